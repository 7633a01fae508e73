//! OpenTelemetry for fvd: one trace per port, joined across the
//! orchestrator, the workers and the test and agent processes they start.
//!
//! * [`init`] installs the process's `tracing` subscriber: logs to stderr
//!   (filtered by `FVD_LOG`) and, only when OTLP export is configured, a
//!   `tracing-opentelemetry` layer plus a meter provider, both exporting
//!   over OTLP/gRPC. When export is off no exporter, layer or meter exists,
//!   so `info` spans stay disabled callsites and cost a branch.
//! * [`propagation`] turns a span into a W3C `traceparent` and back; it
//!   crosses the worker stream inside `AssignJob` and reaches test and
//!   agent processes as the `TRACEPARENT` environment variable.
//!   [`Continuation`] decides where each run of a port hangs, so a port is
//!   one trace across processes (its context is stored with the port).
//! * [`metrics`] holds the instruments (jobs queued and running, queue
//!   wait, GPU-seconds, attempts, verdicts); they are no-ops while off.
//! * [`spans`] builds the spans other crates share (agent runs, trace
//!   comparisons and steps), the span events (verdict changes, gate
//!   refusals, escape hatches, environment failures, pauses) and sets span
//!   statuses (ERROR with a message for what failed).
//! * [`task`]: [`spawn`] and [`spawn_blocking`] start tokio tasks that stay
//!   inside the caller's span; the workspace's `clippy.toml` forbids the
//!   bare tokio functions elsewhere.
//!
//! Span attributes carry names, ids, counts and verdicts only: never the
//! value of an environment variable.

pub mod config;
pub mod metrics;
pub mod propagation;
pub mod spans;
pub mod task;

mod install;

pub use config::{ExportConfig, ExportDecision};
pub use install::{
    LogConfig, LogFormat, Telemetry, TelemetryError, civil_utc, init, init_with, json_event,
};
pub use propagation::{
    Continuation, TRACEPARENT, add_link, current_traceparent, sampled, set_parent, traceparent,
};
pub use task::{spawn, spawn_blocking};
