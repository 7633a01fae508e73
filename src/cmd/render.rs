//! How the port commands show the domain views they read: a port's
//! snapshot as text or JSON, its exit status, agent spend, a run's
//! outcome. One renderer for both sources (embedded state or orchestrator),
//! so `fvd status` reads the same either way.

use std::io::Write;

use fvd_orchestrator::query::{ComponentSnapshot, PortSnapshot};
use fvd_store::dashboard::RunRow;
use fvd_store::model::{ComponentStatus, JobState, PortState};
use fvd_store::states::{EscapeStatus, GateOutcome, VariantFinding};
use fvd_store::usage::UsageTotals;
use fvd_store::variants::VariantRow;

use super::exit::Exit;
use super::source::Target;

/// Prints a line on stdout; a reader that went away (`fvd submit | head`)
/// does not stop the port, which keeps running to its end.
pub fn say(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// How a port is shown: its snapshot and whether a reader of its embedded
/// state found that no process runs it although it is recorded running
/// (an `fvd submit` interrupted by Ctrl-C or a lost terminal).
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    pub snap: &'a PortSnapshot,
    pub interrupted: bool,
}

impl Shown<'_> {
    /// The port's state word (`interrupted` for an interrupted one).
    pub fn state(&self) -> &'static str {
        if self.interrupted {
            "interrupted"
        } else {
            self.snap.state.as_str()
        }
    }

    /// A component's status word and reason as shown: an interrupted
    /// port's unfinished components say how to resume it.
    fn component(&self, c: &ComponentSnapshot, target: &Target) -> (&'static str, String) {
        let unfinished = matches!(
            c.status,
            ComponentStatus::Running
                | ComponentStatus::Queued
                | ComponentStatus::Confirming
                | ComponentStatus::Pending
        );
        if self.interrupted && unfinished {
            (
                "interrupted",
                format!(
                    "interrupted: no fvd process runs it; `{}` resumes it",
                    resume_hint(self.snap, target)
                ),
            )
        } else {
            (c.status.as_str(), c.reason.clone())
        }
    }
}

/// `fvd submit --family F` with the target's flags.
pub fn resume_hint(s: &PortSnapshot, target: &Target) -> String {
    target.hint(
        std::path::Path::new(&s.repo),
        &["submit", "--family", &s.family],
    )
}

/// The answer hint of an open question: its recommended option (else the
/// first) with the target's flags, ready to paste.
pub fn answer_hint(s: &PortSnapshot, e: &fvd_store::EscapeRow, target: &Target) -> String {
    let option = e
        .options
        .iter()
        .position(|o| *o == e.recommended)
        .map_or(1, |i| i + 1)
        .to_string();
    target.hint(
        std::path::Path::new(&s.repo),
        &["answer", &s.family, &e.id, "--option", &option],
    )
}

/// What became of an attempt's judge change (issue #39), from its
/// question (`None`: not asked yet, its run has not come back).
pub fn judge_decision(e: Option<&fvd_store::EscapeRow>) -> String {
    let Some(e) = e else {
        return "not decided yet: a person is asked once its run comes back".to_string();
    };
    let by = if e.answered_by.is_empty() {
        String::new()
    } else {
        format!(" by {}", e.answered_by)
    };
    match e.status {
        EscapeStatus::Open => format!(
            "{} waits for a person: `fvd answer {} {} --option 1` approves, `--option 2` rejects",
            e.id, e.family, e.id
        ),
        EscapeStatus::Answered => format!("{} answered{by}, being acted on: {}", e.id, e.answer),
        EscapeStatus::Withdrawn => format!("{} withdrawn by a rerun", e.id),
        EscapeStatus::Resolved if e.judge_commit.is_empty() => {
            format!("{} rejected{by}: dropped from the branch", e.id)
        }
        EscapeStatus::Resolved => format!(
            "{} approved{by}: commit {} on the branch, authored by them",
            e.id,
            &e.judge_commit[..e.judge_commit.len().min(12)]
        ),
    }
}

