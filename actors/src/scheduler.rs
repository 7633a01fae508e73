//! `SchedulerActor`: the worker registry, slots, the job queue and leases.
//!
//! One per orchestrator process. Workers are registered by the gRPC edge
//! with the sender half of their stream; jobs arrive from component actors.
//! A job is leased to one worker under a fresh, strictly increasing epoch
//! that is committed to the store before the assignment is sent, so a
//! result carrying an older epoch can always be told apart and rejected.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef};
use tokio::sync::mpsc;

use fvd_spec::Placement;
use fvd_store::Store;
use fvd_store::clock::Clock;
use fvd_store::messages::{Assignment, JobReport, LogChunk, ToWorker, WorkerInfo};
use fvd_store::model::JobRecord;

mod capacity;
mod fits;
mod fleet;
mod gpus;
mod leases;
pub mod placement;
mod registry;
mod writer;

use capacity::{Capacity, ClassId, Free, labels_match};
use fits::*;
pub use fleet::{FleetJob, FleetView, FleetWorker};
pub use gpus::{
    DEFAULT_GPU_HEADROOM_PCT, DEFAULT_GPU_SHARE_CAP, LEARNED_HEADROOM, LEARNED_ROUND_MIB,
    SharedGpu, Sharing, ask_mib, learned,
};
use gpus::{GpuUses, share_of};
use leases::*;
pub use placement::{FairQueue, MAX_BYPASS, Policy};
use registry::*;
use writer::*;

/// How many times a job whose worker was lost is put back in the queue
/// before its component gives up with `infra_error`.
pub const MAX_INFRA_RETRIES: u32 = 3;

#[derive(Debug)]
pub struct SchedulerActor;

/// What the scheduler tells whoever queued a job about it. The scheduler
/// knows no component and no trace actor: a subscriber hands it a
/// [`DerivedActorRef`] of its own message type (one that converts from
/// `JobEvent`, as ractor's output ports do) and maps the events into its
/// own messages.
#[derive(Debug)]
pub enum JobEvent {
    /// The job holds a lease on `worker_id` under `epoch` (committed to
    /// the store).
    Leased {
        job_id: String,
        worker_id: String,
        epoch: u64,
    },
    /// Its process started on the worker.
    Started { job_id: String, worker_id: String },
    /// The worker reported its end. `shared`: the GPU it shared with
    /// another run while it ran, if it did.
    Finished {
        report: JobReport,
        worker_id: String,
        shared: Option<SharedGpu>,
    },
    /// The queued job cannot be placed for now (`reason`), or can again
    /// (empty `reason`). `environment`: the only workers that could take it
    /// are excluded by the job ([`QueuedJob::exclude`]).
    Waiting {
        job_id: String,
        reason: String,
        environment: bool,
    },
    /// No worker of a fixed fleet (embedded mode) can ever hold the job: it
    /// left the queue, and `reason` says why and what to change.
    Unplaceable { job_id: String, reason: String },
    /// The worker running the job was lost; the job went back to the queue
    /// unless `give_up` (it was lost too often).
    WorkerLost {
        job_id: String,
        worker_id: String,
        give_up: bool,
    },
    /// A run in flight that [`SchedulerMsg::Adopt`] asked for runs on no
    /// worker (`reason` says why): its owner abandons it and queues a new
    /// run. An adopted run is told with [`JobEvent::Leased`] instead.
    NotAdopted { job_id: String, reason: String },
}

/// Makes `$msg` an output port of the scheduler: its `$variant` carries a
/// [`JobEvent`], so the actor's ref derives a `DerivedActorRef<JobEvent>`
/// ([`QueuedJob::notify`]), as ractor's output ports do.
macro_rules! job_event_msg {
    ($msg:ident :: $variant:ident) => {
        impl From<$crate::scheduler::JobEvent> for $msg {
            fn from(e: $crate::scheduler::JobEvent) -> Self {
                $msg::$variant(e)
            }
        }

        impl TryFrom<$msg> for $crate::scheduler::JobEvent {
            type Error = $msg;

            fn try_from(m: $msg) -> Result<Self, $msg> {
                // A message type may have no other variant.
                #[allow(unreachable_patterns)]
                match m {
                    $msg::$variant(e) => Ok(e),
                    other => Err(other),
                }
            }
        }
    };
}
pub(crate) use job_event_msg;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// A worker silent for longer than this loses its leases.
    pub lease_ttl: Duration,
    /// How often leases are checked.
    pub tick: Duration,
    /// No worker will join but those registered (embedded mode's one local
    /// worker): a job none of them can ever hold is refused at once
    /// ([`JobEvent::Unplaceable`]) instead of waiting for one.
    pub fixed_fleet: bool,
    /// Most bytes of output stored per lease, whatever the worker sends
    /// (a worker keeps to this by default, head and tail): chunks past it
    /// are dropped, with one warning per run.
    pub max_output_bytes: u64,
    /// How long after its start the scheduler holds the runs an earlier
    /// process leased (still `running` in the store) for their workers to
    /// come back and report them: a run its worker reports within this
    /// time is adopted by its component (same job, same epoch), not run
    /// again; one no worker reports is run again. Zero, or a fixed fleet
    /// (whose one worker died with the process), holds none.
    pub adopt_grace: Duration,
    /// How a port's queued jobs are ordered ([`Policy`]).
    pub placement: Policy,
    /// How single-GPU runs with a known memory need share GPUs.
    pub sharing: Sharing,
}

