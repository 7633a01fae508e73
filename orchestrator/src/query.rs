//! The read side of fvd's state, in one place for every reader: the gRPC
//! handlers of `PortService` (a fleet orchestrator), the dashboard, and the
//! CLI reading an embedded `REPO/.fvd/state.db` (`fvd status`, `logs`,
//! `attempts`, `workers`, `queue`, `trace show`) call the same functions,
//! so no two readers can answer differently.
//!
//! Invariants:
//! - Nothing here writes.
//! - Nothing here returns a generated (`fvd_proto`) type: the answers are
//!   domain views ([`PortSnapshot`], [`RunRow`], [`Fleet`], [`Queue`], …);
//!   [`crate::wire`] converts them at the gRPC edge, both ways.
//! - No reader of state bypasses this module: the dashboard's views and the
//!   CLI's local source read the store only through these functions.

use std::collections::BTreeMap;
use std::time::Duration;

use fvd_actors::scheduler::{FleetView, SchedulerMsg};
use fvd_store::dashboard::{ComponentTimes, PortTimes, RunFilter, RunRow};
use fvd_store::model::Worktree;
use fvd_store::model::{
    ComponentRow, ComponentStatus, GateEventRow, JobState, PortRow, PortState, RecordedVerdict,
};
use fvd_store::team::ActionRow;
use fvd_store::traces::TraceInvestigation;
use fvd_store::usage::UsageTotals;
use fvd_store::variants::VariantRow;
use fvd_store::{AttemptRow, EscapeRow, Store, StoreError};
use ractor::ActorRef;
use tokio::sync::mpsc;

/// How often a followed log looks for new output.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// How long a read waits for the live scheduler's picture of the fleet.
const FLEET_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a read found nothing to show.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("no port of family {0}")]
    UnknownFamily(String),
    #[error("no run {run} of component {component} in port {family}")]
    UnknownRun {
        family: String,
        component: String,
        /// `at all` when the latest run was asked for.
        run: String,
    },
    #[error(
        "component {component} of port {family} has no trace investigation (it needs a [component.trace] table and a debug_red run)"
    )]
    NoTrace { family: String, component: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl QueryError {
    /// Whether the thing asked for does not exist (rather than the store
    /// failing): `NOT_FOUND` on the wire.
    pub fn is_not_found(&self) -> bool {
        !matches!(self, QueryError::Store(_))
    }
}

// ----- ports ------------------------------------------------------------------

/// One port as every reader shows it: its state, its components with their
/// variant tables and agent spend, the gate's decisions, its questions and
/// who did what to it.
#[derive(Debug, Clone, PartialEq)]
pub struct PortSnapshot {
    pub family: String,
    /// A running port whose orchestrator cannot write its database reads
    /// [`PortState::Environment`] here, with `pause_reason` saying why.
    pub state: PortState,
    pub phase: String,
    pub repo: String,
    pub port_status_path: String,
    pub repo_identity: String,
    pub owner: String,
    pub submitted_by: String,
    pub pause_reason: String,
    /// Why `PORT_STATUS.md` was not written at the port's last write;
    /// empty when it was.
    pub status_write_error: String,
    pub components: Vec<ComponentSnapshot>,
    /// Oldest first.
    pub gate_events: Vec<GateEventRow>,
    pub escapes: Vec<EscapeRow>,
    /// Oldest first.
    pub actions: Vec<ActionRow>,
    /// Every agent attempt's model usage, summed; `None` without any.
    pub agent_spend: Option<UsageTotals>,
}

impl PortSnapshot {
    /// The escape hatches still waiting for an answer.
    pub fn open_questions(&self) -> impl Iterator<Item = &EscapeRow> {
        self.escapes
            .iter()
            .filter(|e| e.status == fvd_store::states::EscapeStatus::Open)
    }

    /// The gate's refusals and pending phases that still hold: those
    /// recorded after the latest phase it entered, passed or reopened,
    /// oldest first. A refusal a later submit went past (`gate refused
    /// P0` under a port now running at P6) is history, not listed here.
    pub fn current_gate(&self) -> &[GateEventRow] {
        use fvd_store::states::GateOutcome;
        let from = self
            .gate_events
            .iter()
            .rposition(|g| {
                matches!(
                    g.outcome,
                    GateOutcome::Entered | GateOutcome::Passed | GateOutcome::Reopened
                )
            })
            .map_or(0, |i| i + 1);
        &self.gate_events[from..]
    }
}

/// One component of a [`PortSnapshot`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComponentSnapshot {
    pub name: String,
    pub status: ComponentStatus,
    /// The latest finished run's verdict, or how fvd ended the component.
    pub verdict: RecordedVerdict,
    pub reason: String,
    pub runs: u32,
    /// The number of its latest run (see `ComponentRow::last_run`).
    pub last_run: u32,
    pub worker_id: String,
    pub variants: Vec<VariantRow>,
    pub agent_spend: Option<UsageTotals>,
    /// When its row last changed, and when its latest run started and
    /// ended (Unix ms; `None`: not yet).
    pub updated_ms: i64,
    pub run_started_ms: Option<i64>,
    pub run_finished_ms: Option<i64>,
}

