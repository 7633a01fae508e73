//! The store's side of hypothesis variants: one table per red run of a
//! component with `[[component.variant]]`s, its baseline (the red run) and
//! one row per variant run. A child module of `store`, like `traces`.

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Store, StoreError, VERDICT, now_ms, state, verdict};
use crate::states::{RecordedVerdict, VariantFinding, VariantState};

/// The name of the table's first row: the red run itself.
pub const BASELINE: &str = "baseline";

/// One row of a variant table.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VariantRow {
    /// The red run the table is about.
    pub red_job_id: String,
    /// `baseline` or the variant's name.
    pub name: String,
    /// The variant's overrides, `KEY=VALUE` (literal, non-secret values).
    pub env: Vec<String>,
    /// The run: the red run for the baseline, `<family>.<component>#variant.N`.
    pub job_id: String,
    pub state: VariantState,
    pub verdict: RecordedVerdict,
    pub reason: String,
    /// Port module of the first divergence, when the component is traced.
    pub first_divergence: String,
    pub stat: String,
    pub drift: Option<f64>,
    pub finding: VariantFinding,
    /// Why a traced variant names no first divergence.
    pub trace_error: String,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    /// When the run's process started on its worker and when its result was
    /// recorded (from its job), to see which runs overlapped.
    pub spawned_ms: Option<i64>,
    pub job_finished_ms: Option<i64>,
}

