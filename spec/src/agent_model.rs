//! The model side of an `[agent]`: which coding-agent CLI a preset names,
//! which model API it talks to through fvd's proxy, the variable holding
//! that API's key (in fvd's environment, never the agent's), the turn cap,
//! the money and token budgets (`[agent.budget]`) and the prices they are
//! counted in (`[agent.prices."MODEL"]`, over the defaults below).

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// A coding-agent CLI fvd knows how to run headless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    ClaudeCode,
    Codex,
    Opencode,
    Gemini,
}

impl Preset {
    pub const ALL: [Preset; 4] = [
        Preset::ClaudeCode,
        Preset::Codex,
        Preset::Opencode,
        Preset::Gemini,
    ];

    /// The name a spec gives it.
    pub fn name(self) -> &'static str {
        match self {
            Preset::ClaudeCode => "claude-code",
            Preset::Codex => "codex",
            Preset::Opencode => "opencode",
            Preset::Gemini => "gemini",
        }
    }

    pub fn parse(s: &str) -> Option<Preset> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The program it runs (found on `PATH`).
    pub fn program(self) -> &'static str {
        match self {
            Preset::ClaudeCode => "claude",
            Preset::Codex => "codex",
            Preset::Opencode => "opencode",
            Preset::Gemini => "gemini",
        }
    }

    /// Whether its CLI stops itself after `max_turns` turns (Claude Code's
    /// `--max-turns`, Gemini CLI's `maxSessionTurns`). For the others fvd's
    /// proxy counts the turns: Codex has no such flag, and opencode's step
    /// limit asks the model for one more answer instead of stopping.
    pub fn caps_its_turns(self) -> bool {
        matches!(self, Preset::ClaudeCode | Preset::Gemini)
    }

    /// The API it talks to for `model` (opencode: `anthropic/…` speaks
    /// Anthropic Messages, any other provider OpenAI Chat Completions).
    pub fn api(self, model: &str) -> ModelApi {
        match self {
            Preset::ClaudeCode => ModelApi::Anthropic,
            Preset::Codex => ModelApi::OpenAiResponses,
            Preset::Opencode if model.starts_with("anthropic/") => ModelApi::Anthropic,
            Preset::Opencode => ModelApi::OpenAiChat,
            Preset::Gemini => ModelApi::Gemini,
        }
    }
}

/// A model API's wire protocol and where its key and base URL come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelApi {
    Anthropic,
    OpenAiChat,
    OpenAiResponses,
    Gemini,
}

impl ModelApi {
    /// The name a spec gives it (`[agent] api` of a raw command).
    pub fn name(self) -> &'static str {
        match self {
            ModelApi::Anthropic => "anthropic",
            ModelApi::OpenAiChat => "openai-chat",
            ModelApi::OpenAiResponses => "openai-responses",
            ModelApi::Gemini => "gemini",
        }
    }

    pub fn parse(s: &str) -> Option<ModelApi> {
        [
            ModelApi::Anthropic,
            ModelApi::OpenAiChat,
            ModelApi::OpenAiResponses,
            ModelApi::Gemini,
        ]
        .into_iter()
        .find(|a| a.name() == s)
    }

    /// The variable holding the key, unless the spec names another.
    pub fn default_key_env(self) -> &'static str {
        match self {
            ModelApi::Anthropic => "ANTHROPIC_API_KEY",
            ModelApi::OpenAiChat | ModelApi::OpenAiResponses => "OPENAI_API_KEY",
            ModelApi::Gemini => "GEMINI_API_KEY",
        }
    }

    /// The standard variable that points the API elsewhere (a gateway, a
    /// test server); read from fvd's environment.
    pub fn base_url_env(self) -> &'static str {
        match self {
            ModelApi::Anthropic => "ANTHROPIC_BASE_URL",
            ModelApi::OpenAiChat | ModelApi::OpenAiResponses => "OPENAI_BASE_URL",
            ModelApi::Gemini => "GOOGLE_GEMINI_BASE_URL",
        }
    }

    /// The vendor's endpoint, when that variable is not set.
    pub fn default_base_url(self) -> &'static str {
        match self {
            ModelApi::Anthropic => "https://api.anthropic.com",
            ModelApi::OpenAiChat | ModelApi::OpenAiResponses => "https://api.openai.com/v1",
            ModelApi::Gemini => "https://generativelanguage.googleapis.com",
        }
    }
}

