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
use fvd_store::model::{Assignment, JobRecord, JobReport, LogChunk, ToWorker, WorkerInfo};

mod capacity;
mod fleet;
pub mod placement;
use capacity::{Capacity, ClassId, Free, labels_match};
pub use fleet::{FleetJob, FleetView, FleetWorker};
pub use placement::{FairQueue, MAX_BYPASS, Policy};

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
    /// The worker reported its end.
    Finished {
        report: JobReport,
        worker_id: String,
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
    pub compare: Option<Box<fvd_store::model::TraceCompare>>,
    /// See [`Assignment::fvd_writes`].
    pub fvd_writes: Vec<String>,
    /// See [`Assignment::warm`].
    pub warm: Option<Vec<String>>,
    /// See [`Assignment::agent`]: an agent attempt, which has no row in
    /// the store's `jobs` (its ledger row is its record).
    pub agent: Option<Box<fvd_store::model::AgentJob>>,
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
    free_gpus: BTreeSet<u32>,
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
    }
}

#[derive(Debug)]
struct Lease {
    worker_id: String,
    epoch: u64,
    gpus: Vec<u32>,
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

/// A run an earlier orchestrator process leased, still `running` in the
/// store: its worker may still run it.
#[derive(Debug)]
struct Held {
    family: String,
    worker_id: String,
    epoch: u64,
    gpus: Vec<u32>,
    /// Its worker registered and said it runs it: its slots are taken.
    reported: bool,
    /// The component that asked to adopt it, waiting for the answer.
    waiter: Option<Box<QueuedJob>>,
    /// Its report, when the run ended before its component asked.
    early: Option<JobReport>,
}

/// Writes that need no answer before the scheduler moves on: the lease was
/// checked before they were queued, and losing the last few on a crash only
/// loses output of a run that will be rerun anyway.
#[derive(Debug)]
enum Write {
    Log(LogChunk),
    Spawned {
        job_id: String,
        at_ms: i64,
    },
    /// Delivered once everything queued before it is committed: a
    /// component learns that its run finished only after the run's output
    /// is stored, so `logs --follow` never stops short of the last chunk.
    Notify(DerivedActorRef<JobEvent>, Box<JobEvent>),
    /// A dispatch round's leases: committed (with any other rounds queued
    /// meanwhile, in one transaction), then handed back to the scheduler
    /// as [`SchedulerMsg::Committed`], which sends their assignments.
    Leases(Vec<Planned>),
    /// Answered once everything queued before it is committed.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// Lease epochs reserved per synced commit ([`Store::reserve_epochs`]): a
/// lease commits without an fsync of its own once its epoch is in a
/// reserved block. A restart skips what is left of the last block.
pub const EPOCH_BLOCK: u64 = 65_536;

/// Batches queued writes: one relaxed window (no fsync) for everything that
/// arrived while the previous batch was being written. Leases go first and
/// back to `scheduler` once committed; a lease commit that fails stops the
/// scheduler ([`SchedulerMsg::CommitFailed`]), as it did when the scheduler
/// committed them itself. `reserved` is the end of the epochs reserved so
/// far: a batch with a lease above it reserves the next block first (one
/// synced commit), and an idle writer reserves the next block ahead once
/// half of the current one is used, so a lease rarely waits for an fsync.
fn spawn_writer(
    store: Store,
    scheduler: ActorRef<SchedulerMsg>,
    mut reserved: u64,
) -> mpsc::UnboundedSender<Write> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Write>();
    fvd_telemetry::spawn(async move {
        let mut batch = Vec::new();
        let mut top = 0;
        while rx.recv_many(&mut batch, 512).await > 0 {
            let mut logs = Vec::new();
            let mut spawned = Vec::new();
            let mut notify = Vec::new();
            let mut leases = Vec::new();
            let mut barriers = Vec::new();
            for w in batch.drain(..) {
                match w {
                    Write::Log(c) => logs.push(c),
                    Write::Spawned { job_id, at_ms } => spawned.push((job_id, at_ms)),
                    Write::Notify(to, msg) => notify.push((to, msg)),
                    Write::Leases(planned) => leases.extend(planned),
                    Write::Barrier(done) => barriers.push(done),
                }
            }
            top = leases.iter().map(|p| p.epoch).fold(top, u64::max);
            let mut failed = None;
            if top > reserved {
                let through = top.saturating_add(EPOCH_BLOCK);
                match store.reserve_epochs(through).await {
                    Ok(()) => reserved = through,
                    Err(e) => failed = Some(format!("could not reserve lease epochs: {e}")),
                }
            }
            let rows: Vec<(&str, &str, u64, &[u32])> = leases
                .iter()
                .map(|p| {
                    (
                        p.job_id.as_str(),
                        p.worker_id.as_str(),
                        p.epoch,
                        p.gpus.as_slice(),
                    )
                })
                .collect();
            let rows = if failed.is_some() { &[][..] } else { &rows[..] };
            match store.record_round(rows, &logs, &spawned).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, chunks = logs.len(), "could not store job output")
                }
                Err(e) => failed = failed.or(Some(e.to_string())),
            }
            if !leases.is_empty() {
                let msg = match failed {
                    None => SchedulerMsg::Committed(leases),
                    Some(e) => SchedulerMsg::CommitFailed(e),
                };
                let _ = scheduler.cast(msg);
            }
            for (to, msg) in notify {
                let _ = to.send_message(*msg);
            }
            for done in barriers {
                let _ = done.send(());
            }
            // Ahead of need, while nothing waits: the lease path keeps off
            // the fsync of the next reservation.
            if reserved.saturating_sub(top) < EPOCH_BLOCK / 2 && rx.is_empty() {
                let through = reserved.saturating_add(EPOCH_BLOCK);
                match store.reserve_epochs(through).await {
                    Ok(()) => reserved = through,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not reserve lease epochs ahead; the next lease will")
                    }
                }
            }
        }
    });
    tx
}