impl From<ComponentRow> for ComponentSnapshot {
    fn from(c: ComponentRow) -> Self {
        ComponentSnapshot {
            name: c.name,
            status: c.status,
            verdict: c.verdict,
            reason: c.reason,
            runs: c.runs,
            last_run: c.last_run,
            worker_id: c.worker_id,
            variants: Vec::new(),
            agent_spend: None,
            updated_ms: 0,
            run_started_ms: None,
            run_finished_ms: None,
        }
    }
}

/// The snapshot of one port, or of every port when `family` is `None`.
pub async fn status(store: &Store, family: Option<&str>) -> Result<Vec<PortSnapshot>, QueryError> {
    let families: Vec<String> = match family {
        Some(f) => vec![f.to_string()],
        None => store.ports().await?.into_iter().map(|p| p.family).collect(),
    };
    let mut ports = Vec::with_capacity(families.len());
    for f in families {
        ports.push(
            snapshot(store, &f)
                .await?
                .ok_or(QueryError::UnknownFamily(f))?,
        );
    }
    Ok(ports)
}

/// A port's gate events and its row as they stood at one moment. The gate
/// writes them apart, in both orders: a phase is committed before the
/// event that announces it ("P6 entered"), a refusal before the state it
/// blocks. Each read sees its own moment of the store, so the events are
/// read before and after the row until no event came in between: then the
/// pair is one that existed (never "P6 entered" beside phase P0, never a
/// port blocked at P0 without its refusal).
async fn gate_and_port(
    store: &Store,
    family: &str,
) -> Result<Option<(Vec<GateEventRow>, PortRow)>, StoreError> {
    let mark = |g: &[GateEventRow]| (g.len(), g.last().map(|e| e.at_ms));
    let mut before = store.gate_events(family).await?;
    for _ in 0..8 {
        let Some(port) = store.port(family).await? else {
            return Ok(None);
        };
        let after = store.gate_events(family).await?;
        if mark(&after) == mark(&before) {
            return Ok(Some((after, port)));
        }
        before = after;
    }
    // A gate deciding faster than three reads eight times over: the last
    // events read, with a row read after them (a phase may be ahead of
    // its announcement, never behind it).
    let Some(port) = store.port(family).await? else {
        return Ok(None);
    };
    Ok(Some((before, port)))
}

/// The snapshot of one port; `None` when there is no such port.
pub async fn snapshot(store: &Store, family: &str) -> Result<Option<PortSnapshot>, StoreError> {
    let Some((gate, port)) = gate_and_port(store, family).await? else {
        return Ok(None);
    };
    let components = store.components(family).await?;
    let mut times = store.component_times(family).await?;
    let escapes = store.escapes(family).await?;
    let mut tables = store.variant_tables(family).await?;
    let mut spend = store.usage_totals(family).await?;
    let port_spend = spend.values().fold(None::<UsageTotals>, |acc, t| {
        let mut a = acc.unwrap_or_default();
        a.add(t);
        Some(a)
    });
    let origin = store.port_origin(family).await?.unwrap_or_default();
    let actions = store.actions(family).await?;
    let status_write_error = store.status_write_error(family).await?;
    // A running port whose orchestrator cannot write its database is
    // paused, whatever the database still says: nothing it decides can be
    // recorded until writes succeed again.
    let (state, pause_reason) = match store.write_fault() {
        Some(f) if port.state == PortState::Running => {
            (PortState::Environment, f.reason(store.db_name()))
        }
        _ => (port.state, String::new()),
    };
    Ok(Some(PortSnapshot {
        agent_spend: port_spend,
        status_write_error,
        pause_reason,
        escapes,
        family: port.family,
        state,
        phase: port.phase,
        components: components
            .into_iter()
            .map(|c| {
                let variants = tables.remove(&c.name).unwrap_or_default();
                let agent_spend = spend.remove(&c.name);
                let t = times.remove(&c.name).unwrap_or_default();
                ComponentSnapshot {
                    variants,
                    agent_spend,
                    updated_ms: t.updated_ms,
                    run_started_ms: t.started_ms,
                    run_finished_ms: t.finished_ms,
                    ..ComponentSnapshot::from(c)
                }
            })
            .collect(),
        gate_events: gate,
        repo: port.repo,
        port_status_path: port.port_status_path,
        repo_identity: origin.repo_identity,
        owner: origin.owner,
        submitted_by: origin.submitted_by,
        actions,
    }))
}

