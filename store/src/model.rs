//! The rows the store keeps (ports, components, gate events, jobs and
//! their results, worktrees) as the actors and the store share them. What
//! actors and the gRPC edge exchange about workers and jobs is in
//! [`crate::messages`].

use std::path::PathBuf;

pub use crate::states::{
    ComponentStatus, ErrorKind, GateOutcome, JobState, PortState, RecordedVerdict, UnknownState,
};

/// A port as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortRow {
    pub family: String,
    pub repo: String,
    pub spec_path: String,
    pub spec_toml: String,
    pub state: PortState,
    /// P0..P11
    pub phase: String,
    pub port_status_path: String,
    /// The commit the port is pinned to (full hex sha); empty when its
    /// folder is not in a git repository (its jobs then run in the folder
    /// itself, which only a shared file system shows the workers).
    pub commit: String,
}

/// A component's current state as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComponentRow {
    pub name: String,
    pub status: ComponentStatus,
    /// Verdict of the latest finished run (`debug_red`, `scaffold_skip`, …),
    /// or how fvd ended the component without one.
    pub verdict: RecordedVerdict,
    /// One line: the failing assertion, the skip reason, the collection error.
    pub reason: String,
    pub runs: u32,
    /// The number of its latest run, whatever its state (queued, running,
    /// ended, failed on its environment): the number `fvd logs --run` and
    /// `PORT_STATUS.md` name it by; 0 before any.
    pub last_run: u32,
    pub worker_id: String,
}

impl ComponentRow {
    /// Whether the component reached an end state of phase 6.
    pub fn is_final(&self) -> bool {
        self.status.is_final()
    }
}

/// One recorded gate decision.
#[derive(Debug, Clone, PartialEq)]
pub struct GateEventRow {
    pub phase: String,
    pub outcome: GateOutcome,
    pub conditions: Vec<String>,
    pub at_ms: i64,
}

/// One run of a parity test (a job), as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobRecord {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub state: JobState,
    pub lease_epoch: u64,
    pub worker_id: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub gpus_needed: u32,
    pub timeout_ms: u64,
    pub verdict: RecordedVerdict,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: Option<u64>,
    pub output_tail: String,
    pub queued_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    /// Environment variable names passed through (not stored: from the spec).
    pub env_names: Vec<String>,
    /// The commit the run tests: the port's, or an agent attempt's; empty
    /// when the port is not in a git repository.
    pub commit: String,
    /// Where the port folder sits inside the commit's tree
    /// (`examples/tinyport/`), empty at the top: a worker that checks the
    /// commit out runs the job in that folder of its checkout.
    pub code_prefix: String,
    /// How long the run is expected to take: the median duration of its
    /// component's last [`crate::RECENT_RUNS`] finished runs when it was
    /// queued (`None` before the first). Not a column: [`crate::Store::queue_jobs`]
    /// reads it from those runs' rows.
    pub expected_ms: Option<u64>,
    /// The most GPU memory the run held, as fvd's pytest plugin measured
    /// it; `None`: unknown (no CUDA, no plugin, an older worker).
    pub peak_gpu_mib: Option<u64>,
    /// What the component's recorded runs say of the GPU memory this run
    /// needs. Not a column: [`crate::Store::queue_jobs`] reads it when the
    /// run is queued, like [`Self::expected_ms`].
    pub gpu_history: GpuHistory,
}

/// What a component's recorded runs say of the GPU memory its next run
/// needs (issue #44), read when the run is queued: each run's
/// [`JobResult::next_gpu_mib`], already bounded by the GPU it ran on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuHistory {
    /// The most any of the component's last [`crate::RECENT_RUNS`]
    /// finished runs with a measured peak asks for (its peak with
    /// headroom); `None` when none has one.
    pub learned_mib: Option<u64>,
    /// The most any of its runs that ran out of memory while sharing a
    /// GPU (`shared_oom`) asks for (its ask doubled); `None` when none did.
    pub raised_mib: Option<u64>,
    /// The run number of the component's latest recorded run when that run
    /// ran out of memory while sharing (`shared_oom`): the run queued now
    /// is the one that runs alone after it, whichever process queues it.
    pub after_shared_oom: Option<u32>,
}

/// The classified outcome of a run, as recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobResult {
    pub verdict: RecordedVerdict,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub junit_xml: String,
    pub output_tail: String,
    /// The most GPU memory the run held ([`JobRecord::peak_gpu_mib`]);
    /// `None`: unknown, never 0 for it.
    pub peak_gpu_mib: Option<u64>,
    /// What the component's later runs ask for after this one, bounded by
    /// the GPU it ran on ([`GpuHistory`]); `None`: it says nothing.
    pub next_gpu_mib: Option<u64>,
}

/// A component's git worktree (`fvd_workspace::worktree` makes and
/// moves it; the store records it).
#[derive(Debug, Clone, PartialEq)]
pub struct Worktree {
    pub path: PathBuf,
    pub branch: String,
    /// The commit the branch was made from.
    pub base_commit: String,
    /// Where the port folder sits inside the repository (`examples/tinyport/`),
    /// empty when it is the repository's top. Found again at each start,
    /// not stored.
    pub prefix: String,
}

impl Worktree {
    /// The port folder inside the worktree: where its runs and its agent
    /// work.
    pub fn workdir(&self) -> PathBuf {
        self.path.join(&self.prefix)
    }
}

/// The code a port's runs test: what its component and trace actors put on
/// each job they queue (an agent component's runs name their attempt's
/// commit instead, inside the same repository).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortCode {
    /// The commit the port is pinned to; empty when it is not in git.
    pub commit: String,
    /// Where the port folder sits inside the repository.
    pub prefix: String,
    /// Files fvd itself writes into the checkout while the port runs
    /// (relative to the port folder: its `PORT_STATUS.md`): a shared
    /// checkout that differs from the commit only there is still at it.
    pub fvd_writes: Vec<String>,
}