/// Waits until every write queued so far is committed.
async fn written(st: &SchedulerState) {
    let (done, wait) = tokio::sync::oneshot::channel();
    if st.writer.send(Write::Barrier(done)).is_ok() {
        let _ = wait.await;
    }
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
            capacity: Capacity::default(),
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
        // round follows.
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
                if st.workers.get(&worker_id).is_some_and(|w| w.conn == conn) {
                    tracing::info!(worker = %worker_id, "worker disconnected");
                    lose_worker(st, &worker_id).await?;
                }
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
            } => {
                if held_by(st, &worker_id, &chunk.job_id, lease_epoch) {
                    // Output of a run waiting for its component to adopt it.
                    let _ = st.writer.send(Write::Log(*chunk));
                    return Ok(());
                }
                let cap = st.config.max_output_bytes.saturating_add(OUTPUT_CAP_SLACK);
                if let Some(e) = leased(st, &worker_id, &chunk.job_id, lease_epoch)
                    && let Some(lease) = e.lease.as_mut()
                {
                    lease.output_bytes = lease.output_bytes.saturating_add(chunk.data.len() as u64);
                    if lease.output_bytes <= cap {
                        let _ = st.writer.send(Write::Log(*chunk));
                    } else if !std::mem::replace(&mut lease.output_capped, true) {
                        tracing::warn!(worker = %worker_id, job = %chunk.job_id, cap, "a run's output passed the cap; the rest of it is not stored");
                    }
                }
                true
            }
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
                let until = st.clock.now_ms().saturating_add(for_ms);
                st.queue.hold(&family);
                st.holds.insert(family, until);
                false
            }
            SchedulerMsg::ReleaseFamily { family } => release_family(st, &family),
            SchedulerMsg::Tick => {
                let now = st.clock.now_ms();
                expire_leases(st, now).await?;
                expire_held(st, now).await;
                expire_holds(st, now);
                true
            }
            SchedulerMsg::TickSent { sent_ms } => {
                expire_leases(st, sent_ms).await?;
                expire_held(st, sent_ms).await;
                expire_holds(st, sent_ms);
                true
            }
            SchedulerMsg::Drain { worker_id } => {
                if let Some(w) = st.workers.get_mut(&worker_id) {
                    tracing::info!(worker = %worker_id, "worker drains: no new jobs for it");
                    w.draining = true;
                    w.free_cpu = 0;
                    w.free_gpus.clear();
                    w.refile(&mut st.capacity);
                }
                false
            }
            SchedulerMsg::Dispatch => {
                st.dispatch_pending = false;
                // A round that stopped at its lease budget goes on after
                // the messages that arrived meanwhile.
                dispatch(st)?
            }
            SchedulerMsg::Committed(planned) => {
                assign(st, planned).await;
                false
            }
            SchedulerMsg::CommitFailed(e) => {
                return Err(format!("could not commit leases: {e}").into());
            }
            SchedulerMsg::Settle(reply) => {
                // Every lease is committed after this, and its `Committed`
                // is in the mailbox: the answer goes behind it.
                written(st).await;
                myself.cast(SchedulerMsg::Settled(reply))?;
                return Ok(());
            }
            SchedulerMsg::Settled(reply) => {
                let _ = reply.send(());
                return Ok(());
            }
            SchedulerMsg::WhenWorkers { workers, reply } => {
                if st.workers.len() >= workers {
                    let _ = reply.send(());
                } else {
                    st.ready_waiters.push((workers, reply));
                }
                return Ok(());
            }
            SchedulerMsg::Counts(reply) => {
                let _ = reply.send((st.workers.len(), st.queue.len(), st.leased));
                false
            }
            SchedulerMsg::Fleet(reply) => {
                let _ = reply.send(fleet::view(st));
                false
            }
        };
        if !work_changed {
            return Ok(());
        }
        // Dispatch once the messages already waiting are handled: under load
        // many finished jobs free their slots first and one round (one
        // commit) leases them all; when idle the round runs right away.
        if !st.dispatch_pending {
            st.dispatch_pending = true;
            myself.cast(SchedulerMsg::Dispatch)?;
        }
        if fvd_telemetry::metrics::enabled() {
            fvd_telemetry::metrics::jobs(st.queue.len(), st.leased);
        }
        Ok(())
    }
}

