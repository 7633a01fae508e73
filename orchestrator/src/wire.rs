//! The one place `PortService`'s generated types meet fvd's domain views:
//! `to_*` functions turn what [`crate::query`] returns into the messages the
//! server sends, `from_*` functions turn received messages back into those
//! views for the CLI. Both edges of the gRPC hop use this module, so a field
//! added to a view has exactly one place to travel.
//!
//! Invariants:
//! - No generated type is handed past this module: the handlers in
//!   [`crate::port_api`] and the CLI's remote source convert here and pass
//!   domain views on.
//! - No state word is taken on trust: a state a message carries that the
//!   domain does not know is a [`WireError`] naming the field and the word.
//!
//! (`WorkerService`'s messages are converted in `worker_api` and, on the
//! worker, its `client` and `attempt` modules, the two ends of the worker
//! stream.)

use std::path::PathBuf;

use fvd_proto::v1 as pb;
use fvd_store::dashboard::RunRow;
use fvd_store::model::{GateEventRow, Worktree};
use fvd_store::team::ActionRow;
use fvd_store::traces::TraceInvestigation;
use fvd_store::usage::{AttemptUsage, UsageTotals};
use fvd_store::variants::VariantRow;
use fvd_store::{AttemptRow, EscapeRow};

use crate::query::{
    ComponentSnapshot, Fleet, Gpu, Lease, Needs, PortSnapshot, Queue, Queued, Worker,
};

/// A message that does not map onto a domain view.
#[derive(Debug, thiserror::Error)]
#[error("the orchestrator sent {field} {value:?}, which this fvd does not know")]
pub struct WireError {
    /// `PortSnapshot.state`, `ComponentSnapshot.status`, `RunInfo.state`, …
    pub field: &'static str,
    pub value: String,
}

fn parse<T: std::str::FromStr>(field: &'static str, value: &str) -> Result<T, WireError> {
    value.parse().map_err(|_| WireError {
        field,
        value: value.to_string(),
    })
}

fn opt_ms(ms: i64) -> Option<i64> {
    (ms > 0).then_some(ms)
}

// ----- ports ------------------------------------------------------------------

pub fn to_snapshot(s: PortSnapshot) -> pb::PortSnapshot {
    pb::PortSnapshot {
        family: s.family,
        state: s.state.as_str().to_string(),
        phase: s.phase,
        components: s.components.into_iter().map(to_component).collect(),
        gate_events: s.gate_events.into_iter().map(to_gate).collect(),
        repo: s.repo,
        port_status_path: s.port_status_path,
        escapes: s.escapes.into_iter().map(to_escape).collect(),
        status_write_error: s.status_write_error,
        repo_identity: s.repo_identity,
        owner: s.owner,
        submitted_by: s.submitted_by,
        actions: s
            .actions
            .into_iter()
            .map(|a| pb::PortAction {
                action: a.action,
                actor: a.actor,
                detail: a.detail,
                at_ms: a.at_ms,
            })
            .collect(),
        pause_reason: s.pause_reason,
        agent_spend: s.agent_spend.as_ref().map(to_spend),
    }
}

pub fn from_snapshot(s: pb::PortSnapshot) -> Result<PortSnapshot, WireError> {
    let family = s.family;
    Ok(PortSnapshot {
        state: parse("PortSnapshot.state", &s.state)?,
        phase: s.phase,
        components: s
            .components
            .into_iter()
            .map(from_component)
            .collect::<Result<_, _>>()?,
        gate_events: s
            .gate_events
            .into_iter()
            .map(from_gate)
            .collect::<Result<_, _>>()?,
        repo: s.repo,
        port_status_path: s.port_status_path,
        escapes: s
            .escapes
            .into_iter()
            .map(|e| from_escape(&family, e))
            .collect::<Result<_, _>>()?,
        status_write_error: s.status_write_error,
        repo_identity: s.repo_identity,
        owner: s.owner,
        submitted_by: s.submitted_by,
        actions: s
            .actions
            .into_iter()
            .map(|a| ActionRow {
                family: family.clone(),
                action: a.action,
                actor: a.actor,
                detail: a.detail,
                at_ms: a.at_ms,
            })
            .collect(),
        pause_reason: s.pause_reason,
        agent_spend: s.agent_spend.as_ref().map(from_spend),
        family,
    })
}