/// 0 when every component is `non_skip_pass`, 3 when the port paused on
/// questions, 4 when it waits for a fixed environment (a worker's, or the
/// orchestrator's disk), 1 otherwise.
pub fn outcome(snap: &PortSnapshot) -> Exit {
    match snap.state {
        PortState::Environment => Exit::Environment,
        PortState::AskUser => Exit::AskUser,
        // A port waiting for a person (P8's config, P9's conversion, P11's
        // review) has steps the gate has not reached: pending, not findings.
        _ if !snap.components.is_empty()
            && snap.components.iter().all(|c| {
                c.status == ComponentStatus::NonSkipPass
                    || (snap.state == PortState::Waiting && c.status == ComponentStatus::Pending)
            }) =>
        {
            Exit::Success
        }
        _ => Exit::Findings,
    }
}

/// `fvd status --exit-status`: 0 while every port runs or has passed; else
/// the worst of 1 (blocked, failed, cancelled), 3 (waits for an answer)
/// and 4 (waits for an environment).
pub fn exit_status(ports: &[PortSnapshot]) -> Exit {
    let each: Vec<Exit> = ports
        .iter()
        .map(|p| {
            if p.state == PortState::Running {
                Exit::Success
            } else {
                outcome(p)
            }
        })
        .collect();
    [Exit::Findings, Exit::AskUser, Exit::Environment]
        .into_iter()
        .find(|e| each.contains(e))
        .unwrap_or(Exit::Success)
}

/// What a run's end means for `fvd logs --follow`: 0 a pass, 4 a run that
/// failed on its environment, 1 anything else that ended (a red run, a
/// skip, an error, a cut-off or unplaceable run, one that ran out of GPU
/// memory beside another and runs again alone); `None` while it may
/// still end.
pub fn run_exit(run: &RunRow) -> Option<Exit> {
    match run.state {
        JobState::Queued | JobState::Running => None,
        JobState::Finished if run.verdict == ComponentStatus::NonSkipPass.as_str() => {
            Some(Exit::Success)
        }
        JobState::Environment => Some(Exit::Environment),
        JobState::Finished | JobState::SharedOom | JobState::Unplaced | JobState::Abandoned => {
            Some(Exit::Findings)
        }
    }
}

/// The port, its components and open questions. Components that wait for
/// an environment are summed up by cause (one line per worker and cause,
/// not one blocker each). Open questions come first, each with a hint to
/// answer it that can be pasted as it is.
pub fn print_snapshot(shown: Shown<'_>, target: &Target) {
    let s = shown.snap;
    say(format_args!(
        "port {}: {} at {}",
        s.family,
        shown.state(),
        s.phase
    ));
    if !s.owner.is_empty() {
        let last = if s.submitted_by.is_empty() || s.submitted_by == s.owner {
            String::new()
        } else {
            format!(", last submitted by {}", s.submitted_by)
        };
        say(format_args!("  owner {}{last}", s.owner));
    }
    print_open_questions(s, target);
    // The gate's latest refusal: why a blocked port stopped where it did.
    if let Some(g) = s
        .current_gate()
        .iter()
        .rev()
        .find(|g| g.outcome == GateOutcome::Refused)
    {
        say(format_args!("  gate refused {}:", g.phase));
        for c in grouped_conditions(&g.conditions) {
            say(format_args!("    - {c}"));
        }
    }
    print_components(shown, target);
    if let Some(a) = &s.agent_spend {
        say(format_args!("  agents of the port: {}", spend_line(a)));
    }
    print_waiting_causes(s, target);
    for e in s
        .escapes
        .iter()
        .filter(|e| e.status != EscapeStatus::Open && !e.answered_by.is_empty())
    {
        say(format_args!(
            "  {} {} answered by {}: {}",
            e.id, e.component, e.answered_by, e.answer
        ));
    }
    // Where the file is; whether this command changed it is not known
    // here (`fvd status` writes nothing).
    if !s.port_status_path.is_empty() {
        say(format_args!("status file {}", s.port_status_path));
    }
}

/// The open questions, each with its options and a hint to answer it that
/// can be pasted as it is.
fn print_open_questions(s: &PortSnapshot, target: &Target) {
    for e in s.open_questions() {
        say(format_args!(
            "  {} {} asks ({}): {}",
            e.id, e.component, e.decision_type, e.question
        ));
        for (i, o) in e.options.iter().enumerate() {
            let rec = if *o == e.recommended {
                " (recommended)"
            } else {
                ""
            };
            say(format_args!("      {}. {o}{rec}", i + 1));
        }
        say(format_args!(
            "    answer: `{}`  (another --option N, or --text \"...\")",
            answer_hint(s, e, target)
        ));
    }
}

