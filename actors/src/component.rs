//! `ComponentSubagentActor`: one per component of a port. It asks the
//! scheduler for a run of the component's parity test, has the result
//! classified once ([`crate::red_run`]: the verdict from its JUnit report,
//! and whether a red run is traced or gets its variants first) and records
//! it. It alone writes the component's row: the diagnosers that
//! diagnose a red run tell it what they do ([`ComponentMsg::Diagnosis`]).
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
use crate::scheduler::{JobEvent, QueuedJob, SchedulerMsg};
use fvd_spec::ComponentSpec;
use fvd_store::model::{
    ComponentRow, ComponentStatus, JobRecord, JobReport, JobResult, JobState, PortEvent,
    RecordedVerdict,
};
use fvd_store::states::{AttemptKind, AttemptState, EscapeAbout, EscapeStatus};
use fvd_store::{AttemptNext, AttemptRecorded, AttemptRow, ComponentNext, EscapeRow, Store};
use fvd_workspace::agent::{self, AgentsOn};
use fvd_workspace::worktree;

pub use crate::red_run::MAX_INFRA_VERDICTS;

mod judge;

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
        JobEvent::Finished { report, worker_id } => {
            run_finished(&myself, st, report, worker_id).await?;
        }
        JobEvent::NotAdopted { job_id, reason } => {
            if st.job_id.as_deref() == Some(job_id.as_str()) {
                run_again(&myself, st, &job_id, &reason).await?;
            }
        }
    }
    Ok(())
}

/// The component's run ended: its verdict is classified, once; a red run
/// goes through its diagnosers first (it comes back as
/// [`ComponentMsg::Diagnosis`]), any other is recorded now.
async fn run_finished(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    report: JobReport,
    worker_id: String,
) -> Result<(), ActorProcessingErr> {
    if st.job_id.as_deref() != Some(report.job_id.as_str()) {
        return Ok(());
    }
    let v = red_run::classify(&st.args.repo, &st.args.spec, &report);
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
    let result = red_run::job_result((&v).into(), v.reason(), &report);
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

/// An agent turn from `from`: `agent` with the turn's line, or the
/// component's end when a budget is spent.
async fn agent_plan(
    st: &ComponentState,
    from: JobResult,
    kind: AttemptKind,
) -> Result<Plan, ActorProcessingErr> {
    let plan = match turn_start(st, &from).await? {
        TurnStart::Blocked(reason) => Plan {
            next: Next::End,
            status: ComponentStatus::Blocked,
            verdict: from.verdict,
            reason,
        },
        TurnStart::Go { line, .. } => Plan {
            next: Next::Agent {
                from: from.clone(),
                kind,
            },
            status: ComponentStatus::Agent,
            verdict: from.verdict,
            reason: line,
        },
    };
    Ok(plan)
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
        placement: spec.placement.clone(),
        span: st.attempt.clone(),
        collect_env: None,
        compare: None,
        exclude: st.exclude.clone(),
        preflight: spec.preflight.clone(),
        warm: spec.runner.warm_preload(),
        agent: None,
        fvd_writes: st.args.code.fvd_writes.clone(),
    }))
}