pub fn to_component(c: ComponentSnapshot) -> pb::ComponentSnapshot {
    pb::ComponentSnapshot {
        name: c.name,
        status: c.status.as_str().to_string(),
        verdict: c.verdict.as_str().to_string(),
        reason: c.reason,
        runs: c.runs,
        last_run: c.last_run,
        worker_id: c.worker_id,
        variants: c.variants.into_iter().map(to_variant).collect(),
        agent_spend: c.agent_spend.as_ref().map(to_spend),
        updated_ms: c.updated_ms,
        run_started_ms: c.run_started_ms,
        run_finished_ms: c.run_finished_ms,
    }
}

pub fn from_component(c: pb::ComponentSnapshot) -> Result<ComponentSnapshot, WireError> {
    Ok(ComponentSnapshot {
        status: parse("ComponentSnapshot.status", &c.status)?,
        verdict: parse("ComponentSnapshot.verdict", &c.verdict)?,
        updated_ms: c.updated_ms,
        run_started_ms: c.run_started_ms,
        run_finished_ms: c.run_finished_ms,
        name: c.name,
        reason: c.reason,
        runs: c.runs,
        last_run: c.last_run,
        worker_id: c.worker_id,
        variants: c
            .variants
            .into_iter()
            .map(from_variant)
            .collect::<Result<_, _>>()?,
        agent_spend: c.agent_spend.as_ref().map(from_spend),
    })
}

pub fn to_spend(t: &UsageTotals) -> pb::AgentSpend {
    pb::AgentSpend {
        attempts: t.attempts,
        input_tokens: t.input_tokens,
        output_tokens: t.output_tokens,
        cache_read_tokens: t.cache_read_tokens,
        cache_write_tokens: t.cache_write_tokens,
        cost_usd: t.cost_usd,
        unpriced_tokens: t.unpriced_tokens,
        requests: t.requests,
    }
}

pub fn from_spend(a: &pb::AgentSpend) -> UsageTotals {
    UsageTotals {
        attempts: a.attempts,
        input_tokens: a.input_tokens,
        output_tokens: a.output_tokens,
        cache_read_tokens: a.cache_read_tokens,
        cache_write_tokens: a.cache_write_tokens,
        cost_usd: a.cost_usd,
        unpriced_tokens: a.unpriced_tokens,
        requests: a.requests,
    }
}

pub fn to_variant(r: VariantRow) -> pb::VariantRow {
    pb::VariantRow {
        name: r.name,
        env: r.env,
        state: r.state.as_str().into(),
        verdict: r.verdict.as_str().into(),
        reason: r.reason,
        first_divergence: r.first_divergence,
        stat: r.stat,
        drift: r.drift,
        finding: r.finding.as_str().into(),
        trace_error: r.trace_error,
        job_id: r.job_id,
        spawned_ms: r.spawned_ms.unwrap_or(0),
        finished_ms: r.job_finished_ms.or(r.finished_ms).unwrap_or(0),
    }
}

pub fn from_variant(r: pb::VariantRow) -> Result<VariantRow, WireError> {
    Ok(VariantRow {
        red_job_id: String::new(),
        state: parse("VariantRow.state", &r.state)?,
        verdict: parse("VariantRow.verdict", &r.verdict)?,
        finding: parse("VariantRow.finding", &r.finding)?,
        name: r.name,
        env: r.env,
        job_id: r.job_id,
        reason: r.reason,
        first_divergence: r.first_divergence,
        stat: r.stat,
        drift: r.drift,
        trace_error: r.trace_error,
        started_ms: 0,
        finished_ms: opt_ms(r.finished_ms),
        spawned_ms: opt_ms(r.spawned_ms),
        job_finished_ms: opt_ms(r.finished_ms),
    })
}

pub fn to_escape(e: EscapeRow) -> pb::EscapeHatch {
    pb::EscapeHatch {
        id: e.id,
        component: e.component,
        decision_type: e.decision_type,
        question: e.question,
        recommended: e.recommended,
        options: e.options,
        status: e.status.as_str().into(),
        answer: e.answer,
        attempt: e.attempt,
        answered_by: e.answered_by,
        about: e.about.as_str().into(),
        judge_commit: e.judge_commit,
    }
}

