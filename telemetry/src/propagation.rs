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

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    /// Runs `f` with an OpenTelemetry layer that records (exports nowhere).
    fn recording<R>(f: impl FnOnce() -> R) -> R {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, f)
    }

    fn parts(tp: &str) -> Vec<String> {
        tp.split('-').map(str::to_string).collect()
    }

    #[test]
    fn a_span_crosses_a_process_boundary_as_its_child() {
        recording(|| {
            let parent = tracing::info_span!("job");
            let tp = traceparent(&parent).expect("a recorded span has a context");
            let p = parts(&tp);
            assert_eq!(p.len(), 4, "{tp}");
            assert_eq!((p[0].as_str(), p[3].as_str()), ("00", "01"), "{tp}");
            assert_eq!((p[1].len(), p[2].len()), (32, 16), "{tp}");

            // The receiving side: a root span adopted by the remote parent.
            let child = tracing::info_span!(parent: None, "job.run");
            assert!(set_parent(&child, &tp));
            let c = parts(&traceparent(&child).expect("child context"));
            assert_eq!(c[1], p[1], "same trace");
            assert_ne!(c[2], p[2], "its own span id");
        });
    }

    #[test]
    fn nothing_is_made_up_when_off_and_garbage_is_refused() {
        // No subscriber records: no context to hand out or adopt.
        let off = tracing::info_span!("off");
        assert_eq!(traceparent(&off), None);
        assert!(!set_parent(
            &off,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        recording(|| {
            let span = tracing::info_span!("on");
            assert!(!set_parent(&span, ""));
            assert!(!set_parent(&span, "not a traceparent"));
            assert!(!set_parent(
                &span,
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
            ));
        });
    }
}
