//! The store's side of what agent attempts spend on their model APIs
//! (`agent_usage`, one row per attempt): written as the proxy meters each
//! reply and completed when the attempt ends, summed per component and per
//! port for the money and token budgets. A child module of `store`.

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Store, StoreError, now_ms};

/// What one agent attempt spent, and how it ended on the model side.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttemptUsage {
    /// The CLI preset (`claude-code`, …); empty for a raw command.
    pub preset: String,
    pub model: String,
    /// Input tokens not read from a cache.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// `None` when no price is known for the model.
    pub cost_usd: Option<f64>,
    /// Tokens of models no price was found for (not in `cost_usd`).
    pub unpriced_tokens: u64,
    /// Where the token figures come from: `proxy` (fvd metered the API's
    /// replies) or `cli` (the CLI's own report).
    pub source: String,
    /// Where the USD figure comes from: `prices` (the spec's table over the
    /// defaults) or `cli`.
    pub cost_source: String,
    pub requests: u32,
    pub retries: u32,
    /// Turns as the CLI counts them, when it reports them.
    pub turns: Option<u32>,
    /// The CLI's own cost figure, for comparison.
    pub cli_cost_usd: Option<f64>,
    /// `running`, `completed`, `turn_cap`, `budget_cap`, `auth`,
    /// `upstream`, `timed_out`, `error`.
    pub outcome: String,
    /// Why it was stopped, in words.
    pub stop_reason: String,
    /// Tool calls the CLI refused, `TOOL: input`.
    pub permission_denials: Vec<String>,
    /// `structured_output`, `file`, `output` or empty.
    pub handoff_source: String,
}

impl AttemptUsage {
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens
    }

    /// Adds `o`'s counters to these (a try after a crash).
    pub fn add_counts(&mut self, o: &AttemptUsage) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cache_read_tokens += o.cache_read_tokens;
        self.cache_write_tokens += o.cache_write_tokens;
        self.unpriced_tokens += o.unpriced_tokens;
        self.requests += o.requests;
        self.retries += o.retries;
        self.cost_usd = match (self.cost_usd, o.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
    }
}

/// Usage summed over a component's attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct UsageTotals {
    pub attempts: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_usd: f64,
    pub unpriced_tokens: u64,
    pub requests: u32,
}

impl UsageTotals {
    pub fn add(&mut self, o: &UsageTotals) {
        self.attempts += o.attempts;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cache_read_tokens += o.cache_read_tokens;
        self.cache_write_tokens += o.cache_write_tokens;
        self.cost_usd += o.cost_usd;
        self.unpriced_tokens += o.unpriced_tokens;
        self.requests += o.requests;
    }
}

/// What a component's attempts spent since a moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spend {
    pub tokens: u64,
    pub usd: f64,
}

