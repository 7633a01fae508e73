//! The component's side of its agent loop: where a started agent
//! component stands ([`resume`]), the turn a red run (or a refused pass)
//! leads to ([`agent_plan`], [`agent_turn`]: budgets checked, the attempt's
//! actor spawned), and what the attempt's end leads to ([`attempt_done`],
//! [`after_agent`]: recorded with its next step in one commit). The attempt
//! itself, from packet to commit, is [`crate::attempt`]'s.

use super::*;

/// An agent turn from `from`: `agent` with the turn's line, or the
/// component's end when a budget is spent.
pub(super) async fn agent_plan(
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

/// Where a started agent component stands, from the store: an attempt cut
/// off by a crash runs again (its leftovers ended, its worktree reset); a
/// question waits for its answer or goes on with it; an attempt recorded
/// but not yet tested gets its run; otherwise the parity test runs.
pub(super) async fn resume(
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
pub(super) async fn escapes_where(
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
pub(super) async fn answered(st: &ComponentState) -> Result<Vec<EscapeRow>, ActorProcessingErr> {
    escapes_where(st, |e| e.status == EscapeStatus::Answered).await
}

/// The next attempt after a person answered: it starts from the red run the
/// question was asked about, and its packet carries the answer.
pub(super) async fn after_answer(
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
pub(super) async fn last_result(
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

pub(super) async fn job_tail(
    st: &ComponentState,
    job_id: &str,
) -> Result<String, ActorProcessingErr> {
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
pub(super) async fn passes_in_a_row(st: &ComponentState) -> Result<u32, ActorProcessingErr> {
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
pub(super) async fn cleanup_findings(
    st: &ComponentState,
) -> Result<Option<Vec<String>>, ActorProcessingErr> {
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
pub(super) async fn agent_attempt(
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
pub(super) async fn agent_turn(
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
pub(super) fn agent_loop(st: &ComponentState) -> Result<&AgentLoop, ActorProcessingErr> {
    st.agent
        .as_ref()
        .ok_or_else(|| format!("component {} has no agent loop", st.args.spec.name).into())
}

/// The attempt's actor ended: what its agent left is recorded with what it
/// leads to, or the attempt starts again (a try no worker runs), or the
/// component waits for its environment, or blocks.
pub(super) async fn attempt_done(
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
pub(super) async fn agent_environment(
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
pub(super) enum TurnStart {
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

pub(super) async fn turn_start(
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
pub(super) async fn after_agent(
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
            // the pipeline's own agent asks at P7
            phase: match st.args.spec.stage {
                fvd_spec::Stage::Pipeline => fvd_contracts::phase::Phase::PipelineStagesAndVariants,
                _ => fvd_contracts::phase::Phase::ComponentParityDebug,
            }
            .id(),
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