/// When each port was first submitted and last changed, by family.
pub async fn port_times(store: &Store) -> Result<BTreeMap<String, PortTimes>, StoreError> {
    store.port_times().await
}

/// Per component of `family`: when it changed and its latest run's lease.
pub async fn component_times(
    store: &Store,
    family: &str,
) -> Result<BTreeMap<String, ComponentTimes>, StoreError> {
    store.component_times(family).await
}

/// The W3C `traceparent` the port's runs continue, when it was traced.
pub async fn port_traceparent(store: &Store, family: &str) -> Result<Option<String>, StoreError> {
    store.port_traceparent(family).await
}

// ----- runs and their output ----------------------------------------------------

/// Every run of a component, or of every component of the port when
/// `component` is `None`, across all its submits, in the order queued.
pub async fn runs(
    store: &Store,
    family: &str,
    component: Option<&str>,
) -> Result<Vec<RunRow>, QueryError> {
    if store.port(family).await?.is_none() {
        return Err(QueryError::UnknownFamily(family.to_string()));
    }
    Ok(store
        .runs(RunFilter {
            family: Some(family),
            component,
            since_ms: None,
        })
        .await?)
}

/// Every run of every port that ended at or after `since_ms` or has not
/// ended: the fleet's timeline.
pub async fn fleet_runs(store: &Store, since_ms: i64) -> Result<Vec<RunRow>, StoreError> {
    store
        .runs(RunFilter {
            since_ms: Some(since_ms),
            ..RunFilter::default()
        })
        .await
}

/// The run `fvd logs` shows: run `run` (1-based) of the component, or,
/// without `run`, its latest run that started (a run queued again after an
/// environment failure has no output yet), else its latest.
pub async fn run_of(
    store: &Store,
    family: &str,
    component: &str,
    run: Option<u32>,
) -> Result<RunRow, QueryError> {
    let runs = store
        .runs(RunFilter {
            family: Some(family),
            component: Some(component),
            since_ms: None,
        })
        .await?;
    pick_run(&runs, run).ok_or_else(|| QueryError::UnknownRun {
        family: family.to_string(),
        component: component.to_string(),
        run: run.map_or("at all".to_string(), |n| n.to_string()),
    })
}

/// Run `run` of `runs`, or the latest that started, else the latest.
pub fn pick_run(runs: &[RunRow], run: Option<u32>) -> Option<RunRow> {
    match run {
        Some(n) => runs.iter().find(|j| j.run_no == n),
        None => runs
            .iter()
            .rev()
            .find(|r| r.state != JobState::Queued)
            .or_else(|| runs.last()),
    }
    .cloned()
}

/// The stored output of a job after chunk `after`: `(seq, stream, bytes)`.
pub async fn output(
    store: &Store,
    job_id: &str,
    after: Option<u64>,
) -> Result<Vec<(u64, i32, Vec<u8>)>, StoreError> {
    store.logs(job_id, after).await
}

/// Streams a job's stored output `(stream, bytes)` in order; with `follow`,
/// keeps polling until the run is over.
pub fn log_pump(
    store: Store,
    job_id: String,
    follow: bool,
) -> mpsc::Receiver<Result<(i32, Vec<u8>), StoreError>> {
    log_pump_after(store, job_id, follow, None)
}

