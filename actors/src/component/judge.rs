//! A changed judge is a person's question (issue #39), the component's
//! side. An attempt's run always judges its code by the port's own judge
//! ([`fvd_workspace::judge::pin`]); when the attempt changed that judge,
//! the run's verdict is recorded together with a question
//! ([`crate::judge_question`]) and the component waits in `ask_user`. The
//! answer is acted on here: approved, the branch becomes the attempt's code
//! and then the judge change as its own commit authored by the person, and
//! that commit is run; rejected, the branch becomes the code alone, and the
//! component goes on from the run that already judged it (an agent turn
//! whose packet says why, or a confirming run of a pass).

use fvd_store::messages::JobReport;
use fvd_store::model::{JobRecord, JobResult, JobState};
use fvd_store::states::{AttemptState, EscapeAbout, EscapeStatus};
use fvd_store::{ComponentNext, EscapeRow, JudgeNext, VerdictNext, VerdictRecorded};
use fvd_workspace::judge::{self as pinning, Decision};

use super::*;
use crate::judge_question::{self, Changed};

/// The commit whose judge the component's runs keep: the latest judge
/// change a person approved that the branch at `head` still holds, else
/// the port's own commit.
pub(super) async fn base(
    st: &ComponentState,
    dir: &Path,
    head: &str,
) -> Result<String, ActorProcessingErr> {
    let approved: Vec<String> = judge_escapes(st)
        .await?
        .into_iter()
        .filter(|e| !e.judge_commit.is_empty())
        .map(|e| e.judge_commit)
        .collect();
    for commit in approved.iter().rev() {
        if pinning::is_ancestor(dir, commit, head).await {
            return Ok(commit.clone());
        }
    }
    Ok(st.args.code.commit.clone())
}

/// The component's judge questions, oldest first.
async fn judge_escapes(st: &ComponentState) -> Result<Vec<EscapeRow>, ActorProcessingErr> {
    escapes_where(st, |e| e.about == EscapeAbout::Judge).await
}

/// The component's judge questions a person decided since the port was
/// last started over, for the agent's packet.
pub(super) async fn decided_since_reset(
    st: &ComponentState,
) -> Result<Vec<EscapeRow>, ActorProcessingErr> {
    let since = st.args.store.reset_ms(&st.args.family).await?;
    Ok(judge_escapes(st)
        .await?
        .into_iter()
        .filter(|e| e.status == EscapeStatus::Resolved && e.asked_ms >= since)
        .collect())
}

/// The question run `job_id` raises: the component's latest attempt
/// changed its judge, the run came after it, and no question about that
/// attempt is asked or decided yet (one withdrawn by a rerun is asked
/// again).
pub(super) async fn question(
    st: &ComponentState,
    job_id: &str,
    verdict: RecordedVerdict,
) -> Result<Option<EscapeRow>, ActorProcessingErr> {
    if st.agent.is_none() {
        return Ok(None);
    }
    let (family, name) = (&st.args.family, &st.args.spec.name);
    let ledger = st.args.store.attempts(family, name).await?;
    let Some(a) = ledger
        .iter()
        .rev()
        .find(|a| a.state == AttemptState::Recorded)
        .filter(|a| !a.judge_changed.is_empty())
    else {
        return Ok(None);
    };
    let jobs = st.args.store.jobs_of(family, name).await?;
    let after = jobs
        .iter()
        .find(|j| j.job_id == job_id)
        .is_some_and(|j| j.queued_ms >= a.finished_ms);
    if !after {
        return Ok(None);
    }
    let asked = judge_escapes(st)
        .await?
        .iter()
        .any(|e| e.attempt == a.attempt && e.status != EscapeStatus::Withdrawn);
    if asked {
        return Ok(None);
    }
    let mut e = judge_question::escape(&Changed {
        family,
        component: name,
        attempt: a.attempt,
        paths: &a.judge_changed,
        diff: &a.judge_diff,
        verdict,
    });
    // The quoted lines come from the agent's patch: no token value may
    // reach the store or PORT_STATUS.md through them.
    if let Some(spec) = &st.args.spec.agent {
        e.question = st.args.agents.redactor(&spec.env).text(&e.question);
    }
    Ok(Some(e))
}

