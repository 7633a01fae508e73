//! The store's side of drill-down tracing: investigations of red runs and
//! their steps, each step with the comparison report of its traced rerun
//! (`fvd_trace`'s JSON, stored as it is). A child module of `store`, so it
//! shares the store's connections without widening their visibility.

use std::path::PathBuf;

use sqlx::Row;

use super::{Store, StoreError, now_ms, state};
use crate::states::{TraceOutcome, TraceState};

/// One investigation of a red run, with its steps in order.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TraceInvestigation {
    pub id: i64,
    pub family: String,
    pub component: String,
    /// The red run that was investigated.
    pub job_id: String,
    pub state: TraceState,
    /// Empty while it runs.
    pub outcome: TraceOutcome,
    /// One line; the component's blocked reason quotes it.
    pub summary: String,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    pub steps: Vec<TraceStep>,
}

/// One traced rerun and what its comparison found.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TraceStep {
    pub step: u32,
    /// `FASTVIDEO_TRACE_LAYERS` of the rerun (port names).
    pub layers: String,
    /// `FVD_TRACE_REFERENCE_LAYERS` of the rerun (reference names).
    pub reference_layers: String,
    /// The traced rerun's job.
    pub job_id: String,
    /// Where the orchestrator wrote the files gathered from the worker.
    pub files_dir: String,
    /// Port name of the first divergent module; empty when none.
    pub first_module: String,
    /// Why the step has no report; empty when it has one.
    pub error: String,
    /// `fvd_trace::Report` as JSON; `None` until the step is compared, or
    /// when it failed.
    pub report: Option<serde_json::Value>,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    /// How the step's files were compared.
    #[serde(default)]
    pub transport: StepTransport,
}

/// Where a step's files were compared and what crossed the wire.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepTransport {
    /// `worker W` (compared where the files lie) or `orchestrator` (the
    /// worker sent the files); empty before the step finished.
    pub compared_on: String,
    /// What the worker's collected folder held.
    pub files_bytes: u64,
    pub files: u32,
    /// Size of the traced rerun's result message on the wire.
    pub wire_bytes: u64,
    pub compare_ms: u64,
}

impl Store {
    /// Where this store keeps files beside its database (the gathered trace
    /// files): the database's folder, `REPO/.fvd` in embedded mode. `None`
    /// for an in-memory database.
    pub fn files_dir(&self) -> Option<PathBuf> {
        let opts = self.writer.connect_options();
        let file = opts.get_filename();
        if file.as_os_str().is_empty() || file.to_string_lossy().contains(":memory:") {
            return None;
        }
        Some(file.parent().map(PathBuf::from).unwrap_or_default())
    }