/// [`log_pump`] from the chunk after sequence number `after` (the
/// dashboard renders what is stored, then follows from there).
pub fn log_pump_after(
    store: Store,
    job_id: String,
    follow: bool,
    after: Option<u64>,
) -> mpsc::Receiver<Result<(i32, Vec<u8>), StoreError>> {
    let (tx, rx) = mpsc::channel(64);
    fvd_telemetry::spawn(async move {
        let mut last: Option<u64> = after;
        loop {
            // Read the state before the chunks: a run that was over by then
            // has every chunk stored, so this read is the last one needed.
            // Over is anything but waiting or running: finished, cut off,
            // failed on its environment, never placed.
            let ended = match store.job(&job_id).await {
                Ok(Some(j)) => !j.state.is_unfinished(),
                Ok(None) => true,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let chunks = match store.logs(&job_id, last).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            for (seq, stream, data) in chunks {
                last = Some(seq);
                if tx.send(Ok((stream, data))).await.is_err() {
                    return;
                }
            }
            if !follow || ended {
                return;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    });
    rx
}

// ----- agents and traces ----------------------------------------------------------

/// The agent-attempt ledger of a component and its worktree, if it has one.
pub async fn attempts(
    store: &Store,
    family: &str,
    component: &str,
) -> Result<(Option<Worktree>, Vec<AttemptRow>), QueryError> {
    if store.port(family).await?.is_none() {
        return Err(QueryError::UnknownFamily(family.to_string()));
    }
    Ok((
        store.worktree(family, component).await?,
        store.attempts(family, component).await?,
    ))
}

/// The latest drill-down investigation of a component, `None` when it was
/// never traced.
pub async fn latest_trace(
    store: &Store,
    family: &str,
    component: &str,
) -> Result<Option<TraceInvestigation>, StoreError> {
    store.latest_trace(family, component).await
}

/// The latest drill-down investigation of a component; an error naming it
/// when there is none.
pub async fn trace_report(
    store: &Store,
    family: &str,
    component: &str,
) -> Result<TraceInvestigation, QueryError> {
    if store.port(family).await?.is_none() {
        return Err(QueryError::UnknownFamily(family.to_string()));
    }
    latest_trace(store, family, component)
        .await?
        .ok_or_else(|| QueryError::NoTrace {
            family: family.to_string(),
            component: component.to_string(),
        })
}

// ----- the fleet and the queue ------------------------------------------------------

/// The workers as a reader sees them: live from the scheduler of this
/// process, or, without one, as the store last recorded them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Fleet {
    /// A scheduler answered: `workers` are the connected ones, with their
    /// free slots. Otherwise they are what each worker announced when it
    /// last registered (connected or not), and free slots are unknown.
    pub live: bool,
    /// Milliseconds since the epoch of this picture (the scheduler's clock
    /// when live).
    pub now_ms: i64,
    pub workers: Vec<Worker>,
}

/// One worker of a [`Fleet`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Worker {
    pub worker_id: String,
    pub host: String,
    pub gpus: Vec<Gpu>,
    /// GPU indices with no lease on them; `None` when not live.
    pub free_gpus: Option<Vec<u32>>,
    pub cpu_slots: u32,
    /// Free CPU slots; `None` when not live.
    pub free_cpu: Option<u32>,
    pub labels: BTreeMap<String, String>,
    /// Port-relative paths it provides (`fvd worker --provide`).
    pub provides: Vec<String>,
    /// Its last heartbeat (live), or its last registration (stored).
    pub last_seen_ms: i64,
    pub draining: bool,
    /// The runs holding a lease on it.
    pub jobs: Vec<Lease>,
}

impl Worker {
    /// Each of its GPUs with runs on it: how many, and what the runs
    /// sharing it leased, or that one run holds it whole.
    pub fn gpu_use(&self) -> Vec<GpuUse> {
        let mut out = Vec::new();
        for g in &self.gpus {
            let on: Vec<u64> = self
                .jobs
                .iter()
                .filter(|j| j.gpus.contains(&g.index))
                .map(|j| j.share_mib)
                .collect();
            if on.is_empty() {
                continue;
            }
            out.push(GpuUse {
                index: g.index,
                memory_mib: g.memory_mib,
                runs: on.len(),
                leased_mib: on.iter().all(|m| *m > 0).then(|| on.iter().sum()),
            });
        }
        out
    }
}

/// What the runs on one GPU of a worker hold of it ([`Worker::gpu_use`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUse {
    pub index: u32,
    pub memory_mib: u64,
    pub runs: usize,
    /// The MiB the runs sharing it leased; `None`: a run holds it whole.
    pub leased_mib: Option<u64>,
}

impl std::fmt::Display for GpuUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runs = match self.runs {
            1 => "1 run".to_string(),
            n => format!("{n} runs"),
        };
        match self.leased_mib {
            Some(leased) => write!(
                f,
                "GPU {}: {runs} sharing it, {leased} of {} MiB leased",
                self.index, self.memory_mib
            ),
            None => write!(f, "GPU {}: {runs}, held whole", self.index),
        }
    }
}

/// A GPU a worker announced.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub memory_mib: u64,
}

/// A run holding a lease on a worker.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Lease {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub lease_epoch: u64,
    pub gpus: Vec<u32>,
    pub started_ms: Option<i64>,
    /// MiB it holds of its one shared GPU; 0 for GPUs held alone (or not
    /// known: the store does not keep it).
    pub share_mib: u64,
}

/// What the live scheduler of this process sees, if there is one and it
/// answers in time.
async fn live_fleet(scheduler: Option<&ActorRef<SchedulerMsg>>) -> Option<FleetView> {
    let s = scheduler?;
    match s.call(SchedulerMsg::Fleet, Some(FLEET_TIMEOUT)).await {
        Ok(ractor::rpc::CallResult::Success(v)) => Some(v),
        _ => None,
    }
}

