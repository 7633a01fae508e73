//! Spans and span events shared across crates, so every process names
//! them and their attributes the same way.
//!
//! The port loop's own spans (`port`, `phase`, `component`, `attempt`,
//! `job`) are made where their work happens, in `fvd-actors` and
//! `fvd-worker`; this module holds the ones made in several places or
//! crates: agent runs (the component actor's agent loop), trace
//! comparisons (`fvd trace compare` and the trace actor's drill-down) and
//! their traced reruns ([`trace_step`]); the span events (verdict changes,
//! gate refusals, escape hatches, environment failures and waits, pauses);
//! and span statuses ([`failed`], [`succeeded`], [`job_ended`]).

use opentelemetry::trace::Status;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The span of one agent run on a component (e.g. a debugging attempt).
/// Start the agent process with [`crate::TRACEPARENT`] set from this span
/// so its own instrumentation joins the port's trace. Record the outcome
/// with `span.record("fvd.outcome", …)`.
pub fn agent_run(parent: &Span, family: &str, component: &str, attempt: u32, agent: &str) -> Span {
    tracing::info_span!(
        parent: parent,
        "agent_run",
        "fvd.family" = family,
        "fvd.component" = component,
        "fvd.attempt" = i64::from(attempt),
        "fvd.agent" = agent,
        "fvd.outcome" = Empty,
        "fvd.exit_code" = Empty,
        "gen_ai.operation.name" = Empty,
        "gen_ai.system" = Empty,
        "gen_ai.provider.name" = Empty,
        "gen_ai.request.model" = Empty,
        "gen_ai.usage.input_tokens" = Empty,
        "gen_ai.usage.output_tokens" = Empty,
        "fvd.agent.cost_usd" = Empty,
        "fvd.agent.requests" = Empty,
    )
}

/// What an agent run behind fvd's model proxy used, for [`agent_usage`].
#[derive(Debug, Clone, Copy)]
pub struct AgentUsage<'a> {
    /// `anthropic`, `openai`, `gcp.gemini`.
    pub provider: &'a str,
    pub model: &'a str,
    /// Every input token, cached or not (the conventions' count).
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: Option<f64>,
    pub requests: u32,
}

/// Records an agent run's usage on its [`agent_run`] span with the
/// OpenTelemetry GenAI semantic conventions' attribute names.
pub fn agent_usage(span: &Span, u: &AgentUsage<'_>) {
    span.record("gen_ai.operation.name", "invoke_agent");
    span.record("gen_ai.system", u.provider);
    span.record("gen_ai.provider.name", u.provider);
    span.record("gen_ai.request.model", u.model);
    span.record("gen_ai.usage.input_tokens", u.input_tokens as i64);
    span.record("gen_ai.usage.output_tokens", u.output_tokens as i64);
    if let Some(c) = u.cost_usd {
        span.record("fvd.agent.cost_usd", c);
    }
    span.record("fvd.agent.requests", i64::from(u.requests));
}

/// The span of one trace comparison (reference vs port activations);
/// `parent` may be `Span::none()` for a root (then continue a remote
/// context with [`crate::set_parent`]). Record the result with
/// [`first_divergence`].
pub fn trace_comparison(parent: &Span, family: &str, component: &str) -> Span {
    tracing::info_span!(
        parent: parent,
        "trace_comparison",
        "fvd.family" = family,
        "fvd.component" = component,
        "fvd.compared_rows" = Empty,
        "fvd.diverged" = Empty,
        "fvd.first_divergent_module" = Empty,
        "fvd.first_divergent_reference_module" = Empty,
        "fvd.first_divergent_stat" = Empty,
    )
}

/// The first divergence of a comparison, by name on both sides.
#[derive(Debug, Clone, Copy)]
pub struct Divergence<'a> {
    /// The port's module: what a blocked reason and `fvd trace show` name.
    pub port_module: &'a str,
    /// The same module in the reference's names (after renames).
    pub reference_module: &'a str,
    /// The stat that drifted.
    pub stat: &'a str,
}

