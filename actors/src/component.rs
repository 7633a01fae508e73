//! `ComponentSubagentActor`: one per component of a port. It asks the
//! scheduler for a run of the component's parity test, has the result
//! classified once ([`crate::red_run`]: the verdict from its JUnit report,
//! and whether a red run is traced or gets its variants first) and records
//! it. While it runs, it writes the component's row (the scheduler marks
//! a run leased or requeued in the same transaction; the gate and the
//! orchestrator write it on cancel, on a vanished `.fvd` and on reset): the
//! diagnosers of a red run tell it what they do
//! ([`ComponentMsg::Diagnosis`]) and never write the row themselves.
//!
//! A component without an `[agent]` ends as `blocked` on any verdict other
//! than `non_skip_pass`, with the precise reason (the failing assertion, the
//! skip reason, the collection error), as the parity contract asks. A
//! component with one loops: after a red run the coding agent runs in the
//! component's git worktree with the packet of [`fvd_workspace::agent`], its work is
//! committed and recorded in the attempt ledger, and the parity test runs
//! again there, until a `non_skip_pass` that holds for `confirm_runs` runs
//! and clears the cleanup gate, a blocker the agent returns, or a budget
//! spent (attempts, wall time, GPU-seconds: then `blocked` with the last
//! verdict as evidence). An agent that asks the user parks the component in
//! `ask_user` until `fvd answer`; the rest of the port goes on.
//! An `infra_error` is not an attempt: the job is retried on another slot.
//!
//! Every step is in the store before the next begins: an attempt row is
//! opened before its agent starts, so after a crash the attempt that was cut
//! off is found, its leftover processes ended, its worktree reset, and it
//! runs once more under the same number (see `resume`).

use std::collections::BTreeMap;
use std::path::Path;

use fvd_contracts::verdict::Verdict;
use fvd_telemetry::{metrics, spans};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::broadcast;
use tracing::Span;
use tracing::field::Empty;

use crate::attempt::{
    AgentDone, AgentLoop, AttemptActor, AttemptArgs, AttemptCtx, AttemptDone, AttemptEnd,
    AttemptTurn, Spent, budget_spent,
};
use crate::gate::GateMsg;
use crate::red_run::{self, AfterVerdict, Decision, Diagnosis, RedRun};
use crate::scheduler::{JobEvent, QueuedJob, SchedulerMsg, SharedGpu};
use fvd_spec::ComponentSpec;
use fvd_store::messages::{JobReport, PortEvent};
use fvd_store::model::{
    ComponentRow, ComponentStatus, JobRecord, JobResult, JobState, RecordedVerdict,
};
use fvd_store::states::{AttemptKind, AttemptState, EscapeAbout, EscapeStatus};
use fvd_store::{AttemptNext, AttemptRecorded, AttemptRow, ComponentNext, EscapeRow, Store};
use fvd_workspace::agent::{self, AgentsOn};
use fvd_workspace::worktree;

pub use crate::red_run::MAX_INFRA_VERDICTS;

mod agent_loop;
mod judge;
mod shared_oom;

use agent_loop::{
    after_answer, agent_attempt, agent_plan, attempt_done, cleanup_findings, escapes_where,
    passes_in_a_row, resume,
};

#[derive(Debug)]
pub struct ComponentSubagentActor;

#[derive(Debug)]
pub struct ComponentArgs {
    /// The span this component's span hangs under (the port's P6 phase).
    pub span: Span,
    pub family: String,
    pub spec: ComponentSpec,
    /// Working directory of the runs on the worker: the port's repository.
    pub repo: String,
    /// The commit the port is pinned to and where its folder sits in it.
    pub code: fvd_store::model::PortCode,
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub gate: ActorRef<GateMsg>,
    pub events: broadcast::Sender<PortEvent>,
    /// The port's diagnosers its red runs visit (trace, variants).
    pub diagnosers: red_run::Diagnosers,
    /// Whether its agent command may run here, and jailed how.
    pub agents: agent::AgentPolicy,
    /// The port's `REPO/.fvd`: nothing is recorded once it went away (the
    /// gate stops the port).
    pub fvd: std::sync::Arc<crate::fvd_dir::FvdDir>,
    /// A passing component the pipeline sent back to P6: its agent's next
    /// attempt starts from the pipeline's red run instead of its own.
    pub reopen: Option<Reopen>,
}

/// Why a passing component is reopened: the red pipeline run whose first
/// divergence lies in its modules, and that run's result as its agent is
/// told it (the reason names the pipeline test and the module).
#[derive(Debug, Clone)]
pub struct Reopen {
    pub job_id: String,
    pub result: JobResult,
}

