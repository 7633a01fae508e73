//! The shape the port's helper actors share: the trace actor
//! ([`crate::trace_actor`]) and the variant actor ([`crate::variant_actor`]).
//!
//! A helper is one actor per port, spawned by the gate and linked to it,
//! with [`HelperArgs`] and one message enum, [`HelperMsg`]: a red run to
//! diagnose ([`crate::red_run::RedRun`], already classified), the
//! scheduler's [`JobEvent`]s of the reruns it queued, and the components it
//! works for right now. It queues its reruns of a red run's code as jobs of
//! `<component><suffix>` ([`HelperArgs::queue_rerun`], [`HelperArgs::enqueue`]),
//! shows what it does on the component's row by telling the component
//! ([`progress`]; no helper writes a component's row), and passes the run
//! on when done ([`crate::red_run::hand_on`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use fvd_spec::ComponentSpec;
use fvd_spec::trace_spec::TraceSpec;
use fvd_store::Store;
use fvd_store::model::{ComponentStatus, JobRecord, JobReport};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::Span;

use crate::component::ComponentMsg;
use crate::gate::GateMsg;
use crate::red_run::RedRun;
use crate::scheduler::{JobEvent, QueuedJob, SchedulerMsg};
use crate::trace_actor;

/// What the gate gives a helper of its port.
#[derive(Debug)]
pub struct HelperArgs {
    pub family: String,
    /// The port's code: reruns run the commit of the red run.
    pub code: fvd_store::model::PortCode,
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
}

#[derive(Debug)]
pub enum HelperMsg {
    /// A red run handed over, to pass on with [`crate::red_run::hand_on`]
    /// once diagnosed.
    Diagnose(Box<RedRun>),
    /// Progress of a rerun, as the scheduler tells it.
    Job(JobEvent),
    /// The components this helper works for right now (tests, status).
    InFlight(RpcReplyPort<Vec<String>>),
}

crate::scheduler::job_event_msg!(HelperMsg::Job);

/// Spawns a helper of port `family`, linked to its gate (it ends with the
/// port), under the name `<family><suffix>` (`#` cannot clash with a
/// component actor's `family/component`).
pub async fn spawn_for_port<A>(
    actor: A,
    suffix: &str,
    gate: &ActorRef<GateMsg>,
    args: HelperArgs,
) -> Result<ActorRef<HelperMsg>, ActorProcessingErr>
where
    A: Actor<Msg = HelperMsg, Arguments = HelperArgs>,
{
    let name = format!("{}{suffix}", args.family);
    let (actor, _) = Actor::spawn_linked(Some(name), actor, args, gate.get_cell()).await?;
    Ok(actor)
}

/// Where a helper writes the files its reruns gathered: beside the
/// database (in-memory stores, in tests, have no folder: a temporary one
/// serves).
pub fn files_root(store: &Store) -> PathBuf {
    store
        .files_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("fvd"))
        .join("trace")
}

/// The code a red run tested, which its reruns test too: its folder,
/// commit and port folder inside the commit.
#[derive(Debug, Clone, Default)]
pub struct RunCode {
    pub cwd: String,
    pub commit: String,
    pub code_prefix: String,
}

impl HelperArgs {
    /// The code red run `job_id` tested (empty when it has no row).
    pub async fn code_of(&self, job_id: &str) -> RunCode {
        match self.store.job(job_id).await {
            Ok(Some(j)) => RunCode {
                cwd: j.cwd,
                commit: j.commit,
                code_prefix: j.code_prefix,
            },
            _ => RunCode::default(),
        }
    }

    /// Records a rerun of `spec`'s test on `code` as a queued job of
    /// `<component><suffix>`: never a run of the component.
    pub async fn queue_rerun(
        &self,
        spec: &ComponentSpec,
        suffix: &str,
        code: &RunCode,
    ) -> Result<JobRecord, fvd_store::StoreError> {
        self.store
            .queue_job(&JobRecord {
                family: self.family.clone(),
                component: format!("{}{suffix}", spec.name),
                argv: spec.argv(),
                cwd: code.cwd.clone(),
                commit: code.commit.clone(),
                code_prefix: code.code_prefix.clone(),
                gpus_needed: spec.gpus,
                timeout_ms: spec.timeout_ms(),
                ..JobRecord::default()
            })
            .await
    }

    /// Sends a recorded rerun to the scheduler, its events to `notify`:
    /// `env` as [`run_env`] made it, and for a traced rerun the folder
    /// variable and the comparison the worker runs. An error is the
    /// scheduler's: it is down.
    pub fn enqueue(
        &self,
        notify: &ActorRef<HelperMsg>,
        spec: &ComponentSpec,
        record: JobRecord,
        env: BTreeMap<String, String>,
        span: Span,
        traced: Option<&TraceSpec>,
    ) -> Result<(), String> {
        self.scheduler
            .cast(SchedulerMsg::Enqueue(Box::new(QueuedJob {
                record: record.into(),
                env,
                secret_env: spec.env.clone(),
                notify: notify.get_derived(),
                placement: spec.placement.clone(),
                span,
                collect_env: traced.map(|_| trace_actor::TRACE_DIR_ENV.to_string()),
                exclude: BTreeMap::new(),
                preflight: spec.preflight.clone(),
                warm: spec.runner.warm_preload(),
                compare: traced.map(|t| Box::new(trace_actor::worker_compare(t))),
                agent: None,
                fvd_writes: self.code.fvd_writes.clone(),
            })))
            .map_err(|e| e.to_string())
    }
}

/// The variables every run of a component gets on top of `env`: its
/// family, name and run number.
pub fn run_env(
    mut env: BTreeMap<String, String>,
    family: &str,
    component: &str,
    run_no: u32,
) -> BTreeMap<String, String> {
    env.insert("FVD_FAMILY".to_string(), family.to_string());
    env.insert("FVD_COMPONENT".to_string(), component.to_string());
    env.insert("FVD_RUN".to_string(), run_no.to_string());
    env
}

/// Shows what a helper does with a red run on its component's row: the
/// component writes it (status `status`, the run's verdict, `reason`).
pub fn progress(run: &RedRun, status: ComponentStatus, reason: String) {
    let _ = run.component.cast(ComponentMsg::Diagnosing {
        job_id: run.report.job_id.clone(),
        status,
        verdict: run.recorded(),
        reason,
    });
}

/// A rerun's event as a helper handles it.
#[derive(Debug)]
pub enum Rerun {
    Finished {
        report: Box<JobReport>,
        worker_id: String,
    },
    /// Its worker was lost on every retry.
    Lost {
        job_id: String,
        worker_id: String,
    },
    Unplaceable {
        job_id: String,
        reason: String,
    },
}

/// The events a helper acts on (`what` names its reruns in the log of one
/// that waits); the rest only the scheduler's log needs.
pub fn rerun_event(ev: JobEvent, what: &str) -> Option<Rerun> {
    match ev {
        JobEvent::Finished { report, worker_id } => Some(Rerun::Finished {
            report: Box::new(report),
            worker_id,
        }),
        JobEvent::WorkerLost {
            job_id,
            worker_id,
            give_up: true,
        } => Some(Rerun::Lost { job_id, worker_id }),
        JobEvent::Unplaceable { job_id, reason } => Some(Rerun::Unplaceable { job_id, reason }),
        JobEvent::Waiting { job_id, reason, .. } if !reason.is_empty() => {
            tracing::info!(job = %job_id, %reason, "{what} waits");
            None
        }
        _ => None,
    }
}
