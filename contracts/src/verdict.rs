//! Parity verdicts classified from pytest's JUnit XML, never from exit codes.
//!
//! pytest exits 0 when every test skipped, so the exit code cannot tell a
//! scaffold from a working port. The classifier therefore reads the JUnit
//! report case by case ([`parse_junit`]) and uses the exit code, signal and
//! output tail only as supporting evidence: to notice a killed run, a crash
//! before the report was written, or an infrastructure fault (CUDA or NCCL
//! initialisation, out of memory) that must be retried elsewhere rather than
//! counted as an attempt.
//!
//! pytest's own JUnit writer reports a non-strict xpass (an `xfail`-marked
//! test that passed) as a plain pass. The worker's pytest plugin records the
//! real outcome of every case as the testcase property
//! [`OUTCOME_PROPERTY`]; the classifier prefers that property when present,
//! so an xpass is never mistaken for a `non_skip_pass`.
//!
//! The same plugin looks, after each test and at the end of the session,
//! for an assertion helper, a piece of pytest's machinery or a verdict hook
//! that code outside the judge swapped out, and writes what it found as the
//! testsuite property [`INTEGRITY_PROPERTY`]. A run with a finding is
//! [`Verdict::Tampered`], whatever its cases say; so is a run whose cases
//! the plugin reported but whose suite lacks the property (the plugin was
//! unregistered, or the report rewritten).

use std::fmt;

use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};
use serde::{Deserialize, Serialize};

/// Testcase property written by the worker's pytest plugin with the real
/// outcome of the case: `passed`, `failed`, `skipped`, `xfailed`, `xpassed`
/// or `xpassed_strict`.
pub const OUTCOME_PROPERTY: &str = "fvd_outcome";

/// Testsuite property written by the worker's pytest plugin at the end of
/// the session: `clean`, or `tampered` followed by one finding per line.
pub const INTEGRITY_PROPERTY: &str = "fvd_integrity";

/// Most findings kept in a [`Verdict::Tampered`].
pub const MAX_LISTED_FINDINGS: usize = 20;

/// Longest message kept per failing case or skip reason, in characters.
pub const MAX_MESSAGE_CHARS: usize = 400;

/// Most failing cases listed in a [`Verdict::DebugRed`]; the total is kept.
pub const MAX_LISTED_FAILURES: usize = 20;

/// Output-tail and report fragments that mark an infrastructure fault rather
/// than a fault of the port: the same test would pass on a healthy GPU.
const INFRA_MARKERS: &[&str] = &[
    "CUDA error: initialization error",
    "cudaErrorInitializationError",
    "CUDA-capable device(s) is/are busy or unavailable",
    "CUDA error: out of memory",
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "uncorrectable ECC error",
    "NCCL error",
    "ncclSystemError",
    "ncclUnhandledCudaError",
    "ncclRemoteError",
    "ncclInternalError",
];

/// Fragments that say the host has no usable CUDA stack at all (no driver, a
/// driver too old for the runtime, no device): an environment failure of
/// the worker, which the same worker will show on every run, not a
/// transient fault.
const DRIVER_MARKERS: &[&str] = &[
    "Found no NVIDIA driver",
    "CUDA driver version is insufficient",
    "The NVIDIA driver on your system is too old",
    "cudaErrorInsufficientDriver",
    "forward compatibility was attempted on non supported HW",
    "Driver/library version mismatch",
    "NVML library version mismatch",
    "no CUDA-capable device is detected",
    "No CUDA GPUs are available",
    "libcuda.so: cannot open shared object file",
    "libcuda.so.1: cannot open shared object file",
    "NVIDIA-SMI has failed",
];

/// One kind of failure whose cause lies outside the repository, as the
/// failing cases of a run (or its output, without a report) show it. The
/// rows of [`ENVIRONMENT_SIGNATURES`] are tried in order; the first that
/// recognises a text names the run's environment cause.
#[derive(Clone, Copy)]
pub struct EnvSignature {
    /// A stable identifier (`cuda_runtime_missing`), for tests and docs.
    pub name: &'static str,
    /// What the row recognises, for people.
    pub what: &'static str,
    /// A text the row recognises (a line as Python or git prints it).
    pub example: &'static str,
    /// In a report's failure, the row reads only lines that raise this
    /// exception (`ModuleNotFoundError: …`): a test that builds such a
    /// message itself, or asserts on one, is not a broken environment.
    /// `None`: every line of the failure.
    pub raised: Option<&'static str>,
    /// The cause in one line, or `None` when `text` is not this kind of
    /// failure; `in_repo(top)` says whether the checkout holds a
    /// top-level module.
    detect: Detect,
}

/// A signature's recogniser: the text, and whether the checkout holds a
/// top-level module.
type Detect = fn(&str, &dyn Fn(&str) -> bool) -> Option<String>;

impl fmt::Debug for EnvSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvSignature")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EnvSignature {
    /// The cause this row reads in `text`, if it recognises it.
    pub fn detect(&self, text: &str, in_repo: &dyn Fn(&str) -> bool) -> Option<String> {
        (self.detect)(text, in_repo)
    }

    /// [`EnvSignature::detect`] on the error of a report's failing case
    /// ([`failure_error`]): only its [`EnvSignature::raised`] lines when
    /// the row names an exception.
    fn detect_raised(&self, error: &str, in_repo: &dyn Fn(&str) -> bool) -> Option<String> {
        match self.raised {
            None => self.detect(error, in_repo),
            Some(exception) => error
                .lines()
                .map(str::trim_start)
                .filter(|l| {
                    l.strip_prefix(exception)
                        .is_some_and(|rest| rest.starts_with(':'))
                })
                .find_map(|l| self.detect(l, in_repo)),
        }
    }
}

/// The error of a failing case, without the source its report lists: the
/// report's message, and of its long text the lines pytest marks `E   `
/// (the exception and its explanation), or, in a traceback without them
/// (`--tb=native`), its unindented lines. A comment or a branch not taken
/// in the failing test is in the listing, never here (issue #41).
fn failure_error(message: &str, detail: &str) -> String {
    let marked: Vec<&str> = detail
        .lines()
        .filter_map(|l| l.strip_prefix("E   ").or_else(|| (l == "E").then_some("")))
        .collect();
    let lines: Vec<&str> = if marked.is_empty() {
        detail
            .lines()
            .filter(|l| !l.starts_with(char::is_whitespace) && !l.starts_with('>'))
            .collect()
    } else {
        marked
    };
    format!("{message}\n{}", lines.join("\n"))
}

/// The recognised signatures of a broken environment, in the order they
/// are tried. Each has a test of its own (`verdict::tests`); a text none
/// of them recognises is the code's (a failure, an error, a skip).
pub const ENVIRONMENT_SIGNATURES: &[EnvSignature] = &[
    EnvSignature {
        name: "missing_module",
        what: "an import of a top-level package the checkout does not hold (torch, diffusers, pytest itself)",
        example: "ModuleNotFoundError: No module named 'torch'",
        raised: Some("ModuleNotFoundError"),
        detect: detect_missing_module,
    },
    EnvSignature {
        name: "cuda_driver",
        what: "no usable CUDA driver, or a driver too old for the CUDA runtime",
        example: "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).",
        raised: None,
        detect: detect_driver,
    },
    EnvSignature {
        name: "shared_library_missing",
        what: "a shared library the installed packages load is missing (a CUDA runtime such as libcudart.so.13)",
        example: "OSError: libcudart.so.13: cannot open shared object file: No such file or directory",
        raised: None,
        detect: detect_missing_library,
    },
    EnvSignature {
        name: "undefined_symbol",
        what: "a compiled extension that does not match the libraries it was loaded with",
        example: "ImportError: /venv/lib/python3.12/site-packages/flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
        raised: None,
        detect: detect_undefined_symbol,
    },
    EnvSignature {
        name: "system_library_version",
        what: "a system library older than an installed package needs (GLIBC, GLIBCXX)",
        example: "ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found",
        raised: None,
        detect: detect_library_version,
    },
    EnvSignature {
        name: "installed_package_mismatch",
        what: "an installed package (in site-packages) that lacks what the code imports from it",
        example: "ImportError: cannot import name 'FluxPosEmbed' from 'diffusers.models.embeddings' (/venv/lib/python3.12/site-packages/diffusers/models/embeddings.py)",
        raised: None,
        detect: detect_installed_mismatch,
    },
    EnvSignature {
        name: "not_a_git_repository",
        what: "git run in a folder that is not a git checkout",
        example: "fatal: not a git repository (or any of the parent directories): .git",
        raised: None,
        detect: detect_not_git,
    },
    EnvSignature {
        name: "git_dubious_ownership",
        what: "git refusing a checkout owned by another user (safe.directory)",
        example: "fatal: detected dubious ownership in repository at '/srv/FastVideo'",
        raised: None,
        detect: detect_dubious_ownership,
    },
    EnvSignature {
        name: "missing_working_directory",
        what: "a working directory that does not exist (or was removed under the run)",
        example: "shell-init: error retrieving current directory: getcwd: cannot access parent directories: No such file or directory",
        raised: None,
        detect: detect_missing_cwd,
    },
];

/// The first recognised environment signature in `text`, with its cause.
pub fn environment_signature(
    text: &str,
    in_repo: &dyn Fn(&str) -> bool,
) -> Option<(&'static EnvSignature, String)> {
    ENVIRONMENT_SIGNATURES
        .iter()
        .find_map(|s| s.detect(text, in_repo).map(|c| (s, c)))
}

fn detect_missing_module(text: &str, in_repo: &dyn Fn(&str) -> bool) -> Option<String> {
    missing_modules(text).into_iter().find_map(|module| {
        let top = module.split('.').next().unwrap_or(module);
        (!top.is_empty() && !in_repo(top)).then(|| format!("No module named '{module}'"))
    })
}

fn detect_driver(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    DRIVER_MARKERS
        .iter()
        .find(|m| text.contains(*m))
        .map(|m| format!("no usable CUDA driver: {m}"))
}

