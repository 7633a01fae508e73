//! The budgets an agent loop is held to (`[agent]`: attempts, wall time,
//! GPU-seconds; `[agent.model.budget]`: USD and tokens per attempt,
//! component and port): what a component has spent, which budget is spent,
//! and what one attempt may still spend on its model API.

use fvd_store::model::JobState;
use fvd_store::{AttemptRow, Store, now_ms};

/// What the component has spent so far, against its agent's budgets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spent {
    /// Attempts recorded (an attempt cut off by a crash is not one yet).
    pub attempts: u32,
    /// When its first run was queued.
    pub first_queued_ms: Option<i64>,
    /// Run time × GPUs of its finished runs.
    pub gpu_ms: u64,
    pub now_ms: i64,
    /// What its agent attempts spent on their model API, and the port's
    /// (every component's) together.
    pub model_component: fvd_store::usage::Spend,
    pub model_port: fvd_store::usage::Spend,
}

/// Which budget of `a` is spent, in words; `None` while all hold.
pub fn budget_spent(a: &fvd_spec::AgentSpec, s: &Spent) -> Option<String> {
    if s.attempts >= a.max_attempts {
        return Some(format!(
            "agent budget spent: {} of {} attempts",
            s.attempts, a.max_attempts
        ));
    }
    if let (Some(max), Some(first)) = (a.max_wall, s.first_queued_ms) {
        let used = std::time::Duration::from_millis((s.now_ms - first).max(0) as u64);
        if used >= max {
            return Some(format!(
                "agent budget spent: wall time {} s of {} s",
                used.as_secs(),
                max.as_secs()
            ));
        }
    }
    if let Some(max) = a.max_gpu_s
        && s.gpu_ms >= max.saturating_mul(1000)
    {
        return Some(format!(
            "agent budget spent: {:.1} of {max} GPU-seconds",
            s.gpu_ms as f64 / 1000.0
        ));
    }
    let b = a.model.as_ref().map(|m| m.budget).unwrap_or_default();
    for (max, spent, of) in [
        (b.usd_per_component, s.model_component.usd, "the component"),
        (b.usd_per_port, s.model_port.usd, "the port"),
    ] {
        if let Some(max) = max
            && spent >= max
        {
            return Some(format!(
                "agent budget spent: {spent:.4} of {max} USD for {of}"
            ));
        }
    }
    for (max, spent, of) in [
        (
            b.tokens_per_component,
            s.model_component.tokens,
            "the component",
        ),
        (b.tokens_per_port, s.model_port.tokens, "the port"),
    ] {
        if let Some(max) = max
            && spent >= max
        {
            return Some(format!(
                "agent budget spent: {spent} of {max} tokens for {of}"
            ));
        }
    }
    None
}

/// What one attempt may spend on its model API: what is left of its own
/// budget after `this_attempt` (what its earlier tries spent), or of the
/// component's and the port's when less.
pub fn allowance(
    b: &fvd_spec::agent_model::AgentBudget,
    s: &Spent,
    this_attempt: fvd_store::usage::Spend,
) -> fvd_workspace::session::Allowance {
    let least_f = |xs: [Option<f64>; 3]| xs.into_iter().flatten().reduce(f64::min);
    let least_u = |xs: [Option<u64>; 3]| xs.into_iter().flatten().min();
    fvd_workspace::session::Allowance {
        usd: least_f([
            b.usd_per_attempt.map(|m| (m - this_attempt.usd).max(0.0)),
            b.usd_per_component
                .map(|m| (m - s.model_component.usd).max(0.0)),
            b.usd_per_port.map(|m| (m - s.model_port.usd).max(0.0)),
        ]),
        tokens: least_u([
            b.tokens_per_attempt
                .map(|m| m.saturating_sub(this_attempt.tokens)),
            b.tokens_per_component
                .map(|m| m.saturating_sub(s.model_component.tokens)),
            b.tokens_per_port
                .map(|m| m.saturating_sub(s.model_port.tokens)),
        ]),
    }
}

