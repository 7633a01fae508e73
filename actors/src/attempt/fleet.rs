//! An agent attempt as a fleet job (issue #32, `fvd orchestrator serve
//! --agents fleet`): the component hands its attempt to the scheduler like
//! a run, a worker with a free slot runs the agent in a checkout of its own
//! of the attempt's base commit, and the attempt's commit comes back as a
//! pack; the component's worktree and branch then move to it
//! (`worktree::adopt`).
//!
//! The job has no row in the store's `jobs`: the attempt's ledger row
//! (opened before the job is queued, given the job's id and its lease) is
//! its record, which is what makes a crash safe. An orchestrator killed
//! during the attempt restarts with the row `running` and asks to adopt the
//! job ([`Queue::Adopt`], issue #38): its worker still runs it, and the
//! agent goes on; a job no worker runs any more ends
//! [`FleetEnd::NotAdopted`] and the attempt runs again under the same
//! number from its base. A worker lost during the attempt has its job
//! queued again by the scheduler, which starts it from the base on another
//! worker.
//!
//! While it runs, the attempt is registered in [`FleetAttempts`]: the worker
//! edge serves its base commit and its model-proxy tunnel to the worker
//! that holds it, and nothing else.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use fvd_store::messages::{AgentJob, AgentOutcome, JobReport};
use fvd_workspace::agent::{AgentExit, FleetAttempt, FleetAttempts};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::scheduler::{JobEvent, QueuedJob, QueuedRun, SchedulerMsg};

/// How an attempt's fleet job ended.
#[derive(Debug)]
pub enum FleetEnd {
    /// A worker ran the agent (or could not start it, or its code could
    /// not be placed: then `report.agent` is `None`).
    Finished {
        report: Box<JobReport>,
        worker_id: String,
    },
    /// It ran nowhere and will not: never placeable, its workers lost on
    /// every retry, or its owner's process gone. An environment failure.
    Lost(String),
    /// Asked to adopt it after a restart, no worker still runs it (why):
    /// the attempt is tried again from its base.
    NotAdopted(String),
}

/// What the component asks of the fleet for one attempt.
#[derive(Debug)]
pub struct FleetAttemptJob {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub attempt: u32,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// `[agent].env`: read from the worker's environment by name.
    pub secret_env: Vec<String>,
    pub placement: fvd_spec::Placement,
    pub gpus: u32,
    pub timeout_ms: u64,
    /// The attempt's base commit and the port folder's place in it.
    pub base: String,
    pub code_prefix: String,
    pub repo: PathBuf,
    pub proxy: Option<std::net::SocketAddr>,
    pub tools: Option<std::net::SocketAddr>,
    pub agent: AgentJob,
    pub span: tracing::Span,
    /// The job is this attempt's try an earlier orchestrator process
    /// queued (same id): its worker may still run it, and it is adopted
    /// rather than queued (issue #38).
    pub adopt: bool,
}

/// Queues the attempt, waits for its end, and cancels it when `stop`
/// completes first (the model proxy tripped). Dropped mid-way (the
/// component stopped), its job is cancelled and its registration closed.
pub async fn run(
    scheduler: &ActorRef<SchedulerMsg>,
    attempts: &FleetAttempts,
    job: FleetAttemptJob,
    stop: impl Future<Output = ()>,
) -> Result<(FleetEnd, bool), ActorProcessingErr> {
    let _open = attempts.open(
        &job.job_id,
        FleetAttempt {
            repo: job.repo.clone(),
            commit: job.base.clone(),
            proxy: job.proxy,
            tools: job.tools,
            lease: None,
        },
    );
    let record = QueuedRun {
        job_id: job.job_id.clone(),
        family: job.family.clone(),
        component: job.component.clone(),
        run_no: job.attempt,
        argv: job.argv,
        cwd: job.repo.to_string_lossy().into_owned(),
        gpus_needed: job.gpus,
        timeout_ms: job.timeout_ms,
        queued_ms: fvd_store::now_ms(),
        commit: job.base,
        code_prefix: job.code_prefix,
        expected_ms: None,
    };
    let (env, secret_env, placement, span, agent) =
        (job.env, job.secret_env, job.placement, job.span, job.agent);
    let how = if job.adopt { Queue::Adopt } else { Queue::New };
    run_queued(
        scheduler,
        attempts,
        &job.job_id,
        how,
        |notify| QueuedJob {
            record,
            env,
            secret_env,
            notify,
            placement,
            span,
            collect_env: None,
            exclude: BTreeMap::new(),
            preflight: Vec::new(),
            compare: None,
            fvd_writes: Vec::new(),
            warm: None,
            agent: Some(Box::new(agent)),
        },
        stop,
    )
    .await
}