/// Where a started agent component stands, from the store: an attempt cut
/// off by a crash runs again (its leftovers ended, its worktree reset); a
/// question waits for its answer or goes on with it; an attempt recorded
/// but not yet tested gets its run; otherwise the parity test runs.
async fn resume(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    row: &ComponentRow,
) -> Result<(), ActorProcessingErr> {
    let (family, name) = (st.args.family.clone(), st.args.spec.name.clone());
    let ledger = st.args.store.attempts(&family, &name).await?;
    if let Some(cut) = ledger.iter().find(|a| a.state == AttemptState::Running) {
        // On the fleet, its agent may still run on its worker: the try is
        // adopted, with the tokens its agent holds (issue #38), or, if no
        // worker runs it any more, tried again.
        let in_flight = match st.args.agents.on {
            AgentsOn::Fleet => st.args.store.fleet_try(&family, &name, cut.attempt).await?,
            AgentsOn::Host => None,
        };
        match &in_flight {
            Some(t) => {
                tracing::info!(attempt = cut.attempt, job = %t.job_id, "agent attempt was in flight on a worker; asking to adopt it");
            }
            None => {
                let killed = agent::kill_leftovers(&cut.cookie);
                tracing::warn!(attempt = cut.attempt, killed = ?killed, "agent attempt was cut off; running it again from its starting commit");
            }
        }
        let wt = agent_loop(st)?.worktree.path.clone();
        if let Err(e) = worktree::reset(&wt, &cut.head_before).await {
            let reason = format!(
                "error: attempt {} was cut off and its worktree cannot be reset: {e}",
                cut.attempt
            );
            return block(st, RecordedVerdict::Error(None), &reason, "").await;
        }
        let before = JobResult {
            verdict: cut.verdict_before,
            reason: cut.reason_before.clone(),
            output_tail: job_tail(st, &cut.job_before).await?,
            ..JobResult::default()
        };
        let (job, kind) = (cut.job_before.clone(), cut.kind);
        return agent_turn(myself, st, &job, &before, "", kind, in_flight).await;
    }
    // An attempt its model API's environment ended (a refused key, an API
    // that kept failing) runs again under its number, from the same run.
    if let Some(env) = ledger
        .last()
        .filter(|a| a.state == AttemptState::Environment)
    {
        let before = JobResult {
            verdict: env.verdict_before,
            reason: env.reason_before.clone(),
            output_tail: job_tail(st, &env.job_before).await?,
            ..JobResult::default()
        };
        let (job, kind) = (env.job_before.clone(), env.kind);
        return agent_attempt(myself, st, &job, &before, "", kind).await;
    }
    if row.status == ComponentStatus::AskUser {
        let answered = answered(st).await?;
        if answered.is_empty() {
            st.args.gate.cast(GateMsg::ComponentAsks(row.clone()))?;
            return Ok(());
        }
        return after_answer(myself, st).await;
    }
    let untested = ledger
        .last()
        .filter(|a| a.state == AttemptState::Recorded && a.verdict_after.is_none())
        .map(|a| a.attempt);
    if row.status == ComponentStatus::Agent && untested.is_none() {
        // Cut off after the verdict was recorded (with `agent` as its next
        // state) and before the attempt row was opened: the attempt starts
        // from that run, a red one, or a pass the cleanup gate refused.
        if let Some((job, last)) = last_result(st).await? {
            if last.verdict.is_pass()
                && let Some(findings) = cleanup_findings(st).await?
            {
                let refused = JobResult {
                    verdict: RecordedVerdict::CleanupRefused,
                    reason: format!("cleanup gate: {}", findings.join("; ")),
                    ..last
                };
                return agent_attempt(myself, st, &job, &refused, "", AttemptKind::Cleanup).await;
            }
            return agent_attempt(myself, st, &job, &last, "", AttemptKind::Fix).await;
        }
    }
    if let Some(job) = in_flight(st).await? {
        // The attempt's test run (or the red run) may still run on its
        // worker: adopted, or run again (its attempt rebound to the new
        // run) if not.
        return adopt(myself, st, job).await;
    }
    enqueue(myself, st).await?;
    // A recorded attempt whose run was lost with the process is tested by
    // this run.
    if let (Some(attempt), Some(job)) = (untested, st.job_id.clone()) {
        st.args
            .store
            .set_attempt_job(&family, &name, attempt, &job)
            .await?;
    }
    Ok(())
}

/// This component's escape hatches that `keep` selects, oldest first.
async fn escapes_where(
    st: &ComponentState,
    keep: impl Fn(&EscapeRow) -> bool,
) -> Result<Vec<EscapeRow>, ActorProcessingErr> {
    Ok(st
        .args
        .store
        .escapes(&st.args.family)
        .await?
        .into_iter()
        .filter(|e| e.component == st.args.spec.name && keep(e))
        .collect())
}

/// The answered, not yet given, escape hatches of this component.
async fn answered(st: &ComponentState) -> Result<Vec<EscapeRow>, ActorProcessingErr> {
    escapes_where(st, |e| e.status == EscapeStatus::Answered).await
}

/// The next attempt after a person answered: it starts from the red run the
/// question was asked about, and its packet carries the answer.
async fn after_answer(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
) -> Result<(), ActorProcessingErr> {
    // A judge question is acted on by fvd, not handed to the agent.
    if let Some(e) = answered(st)
        .await?
        .into_iter()
        .find(|e| e.about == EscapeAbout::Judge)
    {
        return judge::answered(myself, st, e).await;
    }
    match last_result(st).await? {
        Some((job, last)) => agent_attempt(myself, st, &job, &last, "", AttemptKind::Fix).await,
        None => enqueue(myself, st).await,
    }
}