#[derive(Debug)]
pub enum ComponentMsg {
    /// Progress of the component's run in flight, from the scheduler.
    Job(JobEvent),
    /// A person answered an escape hatch of this component (the answer is
    /// in the store): an `ask_user` component goes on with its next attempt.
    Answered { id: String },
    /// A red run's diagnosers show what they do on the component's row (a
    /// trace step, the variant runs), and hand the run back with their
    /// notes (the investigation's summary, the variant table's note).
    Diagnosis(Diagnosis),
    /// The agent attempt this component spawned ended.
    AttemptDone(Box<AttemptDone>),
}

// The scheduler's events reach the component through a derived ref.
crate::scheduler::job_event_msg!(ComponentMsg::Job);
crate::attempt::attempt_done_msg!(ComponentMsg::AttemptDone);

// A red run's route reaches the component through a derived ref.
impl From<Diagnosis> for ComponentMsg {
    fn from(d: Diagnosis) -> Self {
        ComponentMsg::Diagnosis(d)
    }
}

impl TryFrom<ComponentMsg> for Diagnosis {
    type Error = ComponentMsg;

    fn try_from(m: ComponentMsg) -> Result<Self, ComponentMsg> {
        match m {
            ComponentMsg::Diagnosis(d) => Ok(d),
            other => Err(other),
        }
    }
}

#[derive(Debug)]
pub struct ComponentState {
    args: ComponentArgs,
    job_id: Option<String>,
    infra_verdicts: u32,
    /// `component` span, open until the component is final.
    span: Span,
    /// `attempt` span of the run in flight; the scheduler's `job` span
    /// hangs under it.
    attempt: Span,
    /// Verdict of the previous run, to tell a verdict change.
    last_verdict: Option<RecordedVerdict>,
    /// The agent loop's state, for a component with an `[agent]`.
    agent: Option<AgentLoop>,
    /// Workers whose environment failed this component's runs, with the
    /// cause: its next runs go elsewhere (or wait for a fixed worker).
    exclude: BTreeMap<String, String>,
    /// The component waits for an environment (no worker without a failed
    /// environment can take its run); the gate knows.
    waiting_env: bool,
    /// How its runs ask for GPU memory after an out-of-memory error under
    /// sharing ([`shared_oom`]).
    gpu: shared_oom::GpuAsk,
}

impl Actor for ComponentSubagentActor {
    type Msg = ComponentMsg;
    type State = ComponentState;
    type Arguments = ComponentArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: ComponentArgs,
    ) -> Result<ComponentState, ActorProcessingErr> {
        let span = tracing::info_span!(
            parent: &args.span,
            "component",
            "fvd.family" = %args.family,
            "fvd.component" = %args.spec.name,
            "fvd.gpus_needed" = i64::from(args.spec.gpus),
            "fvd.reopened" = Empty,
            "fvd.status" = Empty,
            "fvd.verdict" = Empty,
            "fvd.reason" = Empty,
        );
        Ok(ComponentState {
            args,
            job_id: None,
            infra_verdicts: 0,
            span,
            attempt: Span::none(),
            last_verdict: None,
            agent: None,
            exclude: BTreeMap::new(),
            waiting_env: false,
            gpu: shared_oom::GpuAsk::default(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        st: &mut ComponentState,
    ) -> Result<(), ActorProcessingErr> {
        let first = first_step(&myself, st).await;
        // After the run it queued, if any: the gate then ends the port's
        // hold on placement, and the scheduler has this run by then.
        let _ = st
            .args
            .gate
            .cast(GateMsg::ComponentStarted(st.args.spec.name.clone()));
        first
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: ComponentMsg,
        st: &mut ComponentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ComponentMsg::Job(ev) => job_event(&myself, st, ev).await?,
            ComponentMsg::Answered { id } => {
                let row = current(st).await?;
                if row.status != ComponentStatus::AskUser || st.agent.is_none() {
                    tracing::debug!(%id, status = %row.status, "answer for a component that is not asking");
                    return Ok(());
                }
                tracing::info!(%id, component = %st.args.spec.name, "escape hatch answered; the agent goes on");
                return after_answer(&myself, st).await;
            }
            ComponentMsg::Diagnosis(Diagnosis::Progress {
                job_id,
                status,
                verdict,
                reason,
            }) => {
                if st.job_id.as_deref() == Some(job_id.as_str()) {
                    update(st, status, verdict, &reason, "").await?;
                }
            }
            ComponentMsg::Diagnosis(Diagnosis::Done(run)) => {
                if st.job_id.as_deref() == Some(run.report.job_id.as_str()) {
                    let note = run.note();
                    let RedRun {
                        report,
                        worker_id,
                        verdict,
                        ..
                    } = *run;
                    record_run(&myself, st, report, worker_id, verdict, &note).await?;
                }
            }
            ComponentMsg::AttemptDone(done) => attempt_done(&myself, st, *done).await?,
        }
        Ok(())
    }

    /// The only children are its attempts' actors: one that ended has sent
    /// its [`ComponentMsg::AttemptDone`]; one that failed fails the
    /// component, which the gate restarts from the store (the attempt, cut
    /// off, runs again).
    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        evt: ractor::SupervisionEvent,
        _st: &mut ComponentState,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            ractor::SupervisionEvent::ActorFailed(_, err) => {
                Err(format!("its agent attempt failed: {err}").into())
            }
            _ => Ok(()),
        }
    }
}

