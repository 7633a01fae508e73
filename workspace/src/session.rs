//! One agent attempt behind fvd's model proxy: the key read from fvd's own
//! environment, the proxy started for the attempt with the budgets left,
//! the CLI's launch (a preset's, or a raw command's with the API's
//! standard variables pointed at the proxy), and, once the agent ended,
//! what it spent and why it stopped.

/// An attempt's token, checked by its digest (issue #38: an attempt
/// adopted after a restart keeps the token its agent holds).
pub use fvd_agentproxy::AttemptToken;
use std::time::Duration;

use fvd_agentproxy::{
    Api, Config, Limits, Price, PriceTable, Proxy, Retry, Secret, Trip, Upstream,
};
use fvd_spec::AgentSpec;
use fvd_spec::agent_model::{ModelApi, ModelSpec, Preset};
use fvd_store::usage::AttemptUsage;

use crate::agent::{AgentExit, HandoffRead};
use crate::preset::{self, Cap, Report};

/// A cause outside the agent and the code: the port waits for it to be
/// fixed, and no budget is spent on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Environment(pub String);

/// A proxied attempt in progress.
#[derive(Debug)]
pub struct Session {
    proxy: Proxy,
    model: ModelSpec,
    preset: Option<Preset>,
    upstream: String,
}

/// The budgets left to one attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Allowance {
    pub usd: Option<f64>,
    pub tokens: Option<u64>,
}

/// The price table the proxy counts in: the spec's over the defaults, and
/// the configured model's price for any other model a CLI asks for.
fn price_table(m: &ModelSpec) -> PriceTable {
    let conv = |p: fvd_spec::agent_model::ModelPrice| Price {
        input: p.input,
        output: p.output,
        cache_read: p.cache_read,
        cache_write: p.cache_write,
    };
    PriceTable {
        models: m
            .prices
            .iter()
            .map(|(k, v)| (k.clone(), conv(*v)))
            .collect(),
        fallback: m.price(m.api_model()).map(conv),
    }
}

fn proxy_api(a: ModelApi) -> Api {
    match a {
        ModelApi::Anthropic => Api::Anthropic,
        ModelApi::OpenAiChat | ModelApi::OpenAiResponses => Api::OpenAi,
        ModelApi::Gemini => Api::Gemini,
    }
}

impl Session {
    /// Starts the attempt's proxy. The key comes from `key_env` in fvd's
    /// environment and the upstream from the API's `*_BASE_URL` there, or
    /// the vendor's endpoint. A missing key or a malformed URL is an
    /// environment cause, named by its variable. `token`: the attempt's
    /// token when its agent already holds one (an attempt adopted after a
    /// restart of the orchestrator); a fresh one otherwise.
    pub async fn start(
        spec: &AgentSpec,
        model: &ModelSpec,
        allowance: Allowance,
        label: String,
        retry: Retry,
        token: Option<fvd_agentproxy::AttemptToken>,
    ) -> Result<Session, Environment> {
        let key = std::env::var(&model.key_env).unwrap_or_default();
        if key.trim().is_empty() {
            return Err(Environment(format!(
                "{} is not set in fvd's environment: the model proxy needs the key of the model API there (the agent never gets it)",
                model.key_env
            )));
        }
        let var = model.api.base_url_env();
        let url = std::env::var(var)
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| model.api.default_base_url().to_string());
        let upstream =
            Upstream::parse(url.trim()).map_err(|e| Environment(format!("{var}: {e}")))?;
        let shown = upstream.url();
        // A CLI that stops itself at the cap keeps it; for the others (and
        // raw commands) the proxy counts the turns.
        let turn_cap = model
            .max_turns
            .filter(|_| !spec.preset.is_some_and(Preset::caps_its_turns));
        let token = match token {
            Some(t) => t,
            None => fvd_agentproxy::AttemptToken::fresh()
                .map_err(|e| Environment(format!("cannot make an attempt token: {e}")))?,
        };
        let proxy = Proxy::start_with(
            Config {
                api: proxy_api(model.api),
                upstream,
                key: Secret::new(key),
                limits: Limits {
                    usd: allowance.usd,
                    tokens: allowance.tokens,
                    turns: turn_cap,
                },
                prices: price_table(model),
                retry,
                label,
            },
            token,
        )
        .await
        .map_err(|e| Environment(e.to_string()))?;
        Ok(Session {
            proxy,
            model: model.clone(),
            preset: spec.preset,
            upstream: shown,
        })
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// The variables a raw command gets: its API's standard ones pointed at
    /// the proxy with the token, and `FVD_MODEL_BASE_URL`/`FVD_MODEL_TOKEN`.
    /// A session started from a token's digest has no token to give: its
    /// agent was given it when it started, and only the URLs are listed.
    pub fn raw_env(&self) -> Vec<(String, String)> {
        let base = self.proxy.base_url();
        let (url_var, key_var) = (
            self.model.api.base_url_env(),
            self.model.api.default_key_env(),
        );
        let mut env = vec![
            (url_var.into(), base.clone()),
            ("FVD_MODEL_BASE_URL".into(), base),
        ];
        if let Some(token) = self.proxy.token() {
            env.push((key_var.into(), token.to_string()));
            env.push(("FVD_MODEL_TOKEN".into(), token.to_string()));
        }
        env
    }

    /// Completes when the proxy stops forwarding: the agent is then ended.
    pub async fn stopped(&self) {
        let mut trips = self.proxy.trips();
        let _ = trips.wait_for(Option::is_some).await;
    }

    /// The usage so far as a ledger row (`running`), for durable writes
    /// while the agent runs.
    pub fn usage_now(&self) -> AttemptUsage {
        self.usage(None, "running", "", &[], "")
    }

