//! Restarts of failed actors under exponential backoff. A gate restarts a
//! failed component actor, and the orchestrator a failed gate, from the
//! store; an actor that fails again at once (a store that cannot be read,
//! a bug) used to be restarted in a hot loop: 102,339 ERROR lines in 25 s
//! at a full core. Now the first failure of a run of them is logged as an
//! error and the restarts wait 100 ms doubling to 30 s; later failures of
//! the run log at debug level only. A run ends after a minute without a
//! failure.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// First pause before a restart.
const FIRST: Duration = Duration::from_millis(100);
/// Longest pause before a restart.
const MAX: Duration = Duration::from_secs(30);
/// A failure this long after the last one starts a new run.
const QUIET: Duration = Duration::from_secs(60);

/// Failures in a row per actor name.
#[derive(Debug, Default)]
pub struct Restarts {
    runs: HashMap<String, (u32, Instant)>,
}

/// What to do about one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    /// How long to wait before restarting.
    pub after: Duration,
    /// The first failure of a run: worth an error line.
    pub first: bool,
    /// Failures in this run so far.
    pub count: u32,
}

impl Restarts {
    /// `name` failed at `now`.
    pub fn failed(&mut self, name: &str, now: Instant) -> Restart {
        let (count, last) = self.runs.entry(name.to_string()).or_insert((0, now));
        if *count > 0 && now.duration_since(*last) > QUIET {
            *count = 0;
        }
        *count += 1;
        *last = now;
        let after = FIRST.saturating_mul(1u32 << (*count - 1).min(16)).min(MAX);
        Restart {
            after: if *count == 1 { Duration::ZERO } else { after },
            first: *count == 1,
            count: *count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_and_a_quiet_minute_starts_over() {
        let mut r = Restarts::default();
        let t0 = Instant::now();
        let pauses: Vec<(u128, bool)> = (0..12)
            .map(|i| {
                let x = r.failed("c", t0 + Duration::from_secs(i));
                (x.after.as_millis(), x.first)
            })
            .collect();
        assert_eq!(pauses[0], (0, true), "the first restart is at once");
        assert_eq!(pauses[1], (200, false));
        assert_eq!(pauses[2], (400, false));
        assert_eq!(pauses[11].0, 30_000, "capped");
        assert!(pauses[1..].iter().all(|p| !p.1), "one error line per run");
        // Another actor has its own run.
        assert!(r.failed("d", t0).first);
        // A minute and more without a failure: a new run.
        let later = r.failed("c", t0 + Duration::from_secs(11 + 61));
        assert_eq!(
            (later.after, later.first, later.count),
            (Duration::ZERO, true, 1)
        );
    }
}