/// A worker registered: recorded, its slots offered, and the jobs that
/// excluded it (after an environment failure) may take it again. A second
/// process under the id of a live worker is refused (`Err`). The runs it
/// says it runs are kept where it still holds their lease (the same
/// process reconnecting), or held for adoption after a restart of this
/// orchestrator; any other is cancelled on it.
async fn worker_connected(
    st: &mut SchedulerState,
    r: Registration,
) -> Result<Result<(), String>, ActorProcessingErr> {
    let Registration {
        info,
        tx,
        conn,
        incarnation,
        running,
    } = r;
    let id = info.worker_id.clone();
    let now = st.clock.now_ms();
    let mut kept: Vec<(String, Vec<u32>)> = Vec::new();
    if let Some(old) = st.workers.get_mut(&id) {
        let same = !incarnation.is_empty() && old.incarnation == incarnation;
        let alive =
            !old.tx.is_closed() && now - old.last_seen_ms <= st.config.lease_ttl.as_millis() as i64;
        if !same && alive && !incarnation.is_empty() {
            return Ok(Err(format!(
                "worker id {id} is in use by a live worker on host {} (another process); choose another --worker-id, or stop that worker first",
                old.info.host
            )));
        }
        if same {
            // The same process on a new stream: what it still runs under
            // its lease goes on; the rest goes back to the queue below.
            for (job, epoch) in &running {
                let lease = st
                    .jobs
                    .get(job)
                    .and_then(|e| e.lease.as_ref())
                    .filter(|l| l.is(&id, *epoch) && l.sent);
                if let Some(l) = lease
                    && old.leases.remove(job)
                {
                    kept.push((job.clone(), l.gpus.clone()));
                }
            }
            if !kept.is_empty() {
                tracing::info!(worker = %id, jobs = ?kept.iter().map(|k| &k.0).collect::<Vec<_>>(), "worker reconnected; its runs go on");
            }
        }
        // Another process of a worker gone, or the rest of this one's.
        lose_worker(st, &id).await?;
    }
    let gpus_json = serde_json::to_string(&info.gpus)?;
    st.store
        .upsert_worker(&info.worker_id, &info.host, &gpus_json, info.cpu_slots)
        .await?;
    tracing::info!(worker = %info.worker_id, gpus = info.gpus.len(), cpu_slots = info.cpu_slots, "worker registered");
    let mut slot = WorkerSlot {
        free_gpus: info.gpus.iter().map(|g| g.index).collect(),
        free_cpu: info.cpu_slots,
        last_seen_ms: now,
        draining: false,
        conn,
        tx: tx.clone(),
        class: st.capacity.add(&info),
        free: None,
        leases: BTreeSet::new(),
        key: Arc::from(info.worker_id.as_str()),
        incarnation,
        info,
    };
    for (job, gpus) in &kept {
        take_slots(&mut slot, gpus);
        slot.leases.insert(job.clone());
    }
    slot.refile(&mut st.capacity);
    st.last_seen.insert((now, slot.key.clone()));
    st.workers.insert(id.clone(), slot);
    for job in st.excluded_by.remove(&id).unwrap_or_default() {
        if let Some(e) = st.jobs.get_mut(&job) {
            e.job.exclude.remove(&id);
        }
    }
    report_held(st, &id, &kept, running).await;
    let count = st.workers.len();
    for (_, reply) in st.ready_waiters.extract_if(.., |(want, _)| *want <= count) {
        let _ = reply.send(());
    }
    // Only a job that waits can change its mind; sorted so the components
    // hear in a stable order.
    let mut waiting: Vec<String> = st.waiting.iter().cloned().collect();
    waiting.sort();
    check_placeable(st, &waiting);
    Ok(Ok(()))
}

/// Marks a leased run's slots on `w` taken.
fn take_slots(w: &mut WorkerSlot, gpus: &[u32]) {
    if gpus.is_empty() {
        w.free_cpu = w.free_cpu.saturating_sub(1);
    } else {
        for g in gpus {
            w.free_gpus.remove(g);
        }
    }
}