/// Progress of the component's run in flight, as the scheduler reports it.
async fn job_event(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    ev: JobEvent,
) -> Result<(), ActorProcessingErr> {
    let myself = myself.clone();
    match ev {
        JobEvent::Leased {
            job_id, worker_id, ..
        } => {
            // The scheduler recorded `running` with the lease; only
            // watchers (and the gate, if it waited for an environment)
            // need telling.
            if st.job_id.as_deref() == Some(job_id.as_str()) {
                tracing::debug!(%job_id, %worker_id, "job leased");
                environment_fixed(st)?;
                emit(st).await?;
            }
        }
        JobEvent::Started { job_id, worker_id } => {
            tracing::debug!(%job_id, %worker_id, "job process started");
        }
        JobEvent::Waiting {
            job_id,
            reason,
            environment,
        } => {
            if st.job_id.as_deref() != Some(job_id.as_str()) {
                return Ok(());
            }
            if environment {
                // Every worker that could take the run failed its
                // environment: the component waits for a fixed one, and
                // the port pauses once nothing else runs.
                let (family, name) = (&st.args.family, &st.args.spec.name);
                st.args.store.set_waiting_env(family, name, &reason).await?;
                if !st.waiting_env {
                    st.waiting_env = true;
                    st.args
                        .gate
                        .cast(GateMsg::ComponentWaitsEnv(name.clone()))?;
                }
            } else {
                environment_fixed(st)?;
                // Only while still queued: a lease recorded meanwhile wins.
                st.args
                    .store
                    .set_queued_reason(&st.args.family, &st.args.spec.name, &reason)
                    .await?;
            }
            emit(st).await?;
        }
        JobEvent::Unplaceable { job_id, reason } => {
            if st.job_id.as_deref() != Some(job_id.as_str()) {
                return Ok(());
            }
            // Never started: no run, no verdict of the code, no agent.
            st.args.store.unplace_job(&job_id).await?;
            st.job_id = None;
            let reason = format!("unplaced: {reason}");
            block(st, RecordedVerdict::Unplaced, &reason, "").await?;
        }
        JobEvent::WorkerLost {
            job_id,
            worker_id,
            give_up,
        } => {
            if st.job_id.as_deref() != Some(job_id.as_str()) {
                return Ok(());
            }
            if give_up {
                let reason = format!("infra_error: worker {worker_id} lost on every retry");
                block(st, RecordedVerdict::InfraError, &reason, &worker_id).await?;
            } else {
                // The scheduler recorded the requeue; only watchers
                // need telling.
                emit(st).await?;
            }
        }
        JobEvent::Finished {
            report,
            worker_id,
            shared,
        } => {
            run_finished(&myself, st, report, worker_id, shared).await?;
        }
        JobEvent::NotAdopted { job_id, reason } => {
            if st.job_id.as_deref() == Some(job_id.as_str()) {
                run_again(&myself, st, &job_id, &reason).await?;
            }
        }
    }
    Ok(())
}

/// The component's run ended: its verdict is classified, once; a run that
/// ran out of GPU memory while it `shared` its GPU runs again alone; a red
/// run goes through its diagnosers first (it comes back as
/// [`ComponentMsg::Diagnosis`]), any other is recorded now.
async fn run_finished(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    report: JobReport,
    worker_id: String,
    shared: Option<SharedGpu>,
) -> Result<(), ActorProcessingErr> {
    if st.job_id.as_deref() != Some(report.job_id.as_str()) {
        return Ok(());
    }
    let v = red_run::classify(&st.args.repo, &st.args.spec, &report);
    if let Some(oom) = shared.and_then(|_| crate::run_verdict::out_of_memory(&report)) {
        let run_no = run_no_of(st, &report.job_id).await?;
        let estimate = st.gpu.estimate(&st.args.spec.placement);
        if let Some(why) = shared_oom::under_sharing(&v, shared, Some(oom), run_no, estimate) {
            return rerun_alone(myself, st, &report, &worker_id, why).await;
        }
    }
    match red_run::decide(&v, &st.args.spec, &st.args.diagnosers) {
        Decision::Environment(cause) => {
            environment_failure(myself, st, &report, &worker_id, &cause).await
        }
        Decision::Diagnose(route) => {
            red_run::hand_on(Box::new(RedRun {
                spec: st.args.spec.clone(),
                report,
                worker_id,
                verdict: v,
                component: myself.get_derived(),
                span: st.span.clone(),
                route,
                trace_summary: String::new(),
                variant_note: String::new(),
            }));
            Ok(())
        }
        Decision::Record => record_run(myself, st, report, worker_id, v, "").await,
    }
}