/// [`SchedulerConfig::max_output_bytes`] by default: 16 MiB, as workers.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;

/// Room past the cap for the lines a worker adds where it cut its output.
const OUTPUT_CAP_SLACK: u64 = 64 * 1024;

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(5),
            tick: Duration::from_millis(500),
            fixed_fleet: false,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            adopt_grace: Duration::from_secs(15),
            placement: Policy::default(),
            sharing: Sharing::default(),
        }
    }
}

#[derive(Debug)]
pub struct SchedulerArgs {
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub config: SchedulerConfig,
}

/// What the scheduler keeps of a queued run's row: what its assignment,
/// its span and the fleet view read. A queue of hundreds of thousands of
/// jobs holds one each, so the row's result fields stay in the store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueuedRun {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub argv: Vec<String>,
    pub cwd: String,
    pub gpus_needed: u32,
    pub timeout_ms: u64,
    pub queued_ms: i64,
    pub commit: String,
    pub code_prefix: String,
    /// See [`JobRecord::expected_ms`].
    pub expected_ms: Option<u64>,
}

impl From<JobRecord> for QueuedRun {
    fn from(r: JobRecord) -> Self {
        Self {
            job_id: r.job_id,
            family: r.family,
            component: r.component,
            run_no: r.run_no,
            argv: r.argv,
            cwd: r.cwd,
            gpus_needed: r.gpus_needed,
            timeout_ms: r.timeout_ms,
            queued_ms: r.queued_ms,
            commit: r.commit,
            code_prefix: r.code_prefix,
            expected_ms: r.expected_ms,
        }
    }
}

impl QueuedJob {
    /// How long its run is expected to take: its component's recent runs,
    /// else its spec's `expected_s`; `None` when neither says.
    pub fn expected_ms(&self) -> Option<u64> {
        self.record.expected_ms.or(self.placement.expected_ms)
    }
}

/// A job waiting for, or holding, a lease.
#[derive(Debug)]
pub struct QueuedJob {
    /// Its row, as `Store::queue_jobs` returned it (`JobRecord::into`).
    pub record: QueuedRun,
    /// Literal environment for the job.
    pub env: BTreeMap<String, String>,
    /// Names of variables the worker passes through and redacts.
    pub secret_env: Vec<String>,
    /// The actor told about the job's progress, in [`JobEvent`]s: the
    /// component for its parity runs, the trace actor for traced reruns. A
    /// derived ref (any actor whose messages convert from `JobEvent`)
    /// keeps the scheduler unaware of who queued the job.
    pub notify: DerivedActorRef<JobEvent>,
    /// Priority, GPU memory and labels the job needs.
    pub placement: Placement,
    /// The component's `attempt` span: each lease of the job is a `job`
    /// span under it, and its context travels to the worker.
    pub span: tracing::Span,
    /// See [`Assignment::collect_env`]; `None` for plain parity runs.
    pub collect_env: Option<String>,
    /// Workers the job must not go to, each with why (a worker whose
    /// environment failed this job's run). A worker that connects again
    /// (restarted, perhaps with its environment fixed) is taken off the
    /// list.
    pub exclude: BTreeMap<String, String>,
    /// The port's `[defaults] preflight` (empty for none), run by each
    /// worker once before its first job of the port.
    pub preflight: Vec<String>,
    /// See [`Assignment::compare`]; `None` but for traced reruns.
    pub compare: Option<Box<fvd_store::messages::TraceCompare>>,
    /// See [`Assignment::fvd_writes`].
    pub fvd_writes: Vec<String>,
    /// See [`Assignment::warm`].
    pub warm: Option<Vec<String>>,
    /// See [`Assignment::agent`]: an agent attempt, which has no row in
    /// the store's `jobs` (its ledger row is its record).
    pub agent: Option<Box<fvd_store::messages::AgentJob>>,
}

/// What a worker announced when it registered.
#[derive(Debug)]
pub struct Registration {
    pub info: WorkerInfo,
    pub tx: mpsc::Sender<ToWorker>,
    pub conn: u64,
    /// The worker process, for good (empty from an older worker).
    pub incarnation: String,
    /// The `(job_id, lease_epoch)` pairs it runs as it registers.
    pub running: Vec<(String, u64)>,
}

/// One heartbeat: the worker and the `(job_id, lease_epoch)` pairs it runs.
type Beat = (Arc<str>, Vec<(String, u64)>);

/// Heartbeats gathered at the edge between two turns of the scheduler. The
/// one that finds the batch empty sends [`SchedulerMsg::Heartbeats`]; the
/// ones after it join that message until the scheduler takes the batch. A
/// fleet of 10,000 workers beating once a second then costs the scheduler
/// one message per turn instead of 10,000 a second. A heartbeat is handled
/// no later than its own message would have been (a tick that judges
/// silence as of when it was sent still finds it ahead).
#[derive(Debug, Default)]
pub struct HeartbeatBatch(std::sync::Mutex<Vec<Beat>>);

impl HeartbeatBatch {
    /// Adds `worker_id`'s heartbeat; tells `scheduler` when the batch was
    /// empty. Fails only when the scheduler is gone.
    pub fn add(
        self: &Arc<Self>,
        scheduler: &ActorRef<SchedulerMsg>,
        worker_id: Arc<str>,
        running: Vec<(String, u64)>,
    ) -> Result<(), ractor::MessagingErr<SchedulerMsg>> {
        let first = {
            let mut beats = self.0.lock().unwrap_or_else(|e| e.into_inner());
            beats.push((worker_id, running));
            beats.len() == 1
        };
        if first {
            scheduler.cast(SchedulerMsg::Heartbeats(self.clone()))?;
        }
        Ok(())
    }