pub fn from_escape(family: &str, e: pb::EscapeHatch) -> Result<EscapeRow, WireError> {
    Ok(EscapeRow {
        status: parse("EscapeHatch.status", &e.status)?,
        family: family.to_string(),
        id: e.id,
        component: e.component,
        attempt: e.attempt,
        decision_type: e.decision_type,
        question: e.question,
        recommended: e.recommended,
        options: e.options,
        answer: e.answer,
        answered_by: e.answered_by,
        // A server from before judge questions sends none: the agent's.
        about: if e.about.is_empty() {
            Default::default()
        } else {
            parse("EscapeHatch.about", &e.about)?
        },
        judge_commit: e.judge_commit,
        ..EscapeRow::default()
    })
}

pub fn to_gate(g: GateEventRow) -> pb::GateEvent {
    pb::GateEvent {
        phase: g.phase,
        outcome: g.outcome.as_str().into(),
        conditions: g.conditions,
        at_ms: g.at_ms,
    }
}

pub fn from_gate(g: pb::GateEvent) -> Result<GateEventRow, WireError> {
    Ok(GateEventRow {
        outcome: parse("GateEvent.outcome", &g.outcome)?,
        phase: g.phase,
        conditions: g.conditions,
        at_ms: g.at_ms,
    })
}

// ----- watching ------------------------------------------------------------------

/// What a watch of a port delivers, as the CLI follows it.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    Component(ComponentSnapshot),
    Gate(GateEventRow),
    /// The port ended (or paused); its final snapshot.
    Finished(PortSnapshot),
}

pub fn to_event(family: &str, e: WatchEvent) -> pb::PortEvent {
    use pb::port_event::Event;
    pb::PortEvent {
        family: family.to_string(),
        event: Some(match e {
            WatchEvent::Component(c) => Event::Component(to_component(c)),
            WatchEvent::Gate(g) => Event::Gate(to_gate(g)),
            WatchEvent::Finished(s) => Event::Finished(to_snapshot(s)),
        }),
    }
}

/// `None` for an event this fvd does not know (a newer server's).
pub fn from_event(e: pb::PortEvent) -> Result<Option<WatchEvent>, WireError> {
    use pb::port_event::Event;
    Ok(match e.event {
        Some(Event::Component(c)) => Some(WatchEvent::Component(from_component(c)?)),
        Some(Event::Gate(g)) => Some(WatchEvent::Gate(from_gate(g)?)),
        Some(Event::Finished(s)) => Some(WatchEvent::Finished(from_snapshot(s)?)),
        None => None,
    })
}

// ----- runs ------------------------------------------------------------------------

pub fn to_run(r: RunRow) -> pb::RunInfo {
    pb::RunInfo {
        job_id: r.job_id,
        family: r.family,
        component: r.component,
        run_no: r.run_no,
        state: r.state.as_str().to_string(),
        worker_id: r.worker_id,
        gpus_needed: r.gpus_needed,
        gpus: r.gpus,
        verdict: r.verdict,
        reason: r.reason,
        exit_code: r.exit_code,
        duration_ms: r.duration_ms,
        queued_ms: r.queued_ms,
        started_ms: r.started_ms.unwrap_or(0),
        spawned_ms: r.spawned_ms.unwrap_or(0),
        finished_ms: r.finished_ms.unwrap_or(0),
        commit: r.commit,
        has_output: r.has_output,
        peak_gpu_mib: r.peak_gpu_mib,
    }
}

pub fn from_run(r: pb::RunInfo) -> Result<RunRow, WireError> {
    Ok(RunRow {
        state: parse("RunInfo.state", &r.state)?,
        job_id: r.job_id,
        family: r.family,
        component: r.component,
        run_no: r.run_no,
        worker_id: r.worker_id,
        gpus_needed: r.gpus_needed,
        gpus: r.gpus,
        verdict: r.verdict,
        reason: r.reason,
        exit_code: r.exit_code,
        duration_ms: r.duration_ms,
        queued_ms: r.queued_ms,
        started_ms: opt_ms(r.started_ms),
        spawned_ms: opt_ms(r.spawned_ms),
        finished_ms: opt_ms(r.finished_ms),
        commit: r.commit,
        has_output: r.has_output,
        peak_gpu_mib: r.peak_gpu_mib,
    })
}

// ----- agents and traces -------------------------------------------------------------

pub fn to_worktree(w: Worktree) -> pb::AgentWorktree {
    pb::AgentWorktree {
        path: w.path.display().to_string(),
        branch: w.branch,
        base_commit: w.base_commit,
    }
}

pub fn from_worktree(w: pb::AgentWorktree) -> Worktree {
    Worktree {
        path: PathBuf::from(w.path),
        branch: w.branch,
        base_commit: w.base_commit,
        prefix: String::new(),
    }
}

