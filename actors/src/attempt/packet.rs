//! An attempt's packet: the prompt its agent reads (`attempt-N/prompt.md`,
//! written by [`fvd_workspace::agent::packet`]) with the run it starts
//! from, the ledger, the answers and the judge decisions, and the handoff
//! that carries a question the agent asked through its tools.

use std::path::PathBuf;

use fvd_store::model::JobResult;
use fvd_workspace::agent::{self, LastRun};
use ractor::ActorProcessingErr;

use super::launch::{HANDOFF_FILE, WORKDIR};
use super::{AttemptCtx, AttemptTurn};

/// The files of one attempt, under the component's agent folder.
pub(super) struct AttemptFiles {
    pub dir: PathBuf,
    pub prompt: String,
    pub handoff: String,
}

/// Writes the attempt's packet (`attempt-N/prompt.md`) and clears the
/// handoff file a crashed earlier try may have left.
pub(super) async fn write(
    cx: &AttemptCtx,
    turn: &AttemptTurn,
) -> Result<AttemptFiles, ActorProcessingErr> {
    let (family, spec) = (&cx.family, &cx.spec);
    let a = &cx.lp.agent;
    let floor = crate::port_status::escape_floor(&cx.store, family)
        .await
        .unwrap_or(0);
    let next_escape = cx.store.next_escape_id(family, floor).await?;
    // The trace of the run the attempt starts from: the component's own,
    // or the pipeline's when the pipeline sent the component back.
    let traced = match cx.store.job(&turn.job_id).await? {
        Some(j) if j.component != spec.name => j.component,
        _ => spec.name.clone(),
    };
    let trace = cx.store.latest_trace_summary(family, &traced).await?;
    // The variant table of exactly this red run, when it had one.
    let table = cx.store.variant_table(family, &spec.name).await?;
    let variants = (table.first().is_some_and(|r| r.red_job_id == turn.job_id))
        .then(|| crate::variant_table::table_text(&table));
    let lp = &cx.lp;
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
        job_id: &turn.job_id,
        verdict: turn.result.verdict,
        reason: &turn.result.reason,
        output_tail: &turn.result.output_tail,
    };
    // On the fleet, the worker knows its own paths and fills them in.
    let fleet = cx.fleet().is_some();
    let workdir = lp.worktree.workdir().to_string_lossy().into_owned();
    let text = agent::packet(&agent::Packet {
        family,
        spec,
        prep: &lp.prep,
        attempt: turn.attempt,
        budget_used: turn.used.attempts + 1,
        max_attempts: a.max_attempts,
        last,
        ledger: &turn.recorded,
        workdir: if fleet { WORKDIR } else { &workdir },
        handoff_file: if fleet { HANDOFF_FILE } else { &files.handoff },
        answers: &turn.answers,
        judge_decisions: &turn.judge_decisions,
        next_escape_id: &next_escape,
        trace: trace.as_deref(),
        variants: variants.as_deref(),
        pipeline: lp.pipeline.as_ref(),
    });
    std::fs::write(&prompt_file, text)
        .map_err(|e| format!("cannot write {}: {e}", prompt_file.display()))?;
    Ok(files)
}

/// The attempt's handoff with the question its agent asked through
/// `ask_user` as its escape hatch, under the id the question will get.
pub(super) async fn question_handoff(
    cx: &AttemptCtx,
    handoff: &agent::HandoffRead,
    q: &agent::AskedQuestion,
    result: &JobResult,
) -> Result<agent::HandoffRead, ActorProcessingErr> {
    let (family, spec) = (&cx.family, &cx.spec);
    let floor = crate::port_status::escape_floor(&cx.store, family)
        .await
        .unwrap_or(0);
    let escape_id = cx.store.next_escape_id(family, floor).await?;
    let files = handoff.files_changed();
    let lp = &cx.lp;
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
            pipeline_mode: lp.pipeline.as_ref().map(|_| agent::pipeline::mode(spec)),
        },
    ))
}