/// The runs worker `id` says it runs as it registers, besides those it
/// `kept`: a run held for adoption under this worker and epoch takes its
/// slots (and is adopted at once if its component asked); any other is an
/// orphan and is cancelled. A held run of this worker that it does not
/// report runs nowhere.
async fn report_held(
    st: &mut SchedulerState,
    id: &str,
    kept: &[(String, Vec<u32>)],
    running: Vec<(String, u64)>,
) {
    let reported: HashSet<&str> = running.iter().map(|(j, _)| j.as_str()).collect();
    let gone: Vec<String> = st
        .held
        .iter()
        .filter(|(j, h)| h.worker_id == id && !h.reported && !reported.contains(j.as_str()))
        .map(|(j, _)| j.clone())
        .collect();
    for job in gone {
        if let Some(h) = st.held.remove(&job) {
            let why = format!("worker {id} came back without it");
            if h.waiter.is_none() {
                st.not_held.insert(job.clone(), why.clone());
            }
            not_adopted(&job, h.waiter, &why);
        }
    }
    let Some(tx) = st.workers.get(id).map(|w| w.tx.clone()) else {
        return;
    };
    for (job, epoch) in running {
        if kept.iter().any(|(k, _)| *k == job) {
            continue;
        }
        let held = st
            .held
            .get(&job)
            .is_some_and(|h| h.worker_id == id && h.epoch == epoch && !h.reported);
        if held {
            let h = st.held.get_mut(&job).expect("held");
            h.reported = true;
            let gpus = h.gpus.clone();
            let waiter = h.waiter.take();
            if let Some(w) = st.workers.get_mut(id) {
                take_slots(w, &gpus);
                w.refile(&mut st.capacity);
            }
            tracing::info!(worker = %id, %job, epoch, "a run in flight before this start still runs on its worker");
            if let Some(waiter) = waiter {
                install(st, job, waiter);
            }
            continue;
        }
        let leased_here = st
            .jobs
            .get(&job)
            .and_then(|e| e.lease.as_ref())
            .is_some_and(|l| l.is(id, epoch));
        if !leased_here {
            tracing::warn!(worker = %id, %job, epoch, "worker runs a job under a lease it does not hold; cancelling it");
            let _ = tx
                .send(ToWorker::Cancel {
                    job_id: job,
                    lease_epoch: epoch,
                    reason: "orphaned: no lease of this orchestrator".into(),
                })
                .await;
        }
    }
}

/// Whether `worker_id` runs the held run `job_id` under `epoch` (reported,
/// not yet adopted).
fn held_by(st: &SchedulerState, worker_id: &str, job_id: &str, epoch: u64) -> bool {
    st.held
        .get(job_id)
        .is_some_and(|h| h.reported && h.worker_id == worker_id && h.epoch == epoch)
}

fn not_adopted(job_id: &str, waiter: Option<Box<QueuedJob>>, reason: &str) {
    if let Some(w) = waiter {
        let _ = w.notify.send_message(JobEvent::NotAdopted {
            job_id: job_id.to_string(),
            reason: reason.to_string(),
        });
    }
}

/// A component asks for its run in flight (see [`SchedulerMsg::Adopt`]).
async fn adopt(st: &mut SchedulerState, job: Box<QueuedJob>) {
    let id = job.record.job_id.clone();
    if let Some(e) = st.jobs.get_mut(&id) {
        // Still here (its component was restarted in this process): the
        // new component hears its events from now on.
        e.job.notify = job.notify;
        e.job.span = job.span;
        if let Some(l) = e.lease.as_ref().filter(|l| l.sent) {
            let _ = e.job.notify.send_message(JobEvent::Leased {
                job_id: id,
                worker_id: l.worker_id.clone(),
                epoch: l.epoch,
            });
        }
        return;
    }
    match st.held.remove(&id) {
        None => {
            let why = st.not_held.remove(&id);
            not_adopted(
                &id,
                Some(job),
                why.as_deref().unwrap_or("no worker holds it"),
            )
        }
        Some(h) if h.reported => {
            st.held.insert(id.clone(), h);
            install(st, id, job);
        }
        Some(mut h) => {
            // Its worker has not come back yet: answered when it does, or
            // when the grace ends.
            h.waiter = Some(job);
            st.held.insert(id, h);
        }
    }
}

/// A held run its worker reported and its component asked for: it goes on
/// under its lease as if leased by this process; a report that came first
/// is delivered now.
fn install(st: &mut SchedulerState, id: String, job: Box<QueuedJob>) {
    let Some(h) = st.held.remove(&id) else {
        return;
    };
    let span = tracing::info_span!(
        parent: &job.span,
        "job",
        "fvd.job_id" = %id,
        "fvd.worker_id" = %h.worker_id,
        "fvd.lease_epoch" = h.epoch as i64,
        "fvd.adopted" = true,
        "fvd.gpu_seconds" = tracing::field::Empty,
        "fvd.duration_ms" = tracing::field::Empty,
    );
    tracing::info!(job = %id, worker = %h.worker_id, epoch = h.epoch, "adopted a run in flight: same job, same epoch");
    let _ = job.notify.send_message(JobEvent::Leased {
        job_id: id.clone(),
        worker_id: h.worker_id.clone(),
        epoch: h.epoch,
    });
    st.jobs.insert(
        id.clone(),
        Box::new(Entry {
            job,
            lease: Some(Lease {
                worker_id: h.worker_id.clone(),
                epoch: h.epoch,
                gpus: h.gpus,
                sent: true,
                span,
                output_bytes: 0,
                output_capped: false,
            }),
            infra_retries: 0,
            unplaceable: None,
        }),
    );
    st.leased += 1;
    if let Some(w) = st.workers.get_mut(&h.worker_id) {
        w.leases.insert(id);
    }
    if let Some(report) = h.early {
        finished(st, h.worker_id, report);
    }
}