/// Records a comparison's outcome on its span: how many rows (module ×
/// tensor × step) were compared and, if it diverged, the first divergent
/// module (in the reference's execution order) under the port's name
/// (`first_divergent_module`, as the blocked reason names it) and the
/// reference's, and the stat that drifted.
pub fn first_divergence(span: &Span, compared_rows: u64, first: Option<Divergence<'_>>) {
    span.record("fvd.compared_rows", compared_rows as i64);
    span.record("fvd.diverged", first.is_some());
    if let Some(d) = first {
        span.record("fvd.first_divergent_module", d.port_module);
        span.record("fvd.first_divergent_reference_module", d.reference_module);
        span.record("fvd.first_divergent_stat", d.stat);
    }
}

/// The span of one traced rerun of a red component (a step of its
/// drill-down): not an attempt of the component, so not named `attempt`.
/// `run` is the job's run number, `step` the drill-down step (1, 2, …).
pub fn trace_step(
    parent: &Span,
    family: &str,
    component: &str,
    step: u32,
    run: u32,
    job_id: &str,
) -> Span {
    tracing::info_span!(
        parent: parent,
        "trace_step",
        "fvd.family" = family,
        "fvd.component" = component,
        "fvd.step" = i64::from(step),
        "fvd.run" = i64::from(run),
        "fvd.job_id" = job_id,
    )
}

/// A component's verdict changed between two attempts.
pub fn verdict_changed(span: &Span, from: &str, to: &str, attempt: u32) {
    tracing::info!(parent: span, fvd.from = from, fvd.to = to, fvd.attempt = attempt, "verdict changed");
}

/// The gate refused a phase transition; `conditions` are the unmet
/// predicates as recorded (field names and reasons, never values).
pub fn gate_refused(span: &Span, phase: &str, conditions: &[String]) {
    tracing::info!(parent: span, fvd.phase = phase, fvd.conditions = ?conditions, "gate refused a transition");
}

/// An escape hatch: the workflow paused to ask the user. `hatch` is a
/// short kind (`ask_user`, a decision type), never the question's text.
pub fn escape_hatch(span: &Span, phase: &str, hatch: &str) {
    tracing::info!(parent: span, fvd.phase = phase, fvd.hatch = hatch, "escape hatch");
}

/// An agent's attempt changed what judges its component (issue #39):
/// `step` is `asked` (question `id` raised), `approved` or `rejected`. The
/// change itself is in the ledger, never on the span.
pub fn judge_change(span: &Span, attempt: u32, id: &str, step: &str) {
    tracing::info!(parent: span, fvd.attempt = attempt, fvd.id = id, fvd.judge = step, "judge change");
}

/// A run could not test the code because of its worker's environment (a
/// package not installed, pytest missing): the cause as classified from the
/// run's redacted output, never an environment variable's value.
pub fn environment_failure(span: &Span, worker_id: &str, cause: &str) {
    tracing::info!(parent: span, fvd.worker_id = worker_id, fvd.cause = cause, "environment failure");
    failed(span, &format!("environment: {cause}"));
}

/// A component waits for a worker whose environment can run it (every
/// worker that could take its run failed its environment).
pub fn environment_wait(span: &Span, phase: &str, component: &str) {
    tracing::info!(parent: span, fvd.phase = phase, fvd.component = component, "waits for an environment");
}

/// The port paused: `state` is `ask_user` or `environment`; it resumes
/// with `fvd answer` or a worker that can run what waits.
pub fn port_paused(span: &Span, phase: &str, state: &str) {
    span.record("fvd.state", state);
    span.record("fvd.phase", phase);
    tracing::info!(parent: span, fvd.phase = phase, fvd.state = state, "port paused");
}

/// The work of `span` failed: status ERROR with `message`, a verdict and
/// its redacted reason or a process's end (never an environment value).
/// Blocked components, red attempts, failed jobs, refused phases and
/// blocked ports are errors; trace viewers show them as such.
pub fn failed(span: &Span, message: &str) {
    span.set_status(Status::error(message.to_string()));
    span.set_attribute("error.type", error_type(message));
}

