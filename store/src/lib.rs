//! The durable store: one SQLite file in WAL mode with numbered migrations.
//!
//! Actors commit every state change here before they acknowledge it or act
//! on it, so a crash loses nothing that anyone was told about. Only plain
//! `sqlx::query` is used (no compile-time macros): the build needs no live
//! database.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Row, SqlitePool};

use crate::messages::LogChunk;
use crate::model::Worktree;
use crate::model::{ComponentRow, GateEventRow, JobRecord, JobResult, PortRow};
use crate::states::{
    AttemptKind, AttemptState, ComponentStatus, EscapeAbout, EscapeStatus, GateOutcome,
    HandoffStatus, JobState, PortState, RecordedVerdict, UnknownState,
};
pub use crate::steps::{
    AttemptNext, AttemptRecorded, ComponentNext, JudgeNext, VerdictNext, VerdictRecorded,
};

pub mod chaos;
pub mod clock;
pub mod dashboard;
pub mod faults;
pub mod messages;
pub mod model;
pub mod states;
mod steps;
use steps::finish_running_job;
pub mod team;
pub mod traces;
pub mod usage;
pub mod variants;

/// One agent attempt of the ledger (`agent_attempts`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct AttemptRow {
    pub family: String,
    pub component: String,
    pub attempt: u32,
    pub commit_sha: String,
    pub diff_stat: String,
    pub diff: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub job_before: String,
    pub verdict_before: RecordedVerdict,
    pub reason_before: String,
    pub job_after: String,
    pub verdict_after: RecordedVerdict,
    pub reason_after: String,
    /// `valid`, `invalid` (with the findings in the summary) or `missing`.
    pub handoff_status: HandoffStatus,
    pub handoff_summary: String,
    pub handoff_text: String,
    pub started_ms: i64,
    pub finished_ms: i64,
    /// `running` from just before the agent starts until its work is
    /// committed and recorded; `recorded` after (or `environment`).
    pub state: AttemptState,
    /// The worktree's HEAD when the attempt began: a restart resets to it.
    pub head_before: String,
    /// Marks the agent's processes (`FVD_AGENT_COOKIE`) so a restart can
    /// find and end what is left of an agent cut off by a crash. Internal:
    /// not shown, not sent.
    #[serde(skip)]
    pub cookie: String,
    /// How many times the attempt was run: more than 1 only after a crash.
    pub tries: u32,
    /// GPU-milliseconds of the run that tested the attempt.
    pub gpu_ms_after: u64,
    /// `fix` after a red run, `cleanup` after a pass the cleanup gate refused.
    pub kind: AttemptKind,
    /// What the attempt spent on its model API (`agent_usage`), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<usage::AttemptUsage>,
    /// The worker its agent ran on (issue #32); empty when it ran on the
    /// orchestrator's host.
    pub worker_id: String,
    /// The judge's paths its commit changed (issue #39); its verdict ran
    /// with the port's own judge instead.
    pub judge_changed: Vec<String>,
    /// The patch of that change (cut at 16 KiB), shown to the person who
    /// approves or rejects it.
    pub judge_diff: String,
}

/// One try of an agent attempt as a fleet job (issue #38): its job id and
/// the SHA-256 digests (hex) of the tokens its agent was given, empty for
/// an agent without a model proxy or tools. No token value is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetTry {
    pub job_id: String,
    pub proxy_token_sha256: String,
    pub tools_token_sha256: String,
}

/// One tool call of an attempt's agent (`attempt_tool_calls`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ToolCallRow {
    #[serde(skip)]
    pub family: String,
    #[serde(skip)]
    pub component: String,
    pub attempt: u32,
    pub seq: u32,
    pub tool: String,
    pub arguments: String,
    /// `ok` or `error`.
    pub outcome: String,
    pub detail: String,
    pub duration_ms: u64,
    /// GPU-milliseconds of the run the call asked for (`run_parity`).
    pub gpu_ms: u64,
    pub at_ms: i64,
}

/// An escape hatch an agent raised (`escape_hatches`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct EscapeRow {
    pub family: String,
    /// `E001`, … per port.
    pub id: String,
    pub component: String,
    pub attempt: u32,
    pub phase: String,
    pub decision_type: String,
    pub question: String,
    pub recommended: String,
    pub options: Vec<String>,
    pub safe_default: String,
    /// `open`, `answered`, `resolved`, or `withdrawn` (the port was rerun
    /// before the answer reached an attempt).
    pub status: EscapeStatus,
    pub answer: String,
    /// The credential that answered; empty when none was checked.
    pub answered_by: String,
    pub asked_ms: i64,
    pub answered_ms: Option<i64>,
    pub resolved_attempt: Option<u32>,
    /// What it asks about: the agent's question, or an attempt's judge
    /// change.
    pub about: EscapeAbout,
    /// The commit of an approved judge change, made under the name of the
    /// person who approved it; empty otherwise.
    pub judge_commit: String,
}

/// How many of a component's latest finished runs its next run's expected
/// duration is the median of ([`model::JobRecord::expected_ms`]).
pub const RECENT_RUNS: usize = 5;

/// Numbered migrations, applied in order, each once. A database records
/// only the versions it applied (no checksum): a comment in an applied
/// migration may be corrected, its statements never change.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/0001_init.sql")),
    (2, include_str!("../migrations/0002_spawned.sql")),
    (3, include_str!("../migrations/0003_agent_attempts.sql")),
    (4, include_str!("../migrations/0004_agent_durability.sql")),
    (5, include_str!("../migrations/0005_traces.sql")),
    (6, include_str!("../migrations/0006_rerun_budget.sql")),
    (7, include_str!("../migrations/0007_runs_counted.sql")),
    (8, include_str!("../migrations/0008_port_trace.sql")),
    (9, include_str!("../migrations/0009_commits.sql")),
    (10, include_str!("../migrations/0010_trace_transport.sql")),
    (11, include_str!("../migrations/0011_variants.sql")),
    (
        12,
        include_str!("../migrations/0012_status_write_error.sql"),
    ),
    (13, include_str!("../migrations/0013_team.sql")),
    (14, include_str!("../migrations/0014_agent_usage.sql")),
    (15, include_str!("../migrations/0015_lease_epochs.sql")),
    (16, include_str!("../migrations/0016_error_kind.sql")),
    (17, include_str!("../migrations/0017_attempt_worker.sql")),
    (
        18,
        include_str!("../migrations/0018_attempt_tool_calls.sql"),
    ),
    (19, include_str!("../migrations/0019_attempt_judge.sql")),
    (20, include_str!("../migrations/0020_judge_questions.sql")),
    (21, include_str!("../migrations/0021_attempt_fleet_try.sql")),
    (22, include_str!("../migrations/0022_run_gpu_memory.sql")),
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {url}: {source}")]
    Open { url: String, source: sqlx::Error },
    #[error("database migration {version}: {source}")]
    Migrate { version: i64, source: sqlx::Error },
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("database holds a malformed value in {what}: {message}")]
    Corrupt { what: &'static str, message: String },
    #[error("could not encode {what} for the database: {message}")]
    Encode { what: &'static str, message: String },
    /// A state column holds a text no state of its kind has (a database
    /// written by another fvd, or edited by hand).
    #[error("database column {column}: {source}")]
    State {
        column: &'static str,
        source: UnknownState,
    },
    /// A component reads `non_skip_pass` but no run of it produced one:
    /// the database was edited, not earned (issue #39).
    #[error(
        "state database integrity: component {family}/{component} reads non_skip_pass, but {detail}; no recorded run passed it, so fvd shows no pass (was the database edited?)"
    )]
    UnearnedPass {
        family: String,
        component: String,
        detail: String,
    },
    #[error("port {family} has no escape hatch {id}")]
    UnknownEscape { family: String, id: String },
    #[error("escape hatch {id} of port {family} is {status}, not open")]
    EscapeNotOpen {
        family: String,
        id: String,
        status: EscapeStatus,
    },
}

/// Rows for one statement's `json_each(?)`: a JSON list of lists.
fn json_rows<T: serde::Serialize>(rows: &[T]) -> Result<String, StoreError> {
    serde_json::to_string(rows).map_err(|e| StoreError::Encode {
        what: "a batch of rows",
        message: e.to_string(),
    })
}

/// The `E###` id after the highest of `ids` and of `floor`.
fn escape_id_after(ids: &[String], floor: u32) -> String {
    let top = ids
        .iter()
        .filter_map(|i| i.strip_prefix('E').and_then(|n| n.parse::<u32>().ok()))
        .max()
        .unwrap_or(0)
        .max(floor);
    format!("E{:03}", top + 1)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Handle to the database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    /// Readers: WAL lets them run beside the writer.
    pool: SqlitePool,
    /// The one writer connection. Writers queue for it inside the process
    /// instead of meeting SQLite's busy handler, which sleeps for up to tens
    /// of milliseconds per retry and showed up as dispatch latency. It never
    /// checkpoints the WAL: see [`Checkpointer`].
    writer: SqlitePool,
    /// `None` for a read-only handle (its writer checkpoints).
    checkpointer: Option<Arc<Checkpointer>>,
    /// Whether writes are failing on the disk, shared by every handle.
    faults: Arc<faults::Faults>,
    /// A write that meets a disk fault waits under this backoff and runs
    /// again ([`Store::with_write_retry`]); `None`: it fails at once.
    retry: Option<faults::Backoff>,
}

/// How every write transaction starts: with the write lock taken up
/// front (see [`Store::write_tx`]).
const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// How often the write-ahead log is copied back into the database.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// Past this many frames (16 MiB of pages) left in the log, the next
/// checkpoint starts at once: under a burst of writes the checkpointer
/// keeps up instead of letting the log grow for the whole burst.
const CHECKPOINT_CHASE_FRAMES: i64 = 4096;

/// The log's file is cut back to this size when SQLite starts it over.
const WAL_KEEP_BYTES: &str = "67108864";

/// Copies the write-ahead log back into the database on a connection of
/// its own, every [`CHECKPOINT_EVERY`], in SQLite's `PASSIVE` mode (it
/// never waits for, nor holds up, the writer). SQLite's own automatic
/// checkpoint runs inside the commit that crosses 1,000 pages of log: that
/// commit then copies 4 MB and syncs the database file, and the scheduler
/// bench saw a dispatch stall for 60 to 330 ms once every few seconds under
/// load. Stops when the last handle of its store is dropped.
#[derive(Debug)]
struct Checkpointer {
    /// Dropped with the last handle: the task sees it and ends.
    _stop: tokio::sync::oneshot::Sender<()>,
    /// Log frames in the WAL and of those copied, at the last checkpoint.
    last: Arc<std::sync::Mutex<(i64, i64)>>,
}

impl Checkpointer {
    fn start(opts: SqliteConnectOptions) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let last = Arc::new(std::sync::Mutex::new((0, 0)));
        let seen = last.clone();
        fvd_telemetry::spawn(async move {
            let mut conn = match opts.connect().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open the database for checkpoints; its write-ahead log grows until the next start");
                    return;
                }
            };
            let mut behind = false;
            // Logged once per change, not every 500 ms while the disk fails.
            let mut failing = false;
            loop {
                let pause = if behind {
                    Duration::ZERO
                } else {
                    CHECKPOINT_EVERY
                };
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(pause) => {}
                }
                let done: Result<(i64, i64, i64), _> =
                    sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
                        .fetch_one(&mut conn)
                        .await;
                match done {
                    Ok((_, log, copied)) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!("the database's write-ahead log is checkpointed again");
                        }
                        behind = log - copied > CHECKPOINT_CHASE_FRAMES;
                        *seen.lock().unwrap_or_else(|e| e.into_inner()) = (log, copied)
                    }
                    Err(e) if failing => {
                        tracing::debug!(error = %e, "could not checkpoint the database's write-ahead log")
                    }
                    Err(e) => {
                        failing = true;
                        tracing::warn!(error = %e, "could not checkpoint the database's write-ahead log; retrying every 500 ms")
                    }
                }
            }
        });
        Self { _stop: stop, last }
    }
}

/// Whether the writer connection may go back to the pool: not when it is
/// still inside a transaction. A commit that fails on a full or failing
/// disk leaves it so: SQLite rolled the transaction back itself, the
/// rollback sqlx then sends fails ("no transaction is active"), and sqlx's
/// count of open transactions stays at one, so every later `BEGIN` on it
/// was refused ("begin_with at non-zero transaction depth") until the
/// process restarted. Such a connection is closed; the pool opens a fresh
/// one for the next write. The ping first lets a rollback queued by a
/// dropped transaction run, so a connection it cleaned is kept.
async fn writer_reusable(conn: &mut sqlx::SqliteConnection) -> Result<bool, sqlx::Error> {
    use sqlx::Connection;
    conn.ping().await?;
    if conn.is_in_transaction() {
        tracing::debug!(
            "the writer connection is left inside a failed transaction; it is closed and replaced"
        );
        return Ok(false);
    }
    Ok(true)
}

