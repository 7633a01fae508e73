//! The store's read side for the dashboard (`fvd_orchestrator::dashboard`):
//! a read-only opening of a state database another process writes (`fvd
//! dashboard --repo DIR` beside an embedded `fvd submit`), and the few
//! columns the port snapshot leaves out (times, leased GPUs, the workers
//! table). A child module of `store`, like `traces`, so it shares the
//! store's connections without widening their visibility. Nothing here
//! writes.

use std::collections::BTreeMap;
use std::path::Path;

use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use super::{MIGRATIONS, Store, StoreError};
use crate::states::JobState;

/// When a port was first submitted and last changed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PortTimes {
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// What the matrix shows of a component beside its snapshot row: when it
/// last changed and its latest run's lease.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ComponentTimes {
    pub updated_ms: i64,
    /// Run number of the latest run; 0 when it never ran.
    pub run_no: u32,
    /// The latest run's state; `None` when it never ran.
    pub job_state: Option<JobState>,
    pub gpus_needed: u32,
    /// Host GPU indices the latest run was leased.
    pub gpus: Vec<u32>,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
}

/// A GPU as the `workers` table keeps it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredGpu {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub memory_mib: u64,
}

/// A row of the `workers` table: what a worker announced when it last
/// registered (the table is not a liveness record).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StoredWorker {
    pub worker_id: String,
    pub host: String,
    pub gpus: Vec<StoredGpu>,
    pub cpu_slots: u32,
    pub registered_ms: i64,
}

/// A run the store records as holding a lease.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LeasedJob {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub worker_id: String,
    pub lease_epoch: u64,
    pub gpus: Vec<u32>,
    pub started_ms: Option<i64>,
}

/// One run (job) of a component as its history shows it: where and when
/// it ran, on which GPUs, what it found, and whether it printed anything.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RunRow {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub state: JobState,
    pub worker_id: String,
    pub gpus_needed: u32,
    /// Host GPU indices of its lease (empty for a CPU run or one never
    /// leased).
    pub gpus: Vec<u32>,
    pub verdict: String,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub duration_ms: Option<u64>,
    pub queued_ms: i64,
    pub started_ms: Option<i64>,
    /// When its process started on the worker (after the checkout).
    pub spawned_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    /// The commit it tested; empty outside git.
    pub commit: String,
    /// Some output is stored for it (`fvd logs` has something to show).
    pub has_output: bool,
    /// The most GPU memory it held, as measured on its worker; `None`:
    /// unknown (no CUDA, not ended, an older worker).
    pub peak_gpu_mib: Option<u64>,
}

/// Which runs [`Store::runs`] reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunFilter<'a> {
    pub family: Option<&'a str>,
    pub component: Option<&'a str>,
    /// Runs that ended at or after this time, or have not ended.
    pub since_ms: Option<i64>,
}

fn gpus_of(text: &str) -> Vec<u32> {
    serde_json::from_str(text).unwrap_or_default()
}