/// `[agent.budget]`: what agents may spend, in USD and in tokens, per
/// attempt, per component and per port (since the port was last started
/// over). `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AgentBudget {
    pub usd_per_attempt: Option<f64>,
    pub usd_per_component: Option<f64>,
    pub usd_per_port: Option<f64>,
    pub tokens_per_attempt: Option<u64>,
    pub tokens_per_component: Option<u64>,
    pub tokens_per_port: Option<u64>,
}

impl AgentBudget {
    pub fn has_usd(&self) -> bool {
        self.usd_per_attempt.is_some()
            || self.usd_per_component.is_some()
            || self.usd_per_port.is_some()
    }

    pub fn is_empty(&self) -> bool {
        *self == AgentBudget::default()
    }
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelPrice {
    pub input: f64,
    pub output: f64,
    pub cache_read: f64,
    pub cache_write: f64,
}

/// List prices (USD per million tokens) of the models the presets are
/// most often run with, as published when this table was written; a model
/// id is priced by its longest entry it starts with. `[agent.prices]`
/// overrides or adds entries: check your vendor's price list.
pub const DEFAULT_PRICES: &[(&str, ModelPrice)] = &[
    ("claude-opus-4", p(15.0, 75.0, 1.5, 18.75)),
    ("claude-opus-4-5", p(5.0, 25.0, 0.5, 6.25)),
    ("claude-opus-4-6", p(5.0, 25.0, 0.5, 6.25)),
    ("claude-sonnet-4", p(3.0, 15.0, 0.3, 3.75)),
    ("claude-haiku-4-5", p(1.0, 5.0, 0.1, 1.25)),
    ("claude-3-5-haiku", p(0.8, 4.0, 0.08, 1.0)),
    ("gpt-5", p(1.25, 10.0, 0.125, 0.0)),
    ("gpt-5-mini", p(0.25, 2.0, 0.025, 0.0)),
    ("gpt-5-nano", p(0.05, 0.4, 0.005, 0.0)),
    ("gpt-4.1", p(2.0, 8.0, 0.5, 0.0)),
    ("gemini-2.5-pro", p(1.25, 10.0, 0.31, 0.0)),
    ("gemini-2.5-flash", p(0.3, 2.5, 0.075, 0.0)),
];

const fn p(input: f64, output: f64, cache_read: f64, cache_write: f64) -> ModelPrice {
    ModelPrice {
        input,
        output,
        cache_read,
        cache_write,
    }
}

/// The model side of an agent: everything fvd's proxy needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub api: ModelApi,
    /// As the spec gives it (opencode's keeps its `provider/` prefix).
    pub model: String,
    /// The variable of fvd's environment that holds the key.
    pub key_env: String,
    /// Model requests (turns) one attempt may make; the CLI's own flag
    /// where it has one, the proxy's count otherwise.
    pub max_turns: Option<u32>,
    pub budget: AgentBudget,
    /// The defaults with the spec's entries over them.
    pub prices: BTreeMap<String, ModelPrice>,
}

impl ModelSpec {
    /// The model id as the API sees it (without opencode's provider).
    pub fn api_model(&self) -> &str {
        match self.model.split_once('/') {
            Some((_, m)) => m,
            None => &self.model,
        }
    }

