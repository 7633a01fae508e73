//! Spans and span events shared across crates, so every process names
//! them and their attributes the same way.
//!
//! The port loop's own spans (`port`, `phase`, `component`, `attempt`,
//! `job`) are made where their work happens, in `fvd-actors` and
//! `fvd-worker`; this module holds the ones the port loop does not drive
//! yet: agent runs (for the agent loop, which does not exist; nothing calls
//! [`agent_run`] today) and trace comparisons (`fvd trace compare` records
//! one; the trace actor's drill-down inside a port will too).

use tracing::Span;
use tracing::field::Empty;

/// The span of one agent run on a component (e.g. a debugging attempt).
/// Start the agent process with [`crate::TRACEPARENT`] set from this span
/// so its own instrumentation joins the port's trace. Record the outcome
/// with `span.record("outcome", …)`.
pub fn agent_run(parent: &Span, family: &str, component: &str, attempt: u32, agent: &str) -> Span {
    tracing::info_span!(
        parent: parent,
        "agent_run",
        family,
        component,
        attempt,
        agent,
        outcome = Empty,
        exit_code = Empty,
    )
}

/// The span of one trace comparison (reference vs port activations);
/// `parent` may be `Span::none()` for a root (then continue a remote
/// context with [`crate::set_parent`]). Record the result with
/// [`first_divergence`].
pub fn trace_comparison(parent: &Span, family: &str, component: &str) -> Span {
    tracing::info_span!(
        parent: parent,
        "trace_comparison",
        family,
        component,
        compared_rows = Empty,
        diverged = Empty,
        first_divergent_module = Empty,
        first_divergent_stat = Empty,
    )
}

/// Records a comparison's outcome on its span: how many rows (module ×
/// tensor × step) were compared and, if it diverged, the first divergent
/// module (in the reference's execution order) and the stat that drifted.
pub fn first_divergence(span: &Span, compared_rows: u64, first: Option<(&str, &str)>) {
    span.record("compared_rows", compared_rows);
    span.record("diverged", first.is_some());
    if let Some((module, stat)) = first {
        span.record("first_divergent_module", module);
        span.record("first_divergent_stat", stat);
    }
}

/// A component's verdict changed between two attempts.
pub fn verdict_changed(span: &Span, from: &str, to: &str, attempt: u32) {
    tracing::info!(parent: span, from, to, attempt, "verdict changed");
}

/// The gate refused a phase transition; `conditions` are the unmet
/// predicates as recorded (field names and reasons, never values).
pub fn gate_refused(span: &Span, phase: &str, conditions: &[String]) {
    tracing::info!(parent: span, phase, conditions = ?conditions, "gate refused a transition");
}

/// An escape hatch: the workflow paused to ask the user. `hatch` is a
/// short kind (`ask_user`, a decision type), never the question's text.
pub fn escape_hatch(span: &Span, phase: &str, hatch: &str) {
    tracing::info!(parent: span, phase, hatch, "escape hatch");
}
