//! What the actors and the gRPC edges exchange about workers and jobs,
//! beside the rows of [`crate::model`]: a worker's registration, a job as
//! handed to it and its report back, collected files, a chunk of output,
//! and the port events watchers follow. Wire (prost) types are converted to
//! these at the edge and never travel further.

use crate::model::{ComponentRow, GateEventRow};
use std::collections::BTreeMap;

/// A GPU a worker announced.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
}

/// What a worker announced when it registered.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo {
    pub worker_id: String,
    pub host: String,
    pub gpus: Vec<GpuInfo>,
    pub cpu_slots: u32,
    pub labels: BTreeMap<String, String>,
    /// Paths relative to a port folder that the worker has for its jobs
    /// (`fvd worker --provide`): a job whose spec lists `worker_paths` goes
    /// only to a worker providing each of them.
    pub provides: Vec<String>,
}

/// A job as handed to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub job_id: String,
    pub lease_epoch: u64,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub secret_env: Vec<String>,
    pub cwd: String,
    pub gpus: Vec<u32>,
    pub timeout_ms: u64,
    /// W3C `traceparent` of the orchestrator's span for this job, when
    /// tracing is on: the worker's job span becomes its child.
    pub traceparent: Option<String>,
    /// Name of a variable the worker sets to an empty folder of its own;
    /// the files the job leaves there come back in [`JobReport::files`].
    pub collect_env: Option<String>,
    /// The port's preflight command (empty for none): the worker runs it
    /// once per port before its first job of that port.
    pub preflight: Vec<String>,
    /// The port the preflight is run for (its family).
    pub preflight_key: String,
    /// `Some(preload)` for a warm run (`[runner] mode = "warm"`), `None`
    /// for a cold one.
    pub warm: Option<Vec<String>>,
    /// The commit the job runs (empty: none, run in `cwd` as it is).
    pub commit: String,
    /// The port folder's place inside the commit's tree.
    pub code_prefix: String,
    /// Paths (relative to the port folder) the job needs from the worker:
    /// found in a shared checkout, or linked from what the worker provides.
    pub worker_paths: Vec<String>,
    /// Files fvd writes into the checkout (relative to the port folder),
    /// left out when a worker compares a shared checkout with the commit.
    pub fvd_writes: Vec<String>,
    /// The port (family) and component the job runs for (span attributes).
    pub family: String,
    pub component: String,
    /// With `collect_env`: how the worker compares the folder's trace files
    /// where they lie; the report comes back in [`JobReport::trace_report`].
    pub compare: Option<TraceCompare>,
    /// Set when the job is an agent attempt ([`AgentJob`]).
    pub agent: Option<AgentJob>,
    /// MiB of its one GPU the job shares, as placed; 0 when it holds its
    /// GPUs alone.
    pub share_mib: u64,
    /// With `share_mib`: the most runs its GPU may hold at once (the
    /// scheduler's cap); 0 when it holds its GPUs alone.
    pub share_cap: u32,
}

/// An agent attempt run as a fleet job (issue #32): the worker runs it in
/// a checkout of its own of the assignment's commit, made for it and
/// removed after, and sends back the commit it leaves
/// ([`JobReport::agent`]). In `argv`, `env` values, `files` and `packet`,
/// the worker replaces `{attempt_dir}`, `{workdir}`, `{prompt_file}`,
/// `{handoff_file}`, `{fvd}` (its own program), and `{proxy_url}` and
/// `{tools_addr}` (its loopback ends of the tunnels to the attempt's model
/// proxy and tools).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentJob {
    /// The packet, written to `{prompt_file}`.
    pub packet: String,
    /// The packet also goes on the agent's stdin (a preset's CLI).
    pub packet_on_stdin: bool,
    /// Files written under `{attempt_dir}` first: `(relative path, text)`.
    pub files: Vec<(String, String)>,
    /// The agent reaches a model proxy through the worker's tunnel.
    pub proxied: bool,
    /// The agent reaches its tools (`fvd mcp`) through the worker's tunnel
    /// (`{tools_addr}`).
    pub tools: bool,
    pub commit_message: String,
}

