//! `ComponentSubagentActor`: one per component of a port. It asks the
//! scheduler for a run of the component's parity test, has the result
//! classified once ([`crate::red_run`]: the verdict from its JUnit report,
//! and whether a red run is traced or gets its variants first) and records
//! it. It alone writes the component's row: the helper actors that
//! diagnose a red run tell it what they do ([`ComponentMsg::Diagnosing`]).
//!
//! A component without an `[agent]` ends as `blocked` on any verdict other
//! than `non_skip_pass`, with the precise reason (the failing assertion, the
//! skip reason, the collection error), as the parity contract asks. A
//! component with one loops: after a red run the coding agent runs in the
//! component's git worktree with the packet of [`crate::agent`], its work is
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
use std::path::{Path, PathBuf};

use fvd_contracts::verdict::Verdict;
use fvd_telemetry::{metrics, spans};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::broadcast;
use tracing::Span;
use tracing::field::Empty;

use crate::gate::GateMsg;
use crate::red_run::{self, AfterVerdict, Decision, RedRun};
use crate::scheduler::{JobEvent, QueuedJob, SchedulerMsg};
use fvd_spec::ComponentSpec;
use fvd_store::model::{
    ComponentRow, ComponentStatus, JobRecord, JobReport, JobResult, JobState, PortEvent,
    RecordedVerdict,
};
use fvd_store::states::{AttemptKind, AttemptState, EscapeAbout, EscapeStatus};
use fvd_store::{
    AttemptNext, AttemptRecorded, AttemptRow, ComponentNext, EscapeRow, Store, now_ms,
};
use fvd_workspace::agent::{self, LastRun};
use fvd_workspace::attempt_caps::TakeInError;
use fvd_workspace::worktree::{self, Worktree};

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
    /// The port's helper actors its red runs visit (trace, variants).
    pub helpers: red_run::Helpers,
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
    /// A helper actor diagnosing red run `job_id` shows what it does on
    /// the component's row (a trace step, the variant runs): the component
    /// writes it while that run is still its run in flight.
    Diagnosing {
        job_id: String,
        status: ComponentStatus,
        verdict: RecordedVerdict,
        reason: String,
    },
    /// A red run back from its route through the helpers, with their notes
    /// (the investigation's summary, the variant table's note): it is
    /// recorded as it is, never classified again.
    Diagnosed(Box<RedRun>),
}

// The scheduler's events reach the component through a derived ref.
crate::scheduler::job_event_msg!(ComponentMsg::Job);

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

