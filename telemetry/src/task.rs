//! The one way fvd starts tokio tasks: inside the caller's current span.
//!
//! A task started with `tokio::spawn` or `spawn_blocking` begins outside
//! every span, so whatever it logs or traces (a worker's output readers, a
//! comparison run off the async threads) falls out of the port's trace and
//! loses the fields that say which port, component and job it served.
//! These wrappers carry the span across; `clippy.toml` at the workspace
//! root forbids the bare tokio functions everywhere else.

use tokio::task::JoinHandle;
use tracing::Instrument;

/// Spawns `fut` on the current tokio runtime inside the caller's current
/// span: the span is entered on every poll of the task, so its spans and
/// events stay in the port's trace instead of starting new, unparented
/// ones. Like `tokio::spawn`, it panics outside a runtime.
// The wrapper itself is the one place allowed to call the bare function.
#[allow(clippy::disallowed_methods)]
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(fut.in_current_span())
}

/// Runs the blocking `f` on tokio's blocking pool inside the caller's
/// current span (entered for the whole call). Like
/// `tokio::task::spawn_blocking`, it panics outside a runtime.
// The wrapper itself is the one place allowed to call the bare function.
#[allow(clippy::disallowed_methods)]
pub fn spawn_blocking<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
}