/// The word before `at` in `text`, after its last blank, quote or `(`.
fn word_before(text: &str, at: usize) -> &str {
    let head = &text[..at];
    let start = head
        .rfind(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '(' | '['))
        .map_or(0, |i| i + 1);
    &head[start..]
}

fn detect_missing_library(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    const NEEDLE: &str = ": cannot open shared object file";
    let i = text.find(NEEDLE)?;
    let lib = word_before(text, i);
    let lib = lib.rsplit('/').next().unwrap_or(lib);
    (!lib.is_empty())
        .then(|| format!("shared library missing: {lib}: cannot open shared object file"))
}

fn detect_undefined_symbol(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    const NEEDLE: &str = ": undefined symbol: ";
    let i = text.find(NEEDLE)?;
    let file = word_before(text, i);
    let file = file.rsplit('/').next().unwrap_or(file);
    let rest = &text[i + NEEDLE.len()..];
    let symbol = rest.split_whitespace().next().unwrap_or_default();
    Some(format!(
        "compiled extension does not match its libraries: {file}: undefined symbol: {symbol}"
    ))
}

fn detect_library_version(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    for needle in [
        "version `GLIBC",
        "version `GLIBCXX",
        "version 'GLIBC",
        "version 'GLIBCXX",
    ] {
        if let Some(i) = text.find(needle) {
            let rest = &text[i + "version `".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
                .collect();
            if text[i..].contains("not found") {
                return Some(format!("system library too old: {name} not found"));
            }
        }
    }
    None
}

fn detect_installed_mismatch(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    const NEEDLE: &str = "cannot import name ";
    let mut rest = text;
    while let Some(i) = rest.find(NEEDLE) {
        let line = rest[i..].lines().next().unwrap_or_default();
        if line.contains("site-packages") || line.contains("dist-packages") {
            let what = line.split(" (").next().unwrap_or(line);
            return Some(format!("installed package mismatch: {what}"));
        }
        rest = &rest[i + NEEDLE.len()..];
    }
    None
}

fn detect_not_git(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    text.contains("not a git repository")
        .then(|| "git: the folder is not a git repository".to_string())
}

fn detect_dubious_ownership(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    text.contains("detected dubious ownership in repository")
        .then(|| "git: dubious ownership of the checkout (safe.directory)".to_string())
}

fn detect_missing_cwd(text: &str, _: &dyn Fn(&str) -> bool) -> Option<String> {
    const MARKERS: &[&str] = &[
        "error retrieving current directory",
        "getcwd: cannot access parent directories",
        "Unable to read current working directory",
    ];
    if let Some(m) = MARKERS.iter().find(|m| text.contains(*m)) {
        return Some(format!("working directory missing: {m}"));
    }
    // git -C DIR with DIR gone
    let i = text.find("fatal: cannot change to ")?;
    text[i..]
        .lines()
        .next()
        .filter(|l| l.contains("No such file or directory"))
        .map(|_| "working directory missing: git cannot change to it".to_string())
}

/// SIGKILL: a run killed with it and not by fvd's own timeout was most likely
/// taken by the host's out-of-memory killer.
const SIGKILL: i32 = 9;

/// The parity status spellings of `contracts/parity_status.md`, plus the run
/// outcomes that are not a component status (`error`, `timeout`,
/// `infra_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictStatus {
    /// At least one test ran and passed; nothing skipped, xfailed or failed.
    NonSkipPass,
    /// Skips, xfails or xpasses and no failure: the test is still a scaffold.
    ScaffoldSkip,
    /// Both sides ran and the comparison failed.
    DebugRed,
    /// The run did not produce a usable result (collection, setup, no tests).
    Error,
    /// The run was killed at its timeout.
    Timeout,
    /// The host failed the run (lost worker, CUDA/NCCL init, out of memory).
    InfraError,
    /// The run could not test the code because of something outside the
    /// repository: a package that is not installed, a missing interpreter
    /// or working directory, no CUDA driver. Never an attempt of the
    /// component; the environment must be fixed.
    Environment,
    /// The run swapped out what judges it (an assertion helper, pytest's
    /// machinery, a verdict hook outside the judge): never a pass, whatever
    /// its cases say.
    Tampered,
}

impl VerdictStatus {
    /// The snake_case spelling used in parity status blocks and ledgers.
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictStatus::NonSkipPass => "non_skip_pass",
            VerdictStatus::ScaffoldSkip => "scaffold_skip",
            VerdictStatus::DebugRed => "debug_red",
            VerdictStatus::Error => "error",
            VerdictStatus::Timeout => "timeout",
            VerdictStatus::InfraError => "infra_error",
            VerdictStatus::Environment => "environment",
            VerdictStatus::Tampered => "tampered",
        }
    }
}

impl fmt::Display for VerdictStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a run ended in [`Verdict::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// pytest collected no test at all.
    NoTests,
    /// A test module failed to import or collect.
    Collection,
    /// A fixture failed before the test body ran.
    Setup,
    /// A fixture failed after the test body ran.
    Teardown,
    /// The JUnit file was requested but not written.
    JunitMissing,
    /// The JUnit file exists but could not be read.
    JunitUnreadable,
    /// The JUnit file is not JUnit XML fvd can parse.
    JunitInvalid,
    /// The process died of a signal before writing its report.
    Crashed,
    /// pytest's exit status contradicts its own report (for example exit 1
    /// with every case passing): the run cannot be trusted as a pass.
    ExitMismatch,
    /// pytest rejected its command line or failed internally (exit 2–4).
    Pytest,
    /// The run was cancelled before it finished.
    Cancelled,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: &[Self] = &[
        ErrorKind::NoTests,
        ErrorKind::Collection,
        ErrorKind::Setup,
        ErrorKind::Teardown,
        ErrorKind::JunitMissing,
        ErrorKind::JunitUnreadable,
        ErrorKind::JunitInvalid,
        ErrorKind::Crashed,
        ErrorKind::ExitMismatch,
        ErrorKind::Pytest,
        ErrorKind::Cancelled,
    ];

    /// The snake_case spelling, e.g. `no_tests` (as in `error:no_tests`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NoTests => "no_tests",
            ErrorKind::Collection => "collection",
            ErrorKind::Setup => "setup",
            ErrorKind::Teardown => "teardown",
            ErrorKind::JunitMissing => "junit_missing",
            ErrorKind::JunitUnreadable => "junit_unreadable",
            ErrorKind::JunitInvalid => "junit_invalid",
            ErrorKind::Crashed => "crashed",
            ErrorKind::ExitMismatch => "exit_mismatch",
            ErrorKind::Pytest => "pytest",
            ErrorKind::Cancelled => "cancelled",
        }
    }
}

/// What kind of non-pass made a run a scaffold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipKind {
    /// `pytest.skip`, `skipif`, `importorskip` (also at module level).
    Skip,
    /// An `xfail`-marked test that failed as expected.
    Xfail,
    /// A non-strict `xfail`-marked test that passed: the marker is stale, and
    /// the run is still not evidence of a pass.
    Xpass,
}

/// One skipped, xfailed or xpassed case with its reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipInfo {
    /// `classname::name` of the case.
    pub case: String,
    pub kind: SkipKind,
    /// The skip or xfail reason, bounded to [`MAX_MESSAGE_CHARS`].
    pub reason: String,
}

/// One failing case with its assertion message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureInfo {
    /// `classname::name` of the case.
    pub case: String,
    /// The failure message (first assertion line), bounded to
    /// [`MAX_MESSAGE_CHARS`].
    pub message: String,
}

/// The classified result of one test run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Verdict {
    NonSkipPass {
        passed: usize,
        /// Whether the worker's pytest plugin reported every case, so that
        /// a non-strict xpass could not hide among the passes.
        xpass_checked: bool,
    },
    ScaffoldSkip {
        passed: usize,
        /// Every skipped, xfailed or xpassed case, in report order.
        skips: Vec<SkipInfo>,
    },
    DebugRed {
        /// The first [`MAX_LISTED_FAILURES`] failing cases.
        failures: Vec<FailureInfo>,
        /// How many cases failed in all.
        failed: usize,
        passed: usize,
    },
    Error {
        kind: ErrorKind,
        /// One line naming the cause (the collection error, the missing file).
        detail: String,
    },
    Timeout,
    InfraError {
        /// The marker or condition that showed the fault.
        cause: String,
    },
    /// See [`VerdictStatus::Environment`]; built by [`environment_cause`].
    Environment {
        /// One line: `No module named 'torch'`, `cannot start the test: …`.
        cause: String,
    },
    /// See [`VerdictStatus::Tampered`].
    Tampered {
        /// What was swapped out and where the replacement was defined, one
        /// line each (`numpy.testing.assert_allclose replaced by
        /// port/model.py:12`), at most [`MAX_LISTED_FINDINGS`].
        findings: Vec<String>,
    },
}

impl Verdict {
    /// The status spelling of this verdict.
    pub fn status(&self) -> VerdictStatus {
        match self {
            Verdict::NonSkipPass { .. } => VerdictStatus::NonSkipPass,
            Verdict::ScaffoldSkip { .. } => VerdictStatus::ScaffoldSkip,
            Verdict::DebugRed { .. } => VerdictStatus::DebugRed,
            Verdict::Error { .. } => VerdictStatus::Error,
            Verdict::Timeout => VerdictStatus::Timeout,
            Verdict::InfraError { .. } => VerdictStatus::InfraError,
            Verdict::Environment { .. } => VerdictStatus::Environment,
            Verdict::Tampered { .. } => VerdictStatus::Tampered,
        }
    }

    /// Whether the run is evidence of parity (`non_skip_pass`).
    pub fn is_pass(&self) -> bool {
        matches!(self, Verdict::NonSkipPass { .. })
    }

    /// Whether the run should be retried on another host without counting as
    /// an attempt.
    pub fn is_infra(&self) -> bool {
        matches!(self, Verdict::InfraError { .. })
    }

    /// Whether the run failed for a cause outside the repository.
    pub fn is_environment(&self) -> bool {
        matches!(self, Verdict::Environment { .. })
    }