    /// Opens an investigation of `job_id`; an investigation of the same
    /// component left running by a process that died is marked abandoned
    /// in the same transaction (its rerun was abandoned with it).
    pub async fn start_trace(
        &self,
        family: &str,
        component: &str,
        job_id: &str,
    ) -> Result<i64, StoreError> {
        self.write("start trace", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            sqlx::query("UPDATE trace_investigations SET state = ?, outcome = ?, summary = 'abandoned: the process investigating it stopped', finished_ms = ? WHERE family = ? AND component = ? AND state = ?")
                .bind(TraceState::Done.as_str())
                .bind(TraceOutcome::Abandoned.as_str())
                .bind(now)
                .bind(family)
                .bind(component)
                .bind(TraceState::Running.as_str())
                .execute(&mut *tx)
                .await?;
            let id: i64 = sqlx::query_scalar("INSERT INTO trace_investigations (family, component, job_id, state, started_ms) VALUES (?, ?, ?, ?, ?) RETURNING id")
                .bind(family)
                .bind(component)
                .bind(job_id)
                .bind(TraceState::Running.as_str())
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(id)
        })
        .await
    }

    /// Records that step `step` of `investigation` runs as `job_id`.
    pub async fn add_trace_step(
        &self,
        investigation: i64,
        step: u32,
        layers: &str,
        reference_layers: &str,
        job_id: &str,
    ) -> Result<(), StoreError> {
        self.write("add trace step", || async move {
            sqlx::query("INSERT INTO trace_steps (investigation, step, layers, reference_layers, job_id, started_ms) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(investigation)
                .bind(step as i64)
                .bind(layers)
                .bind(reference_layers)
                .bind(job_id)
                .bind(now_ms())
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Records what a step found: its report (JSON) or why it has none.
    pub async fn finish_trace_step(
        &self,
        investigation: i64,
        step: u32,
        files_dir: &str,
        first_module: &str,
        report_json: &str,
        error: &str,
    ) -> Result<(), StoreError> {
        self.write("finish trace step", || async move {
            sqlx::query("UPDATE trace_steps SET files_dir = ?, first_module = ?, report = ?, error = ?, finished_ms = ? WHERE investigation = ? AND step = ?")
                .bind(files_dir)
                .bind(first_module)
                .bind(report_json)
                .bind(error)
                .bind(now_ms())
                .bind(investigation)
                .bind(step as i64)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Records how step `step` of `investigation` was compared.
    pub async fn set_trace_step_transport(
        &self,
        investigation: i64,
        step: u32,
        t: &StepTransport,
    ) -> Result<(), StoreError> {
        self.write("set trace step transport", || async move {
            sqlx::query("UPDATE trace_steps SET compared_on = ?, files_bytes = ?, files = ?, wire_bytes = ?, compare_ms = ? WHERE investigation = ? AND step = ?")
                .bind(&t.compared_on)
                .bind(t.files_bytes as i64)
                .bind(t.files as i64)
                .bind(t.wire_bytes as i64)
                .bind(t.compare_ms as i64)
                .bind(investigation)
                .bind(step as i64)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// Closes an investigation with its outcome and one-line summary.
    pub async fn finish_trace(
        &self,
        investigation: i64,
        outcome: TraceOutcome,
        summary: &str,
    ) -> Result<(), StoreError> {
        self.write("finish trace", || async move {
            sqlx::query("UPDATE trace_investigations SET state = ?, outcome = ?, summary = ?, finished_ms = ? WHERE id = ?")
                .bind(TraceState::Done.as_str())
                .bind(outcome.as_str())
                .bind(summary)
                .bind(now_ms())
                .bind(investigation)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// The latest investigation of a component, with its steps.
    pub async fn latest_trace(
        &self,
        family: &str,
        component: &str,
    ) -> Result<Option<TraceInvestigation>, StoreError> {
        let Some(r) = sqlx::query("SELECT * FROM trace_investigations WHERE family = ? AND component = ? ORDER BY id DESC LIMIT 1")
            .bind(family)
            .bind(component)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let id: i64 = r.get("id");
        let steps = sqlx::query("SELECT * FROM trace_steps WHERE investigation = ? ORDER BY step")
            .bind(id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|s| {
                let text: String = s.get("report");
                let report = if text.is_empty() {
                    None
                } else {
                    Some(
                        serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
                            what: "trace_steps.report",
                            message: e.to_string(),
                        })?,
                    )
                };
                Ok(TraceStep {
                    step: s.get::<i64, _>("step") as u32,
                    layers: s.get("layers"),
                    reference_layers: s.get("reference_layers"),
                    job_id: s.get("job_id"),
                    files_dir: s.get("files_dir"),
                    first_module: s.get("first_module"),
                    error: s.get("error"),
                    report,
                    started_ms: s.get("started_ms"),
                    finished_ms: s.get("finished_ms"),
                    transport: StepTransport {
                        compared_on: s.get("compared_on"),
                        files_bytes: s.get::<i64, _>("files_bytes") as u64,
                        files: s.get::<i64, _>("files") as u32,
                        wire_bytes: s.get::<i64, _>("wire_bytes") as u64,
                        compare_ms: s.get::<i64, _>("compare_ms") as u64,
                    },
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Some(TraceInvestigation {
            id,
            family: r.get("family"),
            component: r.get("component"),
            job_id: r.get("job_id"),
            state: state(&r, "state", "trace_investigations.state")?,
            outcome: state(&r, "outcome", "trace_investigations.outcome")?,
            summary: r.get("summary"),
            started_ms: r.get("started_ms"),
            finished_ms: r.get("finished_ms"),
            steps,
        }))
    }

    /// The one-line summary of the component's latest finished
    /// investigation (`first divergence: blocks.2.norm …`), for the agent's
    /// packet and the component's verdict; `None` when it was never traced.
    pub async fn latest_trace_summary(
        &self,
        family: &str,
        component: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar("SELECT summary FROM trace_investigations WHERE family = ? AND component = ? AND state = ? ORDER BY id DESC LIMIT 1")
            .bind(family)
            .bind(component)
            .bind(TraceState::Done.as_str())
            .fetch_optional(&self.pool)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use crate::model::PortRow;

    #[tokio::test]
    async fn an_investigation_keeps_its_steps_and_reports_in_order() {
        let (dir, store) = crate::tests::temp_store().await;
        assert_eq!(store.files_dir(), Some(dir.path().to_path_buf()));
        store
            .create_port(
                &PortRow {
                    family: "p".into(),
                    ..PortRow::default()
                },
                &["c".into()],
            )
            .await
            .unwrap();
        assert_eq!(store.latest_trace("p", "c").await.unwrap(), None);
        let first = store.start_trace("p", "c", "p.c.1").await.unwrap();
        // A second start abandons the first, left running by a dead process.
        let id = store.start_trace("p", "c", "p.c.2").await.unwrap();
        assert_ne!(first, id);
        assert_eq!(
            store
                .latest_trace_summary("p", "c")
                .await
                .unwrap()
                .as_deref(),
            Some("abandoned: the process investigating it stopped")
        );
        store
            .add_trace_step(id, 1, "^b$", "^r$", "p.c#trace.1")
            .await
            .unwrap();
        store
            .finish_trace_step(id, 1, "/d/1", "b", r#"{"first_divergence":null}"#, "")
            .await
            .unwrap();
        store
            .add_trace_step(id, 2, "^b\\.", "^r\\.", "p.c#trace.2")
            .await
            .unwrap();
        store
            .finish_trace_step(id, 2, "", "", "", "no files")
            .await
            .unwrap();
        store
            .finish_trace(id, crate::states::TraceOutcome::Error, "trace failed")
            .await
            .unwrap();
        let t = store.latest_trace("p", "c").await.unwrap().unwrap();
        assert_eq!((t.job_id.as_str(), t.state.as_str()), ("p.c.2", "done"));
        assert_eq!(t.steps.len(), 2);
        assert_eq!(
            t.steps[0].report,
            Some(serde_json::json!({"first_divergence": null}))
        );
        assert_eq!(t.steps[1].report, None);
        assert_eq!(t.steps[1].error, "no files");
        assert_eq!(
            store
                .latest_trace_summary("p", "c")
                .await
                .unwrap()
                .as_deref(),
            Some("trace failed")
        );
    }
}
