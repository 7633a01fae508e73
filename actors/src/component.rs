//! `ComponentSubagentActor`: one per component of a port. It asks the
//! scheduler for a run of the component's parity test, classifies the
//! result from its JUnit report and records it.
//!
//! A component without an `[agent]` ends as `blocked` on any verdict other
//! than `non_skip_pass`, with the precise reason (the failing assertion, the
//! skip reason, the collection error), as the parity contract asks. A
//! component with one loops: after a red run the coding agent runs in the
//! component's git worktree with the packet of [`crate::agent`], its work is
//! committed and recorded in the attempt ledger, and the parity test runs
//! again there, until a `non_skip_pass`, a blocker the agent returns, or
//! `max_attempts` spent (then `blocked` with the last verdict as evidence).
//! An `infra_error` is not an attempt: the job is retried on another slot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fvd_contracts::verdict::{self, JunitEvidence, RunEvidence, Verdict};
use fvd_telemetry::{metrics, spans};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::broadcast;
use tracing::Span;
use tracing::field::Empty;

use crate::agent::{self, LastRun};
use crate::gate::GateMsg;
use crate::model::{ComponentRow, JobRecord, JobReport, JobResult, PortEvent};
use crate::scheduler::{QueuedJob, SchedulerMsg};
use crate::spec::ComponentSpec;
use crate::store::{AttemptRow, Store, now_ms};
use crate::worktree::{self, Worktree};

/// How many infra errors reported by workers (CUDA init, lost GPU) a
/// component tolerates before it is blocked on infrastructure.
pub const MAX_INFRA_VERDICTS: u32 = 3;

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
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub gate: ActorRef<GateMsg>,
    pub events: broadcast::Sender<PortEvent>,
    /// The port's trace actor, when some component has `[component.trace]`.
    pub trace: Option<ActorRef<crate::trace_actor::TraceMsg>>,
}

#[derive(Debug)]
pub enum ComponentMsg {
    Leased {
        job_id: String,
        worker_id: String,
    },
    Started {
        job_id: String,
        worker_id: String,
    },
    Finished {
        report: JobReport,
        worker_id: String,
    },
    /// The queued job cannot be placed for now (`reason`), or can again
    /// (empty `reason`).
    Waiting {
        job_id: String,
        reason: String,
    },
    /// The worker running the job was lost; the scheduler requeued it
    /// unless `give_up`.
    WorkerLost {
        job_id: String,
        worker_id: String,
        give_up: bool,
    },
    /// The trace actor's answer to a red run handed to it: the run, back,
    /// and the investigation's one-line summary.
    Traced {
        report: JobReport,
        worker_id: String,
        summary: String,
    },
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
    last_verdict: Option<String>,
    /// The agent loop's state, for a component with an `[agent]`.
    agent: Option<AgentLoop>,
    /// The last run drilled down by the trace actor and its summary.
    traced: Option<(String, String)>,
}