    /// One line for humans and agents: the failing assertion, the skip
    /// reason, the collection error.
    pub fn reason(&self) -> String {
        let line = match self {
            Verdict::NonSkipPass { passed, .. } => format!("{passed} passed"),
            Verdict::ScaffoldSkip { skips, .. } => {
                let mut distinct: Vec<String> = Vec::new();
                for s in skips {
                    let label = match s.kind {
                        SkipKind::Skip => format!("skipped: {}", s.reason),
                        SkipKind::Xfail => format!("xfail: {}", s.reason),
                        SkipKind::Xpass => {
                            format!("xpass (xfail marker is stale): {}", s.reason)
                        }
                    };
                    if !distinct.contains(&label) {
                        distinct.push(label);
                    }
                }
                match distinct.len() {
                    0 => "skipped".to_string(),
                    1 => distinct.remove(0),
                    n => format!("{} (+{} more reasons)", distinct[0], n - 1),
                }
            }
            Verdict::DebugRed {
                failures, failed, ..
            } => match failures.first() {
                Some(f) if *failed > 1 => {
                    format!("{}: {} (+{} more failing)", f.case, f.message, failed - 1)
                }
                Some(f) => format!("{}: {}", f.case, f.message),
                None => format!("{failed} failed"),
            },
            Verdict::Error { kind, detail } => format!("error:{}: {detail}", kind.as_str()),
            Verdict::Timeout => "killed at the timeout".to_string(),
            Verdict::InfraError { cause } => format!("infrastructure: {cause}"),
            Verdict::Environment { cause } => cause.clone(),
            Verdict::Tampered { findings } => match findings.as_slice() {
                [] => "the run changed what judges it".to_string(),
                [one] => format!("the run changed what judges it: {one}"),
                [first, rest @ ..] => format!(
                    "the run changed what judges it: {first} (+{} more)",
                    rest.len()
                ),
            },
        };
        one_line(&line, 2 * MAX_MESSAGE_CHARS)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status(), self.reason())
    }
}

/// The JUnit side of the evidence of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JunitEvidence<'a> {
    /// The report's text.
    Xml(&'a str),
    /// The file was requested at `path` but not written.
    Missing { path: &'a str },
    /// The file exists but reading it failed.
    Unreadable { path: &'a str, error: &'a str },
}

/// Everything the classifier looks at for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEvidence<'a> {
    pub junit: JunitEvidence<'a>,
    /// Killed by fvd at its timeout.
    pub timed_out: bool,
    /// Killed by fvd on request.
    pub cancelled: bool,
    pub exit_code: Option<i32>,
    /// The signal that ended the process, if one did.
    pub signal: Option<i32>,
    /// The last (redacted) bytes of the run's output.
    pub output_tail: &'a str,
    /// The worker stopped answering before reporting the run.
    pub worker_lost: bool,
    /// fvd's pytest plugin was loaded for the run (a worker loads it for
    /// every run whose JUnit report it collects), so the report must carry
    /// its [`INTEGRITY_PROPERTY`]: one without it is [`Verdict::Tampered`].
    pub plugin: bool,
}

/// The component name P9's basic example runs under: the one run judged by
/// its exit status ([`classify_exit`]) instead of a test report, so no
/// report is asked of it (its command gets no `--junitxml`) and the
/// integrity check reads its exit status.
pub const EXAMPLE_STEP: &str = "pipeline_example";

/// The verdict of a program judged by its exit status alone (P9's basic
/// example, `case`): exit 0 is its one case passing; another exit fails
/// that case with the output's last line; a timeout, a cancel, a signal or
/// an infrastructure marker in the output read as they do for a test run.
pub fn classify_exit(ev: &RunEvidence<'_>, case: &str) -> Verdict {
    if ev.worker_lost {
        return Verdict::InfraError {
            cause: "worker lost".to_string(),
        };
    }
    if ev.timed_out {
        return Verdict::Timeout;
    }
    if ev.cancelled {
        return error(ErrorKind::Cancelled, "run cancelled before it finished");
    }
    match (ev.signal, ev.exit_code) {
        (None, Some(0)) => Verdict::NonSkipPass {
            passed: 1,
            xpass_checked: true,
        },
        (Some(SIGKILL), _) => Verdict::InfraError {
            cause: "killed by SIGKILL outside fvd's timeout (out of memory?)".into(),
        },
        (Some(sig), _) => error(ErrorKind::Crashed, &format!("killed by signal {sig}")),
        (None, code) => {
            if let Some(v) = infra_from_tail(ev) {
                return v;
            }
            let code = code.map_or("without a status".to_string(), |c| c.to_string());
            Verdict::DebugRed {
                failures: vec![FailureInfo {
                    case: case.to_string(),
                    message: one_line(
                        &format!("exited {code}: {}", last_line(ev.output_tail)),
                        MAX_MESSAGE_CHARS,
                    ),
                }],
                failed: 1,
                passed: 0,
            }
        }
    }
}

/// Classify one run. Precedence: lost worker, timeout, cancellation, a
/// missing or unusable report, infrastructure markers, errors, failures,
/// skips, then passes. Nothing that skipped, xfailed or xpassed is a pass.
pub fn classify(ev: &RunEvidence<'_>) -> Verdict {
    if ev.worker_lost {
        return Verdict::InfraError {
            cause: "worker lost".to_string(),
        };
    }
    if ev.timed_out {
        return Verdict::Timeout;
    }
    if ev.cancelled {
        return error(ErrorKind::Cancelled, "run cancelled before it finished");
    }
    let xml = match ev.junit {
        JunitEvidence::Xml(xml) => xml,
        JunitEvidence::Missing { path } => {
            if let Some(v) = infra_from_tail(ev) {
                return v;
            }
            return no_report(
                ev,
                ErrorKind::JunitMissing,
                &format!("junit xml missing at {path}"),
            );
        }
        JunitEvidence::Unreadable { path, error: e } => {
            if let Some(v) = infra_from_tail(ev) {
                return v;
            }
            return no_report(
                ev,
                ErrorKind::JunitUnreadable,
                &format!("junit xml unreadable at {path}: {e}"),
            );
        }
    };
    let report = match parse_junit(xml) {
        Ok(r) => r,
        Err(e) => return error(ErrorKind::JunitInvalid, &e.to_string()),
    };
    classify_report(&report, ev)
}

/// Why a run could not test the code, when the cause lies outside the
/// repository: the command could not start (`spawn_error`: a missing
/// interpreter or working directory), or a failing case whose text one of
/// [`ENVIRONMENT_SIGNATURES`] recognises: an import of a top-level package
/// the repository does not contain (`in_repo(top)` is false: torch,
/// diffusers, pytest itself), a missing shared library, a compiled
/// extension or installed package that does not match, a host without a
/// usable CUDA driver, a git error about the checkout itself, a missing
/// working directory. `None` when the
/// run tested the code (whatever its verdict) or failed for a cause inside
/// the repository: a missing module of the port's own package is a code
/// error, for the component and its agent.
///
/// Only failing evidence is read: a run whose report has no failure or
/// error is never an environment failure.
pub fn environment_cause(
    ev: &RunEvidence<'_>,
    spawn_error: &str,
    in_repo: &dyn Fn(&str) -> bool,
) -> Option<Verdict> {
    let env = |cause: String| {
        Some(Verdict::Environment {
            cause: one_line(&cause, MAX_MESSAGE_CHARS),
        })
    };
    if !spawn_error.is_empty() {
        return env(format!("cannot start the test: {spawn_error}"));
    }
    if ev.timed_out || ev.cancelled || ev.worker_lost {
        return None;
    }
    // What says why the run failed: the error of each failing and erroring
    // case of a report (never the source it lists), or the output when
    // there is no usable report (a process that never reached pytest).
    let parsed = match ev.junit {
        JunitEvidence::Xml(xml) => parse_junit(xml).ok(),
        _ => None,
    };
    match &parsed {
        Some(report) => {
            let errors: Vec<String> = report
                .cases
                .iter()
                .filter(|c| matches!(c.outcome, CaseOutcome::Failed | CaseOutcome::Error(_)))
                .map(|c| failure_error(&c.message, &c.detail))
                .collect();
            // Every row over every error, in the table's order: a missing
            // package outranks what it makes fail later.
            for sig in ENVIRONMENT_SIGNATURES {
                if let Some(cause) = errors.iter().find_map(|t| sig.detect_raised(t, in_repo)) {
                    return env(cause);
                }
            }
        }
        None => {
            if ev.exit_code == Some(0) {
                return None;
            }
            if let Some((_, cause)) = environment_signature(ev.output_tail, in_repo) {
                return env(cause);
            }
        }
    }
    None
}

/// What says a run ran out of GPU memory, in the exception it raised.
const OUT_OF_MEMORY_MARKERS: &[&str] = &[
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "CUDA out of memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
];

/// The CUDA out-of-memory error a failed run raised, if one did: a line of
/// a failing or erroring case's error ([`failure_error`]: its message and
/// the lines pytest marks `E`, never the source it lists) that raises an
/// exception (`Name: …`, an `AssertionError` about such a text excepted)
/// and names an out-of-memory marker; without a usable report, such a line
/// of the output of a run that exited non-zero. The line, bounded.
pub fn out_of_memory(ev: &RunEvidence<'_>) -> Option<String> {
    if ev.timed_out || ev.cancelled || ev.worker_lost {
        return None;
    }
    let parsed = match ev.junit {
        JunitEvidence::Xml(xml) => parse_junit(xml).ok(),
        _ => None,
    };
    let raised = |text: &str| -> Option<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| raises(l))
            .find(|l| OUT_OF_MEMORY_MARKERS.iter().any(|m| l.contains(m)))
            .map(|l| one_line(l, MAX_MESSAGE_CHARS))
    };
    match &parsed {
        Some(report) => report
            .cases
            .iter()
            .filter(|c| matches!(c.outcome, CaseOutcome::Failed | CaseOutcome::Error(_)))
            .find_map(|c| raised(&failure_error(&c.message, &c.detail))),
        None if ev.exit_code != Some(0) => raised(ev.output_tail),
        None => None,
    }
}

