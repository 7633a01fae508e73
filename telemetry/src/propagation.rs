//! W3C trace context across process boundaries: a span becomes a
//! `traceparent` string (sent to workers inside `AssignJob` and given to
//! test and agent processes as `TRACEPARENT`), and a received string
//! becomes the parent of a local span.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The environment variable that carries the trace context into child
/// processes (the name OpenTelemetry's Python SDK and others read).
pub const TRACEPARENT: &str = "TRACEPARENT";

/// The W3C `traceparent` of `span`, or `None` when the span is not
/// recorded (export off, filtered out, or not sampled).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The `traceparent` of the current span.
pub fn current_traceparent() -> Option<String> {
    traceparent(&tracing::Span::current())
}

/// Makes the remote span named by `traceparent` the parent of `span`.
/// Returns whether it took: an invalid header, a disabled span or a span
/// already started under another parent leave it alone.
pub fn set_parent(span: &tracing::Span, traceparent: &str) -> bool {
    if span.is_disabled() || traceparent.is_empty() {
        return false;
    }
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    let cx = TraceContextPropagator::new().extract(&carrier);
    if !cx.span().span_context().is_valid() {
        return false;
    }
    span.set_parent(cx).is_ok()
}
