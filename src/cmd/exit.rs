//! The exit status of every `fvd` command, in one place
//! (`docs/exit-codes.md` has the same table for people). One more status
//! is in that table though no command returns it: 125
//! ([`fvd_sandbox::launch::SETUP_FAILED`]), the exit of a run (a test, a
//! preflight, a warm runner, an agent) whose jail the launcher, `fvd
//! __jail`, could not set up; the program never ran.

/// Every exit status in one line each, for `--help` and the man page's
/// EXIT STATUS (`docs/exit-codes.md` says each in full).
pub const STATUSES: &[(u8, &str)] = &[
    (
        0,
        "success: every component non_skip_pass; no divergence; a valid contract",
    ),
    (
        1,
        "findings: blocked components, a divergence, contract findings, a gate that refuses",
    ),
    (
        2,
        "a usage or input error (a malformed spec names its file and line)",
    ),
    (3, "the port paused on a question: see `fvd answer`"),
    (
        4,
        "the port waits for a fixed environment, or for the orchestrator's disk",
    ),
    (
        5,
        "the orchestrator could not be reached (one line names its URL)",
    ),
    (
        6,
        "the orchestrator refused the credential or its role (never the token)",
    ),
    (
        7,
        "the port ran but its PORT_STATUS.md could not be written",
    ),
    (
        125,
        "in a run's output, not fvd's own exit: the run's jail could not be set up",
    ),
    (
        130,
        "an embedded submit was interrupted; the next submit resumes",
    ),
];

/// What an `fvd` process exits with. An `Err` a command returns exits
/// [`Exit::Usage`], printed once by `main`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every component `non_skip_pass`; no divergence; a valid contract.
    Success,
    /// Blocked components, a divergence, an untrusted or empty comparison,
    /// contract findings, a gate that would refuse, a run `fvd logs
    /// --follow` followed to a red, skipped or cut-off end.
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
    /// The orchestrator could not be reached (refused or dropped
    /// connection, no answer); one line names its URL.
    Unreachable,
    /// The orchestrator refused the credential (missing, unknown, revoked)
    /// or its role (a viewer answering, a porter on another's port); one
    /// line names the credential's name and role, never the token.
    Refused,
    /// An embedded submit was interrupted (Ctrl-C, SIGTERM, a lost
    /// terminal); the running tests were ended and the port is resumable.
    Interrupted,
    /// The port ran, but its `PORT_STATUS.md` could not be written (a
    /// refused patch, a read-only or full disk): the porter's record is
    /// not up to date. The store holds the verdicts; the next submit
    /// writes the file again.
    StatusNotWritten,
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
            Exit::Unreachable => 5,
            Exit::Refused => 6,
            Exit::StatusNotWritten => 7,
            Exit::Interrupted => 130,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code())
    }
}

/// A call to an orchestrator that failed in a way a script can act on:
/// `main` exits [`Exit::Unreachable`] or [`Exit::Refused`] with the one
/// line this displays.
#[derive(Debug)]
pub enum Remote {
    Unreachable {
        url: String,
        cause: String,
    },
    Refused {
        url: String,
        message: String,
    },
    /// Reachable, but paused: it cannot record changes (its disk).
    Paused {
        url: String,
        message: String,
    },
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Remote::Unreachable { url, cause } => {
                write!(f, "cannot reach the orchestrator at {url}: {cause}")
            }
            Remote::Refused { url, message } => {
                write!(f, "refused by the orchestrator at {url}: {message}")
            }
            Remote::Paused { url, message } => {
                write!(f, "the orchestrator at {url} is paused: {message}")
            }
        }
    }
}

impl std::error::Error for Remote {}

impl Remote {
    /// The exit status this failure maps to.
    pub fn exit(&self) -> Exit {
        match self {
            Remote::Unreachable { .. } => Exit::Unreachable,
            Remote::Refused { .. } => Exit::Refused,
            Remote::Paused { .. } => Exit::Environment,
        }
    }