/// OpenTelemetry's `error.type` of a failure message: a low-cardinality
/// class, never the message. A verdict or state word that leads it
/// (`debug_red: …`, `blocked at P7`), how a process ended (`exit_code`,
/// `signal`, `timeout`), else `_OTHER` as the conventions say.
pub fn error_type(message: &str) -> String {
    let m = message.trim_start();
    if m.starts_with("exit code ") {
        return "exit_code".into();
    }
    if m.starts_with("ended by signal") {
        return "signal".into();
    }
    if m.starts_with("timed out") {
        return "timeout".into();
    }
    let word: String = m
        .chars()
        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
        .collect();
    let rest = &m[word.len()..];
    let leads = rest.is_empty() || rest.starts_with(':') || rest.starts_with(" at ");
    if !word.is_empty() && word.len() <= 32 && leads {
        word
    } else {
        "_OTHER".into()
    }
}

/// The work of `span` succeeded: status OK.
pub fn succeeded(span: &Span) {
    span.set_status(Status::Ok);
}

/// How a job's process ended, as its report says.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobEnd<'a> {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    /// Why the process did not run (a spawn or preflight failure); empty
    /// when it ran.
    pub error: &'a str,
}

impl JobEnd<'_> {
    /// Why the job failed, or `None` when it exited 0 or was cancelled
    /// (a cancelled job is neither a pass nor a failure of its code).
    pub fn failure(&self) -> Option<String> {
        if !self.error.is_empty() {
            return Some(self.error.to_string());
        }
        if self.cancelled {
            return None;
        }
        if self.timed_out {
            return Some("timed out".into());
        }
        match (self.exit_code, self.signal) {
            (_, Some(s)) => Some(format!("ended by signal {s}")),
            (Some(0), None) => None,
            (Some(c), None) => Some(format!("exit code {c}")),
            (None, None) => Some("ended without an exit code".into()),
        }
    }
}

/// Sets the status of a `job` or `job.run` span from how its process ended:
/// ERROR with the failure, OK on exit 0, unset when cancelled.
pub fn job_ended(span: &Span, end: &JobEnd<'_>) {
    match end.failure() {
        Some(why) => failed(span, &why),
        None if !end.cancelled => succeeded(span),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_type_is_a_class_never_the_message() {
        for (m, t) in [
            ("debug_red: t::x: AssertionError: off by 0.5", "debug_red"),
            ("blocked at P7", "blocked"),
            ("error:collection: t.py: SyntaxError", "error"),
            ("exit code 1", "exit_code"),
            ("ended by signal 9", "signal"),
            ("timed out", "timeout"),
            ("preflight `x` could not start", "_OTHER"),
            ("component a is blocked (debug_red: …)", "_OTHER"),
            ("", "_OTHER"),
        ] {
            assert_eq!(error_type(m), t, "{m:?}");
        }
    }

    #[test]
    fn a_job_fails_unless_it_exits_0_or_is_cancelled() {
        let end = |exit_code, signal, timed_out, cancelled, error| JobEnd {
            exit_code,
            signal,
            timed_out,
            cancelled,
            error,
        };
        assert_eq!(end(Some(0), None, false, false, "").failure(), None);
        assert_eq!(end(None, Some(15), false, true, "").failure(), None);
        assert_eq!(
            end(Some(1), None, false, false, "").failure().as_deref(),
            Some("exit code 1")
        );
        assert_eq!(
            end(None, Some(9), false, false, "").failure().as_deref(),
            Some("ended by signal 9")
        );
        assert_eq!(
            end(None, Some(9), true, false, "").failure().as_deref(),
            Some("timed out")
        );
        assert_eq!(
            end(None, None, false, false, "preflight `x` could not start")
                .failure()
                .as_deref(),
            Some("preflight `x` could not start")
        );
    }
}
