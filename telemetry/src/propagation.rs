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

/// The span context a `traceparent` names, when it is valid.
fn span_context(traceparent: &str) -> Option<opentelemetry::trace::SpanContext> {
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_string(), traceparent.trim().to_string());
    let cx = TraceContextPropagator::new().extract(&carrier);
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Whether `traceparent` is valid and its caller records it (flags 01).
pub fn sampled(traceparent: &str) -> bool {
    span_context(traceparent).is_some_and(|sc| sc.is_sampled())
}

/// Links `span` to the span named by `traceparent` (another trace that
/// caused this work). Returns whether it took.
pub fn add_link(span: &tracing::Span, traceparent: &str) -> bool {
    match span_context(traceparent) {
        Some(sc) if !span.is_disabled() => {
            span.add_link(sc);
            true
        }
        _ => false,
    }
}

/// Where a span of one run of a port hangs. A port is one trace across its
/// runs (the first `fvd submit`, a resume in a new process, `fvd answer`,
/// an orchestrator restart): each run's span is a child of the context the
/// port stored, not a new root, so the port reads as one tree; the caller
/// that started this run, when in another trace, is a link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Continuation {
    /// The remote parent of the run's span (`None`: a new trace).
    pub parent: Option<String>,
    /// Another trace the span links to.
    pub link: Option<String>,
    /// Whether the run's span becomes the port's stored context.
    pub record: bool,
}

impl Continuation {
    /// Decides from the port's stored context, the caller's context and
    /// whether this run starts the port afresh (a new port, or `--rerun`):
    ///
    /// * a caller who does not sample (flags 00) wins: nothing of this run
    ///   is recorded, whatever the port's trace;
    /// * a fresh run, or a port without a sampled stored context, starts
    ///   the port's trace under the caller (linking an earlier trace) and
    ///   records it;
    /// * otherwise the run continues the stored context: under the caller
    ///   when the caller already continues it (`fvd answer` and a resumed
    ///   embedded `fvd submit` read the stored context themselves), else
    ///   under the stored context, linking the caller.
    pub fn decide(stored: Option<&str>, caller: Option<&str>, fresh: bool) -> Self {
        let caller_sc = caller.and_then(span_context);
        let stored_sc = stored.and_then(span_context).filter(|sc| sc.is_sampled());
        let own = |s: Option<&str>| s.map(|t| t.trim().to_string());
        if caller_sc.as_ref().is_some_and(|sc| !sc.is_sampled()) {
            return Self {
                parent: own(caller),
                link: None,
                record: false,
            };
        }
        let caller = caller.filter(|_| caller_sc.is_some());
        match stored_sc {
            Some(_) if fresh => Self {
                parent: own(caller),
                link: own(stored),
                record: true,
            },
            None => Self {
                parent: own(caller),
                link: None,
                record: true,
            },
            Some(st) => {
                let continues = caller_sc
                    .as_ref()
                    .is_some_and(|sc| sc.trace_id() == st.trace_id());
                if continues {
                    Self {
                        parent: own(caller),
                        link: None,
                        record: false,
                    }
                } else {
                    Self {
                        parent: own(stored),
                        link: own(caller),
                        record: false,
                    }
                }
            }
        }
    }

    /// Applies the decision to a span just made (before it is entered).
    pub fn apply(&self, span: &tracing::Span) {
        if let Some(p) = &self.parent {
            set_parent(span, p);
        }
        if let Some(l) = &self.link {
            add_link(span, l);
        }
    }
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

    const STORED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const SAME_TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
    const OTHER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const UNSAMPLED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

    fn decide(stored: Option<&str>, caller: Option<&str>, fresh: bool) -> Continuation {
        Continuation::decide(stored, caller, fresh)
    }

    fn c(parent: Option<&str>, link: Option<&str>, record: bool) -> Continuation {
        Continuation {
            parent: parent.map(str::to_string),
            link: link.map(str::to_string),
            record,
        }
    }

    #[test]
    fn a_port_s_runs_continue_its_stored_trace() {
        // The first run starts the port's trace (under its caller, if any).
        assert_eq!(decide(None, None, true), c(None, None, true));
        assert_eq!(decide(None, Some(OTHER), true), c(Some(OTHER), None, true));
        // A resume continues it; a caller in another trace is a link.
        assert_eq!(
            decide(Some(STORED), None, false),
            c(Some(STORED), None, false)
        );
        assert_eq!(
            decide(Some(STORED), Some(OTHER), false),
            c(Some(STORED), Some(OTHER), false)
        );
        // A caller that already continues it is the parent.
        assert_eq!(
            decide(Some(STORED), Some(SAME_TRACE), false),
            c(Some(SAME_TRACE), None, false)
        );
        // A rerun starts a new trace, linking the old one.
        assert_eq!(
            decide(Some(STORED), Some(OTHER), true),
            c(Some(OTHER), Some(STORED), true)
        );
        // Nothing usable stored: this run's trace becomes the port's.
        for stored in ["", "garbage", UNSAMPLED] {
            assert_eq!(
                decide(Some(stored), None, false),
                c(None, None, true),
                "{stored}"
            );
        }
        // A garbage caller is ignored.
        assert_eq!(
            decide(Some(STORED), Some("x"), false),
            c(Some(STORED), None, false)
        );
    }

    #[test]
    fn a_caller_that_does_not_sample_wins() {
        for (stored, fresh) in [(None, true), (Some(STORED), false), (Some(STORED), true)] {
            assert_eq!(
                decide(stored, Some(UNSAMPLED), fresh),
                c(Some(UNSAMPLED), None, false),
                "{stored:?} {fresh}"
            );
        }
        assert!(sampled(STORED) && !sampled(UNSAMPLED) && !sampled("x"));
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