pub fn to_attempt(a: AttemptRow) -> pb::AgentAttempt {
    pb::AgentAttempt {
        attempt: a.attempt,
        kind: a.kind.as_str().into(),
        state: a.state.as_str().into(),
        tries: a.tries,
        commit_sha: a.commit_sha,
        diff_stat: a.diff_stat,
        diff: a.diff,
        exit_code: a.exit_code,
        signal: a.signal,
        timed_out: a.timed_out,
        duration_ms: a.duration_ms,
        job_before: a.job_before,
        verdict_before: a.verdict_before.as_str().into(),
        reason_before: a.reason_before,
        job_after: a.job_after,
        verdict_after: a.verdict_after.as_str().into(),
        reason_after: a.reason_after,
        handoff_status: a.handoff_status.as_str().into(),
        handoff_summary: a.handoff_summary,
        handoff_text: a.handoff_text,
        started_ms: a.started_ms,
        finished_ms: a.finished_ms,
        gpu_ms_after: a.gpu_ms_after,
        head_before: a.head_before,
        usage: a.usage.map(to_usage),
        worker_id: a.worker_id,
        judge_changed: a.judge_changed,
        judge_diff: a.judge_diff,
    }
}

/// The ledger row of a received attempt of `family`'s `component`.
pub fn from_attempt(
    family: &str,
    component: &str,
    a: pb::AgentAttempt,
) -> Result<AttemptRow, WireError> {
    Ok(AttemptRow {
        family: family.to_string(),
        component: component.to_string(),
        attempt: a.attempt,
        kind: parse("AgentAttempt.kind", &a.kind)?,
        state: parse("AgentAttempt.state", &a.state)?,
        verdict_before: parse("AgentAttempt.verdict_before", &a.verdict_before)?,
        verdict_after: parse("AgentAttempt.verdict_after", &a.verdict_after)?,
        handoff_status: parse("AgentAttempt.handoff_status", &a.handoff_status)?,
        tries: a.tries,
        commit_sha: a.commit_sha,
        diff_stat: a.diff_stat,
        diff: a.diff,
        exit_code: a.exit_code,
        signal: a.signal,
        timed_out: a.timed_out,
        duration_ms: a.duration_ms,
        job_before: a.job_before,
        reason_before: a.reason_before,
        job_after: a.job_after,
        reason_after: a.reason_after,
        handoff_summary: a.handoff_summary,
        handoff_text: a.handoff_text,
        started_ms: a.started_ms,
        finished_ms: a.finished_ms,
        gpu_ms_after: a.gpu_ms_after,
        head_before: a.head_before,
        cookie: String::new(),
        usage: a.usage.map(from_usage),
        worker_id: a.worker_id,
        judge_changed: a.judge_changed,
        judge_diff: a.judge_diff,
    })
}

fn to_usage(u: AttemptUsage) -> pb::AttemptUsage {
    pb::AttemptUsage {
        preset: u.preset,
        model: u.model,
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
        cost_usd: u.cost_usd,
        unpriced_tokens: u.unpriced_tokens,
        source: u.source,
        cost_source: u.cost_source,
        requests: u.requests,
        retries: u.retries,
        turns: u.turns,
        cli_cost_usd: u.cli_cost_usd,
        outcome: u.outcome,
        stop_reason: u.stop_reason,
        permission_denials: u.permission_denials,
        handoff_source: u.handoff_source,
    }
}

fn from_usage(u: pb::AttemptUsage) -> AttemptUsage {
    AttemptUsage {
        preset: u.preset,
        model: u.model,
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
        cache_write_tokens: u.cache_write_tokens,
        cost_usd: u.cost_usd,
        unpriced_tokens: u.unpriced_tokens,
        source: u.source,
        cost_source: u.cost_source,
        requests: u.requests,
        retries: u.retries,
        turns: u.turns,
        cli_cost_usd: u.cli_cost_usd,
        outcome: u.outcome,
        stop_reason: u.stop_reason,
        permission_denials: u.permission_denials,
        handoff_source: u.handoff_source,
    }
}

/// An investigation travels as its stored JSON (its reports are
/// `fvd_trace`'s own JSON; see `TraceReportResponse`).
pub fn to_investigation(inv: &TraceInvestigation) -> Result<pb::TraceReportResponse, String> {
    Ok(pb::TraceReportResponse {
        investigation_json: serde_json::to_string(inv)
            .map_err(|e| format!("cannot encode the investigation: {e}"))?,
    })
}