    fn take(&self) -> Vec<Beat> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[derive(Debug)]
pub enum SchedulerMsg {
    /// A worker registered; `tx` feeds its Connect stream and `conn`
    /// (unique per stream, chosen by the edge) tells this stream's
    /// disconnect apart from an older stream's of the same worker id.
    WorkerConnected {
        info: Box<WorkerInfo>,
        tx: mpsc::Sender<ToWorker>,
        conn: u64,
    },
    /// A worker registered over the wire: like [`SchedulerMsg::WorkerConnected`],
    /// with the incarnation and running jobs it announced, answered with
    /// `Err(why)` when it is refused (its id is held by another live
    /// worker).
    Register {
        registration: Box<Registration>,
        reply: ractor::RpcReplyPort<Result<(), String>>,
    },
    /// Adopt a run in flight that an earlier process leased (the job's
    /// `running` row): if its worker reports it, it goes on under its lease
    /// and `notify` hears [`JobEvent::Leased`] and then its events as for a
    /// run leased here; otherwise [`JobEvent::NotAdopted`].
    Adopt(Box<QueuedJob>),
    /// A worker's stream ended.
    WorkerDisconnected {
        worker_id: String,
        conn: u64,
    },
    /// A worker is alive and runs these `(job_id, lease_epoch)` pairs; a
    /// job it runs under a lease it no longer holds is cancelled there.
    Heartbeat {
        worker_id: String,
        running: Vec<(String, u64)>,
    },
    /// The heartbeats gathered in this batch since the scheduler last took
    /// it, each handled as a [`SchedulerMsg::Heartbeat`].
    Heartbeats(Arc<HeartbeatBatch>),
    Enqueue(Box<QueuedJob>),
    Started {
        worker_id: String,
        job_id: String,
        lease_epoch: u64,
        /// Worker clock, milliseconds since the epoch.
        at_ms: i64,
    },
    /// A chunk of a job's output (`chunk.job_id`'s).
    Log {
        worker_id: String,
        lease_epoch: u64,
        chunk: Box<LogChunk>,
    },
    Finished {
        worker_id: String,
        report: Box<JobReport>,
    },
    /// Cancel every queued or running job of a family.
    CancelFamily {
        family: String,
    },
    /// Cancel one queued or running job (an agent attempt whose model
    /// proxy tripped, or whose owner went away); its owner is not told.
    Cancel {
        job_id: String,
        reason: String,
    },
    /// The family's components are queueing their first runs: none of
    /// its jobs is placed until [`SchedulerMsg::ReleaseFamily`], or for
    /// at most `for_ms` (a component that never says it started), so the
    /// placement policy orders all of them instead of the first few that
    /// arrive taking the free GPUs.
    HoldFamily {
        family: String,
        for_ms: i64,
    },
    /// The family's jobs are placed again.
    ReleaseFamily {
        family: String,
    },
    /// Check leases and heartbeats.
    Tick,
    /// The periodic check, sent at `sent_ms` (scheduler clock). A worker
    /// is judged silent as of that moment: every heartbeat that reached
    /// the edge before it is ahead of it in the mailbox, so a scheduler
    /// that lags behind its mailbox does not take queued heartbeats for
    /// silence and drop its whole fleet.
    TickSent {
        sent_ms: i64,
    },
    /// The worker takes no new job; it leaves once its jobs are done.
    Drain {
        worker_id: String,
    },
    /// Lease what can be leased (sent by the scheduler to itself).
    Dispatch,
    /// These leases are committed: their assignments may leave (sent by
    /// the scheduler's writer).
    Committed(Vec<Planned>),
    /// Leases could not be committed: the scheduler stops.
    CommitFailed(String),
    /// Answers once every lease decided before it is committed and its
    /// assignment sent (tests and tools that need the leases to be out).
    Settle(ractor::RpcReplyPort<()>),
    /// The second half of [`SchedulerMsg::Settle`]: queued behind the
    /// committed leases.
    Settled(ractor::RpcReplyPort<()>),
    /// Counts for status and tests: (workers, queued, running).
    Counts(ractor::RpcReplyPort<(usize, usize, usize)>),
    /// Answers once at least `workers` workers are registered (at once if
    /// they already are): a readiness signal, instead of polling `Counts`.
    WhenWorkers {
        workers: usize,
        reply: ractor::RpcReplyPort<()>,
    },
    /// The live fleet for the dashboard: workers, free slots, leases,
    /// draining, the queue per port. Reads only.
    Fleet(ractor::RpcReplyPort<FleetView>),
}

#[derive(Debug)]
struct WorkerSlot {
    info: WorkerInfo,
    /// Its id as the key of the ordered indexes (capacity, last seen):
    /// moving a worker in them copies a pointer, not the id.
    key: Arc<str>,
    tx: mpsc::Sender<ToWorker>,
    /// Identifies this connection, so a stale disconnect of an older stream
    /// of the same worker id does not drop the new one.
    conn: u64,
    /// GPUs with no run on them.
    free_gpus: BTreeSet<u32>,
    /// The others: the runs and memory on each.
    uses: GpuUses,
    /// Where it sits in the capacity index's share pool (0: not there).
    share_room: u64,
    free_cpu: u32,
    last_seen_ms: i64,
    /// Draining: slots freed by finished jobs are not offered again.
    draining: bool,
    /// Its shape in the capacity index.
    class: ClassId,
    /// Where it sits in the capacity index (`None`: no room).
    free: Option<Free>,
    /// The jobs leased to it.
    leases: BTreeSet<String>,
    /// The process it is (see [`Registration::incarnation`]).
    incarnation: String,
}

impl WorkerSlot {
    /// Files the worker's free slots in `cap` after they changed.
    fn refile(&mut self, cap: &mut Capacity) {
        let new = Free::of(self.free_gpus.len(), self.free_cpu, self.draining);
        cap.set(&self.key, self.class, self.free, new);
        self.free = new;
        let room = if self.draining {
            0
        } else {
            self.uses.room(&self.info, cap.sharing)
        };
        cap.set_share(&self.key, self.class, self.share_room, room);
        self.share_room = room;
    }