/// The latest finished run of the component and its recorded result.
async fn last_result(
    st: &ComponentState,
) -> Result<Option<(String, JobResult)>, ActorProcessingErr> {
    let jobs = st
        .args
        .store
        .jobs_of(&st.args.family, &st.args.spec.name)
        .await?;
    Ok(jobs
        .into_iter()
        .rev()
        .find(|j| j.state == JobState::Finished)
        .map(|j| {
            (
                j.job_id.clone(),
                JobResult {
                    verdict: j.verdict,
                    reason: j.reason,
                    output_tail: j.output_tail,
                    ..JobResult::default()
                },
            )
        }))
}

async fn job_tail(st: &ComponentState, job_id: &str) -> Result<String, ActorProcessingErr> {
    Ok(st
        .args
        .store
        .job(job_id)
        .await?
        .map(|j| j.output_tail)
        .unwrap_or_default())
}

/// Passing runs in a row since the code last changed (the last recorded
/// attempt), latest first.
async fn passes_in_a_row(st: &ComponentState) -> Result<u32, ActorProcessingErr> {
    let (family, name) = (&st.args.family, &st.args.spec.name);
    let since = st
        .args
        .store
        .attempts(family, name)
        .await?
        .iter()
        .map(|a| a.finished_ms)
        .max()
        .unwrap_or(0);
    let jobs = st.args.store.jobs_of(family, name).await?;
    Ok(jobs
        .iter()
        .rev()
        .filter(|j| j.state == JobState::Finished)
        .take_while(|j| j.verdict.is_pass() && j.queued_ms >= since)
        .count() as u32)
}

/// The cleanup gate's findings for an agent component's worktree; `None`
/// when it is clean or the component has no agent.
async fn cleanup_findings(st: &ComponentState) -> Result<Option<Vec<String>>, ActorProcessingErr> {
    let (Some(lp), Some(a)) = (&st.agent, &st.args.spec.agent) else {
        return Ok(None);
    };
    let findings = match fvd_workspace::cleanup::check(&lp.worktree, &a.cleanup).await {
        Ok(f) => f,
        Err(e) => vec![format!("the worktree could not be checked: {e}")],
    };
    Ok((!findings.is_empty()).then_some(findings))
}

/// One turn of the agent loop after run `job_id` (red, or a pass the
/// cleanup gate refused): spend an attempt (agent, commit, ledger row) and
/// queue the next run; or block when a budget is spent or the agent returns
/// a blocker; or park in `ask_user` when the agent asks a person.
async fn agent_attempt(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    job_id: &str,
    result: &JobResult,
    worker_id: &str,
    kind: AttemptKind,
) -> Result<(), ActorProcessingErr> {
    agent_turn(myself, st, job_id, result, worker_id, kind, None).await
}

/// [`agent_attempt`], or (`adopting`) the try of the attempt an earlier
/// process of the orchestrator started on a worker: asked for instead of
/// started, and started again from its base if no worker runs it now.
/// The attempt runs in its own actor ([`crate::attempt`]), linked to this
/// one; its end comes back as [`ComponentMsg::AttemptDone`].
async fn agent_turn(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    job_id: &str,
    result: &JobResult,
    worker_id: &str,
    kind: AttemptKind,
    adopting: Option<fvd_store::FleetTry>,
) -> Result<(), ActorProcessingErr> {
    let (attempt, line, used, recorded) = match turn_start(st, result).await? {
        TurnStart::Blocked(reason) => return block(st, result.verdict, &reason, worker_id).await,
        TurnStart::Go {
            attempt,
            line,
            used,
            recorded,
        } => (attempt, line, used, recorded),
    };
    let lp = agent_loop(st)?.clone();
    update(st, ComponentStatus::Agent, result.verdict, &line, worker_id).await?;
    let turn = AttemptTurn {
        attempt,
        job_id: job_id.to_string(),
        result: result.clone(),
        worker_id: worker_id.to_string(),
        kind,
        adopting,
        used,
        recorded,
        answers: answered(st).await?,
        judge_decisions: judge::decided_since_reset(st).await?,
    };
    let cx = AttemptCtx {
        family: st.args.family.clone(),
        spec: st.args.spec.clone(),
        lp,
        store: st.args.store.clone(),
        scheduler: st.args.scheduler.clone(),
        agents: st.args.agents.clone(),
        repo: st.args.repo.clone(),
        code: st.args.code.clone(),
        span: st.span.clone(),
    };
    let args = AttemptArgs {
        cx,
        turn,
        reply: myself.get_derived(),
    };
    Actor::spawn_linked(None, AttemptActor, args, myself.get_cell()).await?;
    Ok(())
}

