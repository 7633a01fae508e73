//! Named kill points for the chaos tests: with `FVD_CRASH_AT=NAME` (or
//! `NAME:N`, the N-th time the point is reached) in its environment, the
//! process kills itself with SIGKILL when it reaches [`crash_point`]`(NAME)`,
//! exactly as a `kill -9` between two steps would. Unset (always, outside
//! the tests), a point costs one atomic load.
//!
//! The points sit right after the commits whose neighbourhood a crash has
//! hurt before (issue #27): `verdict-committed` (a run's verdict and its
//! component's next state) and `attempt-committed` (an agent attempt and
//! what it leads to: its question, its end, or its test run).
//!
//! [`fail_point`] is the same for a failure instead of a crash: with
//! `FVD_FAIL_AT=NAME` the caller fails there as its disk would
//! (`status-write`: writing `PORT_STATUS.md`, which the end-to-end tests
//! use since a root process can otherwise write anywhere).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable naming the point to crash at.
pub const CRASH_AT_ENV: &str = "FVD_CRASH_AT";

/// The environment variable naming the point to fail at.
pub const FAIL_AT_ENV: &str = "FVD_FAIL_AT";

/// Whether `FVD_FAIL_AT` names this point (read once): the caller then
/// fails as if its write had.
pub fn fail_point(name: &str) -> bool {
    static FAIL_AT: OnceLock<Option<String>> = OnceLock::new();
    FAIL_AT
        .get_or_init(|| std::env::var(FAIL_AT_ENV).ok())
        .as_deref()
        == Some(name)
}

/// The point and the hit to crash on, read once.
fn target() -> Option<&'static (String, u32)> {
    static TARGET: OnceLock<Option<(String, u32)>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let v = std::env::var(CRASH_AT_ENV).ok()?;
            let (name, n) = match v.split_once(':') {
                Some((name, n)) => (name.to_string(), n.parse().ok()?),
                None => (v, 1),
            };
            Some((name, n))
        })
        .as_ref()
}

/// Kills this process (SIGKILL) if `FVD_CRASH_AT` names this point and
/// this is the hit it names; otherwise does nothing.
pub fn crash_point(name: &str) {
    static HITS: AtomicU32 = AtomicU32::new(0);
    let Some((want, nth)) = target() else {
        return;
    };
    if want != name || HITS.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
        return;
    }
    tracing::warn!(point = name, "{CRASH_AT_ENV}: killing this process here");
    // A real SIGKILL: no destructor, no flush, no exit handler runs.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    std::process::abort();
}