impl Store {
    /// Writes attempt `attempt`'s usage, replacing what was there.
    pub async fn record_usage(
        &self,
        family: &str,
        component: &str,
        attempt: u32,
        u: &AttemptUsage,
    ) -> Result<(), StoreError> {
        let denials =
            serde_json::to_string(&u.permission_denials).expect("a list of strings serializes");
        sqlx::query("INSERT INTO agent_usage (family, component, attempt, preset, model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, unpriced_tokens, source, cost_source, requests, retries, turns, cli_cost_usd, outcome, stop_reason, permission_denials, handoff_source, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(family, component, attempt) DO UPDATE SET preset = excluded.preset, model = excluded.model, input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, cache_read_tokens = excluded.cache_read_tokens, cache_write_tokens = excluded.cache_write_tokens, cost_usd = excluded.cost_usd, unpriced_tokens = excluded.unpriced_tokens, source = excluded.source, cost_source = excluded.cost_source, requests = excluded.requests, retries = excluded.retries, turns = excluded.turns, cli_cost_usd = excluded.cli_cost_usd, outcome = excluded.outcome, stop_reason = excluded.stop_reason, permission_denials = excluded.permission_denials, handoff_source = excluded.handoff_source, updated_ms = excluded.updated_ms")
            .bind(family)
            .bind(component)
            .bind(attempt as i64)
            .bind(&u.preset)
            .bind(&u.model)
            .bind(u.input_tokens as i64)
            .bind(u.output_tokens as i64)
            .bind(u.cache_read_tokens as i64)
            .bind(u.cache_write_tokens as i64)
            .bind(u.cost_usd)
            .bind(u.unpriced_tokens as i64)
            .bind(&u.source)
            .bind(&u.cost_source)
            .bind(u.requests as i64)
            .bind(u.retries as i64)
            .bind(u.turns.map(|t| t as i64))
            .bind(u.cli_cost_usd)
            .bind(&u.outcome)
            .bind(&u.stop_reason)
            .bind(denials)
            .bind(&u.handoff_source)
            .bind(now_ms())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Closes a `running` attempt whose model API's environment ended it (a
    /// refused key, an API that kept failing): state `environment`, counted
    /// in no budget; opening it again runs it under the same number.
    pub async fn attempt_environment(
        &self,
        family: &str,
        component: &str,
        attempt: u32,
        why: &str,
        finished_ms: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE agent_attempts SET state = 'environment', handoff_status = 'missing', handoff_summary = ?, finished_ms = ? WHERE family = ? AND component = ? AND attempt = ? AND state = 'running'")
            .bind(why)
            .bind(finished_ms)
            .bind(family)
            .bind(component)
            .bind(attempt as i64)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// The usage of each attempt of a component that has a row.
    pub async fn usage_of(
        &self,
        family: &str,
        component: &str,
    ) -> Result<BTreeMap<u32, AttemptUsage>, StoreError> {
        let rows = sqlx::query("SELECT * FROM agent_usage WHERE family = ? AND component = ?")
            .bind(family)
            .bind(component)
            .fetch_all(&self.pool)
            .await?;
        let mut out = BTreeMap::new();
        for r in rows {
            let denials: String = r.get("permission_denials");
            let permission_denials =
                serde_json::from_str(&denials).map_err(|e| StoreError::Corrupt {
                    what: "agent_usage.permission_denials",
                    message: e.to_string(),
                })?;
            out.insert(
                r.get::<i64, _>("attempt") as u32,
                AttemptUsage {
                    preset: r.get("preset"),
                    model: r.get("model"),
                    input_tokens: r.get::<i64, _>("input_tokens") as u64,
                    output_tokens: r.get::<i64, _>("output_tokens") as u64,
                    cache_read_tokens: r.get::<i64, _>("cache_read_tokens") as u64,
                    cache_write_tokens: r.get::<i64, _>("cache_write_tokens") as u64,
                    cost_usd: r.get("cost_usd"),
                    unpriced_tokens: r.get::<i64, _>("unpriced_tokens") as u64,
                    source: r.get("source"),
                    cost_source: r.get("cost_source"),
                    requests: r.get::<i64, _>("requests") as u32,
                    retries: r.get::<i64, _>("retries") as u32,
                    turns: r.get::<Option<i64>, _>("turns").map(|t| t as u32),
                    cli_cost_usd: r.get("cli_cost_usd"),
                    outcome: r.get("outcome"),
                    stop_reason: r.get("stop_reason"),
                    permission_denials,
                    handoff_source: r.get("handoff_source"),
                },
            );
        }
        Ok(out)
    }

    /// Every attempt's usage of the port summed per component.
    pub async fn usage_totals(
        &self,
        family: &str,
    ) -> Result<BTreeMap<String, UsageTotals>, StoreError> {
        let rows = sqlx::query("SELECT component, COUNT(*) AS attempts, SUM(input_tokens) AS i, SUM(output_tokens) AS o, SUM(cache_read_tokens) AS cr, SUM(cache_write_tokens) AS cw, TOTAL(cost_usd) AS usd, SUM(unpriced_tokens) AS unpriced, SUM(requests) AS requests FROM agent_usage WHERE family = ? GROUP BY component")
            .bind(family)
            .fetch_all(&self.pool)
            .await?;
        let n =
            |r: &sqlx::sqlite::SqliteRow, c: &str| r.get::<Option<i64>, _>(c).unwrap_or(0) as u64;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get::<String, _>("component"),
                    UsageTotals {
                        attempts: n(r, "attempts") as u32,
                        input_tokens: n(r, "i"),
                        output_tokens: n(r, "o"),
                        cache_read_tokens: n(r, "cr"),
                        cache_write_tokens: n(r, "cw"),
                        cost_usd: r.get::<f64, _>("usd"),
                        unpriced_tokens: n(r, "unpriced"),
                        requests: n(r, "requests") as u32,
                    },
                )
            })
            .collect())
    }

    /// What each component of the port spent on attempts started at or
    /// after `since_ms` (the port's last `--rerun`): component → spend.
    pub async fn usage_spent(
        &self,
        family: &str,
        since_ms: i64,
    ) -> Result<BTreeMap<String, Spend>, StoreError> {
        let rows = sqlx::query("SELECT u.component AS component, SUM(u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens) AS tokens, TOTAL(u.cost_usd) AS usd FROM agent_usage u JOIN agent_attempts a ON a.family = u.family AND a.component = u.component AND a.attempt = u.attempt WHERE u.family = ? AND a.started_ms >= ? GROUP BY u.component")
            .bind(family)
            .bind(since_ms)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.get::<String, _>("component"),
                    Spend {
                        tokens: r.get::<Option<i64>, _>("tokens").unwrap_or(0) as u64,
                        usd: r.get::<Option<f64>, _>("usd").unwrap_or(0.0),
                    },
                )
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AttemptRow;

    fn attempt(component: &str, attempt: u32, started_ms: i64) -> AttemptRow {
        AttemptRow {
            family: "p".into(),
            component: component.into(),
            attempt,
            started_ms,
            kind: crate::states::AttemptKind::Fix,
            ..AttemptRow::default()
        }
    }

    #[tokio::test]
    async fn usage_is_read_with_its_attempt_and_summed_since_the_last_rerun() {
        let (_dir, store) = crate::tests::temp_store().await;
        for (c, n, at) in [("a", 1, 100), ("a", 2, 300), ("b", 1, 300)] {
            store.begin_attempt(&attempt(c, n, at)).await.unwrap();
        }
        let u = AttemptUsage {
            preset: "codex".into(),
            model: "gpt-5".into(),
            input_tokens: 1000,
            output_tokens: 50,
            cache_read_tokens: 200,
            cost_usd: Some(0.5),
            source: "proxy".into(),
            cost_source: "prices".into(),
            requests: 4,
            turns: Some(3),
            outcome: "completed".into(),
            permission_denials: vec!["Bash: curl http://x".into()],
            ..AttemptUsage::default()
        };
        store.record_usage("p", "a", 1, &u).await.unwrap();
        store.record_usage("p", "a", 2, &u).await.unwrap();
        // Written again: replaced, not added.
        let unpriced = AttemptUsage {
            cost_usd: None,
            unpriced_tokens: 7,
            ..u.clone()
        };
        store.record_usage("p", "b", 1, &u).await.unwrap();
        store.record_usage("p", "b", 1, &unpriced).await.unwrap();
        let ledger = store.attempts("p", "a").await.unwrap();
        assert_eq!(ledger[0].usage.as_ref(), Some(&u));
        assert_eq!(
            store.attempts("p", "b").await.unwrap()[0].usage,
            Some(unpriced)
        );
        // Attempts before the rerun (started at 200) no longer count.
        let spent = store.usage_spent("p", 200).await.unwrap();
        assert_eq!(
            spent["a"],
            Spend {
                tokens: 1250,
                usd: 0.5
            }
        );
        assert_eq!(
            spent["b"],
            Spend {
                tokens: 1250,
                usd: 0.0
            }
        );
        assert_eq!(store.usage_spent("p", 0).await.unwrap()["a"].usd, 1.0);
    }

    #[test]
    fn a_later_try_adds_its_counts() {
        let mut a = AttemptUsage {
            input_tokens: 10,
            cost_usd: Some(0.1),
            requests: 1,
            ..AttemptUsage::default()
        };
        a.add_counts(&AttemptUsage {
            input_tokens: 5,
            cost_usd: None,
            requests: 2,
            ..AttemptUsage::default()
        });
        assert_eq!((a.input_tokens, a.cost_usd, a.requests), (15, Some(0.1), 3));
    }
}