/// The fleet: live from `scheduler` when one runs in this process, else
/// the workers table and the leases the store records.
pub async fn fleet(
    store: &Store,
    scheduler: Option<&ActorRef<SchedulerMsg>>,
) -> Result<Fleet, StoreError> {
    let leased = store.leased_jobs().await?;
    let started: BTreeMap<&str, Option<i64>> = leased
        .iter()
        .map(|j| (j.job_id.as_str(), j.started_ms))
        .collect();
    if let Some(v) = live_fleet(scheduler).await {
        return Ok(Fleet {
            live: true,
            now_ms: v.now_ms,
            workers: v
                .workers
                .into_iter()
                .map(|w| Worker {
                    worker_id: w.worker_id,
                    host: w.host,
                    gpus: w
                        .gpus
                        .into_iter()
                        .map(|g| Gpu {
                            index: g.index,
                            name: g.name,
                            memory_mib: g.memory_mib,
                        })
                        .collect(),
                    free_gpus: Some(w.free_gpus),
                    cpu_slots: w.cpu_slots,
                    free_cpu: Some(w.free_cpu),
                    labels: w.labels,
                    provides: w.provides,
                    last_seen_ms: w.last_seen_ms,
                    draining: w.draining,
                    jobs: w
                        .jobs
                        .into_iter()
                        .map(|j| Lease {
                            started_ms: started.get(j.job_id.as_str()).copied().flatten(),
                            job_id: j.job_id,
                            family: j.family,
                            component: j.component,
                            run_no: j.run_no,
                            lease_epoch: j.lease_epoch,
                            gpus: j.gpus,
                            share_mib: j.share_mib,
                        })
                        .collect(),
                })
                .collect(),
        });
    }
    let mut workers: Vec<Worker> = store
        .stored_workers()
        .await?
        .into_iter()
        .map(|w| Worker {
            worker_id: w.worker_id,
            host: w.host,
            gpus: w
                .gpus
                .into_iter()
                .map(|g| Gpu {
                    index: g.index,
                    name: g.name,
                    memory_mib: g.memory_mib,
                })
                .collect(),
            free_gpus: None,
            cpu_slots: w.cpu_slots,
            free_cpu: None,
            labels: BTreeMap::new(),
            provides: Vec::new(),
            last_seen_ms: w.registered_ms,
            draining: false,
            jobs: Vec::new(),
        })
        .collect();
    let runs = store
        .runs(RunFilter {
            since_ms: Some(i64::MAX),
            ..RunFilter::default()
        })
        .await?;
    let run_no: BTreeMap<&str, u32> = runs.iter().map(|r| (r.job_id.as_str(), r.run_no)).collect();
    for j in &leased {
        let lease = Lease {
            job_id: j.job_id.clone(),
            family: j.family.clone(),
            component: j.component.clone(),
            run_no: run_no.get(j.job_id.as_str()).copied().unwrap_or(0),
            lease_epoch: j.lease_epoch,
            gpus: j.gpus.clone(),
            started_ms: j.started_ms,
            share_mib: 0,
        };
        match workers.iter_mut().find(|w| w.worker_id == j.worker_id) {
            Some(w) => w.jobs.push(lease),
            None => workers.push(Worker {
                worker_id: j.worker_id.clone(),
                jobs: vec![lease],
                ..Worker::default()
            }),
        }
    }
    Ok(Fleet {
        live: false,
        now_ms: now_ms(),
        workers,
    })
}

/// The fleet as a page shows it (issue #43): the workers that run now with
/// the runs they hold, the workers that registered once and are gone, and
/// the runs the store still records on a gone worker. Every `fvd submit`
/// of embedded mode registers a worker of its own (`HOST-PID`) that ends
/// with it, so without this split a state's page listed one worker per
/// past submit, and a killed one as holding the run it cut short.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Roster {
    /// The workers that run now: the scheduler's when one answered, else
    /// the stored workers whose process this host still runs.
    pub fleet: Fleet,
    /// The workers that are not running now (or, read from the store, not
    /// seen running on this host), the latest seen first.
    pub gone: Vec<GoneWorker>,
    /// Runs the store records as leased to a worker of `gone`: cut short.
    /// No worker holds them; their port runs them again.
    pub interrupted: Vec<Interrupted>,
}

/// A run of [`Roster::interrupted`] and the gone worker it was on.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Interrupted {
    pub worker_id: String,
    pub run: Lease,
}

impl Roster {
    /// Each interrupted run's job id → when its worker was last seen (0:
    /// unknown): where its bar on a timeline ends.
    pub fn cut(&self) -> BTreeMap<String, i64> {
        let seen: BTreeMap<&str, i64> = self
            .gone
            .iter()
            .map(|w| (w.worker_id.as_str(), w.last_seen_ms))
            .collect();
        self.interrupted
            .iter()
            .map(|i| {
                let at = seen.get(i.worker_id.as_str()).copied().unwrap_or(0);
                (i.run.job_id.clone(), at)
            })
            .collect()
    }
}