/// What the agent loop of a component needs besides its spec.
#[derive(Debug)]
struct AgentLoop {
    worktree: Worktree,
    /// The port's prep fields, for the packet's `component_context`.
    prep: BTreeMap<String, String>,
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
            family = %args.family,
            component = %args.spec.name,
            gpus_needed = args.spec.gpus,
            status = Empty,
            verdict = Empty,
            reason = Empty,
        );
        Ok(ComponentState {
            args,
            job_id: None,
            infra_verdicts: 0,
            span,
            attempt: Span::none(),
            last_verdict: None,
            agent: None,
            traced: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        st: &mut ComponentState,
    ) -> Result<(), ActorProcessingErr> {
        let row = current(st).await?;
        if row.is_final() {
            // Recorded verdicts are not rerun on resume.
            st.span.record("status", row.status.as_str());
            st.span.record("verdict", row.verdict.as_str());
            st.span = Span::none();
            st.args.gate.cast(GateMsg::ComponentFinal(row))?;
            return Ok(());
        }
        if st.args.spec.agent.is_some() {
            match prepare_agent(st).await {
                Ok(l) => st.agent = Some(l),
                Err(e) => {
                    let reason = format!("error: agent loop cannot start: {e}");
                    return finish(st, "blocked", "error", &reason, "").await;
                }
            }
        }
        enqueue(&myself, st).await
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: ComponentMsg,
        st: &mut ComponentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ComponentMsg::Leased { job_id, worker_id } => {
                // The scheduler recorded `running` with the lease; only
                // watchers need telling.
                if st.job_id.as_deref() == Some(job_id.as_str()) {
                    tracing::debug!(%job_id, %worker_id, "job leased");
                    emit(st).await?;
                }
            }
            ComponentMsg::Started { job_id, worker_id } => {
                tracing::debug!(%job_id, %worker_id, "job process started");
            }
            ComponentMsg::Waiting { job_id, reason } => {
                if st.job_id.as_deref() == Some(job_id.as_str()) {
                    // Only while still queued: a lease recorded meanwhile wins.
                    st.args
                        .store
                        .set_queued_reason(&st.args.family, &st.args.spec.name, &reason)
                        .await?;
                    emit(st).await?;
                }
            }
            ComponentMsg::WorkerLost {
                job_id,
                worker_id,
                give_up,
            } => {
                if st.job_id.as_deref() != Some(job_id.as_str()) {
                    return Ok(());
                }
                if give_up {
                    let reason = format!("infra_error: worker {worker_id} lost on every retry");
                    finish(st, "blocked", "infra_error", &reason, &worker_id).await?;
                } else {
                    // The scheduler recorded the requeue; only watchers
                    // need telling.
                    emit(st).await?;
                }
            }
            ComponentMsg::Traced {
                report,
                worker_id,
                summary,
            } => {
                st.traced = Some((report.job_id.clone(), summary));
                myself.cast(ComponentMsg::Finished { report, worker_id })?;
            }
            ComponentMsg::Finished { report, worker_id } => {
                if st.job_id.as_deref() != Some(report.job_id.as_str()) {
                    return Ok(());
                }
                let v = classify(&report);
                // A red run is drilled down first; `Traced` brings it back.
                let traced = st.traced.as_ref();
                let v_str = v.status().as_str();
                if crate::trace_actor::hand_over(
                    &st.args, traced, v_str, &report, &worker_id, &myself, &st.span,
                ) {
                    return Ok(());
                }
                let result = JobResult {
                    verdict: v.status().as_str().to_string(),
                    reason: v.reason(),
                    exit_code: report.exit_code,
                    signal: report.signal,
                    duration_ms: report.duration_ms,
                    junit_xml: report.junit_xml.clone().unwrap_or_default(),
                    output_tail: report.output_tail.clone(),
                };
                if !st
                    .args
                    .store
                    .finish_job(&report.job_id, report.lease_epoch, &result)
                    .await?
                {
                    tracing::warn!(job = %report.job_id, "result for a job no longer running under this lease was rejected");
                    return Ok(());
                }
                st.job_id = None;
                let attempt = std::mem::replace(&mut st.attempt, Span::none());
                attempt.record("verdict", result.verdict.as_str());
                attempt.record("reason", result.reason.as_str());
                metrics::verdict(&st.args.family, &st.args.spec.name, &result.verdict);
                if let Some(prev) = st.last_verdict.replace(result.verdict.clone())
                    && prev != result.verdict
                {
                    let run = current(st).await?.runs;
                    spans::verdict_changed(&st.span, &prev, &result.verdict, run);
                }
                drop(attempt);
                if !report.survivors.is_empty() {
                    tracing::error!(job = %report.job_id, survivors = ?report.survivors, "processes of the job outlived it");
                }
                if st.agent.is_some() {
                    st.args
                        .store
                        .set_attempt_verdict(&report.job_id, &result.verdict, &result.reason)
                        .await?;
                }
                if v.is_infra() && st.infra_verdicts < MAX_INFRA_VERDICTS {
                    st.infra_verdicts += 1;
                    update(st, "queued", &result.verdict, &result.reason, &worker_id).await?;
                    return enqueue(&myself, st).await;
                }
                if !v.is_pass() && !v.is_infra() && st.agent.is_some() {
                    return agent_attempt(&myself, st, &report.job_id, &result, &worker_id).await;
                }
                let status = if v.is_pass() {
                    "non_skip_pass"
                } else {
                    "blocked"
                };
                let reason = if v.is_pass() {
                    result.reason.clone()
                } else {
                    let note = crate::trace_actor::note(st.traced.as_ref(), &report.job_id);
                    format!("{}: {note}{}", result.verdict, result.reason)
                };
                finish(st, status, &result.verdict, &reason, &worker_id).await?;
            }
        }
        Ok(())
    }
}

pub(crate) fn classify(report: &JobReport) -> Verdict {
    let junit = match (&report.junit_xml, report.junit_error.as_str()) {
        (Some(xml), _) => JunitEvidence::Xml(xml),
        (None, e) if e.contains("not written") || e.contains("missing") || e.is_empty() => {
            JunitEvidence::Missing { path: "junit.xml" }
        }
        (None, e) => JunitEvidence::Unreadable {
            path: "junit.xml",
            error: e,
        },
    };
    if !report.spawn_error.is_empty() {
        // The command never ran: as unusable as a pytest that rejected its
        // command line.
        return Verdict::Error {
            kind: verdict::ErrorKind::Pytest,
            detail: format!("could not start the test: {}", report.spawn_error),
        };
    }
    verdict::classify(&RunEvidence {
        junit,
        timed_out: report.timed_out,
        cancelled: report.cancelled,
        exit_code: report.exit_code,
        signal: report.signal,
        output_tail: &report.output_tail,
        worker_lost: false,
    })
}