/// The component's agent loop: only an agent component turns to it, and
/// it has one from its first step on.
fn agent_loop(st: &ComponentState) -> Result<&AgentLoop, ActorProcessingErr> {
    st.agent
        .as_ref()
        .ok_or_else(|| format!("component {} has no agent loop", st.args.spec.name).into())
}

/// The attempt's actor ended: what its agent left is recorded with what it
/// leads to, or the attempt starts again (a try no worker runs), or the
/// component waits for its environment, or blocks.
async fn attempt_done(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    done: AttemptDone,
) -> Result<(), ActorProcessingErr> {
    let AttemptDone { turn, end } = done;
    let result = &turn.result;
    match end {
        AttemptEnd::Ran(done) => after_agent(myself, st, &turn, *done).await,
        AttemptEnd::NotAdopted(why) => {
            tracing::warn!(attempt = turn.attempt, %why, "the agent attempt in flight before the restart runs on no worker; it runs again from its base");
            agent_turn(
                myself,
                st,
                &turn.job_id,
                result,
                &turn.worker_id,
                turn.kind,
                None,
            )
            .await
        }
        AttemptEnd::Uncommitted(why) => {
            let reason = format!("{} ({why})", classed(result.verdict, &result.reason));
            block(st, result.verdict, &reason, &turn.worker_id).await
        }
        AttemptEnd::Environment { why, reset } => agent_environment(st, &turn, &why, reset).await,
    }
}

/// The attempt's model API failed for a reason outside the agent and the
/// code (the attempt is closed as `environment`, its worktree reset): the
/// component waits; the port pauses (exit 4) once nothing else runs.
async fn agent_environment(
    st: &mut ComponentState,
    turn: &AttemptTurn,
    why: &str,
    reset: Result<(), String>,
) -> Result<(), ActorProcessingErr> {
    let reason = format!("environment: agent attempt {}: {why}", turn.attempt);
    if let Err(e) = reset {
        let reason = format!("{reason}; its worktree cannot be reset: {e}");
        return block(st, RecordedVerdict::Error(None), &reason, "").await;
    }
    update(
        st,
        ComponentStatus::Environment,
        turn.result.verdict,
        &reason,
        "",
    )
    .await?;
    spans::environment_failure(&st.span, "", &reason);
    if !st.waiting_env {
        st.waiting_env = true;
        st.args
            .gate
            .cast(GateMsg::ComponentWaitsEnv(st.args.spec.name.clone()))?;
    }
    Ok(())
}

/// Where an agent turn stands before it starts: its budget is spent or its
/// agent may not run here (the blocked reason), or it runs as `attempt` (an
/// attempt cut off by a crash runs again under its own number and is not
/// charged twice).
enum TurnStart {
    Blocked(String),
    Go {
        attempt: u32,
        /// The component's reason while the agent runs.
        line: String,
        used: Spent,
        /// The recorded attempts, oldest first.
        recorded: Vec<AttemptRow>,
    },
}

async fn turn_start(
    st: &ComponentState,
    result: &JobResult,
) -> Result<TurnStart, ActorProcessingErr> {
    let (family, spec) = (&st.args.family, &st.args.spec);
    let a = &agent_loop(st)?.agent;
    let ledger = st.args.store.attempts(family, &spec.name).await?;
    let recorded: Vec<AttemptRow> = ledger
        .iter()
        .filter(|r| r.state == AttemptState::Recorded)
        .cloned()
        .collect();
    let rerun = ledger
        .iter()
        .find(|r| r.state == AttemptState::Running)
        .map(|r| r.attempt);
    let used = crate::attempt::budget::spent(&st.args.store, family, &spec.name, &recorded).await?;
    if rerun.is_none()
        && let Some(why) = budget_spent(a, &used)
    {
        return Ok(TurnStart::Blocked(format!(
            "{} ({why})",
            classed(result.verdict, &result.reason)
        )));
    }
    // A port resumed on an orchestrator that does not run its agent's
    // command (submit refuses such a spec up front).
    if let Err(why) = st.args.agents.admits(a) {
        return Ok(TurnStart::Blocked(format!(
            "{} ({why})",
            classed(result.verdict, &result.reason)
        )));
    }
    let attempt = rerun.unwrap_or(recorded.len() as u32 + 1);
    let line = format!(
        "agent attempt {attempt} ({} of {} in the budget) after {}",
        used.attempts + 1,
        a.max_attempts,
        result.verdict
    );
    Ok(TurnStart::Go {
        attempt,
        line,
        used,
        recorded,
    })
}