/// Whether `line` raises an exception (`torch.OutOfMemoryError: …`,
/// `RuntimeError: …`) other than an assertion's.
fn raises(line: &str) -> bool {
    let Some((name, _)) = line.split_once(':') else {
        return false;
    };
    let last = name.rsplit('.').next().unwrap_or(name);
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && (last.ends_with("Error") || last.ends_with("Exception"))
        && last != "AssertionError"
}

/// The module names of every `No module named 'x.y'` (or unquoted, as
/// `python -m` prints it) in `text`, in order.
fn missing_modules(text: &str) -> Vec<&str> {
    const NEEDLE: &str = "No module named ";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(NEEDLE) {
        rest = &rest[i + NEEDLE.len()..];
        let quoted = rest.strip_prefix('\'').or_else(|| rest.strip_prefix('"'));
        let body = quoted.unwrap_or(rest);
        let end = body
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(body.len());
        let name = body[..end].trim_end_matches('.');
        if !name.is_empty() {
            out.push(name);
        }
        rest = &body[end..];
    }
    out
}

fn classify_report(report: &JunitReport, ev: &RunEvidence<'_>) -> Verdict {
    let cases = &report.cases;
    if cases.is_empty() {
        return match ev.exit_code {
            Some(code @ 2..=4) => error(
                ErrorKind::Pytest,
                &format!("pytest exited {code}: {}", last_line(ev.output_tail)),
            ),
            _ => error(ErrorKind::NoTests, "no tests collected"),
        };
    }
    // Before anything the cases say: a run that swapped out its judge says
    // nothing about the code, not even an infrastructure fault.
    if let Some(findings) = report.tampering(ev.plugin) {
        return Verdict::Tampered { findings };
    }
    if let Some(v) = infra_fault(cases, ev) {
        return v;
    }

    // Collection and setup errors outrank failures: those tests compared
    // nothing. A teardown error ranks below a failure, whose assertion says
    // more, but still keeps a run from passing.
    if let Some(v) = errored(cases, ErrorPhase::Collection, ErrorKind::Collection)
        .or_else(|| errored(cases, ErrorPhase::Setup, ErrorKind::Setup))
    {
        return v;
    }

    let passed = cases
        .iter()
        .filter(|c| c.outcome == CaseOutcome::Passed)
        .count();
    if let Some(v) = debug_red(cases, passed) {
        return v;
    }

    if let Some(v) = errored(cases, ErrorPhase::Teardown, ErrorKind::Teardown) {
        return v;
    }
    if let Some(v) = exit_mismatch(ev, passed) {
        return v;
    }

    let skips = skips_of(cases);
    if !skips.is_empty() {
        return Verdict::ScaffoldSkip { passed, skips };
    }
    if passed == 0 {
        // Unreachable with pytest's writer, kept so that an odd report can
        // never fall through to a pass.
        return error(ErrorKind::NoTests, "no test passed, failed or skipped");
    }
    Verdict::NonSkipPass {
        passed,
        xpass_checked: report.plugin_complete(),
    }
}

/// An infrastructure error when a case failed or errored and an
/// infrastructure marker shows in a troubled case (the first such case
/// named) or else in the output; `None` otherwise.
fn infra_fault(cases: &[TestCase], ev: &RunEvidence<'_>) -> Option<Verdict> {
    let troubled = cases
        .iter()
        .any(|c| matches!(c.outcome, CaseOutcome::Failed | CaseOutcome::Error(_)));
    if !troubled {
        return None;
    }
    for c in cases {
        if matches!(c.outcome, CaseOutcome::Failed | CaseOutcome::Error(_))
            && let Some(m) = infra_raised(&format!("{}\n{}", c.message, c.detail))
        {
            return Some(Verdict::InfraError {
                cause: format!("{m} in {}", c.id()),
            });
        }
    }
    infra_raised(ev.output_tail).map(|m| Verdict::InfraError {
        cause: format!("{m} in the output"),
    })
}

/// An infrastructure marker in what a failure raised or the host printed,
/// never in the test's source pytest lists (indented, or marked `>`: a
/// comment or a branch not taken that names `CUDA out of memory` is no
/// fault of the host), nor in an assertion's text (a test that checks such
/// a message failed on its own).
fn infra_raised(text: &str) -> Option<&'static str> {
    text.lines()
        .filter(|l| !l.starts_with(char::is_whitespace) && !l.starts_with('>'))
        .map(|l| match l.strip_prefix("E ") {
            Some(rest) => rest.trim(),
            None => l.trim(),
        })
        .filter(|l| !l.starts_with("AssertionError") && !l.starts_with("assert "))
        .find_map(infra_marker)
}

/// An error of `kind` naming the first case that errored in `phase`, with
/// its reason (else its message); `None` when none did.
fn errored(cases: &[TestCase], phase: ErrorPhase, kind: ErrorKind) -> Option<Verdict> {
    cases
        .iter()
        .find(|c| c.outcome == CaseOutcome::Error(phase))
        .map(|c| {
            let what = if c.detail_reason.is_empty() {
                &c.message
            } else {
                &c.detail_reason
            };
            error(kind, &format!("{}: {what}", c.id()))
        })
}

/// A red verdict listing the failed (and strictly xpassed) cases, the first
/// [`MAX_LISTED_FAILURES`] of them by name; `None` when none failed.
fn debug_red(cases: &[TestCase], passed: usize) -> Option<Verdict> {
    let failing: Vec<&TestCase> = cases
        .iter()
        .filter(|c| matches!(c.outcome, CaseOutcome::Failed | CaseOutcome::XpassedStrict))
        .collect();
    if failing.is_empty() {
        return None;
    }
    Some(Verdict::DebugRed {
        failures: failing
            .iter()
            .take(MAX_LISTED_FAILURES)
            .map(|c| FailureInfo {
                case: c.id(),
                message: bounded(&c.message),
            })
            .collect(),
        failed: failing.len(),
        passed,
    })
}

/// An exit-mismatch error when pytest did not end cleanly although its
/// report shows no failure; `None` when it did. Clean is exit 0 (or 5, "no
/// tests ran", when every module skipped at import); anything else means
/// the report is incomplete or pytest broke after writing it.
fn exit_mismatch(ev: &RunEvidence<'_>, passed: usize) -> Option<Verdict> {
    let clean_exit = match ev.exit_code {
        None | Some(0) => true,
        Some(5) => passed == 0,
        Some(_) => false,
    };
    if ev.signal.is_none() && clean_exit {
        return None;
    }
    let how = match (ev.exit_code, ev.signal) {
        (_, Some(sig)) => format!("killed by signal {sig}"),
        (Some(code), None) => format!("exited {code}"),
        (None, None) => "ended abnormally".to_string(),
    };
    Some(error(
        ErrorKind::ExitMismatch,
        &format!(
            "pytest {how} although its report shows no failure: {}",
            last_line(ev.output_tail)
        ),
    ))
}

/// The skipped, xfailed and xpassed cases, in order, each with its reason.
fn skips_of(cases: &[TestCase]) -> Vec<SkipInfo> {
    cases
        .iter()
        .filter_map(|c| {
            let kind = match c.outcome {
                CaseOutcome::Skipped => SkipKind::Skip,
                CaseOutcome::Xfailed => SkipKind::Xfail,
                CaseOutcome::Xpassed => SkipKind::Xpass,
                _ => return None,
            };
            Some(SkipInfo {
                case: c.id(),
                kind,
                reason: bounded(&c.message),
            })
        })
        .collect()
}

fn error(kind: ErrorKind, detail: &str) -> Verdict {
    Verdict::Error {
        kind,
        detail: one_line(detail, MAX_MESSAGE_CHARS),
    }
}

/// A run without a usable report: prefer the process's own story (signal,
/// pytest usage error) over the bare fact that the file is missing.
fn no_report(ev: &RunEvidence<'_>, kind: ErrorKind, what: &str) -> Verdict {
    match (ev.signal, ev.exit_code) {
        (Some(SIGKILL), _) => Verdict::InfraError {
            cause: format!("killed by SIGKILL outside fvd's timeout (out of memory?); {what}"),
        },
        (Some(sig), _) => error(
            ErrorKind::Crashed,
            &format!("killed by signal {sig}; {what}"),
        ),
        (None, Some(code @ 2..=5)) => {
            let kind = if code == 5 {
                ErrorKind::NoTests
            } else {
                ErrorKind::Pytest
            };
            error(
                kind,
                &format!(
                    "pytest exited {code}; {what}: {}",
                    last_line(ev.output_tail)
                ),
            )
        }
        _ => error(kind, &format!("{what}: {}", last_line(ev.output_tail))),
    }
}

fn infra_from_tail(ev: &RunEvidence<'_>) -> Option<Verdict> {
    infra_marker(ev.output_tail).map(|m| Verdict::InfraError {
        cause: format!("{m} in the output"),
    })
}

fn infra_marker(text: &str) -> Option<&'static str> {
    INFRA_MARKERS.iter().copied().find(|m| text.contains(m))
}

fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

fn bounded(text: &str) -> String {
    one_line(text, MAX_MESSAGE_CHARS)
}

/// `text` as one line (line breaks and runs of blanks become one space), cut
/// to `max` characters with an ellipsis.
fn one_line(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        line.to_string()
    } else {
        let mut s: String = line.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// The phase in which a case errored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorPhase {
    Collection,
    Setup,
    Teardown,
}

/// The outcome of one JUnit testcase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaseOutcome {
    Passed,
    Failed,
    Error(ErrorPhase),
    Skipped,
    Xfailed,
    /// Non-strict xpass: pytest's writer calls it a pass.
    Xpassed,
    /// Strict xpass: pytest fails it.
    XpassedStrict,
}

/// One testcase of a JUnit report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestCase {
    pub classname: String,
    pub name: String,
    pub outcome: CaseOutcome,
    /// The `message` attribute of the failure, error or skip element.
    pub message: String,
    /// The text of that element (traceback, skip location), bounded.
    pub detail: String,
    /// For errors: the exception line found in the traceback, if any.
    pub detail_reason: String,
    pub properties: Vec<(String, String)>,
}