/// Records a classified run (`note`: its diagnosers' notes, for a blocked
/// reason) and goes on: another run, an agent turn, or the end.
async fn record_run(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    report: JobReport,
    worker_id: String,
    v: Verdict,
    note: &str,
) -> Result<(), ActorProcessingErr> {
    let mut result = red_run::job_result((&v).into(), v.reason(), &report);
    if let Some(note) = st.gpu.note(&report.job_id) {
        result.reason = format!("{}; {note}", result.reason);
    }
    // What the verdict leads to is decided first, so that the verdict and
    // the component's next state are one commit: a crash between them
    // would test the same commit again.
    let plan = plan_after_run(st, &v, &result, note).await?;
    let attempt_gpu_ms = st
        .agent
        .is_some()
        .then(|| report.duration_ms * u64::from(st.args.spec.gpus));
    // The attempt this run judged changed the judge: a person decides
    // whether to keep that change before the component goes on.
    if !matches!(plan.next, Next::Retry)
        && let Some(escape) = judge::question(st, &report.job_id, result.verdict).await?
    {
        return judge::ask(
            st,
            &report,
            &worker_id,
            &v,
            &result,
            &escape,
            attempt_gpu_ms,
        )
        .await;
    }
    let next = ComponentNext {
        status: plan.status,
        verdict: plan.verdict,
        reason: &plan.reason,
        worker_id: &worker_id,
    };
    if let Err(why) = st.args.fvd.check() {
        tracing::warn!(job = %report.job_id, %why, "the verdict is not recorded: the port stops");
        return Ok(());
    }
    if !st
        .args
        .store
        .record_verdict(
            &report.job_id,
            report.lease_epoch,
            &result,
            next,
            attempt_gpu_ms,
        )
        .await?
    {
        tracing::warn!(job = %report.job_id, "result for a job no longer running under this lease was rejected");
        return Ok(());
    }
    fvd_store::chaos::crash_point("verdict-committed");
    note_verdict(st, &report, &v, &result).await?;
    match plan.next {
        Next::Retry => {
            st.infra_verdicts += 1;
            emit(st).await?;
            enqueue(myself, st).await
        }
        Next::Confirm => {
            emit(st).await?;
            enqueue(myself, st).await
        }
        Next::Agent { from, kind } => {
            agent_attempt(myself, st, &report.job_id, &from, &worker_id, kind).await
        }
        Next::End => {
            emit(st).await?;
            announce_final(st, plan.status, plan.verdict, &plan.reason).await
        }
    }
}

/// The spans, metrics and logs of a recorded verdict.
async fn note_verdict(
    st: &mut ComponentState,
    report: &JobReport,
    v: &Verdict,
    result: &JobResult,
) -> Result<(), ActorProcessingErr> {
    st.job_id = None;
    let attempt = std::mem::replace(&mut st.attempt, Span::none());
    attempt.record("fvd.verdict", result.verdict.as_str());
    attempt.record("fvd.reason", result.reason.as_str());
    if v.is_pass() {
        spans::succeeded(&attempt);
    } else {
        spans::failed(&attempt, &classed(result.verdict, &result.reason));
    }
    metrics::verdict(&st.args.family, &st.args.spec.name, result.verdict.as_str());
    if let Some(prev) = st.last_verdict.replace(result.verdict)
        && prev != result.verdict
    {
        let run = current(st).await?.runs;
        spans::verdict_changed(&st.span, prev.as_str(), result.verdict.as_str(), run);
    }
    drop(attempt);
    if !report.survivors.is_empty() {
        tracing::error!(job = %report.job_id, survivors = ?report.survivors, "processes of the job outlived it");
    }
    Ok(())
}

/// What a recorded verdict leads to, and the component state it is
/// recorded with.
struct Plan {
    next: Next,
    status: ComponentStatus,
    verdict: RecordedVerdict,
    reason: String,
}

enum Next {
    /// An infrastructure error: the run goes to another slot.
    Retry,
    /// A pass that has not held `confirm_runs` times in a row: one more
    /// run.
    Confirm,
    /// An agent turn starting from `from` (the red run, or the pass the
    /// cleanup gate refused).
    Agent { from: JobResult, kind: AttemptKind },
    /// The component ends with its status.
    End,
}

