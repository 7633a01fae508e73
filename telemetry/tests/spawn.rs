//! `fvd_telemetry::spawn` and `spawn_blocking` run their work inside the
//! caller's span, on whichever runtime thread picks it up; a bare tokio
//! spawn (the control) does not, which is why clippy.toml forbids it.

use std::sync::Once;

use tracing::Instrument;
use tracing::span::Id;

/// A registry as the process's subscriber: it tracks the current span of
/// every thread, runtime and blocking-pool threads alike (a thread-local
/// default would not reach them). One per test process, so set once.
fn subscriber() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry())
            .expect("no other subscriber in this test process");
    });
}

fn current() -> Option<Id> {
    tracing::Span::current().id()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_task_sees_the_callers_span_across_awaits() {
    subscriber();
    let port = tracing::info_span!("port", family = "tiny");
    let want = port.id().expect("an enabled span has an id");
    let (before, after) = async {
        fvd_telemetry::spawn(async {
            let before = current();
            // Polled again later, perhaps on the other worker thread.
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            (before, current())
        })
        .await
        .expect("task")
    }
    .instrument(port.clone())
    .await;
    assert_eq!(before.as_ref(), Some(&want));
    assert_eq!(after.as_ref(), Some(&want));

    // The control: the same task through bare tokio runs outside it.
    #[allow(clippy::disallowed_methods)]
    let bare = async { tokio::spawn(async { current() }).await.expect("task") }
        .instrument(port)
        .await;
    assert_eq!(bare, None, "a bare tokio::spawn starts outside every span");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_task_sees_the_callers_span() {
    subscriber();
    let compare = tracing::info_span!("trace_comparison", component = "vae");
    let want = compare.id().expect("an enabled span has an id");
    let seen = {
        let _in = compare.enter();
        fvd_telemetry::spawn_blocking(current)
    }
    .await
    .expect("blocking task");
    assert_eq!(seen, Some(want));

    #[allow(clippy::disallowed_methods)]
    let bare = {
        let _in = compare.enter();
        tokio::task::spawn_blocking(current)
    }
    .await
    .expect("blocking task");
    assert_eq!(
        bare, None,
        "a bare spawn_blocking starts outside every span"
    );
}