/// [`Roster::cut`], with one read only when the store records no lease
/// (then no run can be cut short): what a port's page needs of the fleet.
pub async fn interrupted_runs(
    store: &Store,
    scheduler: Option<&ActorRef<SchedulerMsg>>,
) -> Result<BTreeMap<String, i64>, StoreError> {
    if store.leased_jobs().await?.is_empty() {
        return Ok(BTreeMap::new());
    }
    Ok(roster(store, scheduler).await?.cut())
}

/// A worker of [`Roster::gone`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GoneWorker {
    pub worker_id: String,
    pub host: String,
    /// Its registration or the latest time a run it held records, the
    /// later of the two (0: unknown).
    pub last_seen_ms: i64,
}

/// The fleet split into the workers that run and those that are gone
/// ([`Roster`]).
pub async fn roster(
    store: &Store,
    scheduler: Option<&ActorRef<SchedulerMsg>>,
) -> Result<Roster, StoreError> {
    let mut fleet = fleet(store, scheduler).await?;
    let stored = store.stored_workers().await?;
    let worked = store.worker_last_runs().await?;
    let registered: BTreeMap<&str, i64> = stored
        .iter()
        .map(|w| (w.worker_id.as_str(), w.registered_ms))
        .collect();
    let gone: Vec<Worker> = if fleet.live {
        // The scheduler's workers hold only live leases; the stored
        // workers it does not know are gone, with the leases the store
        // still gives them.
        let live: Vec<&str> = fleet.workers.iter().map(|w| w.worker_id.as_str()).collect();
        let held: Vec<&str> = fleet
            .workers
            .iter()
            .flat_map(|w| w.jobs.iter().map(|j| j.job_id.as_str()))
            .collect();
        let stale = store_leases_off(store, &live, &held).await?;
        let mut gone: Vec<Worker> = stored
            .iter()
            .filter(|w| !live.contains(&w.worker_id.as_str()))
            .map(|w| Worker {
                worker_id: w.worker_id.clone(),
                host: w.host.clone(),
                ..Worker::default()
            })
            .collect();
        for (worker_id, lease) in stale {
            match gone.iter_mut().find(|w| w.worker_id == worker_id) {
                Some(w) => w.jobs.push(lease),
                None => gone.push(Worker {
                    worker_id,
                    jobs: vec![lease],
                    ..Worker::default()
                }),
            }
        }
        gone
    } else {
        let host = this_host();
        let (running, left): (Vec<Worker>, Vec<Worker>) = std::mem::take(&mut fleet.workers)
            .into_iter()
            .partition(|w| {
                registered
                    .get(w.worker_id.as_str())
                    .is_some_and(|at| runs_here(w, *at, host.as_deref()))
            });
        fleet.workers = running;
        left
    };
    let mut roster = Roster {
        fleet,
        ..Roster::default()
    };
    for w in gone {
        let last_seen_ms = registered
            .get(w.worker_id.as_str())
            .copied()
            .max(worked.get(&w.worker_id).copied())
            .unwrap_or(0);
        for run in w.jobs {
            roster.interrupted.push(Interrupted {
                worker_id: w.worker_id.clone(),
                run,
            });
        }
        roster.gone.push(GoneWorker {
            worker_id: w.worker_id,
            host: w.host,
            last_seen_ms,
        });
    }
    roster
        .gone
        .sort_by(|a, b| (b.last_seen_ms, &a.worker_id).cmp(&(a.last_seen_ms, &b.worker_id)));
    Ok(roster)
}

/// The leases the store records on a worker not in `live`, by worker,
/// leaving out the runs in `held` (the scheduler holds them).
async fn store_leases_off(
    store: &Store,
    live: &[&str],
    held: &[&str],
) -> Result<Vec<(String, Lease)>, StoreError> {
    let leased = store.leased_jobs().await?;
    if leased.is_empty() {
        return Ok(Vec::new());
    }
    let runs = store
        .runs(RunFilter {
            since_ms: Some(i64::MAX),
            ..RunFilter::default()
        })
        .await?;
    let run_no: BTreeMap<&str, u32> = runs.iter().map(|r| (r.job_id.as_str(), r.run_no)).collect();
    Ok(leased
        .into_iter()
        .filter(|j| !live.contains(&j.worker_id.as_str()) && !held.contains(&j.job_id.as_str()))
        .map(|j| {
            let lease = Lease {
                run_no: run_no.get(j.job_id.as_str()).copied().unwrap_or(0),
                job_id: j.job_id,
                family: j.family,
                component: j.component,
                lease_epoch: j.lease_epoch,
                gpus: j.gpus,
                started_ms: j.started_ms,
                share_mib: 0,
            };
            (j.worker_id, lease)
        })
        .collect())
}