async fn current(st: &ComponentState) -> Result<ComponentRow, ActorProcessingErr> {
    let rows = st.args.store.components(&st.args.family).await?;
    rows.into_iter()
        .find(|r| r.name == st.args.spec.name)
        .ok_or_else(|| format!("component {} has no row in the store", st.args.spec.name).into())
}

async fn enqueue(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
) -> Result<(), ActorProcessingErr> {
    let spec = &st.args.spec;
    let record = st
        .args
        .store
        .queue_job(&JobRecord {
            family: st.args.family.clone(),
            component: spec.name.clone(),
            argv: spec.argv(),
            // An agent component's runs test its worktree, not the checkout.
            cwd: match &st.agent {
                Some(l) => l.worktree.path.to_string_lossy().into_owned(),
                None => st.args.repo.clone(),
            },
            gpus_needed: spec.gpus,
            timeout_ms: spec.timeout.as_millis() as u64,
            ..JobRecord::default()
        })
        .await?;
    st.job_id = Some(record.job_id.clone());
    st.attempt = tracing::info_span!(
        parent: &st.span,
        "attempt",
        family = %st.args.family,
        component = %spec.name,
        attempt = record.run_no,
        job_id = %record.job_id,
        verdict = Empty,
        reason = Empty,
    );
    metrics::attempt(&st.args.family, &spec.name);
    emit(st).await?;
    let mut env = BTreeMap::new();
    env.insert("FVD_FAMILY".to_string(), st.args.family.clone());
    env.insert("FVD_COMPONENT".to_string(), spec.name.clone());
    env.insert("FVD_RUN".to_string(), record.run_no.to_string());
    st.args
        .scheduler
        .cast(SchedulerMsg::Enqueue(Box::new(QueuedJob {
            record,
            env,
            secret_env: spec.env.clone(),
            notify: myself.get_derived(),
            placement: spec.placement.clone(),
            span: st.attempt.clone(),
            collect_env: None,
        })))?;
    Ok(())
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
    let wt = worktree::ensure(repo, family, name, known)
        .await
        .map_err(|e| e.to_string())?;
    store
        .record_worktree(family, name, &wt)
        .await
        .map_err(|e| e.to_string())?;
    let port = store
        .port(family)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("port {family} has no row in the store"))?;
    let prep = crate::spec::parse(Path::new(&port.spec_path), &port.spec_toml)
        .map_err(|e| e.to_string())?
        .prep;
    let dir = repo.join(".fvd").join("agent").join(family).join(name);
    Ok(AgentLoop {
        worktree: wt,
        prep,
        dir,
    })
}