pub fn from_investigation(r: pb::TraceReportResponse) -> Result<TraceInvestigation, String> {
    serde_json::from_str(&r.investigation_json)
        .map_err(|e| format!("the orchestrator sent an investigation that does not parse: {e}"))
}

// ----- the fleet and the queue ---------------------------------------------------------

pub fn to_fleet(f: Fleet) -> pb::WorkersResponse {
    pb::WorkersResponse {
        live: f.live,
        now_ms: f.now_ms,
        workers: f
            .workers
            .into_iter()
            .map(|w| pb::WorkerInfo {
                free: match (w.free_gpus, w.free_cpu) {
                    (Some(gpus), Some(cpu)) => Some(pb::FreeSlots { gpus, cpu }),
                    _ => None,
                },
                worker_id: w.worker_id,
                host: w.host,
                gpus: w
                    .gpus
                    .into_iter()
                    .map(|g| pb::Gpu {
                        index: g.index,
                        uuid: String::new(),
                        name: g.name,
                        memory_mib: g.memory_mib,
                    })
                    .collect(),
                cpu_slots: w.cpu_slots,
                labels: w.labels.into_iter().collect(),
                provides: w.provides,
                last_seen_ms: w.last_seen_ms,
                draining: w.draining,
                jobs: w
                    .jobs
                    .into_iter()
                    .map(|j| pb::WorkerLease {
                        job_id: j.job_id,
                        family: j.family,
                        component: j.component,
                        run_no: j.run_no,
                        lease_epoch: j.lease_epoch,
                        gpus: j.gpus,
                        started_ms: j.started_ms.unwrap_or(0),
                        share_mib: j.share_mib,
                    })
                    .collect(),
            })
            .collect(),
    }
}

pub fn from_fleet(r: pb::WorkersResponse) -> Fleet {
    Fleet {
        live: r.live,
        now_ms: r.now_ms,
        workers: r
            .workers
            .into_iter()
            .map(|w| Worker {
                free_gpus: w.free.as_ref().map(|f| f.gpus.clone()),
                free_cpu: w.free.as_ref().map(|f| f.cpu),
                worker_id: w.worker_id,
                host: w.host,
                gpus: w
                    .gpus
                    .into_iter()
                    .map(|g| Gpu {
                        index: g.index,
                        name: g.name,
                        memory_mib: g.memory_mib,
                    })
                    .collect(),
                cpu_slots: w.cpu_slots,
                labels: w.labels.into_iter().collect(),
                provides: w.provides,
                last_seen_ms: w.last_seen_ms,
                draining: w.draining,
                jobs: w
                    .jobs
                    .into_iter()
                    .map(|j| Lease {
                        job_id: j.job_id,
                        family: j.family,
                        component: j.component,
                        run_no: j.run_no,
                        lease_epoch: j.lease_epoch,
                        gpus: j.gpus,
                        started_ms: opt_ms(j.started_ms),
                        share_mib: j.share_mib,
                    })
                    .collect(),
            })
            .collect(),
    }
}

pub fn to_queue(q: Queue) -> pb::QueueResponse {
    pb::QueueResponse {
        workers: q.workers.map(|n| n as u32),
        jobs: q
            .jobs
            .into_iter()
            .map(|j| pb::QueuedRun {
                job_id: j.job_id,
                family: j.family,
                component: j.component,
                run_no: j.run_no,
                queued_ms: j.queued_ms,
                gpus: j.needs.gpus,
                gpu_memory_mib: j.needs.gpu_memory_mib,
                labels: j.needs.labels.into_iter().collect(),
                worker_paths: j.needs.worker_paths,
                preflight: j.needs.preflight,
                waiting: j.waiting,
            })
            .collect(),
    }
}