    /// A run's slots come back: its GPUs (`share_mib` of each where it
    /// shared them, 0 where it held them alone) or a CPU slot. A GPU is
    /// free again once its last run ends; a draining worker offers nothing
    /// again.
    fn give_back(&mut self, gpus: &[u32], share_mib: u64) {
        if gpus.is_empty() {
            if !self.draining {
                self.free_cpu += 1;
            }
            return;
        }
        for g in gpus {
            if self.uses.give_back(*g, share_mib) && !self.draining {
                self.free_gpus.insert(*g);
            }
        }
    }
}

#[derive(Debug)]
struct Lease {
    worker_id: String,
    epoch: u64,
    gpus: Vec<u32>,
    /// MiB it holds of its one shared GPU; 0 for GPUs held alone.
    share_mib: u64,
    /// Another lease held a share of the same GPU at some time during
    /// this one.
    beside: bool,
    /// Its assignment went to the worker (its commit is done); until then
    /// the worker knows nothing of it.
    sent: bool,
    /// The `job` span of this lease; it ends with the lease.
    span: tracing::Span,
    /// Bytes of output received under this lease, and whether it passed
    /// [`SchedulerConfig::max_output_bytes`].
    output_bytes: u64,
    output_capped: bool,
}

impl Lease {
    /// Whether this is the lease `worker_id` holds under `epoch`.
    fn is(&self, worker_id: &str, epoch: u64) -> bool {
        self.worker_id == worker_id && self.epoch == epoch
    }
}

#[derive(Debug)]
struct Entry {
    /// The job as it came in its message (not moved again).
    job: Box<QueuedJob>,
    lease: Option<Lease>,
    infra_retries: u32,
    /// Why no registered worker can ever hold the job, as last told to
    /// its component (so it is told once per change, not per round).
    unplaceable: Option<String>,
}

#[derive(Debug)]
pub struct SchedulerState {
    store: Store,
    clock: Arc<dyn Clock>,
    config: SchedulerConfig,
    workers: HashMap<String, WorkerSlot>,
    /// Free slots indexed by shape and size: a dispatch never walks the
    /// workers.
    capacity: Capacity,
    /// Workers by when they were last heard from: a tick looks only at
    /// the silent ones.
    last_seen: BTreeSet<(i64, Arc<str>)>,
    queue: FairQueue,
    /// Workers held for gangs that fit nowhere yet (see [`placement`]).
    reservations: placement::Reservations,
    /// Boxed: a table sized for hundreds of thousands of queued jobs (and
    /// twice that while it grows) then holds pointers, not entries of
    /// nearly a kilobyte each.
    jobs: HashMap<String, Box<Entry>>,
    /// Jobs holding a lease.
    leased: usize,
    /// Queued jobs whose placeability a new worker may change: those told
    /// they wait (`Entry::unplaceable`) and those queued before any worker
    /// registered. A worker that connects checks these, not the queue.
    waiting: HashSet<String>,
    /// Per worker id, the jobs that exclude it ([`QueuedJob::exclude`]).
    excluded_by: HashMap<String, Vec<String>>,
    next_epoch: u64,
    /// A `Dispatch` message is already in the mailbox.
    dispatch_pending: bool,
    /// `WhenWorkers` callers waiting for that many workers.
    ready_waiters: Vec<(usize, ractor::RpcReplyPort<()>)>,
    /// Output and spawn times are written off the scheduler's path.
    writer: mpsc::UnboundedSender<Write>,
    /// Runs an earlier process leased, held for adoption until
    /// `adopt_until_ms` (see [`SchedulerConfig::adopt_grace`]).
    held: HashMap<String, Held>,
    adopt_until_ms: i64,
    /// Why held runs whose component had not asked yet went: their worker
    /// came back without them. The component's later ask is told the same
    /// reason, whichever came first (taken by that ask).
    not_held: HashMap<String, String>,
    /// Families held by [`SchedulerMsg::HoldFamily`], until when
    /// (scheduler clock).
    holds: HashMap<String, i64>,
}

/// A chunk of a run's output, stored while it is under the cap (or its run
/// waits to be adopted); past the cap it is dropped, said once. Whether
/// work may have changed.
fn log_chunk(st: &mut SchedulerState, worker_id: &str, lease_epoch: u64, chunk: LogChunk) -> bool {
    if held_by(st, worker_id, &chunk.job_id, lease_epoch) {
        // Output of a run waiting for its component to adopt it.
        let _ = st.writer.send(Write::Log(chunk));
        return false;
    }
    let cap = st.config.max_output_bytes.saturating_add(OUTPUT_CAP_SLACK);
    if let Some(e) = leased(st, worker_id, &chunk.job_id, lease_epoch)
        && let Some(lease) = e.lease.as_mut()
    {
        lease.output_bytes = lease.output_bytes.saturating_add(chunk.data.len() as u64);
        if lease.output_bytes <= cap {
            let _ = st.writer.send(Write::Log(chunk));
        } else if !std::mem::replace(&mut lease.output_capped, true) {
            tracing::warn!(worker = %worker_id, job = %chunk.job_id, cap, "a run's output passed the cap; the rest of it is not stored");
        }
    }
    true
}

/// A worker's stream ended: its runs are lost with it, unless a newer
/// connection of the same worker took over (`conn` is not its latest).
async fn disconnected(
    st: &mut SchedulerState,
    worker_id: &str,
    conn: u64,
) -> Result<(), ActorProcessingErr> {
    if st.workers.get(worker_id).is_some_and(|w| w.conn == conn) {
        tracing::info!(worker = %worker_id, "worker disconnected");
        lose_worker(st, worker_id).await?;
    }
    Ok(())
}

/// The port's runs are not placed for `for_ms` (its components are still
/// queuing their first runs).
fn hold_family(st: &mut SchedulerState, family: String, for_ms: i64) {
    let until = st.clock.now_ms().saturating_add(for_ms);
    st.queue.hold(&family);
    st.holds.insert(family, until);
}

/// Leases, held runs and port holds whose time ran out at `now`.
async fn expire(st: &mut SchedulerState, now: i64) -> Result<(), ActorProcessingErr> {
    expire_leases(st, now).await?;
    expire_held(st, now).await;
    expire_holds(st, now);
    Ok(())
}

/// A draining worker gets no new job.
fn drain(st: &mut SchedulerState, worker_id: &str) {
    if let Some(w) = st.workers.get_mut(worker_id) {
        tracing::info!(worker = %worker_id, "worker drains: no new jobs for it");
        w.draining = true;
        w.free_cpu = 0;
        w.free_gpus.clear();
        w.refile(&mut st.capacity);
    }
}

/// Dispatch once the messages already waiting are handled: under load many
/// finished jobs free their slots first and one round (one commit) leases
/// them all; when idle the round runs right away.
fn dispatch_soon(
    myself: &ActorRef<SchedulerMsg>,
    st: &mut SchedulerState,
) -> Result<(), ActorProcessingErr> {
    if !st.dispatch_pending {
        st.dispatch_pending = true;
        myself.cast(SchedulerMsg::Dispatch)?;
    }
    if fvd_telemetry::metrics::enabled() {
        fvd_telemetry::metrics::jobs(st.queue.len(), st.leased);
    }
    Ok(())
}

/// Answers a question to the scheduler (settled, enough workers, counts,
/// the fleet's view); it changes no work.
async fn answer(
    myself: &ActorRef<SchedulerMsg>,
    st: &mut SchedulerState,
    msg: SchedulerMsg,
) -> Result<(), ActorProcessingErr> {
    match msg {
        SchedulerMsg::Settle(reply) => {
            // Every lease is committed after this, and its `Committed`
            // is in the mailbox: the answer goes behind it.
            written(st).await;
            myself.cast(SchedulerMsg::Settled(reply))?;
        }
        SchedulerMsg::Settled(reply) => {
            let _ = reply.send(());
        }
        SchedulerMsg::WhenWorkers { workers, reply } => {
            if st.workers.len() >= workers {
                let _ = reply.send(());
            } else {
                st.ready_waiters.push((workers, reply));
            }
        }
        SchedulerMsg::Counts(reply) => {
            let _ = reply.send((st.workers.len(), st.queue.len(), st.leased));
        }
        SchedulerMsg::Fleet(reply) => {
            let _ = reply.send(fleet::view(st));
        }
        other => tracing::warn!(?other, "not a question to the scheduler"),
    }
    Ok(())
}

impl Actor for SchedulerActor {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SchedulerArgs,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        // Epochs above any an earlier process may have sent, and a block
        // of them reserved (synced) before the first lease.
        let floor = args.store.epoch_floor().await?;
        let reserved = floor.saturating_add(EPOCH_BLOCK);
        args.store.reserve_epochs(reserved).await?;
        let next_epoch = floor + 1;
        // Runs left in flight by an earlier process wait for their workers.
        let mut held = HashMap::new();
        if !args.config.fixed_fleet && !args.config.adopt_grace.is_zero() {
            for (job, family, worker_id, epoch, gpus) in args.store.running_leases().await? {
                held.insert(
                    job,
                    Held {
                        family,
                        worker_id,
                        epoch,
                        gpus,
                        reported: false,
                        waiter: None,
                        early: None,
                    },
                );
            }
            if !held.is_empty() {
                tracing::info!(
                    runs = held.len(),
                    grace_s = args.config.adopt_grace.as_secs_f64(),
                    "runs in flight before this start wait for their workers to report them"
                );
            }
        }
        let adopt_until_ms = args.clock.now_ms() + args.config.adopt_grace.as_millis() as i64;
        let capacity = Capacity::new(args.config.sharing);
        let clock = args.clock.clone();
        myself.send_interval(args.config.tick, move || SchedulerMsg::TickSent {
            sent_ms: clock.now_ms(),
        });
        Ok(SchedulerState {
            writer: spawn_writer(args.store.clone(), myself.clone(), reserved),
            store: args.store,
            clock: args.clock,
            config: args.config,
            workers: HashMap::new(),
            capacity,
            last_seen: BTreeSet::new(),
            queue: FairQueue::default(),
            reservations: placement::Reservations::default(),
            jobs: HashMap::new(),
            leased: 0,
            waiting: HashSet::new(),
            excluded_by: HashMap::new(),
            next_epoch,
            dispatch_pending: false,
            ready_waiters: Vec::new(),
            held,
            adopt_until_ms,
            not_held: HashMap::new(),
            holds: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: SchedulerMsg,
        st: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        // Whether the message may have freed or added work: then a dispatch
        // round follows. Questions are answered in [`answer`].
        let work_changed = match msg {
            SchedulerMsg::WorkerConnected { info, tx, conn } => {
                let r = Registration {
                    info: *info,
                    tx,
                    conn,
                    incarnation: String::new(),
                    running: Vec::new(),
                };
                if let Err(why) = worker_connected(st, r).await? {
                    tracing::warn!(%why, "refused a worker");
                }
                true
            }
            SchedulerMsg::Register {
                registration,
                reply,
            } => {
                let r = worker_connected(st, *registration).await?;
                let _ = reply.send(r);
                true
            }
            SchedulerMsg::Adopt(job) => {
                adopt(st, job).await;
                true
            }
            SchedulerMsg::WorkerDisconnected { worker_id, conn } => {
                disconnected(st, &worker_id, conn).await?;
                true
            }
            SchedulerMsg::Heartbeat { worker_id, running } => {
                heartbeat(st, &worker_id, running).await;
                false
            }
            SchedulerMsg::Heartbeats(batch) => {
                for (worker_id, running) in batch.take() {
                    heartbeat(st, &worker_id, running).await;
                }
                false
            }
            SchedulerMsg::Enqueue(job) => {
                enqueue(st, job);
                true
            }
            SchedulerMsg::Started {
                worker_id,
                job_id,
                lease_epoch,
                at_ms,
            } => {
                started(st, worker_id, job_id, lease_epoch, at_ms);
                true
            }
            SchedulerMsg::Log {
                worker_id,
                lease_epoch,
                chunk,
            } => log_chunk(st, &worker_id, lease_epoch, *chunk),
            SchedulerMsg::Finished { worker_id, report } => finished(st, worker_id, *report),
            SchedulerMsg::CancelFamily { family } => {
                release_family(st, &family);
                cancel_family(st, &family).await;
                true
            }
            SchedulerMsg::Cancel { job_id, reason } => {
                cancel_job(st, &job_id, &reason).await;
                true
            }
            SchedulerMsg::HoldFamily { family, for_ms } => {
                hold_family(st, family, for_ms);
                false
            }
            SchedulerMsg::ReleaseFamily { family } => release_family(st, &family),
            SchedulerMsg::Tick => {
                let now = st.clock.now_ms();
                expire(st, now).await?;
                true
            }
            SchedulerMsg::TickSent { sent_ms } => {
                expire(st, sent_ms).await?;
                true
            }
            SchedulerMsg::Drain { worker_id } => {
                drain(st, &worker_id);
                false
            }
            SchedulerMsg::Dispatch => {
                st.dispatch_pending = false;
                // A round cut at its lease budget goes on after the rest.
                dispatch(st)?
            }
            SchedulerMsg::Committed(planned) => {
                assign(st, planned).await;
                false
            }
            SchedulerMsg::CommitFailed(e) => {
                return Err(format!("could not commit leases: {e}").into());
            }
            query @ (SchedulerMsg::Settle(_)
            | SchedulerMsg::Settled(_)
            | SchedulerMsg::WhenWorkers { .. }
            | SchedulerMsg::Counts(_)
            | SchedulerMsg::Fleet(_)) => {
                answer(&myself, st, query).await?;
                false
            }
        };
        if work_changed {
            dispatch_soon(&myself, st)?;
        }
        Ok(())
    }
}

/// The UUIDs of a worker's GPUs in `leased`, comma-separated (a span
/// attribute of the job).
fn gpu_uuids(worker: &WorkerInfo, leased: &[u32]) -> String {
    worker
        .gpus
        .iter()
        .filter(|g| leased.contains(&g.index))
        .map(|g| g.uuid.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// A lease decided in memory, committed with the others of its round.
#[derive(Debug)]
pub struct Planned {
    job_id: String,
    worker_id: String,
    epoch: u64,
    gpus: Vec<u32>,
    share_mib: u64,
}

/// Most leases one round decides (one transaction); a round that reaches
/// it lets the messages that arrived meanwhile in, then goes on.
const LEASES_PER_ROUND: usize = 4096;

/// Most placement questions of one round that find no room; past it the
/// round ends and the next event (at the latest the next tick) starts
/// another. With the round's memory of what found no room it rarely comes
/// near it.
const MISSES_PER_ROUND: usize = 1024;

/// The scheduler's free capacity as [`placement::place`] sees it: the
/// capacity index and the workers' free slots.
struct FreeSlots<'a> {
    capacity: &'a mut Capacity,
    workers: &'a mut HashMap<String, WorkerSlot>,
}

impl placement::Fleet for FreeSlots<'_> {
    fn is_full(&self) -> bool {
        self.capacity.is_full()
    }

    fn pick(&mut self, job: &placement::Job<'_>, accept: &dyn Fn(&str) -> bool) -> Option<String> {
        // Gang placement: all GPUs of a job on one worker. Among workers
        // with room, the one with the most free room, so load spreads out.
        let workers = &*self.workers;
        let p = job.placement;
        self.capacity.pick(job.need, p, &|w| !accept(w), &|w| {
            free_usable(workers, w, p)
        })
    }

    fn nearest(
        &mut self,
        job: &placement::Job<'_>,
        accept: &dyn Fn(&str) -> bool,
    ) -> Option<String> {
        let workers = &*self.workers;
        let p = job.placement;
        self.capacity
            .nearest(job.need, p, accept, &|w| free_usable(workers, w, p))
    }

    fn free_gpus(&self, worker: &str, job: &placement::Job<'_>) -> Option<u32> {
        self.workers
            .get(worker)
            .filter(|w| !w.draining)
            .map(|w| usable_gpus(&w.info, Some(&w.free_gpus), job.placement).len() as u32)
    }

    fn take(&mut self, worker: &str, job: &placement::Job<'_>) -> (Vec<u32>, u64) {
        let w = self.workers.get_mut(worker).expect("picked worker exists");
        let sharing = self.capacity.sharing;
        let share = share_of(job.need, job.placement);
        let packed = share.and_then(|mib| Some((w.uses.best_fit(&w.info, sharing, mib)?, mib)));
        let taken = if job.need == 0 {
            w.free_cpu -= 1;
            (Vec::new(), 0)
        } else if let Some((g, mib)) = packed {
            w.uses.take(g, mib);
            (vec![g], mib)
        } else {
            let g: Vec<u32> = usable_gpus(&w.info, Some(&w.free_gpus), job.placement)
                .into_iter()
                .take(job.need as usize)
                .collect();
            // A sharing run on a fresh GPU shares it only if it fits the
            // budget; else it holds the GPU alone.
            let mib = share
                .filter(|mib| {
                    let memory = w.info.gpus.iter().find(|x| Some(&x.index) == g.first());
                    memory.is_some_and(|x| sharing.shares(*mib, x.memory_mib))
                })
                .unwrap_or(0);
            for x in &g {
                w.free_gpus.remove(x);
                w.uses.take(*x, mib);
            }
            (g, mib)
        };
        w.refile(self.capacity);
        taken
    }
}

/// Free GPUs of worker `w` with the memory `p` asks for.
fn free_usable(workers: &HashMap<String, WorkerSlot>, w: &str, p: &Placement) -> usize {
    workers
        .get(w)
        .map_or(0, |w| usable_gpus(&w.info, Some(&w.free_gpus), p).len())
}

/// The queued jobs as [`placement::place`] sees them.
struct QueuedJobs<'a>(&'a HashMap<String, Box<Entry>>);

impl placement::Jobs for QueuedJobs<'_> {
    fn job(&self, id: &str) -> Option<placement::Job<'_>> {
        let (id, e) = self.0.get_key_value(id)?;
        if e.lease.is_some() {
            return None;
        }
        Some(placement::Job {
            id,
            family: &e.job.record.family,
            need: e.job.record.gpus_needed,
            placement: &e.job.placement,
            exclude: &e.job.exclude,
        })
    }
}