/// Plans what a verdict leads to ([`red_run::after_verdict`]; reads only):
/// a retry after an infrastructure error, an agent turn after a red run or
/// a refused cleanup, a confirming run after a pass, or the component's
/// end, blocked with `note` (its diagnosers' notes) before the reason.
async fn plan_after_run(
    st: &ComponentState,
    v: &Verdict,
    result: &JobResult,
    note: &str,
) -> Result<Plan, ActorProcessingErr> {
    let plan = |next, status, reason: String| Plan {
        next,
        status,
        verdict: result.verdict,
        reason,
    };
    match red_run::after_verdict(v, st.infra_verdicts, st.agent.is_some()) {
        AfterVerdict::Retry => Ok(plan(
            Next::Retry,
            ComponentStatus::Queued,
            result.reason.clone(),
        )),
        AfterVerdict::Agent => agent_plan(st, result.clone(), AttemptKind::Fix).await,
        AfterVerdict::Pass => {
            // A pass counts once it held `confirm_runs` times in a row on
            // the same code (this run included): one more run otherwise.
            let streak = passes_in_a_row(st).await? + 1;
            let need = st.args.spec.confirm_runs;
            if streak < need {
                let why = format!("passed {streak} of {need} runs in a row; confirming");
                return Ok(plan(Next::Confirm, ComponentStatus::Confirming, why));
            }
            if let Some(findings) = cleanup_findings(st).await? {
                let refused = JobResult {
                    verdict: RecordedVerdict::CleanupRefused,
                    reason: format!("cleanup gate: {}", findings.join("; ")),
                    ..result.clone()
                };
                return agent_plan(st, refused, AttemptKind::Cleanup).await;
            }
            // A pass that rests on a judge change says whose approval.
            let approved = judge::approved_note(st).await?;
            Ok(plan(
                Next::End,
                ComponentStatus::NonSkipPass,
                format!("{}{approved}", result.reason),
            ))
        }
        AfterVerdict::Block => Ok(plan(
            Next::End,
            ComponentStatus::Blocked,
            classed(result.verdict, &format!("{note}{}", result.reason)),
        )),
    }
}

/// A blocked reason that names its verdict class once: `debug_red: …`, but
/// `error:collection: …` as the reason of an error already reads.
fn classed(verdict: RecordedVerdict, reason: &str) -> String {
    if reason.starts_with(&format!("{verdict}:")) {
        reason.to_string()
    } else {
        format!("{verdict}: {reason}")
    }
}

/// A run that could not test the code because of its worker's environment:
/// the run is recorded as such (never a verdict, never counted), the worker
/// is excluded for this component, and the run is queued again; the
/// scheduler places it on another worker or says it waits for an
/// environment.
async fn environment_failure(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    report: &JobReport,
    worker_id: &str,
    cause: &str,
) -> Result<(), ActorProcessingErr> {
    let result = red_run::job_result(RecordedVerdict::Environment, cause.to_string(), report);
    if !st
        .args
        .store
        .finish_job_environment(&report.job_id, report.lease_epoch, &result)
        .await?
    {
        tracing::warn!(job = %report.job_id, "result for a job no longer running under this lease was rejected");
        return Ok(());
    }
    tracing::info!(family = %st.args.family, component = %st.args.spec.name, worker = %worker_id, %cause, "environment failure: the run is not counted and goes to another worker, or waits for a fixed one");
    let attempt = std::mem::replace(&mut st.attempt, Span::none());
    attempt.record("fvd.verdict", result.verdict.as_str());
    attempt.record("fvd.reason", cause);
    spans::environment_failure(&attempt, worker_id, cause);
    drop(attempt);
    let old_job = st.job_id.take();
    st.exclude.insert(worker_id.to_string(), cause.to_string());
    enqueue(myself, st).await?;
    // An agent attempt whose test run hit the environment is tested by the
    // new run instead.
    if let (Some(old), Some(new)) = (old_job, st.job_id.clone()) {
        rebind_attempt(st, &old, &new).await?;
    }
    Ok(())
}