pub fn from_queue(r: pb::QueueResponse) -> Queue {
    Queue {
        workers: r.workers.map(|n| n as usize),
        jobs: r
            .jobs
            .into_iter()
            .map(|j| Queued {
                job_id: j.job_id,
                family: j.family,
                component: j.component,
                run_no: j.run_no,
                queued_ms: j.queued_ms,
                needs: Needs {
                    gpus: j.gpus,
                    gpu_memory_mib: j.gpu_memory_mib,
                    labels: j.labels.into_iter().collect(),
                    worker_paths: j.worker_paths,
                    preflight: j.preflight,
                },
                waiting: j.waiting,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_store::model::{ComponentStatus, JobState, PortState};

    fn snapshot() -> PortSnapshot {
        PortSnapshot {
            family: "f".into(),
            state: PortState::AskUser,
            phase: "P6".into(),
            repo: "/r".into(),
            port_status_path: "/r/PORT_STATUS.md".into(),
            repo_identity: "path:/r".into(),
            owner: "ana".into(),
            submitted_by: "bo".into(),
            pause_reason: String::new(),
            status_write_error: String::new(),
            components: vec![ComponentSnapshot {
                name: "vae".into(),
                status: ComponentStatus::Blocked,
                verdict: fvd_store::model::RecordedVerdict::DebugRed,
                reason: "debug_red: off by one".into(),
                runs: 2,
                last_run: 3,
                worker_id: "w1".into(),
                updated_ms: 9,
                run_started_ms: Some(3),
                run_finished_ms: None,
                variants: Vec::new(),
                agent_spend: Some(UsageTotals {
                    attempts: 1,
                    cost_usd: 0.5,
                    ..UsageTotals::default()
                }),
            }],
            gate_events: vec![GateEventRow {
                phase: "P6".into(),
                outcome: fvd_store::states::GateOutcome::Entered,
                conditions: Vec::new(),
                at_ms: 7,
            }],
            escapes: vec![EscapeRow {
                family: "f".into(),
                id: "E001".into(),
                component: "vae".into(),
                options: vec!["a".into(), "b".into()],
                status: fvd_store::states::EscapeStatus::Open,
                ..EscapeRow::default()
            }],
            actions: vec![ActionRow {
                family: "f".into(),
                action: "submit".into(),
                actor: "ana".into(),
                detail: "abc".into(),
                at_ms: 3,
            }],
            agent_spend: None,
        }
    }

    #[test]
    fn a_snapshot_crosses_the_wire_and_back_unchanged() {
        let s = snapshot();
        assert_eq!(from_snapshot(to_snapshot(s.clone())).unwrap(), s);
    }

    #[test]
    fn an_unknown_state_word_is_an_error_naming_its_field() {
        let mut w = to_snapshot(snapshot());
        w.components[0].status = "exploded".into();
        let e = from_snapshot(w).unwrap_err();
        assert_eq!(e.field, "ComponentSnapshot.status");
        assert!(e.to_string().contains("\"exploded\""), "{e}");
        let mut r = to_run(RunRow::default());
        r.state = "gone".into();
        assert_eq!(from_run(r).unwrap_err().field, "RunInfo.state");
    }

    #[test]
    fn runs_fleets_and_queues_cross_the_wire_and_back_unchanged() {
        let run = RunRow {
            job_id: "f.vae#3".into(),
            family: "f".into(),
            component: "vae".into(),
            run_no: 3,
            state: JobState::Finished,
            gpus: vec![0, 1],
            started_ms: Some(5),
            finished_ms: Some(9),
            has_output: true,
            peak_gpu_mib: Some(3520),
            ..RunRow::default()
        };
        assert_eq!(from_run(to_run(run.clone())).unwrap(), run);
        let unknown = RunRow {
            peak_gpu_mib: None,
            ..run.clone()
        };
        assert_eq!(from_run(to_run(unknown.clone())).unwrap(), unknown);
        let fleet = Fleet {
            live: true,
            now_ms: 10,
            workers: vec![Worker {
                worker_id: "w1".into(),
                gpus: vec![Gpu {
                    index: 0,
                    name: "H100".into(),
                    memory_mib: 80_000,
                }],
                free_gpus: Some(vec![]),
                free_cpu: Some(1),
                jobs: vec![Lease {
                    job_id: "f.vae#3".into(),
                    started_ms: Some(5),
                    ..Lease::default()
                }],
                ..Worker::default()
            }],
        };
        assert_eq!(from_fleet(to_fleet(fleet.clone())), fleet);
        let queue = Queue {
            workers: Some(0),
            jobs: vec![Queued {
                job_id: "f.vae#4".into(),
                needs: Needs {
                    gpus: 2,
                    labels: [("pool".to_string(), "a".to_string())].into(),
                    preflight: true,
                    ..Needs::default()
                },
                ..Queued::default()
            }],
        };
        assert_eq!(from_queue(to_queue(queue.clone())), queue);
    }
}