/// Leases queued jobs to workers with room for them: the round's leases
/// are decided by [`placement::place`] under the configured policy, then
/// numbered, held in memory and handed to the writer, which commits them
/// in one transaction before they are sent. Each lease asks the capacity
/// index, never the workers one by one; the look-ahead past jobs that do
/// not fit is bounded per port ([`placement::LOOKAHEAD`]) and per round
/// ([`MISSES_PER_ROUND`]). True when the round stopped at
/// [`LEASES_PER_ROUND`] with work left.
fn dispatch(st: &mut SchedulerState) -> Result<bool, ActorProcessingErr> {
    let round = {
        let SchedulerState {
            jobs,
            workers,
            capacity,
            queue,
            reservations,
            config,
            ..
        } = st;
        placement::place(
            &mut FreeSlots { capacity, workers },
            queue,
            &QueuedJobs(jobs),
            reservations,
            config.placement,
            placement::Limits {
                leases: LEASES_PER_ROUND,
                misses: MISSES_PER_ROUND,
            },
        )
    };
    let more = round.more;
    if round.leases.is_empty() {
        return Ok(more);
    }
    let planned: Vec<Planned> = round
        .leases
        .into_iter()
        .map(|l| {
            let epoch = st.next_epoch;
            st.next_epoch += 1;
            Planned {
                job_id: l.job_id,
                worker_id: l.worker_id,
                epoch,
                gpus: l.gpus,
                share_mib: l.share_mib,
            }
        })
        .collect();
    // The leases hold from now on in memory; the writer commits them and
    // hands them back (`assign`): an assignment leaves only once its lease
    // is committed, so a crash finds the job running under its epoch and
    // reruns it once. The scheduler does not wait for the commit: it goes
    // on with the messages that arrived meanwhile, and the rounds decided
    // during one commit go together in the next.
    let now = st.clock.now_ms();
    for p in &planned {
        let worker = &st.workers[&p.worker_id].info;
        let entry = st.jobs.get_mut(&p.job_id).expect("planned job exists");
        let r = &entry.job.record;
        let queue_wait_ms = (now - r.queued_ms).max(0);
        fvd_telemetry::metrics::queue_wait(
            &r.family,
            std::time::Duration::from_millis(queue_wait_ms as u64),
        );
        let span = tracing::info_span!(
            parent: &entry.job.span,
            "job",
            "fvd.family" = %r.family,
            "fvd.component" = %r.component,
            "fvd.attempt" = i64::from(r.run_no),
            "fvd.job_id" = %p.job_id,
            "fvd.lease_epoch" = p.epoch as i64,
            "fvd.worker_id" = %p.worker_id,
            "fvd.gpus" = p.gpus.len() as i64,
            // Evaluated only when the span is recorded.
            "fvd.gpu_uuids" = %gpu_uuids(worker, &p.gpus),
            "fvd.queue_wait_ms" = queue_wait_ms,
            "fvd.gpu_seconds" = tracing::field::Empty,
            "fvd.duration_ms" = tracing::field::Empty,
            "fvd.run.peak_gpu_mib" = tracing::field::Empty,
        );
        st.waiting.remove(&p.job_id);
        st.leased += 1;
        if let Some(w) = st.workers.get_mut(&p.worker_id) {
            w.leases.insert(p.job_id.clone());
        }
        entry.lease = Some(Lease {
            worker_id: p.worker_id.clone(),
            epoch: p.epoch,
            gpus: p.gpus.clone(),
            share_mib: p.share_mib,
            beside: false,
            sent: false,
            span,
            output_bytes: 0,
            output_capped: false,
        });
        if p.share_mib > 0 {
            mark_beside(st, &p.worker_id, &p.job_id);
        }
    }
    if st.writer.send(Write::Leases(planned)).is_err() {
        return Err("the scheduler's writer stopped".into());
    }
    Ok(more)
}