/// The grace is over: held runs no worker reported are run again; those a
/// worker runs but no component asked for (a port cancelled or not
/// resumed here) are cancelled on it.
async fn expire_held(st: &mut SchedulerState, now: i64) {
    if st.held.is_empty() || now < st.adopt_until_ms {
        return;
    }
    for (job, h) in std::mem::take(&mut st.held) {
        if !h.reported {
            not_adopted(
                &job,
                h.waiter,
                &format!("worker {} did not come back in time", h.worker_id),
            );
            continue;
        }
        tracing::info!(%job, worker = %h.worker_id, "no component adopted a run still in flight; cancelling it");
        if let Some(w) = st.workers.get_mut(&h.worker_id) {
            if !w.draining {
                if h.gpus.is_empty() {
                    w.free_cpu += 1;
                } else {
                    w.free_gpus.extend(h.gpus.iter().copied());
                }
                w.refile(&mut st.capacity);
            }
            let _ =
                w.tx.send(ToWorker::Cancel {
                    job_id: job,
                    lease_epoch: h.epoch,
                    reason: "no component adopted it".into(),
                })
                .await;
        }
    }
}

/// A worker is alive. A worker that came back may still run jobs whose
/// lease moved elsewhere while it was gone: those orphans are cancelled.
async fn heartbeat(st: &mut SchedulerState, worker_id: &str, running: Vec<(String, u64)>) {
    let now = st.clock.now_ms();
    let Some(w) = st.workers.get_mut(worker_id) else {
        return;
    };
    if w.last_seen_ms != now {
        let key = w.key.clone();
        st.last_seen.remove(&(w.last_seen_ms, key.clone()));
        st.last_seen.insert((now, key));
        w.last_seen_ms = now;
    }
    let tx = w.tx.clone();
    for (job_id, epoch) in running {
        let held = st
            .jobs
            .get(&job_id)
            .and_then(|e| e.lease.as_ref())
            .is_some_and(|l| l.is(worker_id, epoch))
            || held_by(st, worker_id, &job_id, epoch);
        if !held {
            tracing::warn!(worker = %worker_id, job = %job_id, epoch, "worker runs a job under a lease it no longer holds; cancelling it");
            let _ = tx
                .send(ToWorker::Cancel {
                    job_id,
                    lease_epoch: epoch,
                    reason: "orphaned: the lease moved to another worker".into(),
                })
                .await;
        }
    }
}

/// A job joins its port's queue.
fn enqueue(st: &mut SchedulerState, job: Box<QueuedJob>) {
    let id = job.record.job_id.clone();
    st.queue.push_back(
        &job.record.family,
        job.placement.priority,
        id.clone(),
        job.record.gpus_needed,
        job.expected_ms(),
    );
    for w in job.exclude.keys() {
        st.excluded_by
            .entry(w.clone())
            .or_default()
            .push(id.clone());
    }
    st.jobs.insert(
        id.clone(),
        Box::new(Entry {
            job,
            lease: None,
            infra_retries: 0,
            unplaceable: None,
        }),
    );
    check_placeable(st, &[id]);
}

/// The family's jobs are placed again; whether it was held.
fn release_family(st: &mut SchedulerState, family: &str) -> bool {
    st.holds.remove(family);
    st.queue.release(family)
}

/// Holds past their time end: a component that never said it started
/// delays its port's first placement by at most the hold's length.
fn expire_holds(st: &mut SchedulerState, now: i64) {
    if st.holds.is_empty() {
        return;
    }
    let over: Vec<String> = st
        .holds
        .iter()
        .filter(|(_, until)| **until <= now)
        .map(|(f, _)| f.clone())
        .collect();
    for family in over {
        tracing::debug!(%family, "hold on the port's first placement expired");
        release_family(st, &family);
    }
}

/// A job left the scheduler (finished, cancelled, given up or refused):
/// the indexes that name it forget it.
fn forget(st: &mut SchedulerState, id: &str, entry: &Entry) {
    st.waiting.remove(id);
    for w in entry.job.exclude.keys() {
        if let Some(jobs) = st.excluded_by.get_mut(w) {
            jobs.retain(|j| j != id);
            if jobs.is_empty() {
                st.excluded_by.remove(w);
            }
        }
    }
}

/// A leased job's process started: its spawn time is stored and its
/// owner told.
fn started(st: &mut SchedulerState, worker_id: String, job_id: String, epoch: u64, at_ms: i64) {
    if held_by(st, &worker_id, &job_id, epoch) {
        return;
    }
    if leased(st, &worker_id, &job_id, epoch).is_some() {
        let _ = st.writer.send(Write::Spawned {
            job_id: job_id.clone(),
            at_ms,
        });
    }
    if let Some(e) = leased(st, &worker_id, &job_id, epoch) {
        let _ = e
            .job
            .notify
            .send_message(JobEvent::Started { job_id, worker_id });
    }
}