/// This host's name, as a worker started here announces it.
fn this_host() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether the stored worker `w`, registered at `registered_ms`, still
/// runs: a worker of this host named `HOST-PID` (embedded mode's, and any
/// `fvd worker` without `--worker-id`) whose process is alive and started
/// before that registration (so not a later process that reuses the pid).
/// A worker of another host, or named otherwise, cannot be seen from
/// here: without a scheduler it does not count as running.
fn runs_here(w: &Worker, registered_ms: i64, host: Option<&str>) -> bool {
    if host != Some(w.host.as_str()) {
        return false;
    }
    let Some(pid) = w
        .worker_id
        .strip_prefix(w.host.as_str())
        .and_then(|r| r.strip_prefix('-'))
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return false;
    };
    process_started_ms(pid).is_some_and(|start| start <= registered_ms + PID_START_SLACK_MS)
}

/// How much later than its worker's registration a process may seem to
/// have started (the boot time is in whole seconds, start times in ticks).
const PID_START_SLACK_MS: i64 = 2_000;

/// When process `pid` started (ms since the epoch), if it runs and is not
/// a zombie.
fn process_started_ms(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3 of proc(5), starttime field 22.
    if matches!(fields.first(), Some(&"Z") | Some(&"X") | None) {
        return None;
    }
    let ticks: i64 = fields.get(19)?.parse().ok()?;
    let boot_s: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // Linux reports start times in USER_HZ, 100 a second on every
    // architecture it exports them for.
    Some(boot_s * 1000 + ticks * 10)
}

/// The runs waiting for a lease, and what each needs of a worker.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Queue {
    /// Connected workers, when a live scheduler answered; `None` when the
    /// reader cannot know (a state database without its orchestrator).
    pub workers: Option<usize>,
    /// Oldest first.
    pub jobs: Vec<Queued>,
}

/// One queued run of a [`Queue`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Queued {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub queued_ms: i64,
    pub needs: Needs,
    /// Why it waits, as the scheduler last said (the component's reason
    /// while queued: `waiting: needs 2 GPUs on one worker; …`, or the
    /// environment failures of the workers that could take it); empty when
    /// it simply waits its turn, or nothing was said yet.
    pub waiting: String,
}

/// What a run needs of the worker that takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Needs {
    pub gpus: u32,
    /// Each leased GPU has at least this much memory (0: any): the spec's
    /// `gpu_memory_mib`, else what the component's recorded runs say.
    pub gpu_memory_mib: u64,
    pub labels: BTreeMap<String, String>,
    /// Port-relative paths the worker must provide.
    pub worker_paths: Vec<String>,
    /// The port's preflight command runs on the worker first (a failing
    /// one excludes that worker).
    pub preflight: bool,
}

impl Needs {
    /// In words: `1 GPU with at least 40000 MiB, labels pool=a, worker
    /// paths weights/, a passing preflight`.
    pub fn describe(&self) -> String {
        let mut parts = vec![match self.gpus {
            0 => "a CPU slot".to_string(),
            1 => "1 GPU".to_string(),
            n => format!("{n} GPUs on one worker"),
        }];
        if self.gpu_memory_mib > 0 {
            parts[0].push_str(&format!(" with at least {} MiB each", self.gpu_memory_mib));
        }
        if !self.labels.is_empty() {
            let l: Vec<String> = self
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            parts.push(format!("label {}", l.join(",")));
        }
        if !self.worker_paths.is_empty() {
            parts.push(format!("worker path {}", self.worker_paths.join(", ")));
        }
        if self.preflight {
            parts.push("a passing preflight".to_string());
        }
        parts.join(", ")
    }
}