/// Records run `report`'s verdict with the judge question `escape` in one
/// commit; the component waits for the answer and the gate pauses the port
/// once nothing else runs.
#[allow(clippy::too_many_arguments)]
pub(super) async fn ask(
    st: &mut ComponentState,
    report: &JobReport,
    worker_id: &str,
    v: &Verdict,
    result: &JobResult,
    escape: &EscapeRow,
    attempt_gpu_ms: Option<u64>,
) -> Result<(), ActorProcessingErr> {
    if let Err(why) = st.args.fvd.check() {
        tracing::warn!(job = %report.job_id, %why, "the verdict is not recorded: the port stops");
        return Ok(());
    }
    let floor = crate::port_status::escape_floor(&st.args.store, &st.args.family)
        .await
        .unwrap_or(0);
    let then = VerdictNext::Ask {
        escape,
        floor,
        worker_id,
    };
    let id = match st
        .args
        .store
        .record_verdict_then(
            &report.job_id,
            report.lease_epoch,
            result,
            then,
            attempt_gpu_ms,
        )
        .await?
    {
        VerdictRecorded::Asked(id) => id,
        VerdictRecorded::Stale | VerdictRecorded::Set => {
            tracing::warn!(job = %report.job_id, "result for a job no longer running under this lease was rejected");
            return Ok(());
        }
    };
    fvd_store::chaos::crash_point("verdict-committed");
    // The run's own span carries the question; it ends with the verdict.
    spans::judge_change(&st.attempt, escape.attempt, &id, "asked");
    note_verdict(st, report, v, result).await?;
    tracing::warn!(family = %st.args.family, component = %st.args.spec.name, attempt = escape.attempt, %id, "an attempt changed the component's judge: a person approves or rejects it");
    emit(st).await?;
    if let Err(e) = crate::port_status::write(&st.args.store, &st.args.family).await {
        tracing::error!(family = %st.args.family, error = %e, "could not write PORT_STATUS.md");
    }
    let row = current(st).await?;
    st.args.gate.cast(GateMsg::ComponentAsks(row))?;
    Ok(())
}

/// Acts on a person's answer in the worktree `wt`: the attempt's code
/// kept with the port's judge (rejected), or with the changed judge
/// (approved), committed by fvd, and the branch moved there. The new head,
/// or why it could not be done.
async fn move_branch(
    wt: &Path,
    e: &EscapeRow,
    a: &fvd_store::AttemptRow,
    asked_commit: &str,
    said: &judge_question::JudgeAnswer,
) -> Result<String, String> {
    let decision = if said.approve {
        Decision::Approved {
            by: judge_question::approver(e),
        }
    } else {
        Decision::Rejected
    };
    let head = pinning::decide(
        wt,
        &a.head_before,
        &a.commit_sha,
        asked_commit,
        decision,
        &judge_question::code_message(e, said.approve),
        &judge_question::approved_message(e, &a.judge_changed, &said.why),
    )
    .await
    .map_err(|err| format!("error: cannot act on {}: {err}", e.id))?;
    worktree::reset(wt, &head).await.map_err(|err| {
        format!(
            "error: cannot move the branch to {} after {}: {err}",
            &head[..head.len().min(12)],
            e.id
        )
    })?;
    Ok(head)
}

