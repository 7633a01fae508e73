//! Write faults: which store errors are the disk's (full, read-only,
//! failing, gone), the backoff under which a server's writes wait for the
//! disk instead of failing, and the one fault state readers watch.
//!
//! A write that meets a disk fault is not an error of the port: nothing in
//! the database changed (SQLite rolled the transaction back), and the same
//! transaction is run again once the disk takes writes. A server's store
//! ([`crate::Store::with_write_retry`]) therefore retries such a write in
//! place, with exponential backoff, so the actor that asked simply waits:
//! no actor fails, restarts or logs per attempt, and no decision is lost or
//! taken twice. The first failure and the first success after it are each
//! logged once; meanwhile [`crate::Store::write_fault`] says what failed,
//! since when, which the status of every running port shows as a pause.

use std::time::Duration;

use tokio::sync::watch;

use crate::StoreError;

/// How long a retried write waits between two tries: `first`, doubling up
/// to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// 100 ms doubling to 5 s: a disk that frees up is seen within 5 s,
    /// and a full one costs a write attempt every 5 s per waiting writer.
    fn default() -> Self {
        Self {
            first: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl Backoff {
    /// The pause after `last` (none yet: `first`).
    pub fn next(&self, last: Option<Duration>) -> Duration {
        match last {
            None => self.first,
            Some(d) => d.saturating_mul(2).clamp(self.first, self.max),
        }
    }
}

/// Writes are failing: since when and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFault {
    /// Wall time of the first failed write, milliseconds since the epoch.
    pub since_ms: i64,
    /// What the write was (`finish job`, `lease jobs`, …).
    pub write: &'static str,
    /// SQLite's message (`database or disk is full`), with its code.
    pub error: String,
}

impl WriteFault {
    /// One sentence for people: the pause reason a port's status shows.
    pub fn reason(&self, db: &str) -> String {
        format!(
            "paused: the orchestrator cannot write its database {db} ({}); fvd retries with backoff and resumes by itself once writes succeed",
            self.error
        )
    }
}

/// Whether `e` is the disk's doing: SQLite's `FULL`, `IOERR`, `READONLY`
/// and `CANTOPEN` (extended codes included), or no writer connection could
/// be opened in time. Constraint violations, malformed values and the like
/// are never retried.
pub fn is_disk_fault(e: &StoreError) -> bool {
    let StoreError::Sql(e) = e else {
        return false;
    };
    match e {
        sqlx::Error::Database(db) => {
            db.code()
                .and_then(|c| c.parse::<i32>().ok())
                .is_some_and(|code| {
                    matches!(
                        code & 0xff,
                        SQLITE_IOERR | SQLITE_FULL | SQLITE_READONLY | SQLITE_CANTOPEN
                    )
                })
        }
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        _ => false,
    }
}

const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;

/// The fault state of one database, shared by every handle of it.
#[derive(Debug)]
pub(crate) struct Faults {
    state: watch::Sender<Option<WriteFault>>,
    /// The database, as people name it (its path).
    db: String,
}

impl Faults {
    pub(crate) fn new(db: String) -> Self {
        Self {
            state: watch::Sender::new(None),
            db,
        }
    }

    pub(crate) fn db(&self) -> &str {
        &self.db
    }

    pub(crate) fn current(&self) -> Option<WriteFault> {
        self.state.borrow().clone()
    }

    pub(crate) fn watch(&self) -> watch::Receiver<Option<WriteFault>> {
        self.state.subscribe()
    }

    /// A write failed on the disk: the first failure of a run of them is
    /// logged (once), later ones only at debug level.
    pub(crate) fn failed(&self, write: &'static str, e: &StoreError, retrying: bool) {
        let error = match e {
            StoreError::Sql(sqlx::Error::Database(db)) => format!(
                "{} (SQLite code {})",
                db.message(),
                db.code().unwrap_or_default()
            ),
            other => other.to_string(),
        };
        let started = self.state.send_if_modified(|s| {
            if s.is_some() {
                return false;
            }
            *s = Some(WriteFault {
                since_ms: crate::now_ms(),
                write,
                error: error.clone(),
            });
            true
        });
        if started {
            if retrying {
                tracing::error!(db = %self.db, %write, %error, "database writes fail; running ports pause, and writes are retried with backoff until they succeed");
            } else {
                tracing::error!(db = %self.db, %write, %error, "database write failed");
            }
        } else {
            tracing::debug!(db = %self.db, %write, %error, "database write failed again");
        }
    }

    /// A write succeeded: a fault, if there was one, is over (logged once).
    pub(crate) fn succeeded(&self) {
        if self.state.borrow().is_none() {
            return;
        }
        let mut ended = None;
        self.state.send_if_modified(|s| {
            ended = s.take();
            ended.is_some()
        });
        if let Some(f) = ended {
            let after_s = (crate::now_ms() - f.since_ms).max(0) as f64 / 1000.0;
            tracing::info!(db = %self.db, after_s, "database writes succeed again; paused ports resume");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let b = Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut last = None;
        let mut seen = Vec::new();
        for _ in 0..6 {
            let d = b.next(last);
            seen.push(d.as_millis());
            last = Some(d);
        }
        assert_eq!(seen, [100, 200, 400, 800, 1000, 1000]);
    }

    fn sqlite(code: i32) -> StoreError {
        #[derive(Debug)]
        struct E(i32);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "code {}", self.0)
            }
        }
        impl std::error::Error for E {}
        impl sqlx::error::DatabaseError for E {
            fn message(&self) -> &str {
                "message"
            }
            fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
                Some(self.0.to_string().into())
            }
            fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
                self
            }
            fn kind(&self) -> sqlx::error::ErrorKind {
                sqlx::error::ErrorKind::Other
            }
        }
        StoreError::Sql(sqlx::Error::Database(Box::new(E(code))))
    }

    #[test]
    fn only_the_disk_s_errors_are_faults() {
        // FULL, IOERR_WRITE (778), READONLY_DBMOVED (1032), CANTOPEN.
        for code in [13, 10, 778, 8, 1032, 14] {
            assert!(is_disk_fault(&sqlite(code)), "{code}");
        }
        // CONSTRAINT_UNIQUE (2067), CORRUPT, MISUSE, ERROR.
        for code in [2067, 11, 21, 1] {
            assert!(!is_disk_fault(&sqlite(code)), "{code}");
        }
        assert!(!is_disk_fault(&StoreError::Corrupt {
            what: "x",
            message: "y".into()
        }));
    }

    #[test]
    fn a_run_of_failures_is_one_fault_until_a_write_succeeds() {
        let f = Faults::new("db".into());
        let mut seen = f.watch();
        assert_eq!(f.current(), None);
        f.failed("first", &sqlite(13), true);
        let first = f.current().expect("a fault");
        assert_eq!(first.write, "first");
        assert!(first.error.contains("code 13"), "{}", first.error);
        assert!(seen.has_changed().unwrap());
        seen.mark_unchanged();
        f.failed("second", &sqlite(10), true);
        assert_eq!(f.current(), Some(first), "the fault keeps its start");
        assert!(!seen.has_changed().unwrap(), "no change to announce");
        f.succeeded();
        assert_eq!(f.current(), None);
        assert!(seen.has_changed().unwrap());
    }
}