impl Store {
    /// Opens the database at `path` for reading only, beside the process
    /// that writes it: no migration, no journal-mode change, never a write
    /// lock. Refuses a file that is missing or older than this build's
    /// schema (the writing process migrates it).
    pub async fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        let url = path.display().to_string();
        let open_err = |source| StoreError::Open {
            url: url.clone(),
            source,
        };
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .create_if_missing(false)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .map_err(open_err)?;
        let applied: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
            .fetch_one(&pool)
            .await
            .map_err(open_err)?;
        let want = MIGRATIONS.last().map_or(0, |(v, _)| *v);
        if applied.unwrap_or(0) < want {
            return Err(StoreError::Corrupt {
                what: "schema_migrations",
                message: format!(
                    "{url} is at schema version {} and this fvd reads {want}: open it once with this fvd (fvd status --repo) to migrate it",
                    applied.unwrap_or(0)
                ),
            });
        }
        Ok(Store {
            writer: pool.clone(),
            pool,
            checkpointer: None,
            faults: std::sync::Arc::new(crate::faults::Faults::new(url)),
            retry: None,
        })
    }

    /// Created and updated times of every port, by family.
    pub async fn port_times(&self) -> Result<BTreeMap<String, PortTimes>, StoreError> {
        let rows = sqlx::query("SELECT family, created_ms, updated_ms FROM ports")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get("family"),
                    PortTimes {
                        created_ms: r.get("created_ms"),
                        updated_ms: r.get("updated_ms"),
                    },
                )
            })
            .collect())
    }

    /// Per component of `family`: when it changed and its latest run.
    pub async fn component_times(
        &self,
        family: &str,
    ) -> Result<BTreeMap<String, ComponentTimes>, StoreError> {
        let rows = sqlx::query("SELECT c.name, c.updated_ms, j.run_no, j.state, j.gpus_needed, j.gpus, j.started_ms, j.finished_ms FROM components c LEFT JOIN jobs j ON j.family = c.family AND j.component = c.name AND j.run_no = (SELECT MAX(run_no) FROM jobs k WHERE k.family = c.family AND k.component = c.name) WHERE c.family = ?")
            .bind(family)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let gpus: Option<String> = r.get("gpus");
                let job_state = r
                    .get::<Option<String>, _>("state")
                    .map(|s| s.parse::<JobState>())
                    .transpose()
                    .map_err(|source| StoreError::State {
                        column: "jobs.state",
                        source,
                    })?;
                Ok((
                    r.get("name"),
                    ComponentTimes {
                        updated_ms: r.get("updated_ms"),
                        run_no: r.get::<Option<i64>, _>("run_no").unwrap_or(0) as u32,
                        job_state,
                        gpus_needed: r.get::<Option<i64>, _>("gpus_needed").unwrap_or(0) as u32,
                        gpus: gpus.as_deref().map(gpus_of).unwrap_or_default(),
                        started_ms: r.get("started_ms"),
                        finished_ms: r.get("finished_ms"),
                    },
                ))
            })
            .collect()
    }

    /// The `workers` table, by worker id.
    pub async fn stored_workers(&self) -> Result<Vec<StoredWorker>, StoreError> {
        let rows = sqlx::query(
            "SELECT worker_id, host, gpus, cpu_slots, last_seen_ms FROM workers ORDER BY worker_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let gpus: String = r.get("gpus");
                Ok(StoredWorker {
                    worker_id: r.get("worker_id"),
                    host: r.get("host"),
                    gpus: serde_json::from_str(&gpus).map_err(|e| StoreError::Corrupt {
                        what: "workers.gpus",
                        message: e.to_string(),
                    })?,
                    cpu_slots: r.get::<i64, _>("cpu_slots") as u32,
                    registered_ms: r.get("last_seen_ms"),
                })
            })
            .collect()
    }

    /// The runs `filter` selects, in the order they were queued.
    pub async fn runs(&self, filter: RunFilter<'_>) -> Result<Vec<RunRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT j.job_id, j.family, j.component, j.run_no, j.state, j.worker_id, j.gpus_needed, j.gpus, j.verdict, j.reason, j.exit_code, j.duration_ms, j.queued_ms, j.started_ms, j.spawned_ms, j.finished_ms, j.commit_sha, j.peak_gpu_mib, (j.output_tail != '' OR EXISTS (SELECT 1 FROM job_logs l WHERE l.job_id = j.job_id)) AS has_output FROM jobs j WHERE (?1 IS NULL OR j.family = ?1) AND (?2 IS NULL OR j.component = ?2) AND (?3 IS NULL OR j.finished_ms IS NULL OR j.finished_ms >= ?3) ORDER BY j.queued_ms, j.family, j.component, j.run_no",
        )
        .bind(filter.family)
        .bind(filter.component)
        .bind(filter.since_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let state = r
                    .get::<String, _>("state")
                    .parse::<JobState>()
                    .map_err(|source| StoreError::State {
                        column: "jobs.state",
                        source,
                    })?;
                Ok(RunRow {
                    job_id: r.get("job_id"),
                    family: r.get("family"),
                    component: r.get("component"),
                    run_no: r.get::<i64, _>("run_no") as u32,
                    state,
                    worker_id: r.get("worker_id"),
                    gpus_needed: r.get::<i64, _>("gpus_needed") as u32,
                    gpus: gpus_of(&r.get::<String, _>("gpus")),
                    verdict: r.get("verdict"),
                    reason: r.get("reason"),
                    exit_code: r.get::<Option<i64>, _>("exit_code").map(|c| c as i32),
                    duration_ms: r.get::<Option<i64>, _>("duration_ms").map(|d| d as u64),
                    queued_ms: r.get("queued_ms"),
                    started_ms: r.get("started_ms"),
                    spawned_ms: r.get("spawned_ms"),
                    finished_ms: r.get("finished_ms"),
                    commit: r.get("commit_sha"),
                    has_output: r.get::<bool, _>("has_output"),
                    peak_gpu_mib: r
                        .get::<Option<i64>, _>("peak_gpu_mib")
                        .map(|m| m.max(0) as u64),
                })
            })
            .collect()
    }

    /// Per worker id, the latest moment a run it held records (leased,
    /// started or ended): when a worker that is gone was last seen at work.
    pub async fn worker_last_runs(&self) -> Result<BTreeMap<String, i64>, StoreError> {
        let rows = sqlx::query("SELECT worker_id, MAX(MAX(COALESCE(started_ms, 0), COALESCE(spawned_ms, 0), COALESCE(finished_ms, 0))) AS at FROM jobs WHERE worker_id != '' GROUP BY worker_id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get("worker_id"), r.get::<i64, _>("at")))
            .collect())
    }

    /// Runs the store records as `running` (holding a lease), oldest first.
    pub async fn leased_jobs(&self) -> Result<Vec<LeasedJob>, StoreError> {
        let rows = sqlx::query("SELECT job_id, family, component, worker_id, lease_epoch, gpus, started_ms FROM jobs WHERE state = ? ORDER BY started_ms, job_id")
            .bind(JobState::Running.as_str())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| LeasedJob {
                job_id: r.get("job_id"),
                family: r.get("family"),
                component: r.get("component"),
                worker_id: r.get("worker_id"),
                lease_epoch: r.get::<i64, _>("lease_epoch") as u64,
                gpus: gpus_of(&r.get::<String, _>("gpus")),
                started_ms: r.get("started_ms"),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobRecord, PortRow};

    #[tokio::test]
    async fn a_read_only_store_reads_what_the_writer_commits_and_never_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let writer = Store::open_path(&path).await.unwrap();
        writer
            .create_port(
                &PortRow {
                    family: "p".into(),
                    state: crate::states::PortState::Running,
                    phase: "P6".into(),
                    ..PortRow::default()
                },
                &["a".into(), "b".into()],
            )
            .await
            .unwrap();
        writer
            .upsert_worker(
                "w1",
                "host",
                r#"[{"index":0,"uuid":"u","name":"H100","memory_mib":80000}]"#,
                4,
            )
            .await
            .unwrap();
        let reader = Store::open_read_only(&path).await.unwrap();
        assert_eq!(reader.ports().await.unwrap().len(), 1);
        // A change committed after the reader opened is seen (WAL).
        let j = writer
            .queue_job(&JobRecord {
                family: "p".into(),
                component: "a".into(),
                argv: vec!["true".into()],
                cwd: "/".into(),
                gpus_needed: 1,
                timeout_ms: 1000,
                ..JobRecord::default()
            })
            .await
            .unwrap();
        writer.lease_job(&j.job_id, "w1", 3, &[0]).await.unwrap();
        let times = reader.component_times("p").await.unwrap();
        assert_eq!(times["a"].gpus, vec![0]);
        assert_eq!(times["a"].job_state, Some(JobState::Running));
        assert_eq!((times["b"].run_no, times["b"].job_state), (0, None));
        let leased = reader.leased_jobs().await.unwrap();
        assert_eq!(leased.len(), 1);
        assert_eq!(
            (leased[0].lease_epoch, leased[0].worker_id.as_str()),
            (3, "w1")
        );
        let runs = reader
            .runs(RunFilter {
                family: Some("p"),
                ..RunFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(
            (runs[0].state, runs[0].gpus.as_slice(), runs[0].has_output),
            (JobState::Running, &[0][..], false)
        );
        let other = RunFilter {
            family: Some("q"),
            ..RunFilter::default()
        };
        assert!(reader.runs(other).await.unwrap().is_empty());
        let workers = reader.stored_workers().await.unwrap();
        assert_eq!(workers[0].gpus[0].name, "H100");
        let seen = reader.worker_last_runs().await.unwrap();
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["w1"]);
        assert!(seen["w1"] >= runs[0].started_ms.unwrap(), "{seen:?}");
        assert!(reader.port_times().await.unwrap()["p"].created_ms > 0);
        assert!(
            reader
                .set_port_state("p", crate::states::PortState::Cancelled, "P6")
                .await
                .is_err(),
            "a read-only store must refuse writes"
        );
    }

    #[tokio::test]
    async fn a_missing_database_is_refused_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.db");
        let err = Store::open_read_only(&path).await.unwrap_err();
        assert!(err.to_string().contains("none.db"), "{err}");
        assert!(!path.exists());
    }
}