/// One line per component (status, runs, run time, reason), with its
/// variants and its agent's spend below it.
fn print_components(shown: Shown<'_>, target: &Target) {
    let s = shown.snap;
    for c in &s.components {
        let (status, reason) = shown.component(c, target);
        // a cause said for a group below is not repeated on each line
        let grouped_cause = c.status == ComponentStatus::Environment
            || (c.status == ComponentStatus::Blocked && c.reason.starts_with("unplaced: "));
        let reason = if grouped_cause {
            "(cause below)".to_string()
        } else {
            reason
        };
        say(format_args!(
            "  {:<16} {:<14} runs={}{} {}",
            c.name,
            status,
            c.runs,
            run_time(c, now_ms()),
            reason
        ));
        for v in &c.variants {
            say(format_args!("    {}", variant_line(v)));
        }
        if let Some(a) = &c.agent_spend {
            say(format_args!("    agent: {}", spend_line(a)));
        }
    }
}

/// The components that wait, summed up by cause: one line per worker and
/// cause, per agent that could not work, per cause that no machine here
/// meets; then why the port paused, or how to resume it once the
/// environment is fixed.
fn print_waiting_causes(s: &PortSnapshot, target: &Target) {
    // A component's agent whose model API refused its key (or kept
    // failing) waits too, for a different fix than a worker's.
    let (agents, workers): (Vec<_>, Vec<_>) = grouped(s, ComponentStatus::Environment, "")
        .into_iter()
        .partition(|(cause, _)| cause.starts_with("environment: agent attempt "));
    for (cause, names) in &workers {
        let n = names.len();
        say(format_args!(
            "{n} component{} could not run on {cause} ({})",
            if n == 1 { "" } else { "s" },
            names.join(", ")
        ));
    }
    for (cause, names) in &agents {
        say(format_args!(
            "{}: the agent could not work: {} (the attempt was not counted)",
            names.join(", "),
            cause.trim_start_matches("environment: ")
        ));
    }
    for (cause, names) in grouped(s, ComponentStatus::Blocked, "unplaced: ") {
        let n = names.len();
        say(format_args!(
            "{n} component{} cannot run on this machine: {cause} ({})",
            if n == 1 { "" } else { "s" },
            names.join(", ")
        ));
    }
    if !s.pause_reason.is_empty() {
        say(format_args!("  {}", s.pause_reason));
    } else if s.state == PortState::Environment && !workers.is_empty() {
        say(format_args!(
            "  fix the environment of that worker (or start one that has it) and run `{}` again: nothing was counted against the components",
            resume_hint(s, target)
        ));
    }
}

/// A refusal's conditions as the summary lists them, above the component
/// table: the blocked components in one line that names them and refers to
/// their lines below, where each one's reason is (issue #43: a reason of
/// 200-300 characters was said in full here and again in the table); any
/// other condition as it is.
pub fn grouped_conditions(conditions: &[String]) -> Vec<String> {
    let mut blocked: Vec<&str> = Vec::new();
    let mut others: Vec<String> = Vec::new();
    for c in conditions {
        match blocked_component(c) {
            Some(name) => blocked.push(name),
            None => others.push(c.clone()),
        }
    }
    let mut out = Vec::new();
    match blocked.as_slice() {
        [] => {}
        [one] => out.push(format!(
            "component {one} is blocked (its line below says why)"
        )),
        many => out.push(format!(
            "components {} are blocked (their lines below say why)",
            many.join(", ")
        )),
    }
    out.extend(others);
    out
}

/// The component a gate condition says is blocked, if that is all it says.
fn blocked_component(condition: &str) -> Option<&str> {
    condition
        .strip_prefix("component ")
        .and_then(|r| r.split_once(" is blocked ("))
        .map(|(name, _)| name)
}