/// A run that ran out of GPU memory while it shared its GPU
/// ([`shared_oom`]): recorded as `shared_oom` (no verdict, not counted, its
/// reason says why), and queued again to take a GPU alone; the component's
/// later runs ask for more memory.
async fn rerun_alone(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    report: &JobReport,
    worker_id: &str,
    why: shared_oom::OomUnderSharing,
) -> Result<(), ActorProcessingErr> {
    let reason = why.to_string();
    let mut result = red_run::job_result(RecordedVerdict::InfraError, reason.clone(), report);
    // Its record says what later runs ask for, so a restart keeps it.
    result.next_gpu_mib = Some(why.next_mib);
    if !st
        .args
        .store
        .finish_job_shared_oom(&report.job_id, report.lease_epoch, &result)
        .await?
    {
        tracing::warn!(job = %report.job_id, "result for a job no longer running under this lease was rejected");
        return Ok(());
    }
    tracing::info!(family = %st.args.family, component = %st.args.spec.name, worker = %worker_id, %reason, "out of memory under sharing: the run is not counted and runs again alone");
    let attempt = std::mem::replace(&mut st.attempt, Span::none());
    attempt.record("fvd.verdict", result.verdict.as_str());
    attempt.record("fvd.reason", reason.as_str());
    spans::failed(&attempt, &reason);
    drop(attempt);
    let old_job = st.job_id.take();
    st.gpu.ran_out(why);
    enqueue(myself, st).await?;
    let (family, name) = (&st.args.family, &st.args.spec.name);
    st.args
        .store
        .set_queued_reason(family, name, &reason)
        .await?;
    emit(st).await?;
    // An agent attempt whose test run ran out of memory is tested by the
    // alone run instead.
    if let (Some(old), Some(new)) = (old_job, st.job_id.clone()) {
        rebind_attempt(st, &old, &new).await?;
    }
    Ok(())
}

/// The run number of the component's run `job_id` (0 when the store has
/// no such run).
async fn run_no_of(st: &ComponentState, job_id: &str) -> Result<u32, ActorProcessingErr> {
    let jobs = st
        .args
        .store
        .jobs_of(&st.args.family, &st.args.spec.name)
        .await?;
    Ok(jobs
        .iter()
        .find(|j| j.job_id == job_id)
        .map_or(0, |j| j.run_no))
}

/// The component's run was placed again after it waited for an
/// environment: the gate learns the port runs again.
fn environment_fixed(st: &mut ComponentState) -> Result<(), ActorProcessingErr> {
    if std::mem::take(&mut st.waiting_env) {
        st.args
            .gate
            .cast(GateMsg::EnvironmentFixed(st.args.spec.name.clone()))?;
    }
    Ok(())
}

async fn current(st: &ComponentState) -> Result<ComponentRow, ActorProcessingErr> {
    let rows = st.args.store.components(&st.args.family).await?;
    rows.into_iter()
        .find(|r| r.name == st.args.spec.name)
        .ok_or_else(|| format!("component {} has no row in the store", st.args.spec.name).into())
}

/// Queues the component's next run.
async fn enqueue(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
) -> Result<(), ActorProcessingErr> {
    let job = job_record(st).await?;
    let record = st.args.store.queue_job(&job).await?;
    queued(myself, st, record).await
}

/// The component's first step once started: its verdict already recorded,
/// its agent loop resumed, its run in flight adopted, or its run queued.
async fn first_step(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
) -> Result<(), ActorProcessingErr> {
    let row = current(st).await?;
    if let Some(r) = st.args.reopen.take() {
        return reopened(myself, st, r).await;
    }
    if row.is_final() {
        // Recorded verdicts are not rerun on resume.
        st.span.record("fvd.status", row.status.as_str());
        st.span.record("fvd.verdict", row.verdict.as_str());
        final_status(&st.span, row.status, &row.reason);
        st.span = Span::none();
        st.args.gate.cast(GateMsg::ComponentFinal(row))?;
        return Ok(());
    }
    if st.args.spec.agent.is_some() {
        let a = &st.args;
        match AgentLoop::prepare(&a.store, &a.spec, &a.family, &a.repo, &a.code).await {
            Ok(l) => st.agent = Some(l),
            Err(e) => {
                let reason = format!("error: agent loop cannot start: {e}");
                return block(st, RecordedVerdict::Error(None), &reason, "").await;
            }
        }
        return resume(myself, st, &row).await;
    }
    match in_flight(st).await? {
        Some(job) => adopt(myself, st, job).await,
        None => enqueue(myself, st).await,
    }
}

/// Sent back by the pipeline: the component's agent starts from the
/// pipeline's red run (its own parity test passes). A component without an
/// agent is never reopened.
async fn reopened(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    r: Reopen,
) -> Result<(), ActorProcessingErr> {
    if st.args.spec.agent.is_none() {
        return Err(format!("component {} has no agent to reopen", st.args.spec.name).into());
    }
    {
        let a = &st.args;
        match AgentLoop::prepare(&a.store, &a.spec, &a.family, &a.repo, &a.code).await {
            Ok(l) => st.agent = Some(l),
            Err(e) => {
                let reason = format!("error: agent loop cannot start: {e}");
                return block(st, RecordedVerdict::Error(None), &reason, "").await;
            }
        }
    }
    st.span.record("fvd.reopened", true);
    agent_attempt(myself, st, &r.job_id, &r.result, "", AttemptKind::Fix).await
}