/// The queue of one port (`family`) or of every port: its waiting runs
/// with their needs (from the port's spec) and why they wait.
pub async fn queue(
    store: &Store,
    scheduler: Option<&ActorRef<SchedulerMsg>>,
    family: Option<&str>,
) -> Result<Queue, QueryError> {
    if let Some(f) = family
        && store.port(f).await?.is_none()
    {
        return Err(QueryError::UnknownFamily(f.to_string()));
    }
    let runs = store
        .runs(RunFilter {
            family,
            component: None,
            since_ms: Some(i64::MAX),
        })
        .await?;
    let mut specs: BTreeMap<String, Option<fvd_spec::PortSpec>> = BTreeMap::new();
    let mut reasons: BTreeMap<String, BTreeMap<String, ComponentRow>> = BTreeMap::new();
    let mut jobs = Vec::new();
    for r in runs.into_iter().filter(|r| r.state == JobState::Queued) {
        if !specs.contains_key(&r.family) {
            let spec = store.port(&r.family).await?.and_then(|p| {
                fvd_spec::parse(std::path::Path::new(&p.spec_path), &p.spec_toml).ok()
            });
            specs.insert(r.family.clone(), spec);
            let rows = store
                .components(&r.family)
                .await?
                .into_iter()
                .map(|c| (c.name.clone(), c))
                .collect();
            reasons.insert(r.family.clone(), rows);
        }
        let spec = specs
            .get(&r.family)
            .and_then(Option::as_ref)
            .and_then(|s| s.components.iter().find(|c| c.name == r.component));
        // What the run asks for: the spec's, else what its component's
        // recorded runs say (as the component read it when it queued).
        let gpu_memory_mib = match spec {
            Some(c) => {
                let history = store.gpu_history(&r.family, &r.component).await?;
                fvd_actors::scheduler::ask_mib(&c.placement, &history)
            }
            None => 0,
        };
        let needs = Needs {
            gpus: r.gpus_needed,
            gpu_memory_mib,
            labels: spec.map(|c| c.placement.labels.clone()).unwrap_or_default(),
            worker_paths: spec
                .map(|c| c.placement.worker_paths.clone())
                .unwrap_or_default(),
            preflight: spec.is_some_and(|c| !c.preflight.is_empty()),
        };
        let waiting = reasons
            .get(&r.family)
            .and_then(|rows| rows.get(&r.component))
            .filter(|c| {
                matches!(
                    c.status,
                    ComponentStatus::Queued | ComponentStatus::Environment
                )
            })
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        jobs.push(Queued {
            job_id: r.job_id,
            family: r.family,
            component: r.component,
            run_no: r.run_no,
            queued_ms: r.queued_ms,
            needs,
            waiting,
        });
    }
    let workers = live_fleet(scheduler).await.map(|v| v.workers.len());
    Ok(Queue { workers, jobs })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_store::states::GateOutcome;

    fn event(phase: &str, outcome: GateOutcome) -> GateEventRow {
        GateEventRow {
            phase: phase.into(),
            outcome,
            conditions: vec![format!("{phase} {}", outcome.as_str())],
            at_ms: 0,
        }
    }

    fn port(events: Vec<GateEventRow>) -> PortSnapshot {
        PortSnapshot {
            family: "f".into(),
            state: PortState::Running,
            phase: "P6".into(),
            repo: String::new(),
            port_status_path: String::new(),
            repo_identity: String::new(),
            owner: String::new(),
            submitted_by: String::new(),
            pause_reason: String::new(),
            status_write_error: String::new(),
            components: Vec::new(),
            gate_events: events,
            escapes: Vec::new(),
            actions: Vec::new(),
            agent_spend: None,
        }
    }

    /// Issue #43: read from the store, a worker runs while the process
    /// it is named after (`HOST-PID`, this host) runs and started before
    /// it registered; a later process with its pid, another host or
    /// another name is not it.
    #[test]
    fn a_stored_worker_runs_while_its_process_does() {
        let host = this_host().expect("a host name");
        let me = Worker {
            worker_id: format!("{host}-{}", std::process::id()),
            host: host.clone(),
            ..Worker::default()
        };
        let now = now_ms();
        assert!(runs_here(&me, now, Some(&host)));
        assert!(
            !runs_here(&me, 1_000, Some(&host)),
            "registered before this process started: a reused pid"
        );
        assert!(!runs_here(&me, now, Some("elsewhere")));
        let named = Worker {
            worker_id: "w1".into(),
            ..me.clone()
        };
        assert!(!runs_here(&named, now, Some(&host)));
        let gone = Worker {
            worker_id: format!("{host}-{}", u32::MAX - 1),
            ..me
        };
        assert!(!runs_here(&gone, now, Some(&host)));
    }

    /// Issue #43: a refusal a later submit went past is history; the
    /// refusals and pending phases after the latest phase entered hold.
    #[test]
    fn only_the_gate_s_refusals_since_its_latest_step_hold() {
        let stale = port(vec![
            event("P0", GateOutcome::Refused),
            event("P0", GateOutcome::Passed),
            event("P6", GateOutcome::Entered),
        ]);
        assert!(stale.current_gate().is_empty());
        let blocked = port(vec![
            event("P0", GateOutcome::Refused),
            event("P6", GateOutcome::Entered),
            event("P7", GateOutcome::Refused),
            event("P9", GateOutcome::Pending),
        ]);
        let phases: Vec<(&str, GateOutcome)> = blocked
            .current_gate()
            .iter()
            .map(|g| (g.phase.as_str(), g.outcome))
            .collect();
        assert_eq!(
            phases,
            [("P7", GateOutcome::Refused), ("P9", GateOutcome::Pending)]
        );
        let refused_at_once = port(vec![event("P0", GateOutcome::Refused)]);
        assert_eq!(refused_at_once.current_gate().len(), 1);
    }
}