/// One row of a component's variant table, under the component.
fn variant_line(v: &VariantRow) -> String {
    let mut line = format!("{:<14}", v.name);
    if !v.env.is_empty() {
        line.push_str(&format!(" {}", v.env.join(" ")));
    }
    let verdict = if v.verdict.is_none() {
        v.state.as_str()
    } else {
        v.verdict.as_str()
    };
    line.push_str(&format!("  {verdict}"));
    if !v.first_divergence.is_empty() {
        line.push_str(&format!(", first divergence {}", v.first_divergence));
        if let Some(d) = v.drift {
            line.push_str(&format!(" {} drift {d:.3}", v.stat));
        }
    }
    if !matches!(v.finding, VariantFinding::None | VariantFinding::Baseline)
        && v.finding.as_str() != verdict
    {
        line.push_str(&format!("  [{}]", v.finding));
    }
    line
}

/// Components of `status` whose reason starts with `prefix`, grouped by
/// the rest of it (the cause: `worker W: No module named 'torch'`, `needs 1
/// GPU; this machine has none: …`), causes in order of first appearance:
/// what the machine lacks is said once, not once per component.
fn grouped(s: &PortSnapshot, status: ComponentStatus, prefix: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for c in s.components.iter().filter(|c| c.status == status) {
        let Some(cause) = c.reason.strip_prefix(prefix) else {
            continue;
        };
        match out.iter_mut().find(|(known, _)| known == cause) {
            Some((_, names)) => names.push(c.name.clone()),
            None => out.push((cause.to_string(), vec![c.name.clone()])),
        }
    }
    out
}

/// `fvd status --json` of one port.
pub fn snapshot_json(shown: Shown<'_>, target: &Target) -> serde_json::Value {
    let s = shown.snap;
    serde_json::json!({
        "family": s.family,
        "state": shown.state(),
        "pause_reason": s.pause_reason,
        "phase": s.phase,
        "repo": s.repo,
        "repo_identity": s.repo_identity,
        "owner": s.owner,
        "submitted_by": s.submitted_by,
        "actions": s.actions.iter().map(|a| serde_json::json!({
            "action": a.action,
            "actor": a.actor,
            "detail": a.detail,
            "at_ms": a.at_ms,
        })).collect::<Vec<_>>(),
        "port_status_path": s.port_status_path,
        "components": s.components.iter().map(|c| {
            let (status, reason) = shown.component(c, target);
            let run_duration_ms = c
                .run_started_ms
                .zip(c.run_finished_ms)
                .map(|(s, f)| (f - s).max(0));
            serde_json::json!({
                "name": c.name,
                "status": status,
                "verdict": c.verdict.as_str(),
                "reason": reason,
                "runs": c.runs,
                "worker_id": c.worker_id,
                "updated_ms": c.updated_ms,
                "run_started_ms": c.run_started_ms,
                "run_finished_ms": c.run_finished_ms,
                "run_duration_ms": run_duration_ms,
                "variants": c.variants.iter().map(|v| serde_json::json!({
                    "name": v.name,
                    "env": v.env,
                    "state": v.state,
                    "verdict": v.verdict,
                    "reason": v.reason,
                    "first_divergence": v.first_divergence,
                    "stat": v.stat,
                    "drift": v.drift,
                    "finding": v.finding,
                    "trace_error": v.trace_error,
                    "job_id": v.job_id,
                    "spawned_ms": v.spawned_ms.unwrap_or(0),
                    "finished_ms": v.job_finished_ms.or(v.finished_ms).unwrap_or(0),
                })).collect::<Vec<_>>(),
                "agent_spend": c.agent_spend.as_ref().map(spend_json),
            })
        }).collect::<Vec<_>>(),
        "agent_spend": s.agent_spend.as_ref().map(spend_json),
        "escapes": s.escapes.iter().map(|e| serde_json::json!({
            "id": e.id,
            "component": e.component,
            "decision_type": e.decision_type,
            "question": e.question,
            "recommended": e.recommended,
            "options": e.options,
            "status": e.status,
            "answer": e.answer,
            "answered_by": e.answered_by,
            "attempt": e.attempt,
            "about": e.about,
            "judge_commit": e.judge_commit,
            "answer_command": (e.status == EscapeStatus::Open).then(|| answer_hint(s, e, target)),
        })).collect::<Vec<_>>(),
        "gate": s.gate_events.iter().map(|g| serde_json::json!({
            "phase": g.phase,
            "outcome": g.outcome,
            "conditions": g.conditions,
        })).collect::<Vec<_>>(),
    })
}