/// How [`run_queued`] hands its job to the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// A new job, queued.
    New,
    /// A job an earlier orchestrator process leased: adopted if its worker
    /// still runs it, else it ends [`FleetEnd::NotAdopted`].
    Adopt,
}

/// Queues (or adopts, see [`Queue`]) a job that has no row in the store
/// (`build` gets its `notify`), waits for its end, and cancels it when
/// `stop` completes first; whether it was stopped. `attempts` learns its
/// worker once it is leased.
pub async fn run_queued(
    scheduler: &ActorRef<SchedulerMsg>,
    attempts: &FleetAttempts,
    job_id: &str,
    how: Queue,
    build: impl FnOnce(ractor::DerivedActorRef<JobEvent>) -> QueuedJob,
    stop: impl Future<Output = ()>,
) -> Result<(FleetEnd, bool), ActorProcessingErr> {
    let (done, ended) = oneshot::channel();
    let (waiter, _) = Actor::spawn(
        None,
        AttemptWaiter,
        WaiterArgs {
            job_id: job_id.to_string(),
            attempts: attempts.clone(),
            done,
        },
    )
    .await?;
    let mut guard = Queued {
        scheduler: scheduler.clone(),
        waiter: waiter.clone(),
        job_id: job_id.to_string(),
        ended: false,
    };
    let job = Box::new(build(waiter.get_derived()));
    scheduler.cast(match how {
        Queue::New => SchedulerMsg::Enqueue(job),
        Queue::Adopt => SchedulerMsg::Adopt(job),
    })?;
    tokio::pin!(stop);
    let mut stopped = false;
    let mut ended = ended;
    let end = loop {
        tokio::select! {
            end = &mut ended => break end.unwrap_or_else(|_| FleetEnd::Lost("the job's waiter stopped".into())),
            () = &mut stop, if !stopped => {
                stopped = true;
                let _ = scheduler.cast(SchedulerMsg::Cancel {
                    job_id: guard.job_id.clone(),
                    reason: "the agent's model proxy stopped forwarding".into(),
                });
                // A job still queued ends here; a running one comes back
                // cancelled.
                if !waiter_has_lease(attempts, &guard.job_id) {
                    break FleetEnd::Lost("stopped before it was placed".into());
                }
            }
        }
    };
    guard.ended = true;
    Ok((end, stopped))
}

fn waiter_has_lease(attempts: &FleetAttempts, job_id: &str) -> bool {
    attempts.lease_of(job_id).is_some()
}

/// What the component made of a finished fleet job: the agent's exit as a
/// host run reports it, and what it left.
pub fn exit_of(report: &JobReport, stopped: bool) -> AgentExit {
    let agent = report.agent.as_ref();
    AgentExit {
        exit_code: report.exit_code,
        signal: report.signal,
        timed_out: report.timed_out,
        stopped,
        duration_ms: report.duration_ms,
        stdout: agent.map(|a| a.stdout.clone()).unwrap_or_default(),
        spawn_error: (!report.spawn_error.is_empty()).then(|| report.spawn_error.clone()),
    }
}