/// Applies the migrations `writer`'s database has not had yet, each in its
/// own transaction.
async fn migrate(writer: &SqlitePool) -> Result<(), StoreError> {
    sqlx::query("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_ms INTEGER NOT NULL)")
        .execute(writer)
        .await?;
    for (version, sql) in MIGRATIONS {
        let mut tx = writer.begin_with(BEGIN_WRITE).await?;
        let done: Option<i64> =
            sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = ?")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
        if done.is_some() {
            continue;
        }
        sqlx::raw_sql(*sql)
            .execute(&mut *tx)
            .await
            .map_err(|source| StoreError::Migrate {
                version: *version,
                source,
            })?;
        sqlx::query("INSERT INTO schema_migrations (version, applied_ms) VALUES (?, ?)")
            .bind(version)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Reader connections of a [`Store`], all opened by [`Store::open`].
const READERS: u32 = 4;

impl Store {
    /// Opens (creating if needed) the database at `url` (`sqlite://PATH`)
    /// and applies pending migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let open_err = |source| StoreError::Open {
            url: url.to_string(),
            source,
        };
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(open_err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a committed transaction survives power loss, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(10))
            .foreign_keys(true);
        // Every connection is opened here and kept for the handle's life
        // (no idle or age reaping): a connection open on the file keeps
        // reading and writing it after `REPO/.fvd` was deleted around it,
        // where a fresh one could not open it any more, so a port whose
        // folder went away can still record and tell why it stopped.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .after_release(|conn, _| Box::pin(writer_reusable(conn)))
            .connect_with(
                opts.clone()
                    .pragma("wal_autocheckpoint", "0")
                    .pragma("journal_size_limit", WAL_KEEP_BYTES),
            )
            .await
            .map_err(open_err)?;
        // Migrations run before any reader connects: a connection open
        // across a schema change would keep statements of the old shape.
        migrate(&writer).await?;
        let opts = opts.create_if_missing(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(READERS)
            .min_connections(READERS)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts.clone())
            .await
            .map_err(open_err)?;
        let db = opts.get_filename().display().to_string();
        let store = Store {
            pool,
            writer,
            checkpointer: Some(Arc::new(Checkpointer::start(opts))),
            faults: Arc::new(faults::Faults::new(db)),
            retry: None,
        };
        Ok(store)
    }

    /// Opens the database file at `path`.
    pub async fn open_path(path: &Path) -> Result<Self, StoreError> {
        Self::open(&format!("sqlite://{}", path.display())).await
    }

    /// At the last background checkpoint, the frames in the write-ahead
    /// log and how many of them were in the database (`None` for a
    /// read-only handle, which leaves checkpoints to the writing process).
    pub fn last_checkpoint(&self) -> Option<(i64, i64)> {
        self.checkpointer
            .as_ref()
            .map(|c| *c.last.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// This handle, with its writes retried under `backoff` while they
    /// fail on the disk (full, read-only, failing): the caller waits
    /// instead of getting an error, the database is left as it was by each
    /// failed try, and [`Store::write_fault`] says what fails meanwhile.
    /// For servers, whose actors would otherwise fail and restart on every
    /// write; a command run by a person (`fvd cancel`, `fvd reset`) keeps
    /// failing at once.
    pub fn with_write_retry(mut self, backoff: faults::Backoff) -> Self {
        self.retry = Some(backoff);
        self
    }

    /// Writes are failing on the disk: since when, and why. `None` once a
    /// write succeeded again.
    pub fn write_fault(&self) -> Option<faults::WriteFault> {
        self.faults.current()
    }

    /// Changes of [`Store::write_fault`].
    pub fn watch_write_faults(&self) -> tokio::sync::watch::Receiver<Option<faults::WriteFault>> {
        self.faults.watch()
    }

    /// The database file, as logs and pause reasons name it.
    pub fn db_name(&self) -> &str {
        self.faults.db()
    }

    /// Runs the write `op` (one transaction, or one statement) and, with a
    /// retry policy, runs it again while it fails on the disk. Every write
    /// method goes through here, so no write bypasses the fault state.
    async fn write<T, F, Fut>(&self, what: &'static str, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut pause = None;
        loop {
            match op().await {
                Ok(v) => {
                    self.faults.succeeded();
                    return Ok(v);
                }
                Err(e) if faults::is_disk_fault(&e) => {
                    self.faults.failed(what, &e, self.retry.is_some());
                    let Some(backoff) = &self.retry else {
                        return Err(e);
                    };
                    let p = backoff.next(pause);
                    pause = Some(p);
                    tokio::time::sleep(p).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A write transaction that takes the write lock up front: a deferred
    /// transaction that reads first cannot wait for the lock when it later
    /// writes (SQLite answers `database is locked` at once), this one can.
    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.writer.begin_with(BEGIN_WRITE).await
    }

    // ----- ports -----------------------------------------------------------

    /// Inserts a new port with its components, or returns false when the
    /// family already exists (the caller then resumes it).
    pub async fn create_port(
        &self,
        port: &PortRow,
        components: &[String],
    ) -> Result<bool, StoreError> {
        self.insert_port(port, components, None).await
    }

    /// [`Store::create_port`], with the port's origin and the log entry of
    /// its submit in the same transaction when `origin` is given.
    async fn insert_port(
        &self,
        port: &PortRow,
        components: &[String],
        origin: Option<(&team::PortOrigin, team::Action)>,
    ) -> Result<bool, StoreError> {
        self.write("create port", || async move {
            let mut tx = self.write_tx().await?;
            let exists: Option<String> =
                sqlx::query_scalar("SELECT family FROM ports WHERE family = ?")
                    .bind(&port.family)
                    .fetch_optional(&mut *tx)
                    .await?;
            if exists.is_some() {
                return Ok(false);
            }
            let now = now_ms();
            sqlx::query("INSERT INTO ports (family, repo, spec_path, spec_toml, state, phase, created_ms, updated_ms, commit_sha) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
                .bind(&port.family)
                .bind(&port.repo)
                .bind(&port.spec_path)
                .bind(&port.spec_toml)
                .bind(port.state.as_str())
                .bind(&port.phase)
                .bind(now)
                .bind(now)
                .bind(&port.commit)
                .execute(&mut *tx)
                .await?;
            for name in components {
                sqlx::query(
                    "INSERT INTO components (family, name, status, updated_ms) VALUES (?, ?, ?, ?)",
                )
                .bind(&port.family)
                .bind(name)
                .bind(ComponentStatus::Pending.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            if let Some((origin, action)) = origin {
                team::set_origin(&mut tx, &port.family, origin).await?;
                team::insert_action(&mut tx, &port.family, action, &origin.owner, &port.commit)
                    .await?;
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    /// Replaces the spec of an existing port (a resubmit may edit it): adds
    /// rows for components the new spec introduced, drops those it no
    /// longer lists (their runs stay as history), and sets the components
    /// of `replan` back to `pending` so they run again. The port is pinned
    /// to `port.commit` from now on (runs already recorded keep theirs).
    pub async fn update_port_spec(
        &self,
        port: &PortRow,
        components: &[String],
        replan: &[String],
    ) -> Result<(), StoreError> {
        self.write("update port spec", || async move {
            let family = port.family.as_str();
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            sqlx::query("UPDATE ports SET repo = ?, spec_path = ?, spec_toml = ?, commit_sha = ?, updated_ms = ? WHERE family = ?")
                .bind(&port.repo)
                .bind(&port.spec_path)
                .bind(&port.spec_toml)
                .bind(&port.commit)
                .bind(now)
                .bind(family)
                .execute(&mut *tx)
                .await?;
            for name in components {
                sqlx::query("INSERT OR IGNORE INTO components (family, name, status, updated_ms) VALUES (?, ?, ?, ?)")
                    .bind(family)
                    .bind(name)
                    .bind(ComponentStatus::Pending.as_str())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
            }
            let listed = serde_json::to_string(components).unwrap_or_default();
            sqlx::query("DELETE FROM components WHERE family = ? AND name NOT IN (SELECT value FROM json_each(?))")
                .bind(family)
                .bind(&listed)
                .execute(&mut *tx)
                .await?;
            for name in replan {
                sqlx::query("UPDATE components SET status = ?, verdict = '', error_kind = '', reason = '', worker_id = '', updated_ms = ? WHERE family = ? AND name = ?")
                    .bind(ComponentStatus::Pending.as_str())
                    .bind(now)
                    .bind(family)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    pub async fn port(&self, family: &str) -> Result<Option<PortRow>, StoreError> {
        let row = sqlx::query("SELECT family, repo, spec_path, spec_toml, state, phase, port_status_path, commit_sha FROM ports WHERE family = ?")
            .bind(family)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| port_row(&r)).transpose()
    }

    /// When the port's components were last started over (`--rerun`); 0
    /// when never. Agent budgets count from here.
    pub async fn reset_ms(&self, family: &str) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar::<_, i64>("SELECT reset_ms FROM ports WHERE family = ?")
                .bind(family)
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0),
        )
    }

    pub async fn ports(&self) -> Result<Vec<PortRow>, StoreError> {
        let rows = sqlx::query("SELECT family, repo, spec_path, spec_toml, state, phase, port_status_path, commit_sha FROM ports ORDER BY created_ms")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(port_row).collect()
    }

    pub async fn set_port_state(
        &self,
        family: &str,
        state: PortState,
        phase: &str,
    ) -> Result<(), StoreError> {
        self.write("set port state", || async move {
            sqlx::query("UPDATE ports SET state = ?, phase = ?, updated_ms = ? WHERE family = ?")
                .bind(state.as_str())
                .bind(phase)
                .bind(now_ms())
                .bind(family)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// The trace context (W3C `traceparent`) a port's runs continue; `None`
    /// when none was recorded or there is no such port.
    pub async fn port_traceparent(&self, family: &str) -> Result<Option<String>, StoreError> {
        let tp: Option<String> =
            sqlx::query_scalar("SELECT traceparent FROM ports WHERE family = ?")
                .bind(family)
                .fetch_optional(&self.pool)
                .await?;
        Ok(tp.filter(|t| !t.is_empty()))
    }

    /// Records the trace context of a port's run for later runs to continue.
    pub async fn set_port_traceparent(
        &self,
        family: &str,
        traceparent: &str,
    ) -> Result<(), StoreError> {
        self.write("set port traceparent", || async move {
            sqlx::query("UPDATE ports SET traceparent = ? WHERE family = ?")
                .bind(traceparent)
                .bind(family)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Records why the port's `PORT_STATUS.md` could not be written (empty:
    /// the last write succeeded).
    pub async fn set_status_write_error(
        &self,
        family: &str,
        error: &str,
    ) -> Result<(), StoreError> {
        self.write("set status write error", || async move {
            sqlx::query("UPDATE ports SET status_write_error = ? WHERE family = ?")
                .bind(error)
                .bind(family)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Why the port's `PORT_STATUS.md` could not be written the last time
    /// fvd tried; empty when it was, or never tried.
    pub async fn status_write_error(&self, family: &str) -> Result<String, StoreError> {
        Ok(
            sqlx::query_scalar::<_, String>(
                "SELECT status_write_error FROM ports WHERE family = ?",
            )
            .bind(family)
            .fetch_optional(&self.pool)
            .await?
            .unwrap_or_default(),
        )
    }

    pub async fn set_port_status_path(&self, family: &str, path: &str) -> Result<(), StoreError> {
        self.write("set port status path", || async move {
            sqlx::query("UPDATE ports SET port_status_path = ? WHERE family = ?")
                .bind(path)
                .bind(family)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    // ----- components ------------------------------------------------------

    /// The port's components. `runs` counts the runs of its parity test that
    /// hold a lease or finished, and those a crash cut off after their
    /// process started: one queued and then cancelled or never placed is no
    /// run, one that failed on its worker's environment is none, and one a
    /// lost or stopping worker handed back counts again only once it is
    /// leased again. Counted from `jobs`, so no later write can drift from
    /// it.
    ///
    /// A pass is read from the run that produced it: a component whose row
    /// says `non_skip_pass` while its last finished run did not record one,
    /// or whose report does not classify as one, is an
    /// [`StoreError::UnearnedPass`] naming the row, for every reader (the
    /// gate, `PORT_STATUS.md`, status, the dashboard).
    pub async fn components(&self, family: &str) -> Result<Vec<ComponentRow>, StoreError> {
        let rows = sqlx::query("SELECT c.name, c.status, c.verdict, c.error_kind, c.reason, c.worker_id, (SELECT COUNT(*) FROM jobs j WHERE j.family = c.family AND j.component = c.name AND (j.state IN (?, ?) OR (j.state = ? AND j.spawned_ms IS NOT NULL))) AS runs, (SELECT COALESCE(MAX(m.run_no), 0) FROM jobs m WHERE m.family = c.family AND m.component = c.name) AS last_run, l.job_id AS last_job, l.verdict AS last_verdict, l.error_kind AS last_error_kind, CASE WHEN c.status = ? OR c.verdict = ? THEN l.junit_xml ELSE '' END AS last_junit, l.exit_code AS last_exit, l.signal AS last_signal FROM components c LEFT JOIN jobs l ON l.job_id = (SELECT k.job_id FROM jobs k WHERE k.family = c.family AND k.component = c.name AND k.state = ? ORDER BY k.run_no DESC LIMIT 1) WHERE c.family = ? ORDER BY c.rowid")
            .bind(JobState::Running.as_str())
            .bind(JobState::Finished.as_str())
            .bind(JobState::Abandoned.as_str())
            // The last run's report is read only for a row that says it
            // passed, the one [`unearned`] looks at.
            .bind(ComponentStatus::NonSkipPass.as_str())
            .bind(RecordedVerdict::NonSkipPass.as_str())
            .bind(JobState::Finished.as_str())
            .bind(family)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let row = ComponentRow {
                    name: r.get("name"),
                    status: state(r, "status", "components.status")?,
                    verdict: verdict(r, VERDICT, ("components.verdict", "components.error_kind"))?,
                    reason: r.get("reason"),
                    runs: r.get::<i64, _>("runs") as u32,
                    last_run: r.get::<i64, _>("last_run") as u32,
                    worker_id: r.get("worker_id"),
                };
                if (row.status == ComponentStatus::NonSkipPass || row.verdict.is_pass())
                    && let Some(detail) = unearned(r)?
                {
                    return Err(StoreError::UnearnedPass {
                        family: family.to_string(),
                        component: row.name,
                        detail,
                    });
                }
                Ok(row)
            })
            .collect()
    }

    pub async fn set_component(
        &self,
        family: &str,
        name: &str,
        status: ComponentStatus,
        verdict: RecordedVerdict,
        reason: &str,
        worker_id: &str,
    ) -> Result<(), StoreError> {
        self.write("set component", || async move {
            let mut conn = self.writer.acquire().await?;
            let next = ComponentNext {
                status,
                verdict,
                reason,
                worker_id,
            };
            steps::set_component(&mut conn, family, name, next, now_ms()).await
        })
        .await
    }

    /// Sets the reason of a component that is still `queued` (why it
    /// waits); a component in any other state is left as it is.
    pub async fn set_queued_reason(
        &self,
        family: &str,
        name: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.write("set queued reason", || async move {
            sqlx::query("UPDATE components SET reason = ?, updated_ms = ? WHERE family = ? AND name = ? AND status = ?")
                .bind(reason)
                .bind(now_ms())
                .bind(family)
                .bind(name)
                .bind(ComponentStatus::Queued.as_str())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    // ----- jobs ------------------------------------------------------------

    /// Records a new queued run of a component and returns it. Run numbers
    /// are dense per component, starting at 1.
    pub async fn queue_job(&self, job: &JobRecord) -> Result<JobRecord, StoreError> {
        let mut v = self.queue_jobs(std::slice::from_ref(job)).await?;
        Ok(v.pop().expect("one record in, one out"))
    }

    /// Records many queued runs in one transaction (one fsync), in order.
    pub async fn queue_jobs(&self, jobs: &[JobRecord]) -> Result<Vec<JobRecord>, StoreError> {
        self.write("queue jobs", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            let mut out = Vec::with_capacity(jobs.len());
            for job in jobs {
                out.push(steps::insert_job(&mut tx, job, now).await?);
            }
            tx.commit().await?;
            Ok(out)
        })
        .await
    }

    /// Records that `job_id` was leased to `worker_id` under `epoch`.
    pub async fn lease_job(
        &self,
        job_id: &str,
        worker_id: &str,
        epoch: u64,
        gpus: &[u32],
    ) -> Result<(), StoreError> {
        self.lease_jobs(&[(job_id, worker_id, epoch, gpus)]).await
    }

    /// Records many leases `(job_id, worker_id, epoch, gpus)` in one
    /// transaction, each with its component's `running` state, at
    /// `synchronous = NORMAL`: no fsync of its own. Their epochs must be
    /// reserved first ([`Store::reserve_epochs`], synced): a power cut may
    /// lose these rows, never let a later process hand out their epochs
    /// again. See [`Store::record_round`].
    pub async fn lease_jobs(&self, leases: &[(&str, &str, u64, &[u32])]) -> Result<(), StoreError> {
        self.record_round(leases, &[], &[]).await?
    }

    /// A dispatch round's writes in one relaxed window of the writer
    /// connection (`synchronous = NORMAL`, set back to FULL before any
    /// other write uses it): the leases in one transaction, then output
    /// chunks and spawn times in another. The round goes to SQLite as one
    /// JSON parameter of two statements, whatever its size: each statement
    /// is a round trip to the database's thread (two thread wake-ups),
    /// which per lease cost more than the update itself. Where one
    /// component has several leases in the round, its row names the worker
    /// of the last.
    ///
    /// The outer error is the leases' (retried while the disk fails, like
    /// every write); the inner one the output's, which fails no lease.
    pub async fn record_round(
        &self,
        leases: &[(&str, &str, u64, &[u32])],
        chunks: &[LogChunk],
        spawned: &[(String, i64)],
    ) -> Result<Result<(), StoreError>, StoreError> {
        if leases.is_empty() && chunks.is_empty() && spawned.is_empty() {
            return Ok(Ok(()));
        }
        self.write("lease jobs", || async move {
            let mut relaxed = Relaxed(Some(self.writer.acquire().await?));
            let conn = relaxed.conn();
            sqlx::query("PRAGMA synchronous = NORMAL")
                .execute(&mut **conn)
                .await?;
            let leased = Self::lease_tx(conn, leases).await;
            let output = if leased.is_ok() {
                Self::output_tx(conn, chunks, spawned).await
            } else {
                Ok(())
            };
            sqlx::query("PRAGMA synchronous = FULL")
                .execute(&mut **conn)
                .await?;
            relaxed.restored();
            leased?;
            match output {
                // Both parts again: a lease written twice is the same row.
                Err(e) if faults::is_disk_fault(&e) => Err(e),
                other => Ok(other),
            }
        })
        .await
    }

    async fn lease_tx(
        conn: &mut sqlx::pool::PoolConnection<sqlx::Sqlite>,
        leases: &[(&str, &str, u64, &[u32])],
    ) -> Result<(), StoreError> {
        if leases.is_empty() {
            return Ok(());
        }
        // The GPU list travels as a JSON list, which `->>` gives back as
        // the text the `gpus` column holds.
        let rows: Vec<(&str, &str, i64, &[u32])> = leases
            .iter()
            .map(|(job, worker, epoch, gpus)| (*job, *worker, *epoch as i64, *gpus))
            .collect();
        let rows = json_rows(&rows)?;
        let mut tx = sqlx::Connection::begin_with(&mut **conn, BEGIN_WRITE).await?;
        let now = now_ms();
        sqlx::query(
            "UPDATE jobs SET state = ?1, worker_id = l.value ->> 1, lease_epoch = l.value ->> 2, gpus = l.value ->> 3, started_ms = ?2 \
             FROM json_each(?3) AS l WHERE jobs.job_id = l.value ->> 0",
        )
        .bind(JobState::Running.as_str())
        .bind(now)
        .bind(&rows)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE components SET status = ?1, verdict = '', error_kind = '', reason = '', worker_id = l.worker_id, updated_ms = ?2 \
             FROM (SELECT j.family AS family, j.component AS component, e.value ->> 1 AS worker_id, max(e.key) \
                   FROM json_each(?3) AS e JOIN jobs AS j ON j.job_id = e.value ->> 0 GROUP BY j.family, j.component) AS l \
             WHERE components.family = l.family AND components.name = l.component",
        )
        .bind(ComponentStatus::Running.as_str())
        .bind(now)
        .bind(&rows)
        .execute(&mut *tx)
        .await?;
        // An agent attempt's fleet job has no `jobs` row: its try's lease
        // is kept on the attempt, for a restarted orchestrator to adopt.
        sqlx::query(
            "UPDATE agent_attempts SET worker_id = l.value ->> 1, lease_epoch = l.value ->> 2, lease_gpus = l.value ->> 3 \
             FROM json_each(?1) AS l WHERE agent_attempts.fleet_job = l.value ->> 0 AND agent_attempts.fleet_job <> '' AND agent_attempts.state = ?2",
        )
        .bind(&rows)
        .bind(AttemptState::Running.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Reserves every lease epoch up to `through` in one synced commit
    /// (FULL): the floor a restarted process starts above
    /// ([`Store::epoch_floor`]). Never lowers it.
    pub async fn reserve_epochs(&self, through: u64) -> Result<(), StoreError> {
        self.write("reserve lease epochs", || async move {
            let mut tx = self.write_tx().await?;
            sqlx::query("UPDATE lease_epochs SET reserved_to = MAX(reserved_to, ?) WHERE id = 1")
                .bind(through as i64)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Cancels a port no process is running (embedded mode after its
    /// `submit` ended): every component without a final verdict ends as
    /// `blocked` / `cancelled`, queued or running jobs as abandoned, and the
    /// port as `cancelled`. Returns the components it cancelled.
    pub async fn cancel_port(&self, family: &str) -> Result<Vec<String>, StoreError> {
        self.write("cancel port", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            let names: Vec<String> = sqlx::query_scalar(
                "UPDATE components SET status = ?, verdict = ?, error_kind = '', reason = 'cancelled: the port was cancelled', updated_ms = ? WHERE family = ? AND status NOT IN (?, ?) RETURNING name",
            )
            .bind(ComponentStatus::Blocked.as_str())
            .bind(RecordedVerdict::Cancelled.as_str())
            .bind(now)
            .bind(family)
            .bind(ComponentStatus::NonSkipPass.as_str())
            .bind(ComponentStatus::Blocked.as_str())
            .fetch_all(&mut *tx)
            .await?;
            sqlx::query("UPDATE jobs SET state = ? WHERE family = ? AND state IN (?, ?)")
                .bind(JobState::Abandoned.as_str())
                .bind(family)
                .bind(JobState::Queued.as_str())
                .bind(JobState::Running.as_str())
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE ports SET state = ?, updated_ms = ? WHERE family = ?")
                .bind(PortState::Cancelled.as_str())
                .bind(now)
                .bind(family)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(names)
        })
        .await
    }

    /// Forgets a port: its row, components, runs and their output, gate
    /// decisions, questions, attempt ledger, worktree records and
    /// investigations, in one transaction. The next submit starts it from
    /// scratch. Nothing outside the database is touched. False when there
    /// was no such port.
    pub async fn delete_port(&self, family: &str) -> Result<bool, StoreError> {
        self.write("delete port", || async move {
            let mut tx = self.write_tx().await?;
            let known: Option<String> = sqlx::query_scalar("SELECT family FROM ports WHERE family = ?")
                .bind(family)
                .fetch_optional(&mut *tx)
                .await?;
            if known.is_none() {
                return Ok(false);
            }
            sqlx::query(
                "DELETE FROM job_logs WHERE job_id IN (SELECT job_id FROM jobs WHERE family = ?)",
            )
            .bind(family)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM trace_steps WHERE investigation IN (SELECT id FROM trace_investigations WHERE family = ?)")
                .bind(family)
                .execute(&mut *tx)
                .await?;
            for delete in [
                "DELETE FROM trace_investigations WHERE family = ?",
                "DELETE FROM escape_hatches WHERE family = ?",
                "DELETE FROM agent_attempts WHERE family = ?",
                "DELETE FROM agent_usage WHERE family = ?",
                "DELETE FROM agent_worktrees WHERE family = ?",
                "DELETE FROM gate_events WHERE family = ?",
                "DELETE FROM jobs WHERE family = ?",
                "DELETE FROM components WHERE family = ?",
                "DELETE FROM ports WHERE family = ?",
            ] {
                sqlx::query(delete).bind(family).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    /// Resets one final component of a port to `pending` so its next start
    /// runs it again (a pipeline step whose verdict is of other code); its
    /// recorded runs stay as history.
    pub async fn reset_component(&self, family: &str, name: &str) -> Result<(), StoreError> {
        self.write("reset component", || async move {
            sqlx::query("UPDATE components SET status = ?, verdict = '', error_kind = '', reason = '', worker_id = '', updated_ms = ? WHERE family = ? AND name = ?")
                .bind(ComponentStatus::Pending.as_str())
                .bind(now_ms())
                .bind(family)
                .bind(name)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Resets every component of a port to `pending` so the next start runs
    /// them all again; the recorded runs stay as history.
    pub async fn reset_components(&self, family: &str) -> Result<(), StoreError> {
        self.write("reset components", || async move {
            let mut tx = self.write_tx().await?;
            sqlx::query("UPDATE ports SET reset_ms = ? WHERE family = ?")
                .bind(now_ms())
                .bind(family)
                .execute(&mut *tx)
                .await?;
            // Questions of the old run no longer wait: the rerun asks anew.
            sqlx::query("UPDATE escape_hatches SET status = ? WHERE family = ? AND status IN (?, ?)")
                .bind(EscapeStatus::Withdrawn.as_str())
                .bind(family)
                .bind(EscapeStatus::Open.as_str())
                .bind(EscapeStatus::Answered.as_str())
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE components SET status = ?, verdict = '', error_kind = '', reason = '', worker_id = '', updated_ms = ? WHERE family = ?")
                .bind(ComponentStatus::Pending.as_str())
                .bind(now_ms())
                .bind(family)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM gate_events WHERE family = ?")
                .bind(family)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Puts a leased job back in the queue (its worker was lost); its
    /// component reads `queued` again in the same transaction.
    pub async fn requeue_job(&self, job_id: &str, reason: &str) -> Result<(), StoreError> {
        self.write("requeue job", || async move {
            let mut tx = self.write_tx().await?;
            sqlx::query("UPDATE jobs SET state = ?, worker_id = '' WHERE job_id = ?")
                .bind(JobState::Queued.as_str())
                .bind(job_id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE components SET status = ?, verdict = ?, error_kind = '', reason = ?, worker_id = '', updated_ms = ? WHERE (family, name) = (SELECT family, component FROM jobs WHERE job_id = ?)")
                .bind(ComponentStatus::Queued.as_str())
                .bind(RecordedVerdict::InfraError.as_str())
                .bind(reason)
                .bind(now_ms())
                .bind(job_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// The highest lease epoch any process may have handed out: the last
    /// reserved block's end ([`Store::reserve_epochs`]), or a lease row
    /// above it. A restarted orchestrator numbers its leases from above it,
    /// so epochs keep increasing and fencing stays sound even when a power
    /// cut lost lease rows (committed without an fsync).
    pub async fn epoch_floor(&self) -> Result<u64, StoreError> {
        let v: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(COALESCE((SELECT reserved_to FROM lease_epochs WHERE id = 1), 0), COALESCE((SELECT MAX(lease_epoch) FROM jobs), 0))",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(v.unwrap_or(0).max(0) as u64)
    }

    /// Records the result of a run and the component's new state in one
    /// transaction, but only when the job is still running under `epoch`:
    /// returns false for a stale or duplicate result.
    pub async fn finish_job(
        &self,
        job_id: &str,
        epoch: u64,
        result: &JobResult,
    ) -> Result<bool, StoreError> {
        self.write("finish job", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            if !finish_running_job(&mut tx, job_id, epoch, JobState::Finished, result, now).await? {
                return Ok(false);
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    /// Records a run that could not test the code because of its worker's
    /// environment: the job ends in state `environment` (never `finished`,
    /// so no verdict, streak or run count sees it) with its evidence kept
    /// for `fvd logs`. False for a stale or duplicate result.
    pub async fn finish_job_environment(
        &self,
        job_id: &str,
        epoch: u64,
        result: &JobResult,
    ) -> Result<bool, StoreError> {
        self.write("finish job environment", || async move {
            let mut conn = self.writer.acquire().await?;
            finish_running_job(
                &mut conn,
                job_id,
                epoch,
                JobState::Environment,
                result,
                now_ms(),
            )
            .await
        })
        .await
    }

    /// A running job that ran out of GPU memory while it shared its GPU
    /// (`shared_oom`): no verdict and not counted, like an environment
    /// failure; its component queues it again alone. False when the lease
    /// is stale.
    pub async fn finish_job_shared_oom(
        &self,
        job_id: &str,
        epoch: u64,
        result: &JobResult,
    ) -> Result<bool, StoreError> {
        self.write("finish job shared oom", || async move {
            let mut conn = self.writer.acquire().await?;
            finish_running_job(
                &mut conn,
                job_id,
                epoch,
                JobState::SharedOom,
                result,
                now_ms(),
            )
            .await
        })
        .await
    }

    /// A queued job no worker can ever hold (embedded mode's machine lacks
    /// what it needs): it never started and never will.
    pub async fn unplace_job(&self, job_id: &str) -> Result<(), StoreError> {
        self.write("unplace job", || async move {
            sqlx::query("UPDATE jobs SET state = ?, verdict = ?, error_kind = '', finished_ms = ? WHERE job_id = ? AND state = ?")
                .bind(JobState::Unplaced.as_str())
                .bind(RecordedVerdict::Unplaced.as_str())
                .bind(now_ms())
                .bind(job_id)
                .bind(JobState::Queued.as_str())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// A queued component whose run no worker with a working environment
    /// can take: status `environment`, with the scheduler's reason (each
    /// worker and its cause).
    pub async fn set_waiting_env(
        &self,
        family: &str,
        name: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.write("set waiting env", || async move {
            sqlx::query("UPDATE components SET status = ?, verdict = ?, error_kind = '', reason = ?, updated_ms = ? WHERE family = ? AND name = ? AND status IN (?, ?)")
                .bind(ComponentStatus::Environment.as_str())
                .bind(RecordedVerdict::Environment.as_str())
                .bind(reason)
                .bind(now_ms())
                .bind(family)
                .bind(name)
                .bind(ComponentStatus::Queued.as_str())
                .bind(ComponentStatus::Environment.as_str())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Marks abandoned the jobs of a family that were queued when its last
    /// gate died, and those running that no component will ask the
    /// scheduler to adopt (traced reruns and variant runs, `#` in their
    /// component name, and runs of components already final); returns
    /// their components. A component's own run in flight stays `running`:
    /// the resumed component asks the scheduler to adopt it (its worker may
    /// still run it) and abandons it only if no worker does
    /// ([`Store::abandon_job`]), so it is rerun once under a new run number.
    pub async fn abandon_unfinished(&self, family: &str) -> Result<Vec<String>, StoreError> {
        self.write("abandon unfinished", || async move {
            let rows: Vec<String> = sqlx::query_scalar(
                "UPDATE jobs SET state = ?1 WHERE family = ?2 AND (state = ?3 OR (state = ?4 AND (instr(component, '#') > 0 OR component IN (SELECT name FROM components WHERE family = ?2 AND status IN (?5, ?6))))) RETURNING component",
            )
            .bind(JobState::Abandoned.as_str())
            .bind(family)
            .bind(JobState::Queued.as_str())
            .bind(JobState::Running.as_str())
            .bind(ComponentStatus::NonSkipPass.as_str())
            .bind(ComponentStatus::Blocked.as_str())
            .fetch_all(&self.writer)
            .await?;
            Ok(rows)
        })
        .await
    }

    /// A run left `running` by an earlier process that no worker runs any
    /// more: abandoned (it counts as a run if its process had started).
    /// False when it was no longer running.
    pub async fn abandon_job(&self, job_id: &str) -> Result<bool, StoreError> {
        self.write("abandon job", || async move {
            let done =
                sqlx::query("UPDATE jobs SET state = ? WHERE job_id = ? AND state IN (?, ?)")
                    .bind(JobState::Abandoned.as_str())
                    .bind(job_id)
                    .bind(JobState::Queued.as_str())
                    .bind(JobState::Running.as_str())
                    .execute(&self.writer)
                    .await?
                    .rows_affected();
            Ok(done > 0)
        })
        .await
    }

    /// The leases of runs still `running`, and of agent attempts' fleet
    /// jobs still `running`: `(job, family, worker, epoch, GPUs)`. A
    /// restarted orchestrator holds them for their workers to report and
    /// their components to adopt.
    pub async fn running_leases(
        &self,
    ) -> Result<Vec<(String, String, String, u64, Vec<u32>)>, StoreError> {
        let rows = sqlx::query("SELECT job_id, family, worker_id, lease_epoch, gpus FROM jobs WHERE state = ?1 AND lease_epoch IS NOT NULL AND worker_id <> '' \
             UNION ALL SELECT fleet_job, family, worker_id, lease_epoch, lease_gpus FROM agent_attempts WHERE state = ?2 AND fleet_job <> '' AND lease_epoch IS NOT NULL AND worker_id <> ''")
            .bind(JobState::Running.as_str())
            .bind(AttemptState::Running.as_str())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let gpus: Option<String> = r.get("gpus");
                (
                    r.get("job_id"),
                    r.get("family"),
                    r.get("worker_id"),
                    r.get::<i64, _>("lease_epoch") as u64,
                    gpus.and_then(|g| serde_json::from_str(&g).ok())
                        .unwrap_or_default(),
                )
            })
            .collect())
    }

    /// What the component's recorded runs say of the GPU memory its next
    /// run needs, as a run queued now would read it
    /// ([`model::JobRecord::gpu_history`]).
    pub async fn gpu_history(
        &self,
        family: &str,
        component: &str,
    ) -> Result<model::GpuHistory, StoreError> {
        let mut conn = self.pool.acquire().await?;
        steps::gpu_history(&mut conn, family, component).await
    }

    pub async fn job(&self, job_id: &str) -> Result<Option<JobRecord>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{JOB_SELECT} WHERE job_id = ?"
        )))
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| job_row(&r)).transpose()
    }

    /// Runs of one component, oldest first.
    pub async fn jobs_of(
        &self,
        family: &str,
        component: &str,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{JOB_SELECT} WHERE family = ? AND component = ? ORDER BY run_no"
        )))
        .bind(family)
        .bind(component)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_row).collect()
    }

    // ----- logs ------------------------------------------------------------

    /// Appends log chunks and records spawn times `(job_id, at_ms)` in one
    /// transaction that does not wait for an fsync: a crash of the process
    /// loses none of it, a power cut at most what no later durable commit
    /// synced (a finish, an epoch reservation: each syncs the whole log
    /// before it), and that is output of a run that is rerun anyway. Under
    /// load this was one fsync per batch, queued on the device ahead of the
    /// next lease commit.
    ///
    /// The writer connection is back at `synchronous = FULL` before any
    /// other write uses it: one that is not (an error, or this future
    /// dropped half way) is closed, and the pool opens the next one with
    /// FULL.
    pub async fn append_output(
        &self,
        chunks: &[LogChunk],
        spawned: &[(String, i64)],
    ) -> Result<(), StoreError> {
        self.record_round(&[], chunks, spawned).await?
    }

    async fn output_tx(
        conn: &mut sqlx::pool::PoolConnection<sqlx::Sqlite>,
        chunks: &[LogChunk],
        spawned: &[(String, i64)],
    ) -> Result<(), StoreError> {
        if chunks.is_empty() && spawned.is_empty() {
            return Ok(());
        }
        let mut tx = sqlx::Connection::begin_with(&mut **conn, BEGIN_WRITE).await?;
        for c in chunks {
            sqlx::query("INSERT OR IGNORE INTO job_logs (job_id, seq, stream, offset, data) VALUES (?, ?, ?, ?, ?)")
                .bind(&c.job_id)
                .bind(c.seq as i64)
                .bind(c.stream)
                .bind(c.offset as i64)
                .bind(&c.data)
                .execute(&mut *tx)
                .await?;
        }
        // All spawn times in one statement (see `record_round`).
        if !spawned.is_empty() {
            sqlx::query(
                "UPDATE jobs SET spawned_ms = l.value ->> 1 FROM json_each(?) AS l WHERE jobs.job_id = l.value ->> 0",
            )
            .bind(json_rows(spawned)?)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Log chunks of a job with a sequence number above `after_seq`.
    pub async fn logs(
        &self,
        job_id: &str,
        after_seq: Option<u64>,
    ) -> Result<Vec<(u64, i32, Vec<u8>)>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, stream, data FROM job_logs WHERE job_id = ? AND seq > ? ORDER BY seq",
        )
        .bind(job_id)
        .bind(after_seq.map_or(-1, |s| s as i64))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<i64, _>("seq") as u64,
                    r.get::<i64, _>("stream") as i32,
                    r.get::<Vec<u8>, _>("data"),
                )
            })
            .collect())
    }

    // ----- gate ------------------------------------------------------------

    pub async fn record_gate(
        &self,
        family: &str,
        phase: &str,
        outcome: GateOutcome,
        conditions: &[String],
    ) -> Result<GateEventRow, StoreError> {
        self.write("record gate", || async move {
            let at_ms = now_ms();
            sqlx::query("INSERT INTO gate_events (family, phase, outcome, conditions, at_ms) VALUES (?, ?, ?, ?, ?)")
                .bind(family)
                .bind(phase)
                .bind(outcome.as_str())
                .bind(serde_json::to_string(conditions).unwrap_or_default())
                .bind(at_ms)
                .execute(&self.writer)
                .await?;
            Ok(GateEventRow {
                phase: phase.to_string(),
                outcome,
                conditions: conditions.to_vec(),
                at_ms,
            })
        })
        .await
    }

    pub async fn gate_events(&self, family: &str) -> Result<Vec<GateEventRow>, StoreError> {
        let rows = sqlx::query("SELECT phase, outcome, conditions, at_ms FROM gate_events WHERE family = ? ORDER BY id")
            .bind(family)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let conditions: String = r.get("conditions");
                Ok(GateEventRow {
                    phase: r.get("phase"),
                    outcome: state(r, "outcome", "gate_events.outcome")?,
                    conditions: serde_json::from_str(&conditions).map_err(|e| {
                        StoreError::Corrupt {
                            what: "gate_events.conditions",
                            message: e.to_string(),
                        }
                    })?,
                    at_ms: r.get("at_ms"),
                })
            })
            .collect()
    }

    // ----- agent loop ------------------------------------------------------

    pub async fn worktree(
        &self,
        family: &str,
        component: &str,
    ) -> Result<Option<Worktree>, StoreError> {
        let row = sqlx::query("SELECT path, branch, base_commit FROM agent_worktrees WHERE family = ? AND component = ?")
            .bind(family)
            .bind(component)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Worktree {
            path: r.get::<String, _>("path").into(),
            branch: r.get("branch"),
            base_commit: r.get("base_commit"),
            prefix: String::new(),
        }))
    }

    pub async fn record_worktree(
        &self,
        family: &str,
        component: &str,
        wt: &Worktree,
    ) -> Result<(), StoreError> {
        self.write("record worktree", || async move {
            sqlx::query("INSERT INTO agent_worktrees (family, component, path, branch, base_commit, created_ms) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(family, component) DO UPDATE SET path = excluded.path, branch = excluded.branch, base_commit = excluded.base_commit")
                .bind(family)
                .bind(component)
                .bind(wt.path.to_string_lossy().as_ref())
                .bind(&wt.branch)
                .bind(&wt.base_commit)
                .bind(now_ms())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Opens attempt `a.attempt` before its agent starts (state
    /// `running`). Opening it again after a crash keeps the one row and
    /// counts the new try.
    pub async fn begin_attempt(&self, a: &AttemptRow) -> Result<(), StoreError> {
        self.write("begin attempt", || async move {
            sqlx::query("INSERT INTO agent_attempts (family, component, attempt, commit_sha, diff_stat, diff, timed_out, duration_ms, job_before, verdict_before, error_kind_before, reason_before, handoff_status, handoff_summary, handoff_text, started_ms, finished_ms, state, head_before, cookie, tries, kind) VALUES (?, ?, ?, '', '', '', 0, 0, ?, ?, ?, ?, '', '', '', ?, 0, ?, ?, ?, 1, ?) ON CONFLICT(family, component, attempt) DO UPDATE SET state = excluded.state, tries = tries + 1, head_before = excluded.head_before, cookie = excluded.cookie, started_ms = excluded.started_ms, fleet_job = '', lease_epoch = NULL, lease_gpus = NULL, proxy_token_sha256 = '', tools_token_sha256 = ''")
                .bind(&a.family)
                .bind(&a.component)
                .bind(a.attempt as i64)
                .bind(&a.job_before)
                .bind(a.verdict_before.as_str())
                .bind(a.verdict_before.error_kind_str())
                .bind(&a.reason_before)
                .bind(a.started_ms)
                .bind(AttemptState::Running.as_str())
                .bind(&a.head_before)
                .bind(&a.cookie)
                .bind(a.kind.as_str())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// The fleet job of attempt `attempt`'s try, queued now, and the
    /// digests of the tokens its agent is given (see [`FleetTry`]).
    pub async fn set_fleet_try(
        &self,
        family: &str,
        component: &str,
        attempt: u32,
        t: &FleetTry,
    ) -> Result<(), StoreError> {
        self.write("set fleet try", || async move {
            sqlx::query("UPDATE agent_attempts SET fleet_job = ?, lease_epoch = NULL, lease_gpus = NULL, proxy_token_sha256 = ?, tools_token_sha256 = ? WHERE family = ? AND component = ? AND attempt = ? AND state = ?")
                .bind(&t.job_id)
                .bind(&t.proxy_token_sha256)
                .bind(&t.tools_token_sha256)
                .bind(family)
                .bind(component)
                .bind(attempt as i64)
                .bind(AttemptState::Running.as_str())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// The fleet job of a running attempt's try, if it has one and a
    /// worker leased it: what a restarted orchestrator asks to adopt.
    pub async fn fleet_try(
        &self,
        family: &str,
        component: &str,
        attempt: u32,
    ) -> Result<Option<FleetTry>, StoreError> {
        let row = sqlx::query("SELECT fleet_job, proxy_token_sha256, tools_token_sha256 FROM agent_attempts WHERE family = ? AND component = ? AND attempt = ? AND state = ? AND fleet_job <> '' AND lease_epoch IS NOT NULL")
            .bind(family)
            .bind(component)
            .bind(attempt as i64)
            .bind(AttemptState::Running.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| FleetTry {
            job_id: r.get("fleet_job"),
            proxy_token_sha256: r.get("proxy_token_sha256"),
            tools_token_sha256: r.get("tools_token_sha256"),
        }))
    }

    /// Records one tool call of an attempt's agent (`fvd mcp`), numbered
    /// after the attempt's earlier calls.
    pub async fn record_tool_call(&self, c: &ToolCallRow) -> Result<(), StoreError> {
        self.write("record tool call", || async move {
            sqlx::query("INSERT INTO attempt_tool_calls (family, component, attempt, seq, tool, arguments, outcome, detail, duration_ms, gpu_ms, at_ms) VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(seq), 0) + 1 FROM attempt_tool_calls WHERE family = ?1 AND component = ?2 AND attempt = ?3), ?4, ?5, ?6, ?7, ?8, ?9, ?10)")
                .bind(&c.family)
                .bind(&c.component)
                .bind(c.attempt as i64)
                .bind(&c.tool)
                .bind(&c.arguments)
                .bind(&c.outcome)
                .bind(&c.detail)
                .bind(c.duration_ms as i64)
                .bind(c.gpu_ms as i64)
                .bind(c.at_ms)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// The tool calls of a component's attempts, in order.
    pub async fn tool_calls(
        &self,
        family: &str,
        component: &str,
    ) -> Result<Vec<ToolCallRow>, StoreError> {
        let rows = sqlx::query("SELECT attempt, seq, tool, arguments, outcome, detail, duration_ms, gpu_ms, at_ms FROM attempt_tool_calls WHERE family = ? AND component = ? ORDER BY attempt, seq")
            .bind(family)
            .bind(component)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| ToolCallRow {
                family: family.to_string(),
                component: component.to_string(),
                attempt: r.get::<i64, _>("attempt") as u32,
                seq: r.get::<i64, _>("seq") as u32,
                tool: r.get("tool"),
                arguments: r.get("arguments"),
                outcome: r.get("outcome"),
                detail: r.get("detail"),
                duration_ms: r.get::<i64, _>("duration_ms") as u64,
                gpu_ms: r.get::<i64, _>("gpu_ms") as u64,
                at_ms: r.get("at_ms"),
            })
            .collect())
    }

    /// Records which run tests the attempt's commit.
    pub async fn set_attempt_job(
        &self,
        family: &str,
        component: &str,
        attempt: u32,
        job_after: &str,
    ) -> Result<(), StoreError> {
        self.write("set attempt job", || async move {
            sqlx::query("UPDATE agent_attempts SET job_after = ? WHERE family = ? AND component = ? AND attempt = ?")
                .bind(job_after)
                .bind(family)
                .bind(component)
                .bind(attempt as i64)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// The ledger of a component, oldest attempt first.
    pub async fn attempts(
        &self,
        family: &str,
        component: &str,
    ) -> Result<Vec<AttemptRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM agent_attempts WHERE family = ? AND component = ? ORDER BY attempt",
        )
        .bind(family)
        .bind(component)
        .fetch_all(&self.pool)
        .await?;
        let mut usage = self.usage_of(family, component).await?;
        rows.iter()
            .map(|r| {
                Ok(AttemptRow {
                    usage: usage.remove(&(r.get::<i64, _>("attempt") as u32)),
                    family: r.get("family"),
                    component: r.get("component"),
                    attempt: r.get::<i64, _>("attempt") as u32,
                    commit_sha: r.get("commit_sha"),
                    diff_stat: r.get("diff_stat"),
                    diff: r.get("diff"),
                    exit_code: r.get("exit_code"),
                    signal: r.get("signal"),
                    timed_out: r.get("timed_out"),
                    duration_ms: r.get::<i64, _>("duration_ms") as u64,
                    job_before: r.get("job_before"),
                    verdict_before: verdict(
                        r,
                        ("verdict_before", "error_kind_before"),
                        (
                            "agent_attempts.verdict_before",
                            "agent_attempts.error_kind_before",
                        ),
                    )?,
                    reason_before: r.get("reason_before"),
                    job_after: r.get("job_after"),
                    verdict_after: verdict(
                        r,
                        ("verdict_after", "error_kind_after"),
                        (
                            "agent_attempts.verdict_after",
                            "agent_attempts.error_kind_after",
                        ),
                    )?,
                    reason_after: r.get("reason_after"),
                    handoff_status: state(r, "handoff_status", "agent_attempts.handoff_status")?,
                    handoff_summary: r.get("handoff_summary"),
                    handoff_text: r.get("handoff_text"),
                    started_ms: r.get("started_ms"),
                    finished_ms: r.get("finished_ms"),
                    state: state(r, "state", "agent_attempts.state")?,
                    head_before: r.get("head_before"),
                    worker_id: r.get("worker_id"),
                    judge_changed: r
                        .get::<String, _>("judge_changed")
                        .lines()
                        .map(str::to_string)
                        .collect(),
                    judge_diff: r.get("judge_diff"),
                    cookie: r.get("cookie"),
                    tries: r.get::<i64, _>("tries") as u32,
                    gpu_ms_after: r.get::<i64, _>("gpu_ms_after") as u64,
                    kind: state(r, "kind", "agent_attempts.kind")?,
                })
            })
            .collect()
    }

    /// Records an escape hatch under the next free `E###` id of the port,
    /// above `floor` (the highest id people already use in PORT_STATUS.md).
    /// Returns the id given.
    pub async fn raise_escape(&self, e: &EscapeRow, floor: u32) -> Result<String, StoreError> {
        self.write("raise escape", || async move {
            let mut tx = self.write_tx().await?;
            let id = steps::insert_escape(&mut tx, e, floor).await?;
            tx.commit().await?;
            Ok(id)
        })
        .await
    }

    /// The id the next escape hatch of the port will get (see
    /// [`Store::raise_escape`]), for an agent to cite before it asks.
    pub async fn next_escape_id(&self, family: &str, floor: u32) -> Result<String, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM escape_hatches WHERE family = ?")
            .bind(family)
            .fetch_all(&self.pool)
            .await?;
        Ok(escape_id_after(&ids, floor))
    }

    /// Escape hatches of a port, oldest first.
    pub async fn escapes(&self, family: &str) -> Result<Vec<EscapeRow>, StoreError> {
        let rows = sqlx::query("SELECT * FROM escape_hatches WHERE family = ? ORDER BY id")
            .bind(family)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let options: String = r.get("options");
                Ok(EscapeRow {
                    family: r.get("family"),
                    id: r.get("id"),
                    component: r.get("component"),
                    attempt: r.get::<i64, _>("attempt") as u32,
                    phase: r.get("phase"),
                    decision_type: r.get("decision_type"),
                    question: r.get("question"),
                    recommended: r.get("recommended"),
                    options: serde_json::from_str(&options).map_err(|e| StoreError::Corrupt {
                        what: "escape_hatches.options",
                        message: e.to_string(),
                    })?,
                    safe_default: r.get("safe_default"),
                    status: state(r, "status", "escape_hatches.status")?,
                    answer: r.get("answer"),
                    answered_by: r.get("answered_by"),
                    asked_ms: r.get("asked_ms"),
                    answered_ms: r.get("answered_ms"),
                    resolved_attempt: r
                        .get::<Option<i64>, _>("resolved_attempt")
                        .map(|a| a as u32),
                    about: state(r, "about", "escape_hatches.about")?,
                    judge_commit: r.get("judge_commit"),
                })
            })
            .collect()
    }

    /// Records the answer to an open escape hatch and returns the hatch.
    /// Only an `open` hatch takes an answer: a second answer is refused.
    pub async fn answer_escape(
        &self,
        family: &str,
        id: &str,
        answer: &str,
    ) -> Result<EscapeRow, StoreError> {
        self.answer_escape_by(family, id, answer, "").await
    }

    /// [`Store::answer_escape`] by the credential `by`, logged as its
    /// `answer` action in the same transaction.
    pub async fn answer_escape_by(
        &self,
        family: &str,
        id: &str,
        answer: &str,
        by: &str,
    ) -> Result<EscapeRow, StoreError> {
        self.write("answer escape", || async move {
            let mut tx = self.write_tx().await?;
            steps::escape_in(&mut tx, family, id, EscapeStatus::Open).await?;
            sqlx::query("UPDATE escape_hatches SET status = ?, answer = ?, answered_by = ?, answered_ms = ? WHERE family = ? AND id = ?")
                .bind(EscapeStatus::Answered.as_str())
                .bind(answer)
                .bind(by)
                .bind(now_ms())
                .bind(family)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            team::insert_action(&mut tx, family, team::Action::Answer, by, id).await?;
            tx.commit().await?;
            self.escapes(family)
                .await?
                .into_iter()
                .find(|e| e.id == id)
                .ok_or_else(|| StoreError::UnknownEscape {
                    family: family.into(),
                    id: id.into(),
                })
        })
        .await
    }

    /// Marks an answered escape hatch acted on (`resolved`) and, when the
    /// answer runs `rerun` again (a quality test whose references were
    /// seeded), resets that component to `pending` in the same
    /// transaction: the answer is acted on once.
    pub async fn resolve_escape(
        &self,
        family: &str,
        id: &str,
        rerun: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write("resolve escape", || async move {
            let mut tx = self.write_tx().await?;
            steps::escape_in(&mut tx, family, id, EscapeStatus::Answered).await?;
            sqlx::query("UPDATE escape_hatches SET status = ? WHERE family = ? AND id = ?")
                .bind(EscapeStatus::Resolved.as_str())
                .bind(family)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            if let Some(name) = rerun {
                sqlx::query("UPDATE components SET status = ?, verdict = '', error_kind = '', reason = '', worker_id = '', updated_ms = ? WHERE family = ? AND name = ?")
                    .bind(ComponentStatus::Pending.as_str())
                    .bind(now_ms())
                    .bind(family)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    // ----- workers ---------------------------------------------------------

    pub async fn upsert_worker(
        &self,
        worker_id: &str,
        host: &str,
        gpus_json: &str,
        cpu_slots: u32,
    ) -> Result<(), StoreError> {
        self.write("upsert worker", || async move {
            sqlx::query("INSERT INTO workers (worker_id, host, gpus, cpu_slots, last_seen_ms) VALUES (?, ?, ?, ?, ?) ON CONFLICT(worker_id) DO UPDATE SET host = excluded.host, gpus = excluded.gpus, cpu_slots = excluded.cpu_slots, last_seen_ms = excluded.last_seen_ms")
                .bind(worker_id)
                .bind(host)
                .bind(gpus_json)
                .bind(cpu_slots as i64)
                .bind(now_ms())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }
}

const JOB_SELECT: &str = "SELECT job_id, family, component, run_no, state, lease_epoch, worker_id, argv, cwd, gpus_needed, timeout_ms, verdict, error_kind, reason, exit_code, signal, duration_ms, output_tail, queued_ms, started_ms, finished_ms, commit_sha, code_prefix, peak_gpu_mib FROM jobs";

/// The state in column `name` of `r`, read through its one mapping;
/// `column` names it in the error (`table.column`).
pub(crate) fn state<T: FromStr<Err = UnknownState>>(
    r: &sqlx::sqlite::SqliteRow,
    name: &str,
    column: &'static str,
) -> Result<T, StoreError> {
    r.get::<String, _>(name)
        .parse()
        .map_err(|source| StoreError::State { column, source })
}

/// The verdict in columns `cols` (`verdict`, `error_kind`) of `r`, read
/// through its one mapping; `names` name them in the error
/// (`table.column`).
pub(crate) fn verdict(
    r: &sqlx::sqlite::SqliteRow,
    cols: (&str, &str),
    names: (&'static str, &'static str),
) -> Result<RecordedVerdict, StoreError> {
    let text: String = r.get(cols.0);
    let kind: String = r.get(cols.1);
    RecordedVerdict::from_columns(&text, &kind).map_err(|source| StoreError::State {
        column: if source.kind == "error kind" {
            names.1
        } else {
            names.0
        },
        source,
    })
}

/// The columns of a verdict and its error's kind.
pub(crate) const VERDICT: (&str, &str) = ("verdict", "error_kind");

/// Why the last finished run of a component row (its `last_*` columns)
/// did not earn a pass: none finished, it recorded another verdict, or its
/// stored report does not classify as a pass. `None`: it earned one.
fn unearned(r: &sqlx::sqlite::SqliteRow) -> Result<Option<String>, StoreError> {
    use fvd_contracts::verdict::{self, JunitEvidence, RunEvidence};
    let Some(job) = r.get::<Option<String>, _>("last_job") else {
        return Ok(Some("it has no finished run".to_string()));
    };
    let recorded = verdict(
        r,
        ("last_verdict", "last_error_kind"),
        ("jobs.verdict", "jobs.error_kind"),
    )?;
    if !recorded.is_pass() {
        return Ok(Some(format!("its last run {job} recorded {recorded}")));
    }
    let junit: String = r.get("last_junit");
    let ev = RunEvidence {
        junit: JunitEvidence::Xml(&junit),
        timed_out: false,
        cancelled: false,
        exit_code: r.get::<Option<i64>, _>("last_exit").map(|c| c as i32),
        signal: r.get::<Option<i64>, _>("last_signal").map(|s| s as i32),
        output_tail: "",
        worker_lost: false,
        // Runs recorded before the integrity check owe no report of it; a
        // finding in the report still counts.
        plugin: false,
    };
    // The example is judged by its exit status: it has no report.
    let name: String = r.get("name");
    let v = if name == verdict::EXAMPLE_STEP {
        verdict::classify_exit(&ev, &name)
    } else {
        verdict::classify(&ev)
    };
    Ok((!v.is_pass()).then(|| format!("the report of its last run {job} reads {}", v.status())))
}

fn port_row(r: &sqlx::sqlite::SqliteRow) -> Result<PortRow, StoreError> {
    Ok(PortRow {
        family: r.get("family"),
        repo: r.get("repo"),
        spec_path: r.get("spec_path"),
        spec_toml: r.get("spec_toml"),
        state: state(r, "state", "ports.state")?,
        phase: r.get("phase"),
        port_status_path: r.get("port_status_path"),
        commit: r.get("commit_sha"),
    })
}

fn job_row(r: &sqlx::sqlite::SqliteRow) -> Result<JobRecord, StoreError> {
    let argv: String = r.get("argv");
    Ok(JobRecord {
        job_id: r.get("job_id"),
        family: r.get("family"),
        component: r.get("component"),
        run_no: r.get::<i64, _>("run_no") as u32,
        state: state(r, "state", "jobs.state")?,
        lease_epoch: r.get::<i64, _>("lease_epoch") as u64,
        worker_id: r.get("worker_id"),
        argv: serde_json::from_str(&argv).map_err(|e| StoreError::Corrupt {
            what: "jobs.argv",
            message: e.to_string(),
        })?,
        cwd: r.get("cwd"),
        gpus_needed: r.get::<i64, _>("gpus_needed") as u32,
        timeout_ms: r.get::<i64, _>("timeout_ms") as u64,
        verdict: verdict(r, VERDICT, ("jobs.verdict", "jobs.error_kind"))?,
        reason: r.get("reason"),
        exit_code: r.get("exit_code"),
        signal: r.get("signal"),
        duration_ms: r.get::<Option<i64>, _>("duration_ms").map(|d| d as u64),
        output_tail: r.get("output_tail"),
        queued_ms: r.get("queued_ms"),
        started_ms: r.get("started_ms"),
        finished_ms: r.get("finished_ms"),
        env_names: Vec::new(),
        commit: r.get("commit_sha"),
        code_prefix: r.get("code_prefix"),
        expected_ms: None,
        peak_gpu_mib: r
            .get::<Option<i64>, _>("peak_gpu_mib")
            .map(|m| m.max(0) as u64),
        gpu_history: model::GpuHistory::default(),
    })
}

/// The writer connection while it may be at `synchronous = NORMAL`
/// ([`Store::append_output`]): dropped before [`Relaxed::restored`], it is
/// closed instead of going back to the pool, so no later commit runs
/// without its fsync.
struct Relaxed(Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>);

impl Relaxed {
    fn conn(&mut self) -> &mut sqlx::pool::PoolConnection<sqlx::Sqlite> {
        self.0.as_mut().expect("held until restored")
    }

    /// Back at FULL: the connection returns to the pool.
    fn restored(mut self) {
        self.0.take();
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a fresh temporary folder (kept while the folder is).
    pub(crate) async fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_path(&dir.path().join("state.db"))
            .await
            .unwrap();
        (dir, store)
    }

    fn port(family: &str) -> PortRow {
        PortRow {
            family: family.into(),
            repo: "/repo".into(),
            spec_path: "port.toml".into(),
            spec_toml: "".into(),
            state: PortState::Running,
            phase: "P0".into(),
            port_status_path: String::new(),
            commit: "c0ffee".repeat(6) + "c0ff",
        }
    }

    #[tokio::test]
    async fn a_store_whose_folder_was_deleted_keeps_reading_and_writing_it() {
        let (dir, store) = temp_store().await;
        store.create_port(&port("p"), &["c".into()]).await.unwrap();
        std::fs::remove_dir_all(dir.path()).unwrap();
        // Twice as many concurrent reads as there are readers, several
        // times over: none may need a connection that opens the file anew.
        assert_eq!(READERS, 4);
        for _ in 0..3 {
            let c = || store.components("p");
            let r = tokio::join!(c(), c(), c(), c(), c(), c(), c(), c());
            for r in [r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7] {
                assert_eq!(r.unwrap().len(), 1);
            }
        }
        store
            .set_port_state("p", PortState::Blocked, "P6")
            .await
            .unwrap();
        assert_eq!(
            store.port("p").await.unwrap().unwrap().state,
            PortState::Blocked
        );
    }

    fn job(family: &str, component: &str) -> JobRecord {
        JobRecord {
            family: family.into(),
            component: component.into(),
            argv: vec!["true".into()],
            cwd: "/".into(),
            timeout_ms: 1000,
            commit: "ab".repeat(20),
            code_prefix: "examples/p/".into(),
            ..JobRecord::default()
        }
    }

    /// A real, small file system (tmpfs of `mib` MiB) at a fresh folder,
    /// unmounted when dropped: a full disk without simulating one. Needs
    /// root, as the tests run here and in CI; fails, never skips, without.
    pub(crate) struct SmallDisk {
        pub dir: tempfile::TempDir,
    }

    impl SmallDisk {
        pub(crate) fn mount(mib: u32) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let out = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "fvd-test"])
                .arg(dir.path())
                .output()
                .expect("run mount");
            assert!(
                out.status.success(),
                "a full-disk test mounts a tmpfs and needs root: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Self { dir }
        }

        /// Fills the disk with one file: the next write that needs a block
        /// fails with ENOSPC.
        pub(crate) fn fill(&self) -> std::path::PathBuf {
            use std::io::Write;
            let path = self.dir.path().join("filler");
            let mut f = std::fs::File::create(&path).unwrap();
            let block = vec![0x5a_u8; 64 * 1024];
            while f.write_all(&block).is_ok() {}
            while f.write_all(&[0x5a]).is_ok() {}
            path
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }

    /// A transaction too large to fit on a full disk: it fails at commit.
    fn big_job(family: &str) -> JobRecord {
        JobRecord {
            argv: vec!["x".repeat(64 * 1024)],
            ..job(family, "a")
        }
    }

    #[tokio::test]
    async fn a_commit_that_fails_on_a_full_disk_leaves_the_writer_usable() {
        let disk = SmallDisk::mount(2);
        let store = Store::open_path(&disk.dir.path().join("state.db"))
            .await
            .unwrap();
        store.create_port(&port("p"), &["a".into()]).await.unwrap();
        let filler = disk.fill();
        for _ in 0..3 {
            let e = store.queue_job(&big_job("p")).await.unwrap_err();
            assert!(faults::is_disk_fault(&e), "{e}");
        }
        let fault = store.write_fault().expect("the fault is known");
        assert!(fault.error.contains("full"), "{fault:?}");
        std::fs::remove_file(filler).unwrap();
        // The failed commits left no transaction open on the writer: the
        // next ones begin and commit (they were refused with "begin_with
        // at non-zero transaction depth" until the process restarted).
        let j = store.queue_job(&big_job("p")).await.unwrap();
        assert_eq!(j.run_no, 1, "no failed try left a row");
        store.queue_job(&job("p", "a")).await.unwrap();
        assert_eq!(store.write_fault(), None);
    }

    #[tokio::test]
    async fn with_write_retry_a_write_waits_for_the_disk_then_commits_once() {
        let disk = SmallDisk::mount(2);
        let store = Store::open_path(&disk.dir.path().join("state.db"))
            .await
            .unwrap()
            .with_write_retry(faults::Backoff {
                first: Duration::from_millis(1),
                max: Duration::from_millis(20),
            });
        store.create_port(&port("p"), &["a".into()]).await.unwrap();
        let mut faults = store.watch_write_faults();
        let filler = disk.fill();
        let writer = store.clone();
        let write = fvd_telemetry::spawn(async move { writer.queue_job(&big_job("p")).await });
        tokio::time::timeout(Duration::from_secs(20), faults.wait_for(Option::is_some))
            .await
            .expect("the fault is announced")
            .unwrap();
        assert!(!write.is_finished(), "the write waits for the disk");
        std::fs::remove_file(filler).unwrap();
        let j = tokio::time::timeout(Duration::from_secs(20), write)
            .await
            .expect("the write goes through once space returns")
            .unwrap()
            .unwrap();
        assert_eq!(j.run_no, 1);
        assert_eq!(store.write_fault(), None, "the fault is over");
        let runs = store.jobs_of("p", "a").await.unwrap();
        assert_eq!(runs.len(), 1, "committed once: {runs:?}");
    }

    /// job id, state, worker, epoch, GPUs, spawn time, whether it started.
    type LeaseRow = (String, String, String, i64, String, Option<i64>, bool);

    #[tokio::test]
    async fn the_write_ahead_log_is_checkpointed_beside_the_writer_not_in_its_commits() {
        let (_dir, store) = crate::tests::temp_store().await;
        let auto: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
            .fetch_one(&store.writer)
            .await
            .unwrap();
        assert_eq!(auto, 0, "a commit never copies the log itself");
        // Over SQLite's 1,000-page threshold: its own checkpoint would
        // have run inside one of these commits.
        let jobs: Vec<JobRecord> = (0..3000)
            .map(|i| JobRecord {
                argv: vec!["x".repeat(2000)],
                ..job("p", &format!("c{i}"))
            })
            .collect();
        store.create_port(&port("p"), &[]).await.unwrap();
        store.queue_jobs(&jobs).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (log, copied) = store.last_checkpoint().unwrap();
            if log > 1000 && copied == log {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no background checkpoint copied the log: {log} frames, {copied} copied"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn output_is_stored_and_the_writer_is_durable_again_after_it() {
        let (_dir, store) = crate::tests::temp_store().await;
        let synchronous = || async {
            sqlx::query_scalar::<_, i64>("PRAGMA synchronous")
                .fetch_one(&store.writer)
                .await
                .unwrap()
        };
        assert_eq!(synchronous().await, 2, "the writer opens with FULL");
        let chunk = LogChunk {
            job_id: "j1".into(),
            seq: 0,
            stream: 1,
            offset: 0,
            data: b"hello".to_vec(),
        };
        store.append_output(&[chunk], &[]).await.unwrap();
        assert_eq!(
            synchronous().await,
            2,
            "a lease committed after output must wait for its fsync"
        );
        assert_eq!(
            store.logs("j1", None).await.unwrap(),
            [(0, 1, b"hello".to_vec())]
        );
    }

    #[tokio::test]
    async fn a_writer_dropped_while_relaxed_is_closed_not_reused() {
        let (_dir, store) = crate::tests::temp_store().await;
        let mut relaxed = Relaxed(Some(store.writer.acquire().await.unwrap()));
        sqlx::query("PRAGMA synchronous = NORMAL")
            .execute(&mut **relaxed.conn())
            .await
            .unwrap();
        // As when `append_output` fails or is cancelled half way.
        drop(relaxed);
        let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&store.writer)
            .await
            .unwrap();
        assert_eq!(level, 2, "the next writer connection commits with FULL");
    }

    /// Placement by expected duration reads a run's estimate from its
    /// component's last finished runs, as it is queued.
    #[tokio::test]
    async fn a_queued_run_expects_the_median_of_its_components_last_runs() {
        let (_dir, store) = crate::tests::temp_store().await;
        store
            .create_port(&port("p"), &["a".into(), "b".into()])
            .await
            .unwrap();
        let mut epoch = 0;
        let mut run = |ms: Option<u64>| {
            let store = store.clone();
            epoch += 1;
            let epoch = epoch;
            async move {
                let j = store.queue_job(&job("p", "a")).await.unwrap();
                store.lease_job(&j.job_id, "w", epoch, &[]).await.unwrap();
                if let Some(ms) = ms {
                    let r = JobResult {
                        duration_ms: ms,
                        ..JobResult::default()
                    };
                    assert!(store.finish_job(&j.job_id, epoch, &r).await.unwrap());
                }
                j.expected_ms
            }
        };
        assert_eq!(run(Some(9_000)).await, None, "nothing known before a run");
        assert_eq!(run(Some(1_000)).await, Some(9_000));
        assert_eq!(run(Some(2_000)).await, Some(5_000), "even: the middle two");
        // A run still in flight (or lost) is no evidence.
        assert_eq!(run(None).await, Some(2_000));
        for ms in [3_000, 4_000, 5_000, 6_000] {
            run(Some(ms)).await;
        }
        // Only the last five finished runs count: 2, 3, 4, 5, 6 s.
        assert_eq!(run(None).await, Some(4_000));
        let b = store.queue_job(&job("p", "b")).await.unwrap();
        assert_eq!(b.expected_ms, None, "another component's runs do not count");
    }

    /// A run's peak GPU memory reads back as stored and unknown stays
    /// unknown; a queued run reads what its component's runs ask for: the
    /// most of its last finished runs with an ask, and the most of its
    /// `shared_oom` runs, however long ago.
    #[tokio::test]
    async fn a_run_s_peak_round_trips_and_its_component_s_asks_are_read_when_queued() {
        use crate::model::GpuHistory;
        let (_dir, store) = crate::tests::temp_store().await;
        store
            .create_port(&port("p"), &["a".into(), "b".into()])
            .await
            .unwrap();
        let mut epoch = 0;
        let mut run = |peak: Option<u64>, next: Option<u64>, oom: bool| {
            let store = store.clone();
            epoch += 1;
            let epoch = epoch;
            async move {
                let j = store.queue_job(&job("p", "a")).await.unwrap();
                store.lease_job(&j.job_id, "w", epoch, &[0]).await.unwrap();
                let r = JobResult {
                    peak_gpu_mib: peak,
                    next_gpu_mib: next,
                    ..JobResult::default()
                };
                let done = if oom {
                    store.finish_job_shared_oom(&j.job_id, epoch, &r).await
                } else {
                    store.finish_job(&j.job_id, epoch, &r).await
                };
                assert!(done.unwrap());
                let read = store.job(&j.job_id).await.unwrap().unwrap();
                assert_eq!(read.peak_gpu_mib, peak, "{}", j.job_id);
                j.gpu_history
            }
        };
        let none = GpuHistory::default();
        assert_eq!(run(None, None, false).await, none, "nothing known yet");
        assert_eq!(run(Some(1000), Some(1280), false).await, none);
        let h = run(Some(0), Some(0), false).await;
        assert_eq!(h.learned_mib, Some(1280));
        // A shared_oom run's ask counts as a raise, not as a learned ask.
        let h = run(Some(700), Some(2560), true).await;
        assert_eq!(h.learned_mib, Some(1280));
        // queued right after the shared_oom run (run 4): it runs alone
        let h = run(Some(3000), Some(3776), false).await;
        assert_eq!(
            h,
            GpuHistory {
                learned_mib: Some(1280),
                raised_mib: Some(2560),
                after_shared_oom: Some(4),
            }
        );
        for _ in 0..4 {
            run(Some(100), Some(128), false).await;
        }
        // Only the last five finished runs with an ask count (the 3776 one
        // and four of 128), and the raise is kept.
        let h = run(None, None, false).await;
        assert_eq!(
            h,
            GpuHistory {
                learned_mib: Some(3776),
                raised_mib: Some(2560),
                after_shared_oom: None,
            }
        );
        // A run with no peak is no evidence; one more with a peak is.
        let h = run(Some(100), Some(128), false).await;
        assert_eq!(h.learned_mib, Some(3776));
        let h = run(None, None, false).await;
        assert_eq!(h.learned_mib, Some(128), "the 3776 run is now six back");
        let b = store.queue_job(&job("p", "b")).await.unwrap();
        assert_eq!(b.gpu_history, none, "another component's runs do not count");
        assert_eq!(b.peak_gpu_mib, None);
    }

    /// Leases commit without an fsync, so a power cut may lose their rows;
    /// the reserved block (synced) still says which epochs were handed
    /// out, and a reopened store starts above it.
    #[tokio::test]
    async fn the_epoch_floor_is_the_reserved_block_even_when_lease_rows_are_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open_path(&path).await.unwrap();
        assert_eq!(store.epoch_floor().await.unwrap(), 0);
        store.create_port(&port("p"), &["a".into()]).await.unwrap();
        store.reserve_epochs(1_000).await.unwrap();
        let j = store.queue_job(&job("p", "a")).await.unwrap();
        store.lease_job(&j.job_id, "w", 7, &[]).await.unwrap();
        assert_eq!(store.epoch_floor().await.unwrap(), 1_000);
        store.reserve_epochs(10).await.unwrap();
        assert_eq!(store.epoch_floor().await.unwrap(), 1_000, "never lowered");
        drop(store);
        // What a power cut leaves of a lease committed at NORMAL: the row
        // as it was queued.
        {
            let store = Store::open_path(&path).await.unwrap();
            sqlx::query("UPDATE jobs SET state = 'queued', lease_epoch = 0, worker_id = ''")
                .execute(&store.writer)
                .await
                .unwrap();
        }
        let store = Store::open_path(&path).await.unwrap();
        assert_eq!(store.epoch_floor().await.unwrap(), 1_000);
        // A lease row above the reservation (none is written so) still
        // counts.
        store.lease_job(&j.job_id, "w", 5_000, &[]).await.unwrap();
        assert_eq!(store.epoch_floor().await.unwrap(), 5_000);
    }

    #[tokio::test]
    async fn a_round_of_leases_is_recorded_job_by_job() {
        let (_dir, store) = crate::tests::temp_store().await;
        store
            .create_port(&port("p"), &["a".into(), "b".into(), "c".into()])
            .await
            .unwrap();
        let a = store.queue_job(&job("p", "a")).await.unwrap();
        let b = store.queue_job(&job("p", "b")).await.unwrap();
        let a2 = store.queue_job(&job("p", "a")).await.unwrap();
        let c = store.queue_job(&job("p", "c")).await.unwrap();
        store
            .lease_jobs(&[
                (a.job_id.as_str(), "w1", 5, &[0, 1]),
                (b.job_id.as_str(), "w2", 6, &[]),
                (a2.job_id.as_str(), "w3", 7, &[3]),
            ])
            .await
            .unwrap();
        store.lease_jobs(&[]).await.unwrap();
        store
            .append_output(&[], &[(a.job_id.clone(), 11), (b.job_id.clone(), 12)])
            .await
            .unwrap();
        let rows: Vec<LeaseRow> = sqlx::query_as(
            "SELECT job_id, state, worker_id, lease_epoch, gpus, spawned_ms, started_ms IS NOT NULL FROM jobs ORDER BY rowid",
        )
        .fetch_all(&store.pool)
        .await
        .unwrap();
        let row = |id: &str, state: &str, w: &str, e: i64, g: &str, sp: Option<i64>, st: bool| {
            (
                id.to_string(),
                state.to_string(),
                w.to_string(),
                e,
                g.to_string(),
                sp,
                st,
            )
        };
        assert_eq!(
            rows,
            [
                row(&a.job_id, "running", "w1", 5, "[0,1]", Some(11), true),
                row(&b.job_id, "running", "w2", 6, "[]", Some(12), true),
                row(&a2.job_id, "running", "w3", 7, "[3]", None, true),
                row(&c.job_id, "queued", "", 0, "[]", None, false),
            ]
        );
        // A component leased twice in the round names the last worker.
        let comps: Vec<(String, String, String)> = store
            .components("p")
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.status.as_str().to_string(), c.worker_id))
            .collect();
        assert_eq!(
            comps,
            [
                ("a".to_string(), "running".to_string(), "w3".to_string()),
                ("b".to_string(), "running".to_string(), "w2".to_string()),
                ("c".to_string(), "queued".to_string(), String::new()),
            ]
        );
        assert_eq!(store.epoch_floor().await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_port_s_trace_context_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open_path(&path).await.unwrap();
        assert_eq!(store.port_traceparent("p").await.unwrap(), None);
        store.create_port(&port("p"), &["a".into()]).await.unwrap();
        assert_eq!(store.port_traceparent("p").await.unwrap(), None);
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        store.set_port_traceparent("p", tp).await.unwrap();
        drop(store);
        let store = Store::open_path(&path).await.unwrap();
        assert_eq!(
            store.port_traceparent("p").await.unwrap().as_deref(),
            Some(tp)
        );
    }

    #[tokio::test]
    async fn survives_reopen_and_fences_stale_results() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open_path(&path).await.unwrap();
        assert!(store.create_port(&port("p"), &["a".into()]).await.unwrap());
        assert!(!store.create_port(&port("p"), &["a".into()]).await.unwrap());
        let j = store.queue_job(&job("p", "a")).await.unwrap();
        assert_eq!(j.run_no, 1);
        assert_eq!(j.job_id, "p.a.1");
        store.lease_job(&j.job_id, "w1", 7, &[]).await.unwrap();
        drop(store);

        let store = Store::open_path(&path).await.unwrap();
        assert_eq!(store.epoch_floor().await.unwrap(), 7);
        // The commit the port is pinned to, and each job's, are kept.
        assert_eq!(
            store.port("p").await.unwrap().unwrap().commit,
            port("p").commit
        );
        let kept = store.job(&j.job_id).await.unwrap().unwrap();
        assert_eq!(
            (kept.commit.as_str(), kept.code_prefix.as_str()),
            (j.commit.as_str(), "examples/p/")
        );
        let result = JobResult {
            verdict: RecordedVerdict::NonSkipPass,
            ..JobResult::default()
        };
        assert!(
            !store.finish_job(&j.job_id, 6, &result).await.unwrap(),
            "stale epoch must be refused"
        );
        assert!(store.finish_job(&j.job_id, 7, &result).await.unwrap());
        assert!(
            !store.finish_job(&j.job_id, 7, &result).await.unwrap(),
            "a duplicate result must be refused"
        );
        let runs = store.jobs_of("p", "a").await.unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].verdict, RecordedVerdict::NonSkipPass);
    }

    #[tokio::test]
    async fn runs_count_only_runs_that_started() {
        let (_dir, store) = crate::tests::temp_store().await;
        store
            .create_port(&port("p"), &["a".into(), "b".into()])
            .await
            .unwrap();
        let runs = |store: Store| async move {
            store
                .components("p")
                .await
                .unwrap()
                .iter()
                .map(|c| (c.name.clone(), c.runs))
                .collect::<Vec<_>>()
        };
        let j1 = store.queue_job(&job("p", "a")).await.unwrap();
        store.queue_job(&job("p", "b")).await.unwrap();
        assert_eq!(
            runs(store.clone()).await,
            [("a".into(), 0), ("b".into(), 0)]
        );
        store.lease_job(&j1.job_id, "w", 1, &[]).await.unwrap();
        // A lost worker's job goes back to the queue and starts again: one run.
        store.requeue_job(&j1.job_id, "worker lost").await.unwrap();
        store.lease_job(&j1.job_id, "w2", 2, &[]).await.unwrap();
        store
            .append_output(&[], &[(j1.job_id.clone(), 1)])
            .await
            .unwrap();
        // Queued, then cancelled before any worker took it (the crash that
        // abandons it also cuts off a's run, whose process had started).
        store.queue_job(&job("p", "a")).await.unwrap();
        store.abandon_unfinished("p").await.unwrap();
        // A traced rerun is no run of the component.
        let t = store.queue_job(&job("p", "a#trace")).await.unwrap();
        store.lease_job(&t.job_id, "w", 3, &[]).await.unwrap();
        assert_eq!(
            runs(store.clone()).await,
            [("a".into(), 1), ("b".into(), 0)]
        );
    }

    /// A database written before migration 0016 (schema 14, with runs,
    /// components, attempts and variant rows in it) migrates, and every
    /// error reads back with the kind its reason named; one whose reason
    /// names none (fvd's own failure) reads without one.
    #[tokio::test]
    async fn a_database_of_schema_14_migrates_and_keeps_each_error_s_kind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        {
            let opts = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true);
            let mut conn = opts.connect().await.unwrap();
            sqlx::query("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_ms INTEGER NOT NULL)")
                .execute(&mut conn)
                .await
                .unwrap();
            for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v <= 14) {
                sqlx::raw_sql(*sql).execute(&mut conn).await.unwrap();
                sqlx::query("INSERT INTO schema_migrations VALUES (?, 0)")
                    .bind(version)
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
            sqlx::raw_sql(
                "INSERT INTO ports (family, repo, spec_path, spec_toml, state, phase, created_ms, updated_ms) VALUES ('p', '/r', '/r/port.toml', '', 'blocked', 'P7', 1, 1);
                 INSERT INTO components (family, name, status, verdict, reason, updated_ms) VALUES
                   ('p', 'a', 'blocked', 'error', 'error:collection: t.py: SyntaxError', 1),
                   ('p', 'b', 'blocked', 'error', 'error: agent loop cannot start: no git', 1),
                   ('p', 'c', 'blocked', 'error', 'error: error:cancelled: run cancelled before it finished', 1),
                   ('p', 'd', 'blocked', 'debug_red', 'debug_red: t::x: 2 != 3', 1),
                   ('p', 'e', 'agent', 'error', '  error:no_tests: collected 0 items', 1);
                 INSERT INTO jobs (job_id, family, component, run_no, state, argv, cwd, gpus_needed, timeout_ms, verdict, reason, queued_ms) VALUES
                   ('p.a.1', 'p', 'a', 1, 'finished', '[]', '/r', 0, 1, 'error', 'error:collection: t.py: SyntaxError', 1),
                   ('p.d.1', 'p', 'd', 1, 'finished', '[]', '/r', 0, 1, 'debug_red', 'debug_red: t::x: 2 != 3', 1);
                 INSERT INTO agent_attempts (family, component, attempt, commit_sha, diff_stat, diff, timed_out, duration_ms, job_before, verdict_before, reason_before, verdict_after, reason_after, handoff_status, handoff_summary, handoff_text, started_ms, finished_ms) VALUES
                   ('p', 'e', 1, '', '', '', 0, 0, 'p.e.1', 'error', 'error:no_tests: collected 0 items', 'error', 'error:crashed: killed by signal 11', 'valid', '', '', 1, 2);
                 INSERT INTO variant_runs (family, component, red_job_id, position, name, env, state, verdict, reason, finding, started_ms) VALUES
                   ('p', 'd', 'p.d.1', 1, 'v', '[]', 'done', 'error', 'error:setup: fixture failed', 'other', 1);",
            )
            .execute(&mut conn)
            .await
            .unwrap();
        }
        let store = Store::open_path(&path).await.unwrap();
        let kinds: Vec<(String, RecordedVerdict)> = store
            .components("p")
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.verdict))
            .collect();
        use fvd_contracts::verdict::ErrorKind as K;
        assert_eq!(
            kinds,
            [
                ("a".into(), RecordedVerdict::Error(Some(K::Collection))),
                ("b".into(), RecordedVerdict::Error(None)),
                ("c".into(), RecordedVerdict::Error(Some(K::Cancelled))),
                ("d".into(), RecordedVerdict::DebugRed),
                ("e".into(), RecordedVerdict::Error(Some(K::NoTests))),
            ]
        );
        let job = store.job("p.a.1").await.unwrap().unwrap();
        assert_eq!(job.verdict, RecordedVerdict::Error(Some(K::Collection)));
        assert_eq!(job.peak_gpu_mib, None, "a run from before 0022: unknown");
        let a = &store.attempts("p", "e").await.unwrap()[0];
        assert_eq!(
            (a.verdict_before, a.verdict_after, a.state, a.handoff_status),
            (
                RecordedVerdict::Error(Some(K::NoTests)),
                RecordedVerdict::Error(Some(K::Crashed)),
                AttemptState::Recorded,
                HandoffStatus::Valid
            )
        );
        let v = &store.variant_table("p", "d").await.unwrap()[0];
        assert_eq!(v.verdict, RecordedVerdict::Error(Some(K::Setup)));
        // The reason is kept as it was; only the kind moved beside it.
        assert_eq!(job.reason, "error:collection: t.py: SyntaxError");
    }

    #[tokio::test]
    async fn an_unknown_state_in_the_database_is_an_error_naming_it() {
        let (_dir, store) = crate::tests::temp_store().await;
        store.create_port(&port("p"), &["a".into()]).await.unwrap();
        store.queue_job(&job("p", "a")).await.unwrap();
        for (sql, read) in [
            ("UPDATE ports SET state = 'in_progress'", "ports.state"),
            ("UPDATE components SET status = 'done'", "components.status"),
            ("UPDATE jobs SET state = 'lost'", "jobs.state"),
            (
                "UPDATE jobs SET verdict = 'passed', state = 'finished'",
                "jobs.verdict",
            ),
            (
                "UPDATE jobs SET error_kind = 'oops', verdict = 'error'",
                "jobs.error_kind",
            ),
            (
                "UPDATE components SET verdict = 'green', status = 'blocked'",
                "components.verdict",
            ),
        ] {
            sqlx::query(sql).execute(&store.writer).await.unwrap();
            let err = match read {
                "ports.state" => store.port("p").await.map(|_| ()),
                "components.status" | "components.verdict" => {
                    store.components("p").await.map(|_| ())
                }
                _ => store.jobs_of("p", "a").await.map(|_| ()),
            }
            .unwrap_err();
            let value = sql.split('\'').nth(1).unwrap();
            assert!(
                matches!(&err, StoreError::State { column, source } if *column == read && source.value == value),
                "{err}"
            );
            assert!(err.to_string().contains(read) && err.to_string().contains(value));
        }
        sqlx::query("UPDATE jobs SET state = 'lost'")
            .execute(&store.writer)
            .await
            .unwrap();
        let err = store.component_times("p").await.unwrap_err();
        assert!(err.to_string().contains("jobs.state"), "{err}");
    }

    /// An agent attempt's fleet job has no `jobs` row: its lease is kept on
    /// the attempt (issue #38), listed with the runs' for a restarted
    /// orchestrator, and forgotten when the attempt is tried again or
    /// recorded.
    #[tokio::test]
    async fn an_agent_attempt_s_fleet_lease_is_listed_with_the_runs() {
        let (_dir, store) = crate::tests::temp_store().await;
        store.create_port(&port("p"), &["a".into()]).await.unwrap();
        let row = AttemptRow {
            family: "p".into(),
            component: "a".into(),
            attempt: 1,
            head_before: "abc".into(),
            ..AttemptRow::default()
        };
        store.begin_attempt(&row).await.unwrap();
        let t = FleetTry {
            job_id: "p/a/agent-1-5".into(),
            proxy_token_sha256: "d".repeat(64),
            tools_token_sha256: "e".repeat(64),
        };
        store.set_fleet_try("p", "a", 1, &t).await.unwrap();
        // Queued, not leased: nothing to adopt.
        assert_eq!(store.fleet_try("p", "a", 1).await.unwrap(), None);
        assert!(store.running_leases().await.unwrap().is_empty());
        store.lease_job(&t.job_id, "w2", 7, &[1]).await.unwrap();
        assert_eq!(store.fleet_try("p", "a", 1).await.unwrap(), Some(t.clone()));
        assert_eq!(
            store.running_leases().await.unwrap(),
            [(t.job_id.clone(), "p".into(), "w2".into(), 7, vec![1])]
        );
        assert_eq!(store.attempts("p", "a").await.unwrap()[0].worker_id, "w2");
        // A new try of the attempt forgets the old one's job and tokens.
        store.begin_attempt(&row).await.unwrap();
        assert_eq!(store.fleet_try("p", "a", 1).await.unwrap(), None);
        assert!(store.running_leases().await.unwrap().is_empty());
        // So does its record.
        store.set_fleet_try("p", "a", 1, &t).await.unwrap();
        store.lease_job(&t.job_id, "w2", 8, &[]).await.unwrap();
        assert_eq!(store.running_leases().await.unwrap().len(), 1);
        store
            .attempt_environment("p", "a", 1, "the model API refused the key", 9)
            .await
            .unwrap();
        assert!(store.running_leases().await.unwrap().is_empty());
        assert_eq!(store.fleet_try("p", "a", 1).await.unwrap(), None);
    }

    #[tokio::test]
    async fn abandons_in_flight_runs_once() {
        let (_dir, store) = crate::tests::temp_store().await;
        store
            .create_port(&port("p"), &["a".into(), "b".into()])
            .await
            .unwrap();
        let ja = store.queue_job(&job("p", "a")).await.unwrap();
        store.lease_job(&ja.job_id, "w", 1, &[2, 3]).await.unwrap();
        store.queue_job(&job("p", "b")).await.unwrap();
        let traced = store.queue_job(&job("p", "a#trace")).await.unwrap();
        store.lease_job(&traced.job_id, "w", 2, &[]).await.unwrap();
        let mut abandoned = store.abandon_unfinished("p").await.unwrap();
        abandoned.sort();
        // a's own run in flight waits for its component to adopt it.
        assert_eq!(abandoned, vec!["a#trace".to_string(), "b".to_string()]);
        assert_eq!(
            store.running_leases().await.unwrap(),
            [(ja.job_id.clone(), "p".into(), "w".into(), 1, vec![2, 3])]
        );
        assert!(store.abandon_unfinished("p").await.unwrap().is_empty());
        // No worker runs it any more: abandoned once, then rerun.
        assert!(store.abandon_job(&ja.job_id).await.unwrap());
        assert!(!store.abandon_job(&ja.job_id).await.unwrap());
        let next = store.queue_job(&job("p", "a")).await.unwrap();
        assert_eq!(next.run_no, 2);
        // A final component's run in flight is abandoned with the rest.
        store.lease_job(&next.job_id, "w", 3, &[]).await.unwrap();
        store
            .set_component(
                "p",
                "a",
                ComponentStatus::Blocked,
                RecordedVerdict::Cancelled,
                "",
                "",
            )
            .await
            .unwrap();
        assert_eq!(store.abandon_unfinished("p").await.unwrap(), ["a"]);
    }
}