/// A leased job ended: its slots are freed and the report goes to its
/// owner (behind the job's output, through the writer). False for a stale
/// report, which changes nothing.
fn finished(st: &mut SchedulerState, worker_id: String, report: JobReport) -> bool {
    if held_by(st, &worker_id, &report.job_id, report.lease_epoch) {
        // Delivered once its component adopts it.
        if let Some(h) = st.held.get_mut(&report.job_id) {
            h.early = Some(report);
        }
        return false;
    }
    if leased(st, &worker_id, &report.job_id, report.lease_epoch).is_none() {
        return false;
    }
    let Some(entry) = st.jobs.remove(&report.job_id) else {
        return false;
    };
    if let Some(lease) = &entry.lease {
        let gpu_seconds = lease.gpus.len() as f64 * report.duration_ms as f64 / 1000.0;
        lease.span.record("fvd.gpu_seconds", gpu_seconds);
        lease
            .span
            .record("fvd.duration_ms", report.duration_ms as i64);
        fvd_telemetry::spans::job_ended(&lease.span, &job_end(&report));
        let r = &entry.job.record;
        fvd_telemetry::metrics::gpu_seconds(&r.family, &r.component, gpu_seconds);
    }
    release(st, &report.job_id, &entry);
    forget(st, &report.job_id, &entry);
    let _ = st.writer.send(Write::Notify(
        entry.job.notify.clone(),
        Box::new(JobEvent::Finished { report, worker_id }),
    ));
    true
}

/// Every queued or running job of `family` is dropped; running ones are
/// cancelled on their workers.
async fn cancel_family(st: &mut SchedulerState, family: &str) {
    let held: Vec<String> = st
        .held
        .iter()
        .filter(|(_, h)| h.family == family)
        .map(|(j, _)| j.clone())
        .collect();
    for job in held {
        let Some(h) = st.held.remove(&job) else {
            continue;
        };
        if h.reported
            && let Some(w) = st.workers.get_mut(&h.worker_id)
        {
            if !w.draining {
                if h.gpus.is_empty() {
                    w.free_cpu += 1;
                } else {
                    w.free_gpus.extend(h.gpus.iter().copied());
                }
                w.refile(&mut st.capacity);
            }
            let _ =
                w.tx.send(ToWorker::Cancel {
                    job_id: job,
                    lease_epoch: h.epoch,
                    reason: "port cancelled".into(),
                })
                .await;
        }
    }
    let ids: Vec<String> = st
        .jobs
        .iter()
        .filter(|(_, e)| e.job.record.family == family)
        .map(|(id, _)| id.clone())
        .collect();
    st.queue.remove_family(family);
    // A lease still on its way to the database lands before the port's
    // cancellation is written after this, not over it.
    if ids
        .iter()
        .any(|id| st.jobs[id].lease.as_ref().is_some_and(|l| !l.sent))
    {
        written(st).await;
    }
    for id in ids {
        if let Some(entry) = st.jobs.remove(&id) {
            if let Some(lease) = entry.lease.as_ref().filter(|l| l.sent)
                && let Some(w) = st.workers.get(&lease.worker_id)
            {
                let _ =
                    w.tx.send(ToWorker::Cancel {
                        job_id: id.clone(),
                        lease_epoch: lease.epoch,
                        reason: "port cancelled".into(),
                    })
                    .await;
            }
            release(st, &id, &entry);
            forget(st, &id, &entry);
        }
    }
}

/// One queued or running job is dropped; a running one is cancelled on its
/// worker.
async fn cancel_job(st: &mut SchedulerState, job_id: &str, reason: &str) {
    let Some(entry) = st.jobs.remove(job_id) else {
        return;
    };
    st.queue.remove(&entry.job.record.family, job_id);
    if let Some(lease) = entry.lease.as_ref().filter(|l| l.sent)
        && let Some(w) = st.workers.get(&lease.worker_id)
    {
        let _ =
            w.tx.send(ToWorker::Cancel {
                job_id: job_id.to_string(),
                lease_epoch: lease.epoch,
                reason: reason.to_string(),
            })
            .await;
    }
    release(st, job_id, &entry);
    forget(st, job_id, &entry);
}

/// Workers that missed their heartbeats for the lease TTL as of `now` are
/// lost: their leases expire. Only the silent ones are looked at.
async fn expire_leases(st: &mut SchedulerState, now: i64) -> Result<(), ActorProcessingErr> {
    let ttl = st.config.lease_ttl.as_millis() as i64;
    let lost: Vec<String> = st
        .last_seen
        .iter()
        .take_while(|(seen, _)| now - seen > ttl)
        .map(|(_, id)| id.to_string())
        .collect();
    for id in lost {
        tracing::warn!(worker = %id, "worker missed its heartbeats; its leases expire");
        lose_worker(st, &id).await?;
    }
    Ok(())
}

/// The entry of a job when `worker_id` holds its lease under `epoch`;
/// otherwise the message is stale and is logged and ignored.
fn leased<'a>(
    st: &'a mut SchedulerState,
    worker_id: &str,
    job_id: &str,
    epoch: u64,
) -> Option<&'a mut Entry> {
    let ok = st
        .jobs
        .get(job_id)
        .and_then(|e| e.lease.as_ref())
        .is_some_and(|l| l.is(worker_id, epoch));
    if !ok {
        tracing::warn!(worker = %worker_id, job = %job_id, epoch, "rejected a message with a stale or unknown lease");
        return None;
    }
    st.jobs.get_mut(job_id).map(|e| &mut **e)
}

