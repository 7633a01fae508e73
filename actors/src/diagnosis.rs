//! The shape the port's diagnosers share: the trace actor
//! ([`crate::trace_actor`]) and the variant actor ([`crate::variant_actor`]).
//!
//! A diagnoser is one actor per port, spawned by the gate and linked to it,
//! with [`DiagnosisArgs`] and one message enum, [`DiagnosisMsg`]: a red run to
//! diagnose ([`crate::red_run::RedRun`], already classified), the
//! scheduler's [`JobEvent`]s of the reruns it queued, and the components it
//! works for right now. It queues its reruns of a red run's code as jobs of
//! `<component><suffix>` ([`DiagnosisArgs::queue_rerun`], [`DiagnosisArgs::enqueue`]),
//! shows what it does on the component's row by telling the component
//! ([`RedRun::progress`]; no diagnoser writes a component's row), and passes the run
//! on when done ([`crate::red_run::hand_on`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use fvd_spec::ComponentSpec;
use fvd_spec::trace_spec::TraceSpec;
use fvd_store::Store;
use fvd_store::messages::JobReport;
use fvd_store::model::JobRecord;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::Span;

use crate::red_run::RedRun;
use crate::run_env;
use crate::scheduler::{JobEvent, QueuedJob, SchedulerMsg};

/// What the gate gives a diagnoser of its port.
#[derive(Debug)]
pub struct DiagnosisArgs {
    pub family: String,
    /// The port's code: reruns run the commit of the red run.
    pub code: fvd_store::model::PortCode,
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
}

#[derive(Debug)]
pub enum DiagnosisMsg {
    /// A red run handed over, to pass on with [`crate::red_run::hand_on`]
    /// once diagnosed.
    Diagnose(Box<RedRun>),
    /// Progress of a rerun, as the scheduler tells it.
    Job(JobEvent),
    /// The components this diagnoser works for right now (tests, status).
    InFlight(RpcReplyPort<Vec<String>>),
}

crate::scheduler::job_event_msg!(DiagnosisMsg::Job);

// A red run reaches a diagnoser through a derived ref (its route).
impl From<Box<RedRun>> for DiagnosisMsg {
    fn from(r: Box<RedRun>) -> Self {
        DiagnosisMsg::Diagnose(r)
    }
}

impl TryFrom<DiagnosisMsg> for Box<RedRun> {
    type Error = DiagnosisMsg;

    fn try_from(m: DiagnosisMsg) -> Result<Self, DiagnosisMsg> {
        match m {
            DiagnosisMsg::Diagnose(r) => Ok(r),
            other => Err(other),
        }
    }
}

/// Spawns a diagnoser of port `family`, linked to its gate (it ends with the
/// port), under the name `<family><suffix>` (`#` cannot clash with a
/// component actor's `family/component`).
pub async fn spawn_for_port<A>(
    actor: A,
    suffix: &str,
    supervisor: ActorCell,
    args: DiagnosisArgs,
) -> Result<ActorRef<DiagnosisMsg>, ActorProcessingErr>
where
    A: Actor<Msg = DiagnosisMsg, Arguments = DiagnosisArgs>,
{
    let name = format!("{}{suffix}", args.family);
    let (actor, _) = Actor::spawn_linked(Some(name), actor, args, supervisor).await?;
    Ok(actor)
}

/// Where a diagnoser writes the files its reruns gathered: beside the
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

impl DiagnosisArgs {
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
        notify: &ActorRef<DiagnosisMsg>,
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
                collect_env: traced.map(|_| run_env::TRACE_DIR_ENV.to_string()),
                exclude: BTreeMap::new(),
                preflight: spec.preflight.clone(),
                warm: spec.runner.warm_preload(),
                compare: traced.map(|t| Box::new(run_env::worker_compare(t))),
                agent: None,
                fvd_writes: self.code.fvd_writes.clone(),
            })))
            .map_err(|e| e.to_string())
    }
}

/// A rerun's event as a diagnoser handles it.
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

/// The events a diagnoser acts on (`what` names its reruns in the log of one
/// that waits); the rest only the scheduler's log needs.
pub fn rerun_event(ev: JobEvent, what: &str) -> Option<Rerun> {
    match ev {
        JobEvent::Finished {
            report, worker_id, ..
        } => Some(Rerun::Finished {
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