/// What the component spent since its port was last started over
/// (`--rerun`): the ledger keeps older attempts as history, the budgets
/// start again.
pub async fn spent(
    store: &Store,
    family: &str,
    name: &str,
    recorded: &[AttemptRow],
) -> Result<Spent, fvd_store::StoreError> {
    let since = store.reset_ms(family).await?;
    let jobs = store.jobs_of(family, name).await?;
    let jobs: Vec<_> = jobs.into_iter().filter(|j| j.queued_ms >= since).collect();
    let model = store.usage_spent(family, since).await?;
    // The parity runs an agent asked for itself (`fvd mcp`'s `run_parity`).
    let tool_gpu_ms: u64 = store
        .tool_calls(family, name)
        .await?
        .iter()
        .filter(|c| c.at_ms >= since)
        .map(|c| c.gpu_ms)
        .sum();
    let model_port = model
        .values()
        .fold(fvd_store::usage::Spend::default(), |a, s| {
            fvd_store::usage::Spend {
                tokens: a.tokens + s.tokens,
                usd: a.usd + s.usd,
            }
        });
    Ok(Spent {
        model_component: model.get(name).copied().unwrap_or_default(),
        model_port,
        attempts: recorded.iter().filter(|a| a.started_ms >= since).count() as u32,
        first_queued_ms: jobs.iter().map(|j| j.queued_ms).min(),
        gpu_ms: jobs
            .iter()
            .filter(|j| j.state == JobState::Finished)
            .map(|j| j.duration_ms.unwrap_or(0) * u64::from(j.gpus_needed))
            .sum::<u64>()
            + tool_gpu_ms,
        now_ms: now_ms(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn agent() -> fvd_spec::AgentSpec {
        fvd_spec::AgentSpec {
            command: vec!["a".into()],
            timeout: Duration::from_secs(60),
            env: vec![],
            max_attempts: 3,
            max_wall: Some(Duration::from_secs(600)),
            max_gpu_s: Some(100),
            cleanup: Default::default(),
            preset: None,
            extra_args: vec![],
            model: None,
            gpus: Default::default(),
        }
    }

    #[test]
    fn each_budget_stops_the_loop_when_spent_and_not_before() {
        let a = agent();
        let fresh = Spent {
            attempts: 2,
            first_queued_ms: Some(1_000),
            gpu_ms: 99_999,
            now_ms: 1_000 + 599_999,
            model_component: Default::default(),
            model_port: Default::default(),
        };
        assert_eq!(budget_spent(&a, &fresh), None);
        let s = Spent {
            attempts: 3,
            ..fresh
        };
        assert_eq!(
            budget_spent(&a, &s).as_deref(),
            Some("agent budget spent: 3 of 3 attempts")
        );
        let s = Spent {
            now_ms: 1_000 + 600_000,
            ..fresh
        };
        assert_eq!(
            budget_spent(&a, &s).as_deref(),
            Some("agent budget spent: wall time 600 s of 600 s")
        );
        let s = Spent {
            gpu_ms: 100_000,
            ..fresh
        };
        assert_eq!(
            budget_spent(&a, &s).as_deref(),
            Some("agent budget spent: 100.0 of 100 GPU-seconds")
        );
        // No limits: only attempts count.
        let open = fvd_spec::AgentSpec {
            max_wall: None,
            max_gpu_s: None,
            ..agent()
        };
        let s = Spent {
            gpu_ms: u64::MAX / 2,
            now_ms: i64::MAX / 2,
            ..fresh
        };
        assert_eq!(budget_spent(&open, &s), None);
    }

    #[test]
    fn model_budgets_block_when_spent_and_an_attempt_gets_what_is_left() {
        use fvd_spec::agent_model::{AgentBudget, ModelApi, ModelSpec};
        use fvd_store::usage::Spend;
        let budget = AgentBudget {
            usd_per_attempt: Some(2.0),
            usd_per_component: Some(5.0),
            usd_per_port: Some(9.0),
            tokens_per_component: Some(1_000),
            ..AgentBudget::default()
        };
        let a = fvd_spec::AgentSpec {
            model: Some(ModelSpec {
                api: ModelApi::Anthropic,
                model: "claude-sonnet-4-5".into(),
                key_env: "ANTHROPIC_API_KEY".into(),
                max_turns: None,
                budget,
                prices: Default::default(),
            }),
            max_wall: None,
            max_gpu_s: None,
            ..agent()
        };
        let s = |c: (f64, u64), p: (f64, u64)| Spent {
            attempts: 0,
            first_queued_ms: None,
            gpu_ms: 0,
            now_ms: 0,
            model_component: Spend {
                usd: c.0,
                tokens: c.1,
            },
            model_port: Spend {
                usd: p.0,
                tokens: p.1,
            },
        };
        // Plenty left: the attempt's own cap; the component's tokens.
        let fresh = s((1.0, 100), (1.0, 100));
        assert_eq!(budget_spent(&a, &fresh), None);
        let none = Spend::default();
        let left = allowance(&budget, &fresh, none);
        assert_eq!((left.usd, left.tokens), (Some(2.0), Some(900)));
        // A try of an attempt after a crash, or one adopted, has what its
        // earlier tries left of the attempt's cap.
        let earlier = Spend {
            usd: 1.5,
            tokens: 50,
        };
        let left = allowance(&budget, &fresh, earlier);
        assert_eq!((left.usd, left.tokens), (Some(0.5), Some(900)));
        // Less left of the component than an attempt may spend.
        let left = allowance(&budget, &s((4.5, 100), (4.5, 100)), none);
        assert_eq!(left.usd, Some(0.5));
        // The port's other components spent most of its budget.
        let left = allowance(&budget, &s((1.0, 100), (8.75, 100)), none);
        assert_eq!(left.usd, Some(0.25));
        assert_eq!(
            budget_spent(&a, &s((5.0, 10), (5.0, 10))).as_deref(),
            Some("agent budget spent: 5.0000 of 5 USD for the component")
        );
        assert_eq!(
            budget_spent(&a, &s((1.0, 10), (9.5, 10))).as_deref(),
            Some("agent budget spent: 9.5000 of 9 USD for the port")
        );
        assert_eq!(
            budget_spent(&a, &s((1.0, 1_000), (1.0, 1_000))).as_deref(),
            Some("agent budget spent: 1000 of 1000 tokens for the component")
        );
    }
}