/// Records the attempt together with what it leads to, in one commit:
/// blocked (the agent could not start, asked for a conversion retry, or
/// returned a blocker), parked on its question (raised under a fresh
/// `E###` id), or the parity test queued on its commit. A crash after the
/// ledger row and before the question or the run cannot happen: both or
/// neither are in the store.
async fn after_agent(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    turn: &AttemptTurn,
    done: AgentDone,
) -> Result<(), ActorProcessingErr> {
    let (attempt, result) = (turn.attempt, &turn.result);
    let worker_id = turn.worker_id.as_str();
    let answered = !turn.answers.is_empty();
    let mut row = done.row(&st.args.family, &st.args.spec.name, attempt);
    let AgentDone {
        exit,
        handoff,
        refused,
        ..
    } = done;
    let family = st.args.family.clone();
    let blocked = |why: String| format!("{} ({why})", classed(result.verdict, &result.reason));
    let mut conversion = None;
    let end_reason = if let Some(why) = &refused {
        Some(blocked(format!("{why}, after agent attempt {attempt}")))
    } else if let Some(e) = &exit.spawn_error {
        Some(blocked(format!("{e}, after agent attempt {attempt}")))
    } else if handoff.escape().is_some() {
        None
    } else if let Some(request) = handoff.conversion_retry() {
        conversion = Some(request.clone());
        Some(blocked(format!(
            "conversion_retry_request after agent attempt {attempt}: {request}"
        )))
    } else {
        handoff
            .stop_reason()
            .map(|stop| blocked(format!("{stop}, after agent attempt {attempt}")))
    };
    let escape;
    let floor;
    let job;
    let then = if let Some(reason) = &end_reason {
        AttemptNext::End(ComponentNext {
            status: ComponentStatus::Blocked,
            verdict: result.verdict,
            reason,
            worker_id,
        })
    } else if let Some(hatch) = handoff.escape() {
        floor = crate::port_status::escape_floor(&st.args.store, &family)
            .await
            .unwrap_or(0);
        escape = EscapeRow {
            family: family.clone(),
            component: st.args.spec.name.clone(),
            attempt,
            phase: fvd_contracts::phase::Phase::ComponentParityDebug.id(),
            decision_type: hatch.decision_type.as_str().to_string(),
            question: hatch.question.to_string(),
            recommended: hatch.recommended_option.to_string(),
            options: hatch.options.iter().map(|o| o.to_string()).collect(),
            safe_default: hatch.safe_default.to_string(),
            ..EscapeRow::default()
        };
        AttemptNext::Ask {
            escape: &escape,
            floor,
            verdict: result.verdict,
            worker_id,
        }
    } else {
        let (record, pinned) = judged_job_record(st).await?;
        row.judge_changed = pinned.changed;
        row.judge_diff = pinned.diff;
        job = record;
        AttemptNext::Test(&job)
    };
    if let Err(why) = st.args.fvd.check() {
        tracing::warn!(attempt, %why, "the attempt is not recorded: the port stops");
        return Ok(());
    }
    let done = st
        .args
        .store
        .record_attempt_step(&row, answered, then)
        .await?;
    fvd_store::chaos::crash_point("attempt-committed");
    match done {
        // The port was cancelled while the agent ran.
        AttemptRecorded::AlreadyFinal => Ok(()),
        AttemptRecorded::Ended => {
            if let Some(request) = conversion {
                // fvd does not convert weights: the request goes to the
                // gate, which reopens conversion (P5) with it.
                st.args.gate.cast(GateMsg::ConversionRetry {
                    component: st.args.spec.name.clone(),
                    request,
                })?;
            }
            emit(st).await?;
            let reason = end_reason.unwrap_or_default();
            announce_final(st, ComponentStatus::Blocked, result.verdict, &reason).await
        }
        AttemptRecorded::Asked(id) => {
            tracing::info!(%family, component = %st.args.spec.name, %id, "the agent asked a question; the component waits for its answer");
            emit(st).await?;
            // `PORT_STATUS.md` shows the question; the gate pauses the port
            // once nothing else runs.
            if let Err(e) = crate::port_status::write(&st.args.store, &family).await {
                tracing::error!(%family, error = %e, "could not write PORT_STATUS.md");
            }
            let row = current(st).await?;
            st.args.gate.cast(GateMsg::ComponentAsks(row))?;
            Ok(())
        }
        AttemptRecorded::Queued(job) => queued(myself, st, job).await,
    }
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