/// What an agent attempt left on its worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentOutcome {
    /// The attempt's commit; empty with `error` when there is none.
    pub commit: String,
    /// The git pack of its objects, thin against the base commit.
    pub pack: Vec<u8>,
    pub handoff: String,
    pub stdout: String,
    /// Why the worker could not commit or send the attempt.
    pub error: String,
    /// Why the orchestrator refused the attempt's commit (its pack was over
    /// `--max-attempt-pack-mib`): the agent's doing, the attempt's outcome.
    pub refused: String,
}

/// How a worker compares a traced rerun's files: the two sides' globs in
/// the collected folder and the comparison options, as the spec writes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceCompare {
    pub reference: String,
    pub port: String,
    pub rename: Vec<String>,
    pub tol: Vec<String>,
    pub steps: Option<String>,
}

/// Messages the orchestrator sends down a worker's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ToWorker {
    /// Boxed: a worker's channel of these allocates 32 slots up front.
    Assign(Box<Assignment>),
    Cancel {
        job_id: String,
        lease_epoch: u64,
        reason: String,
    },
}

/// What a worker reported at the end of a job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobReport {
    pub job_id: String,
    pub lease_epoch: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: u64,
    pub junit_xml: Option<String>,
    /// What became of the report; the verdict is classified from this.
    pub junit_status: JunitStatus,
    /// Why there is no report, in words for people.
    pub junit_error: String,
    pub output_tail: String,
    pub survivors: Vec<u32>,
    pub spawn_error: String,
    /// Files of the folder named by [`Assignment::collect_env`], sent back
    /// over the stream (the orchestrator may not see the worker's disk).
    pub files: Vec<CollectedFile>,
    /// Why the folder's files did not come back (over the size limit,
    /// unreadable); empty when they did or none were asked for.
    pub files_error: String,
    /// The port's preflight failed on this worker: the job did not run.
    pub preflight_error: String,
    /// The worker's comparison of the collected trace files (fvd_trace's
    /// report JSON), when the assignment asked for one.
    pub trace_report: Option<String>,
    /// Why the worker could not compare them; empty otherwise.
    pub trace_error: String,
    /// What the collected folder held on the worker: bytes and files.
    pub collected_bytes: u64,
    pub collected_files: u32,
    /// Time the worker spent comparing.
    pub compare_ms: u64,
    /// Size of the result message as it came over the wire (0 when it did
    /// not, as in tests).
    pub wire_bytes: u64,
    /// An agent attempt's result ([`Assignment::agent`]).
    pub agent: Option<AgentOutcome>,
    /// The most GPU memory the run held, as fvd's pytest plugin measured
    /// it; `None`: unknown (no CUDA, no plugin, a worker older than the
    /// field).
    pub peak_gpu_mib: Option<u64>,
    /// The memory of the smallest GPU the run's lease held, as its worker
    /// registered it (0: unknown). Not on the wire: the scheduler sets it
    /// when the report arrives.
    pub gpu_memory_mib: u64,
}

/// What became of a job's JUnit report, as its worker said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JunitStatus {
    /// The job asked for none.
    #[default]
    NotRequested,
    /// Read: [`JobReport::junit_xml`] holds it (none when the file was
    /// empty).
    Read,
    /// The test did not write it.
    Missing,
    /// It exists but could not be read; [`JobReport::junit_error`] says why.
    Unreadable,
}

/// One file a job left in its collected folder.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollectedFile {
    /// Relative to the collected folder, `/`-separated, no `..`.
    pub path: String,
    pub data: Vec<u8>,
}

/// Events a port emits for watchers (`fvd submit --wait`, `fvd status`).
#[derive(Debug, Clone, PartialEq)]
pub enum PortEvent {
    Component {
        family: String,
        component: ComponentRow,
    },
    Gate {
        family: String,
        event: GateEventRow,
    },
    Finished {
        family: String,
    },
}

impl PortEvent {
    pub fn family(&self) -> &str {
        match self {
            PortEvent::Component { family, .. }
            | PortEvent::Gate { family, .. }
            | PortEvent::Finished { family } => family,
        }
    }
}

/// A chunk of a job's output, as stored. A chunk whose `(job_id, seq)` is
/// already stored is a retransmission and is ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct LogChunk {
    pub job_id: String,
    pub seq: u64,
    /// 1 stdout, 2 stderr.
    pub stream: i32,
    pub offset: u64,
    pub data: Vec<u8>,
}