/// A sharing lease of `job_id` was placed on `worker_id`: when another
/// sharing lease holds its GPU, both ran beside another run (an out of
/// memory error then says nothing of the code alone).
fn mark_beside(st: &mut SchedulerState, worker_id: &str, job_id: &str) {
    let Some(w) = st.workers.get(worker_id) else {
        return;
    };
    let gpus = |j: &str| {
        st.jobs
            .get(j)
            .and_then(|e| e.lease.as_ref())
            .filter(|l| l.share_mib > 0)
            .map(|l| l.gpus.clone())
    };
    let Some(mine) = gpus(job_id) else {
        return;
    };
    if w.uses.on(mine[0]).runs < 2 {
        return;
    }
    let beside: Vec<String> = w
        .leases
        .iter()
        .filter(|j| gpus(j).is_some_and(|g| g == mine))
        .cloned()
        .collect();
    for j in beside {
        if let Some(l) = st.jobs.get_mut(&j).and_then(|e| e.lease.as_mut()) {
            l.beside = true;
        }
    }
}

/// Committed leases: each job that still holds its lease (not cancelled,
/// its worker not lost meanwhile) is assigned, and its owner told.
async fn assign(st: &mut SchedulerState, planned: Vec<Planned>) {
    let cap = st.capacity.sharing.cap;
    for p in planned {
        let Some(entry) = st.jobs.get_mut(&p.job_id) else {
            continue;
        };
        let Some(lease) = entry.lease.as_mut().filter(|l| l.is(&p.worker_id, p.epoch)) else {
            continue;
        };
        lease.sent = true;
        let r = &entry.job.record;
        let assignment = Assignment {
            job_id: p.job_id.clone(),
            lease_epoch: p.epoch,
            argv: r.argv.clone(),
            env: entry.job.env.clone(),
            secret_env: entry.job.secret_env.clone(),
            cwd: r.cwd.clone(),
            gpus: p.gpus,
            timeout_ms: r.timeout_ms,
            traceparent: fvd_telemetry::traceparent(&lease.span),
            collect_env: entry.job.collect_env.clone(),
            preflight: entry.job.preflight.clone(),
            preflight_key: r.family.clone(),
            warm: entry.job.warm.clone(),
            family: r.family.clone(),
            component: r.component.clone(),
            commit: r.commit.clone(),
            code_prefix: r.code_prefix.clone(),
            worker_paths: entry.job.placement.worker_paths.clone(),
            fvd_writes: entry.job.fvd_writes.clone(),
            compare: entry.job.compare.as_deref().cloned(),
            agent: entry.job.agent.as_deref().cloned(),
            share_mib: lease.share_mib,
            share_cap: if lease.share_mib > 0 { cap } else { 0 },
        };
        let _ = entry.job.notify.send_message(JobEvent::Leased {
            job_id: p.job_id.clone(),
            worker_id: p.worker_id.clone(),
            epoch: p.epoch,
        });
        let Some(w) = st.workers.get(&p.worker_id) else {
            continue;
        };
        let tx = w.tx.clone();
        if tx
            .send(ToWorker::Assign(Box::new(assignment)))
            .await
            .is_err()
        {
            // The stream is gone; the disconnect message will requeue it.
            tracing::warn!(worker = %p.worker_id, job = %p.job_id, "worker stream closed while assigning");
        }
    }
}

/// How a finished job's process ended, for its span's status.
fn job_end(report: &JobReport) -> fvd_telemetry::spans::JobEnd<'_> {
    fvd_telemetry::spans::JobEnd {
        exit_code: report.exit_code,
        signal: report.signal,
        timed_out: report.timed_out,
        cancelled: report.cancelled,
        error: if report.spawn_error.is_empty() {
            &report.preflight_error
        } else {
            &report.spawn_error
        },
    }
}
