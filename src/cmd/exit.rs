//! The exit status of every `fvd` command, in one place.

/// What an `fvd` process exits with. An `Err` a command returns exits
/// [`Exit::Usage`], printed once by `main`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every component `non_skip_pass`; no divergence; a valid contract.
    Success,
    /// Blocked components, a divergence, an untrusted or empty comparison,
    /// contract findings, a gate that would refuse.
    Findings,
    /// A usage or input error (a malformed spec names file, line, column).
    Usage,
    /// The port paused: its only unfinished components wait for `fvd
    /// answer`.
    AskUser,
    /// The port paused: some component waits for a worker whose
    /// environment can run it (a package, interpreter or driver missing),
    /// or the orchestrator cannot write its database (a full, read-only or
    /// failing disk; the port resumes by itself once it can).
    Environment,
    /// An embedded submit was interrupted (Ctrl-C, SIGTERM, a lost
    /// terminal); the running tests were ended and the port is resumable.
    Interrupted,
}

impl Exit {
    /// [`Exit::Success`] when `ok`, else [`Exit::Findings`].
    pub fn success_if(ok: bool) -> Self {
        if ok { Exit::Success } else { Exit::Findings }
    }

    /// The process exit status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Findings => 1,
            Exit::Usage => 2,
            Exit::AskUser => 3,
            Exit::Environment => 4,
            Exit::Interrupted => 130,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}