/// What the agent loop of a component needs besides its spec.
#[derive(Debug)]
struct AgentLoop {
    worktree: Worktree,
    /// The port's prep fields, for the packet's `component_context`.
    prep: BTreeMap<String, String>,
    /// The component's judge, repository-relative (`fvd_workspace::judge`):
    /// its runs test an attempt with these as the port's commit has them.
    judge: Vec<String>,
    /// Where prompts, handoffs and agent output of each attempt are kept.
    dir: PathBuf,
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
            ComponentMsg::Diagnosing {
                job_id,
                status,
                verdict,
                reason,
            } => {
                if st.job_id.as_deref() == Some(job_id.as_str()) {
                    update(st, status, verdict, &reason, "").await?;
                }
            }
            ComponentMsg::Diagnosed(run) => {
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
        }
        Ok(())
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
/// goes through its helpers first (it comes back as
/// [`ComponentMsg::Diagnosed`]), any other is recorded now.
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
    match red_run::decide(&v, &st.args.spec, &st.args.helpers) {
        Decision::Environment(cause) => {
            environment_failure(myself, st, &report, &worker_id, &cause).await
        }
        Decision::Diagnose(route) => {
            red_run::hand_on(Box::new(RedRun {
                spec: st.args.spec.clone(),
                report,
                worker_id,
                verdict: v,
                component: myself.clone(),
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

/// Records a classified run (`note`: its helpers' notes, for a blocked
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
/// end, blocked with `note` (its helpers' notes) before the reason.
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
        match prepare_agent(st).await {
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
    let env = crate::helper::run_env(
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

/// Finds or makes the component's worktree and reads the port's prep
/// fields from the stored spec.
async fn prepare_agent(st: &ComponentState) -> Result<AgentLoop, String> {
    let (family, name) = (&st.args.family, &st.args.spec.name);
    let store = &st.args.store;
    let known = store
        .worktree(family, name)
        .await
        .map_err(|e| e.to_string())?;
    let repo = Path::new(&st.args.repo);
    // A new worktree starts at the commit the port is pinned to.
    let base = Some(st.args.code.commit.as_str()).filter(|c| !c.is_empty());
    let clock = std::time::Instant::now();
    let wt = worktree::ensure(repo, family, name, known, base)
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(%family, component = %name, worktree_ms = clock.elapsed().as_millis() as u64, "agent worktree ready");
    store
        .record_worktree(family, name, &wt)
        .await
        .map_err(|e| e.to_string())?;
    let port = store
        .port(family)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("port {family} has no row in the store"))?;
    let prep = fvd_spec::parse(Path::new(&port.spec_path), &port.spec_toml)
        .map_err(|e| e.to_string())?
        .prep;
    let dir = agent_dir(repo, family, name).map_err(|e| e.to_string())?;
    let tests: Vec<String> = st
        .args
        .spec
        .test_files()
        .iter()
        .map(|t| t.to_string())
        .collect();
    let mut more: Vec<String> = ["official_ref_dir", "port_state_file"]
        .iter()
        .filter_map(|k| prep.get(*k).cloned())
        .collect();
    if let Ok(spec) = Path::new(&port.spec_path).strip_prefix(repo) {
        more.push(spec.to_string_lossy().into_owned());
    }
    let judge = fvd_workspace::judge::paths(&st.args.code.prefix, &tests, &more);
    Ok(AgentLoop {
        worktree: wt,
        prep,
        judge,
        dir,
    })
}

/// Where a component's packets and handoffs go:
/// `REPO/.fvd/agent/<family>/<component>`, never elsewhere.
fn agent_dir(repo: &Path, family: &str, name: &str) -> Result<PathBuf, fvd_paths::PathError> {
    fvd_paths::join_under_no_links(
        &repo.join(".fvd").join("agent"),
        Path::new(family).join(name),
    )
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
        let in_flight = match fleet_of(st) {
            Some(_) => st.args.store.fleet_try(&family, &name, cut.attempt).await?,
            None => None,
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
        let wt = st
            .agent
            .as_ref()
            .expect("agent loop prepared")
            .worktree
            .path
            .clone();
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

/// What the component has spent so far, against its agent's budgets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spent {
    /// Attempts recorded (an attempt cut off by a crash is not one yet).
    pub attempts: u32,
    /// When its first run was queued.
    pub first_queued_ms: Option<i64>,
    /// Run time × GPUs of its finished runs.
    pub gpu_ms: u64,
    pub now_ms: i64,
    /// What its agent attempts spent on their model API, and the port's
    /// (every component's) together.
    pub model_component: fvd_store::usage::Spend,
    pub model_port: fvd_store::usage::Spend,
}

/// Which budget of `a` is spent, in words; `None` while all hold.
pub fn budget_spent(a: &fvd_spec::AgentSpec, s: &Spent) -> Option<String> {
    if s.attempts >= a.max_attempts {
        return Some(format!(
            "agent budget spent: {} of {} attempts",
            s.attempts, a.max_attempts
        ));
    }
    if let (Some(max), Some(first)) = (a.max_wall, s.first_queued_ms) {
        let used = std::time::Duration::from_millis((s.now_ms - first).max(0) as u64);
        if used >= max {
            return Some(format!(
                "agent budget spent: wall time {} s of {} s",
                used.as_secs(),
                max.as_secs()
            ));
        }
    }
    if let Some(max) = a.max_gpu_s
        && s.gpu_ms >= max.saturating_mul(1000)
    {
        return Some(format!(
            "agent budget spent: {:.1} of {max} GPU-seconds",
            s.gpu_ms as f64 / 1000.0
        ));
    }
    let b = a.model.as_ref().map(|m| m.budget).unwrap_or_default();
    for (max, spent, of) in [
        (b.usd_per_component, s.model_component.usd, "the component"),
        (b.usd_per_port, s.model_port.usd, "the port"),
    ] {
        if let Some(max) = max
            && spent >= max
        {
            return Some(format!(
                "agent budget spent: {spent:.4} of {max} USD for {of}"
            ));
        }
    }
    for (max, spent, of) in [
        (
            b.tokens_per_component,
            s.model_component.tokens,
            "the component",
        ),
        (b.tokens_per_port, s.model_port.tokens, "the port"),
    ] {
        if let Some(max) = max
            && spent >= max
        {
            return Some(format!(
                "agent budget spent: {spent} of {max} tokens for {of}"
            ));
        }
    }
    None
}

/// What one attempt may spend on its model API: what is left of its own
/// budget after `this_attempt` (what its earlier tries spent), or of the
/// component's and the port's when less.
pub fn allowance(
    b: &fvd_spec::agent_model::AgentBudget,
    s: &Spent,
    this_attempt: fvd_store::usage::Spend,
) -> fvd_workspace::session::Allowance {
    let least_f = |xs: [Option<f64>; 3]| xs.into_iter().flatten().reduce(f64::min);
    let least_u = |xs: [Option<u64>; 3]| xs.into_iter().flatten().min();
    fvd_workspace::session::Allowance {
        usd: least_f([
            b.usd_per_attempt.map(|m| (m - this_attempt.usd).max(0.0)),
            b.usd_per_component
                .map(|m| (m - s.model_component.usd).max(0.0)),
            b.usd_per_port.map(|m| (m - s.model_port.usd).max(0.0)),
        ]),
        tokens: least_u([
            b.tokens_per_attempt
                .map(|m| m.saturating_sub(this_attempt.tokens)),
            b.tokens_per_component
                .map(|m| m.saturating_sub(s.model_component.tokens)),
            b.tokens_per_port
                .map(|m| m.saturating_sub(s.model_port.tokens)),
        ]),
    }
}

/// What the component spent since its port was last started over
/// (`--rerun`): the ledger keeps older attempts as history, the budgets
/// start again.
async fn spent(st: &ComponentState, recorded: &[AttemptRow]) -> Result<Spent, ActorProcessingErr> {
    let since = st.args.store.reset_ms(&st.args.family).await?;
    let jobs = st
        .args
        .store
        .jobs_of(&st.args.family, &st.args.spec.name)
        .await?;
    let jobs: Vec<_> = jobs.into_iter().filter(|j| j.queued_ms >= since).collect();
    let model = st.args.store.usage_spent(&st.args.family, since).await?;
    // The parity runs an agent asked for itself (`fvd mcp`'s `run_parity`).
    let tool_gpu_ms: u64 = st
        .args
        .store
        .tool_calls(&st.args.family, &st.args.spec.name)
        .await?
        .iter()
        .filter(|c| c.at_ms >= since)
        .map(|c| c.gpu_ms)
        .sum();
    let model_port = model
        .values()
        .fold(fvd_store::usage::Spend::default(), |a, s| {
            fvd_store::usage::Spend {
                tokens: a.tokens + s.tokens,
                usd: a.usd + s.usd,
            }
        });
    Ok(Spent {
        model_component: model.get(&st.args.spec.name).copied().unwrap_or_default(),
        model_port,
        attempts: recorded.iter().filter(|a| a.started_ms >= since).count() as u32,
        first_queued_ms: jobs.iter().map(|j| j.queued_ms).min(),
        gpu_ms: jobs
            .iter()
            .filter(|j| j.state == JobState::Finished)
            .map(|j| j.duration_ms.unwrap_or(0) * u64::from(j.gpus_needed))
            .sum::<u64>()
            + tool_gpu_ms,
        now_ms: now_ms(),
    })
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
async fn agent_turn(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    job_id: &str,
    result: &JobResult,
    worker_id: &str,
    kind: AttemptKind,
    adopting: Option<fvd_store::FleetTry>,
) -> Result<(), ActorProcessingErr> {
    let spec = st.args.spec.clone();
    let (attempt, line, used, recorded) = match turn_start(st, result).await? {
        TurnStart::Blocked(reason) => return block(st, result.verdict, &reason, worker_id).await,
        TurnStart::Go {
            attempt,
            line,
            used,
            recorded,
        } => (attempt, line, used, recorded),
    };
    update(st, ComponentStatus::Agent, result.verdict, &line, worker_id).await?;
    let answers = answered(st).await?;
    let turn = Turn {
        attempt,
        job_id,
        result,
        kind,
        adopting: adopting.as_ref(),
    };
    let clock = std::time::Instant::now();
    let files = write_packet(st, &turn, &recorded, &used, &answers).await?;
    let packet_ms = clock.elapsed().as_millis() as u64;
    let ran = run_agent(st, &turn, &files, &used).await?;
    if let Some(why) = ran.not_adopted {
        tracing::warn!(attempt, %why, "the agent attempt in flight before the restart runs on no worker; it runs again from its base");
        return Box::pin(agent_turn(
            myself, st, job_id, result, worker_id, kind, None,
        ))
        .await;
    }
    let (exit, mut handoff) = (ran.exit, ran.handoff);
    if let Some(env) = ran.environment {
        return agent_environment(st, &turn, &ran.head_before, &env.0).await;
    }
    // A question asked by tool is the attempt's escape hatch, unless its
    // handoff already asks one.
    if let Some(q) = &ran.asked
        && handoff.escape().is_none()
    {
        handoff = question_handoff(st, &handoff, q, result).await?;
    }
    let wt = st
        .agent
        .as_ref()
        .expect("agent components have a loop")
        .worktree
        .path
        .clone();
    // A worker's commit moves the component's branch to it; a host run's
    // work is committed here.
    // A commit over the limits on what an attempt brings back (issue #38)
    // is refused before anything of it is checked out: the attempt is
    // recorded with the refusal as its outcome, and the worktree stays at
    // its base.
    let limits = st.args.agents.limits;
    let (committed, agent_worker) = match &ran.fleet {
        Some(f) => (
            match &f.refused {
                Some(why) => Err(worktree::WorktreeError::TakeIn(TakeInError::OverLimit(
                    why.clone(),
                ))),
                None => worktree::adopt(&wt, &ran.head_before, &f.sha, &f.pack, &limits).await,
            },
            f.worker_id.clone(),
        ),
        None => (
            worktree::commit(&wt, &format!("fvd: {} attempt {attempt}", spec.name)).await,
            String::new(),
        ),
    };
    let commit = match committed {
        Ok(c) => c,
        Err(worktree::WorktreeError::TakeIn(TakeInError::OverLimit(why))) => {
            tracing::warn!(family = %st.args.family, component = %spec.name, attempt, worker = %agent_worker, "{why}");
            return after_agent(
                myself,
                st,
                &turn,
                worker_id,
                AgentDone {
                    commit: worktree::Commit {
                        sha: ran.head_before.clone(),
                        stat: why.clone(),
                        diff: String::new(),
                    },
                    exit: &exit,
                    handoff: &handoff,
                    worker_id: agent_worker,
                    refused: Some(why),
                },
                !answers.is_empty(),
            )
            .await;
        }
        Err(e) => {
            let reason = format!(
                "{} (agent attempt {attempt} could not be committed: {e})",
                classed(result.verdict, &result.reason)
            );
            return block(st, result.verdict, &reason, worker_id).await;
        }
    };
    let commit_ms = clock.elapsed().as_millis() as u64 - packet_ms - ran.run_ms;
    // fvd's own time around the agent, for `bench/agent_overhead.py`.
    tracing::info!(
        family = %st.args.family,
        component = %spec.name,
        attempt,
        packet_ms,
        ledger_ms = ran.ledger_ms,
        proxy_ms = ran.proxy_ms,
        agent_ms = exit.duration_ms,
        commit_ms,
        total_ms = clock.elapsed().as_millis() as u64,
        "agent attempt overhead"
    );
    after_agent(
        myself,
        st,
        &turn,
        worker_id,
        AgentDone {
            commit,
            exit: &exit,
            handoff: &handoff,
            worker_id: agent_worker,
            refused: None,
        },
        !answers.is_empty(),
    )
    .await
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
    let a = spec.agent.as_ref().expect("only agent components loop");
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
    let used = spent(st, &recorded).await?;
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

/// What one agent turn is about: its attempt number, and the run it starts
/// from (`kind`: `fix` after a red run, `cleanup` after a refused pass).
struct Turn<'a> {
    attempt: u32,
    job_id: &'a str,
    result: &'a JobResult,
    kind: AttemptKind,
    /// The try an earlier process started on a worker, to adopt.
    adopting: Option<&'a fvd_store::FleetTry>,
}

/// The files of one attempt, under the component's agent folder.
struct AttemptFiles {
    dir: PathBuf,
    prompt: String,
    handoff: String,
}

/// Writes the attempt's packet (`attempt-N/prompt.md`) and clears the
/// handoff file a crashed earlier try may have left.
async fn write_packet(
    st: &ComponentState,
    turn: &Turn<'_>,
    recorded: &[AttemptRow],
    used: &Spent,
    answers: &[EscapeRow],
) -> Result<AttemptFiles, ActorProcessingErr> {
    let (family, spec) = (&st.args.family, &st.args.spec);
    let a = spec.agent.as_ref().expect("only agent components loop");
    let floor = crate::port_status::escape_floor(&st.args.store, family)
        .await
        .unwrap_or(0);
    let next_escape = st.args.store.next_escape_id(family, floor).await?;
    let judge_decisions = judge::decided_since_reset(st).await?;
    let trace = st
        .args
        .store
        .latest_trace_summary(family, &spec.name)
        .await?;
    // The variant table of exactly this red run, when it had one.
    let table = st.args.store.variant_table(family, &spec.name).await?;
    let variants = (table.first().is_some_and(|r| r.red_job_id == turn.job_id))
        .then(|| crate::variant_actor::table_text(&table));
    let lp = st.agent.as_ref().expect("agent components have a loop");
    let dir = lp.dir.join(format!("attempt-{}", turn.attempt));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let prompt_file = dir.join("prompt.md");
    let handoff_file = dir.join("handoff.txt");
    // A handoff left by a crashed earlier try must not pass for this one's.
    let _ = std::fs::remove_file(&handoff_file);
    let files = AttemptFiles {
        prompt: prompt_file.to_string_lossy().into_owned(),
        handoff: handoff_file.to_string_lossy().into_owned(),
        dir,
    };
    let last = LastRun {
        job_id: turn.job_id,
        verdict: turn.result.verdict,
        reason: &turn.result.reason,
        output_tail: &turn.result.output_tail,
    };
    // On the fleet, the worker knows its own paths and fills them in.
    let fleet = fleet_of(st).is_some();
    let workdir = lp.worktree.workdir().to_string_lossy().into_owned();
    let text = agent::packet(&agent::Packet {
        family,
        spec,
        prep: &lp.prep,
        attempt: turn.attempt,
        budget_used: used.attempts + 1,
        max_attempts: a.max_attempts,
        last,
        ledger: recorded,
        workdir: if fleet { WORKDIR } else { &workdir },
        handoff_file: if fleet { HANDOFF_FILE } else { &files.handoff },
        answers,
        judge_decisions: &judge_decisions,
        next_escape_id: &next_escape,
        trace: trace.as_deref(),
        variants: variants.as_deref(),
    });
    std::fs::write(&prompt_file, text)
        .map_err(|e| format!("cannot write {}: {e}", prompt_file.display()))?;
    Ok(files)
}

/// The attempt's handoff with the question its agent asked through
/// `ask_user` as its escape hatch, under the id the question will get.
async fn question_handoff(
    st: &ComponentState,
    handoff: &agent::HandoffRead,
    q: &agent::AskedQuestion,
    result: &JobResult,
) -> Result<agent::HandoffRead, ActorProcessingErr> {
    let (family, spec) = (&st.args.family, &st.args.spec);
    let floor = crate::port_status::escape_floor(&st.args.store, family)
        .await
        .unwrap_or(0);
    let escape_id = st.args.store.next_escape_id(family, floor).await?;
    let files: Vec<String> = handoff
        .value
        .as_ref()
        .map(|h| h.files_changed.iter().map(|f| f.to_string()).collect())
        .unwrap_or_default();
    let lp = st.agent.as_ref().expect("agent components have a loop");
    let port_state_file = lp
        .prep
        .get("port_state_file")
        .cloned()
        .unwrap_or_else(|| "none".into());
    let test = spec
        .test_files()
        .first()
        .map(|t| t.to_string())
        .unwrap_or_default();
    let evidence = result.reason.lines().next().unwrap_or_default();
    Ok(agent::with_question(
        handoff,
        q,
        &agent::AskedAt {
            component: &spec.name,
            parity_test: &test,
            parity_status: result.verdict.as_str(),
            evidence,
            escape_id: &escape_id,
            files_changed: &files,
            port_state_file: &port_state_file,
        },
    ))
}

/// What one run of the agent came to.
struct AgentRan {
    /// Time spent opening the ledger row, starting the proxy, and in
    /// `run_agent` as a whole.
    ledger_ms: u64,
    proxy_ms: u64,
    run_ms: u64,
    exit: agent::AgentExit,
    handoff: agent::HandoffRead,
    /// A cause outside the agent ended it (its model API refused the key
    /// or kept failing): nothing is committed or counted.
    environment: Option<fvd_workspace::session::Environment>,
    head_before: String,
    /// The commit a worker made of the attempt, when it ran on the fleet.
    fleet: Option<FleetCommit>,
    /// The question the agent asked through its `ask_user` tool.
    asked: Option<agent::AskedQuestion>,
    /// The try it was to adopt runs on no worker (why): nothing ran.
    not_adopted: Option<String>,
}

/// An attempt's commit as a worker sent it back.
struct FleetCommit {
    sha: String,
    pack: Vec<u8>,
    worker_id: String,
    /// Why the orchestrator's edge refused it (its pack was over the
    /// limit): then there is no commit to take in.
    refused: Option<String>,
}

/// Where an attempt's agent runs on the fleet: its worker fills these in.
const WORKDIR: &str = "{workdir}";
const PROMPT_FILE: &str = "{prompt_file}";
const HANDOFF_FILE: &str = "{handoff_file}";
const ATTEMPT_DIR: &str = "{attempt_dir}";
const PROXY_URL: &str = "{proxy_url}";
const TOOLS_ADDR: &str = "{tools_addr}";
const FVD_PROGRAM: &str = "{fvd}";

/// The fleet's attempt registry when agents run on workers (`--agents
/// fleet`); `None` when they run on this host.
fn fleet_of(st: &ComponentState) -> Option<&fvd_workspace::agent::FleetAttempts> {
    match st.args.agents.on {
        fvd_workspace::agent::AgentsOn::Fleet => Some(&st.args.agents.registry),
        fvd_workspace::agent::AgentsOn::Host => None,
    }
}

/// How one agent run is started, wherever it runs.
struct AgentLaunch<'a> {
    argv: Vec<String>,
    extra: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
    /// A preset's configuration files, relative to the attempt's folder
    /// (written there by the launch on this host; carried to a worker).
    files: Vec<(String, String)>,
    /// The attempt's model proxy, which a worker reaches by its tunnel.
    proxy: Option<std::net::SocketAddr>,
    /// The attempt's tools (`fvd mcp`), likewise.
    tools: Option<std::net::SocketAddr>,
    /// Digests of the tokens the agent is given for them (stored with the
    /// try's fleet job, for a restarted orchestrator to admit them).
    proxy_token: String,
    tools_token: String,
    /// The try to adopt instead of queuing a new one.
    adopt: Option<&'a fvd_store::FleetTry>,
    span: &'a Span,
}

/// What one agent run gave, wherever it ran.
struct AgentRun {
    exit: agent::AgentExit,
    /// The handoff file's text, not yet redacted here.
    handoff_text: Option<String>,
    fleet: Option<FleetCommit>,
    /// It could not run for a cause outside the agent (fleet only).
    environment: Option<String>,
    /// The try to adopt runs on no worker (why).
    not_adopted: Option<String>,
}

/// The attempt's model API failed for a reason outside the agent and the
/// code: the attempt is closed as `environment` (not counted, run again
/// under its number when the port resumes), the worktree is reset to where
/// it began, and the component waits; the port pauses (exit 4) once
/// nothing else runs.
async fn agent_environment(
    st: &mut ComponentState,
    turn: &Turn<'_>,
    head_before: &str,
    why: &str,
) -> Result<(), ActorProcessingErr> {
    let (family, name) = (st.args.family.clone(), st.args.spec.name.clone());
    let reason = format!("environment: agent attempt {}: {why}", turn.attempt);
    tracing::warn!(%family, component = %name, attempt = turn.attempt, "{reason}");
    st.args
        .store
        .attempt_environment(&family, &name, turn.attempt, why, now_ms())
        .await?;
    let wt = st
        .agent
        .as_ref()
        .expect("agent components have a loop")
        .worktree
        .path
        .clone();
    if let Err(e) = worktree::reset(&wt, head_before).await {
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
        st.args.gate.cast(GateMsg::ComponentWaitsEnv(name))?;
    }
    Ok(())
}

/// Opens the attempt's ledger row, runs the agent in the worktree's port
/// folder under its own span (behind the model proxy when the agent has a
/// model API), and reads the handoff it returned.
async fn run_agent(
    st: &ComponentState,
    turn: &Turn<'_>,
    files: &AttemptFiles,
    used: &Spent,
) -> Result<AgentRan, ActorProcessingErr> {
    let (family, spec) = (&st.args.family, &st.args.spec);
    let a = spec.agent.as_ref().expect("only agent components loop");
    let lp = st.agent.as_ref().expect("agent components have a loop");
    let attempt = turn.attempt;
    let clock = std::time::Instant::now();
    // git works on the whole worktree; the agent in the port's folder of it.
    let wt = lp.worktree.path.clone();
    let wt_s = lp.worktree.workdir().to_string_lossy().into_owned();
    let started_ms = now_ms();
    let cookie = format!("{family}/{}/{attempt}/{started_ms}", spec.name);
    let head_before = worktree::head(&wt).await.map_err(|e| e.to_string())?;
    // The row exists before the agent does: a crash from here on finds it.
    // An adopted try goes on under the row its process opened.
    if turn.adopting.is_none() {
        st.args
            .store
            .begin_attempt(&AttemptRow {
                family: family.clone(),
                component: spec.name.clone(),
                attempt,
                job_before: turn.job_id.to_string(),
                verdict_before: turn.result.verdict,
                reason_before: turn.result.reason.clone(),
                started_ms,
                head_before: head_before.clone(),
                cookie: cookie.clone(),
                kind: turn.kind,
                ..AttemptRow::default()
            })
            .await?;
    }
    let ledger_ms = clock.elapsed().as_millis() as u64;
    let fleet = fleet_of(st).is_some();
    let (prompt, handoff) = if fleet {
        (PROMPT_FILE, HANDOFF_FILE)
    } else {
        (files.prompt.as_str(), files.handoff.as_str())
    };
    let argv = a.argv(&fvd_spec::AgentVars {
        prompt_file: prompt,
        handoff_file: handoff,
        worktree: if fleet { WORKDIR } else { &wt_s },
        family,
        component: &spec.name,
        attempt,
    });
    let program = match a.preset {
        Some(p) => p.program().to_string(),
        None => argv[0].clone(),
    };
    let span = spans::agent_run(&st.span, family, &spec.name, attempt, &program);
    let mut extra = vec![
        ("FVD_FAMILY".to_string(), family.clone()),
        ("FVD_COMPONENT".to_string(), spec.name.clone()),
        ("FVD_ATTEMPT".to_string(), attempt.to_string()),
        ("FVD_PROMPT_FILE".to_string(), prompt.to_string()),
        ("FVD_HANDOFF_FILE".to_string(), handoff.to_string()),
        (agent::COOKIE_ENV.to_string(), cookie),
    ];
    if let Some(tp) = fvd_telemetry::traceparent(&span) {
        extra.push((fvd_telemetry::TRACEPARENT.to_string(), tp));
    }
    // fvd's tools for the agent (`fvd mcp`), for as long as it runs; an
    // adopted try's admit the token its agent holds.
    let tools_token = turn
        .adopting
        .and_then(|t| fvd_workspace::session::AttemptToken::from_digest_hex(&t.tools_token_sha256));
    let tools = start_tools(st, attempt, &head_before, &span, used, tools_token).await;
    let mcp = tools.as_ref().map(|t| tools_mcp(st, t, &head_before));
    if let (Some(m), Some(t)) = (&mcp, &tools) {
        extra.extend(m.env.iter().cloned());
        // The token only in the agent's environment, never in a file or an
        // argument a job could read: `fvd mcp` takes it from there
        // (issue #38).
        if let Some(v) = t.token.value() {
            extra.push(("FVD_TOOLS_TOKEN".into(), v.to_string()));
        }
    }
    let tools_addr = tools.as_ref().map(|t| t.addr);
    let tools_token = tools
        .as_ref()
        .map(|t| t.token.digest_hex())
        .unwrap_or_default();
    let Some(model) = &a.model else {
        let ran = run_where(
            st,
            attempt,
            files,
            &head_before,
            AgentLaunch {
                argv,
                extra,
                stdin: None,
                files: Vec::new(),
                proxy: None,
                tools: tools_addr,
                proxy_token: String::new(),
                tools_token,
                adopt: turn.adopting,
                span: &span,
            },
            std::future::pending(),
        )
        .await?;
        let AgentRun {
            exit,
            handoff_text,
            fleet,
            environment,
            not_adopted,
        } = ran;
        // The handoff is stored and may reach PORT_STATUS.md: redacted like
        // the agent's output.
        let handoff_text = handoff_text.map(|t| st.args.agents.redactor(&a.env).text(&t));
        let mut handoff = agent::read_handoff(&spec.name, handoff_text.as_deref(), &exit.stdout);
        if let Some(e) = &exit.spawn_error {
            handoff.summary = e.clone();
        }
        let outcome = agent::exit_text(exit.exit_code, exit.signal, exit.timed_out);
        span.record("fvd.outcome", outcome.as_str());
        if let Some(c) = exit.exit_code {
            span.record("fvd.exit_code", c);
        }
        return Ok(AgentRan {
            ledger_ms,
            proxy_ms: 0,
            run_ms: clock.elapsed().as_millis() as u64,
            exit,
            handoff,
            environment: environment.map(fvd_workspace::session::Environment),
            head_before,
            fleet,
            asked: tools.as_ref().and_then(|t| t.asked()),
            not_adopted,
        });
    };
    let mut ran = proxied_agent(
        st,
        ProxiedRun {
            attempt,
            argv,
            extra,
            files,
            used,
            span,
            head_before,
            clock,
            ledger_ms,
            mcp,
            tools: tools_addr,
            tools_token,
            adopting: turn.adopting,
        },
        model,
    )
    .await?;
    ran.asked = tools.as_ref().and_then(|t| t.asked());
    Ok(ran)
}

/// The parts of one proxied agent run.
struct ProxiedRun<'a> {
    attempt: u32,
    argv: Vec<String>,
    extra: Vec<(String, String)>,
    files: &'a AttemptFiles,
    used: &'a Spent,
    span: Span,
    head_before: String,
    /// Started with the attempt's ledger row.
    clock: std::time::Instant,
    ledger_ms: u64,
    mcp: Option<fvd_workspace::preset::Mcp>,
    tools: Option<std::net::SocketAddr>,
    /// The digest of the tools' token.
    tools_token: String,
    adopting: Option<&'a fvd_store::FleetTry>,
}

/// Runs the agent behind its own model proxy: the key stays in fvd, the
/// usage is written to the ledger as it is metered, and the agent is ended
/// the moment the proxy trips (a budget spent, a refused key).
async fn proxied_agent(
    st: &ComponentState,
    r: ProxiedRun<'_>,
    model: &fvd_spec::agent_model::ModelSpec,
) -> Result<AgentRan, ActorProcessingErr> {
    use fvd_workspace::session::{self, Session};
    let (family, spec) = (&st.args.family, &st.args.spec);
    let a = spec.agent.as_ref().expect("only agent components loop");
    let ProxiedRun {
        attempt,
        argv,
        mut extra,
        files,
        used,
        span,
        head_before,
        clock,
        ledger_ms,
        mcp,
        tools,
        tools_token,
        adopting,
    } = r;
    let store = st.args.store.clone();
    // A try after a crash (or an adopted one) adds to what the tries
    // before it spent, and may spend only what the attempt has left.
    let before = store
        .usage_of(family, &spec.name)
        .await?
        .remove(&attempt)
        .unwrap_or_default();
    let this_attempt = fvd_store::usage::Spend {
        tokens: before.total_tokens(),
        usd: before.cost_usd.unwrap_or(0.0),
    };
    let label = format!("{family}/{}/{attempt}", spec.name);
    let started = std::time::Instant::now();
    let token = adopting
        .and_then(|t| fvd_workspace::session::AttemptToken::from_digest_hex(&t.proxy_token_sha256));
    let sess = match Session::start(
        a,
        model,
        allowance(&model.budget, used, this_attempt),
        label,
        session::default_retry(),
        token,
    )
    .await
    {
        Ok(s) => std::sync::Arc::new(s),
        Err(env) => {
            span.record("fvd.outcome", "environment");
            return Ok(AgentRan {
                ledger_ms,
                proxy_ms: started.elapsed().as_millis() as u64,
                run_ms: clock.elapsed().as_millis() as u64,
                exit: agent::AgentExit::default(),
                handoff: agent::read_handoff(&spec.name, None, ""),
                environment: Some(env),
                head_before,
                fleet: None,
                asked: None,
                not_adopted: None,
            });
        }
    };
    let proxy_ms = started.elapsed().as_millis() as u64;
    let fleet = fleet_of(st).is_some();
    // A worker reaches the proxy by its own loopback end of a tunnel.
    let on_worker = |v: String| {
        if fleet {
            v.replace(&sess.proxy().origin(), PROXY_URL)
        } else {
            v
        }
    };
    let mut launch_files = Vec::new();
    let (argv, stdin) = match a.preset {
        Some(p) if fleet => {
            let packet = std::fs::read_to_string(&files.prompt)
                .map_err(|e| format!("cannot read {}: {e}", files.prompt))?;
            let base_url = on_worker(sess.proxy().base_url());
            // Workers start jobs in their jail by default.
            let plan = session::plan(
                &sess,
                a,
                p,
                &packet,
                session::Place {
                    dir: Path::new(ATTEMPT_DIR),
                    jailed: true,
                    mcp: mcp.as_ref(),
                },
                &base_url,
            );
            extra.extend(plan.launch.env);
            launch_files = plan.files;
            (plan.launch.argv, Some(plan.launch.stdin))
        }
        Some(p) => {
            let packet = std::fs::read_to_string(&files.prompt)
                .map_err(|e| format!("cannot read {}: {e}", files.prompt))?;
            let jailed = st.args.agents.jail.mechanism().is_some();
            let mut l = session::launch(
                &sess,
                a,
                p,
                &packet,
                session::Place {
                    dir: &files.dir,
                    jailed,
                    mcp: mcp.as_ref(),
                },
            )
            .map_err(|e| format!("cannot write the {} configuration: {e}", p.name()))?;
            // Found as `fvd agents check` finds it: FVD_AGENT_CLI_DIR, then PATH.
            if let Some(found) =
                fvd_workspace::preset::find_program(p, std::env::var_os("PATH").as_deref())
            {
                l.argv[0] = found.display().to_string();
            }
            extra.extend(l.env);
            (l.argv, Some(l.stdin))
        }
        None => {
            extra.extend(sess.raw_env().into_iter().map(|(k, v)| (k, on_worker(v))));
            (argv, None)
        }
    };
    tracing::debug!(%family, component = %spec.name, attempt, proxy_ms, "agent attempt: model proxy started");
    // The ledger follows the proxy's meter while the agent runs.
    let writer = {
        let (s, store) = (sess.clone(), store.clone());
        let (f, c, b) = (family.clone(), spec.name.clone(), before.clone());
        fvd_telemetry::spawn(async move {
            let mut updates = s.proxy().usage_updates();
            while updates.changed().await.is_ok() {
                let mut u = s.usage_now();
                u.add_counts(&b);
                if let Err(e) = store.record_usage(&f, &c, attempt, &u).await {
                    tracing::warn!(error = %e, "agent usage could not be written");
                }
            }
        })
    };
    let program = argv[0].clone();
    let ran = run_where(
        st,
        attempt,
        files,
        &head_before,
        AgentLaunch {
            argv,
            extra,
            stdin,
            files: launch_files,
            proxy: Some(sess.proxy().addr()),
            tools,
            proxy_token: sess.proxy().token_digest(),
            tools_token,
            adopt: adopting,
            span: &span,
        },
        sess.stopped(),
    )
    .await;
    writer.abort();
    let _ = writer.await;
    let AgentRun {
        exit,
        handoff_text,
        fleet,
        environment,
        not_adopted,
    } = ran?;
    if not_adopted.is_some() {
        return Ok(AgentRan {
            ledger_ms,
            proxy_ms,
            run_ms: clock.elapsed().as_millis() as u64,
            exit,
            handoff: agent::read_handoff(&spec.name, None, ""),
            environment: None,
            head_before,
            fleet: None,
            asked: None,
            not_adopted,
        });
    }
    if let Some(why) = environment {
        span.record("fvd.outcome", "environment");
        return Ok(AgentRan {
            ledger_ms,
            proxy_ms,
            run_ms: clock.elapsed().as_millis() as u64,
            exit,
            handoff: agent::read_handoff(&spec.name, None, ""),
            environment: Some(session::Environment(why)),
            head_before,
            fleet: None,
            asked: None,
            not_adopted: None,
        });
    }
    let report = a
        .preset
        .map(|p| fvd_workspace::preset::report(p, &exit.stdout));
    // The agent never held the key; its handoff is redacted of it anyway,
    // with the values of the variables its spec passes.
    let mut names = a.env.clone();
    names.push(model.key_env.clone());
    let handoff_text = handoff_text.map(|t| st.args.agents.redactor(&names).text(&t));
    let final_text = report
        .as_ref()
        .and_then(|r| r.result.clone())
        .unwrap_or_else(|| exit.stdout.clone());
    let mut handoff = agent::read_handoff_of(
        &spec.name,
        report
            .as_ref()
            .and_then(|r| r.structured_handoff.as_deref()),
        handoff_text.as_deref(),
        &final_text,
    );
    if let Some(e) = &exit.spawn_error {
        handoff.summary = format!("{e} (is {program} installed and on PATH?)");
    }
    let (mut usage, environment) = sess.finish(&exit, report.as_ref(), &handoff);
    usage.add_counts(&before);
    store
        .record_usage(family, &spec.name, attempt, &usage)
        .await?;
    let outcome = agent::exit_text(exit.exit_code, exit.signal, exit.timed_out);
    span.record("fvd.outcome", usage.outcome.as_str());
    if let Some(c) = exit.exit_code {
        span.record("fvd.exit_code", c);
    }
    spans::agent_usage(
        &span,
        &spans::AgentUsage {
            provider: provider_name(model.api),
            model: &usage.model,
            input_tokens: usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
            output_tokens: usage.output_tokens,
            cost_usd: usage.cost_usd,
            requests: usage.requests,
        },
    );
    metrics::agent_usage(
        family,
        &spec.name,
        &usage.model,
        [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
        ],
        usage.cost_usd.unwrap_or(0.0) - before.cost_usd.unwrap_or(0.0),
    );
    tracing::info!(%family, component = %spec.name, attempt, %outcome, model_outcome = %usage.outcome, requests = usage.requests, cost_usd = ?usage.cost_usd, "agent attempt ended");
    Ok(AgentRan {
        ledger_ms,
        proxy_ms,
        run_ms: clock.elapsed().as_millis() as u64,
        exit,
        handoff,
        environment,
        head_before,
        fleet,
        asked: None,
        not_adopted: None,
    })
}

/// Starts the attempt's tools (`attempt_tools`), their `run_parity` held
/// to what the GPU-second budget has left after `used`; `None`, with a
/// warning, when they cannot listen (the agent runs without them).
async fn start_tools(
    st: &ComponentState,
    attempt: u32,
    head_before: &str,
    span: &Span,
    used: &Spent,
    token: Option<fvd_workspace::session::AttemptToken>,
) -> Option<crate::attempt_tools::ToolsServer> {
    let spec = &st.args.spec;
    let a = spec.agent.as_ref()?;
    let lp = st.agent.as_ref()?;
    let gpu_left_ms = a
        .max_gpu_s
        .map(|max| max.saturating_mul(1000).saturating_sub(used.gpu_ms));
    let ctx = crate::attempt_tools::ToolsContext {
        family: st.args.family.clone(),
        component: spec.name.clone(),
        attempt,
        spec: spec.clone(),
        repo: st.args.repo.clone(),
        code_prefix: lp.worktree.prefix.clone(),
        base: head_before.to_string(),
        fvd_writes: st.args.code.fvd_writes.clone(),
        store: st.args.store.clone(),
        scheduler: st.args.scheduler.clone(),
        registry: st.args.agents.registry.clone(),
        span: span.clone(),
        secrets: st.args.agents.redactor(&a.env),
        asked: Default::default(),
        limits: st.args.agents.limits,
        gpu_budget: crate::attempt_tools::GpuBudget::new(gpu_left_ms),
    };
    match crate::attempt_tools::start(ctx, token).await {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "the attempt's tools cannot listen; the agent runs without them");
            None
        }
    }
}

/// How the agent's CLI starts `fvd mcp` for this attempt: the variables
/// that scope it (the tools' address, the attempt's base; not the token,
/// which `fvd mcp` finds in the agent's environment), with the address and
/// the program left for a worker to fill in.
fn tools_mcp(
    st: &ComponentState,
    tools: &crate::attempt_tools::ToolsServer,
    head_before: &str,
) -> fvd_workspace::preset::Mcp {
    let fleet = fleet_of(st).is_some();
    let program = if fleet {
        FVD_PROGRAM.to_string()
    } else {
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "fvd".into())
    };
    let addr = if fleet {
        TOOLS_ADDR.to_string()
    } else {
        tools.addr.to_string()
    };
    fvd_workspace::preset::Mcp {
        program: program.clone(),
        env: vec![
            ("FVD_TOOLS_ADDR".into(), addr),
            ("FVD_ATTEMPT_BASE".into(), head_before.to_string()),
            ("FVD_BIN".into(), program),
        ],
    }
}

/// Runs the attempt's agent: on this host in the component's worktree, or
/// (`--agents fleet`) as a fleet job on a worker, which sends back its
/// commit. `stop` ends it early (its model proxy tripped).
async fn run_where(
    st: &ComponentState,
    attempt: u32,
    files: &AttemptFiles,
    head_before: &str,
    launch: AgentLaunch<'_>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<AgentRun, ActorProcessingErr> {
    let (family, spec) = (&st.args.family, &st.args.spec);
    let a = spec.agent.as_ref().expect("only agent components loop");
    let lp = st.agent.as_ref().expect("agent components have a loop");
    let Some(attempts) = fleet_of(st) else {
        // The agent writes its worktree and its attempt's files, nothing
        // else of the repository: not the main checkout, not `.fvd/` (the
        // state database, other components' worktrees) (issue #39).
        let repo = Path::new(&st.args.repo);
        let depth = st
            .args
            .code
            .prefix
            .split('/')
            .filter(|c| !c.is_empty())
            .count();
        let top = repo.ancestors().nth(depth).unwrap_or(repo);
        let mut policy = st.args.agents.clone();
        policy.jail = policy
            .jail
            .read_only(&[top.to_path_buf(), repo.to_path_buf()])
            .writable(&[lp.worktree.path.clone(), files.dir.clone()]);
        let exit = agent::run_with(
            &launch.argv,
            agent::RunAgent {
                cwd: &lp.worktree.workdir(),
                env_names: &a.env,
                extra: &launch.extra,
                timeout: a.timeout,
                log_dir: &files.dir,
                policy: &policy,
            },
            launch.stdin,
            stop,
        )
        .await;
        return Ok(AgentRun {
            exit,
            handoff_text: std::fs::read_to_string(&files.handoff).ok(),
            fleet: None,
            environment: None,
            not_adopted: None,
        });
    };
    let packet = std::fs::read_to_string(&files.prompt)
        .map_err(|e| format!("cannot read {}: {e}", files.prompt))?;
    let mut placement = spec.placement.clone();
    if let Some(p) = a.preset {
        // Only a worker that has the CLI takes the attempt.
        placement
            .labels
            .insert(format!("{}{}", AGENT_LABEL_PREFIX, p.name()), "yes".into());
    }
    let job_id = match launch.adopt {
        Some(t) => t.job_id.clone(),
        None => {
            let job_id = format!("{family}/{}/agent-{attempt}-{}", spec.name, now_ms());
            // Kept with the attempt before it is queued: its lease is then
            // written with it, and a restarted orchestrator adopts it.
            st.args
                .store
                .set_fleet_try(
                    family,
                    &spec.name,
                    attempt,
                    &fvd_store::FleetTry {
                        job_id: job_id.clone(),
                        proxy_token_sha256: launch.proxy_token.clone(),
                        tools_token_sha256: launch.tools_token.clone(),
                    },
                )
                .await?;
            job_id
        }
    };
    let job = crate::agent_job::FleetAttemptJob {
        job_id,
        family: family.clone(),
        component: spec.name.clone(),
        attempt,
        argv: launch.argv,
        env: launch.extra.into_iter().collect(),
        secret_env: a.env.clone(),
        placement,
        gpus: a.gpus(spec.gpus),
        timeout_ms: u64::try_from(a.timeout.as_millis()).unwrap_or(u64::MAX),
        base: head_before.to_string(),
        code_prefix: lp.worktree.prefix.clone(),
        repo: PathBuf::from(&st.args.repo),
        proxy: launch.proxy,
        tools: launch.tools,
        agent: fvd_store::model::AgentJob {
            packet,
            packet_on_stdin: launch.stdin.is_some(),
            files: launch.files,
            proxied: launch.proxy.is_some(),
            tools: launch.tools.is_some(),
            commit_message: format!("fvd: {} attempt {attempt}", spec.name),
        },
        span: launch.span.clone(),
        adopt: launch.adopt.is_some(),
    };
    let (end, stopped) = crate::agent_job::run(&st.args.scheduler, attempts, job, stop).await?;
    let (report, worker_id) = match end {
        crate::agent_job::FleetEnd::Finished { report, worker_id } => (report, worker_id),
        crate::agent_job::FleetEnd::Lost(why) => {
            return Ok(AgentRun {
                exit: agent::AgentExit {
                    stopped,
                    ..Default::default()
                },
                handoff_text: None,
                fleet: None,
                environment: Some(format!("the attempt ran on no worker: {why}")),
                not_adopted: None,
            });
        }
        crate::agent_job::FleetEnd::NotAdopted(why) => {
            return Ok(AgentRun {
                exit: agent::AgentExit::default(),
                handoff_text: None,
                fleet: None,
                environment: None,
                not_adopted: Some(why),
            });
        }
    };
    let exit = crate::agent_job::exit_of(&report, stopped);
    // The record of the run, as a host run leaves it beside the packet.
    let _ = std::fs::write(files.dir.join("agent.stdout"), &exit.stdout);
    let _ = std::fs::write(files.dir.join("worker"), &worker_id);
    match crate::agent_job::outcome_of(&report) {
        Ok(out) => Ok(AgentRun {
            handoff_text: (!out.handoff.is_empty()).then(|| out.handoff.clone()),
            fleet: Some(FleetCommit {
                sha: out.commit.clone(),
                pack: out.pack.clone(),
                worker_id,
                refused: (!out.refused.is_empty()).then(|| out.refused.clone()),
            }),
            exit,
            environment: None,
            not_adopted: None,
        }),
        Err(why) => Ok(AgentRun {
            exit,
            handoff_text: None,
            fleet: None,
            environment: Some(format!("worker {worker_id}: {why}")),
            not_adopted: None,
        }),
    }
}

/// The label a worker carries for each agent CLI it has
/// (`fvd.agent.claude-code = "yes"`): an attempt of a preset goes only to
/// a worker that has its CLI.
pub const AGENT_LABEL_PREFIX: &str = "fvd.agent.";

/// The GenAI semantic conventions' provider name of an API.
fn provider_name(api: fvd_spec::agent_model::ModelApi) -> &'static str {
    use fvd_spec::agent_model::ModelApi;
    match api {
        ModelApi::Anthropic => "anthropic",
        ModelApi::OpenAiChat | ModelApi::OpenAiResponses => "openai",
        ModelApi::Gemini => "gcp.gemini",
    }
}

/// What an agent left: its commit, how it ended, its handoff, and the
/// worker it ran on (empty: this host).
struct AgentDone<'a> {
    commit: worktree::Commit,
    exit: &'a agent::AgentExit,
    handoff: &'a agent::HandoffRead,
    worker_id: String,
    /// Its commit was refused (over a limit on what an attempt brings
    /// back): why, in one line; `commit` is then the base.
    refused: Option<String>,
}

/// The attempt's ledger row as the agent left it.
fn attempt_row(st: &ComponentState, attempt: u32, done: AgentDone<'_>) -> AttemptRow {
    let AgentDone {
        commit,
        exit,
        handoff,
        worker_id,
        refused: _,
    } = done;
    AttemptRow {
        worker_id,
        family: st.args.family.clone(),
        component: st.args.spec.name.clone(),
        attempt,
        commit_sha: commit.sha,
        diff_stat: commit.stat,
        diff: commit.diff,
        exit_code: exit.exit_code,
        signal: exit.signal,
        timed_out: exit.timed_out,
        duration_ms: exit.duration_ms,
        handoff_status: handoff.status,
        handoff_summary: handoff.summary.clone(),
        handoff_text: handoff.text.clone(),
        finished_ms: now_ms(),
        ..AttemptRow::default()
    }
}

/// Records the attempt together with what it leads to, in one commit:
/// blocked (the agent could not start, asked for a conversion retry, or
/// returned a blocker), parked on its question (raised under a fresh
/// `E###` id), or the parity test queued on its commit. A crash after the
/// ledger row and before the question or the run cannot happen: both or
/// neither are in the store.
#[allow(clippy::too_many_arguments)]
async fn after_agent(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    turn: &Turn<'_>,
    worker_id: &str,
    done: AgentDone<'_>,
    answered: bool,
) -> Result<(), ActorProcessingErr> {
    let (attempt, result) = (turn.attempt, turn.result);
    let (exit, handoff) = (done.exit, done.handoff);
    let refused = done.refused.clone();
    let mut row = attempt_row(st, attempt, done);
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
    use std::time::Duration;

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

    #[test]
    fn agent_files_stay_under_the_agent_folder() {
        let repo = Path::new("/r");
        assert_eq!(
            agent_dir(repo, "p", "c").unwrap(),
            Path::new("/r/.fvd/agent/p/c")
        );
        for name in ["../../../etc", "/tmp/x", "a/../.."] {
            assert!(agent_dir(repo, "p", name).is_err(), "{name}");
        }
    }

    fn agent() -> fvd_spec::AgentSpec {
        fvd_spec::AgentSpec {
            command: vec!["a".into()],
            timeout: Duration::from_secs(60),
            env: vec![],
            max_attempts: 3,
            max_wall: Some(Duration::from_secs(600)),
            max_gpu_s: Some(100),
            cleanup: Default::default(),
            preset: None,
            extra_args: vec![],
            model: None,
            gpus: Default::default(),
        }
    }

    #[test]
    fn each_budget_stops_the_loop_when_spent_and_not_before() {
        let a = agent();
        let fresh = Spent {
            attempts: 2,
            first_queued_ms: Some(1_000),
            gpu_ms: 99_999,
            now_ms: 1_000 + 599_999,
            model_component: Default::default(),
            model_port: Default::default(),
        };
        assert_eq!(budget_spent(&a, &fresh), None);
        let s = Spent {
            attempts: 3,
            ..fresh
        };
        assert_eq!(
            budget_spent(&a, &s).as_deref(),
            Some("agent budget spent: 3 of 3 attempts")
        );
        let s = Spent {
            now_ms: 1_000 + 600_000,
            ..fresh
        };
        assert_eq!(
            budget_spent(&a, &s).as_deref(),
            Some("agent budget spent: wall time 600 s of 600 s")
        );
        let s = Spent {
            gpu_ms: 100_000,
            ..fresh
        };
        assert_eq!(
            budget_spent(&a, &s).as_deref(),
            Some("agent budget spent: 100.0 of 100 GPU-seconds")
        );
        // No limits: only attempts count.
        let open = fvd_spec::AgentSpec {
            max_wall: None,
            max_gpu_s: None,
            ..agent()
        };
        let s = Spent {
            gpu_ms: u64::MAX / 2,
            now_ms: i64::MAX / 2,
            ..fresh
        };
        assert_eq!(budget_spent(&open, &s), None);
    }

    #[test]
    fn model_budgets_block_when_spent_and_an_attempt_gets_what_is_left() {
        use fvd_spec::agent_model::{AgentBudget, ModelApi, ModelSpec};
        use fvd_store::usage::Spend;
        let budget = AgentBudget {
            usd_per_attempt: Some(2.0),
            usd_per_component: Some(5.0),
            usd_per_port: Some(9.0),
            tokens_per_component: Some(1_000),
            ..AgentBudget::default()
        };
        let a = fvd_spec::AgentSpec {
            model: Some(ModelSpec {
                api: ModelApi::Anthropic,
                model: "claude-sonnet-4-5".into(),
                key_env: "ANTHROPIC_API_KEY".into(),
                max_turns: None,
                budget,
                prices: Default::default(),
            }),
            max_wall: None,
            max_gpu_s: None,
            ..agent()
        };
        let s = |c: (f64, u64), p: (f64, u64)| Spent {
            attempts: 0,
            first_queued_ms: None,
            gpu_ms: 0,
            now_ms: 0,
            model_component: Spend {
                usd: c.0,
                tokens: c.1,
            },
            model_port: Spend {
                usd: p.0,
                tokens: p.1,
            },
        };
        // Plenty left: the attempt's own cap; the component's tokens.
        let fresh = s((1.0, 100), (1.0, 100));
        assert_eq!(budget_spent(&a, &fresh), None);
        let none = Spend::default();
        let left = allowance(&budget, &fresh, none);
        assert_eq!((left.usd, left.tokens), (Some(2.0), Some(900)));
        // A try of an attempt after a crash, or one adopted, has what its
        // earlier tries left of the attempt's cap.
        let earlier = Spend {
            usd: 1.5,
            tokens: 50,
        };
        let left = allowance(&budget, &fresh, earlier);
        assert_eq!((left.usd, left.tokens), (Some(0.5), Some(900)));
        // Less left of the component than an attempt may spend.
        let left = allowance(&budget, &s((4.5, 100), (4.5, 100)), none);
        assert_eq!(left.usd, Some(0.5));
        // The port's other components spent most of its budget.
        let left = allowance(&budget, &s((1.0, 100), (8.75, 100)), none);
        assert_eq!(left.usd, Some(0.25));
        assert_eq!(
            budget_spent(&a, &s((5.0, 10), (5.0, 10))).as_deref(),
            Some("agent budget spent: 5.0000 of 5 USD for the component")
        );
        assert_eq!(
            budget_spent(&a, &s((1.0, 10), (9.5, 10))).as_deref(),
            Some("agent budget spent: 9.5000 of 9 USD for the port")
        );
        assert_eq!(
            budget_spent(&a, &s((1.0, 1_000), (1.0, 1_000))).as_deref(),
            Some("agent budget spent: 1000 of 1000 tokens for the component")
        );
    }
}