impl TestCase {
    /// `classname::name`, or just the name for collection errors.
    pub fn id(&self) -> String {
        if self.classname.is_empty() {
            self.name.clone()
        } else {
            format!("{}::{}", self.classname, self.name)
        }
    }

    fn property(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The testcases of a JUnit report, in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JunitReport {
    pub cases: Vec<TestCase>,
    /// The properties of the testsuite itself (not of a case), in order.
    pub suite_properties: Vec<(String, String)>,
}

impl JunitReport {
    /// Whether the worker's pytest plugin reported every case that ran (so a
    /// non-strict xpass would have been seen).
    pub fn plugin_complete(&self) -> bool {
        self.cases
            .iter()
            .filter(|c| c.outcome != CaseOutcome::Error(ErrorPhase::Collection))
            .all(|c| c.property(OUTCOME_PROPERTY).is_some())
    }

    /// What the plugin's integrity check found, `None` when it reported a
    /// clean run, or when `plugin` is false (the run did not load it, or
    /// predates it) and the report carries no finding. Any `tampered`
    /// property wins over a `clean` one; a report the plugin was loaded for
    /// (`plugin`) but whose suite has no integrity property lost the check,
    /// which is a finding too.
    pub fn tampering(&self, plugin: bool) -> Option<Vec<String>> {
        let mut clean = false;
        for (name, value) in &self.suite_properties {
            if name != INTEGRITY_PROPERTY {
                continue;
            }
            let mut lines = value.lines();
            match lines.next().map(str::trim) {
                Some("clean") => clean = true,
                Some("tampered") => {
                    let findings: Vec<String> = lines
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .take(MAX_LISTED_FINDINGS)
                        .map(bounded)
                        .collect();
                    return Some(findings);
                }
                other => {
                    return Some(vec![bounded(&format!(
                        "fvd's integrity check reported {:?}, which it never writes",
                        other.unwrap_or("")
                    ))]);
                }
            }
        }
        (plugin && !clean).then(|| {
            vec![
                "fvd's integrity check did not report: its pytest plugin was unregistered \
                 or the report rewritten"
                    .to_string(),
            ]
        })
    }
}

/// A JUnit document fvd cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JunitError {
    #[error("junit xml is not well-formed at byte {position}: {message}")]
    Malformed { position: u64, message: String },
    #[error("junit xml has no testsuite element")]
    NoTestsuite,
}

/// Longest traceback text kept per case, in bytes (char-aligned).
const MAX_DETAIL_BYTES: usize = 8 * 1024;

#[derive(Default)]
struct CaseBuilder {
    classname: String,
    name: String,
    /// (tag, message, type) of the first result child.
    result: Option<(String, String, String)>,
    text: String,
    in_result: bool,
    properties: Vec<(String, String)>,
}

/// Parse pytest's JUnit XML (xunit1 or xunit2, with or without a
/// `<testsuites>` wrapper) into its testcases.
pub fn parse_junit(xml: &str) -> Result<JunitReport, JunitError> {
    let mut reader = Reader::from_str(xml);
    let mut report = JunitReport::default();
    let mut saw_suite = false;
    let mut case: Option<CaseBuilder> = None;

    loop {
        let ev = reader.read_event().map_err(|e| JunitError::Malformed {
            position: reader.error_position(),
            message: e.to_string(),
        })?;
        let malformed = |e: &dyn fmt::Display| JunitError::Malformed {
            position: reader.buffer_position(),
            message: e.to_string(),
        };
        match ev {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let empty = matches!(ev, Event::Empty(_));
                let tag = e.local_name();
                match tag.as_ref() {
                    "testsuite" => saw_suite = true,
                    "testcase" => {
                        let b = CaseBuilder {
                            classname: attr(e, "classname").map_err(|e| malformed(&e))?,
                            name: attr(e, "name").map_err(|e| malformed(&e))?,
                            ..CaseBuilder::default()
                        };
                        if empty {
                            report.cases.push(finish(b));
                        } else {
                            case = Some(b);
                        }
                    }
                    t @ ("failure" | "error" | "skipped") => {
                        if let Some(b) = case.as_mut()
                            && b.result.is_none()
                        {
                            b.result = Some((
                                t.to_string(),
                                attr(e, "message").map_err(|e| malformed(&e))?,
                                attr(e, "type").map_err(|e| malformed(&e))?,
                            ));
                            b.in_result = !empty;
                        }
                    }
                    "property" => {
                        let prop = (
                            attr(e, "name").map_err(|e| malformed(&e))?,
                            attr(e, "value").map_err(|e| malformed(&e))?,
                        );
                        match case.as_mut() {
                            Some(b) => b.properties.push(prop),
                            None => report.suite_properties.push(prop),
                        }
                    }
                    _ => {}
                }
            }
            Event::End(ref e) => match e.local_name().as_ref() {
                "testcase" => {
                    if let Some(b) = case.take() {
                        report.cases.push(finish(b));
                    }
                }
                "failure" | "error" | "skipped" => {
                    if let Some(b) = case.as_mut() {
                        b.in_result = false;
                    }
                }
                _ => {}
            },
            Event::Text(ref t) => {
                if let Some(b) = case.as_mut().filter(|b| b.in_result) {
                    push_bounded(&mut b.text, &t.xml10_content());
                }
            }
            Event::CData(ref t) => {
                if let Some(b) = case.as_mut().filter(|b| b.in_result) {
                    push_bounded(&mut b.text, &t.xml10_content());
                }
            }
            Event::GeneralRef(ref r) => {
                if let Some(b) = case.as_mut().filter(|b| b.in_result) {
                    let name = r.xml10_content();
                    if let Ok(Some(ch)) = r.resolve_char_ref() {
                        push_bounded(&mut b.text, ch.encode_utf8(&mut [0; 4]));
                    } else if let Some(s) = quick_xml::escape::resolve_predefined_entity(&name) {
                        push_bounded(&mut b.text, s);
                    }
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !saw_suite {
        return Err(JunitError::NoTestsuite);
    }
    Ok(report)
}

fn attr(e: &BytesStart<'_>, name: &str) -> Result<String, String> {
    for a in e.attributes() {
        let a = a.map_err(|e| e.to_string())?;
        if a.key.local_name().as_ref() == name {
            return a
                .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .map(|v| v.into_owned())
                .map_err(|e| e.to_string());
        }
    }
    Ok(String::new())
}

fn push_bounded(buf: &mut String, s: &str) {
    let room = MAX_DETAIL_BYTES.saturating_sub(buf.len());
    if s.len() <= room {
        buf.push_str(s);
    } else {
        let mut cut = room;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        buf.push_str(&s[..cut]);
    }
}

fn finish(b: CaseBuilder) -> TestCase {
    let plugin = b
        .properties
        .iter()
        .find(|(n, _)| n == OUTCOME_PROPERTY)
        .map(|(_, v)| v.clone());
    let (mut outcome, mut message) = match &b.result {
        None => (CaseOutcome::Passed, String::new()),
        Some((tag, message, ty)) => match tag.as_str() {
            "failure" if message.starts_with("[XPASS(strict)]") => {
                (CaseOutcome::XpassedStrict, message.clone())
            }
            "failure" => (CaseOutcome::Failed, failure_message(message, &b.text)),
            "error" if message == "collection failure" => {
                (CaseOutcome::Error(ErrorPhase::Collection), message.clone())
            }
            "error" if message.starts_with("failed on teardown") => {
                (CaseOutcome::Error(ErrorPhase::Teardown), message.clone())
            }
            "error" => (CaseOutcome::Error(ErrorPhase::Setup), message.clone()),
            _ if ty == "pytest.xfail" => (CaseOutcome::Xfailed, message.clone()),
            // Older pytest wrote a non-strict xpass as a skip with this text.
            _ if message == "xfail-marked test passes unexpectedly" => {
                (CaseOutcome::Xpassed, message.clone())
            }
            _ if message == "collection skipped" => {
                (CaseOutcome::Skipped, collect_skip_reason(&b.text))
            }
            _ => (CaseOutcome::Skipped, message.clone()),
        },
    };
    // The plugin saw the real outcome; pytest's writer cannot express xpass.
    match plugin.as_deref() {
        Some("xpassed") if outcome == CaseOutcome::Passed => {
            outcome = CaseOutcome::Xpassed;
            message = "xfail-marked test passed".to_string();
        }
        Some("xfailed") if outcome == CaseOutcome::Passed => outcome = CaseOutcome::Xfailed,
        _ => {}
    }
    if outcome == CaseOutcome::Xpassed
        && let Some((_, reason)) = b.properties.iter().find(|(n, _)| n == "fvd_xfail_reason")
        && !reason.is_empty()
    {
        message = reason.clone();
    }
    let detail_reason = if matches!(outcome, CaseOutcome::Error(_)) {
        exception_line(&b.text)
    } else {
        String::new()
    };
    TestCase {
        classname: b.classname,
        name: b.name,
        outcome,
        message,
        detail: b.text,
        detail_reason,
        properties: b.properties,
    }
}

/// The failure message, with numpy's "Max absolute/relative difference"
/// lines (only in the traceback text) in place of its list of first
/// mismatches: the size of the miss is what a reader needs first.
fn failure_message(message: &str, text: &str) -> String {
    let mut m = message.to_string();
    if let Some(i) = m
        .find("First ")
        .filter(|&i| m[i..].contains("mismatches are at"))
    {
        m.truncate(i);
    }
    for line in text.lines() {
        let line = line.trim().trim_start_matches('E').trim();
        if (line.starts_with("Max absolute difference")
            || line.starts_with("Max relative difference"))
            && !m.contains(line)
        {
            m.push('\n');
            m.push_str(line);
        }
    }
    m
}

/// A module-level skip is written as the repr of pytest's
/// `(path, line, "Skipped: reason")` tuple; pull the reason out of it.
fn collect_skip_reason(text: &str) -> String {
    let t = text.trim();
    if let Some(i) = t.find("Skipped: ") {
        let rest = &t[i + "Skipped: ".len()..];
        let rest = rest.strip_suffix(')').unwrap_or(rest);
        let rest = rest.strip_suffix(['\'', '"']).unwrap_or(rest);
        return rest.to_string();
    }
    t.to_string()
}

/// The `E   SomeError: message` line of a pytest traceback, which names the
/// cause better than the generic `collection failure` message.
fn exception_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("E ").map(str::trim))
        .unwrap_or("")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(xml: &str) -> RunEvidence<'_> {
        RunEvidence {
            junit: JunitEvidence::Xml(xml),
            timed_out: false,
            cancelled: false,
            exit_code: Some(0),
            signal: None,
            output_tail: "",
            worker_lost: false,
            plugin: false,
        }
    }

    #[test]
    fn an_infra_marker_in_the_listed_source_or_an_assertion_is_no_infra_fault() {
        let classified = |message: &str, detail: &str, tail: &'static str| {
            let xml = failed_with(message, detail);
            let mut e = ev(&xml);
            e.exit_code = Some(1);
            e.output_tail = tail;
            classify(&e).status()
        };
        let listed = "    def test_x():\n        # CUDA out of memory here means the batch is too big\n        if False:\n            raise torch.cuda.OutOfMemoryError('CUDA out of memory')\n>       np.testing.assert_allclose(a, b, atol=1e-5)\nE       AssertionError: \nE       Not equal to tolerance rtol=1e-07, atol=1e-05\n\ntest_x.py:9: AssertionError";
        // the run's output lists the same source
        let tail: &'static str = "________ test_x ________\n    def test_x():\n        # CUDA out of memory here means the batch is too big\n>       np.testing.assert_allclose(a, b, atol=1e-5)\nE       AssertionError: \n1 failed";
        assert_eq!(
            classified("AssertionError: Not equal to tolerance", listed, tail),
            VerdictStatus::DebugRed
        );
        let asserted = ">       assert 'NCCL error' in str(err)\nE       AssertionError: assert 'NCCL error' in 'boom'";
        assert_eq!(
            classified(
                "AssertionError: assert 'NCCL error' in 'boom'",
                asserted,
                ""
            ),
            VerdictStatus::DebugRed
        );
        let raised = ">       y = model(x)\nE       torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
        assert_eq!(
            classified("torch.OutOfMemoryError: CUDA out of memory.", raised, ""),
            VerdictStatus::InfraError
        );
        // the host printed it, outside any listing
        let log: &'static str =
            "[rank0] NCCL error in: nccl.cpp:42, unhandled system error\n1 failed";
        assert_eq!(
            classified("AssertionError: Not equal to tolerance", listed, log),
            VerdictStatus::InfraError
        );
    }