    /// What a failed call to `url` means for a script: unreachable,
    /// refused, paused, or (`None`) an error of the request itself.
    pub fn of(url: &str, s: &tonic::Status) -> Option<Self> {
        use tonic::Code;
        // What the connection, not the server, said: fvd's handlers never
        // answer UNKNOWN or CANCELLED, and their INTERNAL carries no source
        // error, while a status made from a transport or HTTP/2 error does
        // (a TLS listener dialled in plain http gives any of the three).
        let transport = matches!(s.code(), Code::Unknown | Code::Cancelled)
            || (s.code() == Code::Internal && std::error::Error::source(s).is_some())
            || s.message().starts_with("transport error");
        if fvd_proto::paused::is_paused(s) {
            return Some(Remote::Paused {
                url: url.to_string(),
                message: s.message().to_string(),
            });
        }
        match s.code() {
            Code::Unauthenticated | Code::PermissionDenied => Some(Remote::Refused {
                url: url.to_string(),
                message: s.message().to_string(),
            }),
            Code::Unavailable => Some(Remote::Unreachable {
                url: url.to_string(),
                cause: s.message().to_string(),
            }),
            _ if transport => Some(Remote::Unreachable {
                url: url.to_string(),
                cause: s.message().to_string(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_exit_codes_scripts_can_tell_apart() {
        let url = "http://127.0.0.1:1";
        let paused =
            Remote::of(url, &fvd_proto::paused::paused("cannot write its database")).unwrap();
        assert_eq!(paused.exit().code(), 4);
        assert!(
            Remote::of(url, &tonic::Status::resource_exhausted("message too large")).is_none(),
            "exhaustion without the pause key is an error of the request"
        );
        let refused = Remote::of(
            url,
            &tonic::Status::permission_denied("credential vera (viewer) may not answer"),
        )
        .unwrap();
        assert_eq!(refused.exit().code(), 6);
        assert_eq!(
            refused.to_string(),
            "refused by the orchestrator at http://127.0.0.1:1: credential vera (viewer) may not answer"
        );
        assert_eq!(
            Remote::of(url, &tonic::Status::unauthenticated("x"))
                .unwrap()
                .exit()
                .code(),
            6
        );
        assert_eq!(
            Remote::of(url, &tonic::Status::unavailable("connection refused"))
                .unwrap()
                .exit()
                .code(),
            5
        );
        assert!(Remote::of(url, &tonic::Status::not_found("no port")).is_none());
        // The server's own internal error is the request's, not the link's.
        assert!(Remote::of(url, &tonic::Status::internal("database: locked")).is_none());
        assert_eq!(
            Remote::of(url, &tonic::Status::cancelled("operation was canceled"))
                .unwrap()
                .exit()
                .code(),
            5
        );
        let codes: Vec<u8> = ALL.iter().map(|e| e.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 6, 7, 130]);
    }

    const ALL: [Exit; 9] = [
        Exit::Success,
        Exit::Findings,
        Exit::Usage,
        Exit::AskUser,
        Exit::Environment,
        Exit::Unreachable,
        Exit::Refused,
        Exit::StatusNotWritten,
        Exit::Interrupted,
    ];

    /// `docs/exit-codes.md` lists every code here, and 125, the jail
    /// launcher's (issue #38: it was missing), and no other.
    #[test]
    fn the_docs_table_lists_every_code_and_the_jail_launchers() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/exit-codes.md"))
                .expect("docs/exit-codes.md");
        let (_, section) = doc.split_once("# Exit codes\n").expect("the title");
        let listed: Vec<i32> = section
            .lines()
            .skip_while(|l| !l.starts_with("| code |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let code = l.split('|').nth(1).unwrap_or_default().trim();
                code.parse()
                    .unwrap_or_else(|_| panic!("a row without a code: {l}"))
            })
            .collect();
        let mut want: Vec<i32> = ALL.iter().map(|e| i32::from(e.code())).collect();
        want.push(fvd_sandbox::launch::SETUP_FAILED);
        want.sort_unstable();
        assert_eq!(listed, want);
    }
}