impl Store {
    /// Opens the variant table of `red_job_id`: its rows as given (the
    /// baseline done, the variants running). Rows of the component's
    /// earlier tables left running by a process that died are marked
    /// abandoned in the same transaction.
    pub async fn start_variants(
        &self,
        family: &str,
        component: &str,
        rows: &[VariantRow],
    ) -> Result<(), StoreError> {
        self.write("start variants", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            sqlx::query("UPDATE variant_runs SET state = ?, finished_ms = ? WHERE family = ? AND component = ? AND state = ?")
                .bind(VariantState::Abandoned.as_str())
                .bind(now)
                .bind(family)
                .bind(component)
                .bind(VariantState::Running.as_str())
                .execute(&mut *tx)
                .await?;
            for (i, r) in rows.iter().enumerate() {
                sqlx::query("INSERT OR REPLACE INTO variant_runs (family, component, red_job_id, position, name, env, job_id, state, verdict, error_kind, reason, first_divergence, stat, drift, finding, trace_error, started_ms, finished_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
                    .bind(family)
                    .bind(component)
                    .bind(&r.red_job_id)
                    .bind(i as i64)
                    .bind(&r.name)
                    .bind(serde_json::to_string(&r.env).unwrap_or_default())
                    .bind(&r.job_id)
                    .bind(r.state.as_str())
                    .bind(r.verdict.as_str())
                    .bind(r.verdict.error_kind_str())
                    .bind(&r.reason)
                    .bind(&r.first_divergence)
                    .bind(&r.stat)
                    .bind(r.drift)
                    .bind(r.finding.as_str())
                    .bind(&r.trace_error)
                    .bind(now)
                    .bind((r.state != VariantState::Running).then_some(now))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Records what a variant's run found.
    pub async fn finish_variant(
        &self,
        family: &str,
        component: &str,
        row: &VariantRow,
    ) -> Result<(), StoreError> {
        self.write("finish variant", || async move {
            sqlx::query("UPDATE variant_runs SET state = ?, verdict = ?, error_kind = ?, reason = ?, first_divergence = ?, stat = ?, drift = ?, finding = ?, trace_error = ?, finished_ms = ? WHERE family = ? AND component = ? AND red_job_id = ? AND name = ?")
                .bind(VariantState::Done.as_str())
                .bind(row.verdict.as_str())
                .bind(row.verdict.error_kind_str())
                .bind(&row.reason)
                .bind(&row.first_divergence)
                .bind(&row.stat)
                .bind(row.drift)
                .bind(row.finding.as_str())
                .bind(&row.trace_error)
                .bind(now_ms())
                .bind(family)
                .bind(component)
                .bind(&row.red_job_id)
                .bind(&row.name)
                .execute(&self.writer)
                .await?;
            Ok(())
        })
        .await
    }

    /// The latest variant table of a component (baseline first, then the
    /// spec's order); empty when it never had one.
    pub async fn variant_table(
        &self,
        family: &str,
        component: &str,
    ) -> Result<Vec<VariantRow>, StoreError> {
        Ok(self
            .variant_tables(family)
            .await?
            .remove(component)
            .unwrap_or_default())
    }

    /// The latest variant table of each component of a port that has one.
    pub async fn variant_tables(
        &self,
        family: &str,
    ) -> Result<BTreeMap<String, Vec<VariantRow>>, StoreError> {
        // The latest table of each component: the red run of its newest row.
        let rows = sqlx::query(
            "SELECT v.*, j.spawned_ms AS spawned_ms, j.finished_ms AS job_finished_ms \
             FROM variant_runs v LEFT JOIN jobs j ON j.job_id = v.job_id \
             WHERE v.family = ? AND v.red_job_id = (\
               SELECT w.red_job_id FROM variant_runs w \
               WHERE w.family = v.family AND w.component = v.component \
               ORDER BY w.started_ms DESC, w.rowid DESC LIMIT 1) \
             ORDER BY v.component, v.position",
        )
        .bind(family)
        .fetch_all(&self.pool)
        .await?;
        let mut out: BTreeMap<String, Vec<VariantRow>> = BTreeMap::new();
        for r in rows {
            let env: String = r.get("env");
            let row = VariantRow {
                red_job_id: r.get("red_job_id"),
                name: r.get("name"),
                env: serde_json::from_str(&env).map_err(|e| StoreError::Corrupt {
                    what: "variant_runs.env",
                    message: e.to_string(),
                })?,
                job_id: r.get("job_id"),
                state: state(&r, "state", "variant_runs.state")?,
                verdict: verdict(
                    &r,
                    VERDICT,
                    ("variant_runs.verdict", "variant_runs.error_kind"),
                )?,
                reason: r.get("reason"),
                first_divergence: r.get("first_divergence"),
                stat: r.get("stat"),
                drift: r.get("drift"),
                finding: state(&r, "finding", "variant_runs.finding")?,
                trace_error: r.get("trace_error"),
                started_ms: r.get("started_ms"),
                finished_ms: r.get("finished_ms"),
                spawned_ms: r.get("spawned_ms"),
                job_finished_ms: r.get("job_finished_ms"),
            };
            out.entry(r.get("component")).or_default().push(row);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PortRow;

    fn row(red: &str, name: &str, state: &str) -> VariantRow {
        VariantRow {
            red_job_id: red.into(),
            name: name.into(),
            env: if name == BASELINE {
                Vec::new()
            } else {
                vec![format!("{}=1", name.to_uppercase())]
            },
            state: state.parse().unwrap(),
            ..VariantRow::default()
        }
    }

    #[tokio::test]
    async fn the_latest_table_of_each_component_comes_back_in_order() {
        let (_dir, store) = crate::tests::temp_store().await;
        store
            .create_port(
                &PortRow {
                    family: "p".into(),
                    state: crate::states::PortState::Running,
                    ..PortRow::default()
                },
                &["c".into(), "d".into()],
            )
            .await
            .unwrap();
        assert!(store.variant_table("p", "c").await.unwrap().is_empty());
        let first = [
            row("p.c.1", BASELINE, "done"),
            row("p.c.1", "zeta", "running"),
        ];
        store.start_variants("p", "c", &first).await.unwrap();
        // A newer red run's table replaces it; the row left running by the
        // first is abandoned.
        let second = [
            row("p.c.2", BASELINE, "done"),
            row("p.c.2", "zeta", "running"),
            row("p.c.2", "alpha", "running"),
        ];
        store.start_variants("p", "c", &second).await.unwrap();
        let mut done = second[2].clone();
        done.verdict = RecordedVerdict::NonSkipPass;
        done.finding = VariantFinding::Passes;
        done.drift = Some(0.5);
        store.finish_variant("p", "c", &done).await.unwrap();
        let t = store.variant_table("p", "c").await.unwrap();
        let names: Vec<(&str, &str)> = t
            .iter()
            .map(|r| (r.name.as_str(), r.state.as_str()))
            .collect();
        assert_eq!(
            names,
            [("baseline", "done"), ("zeta", "running"), ("alpha", "done")]
        );
        assert_eq!(t[2].env, ["ALPHA=1"]);
        assert_eq!((t[2].finding.as_str(), t[2].drift), ("passes", Some(0.5)));
        assert!(t[2].finished_ms.is_some() && t[1].finished_ms.is_none());
        assert!(!store.variant_tables("p").await.unwrap().contains_key("d"));
        let all: Vec<String> = sqlx::query_scalar(
            "SELECT state FROM variant_runs WHERE red_job_id = 'p.c.1' ORDER BY position",
        )
        .fetch_all(&store.pool)
        .await
        .unwrap();
        assert_eq!(all, ["done", "abandoned"]);
    }
}