    fn usage(
        &self,
        report: Option<&Report>,
        outcome: &str,
        stop_reason: &str,
        denials: &[String],
        handoff_source: &str,
    ) -> AttemptUsage {
        let u = self.proxy.usage();
        AttemptUsage {
            preset: self
                .preset
                .map(|p| p.name().to_string())
                .unwrap_or_default(),
            model: self.model.api_model().to_string(),
            input_tokens: u.tokens.input,
            output_tokens: u.tokens.output,
            cache_read_tokens: u.tokens.cache_read,
            cache_write_tokens: u.tokens.cache_write,
            // Unknown only when no token had a price.
            cost_usd: (u.tokens.total() == 0 || u.unpriced_tokens < u.tokens.total())
                .then_some(u.cost_usd),
            unpriced_tokens: u.unpriced_tokens,
            source: "proxy".into(),
            cost_source: "prices".into(),
            requests: u.requests,
            retries: u.retries,
            turns: report.and_then(|r| r.turns),
            cli_cost_usd: report.and_then(|r| r.cost_usd),
            outcome: outcome.into(),
            stop_reason: stop_reason.into(),
            permission_denials: denials.to_vec(),
            handoff_source: handoff_source.into(),
        }
    }

    /// What the attempt came to once its agent ended: the ledger's usage
    /// row and, when the cause lies outside the agent, the environment.
    pub fn finish(
        &self,
        exit: &AgentExit,
        report: Option<&Report>,
        handoff: &HandoffRead,
    ) -> (AttemptUsage, Option<Environment>) {
        let trip = self.proxy.tripped();
        let denials = report
            .map(|r| r.permission_denials.clone())
            .unwrap_or_default();
        let cap = report.and_then(|r| r.cap).or_else(|| {
            self.preset
                .and_then(|p| preset::exit_cap(p, exit.exit_code))
        });
        let (outcome, why, env) = match (&trip, cap) {
            (Some(Trip::Auth { status }), _) => {
                let why = format!(
                    "the model API at {} refused the key in {} ({status}): fix {} in fvd's environment and submit again",
                    self.upstream, self.model.key_env, self.model.key_env
                );
                ("auth", why.clone(), Some(Environment(why)))
            }
            (Some(Trip::Upstream { message, .. }), _) => {
                let why = format!("the model API failed: {message}");
                ("upstream", why.clone(), Some(Environment(why)))
            }
            (Some(Trip::Budget(w)), _) => ("budget_cap", format!("budget spent: {w}"), None),
            (Some(Trip::Turns(w)), _) => ("turn_cap", format!("turns spent: {w}"), None),
            (None, Some(Cap::Turns)) => (
                "turn_cap",
                format!(
                    "the CLI's turn cap ({}) was reached",
                    self.model
                        .max_turns
                        .map_or("its default".into(), |t| t.to_string())
                ),
                None,
            ),
            (None, Some(Cap::Budget)) => (
                "budget_cap",
                "the CLI's budget cap was reached".into(),
                None,
            ),
            (None, None) if exit.timed_out => ("timed_out", "the agent timed out".into(), None),
            (None, None) if exit.exit_code == Some(0) => ("completed", String::new(), None),
            (None, None) => (
                "error",
                report.and_then(|r| r.error.clone()).unwrap_or_else(|| {
                    crate::agent::exit_text(exit.exit_code, exit.signal, exit.timed_out)
                }),
                None,
            ),
        };
        // What the CLI says is cut and checked: it may quote anything.
        let why = crate::agent::tail(&why, 500).to_string();
        (
            self.usage(report, outcome, &why, &denials, handoff.source),
            env,
        )
    }
}

/// Where and how a preset's CLI starts for an attempt.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The attempt's folder (its HOME and files go below it).
    pub dir: &'a std::path::Path,
    /// It starts in fvd's jail.
    pub jailed: bool,
    /// fvd's tools, configured as its MCP server.
    pub mcp: Option<&'a preset::Mcp>,
}

/// A preset's launch for this session, with the packet on stdin, its
/// files written under `at.dir`.
pub fn launch(
    s: &Session,
    spec: &AgentSpec,
    preset: Preset,
    packet: &str,
    at: Place<'_>,
) -> std::io::Result<preset::Launch> {
    let base = s.proxy.base_url();
    preset::launch(&attempt(s, spec, preset, packet, at, &base))
}

/// A preset's launch for this session as a worker runs it (issue #32):
/// nothing written here; `at.dir` and `base_url` are what the worker fills
/// in (its attempt folder, its loopback end of the proxy's tunnel).
pub fn plan(
    s: &Session,
    spec: &AgentSpec,
    preset: Preset,
    packet: &str,
    at: Place<'_>,
    base_url: &str,
) -> preset::Plan {
    preset::plan(&attempt(s, spec, preset, packet, at, base_url))
}

fn attempt<'a>(
    s: &'a Session,
    spec: &'a AgentSpec,
    preset: Preset,
    packet: &'a str,
    at: Place<'a>,
    base_url: &'a str,
) -> preset::Attempt<'a> {
    preset::Attempt {
        preset,
        model: &s.model,
        extra_args: &spec.extra_args,
        packet,
        dir: at.dir,
        base_url,
        // Empty for a session started from a token's digest, whose agent
        // is not launched again.
        token: s.proxy.token().unwrap_or_default(),
        jailed: at.jailed,
        mcp: at.mcp,
    }
}

/// The retries of real attempts: three more tries over about 3.5 s.
pub fn default_retry() -> Retry {
    Retry {
        retries: 3,
        base: Duration::from_millis(500),
        max_wait: Duration::from_secs(8),
    }
}