/// The component's next run, before it is queued: an agent component's
/// runs test its worktree at the attempt's commit, not the checkout at the
/// port's.
async fn job_record(st: &ComponentState) -> Result<JobRecord, ActorProcessingErr> {
    Ok(judged_job_record(st).await?.0)
}

/// [`job_record`], and what the worktree's commit changed of the judge: an
/// agent component's run then tests a commit of fvd's with the port's own
/// judge (issue #39), never the attempt's; the port's own is the judge of
/// its commit, or the latest judge change a person approved.
async fn judged_job_record(
    st: &ComponentState,
) -> Result<(JobRecord, fvd_workspace::judge::Pinned), ActorProcessingErr> {
    let spec = &st.args.spec;
    let Some(l) = &st.agent else {
        let commit = st.args.code.commit.clone();
        let unchanged = fvd_workspace::judge::Pinned {
            commit: commit.clone(),
            changed: Vec::new(),
            diff: String::new(),
        };
        return Ok((job_at(st, commit), unchanged));
    };
    let head = worktree::head(&l.worktree.path)
        .await
        .map_err(|e| e.to_string())?;
    let base = judge::base(st, &l.worktree.path, &head).await?;
    let pinned = fvd_workspace::judge::pin(&l.worktree.path, &base, &head, &l.judge)
        .await
        .map_err(|e| format!("cannot pin the judge of {}: {e}", spec.name))?;
    if !pinned.changed.is_empty() {
        tracing::warn!(component = %spec.name, head = %head, tested = %pinned.commit, changed = ?pinned.changed, "the worktree changed the component's judge: its run tests the port's own");
    }
    Ok((job_at(st, pinned.commit.clone()), pinned))
}

/// A run of the component's parity test at `commit`: in its worktree for
/// an agent component, in the checkout otherwise.
fn job_at(st: &ComponentState, commit: String) -> JobRecord {
    let spec = &st.args.spec;
    let (cwd, code_prefix) = match &st.agent {
        Some(l) => (
            l.worktree.workdir().to_string_lossy().into_owned(),
            l.worktree.prefix.clone(),
        ),
        None => (st.args.repo.clone(), st.args.code.prefix.clone()),
    };
    JobRecord {
        family: st.args.family.clone(),
        component: spec.name.clone(),
        argv: spec.argv(),
        cwd,
        commit,
        code_prefix,
        gpus_needed: spec.gpus,
        timeout_ms: spec.timeout_ms(),
        ..JobRecord::default()
    }
}

/// A run recorded as queued goes to the scheduler, under its own
/// `attempt` span.
async fn queued(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    record: JobRecord,
) -> Result<(), ActorProcessingErr> {
    let job = scheduled(myself, st, record).await?;
    st.args.scheduler.cast(SchedulerMsg::Enqueue(job))?;
    Ok(())
}

/// The component's run in flight when the last process of this port
/// stopped (its row still `running`): the scheduler adopts it if its worker
/// still runs it (`Leased` follows, then its result as for any run), or
/// says `NotAdopted` and it runs again.
async fn adopt(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    record: JobRecord,
) -> Result<(), ActorProcessingErr> {
    tracing::info!(job = %record.job_id, "asking to adopt the run that was in flight");
    let job = scheduled(myself, st, record).await?;
    st.args.scheduler.cast(SchedulerMsg::Adopt(job))?;
    Ok(())
}

/// The component's run in flight, if its latest run is `running`.
async fn in_flight(st: &ComponentState) -> Result<Option<JobRecord>, ActorProcessingErr> {
    let jobs = st
        .args
        .store
        .jobs_of(&st.args.family, &st.args.spec.name)
        .await?;
    Ok(jobs
        .into_iter()
        .last()
        .filter(|j| j.state == JobState::Running))
}

/// A run no worker runs any more (see [`adopt`]): abandoned, and a new one
/// queued; an agent attempt it was to test is tested by the new one.
async fn run_again(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    job_id: &str,
    reason: &str,
) -> Result<(), ActorProcessingErr> {
    tracing::info!(job = %job_id, %reason, "the run in flight before the restart runs on no worker; it runs again");
    st.args.store.abandon_job(job_id).await?;
    st.job_id = None;
    enqueue(myself, st).await?;
    if let Some(new) = st.job_id.clone() {
        rebind_attempt(st, job_id, &new).await?;
    }
    Ok(())
}

/// The agent attempt that run `old` was to test (its verdict not in yet)
/// is tested by run `new` instead.
async fn rebind_attempt(
    st: &ComponentState,
    old: &str,
    new: &str,
) -> Result<(), ActorProcessingErr> {
    if st.agent.is_none() {
        return Ok(());
    }
    let (family, name) = (&st.args.family, &st.args.spec.name);
    if let Some(a) = st
        .args
        .store
        .attempts(family, name)
        .await?
        .into_iter()
        .rev()
        .find(|a| a.job_after == old && a.verdict_after.is_none())
    {
        st.args
            .store
            .set_attempt_job(family, name, a.attempt, new)
            .await?;
    }
    Ok(())
}