    #[test]
    fn a_program_judged_by_its_exit_status_passes_only_on_exit_0() {
        let mut e = ev("");
        e.junit = JunitEvidence::Missing { path: "junit.xml" };
        e.output_tail = "loading\nwrote out.mp4\n";
        assert_eq!(
            classify_exit(&e, "python ex.py"),
            Verdict::NonSkipPass {
                passed: 1,
                xpass_checked: true
            }
        );
        e.exit_code = Some(2);
        let v = classify_exit(&e, "python ex.py");
        assert_eq!(v.status(), VerdictStatus::DebugRed);
        assert_eq!(v.reason(), "python ex.py: exited 2: wrote out.mp4");
        e.exit_code = None;
        e.signal = Some(11);
        assert_eq!(classify_exit(&e, "x").status(), VerdictStatus::Error);
        e.signal = Some(SIGKILL);
        assert_eq!(classify_exit(&e, "x").status(), VerdictStatus::InfraError);
        e.signal = None;
        e.exit_code = Some(0);
        e.timed_out = true;
        assert_eq!(classify_exit(&e, "x"), Verdict::Timeout);
    }

    fn suite(body: &str) -> String {
        format!(
            r#"<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="0" failures="0" skipped="0" tests="1"><properties><property name="fvd_integrity" value="clean"/></properties>{body}</testsuite></testsuites>"#
        )
    }