    /// The price of `model` (exact, else its longest prefix in the table).
    pub fn price(&self, model: &str) -> Option<ModelPrice> {
        self.prices.get(model).copied().or_else(|| {
            self.prices
                .iter()
                .filter(|(id, _)| model.starts_with(id.as_str()))
                .max_by_key(|(id, _)| id.len())
                .map(|(_, p)| *p)
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBudget {
    usd_per_attempt: Option<Spanned<f64>>,
    usd_per_component: Option<Spanned<f64>>,
    usd_per_port: Option<Spanned<f64>>,
    tokens_per_attempt: Option<Spanned<u64>>,
    tokens_per_component: Option<Spanned<u64>>,
    tokens_per_port: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrice {
    input: f64,
    output: f64,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
}

/// The `[agent]` keys this module reads.
#[derive(Debug, Default)]
pub(crate) struct RawModel {
    pub preset: Option<Spanned<String>>,
    pub api: Option<Spanned<String>>,
    pub model: Option<Spanned<String>>,
    pub key_env: Option<Spanned<String>>,
    pub max_turns: Option<Spanned<u32>>,
    pub budget: Option<RawBudget>,
    pub prices: BTreeMap<String, RawPrice>,
    pub has_command: bool,
    pub env: Vec<String>,
}

/// What [`parse`] makes of an `[agent]` table.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub preset: Option<Preset>,
    pub model: Option<ModelSpec>,
}

/// Checks the model keys of `[agent]`; errors are `(line, message)`, the
/// line 0 when the table itself is at fault.
pub(crate) fn parse(
    raw: RawModel,
    line_of: impl Fn(usize) -> usize,
) -> Result<Parsed, (usize, String)> {
    let preset = preset_of(&raw, &line_of)?;
    let model = raw.model.as_ref().map(|m| m.get_ref().clone());
    let line_or_0 = |s: &Option<Spanned<String>>| s.as_ref().map_or(0, |s| line_of(s.span().start));
    let Some(api) = api_of(&raw, preset, model.as_deref(), &line_of)? else {
        return without_proxy(&raw);
    };
    let model = model.unwrap_or_default();
    if model.trim().is_empty() && raw.model.is_some() {
        return Err((line_or_0(&raw.model), "agent.model is empty".into()));
    }
    if preset == Some(Preset::Opencode) && !model.contains('/') {
        return Err((
            line_or_0(&raw.model),
            format!(
                "agent.model {} names no provider: opencode takes provider/model (anthropic/… or openai/…)",
                fvd_paths::shown(&model)
            ),
        ));
    }
    let key_env = key_env_of(&raw, api, &line_of)?;
    if let Some(t) = &raw.max_turns
        && *t.get_ref() == 0
    {
        return Err((
            line_of(t.span().start),
            "agent.max_turns must be at least 1".into(),
        ));
    }
    let prices = prices(raw.prices)?;
    let budget = budget(raw.budget, &line_of)?;
    let spec = ModelSpec {
        api,
        model,
        key_env,
        max_turns: raw.max_turns.map(Spanned::into_inner),
        budget,
        prices,
    };
    if budget.has_usd() && spec.price(spec.api_model()).is_none() {
        return Err((
            0,
            format!(
                "agent.budget counts USD but model {} has no price: add [agent.prices.\"{}\"] with input and output (USD per million tokens)",
                fvd_paths::shown(spec.api_model()),
                spec.api_model()
            ),
        ));
    }
    Ok(Parsed {
        preset,
        model: Some(spec),
    })
}

/// The `agent.preset`, checked, when there is one; refused when the table
/// gives both a preset and a command, or neither.
fn preset_of(
    raw: &RawModel,
    line_of: &impl Fn(usize) -> usize,
) -> Result<Option<Preset>, (usize, String)> {
    let preset = match &raw.preset {
        None => None,
        Some(s) => Some(Preset::parse(s.get_ref()).ok_or_else(|| {
            (
                line_of(s.span().start),
                format!(
                    "agent.preset {} is not one of {}",
                    fvd_paths::shown(s.get_ref()),
                    Preset::ALL.map(Preset::name).join(", ")
                ),
            )
        })?),
    };
    match (preset, raw.has_command) {
        (Some(_), true) => Err((
            0,
            "agent: give either preset or command, not both (extra_args adds to a preset's command)"
                .into(),
        )),
        (None, false) => Err((0, "agent: give a preset or a command".into())),
        _ => Ok(preset),
    }
}

/// The model API fvd's proxy speaks: the preset's for `model` (which a
/// preset requires), else `agent.api` of a raw command; `None` for a raw
/// command without the proxy.
fn api_of(
    raw: &RawModel,
    preset: Option<Preset>,
    model: Option<&str>,
    line_of: &impl Fn(usize) -> usize,
) -> Result<Option<ModelApi>, (usize, String)> {
    let api = match (&raw.api, preset) {
        (Some(a), Some(_)) => {
            return Err((
                line_of(a.span().start),
                "agent.api is for a raw command: a preset knows its API".into(),
            ));
        }
        (Some(a), None) => Some(ModelApi::parse(a.get_ref()).ok_or_else(|| {
            (
                line_of(a.span().start),
                format!(
                    "agent.api {} is not one of anthropic, openai-chat, openai-responses, gemini",
                    fvd_paths::shown(a.get_ref())
                ),
            )
        })?),
        (None, _) => None,
    };
    match (preset, api) {
        (Some(p), _) => {
            let Some(m) = model else {
                return Err((
                    raw.preset.as_ref().map_or(0, |s| line_of(s.span().start)),
                    format!(
                        "agent.model is required with preset {} (the model's id, as its API names it)",
                        p.name()
                    ),
                ));
            };
            Ok(Some(p.api(m)))
        }
        (None, a) => Ok(a),
    }
}

/// A raw command without the proxy: nothing of the model side may be set,
/// and nothing of it is parsed.
fn without_proxy(raw: &RawModel) -> Result<Parsed, (usize, String)> {
    for (what, set) in [
        ("model", raw.model.is_some()),
        ("key_env", raw.key_env.is_some()),
        ("max_turns", raw.max_turns.is_some()),
        ("budget", raw.budget.is_some()),
        ("prices", !raw.prices.is_empty()),
    ] {
        if set {
            return Err((
                0,
                format!(
                    "agent.{what} needs fvd's model proxy: set agent.preset, or agent.api with a command"
                ),
            ));
        }
    }
    Ok(Parsed::default())
}

/// The variable that holds the model key: `agent.key_env`, checked, else
/// the API's default; refused when `agent.env` passes it to the agent.
fn key_env_of(
    raw: &RawModel,
    api: ModelApi,
    line_of: &impl Fn(usize) -> usize,
) -> Result<String, (usize, String)> {
    let key_env = match &raw.key_env {
        Some(k) => {
            if !crate::is_env_name(k.get_ref()) {
                return Err((
                    line_of(k.span().start),
                    "agent.key_env is not a variable name (specs name variables, never values)"
                        .into(),
                ));
            }
            k.get_ref().clone()
        }
        None => api.default_key_env().to_string(),
    };
    if raw.env.contains(&key_env) {
        return Err((
            0,
            format!(
                "agent.env passes {key_env} to the agent: fvd's proxy holds that key and the agent gets a token of its own; remove it from env"
            ),
        ));
    }
    Ok(key_env)
}

/// The default prices with the spec's `[agent.prices]` over them, each
/// checked (finite, not negative); an unknown cache price is the input's.
fn prices(
    raw: BTreeMap<String, RawPrice>,
) -> Result<BTreeMap<String, ModelPrice>, (usize, String)> {
    let mut prices: BTreeMap<String, ModelPrice> = DEFAULT_PRICES
        .iter()
        .map(|(m, p)| (m.to_string(), *p))
        .collect();
    for (m, p) in raw {
        let all = [
            p.input,
            p.output,
            p.cache_read.unwrap_or(0.0),
            p.cache_write.unwrap_or(0.0),
        ];
        if all.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err((
                0,
                format!(
                    "agent.prices.{}: prices are USD per million tokens, finite and not negative",
                    fvd_paths::shown(&m)
                ),
            ));
        }
        prices.insert(
            m,
            ModelPrice {
                input: p.input,
                output: p.output,
                // Unknown cache prices are charged as input: a budget
                // errs on the side of stopping early.
                cache_read: p.cache_read.unwrap_or(p.input),
                cache_write: p.cache_write.unwrap_or(p.input),
            },
        );
    }
    Ok(prices)
}

fn budget(
    raw: Option<RawBudget>,
    line_of: &impl Fn(usize) -> usize,
) -> Result<AgentBudget, (usize, String)> {
    let Some(r) = raw else {
        return Ok(AgentBudget::default());
    };
    let usd = |v: Option<Spanned<f64>>, name: &str| -> Result<Option<f64>, (usize, String)> {
        match v {
            Some(s) if !(s.get_ref().is_finite() && *s.get_ref() > 0.0) => Err((
                line_of(s.span().start),
                format!("agent.budget.{name} must be a positive number of USD"),
            )),
            other => Ok(other.map(Spanned::into_inner)),
        }
    };
    let tokens = |v: Option<Spanned<u64>>, name: &str| -> Result<Option<u64>, (usize, String)> {
        match v {
            Some(s) if *s.get_ref() == 0 => Err((
                line_of(s.span().start),
                format!("agent.budget.{name} must be at least 1 token"),
            )),
            other => Ok(other.map(Spanned::into_inner)),
        }
    };
    Ok(AgentBudget {
        usd_per_attempt: usd(r.usd_per_attempt, "usd_per_attempt")?,
        usd_per_component: usd(r.usd_per_component, "usd_per_component")?,
        usd_per_port: usd(r.usd_per_port, "usd_per_port")?,
        tokens_per_attempt: tokens(r.tokens_per_attempt, "tokens_per_attempt")?,
        tokens_per_component: tokens(r.tokens_per_component, "tokens_per_component")?,
        tokens_per_port: tokens(r.tokens_per_port, "tokens_per_port")?,
    })
}
