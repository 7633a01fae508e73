//! The read side of a port's state, in one place for every reader: the
//! gRPC handlers of `PortService` (a fleet orchestrator) and the CLI reading
//! an embedded `REPO/.fvd/state.db` (`fvd status`, `logs`, `attempts`,
//! `trace show`) call the same functions, so the two modes cannot answer
//! differently. Nothing here writes.

use std::time::Duration;

use fvd_proto::v1 as pb;
use fvd_store::model::Worktree;
use fvd_store::model::{JobRecord, JobState};
use fvd_store::traces::TraceInvestigation;
use fvd_store::{AttemptRow, Store, StoreError};
use tokio::sync::mpsc;

use crate::port_api::{component_wire, escape_wire, gate_wire, variant_wire};

/// How often a followed log looks for new output.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

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

/// The snapshot of one port, or of every port when `family` is `None`.
pub async fn status(
    store: &Store,
    family: Option<&str>,
) -> Result<Vec<pb::PortSnapshot>, QueryError> {
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

/// The wire snapshot of one port, read from the store.
pub async fn snapshot(store: &Store, family: &str) -> Result<Option<pb::PortSnapshot>, StoreError> {
    // The gate commits a phase before the event that announces it, so the
    // events are read first: a snapshot that holds "P6 entered" then also
    // holds the port in P6 (each read sees its own moment of the store).
    let gate = store.gate_events(family).await?;
    let Some(port) = store.port(family).await? else {
        return Ok(None);
    };
    let components = store.components(family).await?;
    let escapes = store.escapes(family).await?;
    let mut tables = store.variant_tables(family).await?;
    let mut spend = store.usage_totals(family).await?;
    let port_spend = spend
        .values()
        .fold(None::<fvd_store::usage::UsageTotals>, |acc, t| {
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
        Some(f) if port.state == fvd_store::model::PortState::Running => (
            fvd_store::model::PortState::Environment,
            f.reason(store.db_name()),
        ),
        _ => (port.state, String::new()),
    };
    Ok(Some(pb::PortSnapshot {
        agent_spend: port_spend.as_ref().map(crate::port_api::spend_wire),
        status_write_error,
        pause_reason,
        escapes: escapes.into_iter().map(escape_wire).collect(),
        family: port.family,
        state: state.as_str().to_string(),
        phase: port.phase,
        components: components
            .into_iter()
            .map(|c| {
                let rows = tables.remove(&c.name).unwrap_or_default();
                let used = spend.remove(&c.name);
                let mut w = component_wire(c);
                w.variants = rows.into_iter().map(variant_wire).collect();
                w.agent_spend = used.as_ref().map(crate::port_api::spend_wire);
                w
            })
            .collect(),
        gate_events: gate.into_iter().map(gate_wire).collect(),
        repo: port.repo,
        port_status_path: port.port_status_path,
        repo_identity: origin.repo_identity,
        owner: origin.owner,
        submitted_by: origin.submitted_by,
        actions: actions
            .into_iter()
            .map(|a| pb::PortAction {
                action: a.action,
                actor: a.actor,
                detail: a.detail,
                at_ms: a.at_ms,
            })
            .collect(),
    }))
}

/// The run whose output `fvd logs` shows: run `run` (1-based) of the
/// component, or its latest run.
pub async fn run_of(
    store: &Store,
    family: &str,
    component: &str,
    run: Option<u32>,
) -> Result<JobRecord, QueryError> {
    let runs = store.jobs_of(family, component).await?;
    match run {
        None => runs.last(),
        Some(n) => runs.iter().find(|j| j.run_no == n),
    }
    .cloned()
    .ok_or_else(|| QueryError::UnknownRun {
        family: family.to_string(),
        component: component.to_string(),
        run: run.map_or("at all".to_string(), |n| n.to_string()),
    })
}

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

/// The latest drill-down investigation of a component.
pub async fn trace_report(
    store: &Store,
    family: &str,
    component: &str,
) -> Result<TraceInvestigation, QueryError> {
    if store.port(family).await?.is_none() {
        return Err(QueryError::UnknownFamily(family.to_string()));
    }
    store
        .latest_trace(family, component)
        .await?
        .ok_or_else(|| QueryError::NoTrace {
            family: family.to_string(),
            component: component.to_string(),
        })
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
                Ok(Some(j)) => !matches!(j.state, JobState::Queued | JobState::Running),
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