/// A lease ends: its slots go back to the worker (unless it drains).
fn release(st: &mut SchedulerState, job_id: &str, entry: &Entry) {
    let Some(lease) = &entry.lease else {
        return;
    };
    st.leased -= 1;
    let Some(w) = st.workers.get_mut(&lease.worker_id) else {
        return;
    };
    w.leases.remove(job_id);
    if !w.draining {
        if lease.gpus.is_empty() {
            w.free_cpu += 1;
        } else {
            w.free_gpus.extend(lease.gpus.iter().copied());
        }
        w.refile(&mut st.capacity);
    }
}

/// Drops a worker and puts its leased jobs back at the front of the queue,
/// or ends them as `infra_error` once they were retried enough.
async fn lose_worker(st: &mut SchedulerState, worker_id: &str) -> Result<(), ActorProcessingErr> {
    let Some(mut w) = st.workers.remove(worker_id) else {
        return Ok(());
    };
    // Held runs it reported wait for it to come back (until the grace
    // ends), their slots gone with it.
    for h in st.held.values_mut().filter(|h| h.worker_id == worker_id) {
        h.reported = false;
    }
    st.capacity.set(&w.key, w.class, w.free, None);
    st.capacity.remove(w.class);
    st.last_seen.remove(&(w.last_seen_ms, w.key.clone()));
    let lost: Vec<String> = std::mem::take(&mut w.leases).into_iter().collect();
    if !lost.is_empty() {
        tracing::warn!(worker = %worker_id, jobs = ?lost, "worker lost while running jobs; they go back to the queue");
        // A lease still on its way to the database lands before the
        // requeue below, not after it.
        written(st).await;
    }
    for id in lost.into_iter().rev() {
        let Some(entry) = st.jobs.get_mut(&id) else {
            continue;
        };
        if entry.lease.take().is_some() {
            st.leased -= 1;
        }
        entry.infra_retries += 1;
        if entry.infra_retries > MAX_INFRA_RETRIES {
            let entry = st.jobs.remove(&id).expect("entry exists");
            forget(st, &id, &entry);
            let _ = entry.job.notify.send_message(JobEvent::WorkerLost {
                job_id: id,
                worker_id: worker_id.to_string(),
                give_up: true,
            });
            continue;
        }
        st.store
            .requeue_job(
                &id,
                &format!("worker {worker_id} lost; retrying on another slot"),
            )
            .await?;
        let _ = entry.job.notify.send_message(JobEvent::WorkerLost {
            job_id: id.clone(),
            worker_id: worker_id.to_string(),
            give_up: false,
        });
        let family = entry.job.record.family.clone();
        let priority = entry.job.placement.priority;
        let gpus = entry.job.record.gpus_needed;
        let expected = entry.job.expected_ms();
        st.queue.push_front(&family, priority, id, gpus, expected);
    }
    Ok(())
}

/// "path a" or "paths a, b".
fn paths_phrase(paths: &[&str]) -> String {
    match paths {
        [one] => format!("path {one}"),
        many => format!("paths {}", many.join(", ")),
    }
}

/// GPUs of a worker the job may use: those in `free` (or all of them, to
/// ask whether it could ever fit) with at least the memory it asks for.
fn usable_gpus(w: &WorkerInfo, free: Option<&BTreeSet<u32>>, p: &Placement) -> Vec<u32> {
    w.gpus
        .iter()
        .filter(|g| g.memory_mib >= p.gpu_memory_mib)
        .filter(|g| free.is_none_or(|f| f.contains(&g.index)))
        .map(|g| g.index)
        .collect()
}