pub fn spend_line(a: &UsageTotals) -> String {
    let tokens = a.input_tokens + a.output_tokens + a.cache_read_tokens + a.cache_write_tokens;
    let mut line = format!(
        "{} attempt(s), {} request(s), {tokens} tokens, ${:.4}",
        a.attempts, a.requests, a.cost_usd
    );
    if a.unpriced_tokens > 0 {
        line.push_str(&format!(" (+{} tokens without a price)", a.unpriced_tokens));
    }
    line
}

fn spend_json(a: &UsageTotals) -> serde_json::Value {
    serde_json::json!({
        "attempts": a.attempts,
        "input_tokens": a.input_tokens,
        "output_tokens": a.output_tokens,
        "cache_read_tokens": a.cache_read_tokens,
        "cache_write_tokens": a.cache_write_tokens,
        "cost_usd": a.cost_usd,
        "unpriced_tokens": a.unpriced_tokens,
        "requests": a.requests,
    })
}

/// One attempt's model usage in a line: what it cost, from what, and how
/// it ended on the model side.
pub fn usage_line(u: &fvd_store::usage::AttemptUsage) -> String {
    let cost = match u.cost_usd {
        Some(c) => format!("${c:.4}"),
        None => "cost unknown (no price)".into(),
    };
    let mut parts = vec![
        format!(
            "{} {} via {}",
            if u.preset.is_empty() {
                "command"
            } else {
                &u.preset
            },
            u.model,
            u.source
        ),
        format!(
            "{} in + {} out tokens ({} cache read, {} cache write)",
            u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens
        ),
        cost,
        format!("{} request(s)", u.requests),
    ];
    if u.unpriced_tokens > 0 {
        parts.push(format!("{} tokens without a price", u.unpriced_tokens));
    }
    if u.retries > 0 {
        parts.push(format!("{} retried", u.retries));
    }
    if let Some(t) = u.turns {
        parts.push(format!("{t} turn(s)"));
    }
    if let Some(c) = u.cli_cost_usd {
        parts.push(format!("the CLI says ${c:.4}"));
    }
    let ended = if u.stop_reason.is_empty() {
        u.outcome.clone()
    } else {
        format!("{}: {}", u.outcome, u.stop_reason)
    };
    parts.push(ended);
    parts.join("; ")
}

/// The latest run's time: ` (0.8 s)` once it ended, ` (running 12 s)`
/// while it runs; nothing before it started.
fn run_time(c: &fvd_orchestrator::query::ComponentSnapshot, now: i64) -> String {
    let secs = |ms: i64| {
        let s = ms.max(0) as f64 / 1000.0;
        if s < 10.0 {
            format!("{s:.1} s")
        } else if s < 120.0 {
            format!("{s:.0} s")
        } else {
            format!("{:.0} min", s / 60.0)
        }
    };
    match (c.run_started_ms, c.run_finished_ms) {
        (Some(start), Some(end)) => format!(" ({})", secs(end - start)),
        (Some(start), None) => format!(" (running {})", secs(now - start)),
        _ => String::new(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_followed_run_exits_with_what_it_found() {
        let run = |state, verdict: &str| RunRow {
            state,
            verdict: verdict.into(),
            ..RunRow::default()
        };
        assert_eq!(run_exit(&run(JobState::Running, "")), None);
        assert_eq!(run_exit(&run(JobState::Queued, "")), None);
        assert_eq!(
            run_exit(&run(JobState::Finished, "non_skip_pass")),
            Some(Exit::Success)
        );
        assert_eq!(
            run_exit(&run(JobState::Finished, "debug_red")),
            Some(Exit::Findings)
        );
        assert_eq!(
            run_exit(&run(JobState::Finished, "scaffold_skip")),
            Some(Exit::Findings)
        );
        assert_eq!(
            run_exit(&run(JobState::Environment, "")),
            Some(Exit::Environment)
        );
        assert_eq!(
            run_exit(&run(JobState::Abandoned, "")),
            Some(Exit::Findings)
        );
    }
}