    /// A one-case pass whose suite carries `integrity` (none: no property).
    fn passing_suite(integrity: Option<&str>) -> String {
        let props = integrity
            .map(|v| {
                format!(r#"<properties><property name="fvd_integrity" value="{v}"/></properties>"#)
            })
            .unwrap_or_default();
        format!(
            r#"<testsuites><testsuite name="pytest" tests="1">{props}<testcase classname="t" name="a"><properties><property name="fvd_outcome" value="passed"/></properties></testcase></testsuite></testsuites>"#
        )
    }

    #[test]
    fn a_swapped_judge_is_tampered_whatever_the_cases_say() {
        let xml = passing_suite(Some(
            "tampered&#10;numpy.testing.assert_allclose replaced by port/m.py:5&#10;hook pytest_runtest_makereport implemented at port/m.py:9, outside the judge",
        ));
        let v = classify(&ev(&xml));
        assert_eq!(
            v,
            Verdict::Tampered {
                findings: vec![
                    "numpy.testing.assert_allclose replaced by port/m.py:5".into(),
                    "hook pytest_runtest_makereport implemented at port/m.py:9, outside the judge"
                        .into(),
                ]
            }
        );
        assert!(!v.is_pass());
        assert_eq!(v.status().as_str(), "tampered");
        assert_eq!(
            v.reason(),
            "the run changed what judges it: numpy.testing.assert_allclose replaced by port/m.py:5 (+1 more)"
        );
        // A red run that also swapped its judge is named for the swap.
        let red = xml.replace(
            r#"value="passed"/></properties></testcase>"#,
            r#"value="failed"/></properties><failure message="AssertionError: x">E</failure></testcase>"#,
        );
        assert_eq!(classify(&ev(&red)).status(), VerdictStatus::Tampered);
    }

    #[test]
    fn a_lost_or_forged_integrity_report_is_tampered_and_a_clean_one_passes() {
        let loaded = |xml: &str| {
            classify(&RunEvidence {
                plugin: true,
                ..ev(xml)
            })
        };
        assert!(loaded(&passing_suite(Some("clean"))).is_pass());
        // The worker loaded the plugin but its end-of-session report is gone.
        let lost = loaded(&passing_suite(None));
        assert_eq!(lost.status(), VerdictStatus::Tampered, "{lost:?}");
        assert!(
            lost.reason().contains("did not report"),
            "{}",
            lost.reason()
        );
        // A text the plugin never writes, and a forged `clean` beside a real
        // finding.
        let odd = classify(&ev(&passing_suite(Some("fine"))));
        assert_eq!(odd.status(), VerdictStatus::Tampered);
        let both = passing_suite(Some("clean")).replace(
            "</properties><testcase",
            r#"<property name="fvd_integrity" value="tampered&#10;math.isclose replaced by a.py:1"/></properties><testcase"#,
        );
        assert_eq!(
            classify(&ev(&both)),
            Verdict::Tampered {
                findings: vec!["math.isclose replaced by a.py:1".into()]
            }
        );
        // A report of a run that did not load the plugin (or predates its
        // check) owes no integrity report.
        assert!(classify(&ev(&passing_suite(None))).is_pass());
    }

    #[test]
    fn plain_pass_with_plugin_is_checked_pass() {
        let xml = suite(
            r#"<testcase classname="t" name="a"><properties><property name="fvd_outcome" value="passed"/></properties></testcase>"#,
        );
        assert_eq!(
            classify(&ev(&xml)),
            Verdict::NonSkipPass {
                passed: 1,
                xpass_checked: true
            }
        );
    }

    #[test]
    fn xpass_property_is_never_a_pass() {
        let xml = suite(
            r#"<testcase classname="t" name="a"><properties><property name="fvd_outcome" value="xpassed"/></properties></testcase>"#,
        );
        let v = classify(&ev(&xml));
        assert_eq!(v.status(), VerdictStatus::ScaffoldSkip);
    }

    #[test]
    fn all_skipped_without_wrapper_is_scaffold() {
        let xml = r#"<testsuite name="pytest" tests="1"><testcase classname="t" name="a"><skipped type="pytest.skip" message="needs &lt;ops&gt;">t.py:3: needs ops</skipped></testcase></testsuite>"#;
        let v = classify(&ev(xml));
        assert_eq!(v.status(), VerdictStatus::ScaffoldSkip);
        assert_eq!(v.reason(), "skipped: needs <ops>");
    }

    /// A repository holding `fastvideo/` and `tests/`.
    fn in_repo(top: &str) -> bool {
        matches!(top, "fastvideo" | "tests")
    }

    fn collection_error(module: &str) -> String {
        suite(&format!(
            r#"<testcase classname="" name="test_x"><error message="collection failure">ImportError while importing test module '/r/test_x.py'.
Traceback:
test_x.py:1: in &lt;module&gt;
    import {module}
E   ModuleNotFoundError: No module named '{module}'</error></testcase>"#
        ))
    }

    #[test]
    fn a_package_the_repository_lacks_is_the_environment() {
        let xml = collection_error("torch");
        let mut e = ev(&xml);
        e.exit_code = Some(2);
        let v = environment_cause(&e, "", &in_repo).expect("torch is not in the repo");
        assert_eq!(v.status(), VerdictStatus::Environment);
        assert_eq!(v.reason(), "No module named 'torch'");
        // A dotted name counts by its top-level package.
        let xml = collection_error("diffusers.models");
        assert_eq!(
            environment_cause(&ev(&xml), "", &in_repo).map(|v| v.reason()),
            Some("No module named 'diffusers.models'".to_string())
        );
    }

    #[test]
    fn a_module_missing_from_the_repository_itself_is_a_code_error() {
        let xml = collection_error("fastvideo.models.dits.tiny");
        let mut e = ev(&xml);
        e.exit_code = Some(2);
        assert_eq!(environment_cause(&e, "", &in_repo), None);
        assert_eq!(classify(&e).status(), VerdictStatus::Error);
    }

    #[test]
    fn no_pytest_no_interpreter_no_driver() {
        // `python3 -m pytest` without pytest: no report, the tail says why
        // (unquoted, as `python -m` prints it).
        let e = RunEvidence {
            junit: JunitEvidence::Missing { path: "j.xml" },
            exit_code: Some(1),
            output_tail: "/usr/bin/python3: No module named pytest\n",
            ..ev("")
        };
        assert_eq!(
            environment_cause(&e, "", &in_repo).map(|v| v.reason()),
            Some("No module named 'pytest'".to_string())
        );
        let v = environment_cause(
            &ev(""),
            "cannot spawn \"python9\" in \"/r\": No such file or directory",
            &in_repo,
        )
        .unwrap();
        assert!(
            v.reason()
                .starts_with("cannot start the test: cannot spawn"),
            "{}",
            v.reason()
        );
        let xml = suite(
            r#"<testcase classname="t" name="a"><error message="failed on setup with &quot;RuntimeError: Found no NVIDIA driver on your system&quot;">x</error></testcase>"#,
        );
        assert_eq!(
            environment_cause(&ev(&xml), "", &in_repo).map(|v| v.status()),
            Some(VerdictStatus::Environment)
        );
    }

    /// A collection error (an exception at the test module's import)
    /// whose traceback ends in `line`.
    fn collection_failing_with(line: &str) -> String {
        let esc = line
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;");
        suite(&format!(
            r#"<testcase classname="" name="test_x"><error message="collection failure">ImportError while importing test module '/r/test_x.py'.
Traceback:
test_x.py:1: in &lt;module&gt;
    import something
E   {esc}</error></testcase>"#
        ))
    }

    /// The cause the run gets from a failing case ending in `line`.
    fn env_reason(line: &str) -> Option<String> {
        let xml = collection_failing_with(line);
        let mut e = ev(&xml);
        e.exit_code = Some(2);
        environment_cause(&e, "", &in_repo).map(|v| {
            assert_eq!(v.status(), VerdictStatus::Environment);
            v.reason()
        })
    }

    /// A failed case whose message is `message` and whose long report is
    /// `detail` (escaped here).
    fn failed_with(message: &str, detail: &str) -> String {
        let esc = |t: &str| {
            t.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;")
        };
        suite(&format!(
            r#"<testcase classname="t" name="test_x"><failure message="{}">{}</failure></testcase>"#,
            esc(message),
            esc(detail)
        ))
    }

    fn cause_of(xml: &str) -> Option<String> {
        let mut e = ev(xml);
        e.exit_code = Some(1);
        environment_cause(&e, "", &in_repo).map(|v| v.reason())
    }

    #[test]
    fn out_of_memory_is_read_from_the_raised_error_not_the_listing() {
        let oom = |message: &str, detail: &str| {
            let xml = failed_with(message, detail);
            let mut e = ev(&xml);
            e.exit_code = Some(1);
            out_of_memory(&e)
        };
        let raised = "    def test_x():\n>       y = model(x)\nE       torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n\ntest_x.py:3: OutOfMemoryError";
        assert_eq!(
            oom(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                raised
            )
            .as_deref(),
            Some("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        );
        let cublas = "    def test_x():\n>       y = a @ b\nE       RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n\ntest_x.py:3: RuntimeError";
        assert!(oom("RuntimeError: CUDA error", cublas).is_some());
        // In the listing only, or asserted on: the numbers failed.
        let listed = "    def test_x():\n        # CUDA out of memory here means the batch is too big\n        if False:\n            raise torch.cuda.OutOfMemoryError('CUDA out of memory')\n>       np.testing.assert_allclose(a, b, atol=1e-5)\nE       AssertionError: \nE       Not equal to tolerance rtol=1e-07, atol=1e-05\n\ntest_x.py:9: AssertionError";
        assert_eq!(oom("AssertionError: Not equal to tolerance", listed), None);
        let asserted = "    def test_x():\n>       assert 'CUDA out of memory' in str(err)\nE       AssertionError: assert 'CUDA out of memory' in 'boom'\n\ntest_x.py:2: AssertionError";
        assert_eq!(
            oom(
                "AssertionError: assert 'CUDA out of memory' in 'boom'",
                asserted
            ),
            None
        );
        // Without a report: the output of a run that failed.
        let no_report = |tail: &'static str, code| RunEvidence {
            junit: JunitEvidence::Missing { path: "junit.xml" },
            exit_code: Some(code),
            output_tail: tail,
            ..ev("")
        };
        let tail =
            "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory.\n";
        assert!(out_of_memory(&no_report(tail, 1)).is_some());
        assert_eq!(out_of_memory(&no_report(tail, 0)), None);
        // A timed-out run is a timeout, whatever it printed.
        let mut timed_out = no_report(tail, 1);
        timed_out.timed_out = true;
        assert_eq!(out_of_memory(&timed_out), None);
    }

    #[test]
    fn a_signature_in_the_listed_source_is_not_the_failure() {
        // Each example in a comment above the failing line, and in a branch
        // the test did not take: the failure is the numbers.
        for sig in ENVIRONMENT_SIGNATURES {
            let detail = format!(
                "    def test_x():\n        # if this fails with {ex:?}, load the module first\n        if False:\n            raise RuntimeError({ex:?})\n>       np.testing.assert_allclose(a, b, atol=1e-5)\nE       AssertionError: \nE       Not equal to tolerance rtol=1e-07, atol=1e-05\nE       Max absolute difference: 0.25\n\ntest_x.py:9: AssertionError",
                ex = sig.example
            );
            let xml = failed_with("AssertionError: Not equal to tolerance", &detail);
            assert_eq!(cause_of(&xml), None, "{}", sig.name);
        }
    }

    #[test]
    fn a_test_that_builds_or_checks_an_import_error_is_not_a_missing_module() {
        // FastVideo's test_attn_qat_train_kernel.py pattern, the code under
        // test regressed: pytest.raises' match fails on the mocked message.
        let detail = "    def test_missing(monkeypatch):\n        missing = ImportError(\"No module named 'fastvideo_kernel'\")\n>       with pytest.raises(ImportError, match=\"requires FastVideo's fastvideo-kernel\"):\nE       AssertionError: Regex pattern did not match.\nE        Regex: \"requires FastVideo's fastvideo-kernel\"\nE        Input: \"No module named 'fastvideo_kernel'\"\n\ntest_attn.py:45: AssertionError";
        let xml = failed_with("AssertionError: Regex pattern did not match.", detail);
        assert_eq!(cause_of(&xml), None);
        // The mocked error raised as it is: an ImportError the test built.
        let detail = "    def test_missing():\n>       raise missing\nE       ImportError: No module named 'fastvideo_kernel'\n\ntest_attn.py:41: ImportError";
        let xml = failed_with("ImportError: No module named 'fastvideo_kernel'", detail);
        assert_eq!(cause_of(&xml), None);
        // What the import system raises for a package that is not there.
        let detail = "    def test_x():\n>       import fastvideo_kernel\nE       ModuleNotFoundError: No module named 'fastvideo_kernel'\n\ntest_attn.py:3: ModuleNotFoundError";
        let xml = failed_with(
            "ModuleNotFoundError: No module named 'fastvideo_kernel'",
            detail,
        );
        assert_eq!(
            cause_of(&xml).as_deref(),
            Some("No module named 'fastvideo_kernel'")
        );
    }

    #[test]
    fn a_cause_is_quoted_from_the_error_not_the_listing() {
        let detail = "    def test_x():\n>       raise ImportError(\"/venv/lib/python3.12/site-packages/ext/_C.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\")\nE       ImportError: /venv/lib/python3.12/site-packages/ext/_C.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\n\ntest_x.py:2: ImportError";
        let xml = failed_with("ImportError: /venv/…/_C.so: undefined symbol", detail);
        let cause = cause_of(&xml).unwrap();
        assert!(
            cause.ends_with("undefined symbol: _ZN3c104cuda9SetDeviceEi"),
            "{cause}"
        );
        // A native traceback (--tb=native): its unindented lines.
        let detail = "Traceback (most recent call last):\n  File \"/r/test_x.py\", line 3, in test_x\n    # libcudart.so.12: cannot open shared object file\n    import torch\nModuleNotFoundError: No module named 'torch'";
        let xml = failed_with("ModuleNotFoundError: No module named 'torch'", detail);
        assert_eq!(cause_of(&xml).as_deref(), Some("No module named 'torch'"));
    }

    /// Which row of the table recognises `text` first.
    fn row_of(text: &str) -> Option<&'static str> {
        environment_signature(text, &in_repo).map(|(s, _)| s.name)
    }

    #[test]
    fn every_signature_recognises_its_own_example_first() {
        for sig in ENVIRONMENT_SIGNATURES {
            assert_eq!(row_of(sig.example), Some(sig.name), "{sig:?}");
            assert!(env_reason(sig.example).is_some(), "{sig:?}");
        }
        let names: std::collections::HashSet<_> =
            ENVIRONMENT_SIGNATURES.iter().map(|s| s.name).collect();
        assert_eq!(
            names.len(),
            ENVIRONMENT_SIGNATURES.len(),
            "names are unique"
        );
    }

    #[test]
    fn signature_missing_module() {
        assert_eq!(
            env_reason("ModuleNotFoundError: No module named 'transformers'").as_deref(),
            Some("No module named 'transformers'")
        );
        // the repository's own package: the code's
        assert_eq!(row_of("No module named 'fastvideo.models.x'"), None);
    }

    #[test]
    fn signature_cuda_runtime_missing() {
        for (line, lib) in [
            (
                "OSError: libcudart.so.13: cannot open shared object file: No such file or directory",
                "libcudart.so.13",
            ),
            (
                "OSError: /usr/local/cuda/lib64/libcublasLt.so.12: cannot open shared object file: No such file or directory",
                "libcublasLt.so.12",
            ),
        ] {
            assert_eq!(
                env_reason(line),
                Some(format!(
                    "shared library missing: {lib}: cannot open shared object file"
                )),
                "{line}"
            );
        }
    }

    #[test]
    fn signature_undefined_symbol() {
        let line = "ImportError: /venv/lib/python3.12/site-packages/xformers/_C.so: undefined symbol: _ZN2at4_ops5zeros4callE";
        assert_eq!(
            env_reason(line).as_deref(),
            Some(
                "compiled extension does not match its libraries: _C.so: undefined symbol: _ZN2at4_ops5zeros4callE"
            )
        );
        // an undefined *name* in Python is the code's
        assert_eq!(
            row_of("NameError: name 'undefined_symbol' is not defined"),
            None
        );
    }

    #[test]
    fn signature_system_library_version() {
        assert_eq!(
            env_reason("OSError: /lib64/libc.so.6: version `GLIBC_2.34' not found (required by /venv/lib/libtorch.so)").as_deref(),
            Some("system library too old: GLIBC_2.34 not found")
        );
    }

    #[test]
    fn signature_installed_package_mismatch() {
        let line = "ImportError: cannot import name 'Qwen3VLModel' from 'transformers' (/venv/lib/python3.12/site-packages/transformers/__init__.py)";
        assert_eq!(
            env_reason(line).as_deref(),
            Some(
                "installed package mismatch: cannot import name 'Qwen3VLModel' from 'transformers'"
            )
        );
        // the same error from the repository's own package: the code's
        assert_eq!(
            row_of(
                "ImportError: cannot import name 'Dit' from 'fastvideo.models' (/srv/FastVideo/fastvideo/models/__init__.py)"
            ),
            None
        );
    }

    #[test]
    fn signature_cuda_driver_and_runtime_mismatch() {
        for line in [
            "RuntimeError: Found no NVIDIA driver on your system.",
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).",
            "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
            "Failed to initialize NVML: Driver/library version mismatch",
        ] {
            let r = env_reason(line).unwrap_or_default();
            assert!(r.starts_with("no usable CUDA driver: "), "{line}: {r}");
        }
    }