/// Acts on the answer to judge question `e` (see the module doc).
pub(super) async fn answered(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    e: EscapeRow,
) -> Result<(), ActorProcessingErr> {
    let (family, name) = (st.args.family.clone(), st.args.spec.name.clone());
    // The orchestrator takes no other answer; one that reads as neither
    // keeps the port's judge.
    let said = judge_question::answer(&e.answer).unwrap_or(judge_question::JudgeAnswer {
        approve: false,
        why: e.answer.clone(),
    });
    let ledger = st.args.store.attempts(&family, &name).await?;
    let Some(a) = ledger.iter().find(|a| a.attempt == e.attempt).cloned() else {
        let reason = format!(
            "error: {} asks about attempt {}, which the ledger does not hold",
            e.id, e.attempt
        );
        return block(st, RecordedVerdict::Error(None), &reason, "").await;
    };
    // The run the question was asked about tested the attempt's code with
    // the port's judge: its commit is that code.
    let jobs = st.args.store.jobs_of(&family, &name).await?;
    let Some(asked_run) = jobs
        .iter()
        .rev()
        .find(|j| j.state == JobState::Finished)
        .cloned()
    else {
        let reason = format!("error: {} has no run its question was asked about", e.id);
        return block(st, RecordedVerdict::Error(None), &reason, "").await;
    };
    let wt = super::agent_loop::agent_loop(st)?.worktree.path.clone();
    let head = match move_branch(&wt, &e, &a, &asked_run.commit, &said).await {
        Ok(h) => h,
        Err(reason) => return block(st, RecordedVerdict::Error(None), &reason, "").await,
    };
    let word = if said.approve { "approved" } else { "rejected" };
    spans::judge_change(&st.span, e.attempt, &e.id, word);
    tracing::info!(%family, component = %name, id = %e.id, attempt = e.attempt, by = %judge_question::approver(&e), head = %head, "judge change {word}");
    if said.approve {
        // The approved commit is run as it is: its judge is the person's.
        let job = job_at(st, head.clone());
        let queued = st
            .args
            .store
            .judge_decided(&family, &e.id, e.attempt, &head, JudgeNext::Test(&job))
            .await?
            .expect("a run was asked for");
        written(st).await;
        return queued_run(myself, st, queued).await;
    }
    let last = JobResult {
        verdict: asked_run.verdict,
        reason: asked_run.reason.clone(),
        output_tail: asked_run.output_tail.clone(),
        ..JobResult::default()
    };
    if last.verdict.is_pass() {
        // The code passed the port's judge: a run of the branch as it now
        // is confirms it.
        let job = job_record(st).await?;
        let queued = st
            .args
            .store
            .judge_decided(&family, &e.id, e.attempt, "", JudgeNext::Test(&job))
            .await?
            .expect("a run was asked for");
        written(st).await;
        return queued_run(myself, st, queued).await;
    }
    let plan = agent_plan(st, last.clone(), AttemptKind::Fix).await?;
    let next = ComponentNext {
        status: plan.status,
        verdict: plan.verdict,
        reason: &plan.reason,
        worker_id: "",
    };
    st.args
        .store
        .judge_decided(&family, &e.id, e.attempt, "", JudgeNext::Set(next))
        .await?;
    written(st).await;
    match plan.next {
        Next::Agent { from, kind } => {
            agent_attempt(myself, st, &asked_run.job_id, &from, "", kind).await
        }
        _ => {
            emit(st).await?;
            announce_final(st, plan.status, plan.verdict, &plan.reason).await
        }
    }
}

/// `PORT_STATUS.md` after a decision (its row now says who decided).
async fn written(st: &ComponentState) {
    if let Err(e) = crate::port_status::write(&st.args.store, &st.args.family).await {
        tracing::error!(family = %st.args.family, error = %e, "could not write PORT_STATUS.md");
    }
}

/// A run recorded as queued goes to the scheduler; watchers see it.
async fn queued_run(
    myself: &ActorRef<ComponentMsg>,
    st: &mut ComponentState,
    job: JobRecord,
) -> Result<(), ActorProcessingErr> {
    emit(st).await?;
    queued(myself, st, job).await
}

/// The approved judge changes the component's pass rests on, as one
/// clause for its reason (empty when none).
pub(super) async fn approved_note(st: &ComponentState) -> Result<String, ActorProcessingErr> {
    let ledger = st
        .args
        .store
        .attempts(&st.args.family, &st.args.spec.name)
        .await?;
    let notes: Vec<String> = judge_escapes(st)
        .await?
        .into_iter()
        .filter(|e| e.status == EscapeStatus::Resolved && !e.judge_commit.is_empty())
        .map(|e| {
            let paths = ledger
                .iter()
                .find(|a| a.attempt == e.attempt)
                .map(|a| a.judge_changed.join(", "))
                .unwrap_or_default();
            format!(
                "judge changed by attempt {} ({paths}), approved by {} ({})",
                e.attempt,
                judge_question::approver(&e),
                e.id
            )
        })
        .collect();
    Ok(if notes.is_empty() {
        String::new()
    } else {
        format!(" [{}]", notes.join("; "))
    })
}