/// One turn of the agent loop after a red run `job_id`: spend an attempt
/// (agent, commit, ledger row) and queue the next run, or block when the
/// budget is spent or the agent returns a blocker.
async fn agent_attempt(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    job_id: &str,
    result: &JobResult,
    worker_id: &str,
) -> Result<(), ActorProcessingErr> {
    let spec = st.args.spec.clone();
    let family = st.args.family.clone();
    let a = spec.agent.clone().expect("only agent components loop");
    let ledger = st.args.store.attempts(&family, &spec.name).await?;
    let done = ledger.len() as u32;
    if done >= a.max_attempts {
        let reason = format!(
            "{}: {} (agent budget spent: {done} of {} attempts)",
            result.verdict, result.reason, a.max_attempts
        );
        return finish(st, "blocked", &result.verdict, &reason, worker_id).await;
    }
    let attempt = done + 1;
    update(
        st,
        "agent",
        &result.verdict,
        &format!(
            "agent attempt {attempt} of {} after {}",
            a.max_attempts, result.verdict
        ),
        worker_id,
    )
    .await?;
    let lp = st.agent.as_ref().expect("agent components have a loop");
    let dir = lp.dir.join(format!("attempt-{attempt}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let prompt_file = dir.join("prompt.md");
    let handoff_file = dir.join("handoff.txt");
    // A handoff left by a crashed earlier try must not pass for this one's.
    let _ = std::fs::remove_file(&handoff_file);
    let (prompt_s, handoff_s) = (
        prompt_file.to_string_lossy().into_owned(),
        handoff_file.to_string_lossy().into_owned(),
    );
    let last = LastRun {
        job_id,
        verdict: &result.verdict,
        reason: &result.reason,
        output_tail: &result.output_tail,
    };
    let text = agent::packet(&agent::Packet {
        family: &family,
        spec: &spec,
        prep: &lp.prep,
        attempt,
        max_attempts: a.max_attempts,
        last,
        ledger: &ledger,
        handoff_file: &handoff_s,
    });
    std::fs::write(&prompt_file, text)
        .map_err(|e| format!("cannot write {}: {e}", prompt_file.display()))?;
    let wt = lp.worktree.path.clone();
    let wt_s = wt.to_string_lossy().into_owned();
    let argv = a.argv(&crate::spec::AgentVars {
        prompt_file: &prompt_s,
        handoff_file: &handoff_s,
        worktree: &wt_s,
        family: &family,
        component: &spec.name,
        attempt,
    });
    let span = spans::agent_run(&st.span, &family, &spec.name, attempt, &argv[0]);
    let mut extra = vec![
        ("FVD_FAMILY".to_string(), family.clone()),
        ("FVD_COMPONENT".to_string(), spec.name.clone()),
        ("FVD_ATTEMPT".to_string(), attempt.to_string()),
        ("FVD_PROMPT_FILE".to_string(), prompt_s.clone()),
        ("FVD_HANDOFF_FILE".to_string(), handoff_s.clone()),
    ];
    if let Some(tp) = fvd_telemetry::traceparent(&span) {
        extra.push((fvd_telemetry::TRACEPARENT.to_string(), tp));
    }
    let started_ms = now_ms();
    let exit = agent::run(&argv, &wt, &a.env, &extra, a.timeout, &dir).await;
    let handoff_text = std::fs::read_to_string(&handoff_file).ok();
    let mut handoff = agent::read_handoff(&spec.name, handoff_text.as_deref(), &exit.stdout);
    if let Some(e) = &exit.spawn_error {
        handoff.summary = e.clone();
    }
    let outcome = agent::exit_text(exit.exit_code, exit.signal, exit.timed_out);
    span.record("outcome", outcome.as_str());
    if let Some(c) = exit.exit_code {
        span.record("exit_code", c);
    }
    drop(span);
    let commit = match worktree::commit(&wt, &format!("fvd: {} attempt {attempt}", spec.name)).await
    {
        Ok(c) => c,
        Err(e) => {
            let reason = format!(
                "{}: {} (agent attempt {attempt} could not be committed: {e})",
                result.verdict, result.reason
            );
            return finish(st, "blocked", &result.verdict, &reason, worker_id).await;
        }
    };
    st.args
        .store
        .record_attempt(&AttemptRow {
            family: family.clone(),
            component: spec.name.clone(),
            attempt,
            commit_sha: commit.sha,
            diff_stat: commit.stat,
            diff: commit.diff,
            exit_code: exit.exit_code,
            signal: exit.signal,
            timed_out: exit.timed_out,
            duration_ms: exit.duration_ms,
            job_before: job_id.to_string(),
            verdict_before: result.verdict.clone(),
            reason_before: result.reason.clone(),
            handoff_status: handoff.status.to_string(),
            handoff_summary: handoff.summary.clone(),
            handoff_text: handoff.text.clone(),
            started_ms,
            finished_ms: now_ms(),
            ..AttemptRow::default()
        })
        .await?;
    let stop = match (&exit.spawn_error, handoff.stop_reason()) {
        (Some(e), _) => Some(e.clone()),
        (None, s) => s,
    };
    if let Some(stop) = stop {
        let reason = format!(
            "{}: {} ({stop}, after agent attempt {attempt})",
            result.verdict, result.reason
        );
        return finish(st, "blocked", &result.verdict, &reason, worker_id).await;
    }
    // The port may have been cancelled while the agent ran.
    if current(st).await?.is_final() {
        return Ok(());
    }
    enqueue(myself, st).await?;
    if let Some(job) = &st.job_id {
        st.args
            .store
            .set_attempt_job(&family, &spec.name, attempt, job)
            .await?;
    }
    Ok(())
}

async fn update(
    st: &ComponentState,
    status: &str,
    verdict: &str,
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
    status: &str,
    verdict: &str,
    reason: &str,
    worker_id: &str,
) -> Result<(), ActorProcessingErr> {
    update(st, status, verdict, reason, worker_id).await?;
    st.span.record("status", status);
    st.span.record("verdict", verdict);
    st.span.record("reason", reason);
    // The component is final: its span ends (and is exported) now.
    st.attempt = Span::none();
    st.span = Span::none();
    let row = current(st).await?;
    st.args.gate.cast(GateMsg::ComponentFinal(row))?;
    Ok(())
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
