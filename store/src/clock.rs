//! The clock the lease logic reads, injected so tests can move time
//! forward instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};

/// Milliseconds on some monotonic-enough scale.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now_ms(&self) -> i64;
}

/// Wall time.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        crate::now_ms()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