    #[test]
    fn signature_not_a_git_repository() {
        let line =
            "AssertionError: fatal: not a git repository (or any of the parent directories): .git";
        assert_eq!(
            env_reason(line).as_deref(),
            Some("git: the folder is not a git repository")
        );
    }

    #[test]
    fn signature_git_dubious_ownership() {
        let line = "fatal: detected dubious ownership in repository at '/srv/FastVideo'\nTo add an exception for this directory, call: git config --global --add safe.directory /srv/FastVideo";
        assert_eq!(
            env_reason(line).as_deref(),
            Some("git: dubious ownership of the checkout (safe.directory)")
        );
    }

    #[test]
    fn signature_missing_working_directory() {
        assert!(
            env_reason("FileNotFoundError: shell-init: error retrieving current directory: getcwd: cannot access parent directories: No such file or directory")
                .is_some_and(|r| r.starts_with("working directory missing: "))
        );
        assert_eq!(
            row_of("fatal: cannot change to '/scratch/gone': No such file or directory"),
            Some("missing_working_directory")
        );
        // a test's own missing data file is not this
        assert_eq!(
            row_of(
                "FileNotFoundError: [Errno 2] No such file or directory: 'weights/vae.safetensors'"
            ),
            None
        );
        // and a missing working directory at spawn is an environment too
        let v = environment_cause(
            &ev(""),
            "cannot spawn \"python3\" in \"/r/gone\": No such file or directory",
            &in_repo,
        )
        .unwrap();
        assert!(
            v.reason().starts_with("cannot start the test: "),
            "{}",
            v.reason()
        );
    }

    #[test]
    fn runs_that_tested_are_never_the_environment() {
        // A numeric failure whose output mentions a missing optional module.
        let xml = suite(
            r#"<testcase classname="t" name="a"><failure message="AssertionError: max diff 0.3">assert 0.3 &lt; 1e-3</failure></testcase>"#,
        );
        let e = RunEvidence {
            output_tail: "warning: No module named 'flash_attn'; using sdpa",
            exit_code: Some(1),
            ..ev(&xml)
        };
        assert_eq!(environment_cause(&e, "", &in_repo), None);
        // A pass, whatever its output says.
        let xml = suite(r#"<testcase classname="t" name="a"></testcase>"#);
        let e = RunEvidence {
            output_tail: "No module named 'torch' (fell back to numpy)",
            ..ev(&xml)
        };
        assert_eq!(environment_cause(&e, "", &in_repo), None);
        // Killed at the timeout: a verdict of its own.
        let e = RunEvidence {
            timed_out: true,
            junit: JunitEvidence::Missing { path: "j.xml" },
            output_tail: "No module named 'torch'",
            ..ev("")
        };
        assert_eq!(environment_cause(&e, "", &in_repo), None);
    }

    #[test]
    fn failure_message_and_infra_marker() {
        let xml = suite(
            r#"<testcase classname="t" name="a"><failure message="AssertionError: Not equal">trace</failure></testcase>"#,
        );
        let mut e = ev(&xml);
        e.exit_code = Some(1);
        assert_eq!(classify(&e).reason(), "t::a: AssertionError: Not equal");
        let xml = suite(
            r#"<testcase classname="t" name="a"><error message="failed on setup with &quot;RuntimeError: CUDA error: initialization error&quot;">x</error></testcase>"#,
        );
        assert_eq!(classify(&ev(&xml)).status(), VerdictStatus::InfraError);
    }

    #[test]
    fn empty_suite_is_no_tests_and_missing_junit_is_error() {
        let xml = r#"<testsuites><testsuite name="pytest" tests="0"></testsuite></testsuites>"#;
        let mut e = ev(xml);
        e.exit_code = Some(5);
        assert!(matches!(
            classify(&e),
            Verdict::Error {
                kind: ErrorKind::NoTests,
                ..
            }
        ));
        let e = RunEvidence {
            junit: JunitEvidence::Missing { path: "/x/j.xml" },
            exit_code: Some(1),
            ..ev("")
        };
        let v = classify(&e);
        assert!(matches!(
            v,
            Verdict::Error {
                kind: ErrorKind::JunitMissing,
                ..
            }
        ));
        assert!(v.reason().contains("/x/j.xml"), "{}", v.reason());
    }

    #[test]
    fn all_pass_with_nonzero_exit_is_not_a_pass() {
        let xml = suite(r#"<testcase classname="t" name="a"/>"#);
        let mut e = ev(&xml);
        e.exit_code = Some(1);
        assert!(matches!(
            classify(&e),
            Verdict::Error {
                kind: ErrorKind::ExitMismatch,
                ..
            }
        ));
    }

    #[test]
    fn malformed_xml_is_error() {
        let v = classify(&ev("<testsuite><testcase></testsuite>"));
        assert_eq!(v.status(), VerdictStatus::Error);
        let v = classify(&ev("not xml at all"));
        assert_eq!(v.status(), VerdictStatus::Error);
    }

    #[test]
    fn status_spellings() {
        assert_eq!(VerdictStatus::NonSkipPass.to_string(), "non_skip_pass");
        assert_eq!(Verdict::Timeout.status().as_str(), "timeout");
        assert_eq!(ErrorKind::NoTests.as_str(), "no_tests");
    }

    #[test]
    fn failure_outranks_teardown_error() {
        let xml = suite(
            r#"<testcase classname="t" name="a"><failure message="AssertionError: off by 2">x</failure></testcase><testcase classname="t" name="a"><error message="failed on teardown with &quot;OSError: busy&quot;">E   OSError: busy</error></testcase>"#,
        );
        let mut e = ev(&xml);
        e.exit_code = Some(1);
        assert_eq!(classify(&e).status(), VerdictStatus::DebugRed);
        let xml = suite(
            r#"<testcase classname="t" name="a"><error message="failed on teardown with &quot;OSError: busy&quot;">E   OSError: busy</error></testcase>"#,
        );
        assert_eq!(
            classify(&ev(&xml)),
            Verdict::Error {
                kind: ErrorKind::Teardown,
                detail: "t::a: OSError: busy".into()
            }
        );
    }

    /// One testcase element as pytest (with the fvd plugin) writes it.
    fn case_xml(i: usize, kind: u8) -> String {
        let prop = |v: &str| {
            format!(r#"<properties><property name="fvd_outcome" value="{v}" /></properties>"#)
        };
        let body = match kind {
            0 => prop("passed"),
            1 => format!(
                r#"{}<skipped type="pytest.skip" message="why {i}">t.py:1: why</skipped>"#,
                prop("skipped")
            ),
            2 => format!(
                r#"{}<skipped type="pytest.xfail" message="later" />"#,
                prop("xfailed")
            ),
            3 => prop("xpassed"),
            4 => format!(
                r#"{}<failure message="AssertionError: bad">E bad</failure>"#,
                prop("failed")
            ),
            _ => format!(
                r#"{}<error message="failed on setup with &quot;E&quot;">E   OSError: x</error>"#,
                prop("error")
            ),
        };
        format!(r#"<testcase classname="t" name="c{i}">{body}</testcase>"#)
    }

    proptest::proptest! {
        /// A run is a pass exactly when at least one case passed and every
        /// case passed; any skip, xfail or xpass makes it a scaffold at best.
        #[test]
        fn pass_only_when_every_case_passed(
            kinds in proptest::collection::vec(0u8..6, 0..12),
            exit in proptest::sample::select(vec![0, 1, 5]),
        ) {
            let body: String = kinds.iter().enumerate().map(|(i, k)| case_xml(i, *k)).collect();
            let xml = suite(&body);
            let mut e = ev(&xml);
            e.exit_code = Some(exit);
            let v = classify(&e);
            let all_pass = !kinds.is_empty() && kinds.iter().all(|k| *k == 0);
            if v.is_pass() {
                proptest::prop_assert!(all_pass && exit == 0, "{v:?} for {kinds:?}");
            }
            if all_pass && exit == 0 {
                proptest::prop_assert!(v.is_pass(), "{v:?}");
            }
            let skipped = kinds.iter().any(|k| (1..=3).contains(k));
            let broken = kinds.iter().any(|k| *k >= 4);
            if skipped && !broken && exit == 0 {
                proptest::prop_assert_eq!(v.status(), VerdictStatus::ScaffoldSkip);
            }
            if kinds.contains(&5) {
                proptest::prop_assert_eq!(v.status(), VerdictStatus::Error);
            } else if kinds.contains(&4) {
                proptest::prop_assert_eq!(v.status(), VerdictStatus::DebugRed);
            }
        }
    }
}