/// The attempt's outcome, or why the worker could not give one (then the
/// attempt is an environment failure: nothing of the agent's is lost, it
/// runs again under its number).
pub fn outcome_of(report: &JobReport) -> Result<&AgentOutcome, String> {
    match &report.agent {
        None if !report.spawn_error.is_empty() => Err(report.spawn_error.clone()),
        None => Err("the worker sent no attempt result".into()),
        // Refused at the edge (over a limit): the agent's outcome, not the
        // environment's; the component records it.
        Some(a) if !a.refused.is_empty() => Ok(a),
        Some(a) if !a.error.is_empty() => Err(a.error.clone()),
        Some(a) if a.commit.is_empty() => Err("the worker sent no commit".into()),
        Some(a) => Ok(a),
    }
}

/// Cancels the job and stops its waiter if the attempt is left before it
/// ended (the component stopped mid-way).
struct Queued {
    scheduler: ActorRef<SchedulerMsg>,
    waiter: ActorRef<WaiterMsg>,
    job_id: String,
    ended: bool,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.scheduler.cast(SchedulerMsg::Cancel {
                job_id: self.job_id.clone(),
                reason: "its component stopped".into(),
            });
        }
        self.waiter.stop(None);
    }
}

/// Turns the scheduler's events about one attempt's job into its end.
#[derive(Debug)]
struct AttemptWaiter;

#[derive(Debug)]
enum WaiterMsg {
    Job(JobEvent),
}

crate::scheduler::job_event_msg!(WaiterMsg::Job);

struct WaiterArgs {
    job_id: String,
    attempts: FleetAttempts,
    done: oneshot::Sender<FleetEnd>,
}

impl std::fmt::Debug for WaiterArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaiterArgs")
            .field("job_id", &self.job_id)
            .finish()
    }
}

#[derive(Debug)]
struct WaiterState {
    job_id: String,
    attempts: FleetAttempts,
    done: Option<oneshot::Sender<FleetEnd>>,
}

impl Actor for AttemptWaiter {
    type Msg = WaiterMsg;
    type State = WaiterState;
    type Arguments = WaiterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WaiterMsg>,
        args: WaiterArgs,
    ) -> Result<WaiterState, ActorProcessingErr> {
        Ok(WaiterState {
            job_id: args.job_id,
            attempts: args.attempts,
            done: Some(args.done),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WaiterMsg>,
        WaiterMsg::Job(ev): WaiterMsg,
        st: &mut WaiterState,
    ) -> Result<(), ActorProcessingErr> {
        let end = match ev {
            JobEvent::Leased {
                job_id,
                worker_id,
                epoch,
            } if job_id == st.job_id => {
                tracing::info!(job = %job_id, worker = %worker_id, epoch, "agent attempt leased");
                st.attempts.leased(&job_id, &worker_id, epoch);
                None
            }
            JobEvent::Finished {
                report, worker_id, ..
            } if report.job_id == st.job_id => Some(FleetEnd::Finished {
                report: Box::new(report),
                worker_id,
            }),
            JobEvent::Unplaceable { job_id, reason } if job_id == st.job_id => {
                Some(FleetEnd::Lost(format!("no worker can run it: {reason}")))
            }
            JobEvent::WorkerLost {
                job_id,
                worker_id,
                give_up: true,
            } if job_id == st.job_id => Some(FleetEnd::Lost(format!(
                "worker {worker_id} lost on every retry"
            ))),
            JobEvent::WorkerLost {
                job_id,
                worker_id,
                give_up: false,
            } if job_id == st.job_id => {
                tracing::warn!(job = %job_id, worker = %worker_id, "agent attempt's worker lost; the attempt is placed again from its base");
                st.attempts.unleased(&job_id);
                None
            }
            JobEvent::NotAdopted { job_id, reason } if job_id == st.job_id => {
                Some(FleetEnd::NotAdopted(reason))
            }
            _ => None,
        };
        if let Some(end) = end {
            if let Some(done) = st.done.take() {
                let _ = done.send(end);
            }
            myself.stop(None);
        }
        Ok(())
    }
}