/// The scheduler's view of a recorded run, under a new `attempt` span.
async fn scheduled(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    record: JobRecord,
) -> Result<Box<QueuedJob>, ActorProcessingErr> {
    let spec = &st.args.spec;
    st.job_id = Some(record.job_id.clone());
    st.attempt = tracing::info_span!(
        parent: &st.span,
        "attempt",
        "fvd.family" = %st.args.family,
        "fvd.component" = %spec.name,
        "fvd.attempt" = i64::from(record.run_no),
        "fvd.job_id" = %record.job_id,
        "fvd.verdict" = Empty,
        "fvd.reason" = Empty,
    );
    metrics::attempt(&st.args.family, &spec.name);
    emit(st).await?;
    let placement = st
        .gpu
        .placement(&st.args.spec.placement, &record.gpu_history, &record.job_id);
    let spec = &st.args.spec;
    let env = crate::run_env::run_env(
        spec.set_env.clone(),
        &st.args.family,
        &spec.name,
        record.run_no,
    );
    Ok(Box::new(QueuedJob {
        record: record.into(),
        env,
        secret_env: spec.env.clone(),
        notify: myself.get_derived(),
        placement,
        span: st.attempt.clone(),
        collect_env: None,
        compare: None,
        exclude: st.exclude.clone(),
        preflight: spec.preflight.clone(),
        // The example is a program, not a pytest run a zygote could fork.
        warm: match spec.stage {
            fvd_spec::Stage::Example => None,
            _ => spec.runner.warm_preload(),
        },
        agent: None,
        fvd_writes: st.args.code.fvd_writes.clone(),
    }))
}

async fn update(
    st: &ComponentState,
    status: ComponentStatus,
    verdict: RecordedVerdict,
    reason: &str,
    worker_id: &str,
) -> Result<(), ActorProcessingErr> {
    st.args
        .store
        .set_component(
            &st.args.family,
            &st.args.spec.name,
            status,
            verdict,
            reason,
            worker_id,
        )
        .await?;
    emit(st).await
}

async fn finish(
    st: &mut ComponentState,
    status: ComponentStatus,
    verdict: RecordedVerdict,
    reason: &str,
    worker_id: &str,
) -> Result<(), ActorProcessingErr> {
    update(st, status, verdict, reason, worker_id).await?;
    announce_final(st, status, verdict, reason).await
}

/// The component is final (recorded): its spans end with its status, and
/// the gate is told.
async fn announce_final(
    st: &mut ComponentState,
    status: ComponentStatus,
    verdict: RecordedVerdict,
    reason: &str,
) -> Result<(), ActorProcessingErr> {
    st.span.record("fvd.status", status.as_str());
    st.span.record("fvd.verdict", verdict.as_str());
    st.span.record("fvd.reason", reason);
    final_status(&st.span, status, reason);
    // The component is final: its span ends (and is exported) now.
    st.attempt = Span::none();
    st.span = Span::none();
    let row = current(st).await?;
    st.args.gate.cast(GateMsg::ComponentFinal(row))?;
    Ok(())
}

/// Ends the component `blocked`: it ended without a pass, and `verdict`
/// and `reason` say why.
async fn block(
    st: &mut ComponentState,
    verdict: RecordedVerdict,
    reason: &str,
    worker_id: &str,
) -> Result<(), ActorProcessingErr> {
    finish(st, ComponentStatus::Blocked, verdict, reason, worker_id).await
}

/// A final component's span status: OK for a pass, ERROR with the blocked
/// reason otherwise.
fn final_status(span: &Span, status: ComponentStatus, reason: &str) {
    if status == ComponentStatus::NonSkipPass {
        spans::succeeded(span);
    } else {
        spans::failed(span, reason);
    }
}

async fn emit(st: &ComponentState) -> Result<(), ActorProcessingErr> {
    let row = current(st).await?;
    // Nobody watching is fine: the store has it.
    let _ = st.args.events.send(PortEvent::Component {
        family: st.args.family.clone(),
        component: row,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_names_its_class_once() {
        assert_eq!(
            classed(RecordedVerdict::Error(None), "error:collection: t.py: boom"),
            "error:collection: t.py: boom"
        );
        assert_eq!(
            classed(RecordedVerdict::DebugRed, "t::a: max diff 0.3"),
            "debug_red: t::a: max diff 0.3"
        );
        assert_eq!(
            classed(RecordedVerdict::Timeout, "killed at the timeout"),
            "timeout: killed at the timeout"
        );
    }
}