/// Tells the components of queued jobs that need more GPUs than any
/// registered worker has (a gang job is never split), and again once such a
/// worker arrives; without it a 2-GPU component among 1-GPU workers would
/// wait in silence. Answered from the capacity index's shapes of worker,
/// not by looking at each worker.
fn check_placeable(st: &mut SchedulerState, ids: &[String]) {
    if st.workers.is_empty() {
        // Workers may simply not have registered yet (embedded start-up):
        // the first one to register checks these jobs.
        st.waiting.extend(ids.iter().cloned());
        return;
    }
    for id in ids {
        let Some(e) = st.jobs.get(id).filter(|e| e.lease.is_none()) else {
            st.waiting.remove(id);
            continue;
        };
        let need = e.job.record.gpus_needed;
        let p = &e.job.placement;
        let holders = st.capacity.could_hold(need, p);
        let fitting = st.capacity.members(&holders);
        let reason = if fitting == 0 {
            let mut want = format!(
                "{need} GPU{} on one worker",
                if need == 1 { "" } else { "s" }
            );
            if p.gpu_memory_mib > 0 {
                want.push_str(&format!(" with at least {} MiB each", p.gpu_memory_mib));
            }
            if !p.labels.is_empty() {
                let labels: Vec<String> =
                    p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                want.push_str(&format!(" labelled {}", labels.join(",")));
            }
            if !p.worker_paths.is_empty() {
                let paths: Vec<&str> = p.worker_paths.iter().map(String::as_str).collect();
                want.push_str(&format!(" providing worker {}", paths_phrase(&paths)));
            }
            if st.config.fixed_fleet {
                let why = never_fits(st.capacity.shapes(), need as usize, p);
                let e = st.jobs.remove(id).expect("checked above");
                st.queue.remove(&e.job.record.family, id);
                forget(st, id, &e);
                let _ = e.job.notify.send_message(JobEvent::Unplaceable {
                    job_id: id.clone(),
                    reason: why,
                });
                continue;
            }
            let missing = st.capacity.unprovided(p);
            Some(if missing.is_empty() {
                format!("waiting: needs {want}; no registered worker has that")
            } else {
                format!(
                    "waiting: needs worker {}; no registered worker provides {} (fvd worker --provide PATH=DIR)",
                    paths_phrase(&missing),
                    if missing.len() == 1 { "it" } else { "them" }
                )
            })
        } else {
            // Excluded workers that could hold the job: when they are all
            // of those, the job waits on its environment.
            let mut why: Vec<String> = e
                .job
                .exclude
                .iter()
                .filter(|(w, _)| {
                    st.workers
                        .get(*w)
                        .is_some_and(|w| Capacity::holds(&holders, w.class))
                })
                .map(|(w, reason)| format!("worker {w}: {reason}"))
                .collect();
            if why.len() == fitting {
                why.sort();
                Some(why.join("; "))
            } else {
                None
            }
        };
        let environment = fitting > 0 && reason.is_some();
        if reason.is_some() {
            st.waiting.insert(id.clone());
        } else {
            st.waiting.remove(id);
        }
        let e = st.jobs.get_mut(id).expect("checked above");
        if reason != e.unplaceable {
            e.unplaceable = reason.clone();
            let _ = e.job.notify.send_message(JobEvent::Waiting {
                job_id: id.clone(),
                reason: reason.unwrap_or_default(),
                environment,
            });
        }
    }
}

/// Why no worker of a fixed fleet (embedded mode's machine) can ever hold a
/// job, and what to do about it. `workers`: one registration per shape.
fn never_fits<'a>(
    workers: impl Iterator<Item = &'a WorkerInfo>,
    need: usize,
    p: &Placement,
) -> String {
    let workers: Vec<&WorkerInfo> = workers.collect();
    let gpus = workers.iter().map(|w| w.gpus.len()).max().unwrap_or(0);
    let unprovided: Vec<&str> = p
        .worker_paths
        .iter()
        .filter(|x| !workers.iter().any(|w| w.provides.contains(x)))
        .map(String::as_str)
        .collect();
    if !unprovided.is_empty() {
        return format!(
            "needs worker {}; this machine's checkout does not have {}: put {} there (git-ignored), or run it on a fleet whose workers provide {} (fvd worker --provide PATH=DIR)",
            paths_phrase(&unprovided),
            if unprovided.len() == 1 { "it" } else { "them" },
            if unprovided.len() == 1 { "it" } else { "them" },
            if unprovided.len() == 1 { "it" } else { "them" },
        );
    }
    let labelled = workers.iter().any(|w| labels_match(w, p));
    if !labelled {
        let labels: Vec<String> = p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        return format!(
            "needs a worker labelled {}; this machine has no such label: run it on a fleet or drop the labels",
            labels.join(",")
        );
    }
    let big = workers
        .iter()
        .map(|w| usable_gpus(w, None, p).len())
        .max()
        .unwrap_or(0);
    if gpus >= need && big < need {
        let most = workers
            .iter()
            .flat_map(|w| w.gpus.iter().map(|g| g.memory_mib))
            .max()
            .unwrap_or(0);
        return format!(
            "needs {need} GPU{} with at least {} MiB each; this machine's have at most {most} MiB: run it on a fleet or lower gpu_memory_mib",
            if need == 1 { "" } else { "s" },
            p.gpu_memory_mib
        );
    }
    let has = match gpus {
        0 => "none".to_string(),
        n => n.to_string(),
    };
    format!(
        "needs {need} GPU{}; this machine has {has}: run it on a fleet or set gpus = {}",
        if need == 1 { "" } else { "s" },
        gpus.min(need)
    )
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

    fn take(&mut self, worker: &str, job: &placement::Job<'_>) -> Vec<u32> {
        let w = self.workers.get_mut(worker).expect("picked worker exists");
        let gpus: Vec<u32> = if job.need == 0 {
            w.free_cpu -= 1;
            Vec::new()
        } else {
            let g: Vec<u32> = usable_gpus(&w.info, Some(&w.free_gpus), job.placement)
                .into_iter()
                .take(job.need as usize)
                .collect();
            for x in &g {
                w.free_gpus.remove(x);
            }
            g
        };
        w.refile(self.capacity);
        gpus
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
            sent: false,
            span,
            output_bytes: 0,
            output_capped: false,
        });
    }
    if st.writer.send(Write::Leases(planned)).is_err() {
        return Err("the scheduler's writer stopped".into());
    }
    Ok(more)
}

/// Committed leases: each job that still holds its lease (not cancelled,
/// its worker not lost meanwhile) is assigned, and its owner told.
async fn assign(st: &mut SchedulerState, planned: Vec<Planned>) {
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
