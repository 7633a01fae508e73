//! The coding-agent CLIs fvd knows: how to run each headless against
//! fvd's model proxy, and how to read what it reports.
//!
//! Per attempt, a preset gets its own HOME (and XDG folders) under the
//! attempt's folder, with the CLI's configuration written there: the
//! proxy's base URL and the attempt's token (never the key), telemetry,
//! update checks and plugin fetches off. The packet goes on stdin (no
//! argument-length limit, no flag that swallows it). The CLI's JSON events
//! are read for its result, turns, usage, cost, permission denials and the
//! handoff of its structured output (Claude Code's `--json-schema`, Codex's
//! `--output-schema`).
//!
//! Flags were checked against Claude Code 2.1.332, Codex CLI 0.171.0,
//! opencode 1.18.33 and Gemini CLI 0.61.0 (`tests/agents`).

use std::path::{Path, PathBuf};

use fvd_agentproxy::Tokens;
use fvd_spec::agent_model::{ModelApi, ModelSpec, Preset};
use serde_json::{Value, json};

/// The JSON schema of a structured handoff: the block's text in one field.
pub const HANDOFF_SCHEMA: &str = r#"{"type":"object","properties":{"handoff":{"type":"string","description":"the component_skill_handoff block: its lines, one field per line, as the packet's Handoff section asks"}},"required":["handoff"],"additionalProperties":false}"#;

/// What one attempt's launch is made from.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub preset: Preset,
    pub model: &'a ModelSpec,
    pub extra_args: &'a [String],
    /// The packet, given on stdin.
    pub packet: &'a str,
    /// The attempt's folder: HOME and the CLI's files go below it.
    pub dir: &'a Path,
    /// The proxy's base URL for the model API (with its base path).
    pub base_url: &'a str,
    /// The attempt's token.
    pub token: &'a str,
    /// The agent starts in fvd's jail (`fvd_sandbox`): a CLI's own sandbox,
    /// which cannot nest in it, is left to the jail.
    pub jailed: bool,
    /// fvd's tools for the attempt (`fvd mcp`), configured as the CLI's
    /// MCP server `fvd`.
    pub mcp: Option<&'a Mcp>,
}

/// How a CLI starts `fvd mcp`: the fvd program and the variables that
/// scope it to the attempt (its tools' address, its base). Never a secret:
/// these end up in an argument or a configuration file, which other
/// processes can read; the tools' token is only in the agent's environment,
/// where `fvd mcp` finds it (issue #38).
#[derive(Debug, Clone, PartialEq)]
pub struct Mcp {
    pub program: String,
    pub env: Vec<(String, String)>,
}

impl Mcp {
    fn env_json(&self) -> Value {
        Value::Object(
            self.env
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        )
    }
}

/// How to start the CLI.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub argv: Vec<String>,
    /// Set on top of the agent's base environment (HOME replaced).
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
}

/// The variable a preset's CLI reads the attempt's token from, where its
/// configuration names one.
const TOKEN_ENV: &str = "FVD_MODEL_TOKEN";

/// Writes the CLI's configuration under the attempt's HOME and returns how
/// to start it.
pub fn launch(a: &Attempt<'_>) -> std::io::Result<Launch> {
    let plan = plan(a);
    std::fs::create_dir_all(a.dir.join("home"))?;
    for (rel, text) in &plan.files {
        let path = a.dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    Ok(plan.launch)
}

/// A launch and the files it needs, written nowhere yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub launch: Launch,
    /// `(path relative to the attempt's folder, text)`: the CLI's
    /// configuration under its HOME.
    pub files: Vec<(String, String)>,
}

/// How to start the CLI and the files it needs, without writing them: an
/// attempt on a worker gets them in its assignment (issue #32), with
/// `a.dir` a placeholder the worker replaces.
pub fn plan(a: &Attempt<'_>) -> Plan {
    let home = a.dir.join("home");
    let mut files: Vec<(String, String)> = Vec::new();
    let mut env = home_env(&home);
    let mut argv: Vec<String> = vec![a.preset.program().into()];
    match a.preset {
        Preset::ClaudeCode => claude_code_args(a, &mut argv, &mut env),
        Preset::Codex => codex_args(a, &home, &mut argv, &mut env, &mut files),
        Preset::Opencode => opencode_args(a, &mut argv, &mut env),
        Preset::Gemini => gemini_args(a, &mut argv, &mut env, &mut files),
    }
    argv.extend(a.extra_args.iter().cloned());
    if a.preset == Preset::Codex {
        // The packet comes on stdin.
        argv.push("-".to_string());
    }
    Plan {
        launch: Launch {
            argv,
            env,
            stdin: a.packet.as_bytes().to_vec(),
        },
        files,
    }
}

/// The variables every preset gets: HOME and the XDG folders under the
/// attempt's `home`, and `NO_COLOR`.
fn home_env(home: &Path) -> Vec<(String, String)> {
    vec![
        ("HOME".into(), home.display().to_string()),
        (
            "XDG_CONFIG_HOME".into(),
            home.join(".config").display().to_string(),
        ),
        (
            "XDG_DATA_HOME".into(),
            home.join(".local/share").display().to_string(),
        ),
        (
            "XDG_STATE_HOME".into(),
            home.join(".local/state").display().to_string(),
        ),
        (
            "XDG_CACHE_HOME".into(),
            home.join(".cache").display().to_string(),
        ),
        ("NO_COLOR".into(), "1".into()),
    ]
}

/// Adds Claude Code's arguments (headless, stream-json, the handoff schema,
/// its limits, fvd's MCP server and the tools it may run without asking)
/// and variables (the proxy, the token, no telemetry) to `argv` and `env`.
fn claude_code_args(a: &Attempt<'_>, argv: &mut Vec<String>, env: &mut Vec<(String, String)>) {
    let m = a.model;
    let s = |x: &str| x.to_string();
    argv.extend(
        [
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--no-session-persistence",
            "--permission-mode",
            "acceptEdits",
            "--json-schema",
            HANDOFF_SCHEMA,
            "--model",
            m.api_model(),
        ]
        .map(s),
    );
    if let Some(t) = m.max_turns {
        argv.extend([s("--max-turns"), t.to_string()]);
    }
    if let Some(usd) = m.budget.usd_per_attempt {
        // Its own cap is checked between turns; the proxy's stops it
        // mid-turn.
        argv.extend([s("--max-budget-usd"), usd.to_string()]);
    }
    // What it may run without asking: the parity test and reading
    // git. Anything else is denied (and listed on the attempt). An
    // allowlist is not a sandbox: see the containment of jobs.
    if let Some(mcp) = a.mcp {
        let config = json!({"mcpServers": {"fvd": {
            "type": "stdio",
            "command": mcp.program,
            "args": ["mcp"],
            "env": mcp.env_json(),
        }}});
        argv.extend([s("--mcp-config"), config.to_string()]);
        // fvd's tools in every request, not behind its tool search
        // (which defers MCP tools until the model looks them up).
        env.push((s("ENABLE_TOOL_SEARCH"), s("false")));
    }
    argv.push(s("--allowedTools"));
    if a.mcp.is_some() {
        // Every tool of the `fvd` MCP server.
        argv.push(s("mcp__fvd"));
    }
    argv.extend(
        [
            "Read",
            "Edit",
            "Write",
            "Glob",
            "Grep",
            "Bash(python3:*)",
            "Bash(python:*)",
            "Bash(pytest:*)",
            "Bash(git diff:*)",
            "Bash(git status:*)",
            "Bash(git log:*)",
        ]
        .map(s),
    );
    env.extend(
        [
            ("ANTHROPIC_BASE_URL", a.base_url),
            ("ANTHROPIC_API_KEY", a.token),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_ERROR_REPORTING", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_BUG_COMMAND", "1"),
        ]
        .map(|(k, v)| (s(k), s(v))),
    );
}

/// Adds Codex's arguments (exec, json, its sandbox or none in fvd's jail,
/// the output schema, the model) and variables (`CODEX_HOME`, the token) to
/// `argv` and `env`, and its configuration and the handoff schema to
/// `files`.
fn codex_args(
    a: &Attempt<'_>,
    home: &Path,
    argv: &mut Vec<String>,
    env: &mut Vec<(String, String)>,
    files: &mut Vec<(String, String)>,
) {
    let m = a.model;
    let s = |x: &str| x.to_string();
    let codex_home = home.join(".codex");
    files.push((
        "home/.codex/config.toml".into(),
        codex_config(m, a.base_url, a.mcp),
    ));
    let schema = a.dir.join("handoff.schema.json");
    files.push(("handoff.schema.json".into(), HANDOFF_SCHEMA.into()));
    argv.extend(
        [
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--ephemeral",
            "--disable",
            "plugins",
            "--sandbox",
            // Codex's own sandbox (bubblewrap or Landlock) runs no
            // command inside fvd's jail, silently: the jail is its
            // sandbox then.
            if a.jailed {
                "danger-full-access"
            } else {
                "workspace-write"
            },
            "--add-dir",
        ]
        .map(s),
    );
    argv.push(a.dir.display().to_string());
    argv.extend([s("--output-schema"), schema.display().to_string()]);
    argv.extend([s("--model"), s(m.api_model())]);
    env.push((s("CODEX_HOME"), codex_home.display().to_string()));
    env.push((s(TOKEN_ENV), s(a.token)));
}

/// Adds opencode's arguments (run, json, fvd's model) and variables (its
/// configuration, the token, its downloads and extras off) to `argv` and
/// `env`.
fn opencode_args(a: &Attempt<'_>, argv: &mut Vec<String>, env: &mut Vec<(String, String)>) {
    let m = a.model;
    let s = |x: &str| x.to_string();
    argv.extend(["run", "--format", "json", "--model"].map(s));
    argv.push(format!("fvd/{}", m.api_model()));
    env.push((
        s("OPENCODE_CONFIG_CONTENT"),
        opencode_config(m, a.base_url, a.mcp),
    ));
    env.push((s(TOKEN_ENV), s(a.token)));
    env.extend(
        [
            "OPENCODE_DISABLE_AUTOUPDATE",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS",
            "OPENCODE_DISABLE_MODELS_FETCH",
            "OPENCODE_DISABLE_LSP_DOWNLOAD",
            "OPENCODE_DISABLE_SHARE",
            "OPENCODE_DISABLE_CLAUDE_CODE",
            "OPENCODE_DISABLE_EXTERNAL_SKILLS",
            "OPENCODE_DISABLE_PROJECT_CONFIG",
        ]
        .map(|k| (s(k), s("1"))),
    );
}

/// Adds Gemini CLI's arguments (the model, stream-json, yolo, an empty
/// `--prompt`: the packet comes on stdin) and variables (the proxy, the
/// token) to `argv` and `env`, and its settings to `files`.
fn gemini_args(
    a: &Attempt<'_>,
    argv: &mut Vec<String>,
    env: &mut Vec<(String, String)>,
    files: &mut Vec<(String, String)>,
) {
    let m = a.model;
    let s = |x: &str| x.to_string();
    files.push((
        "home/.gemini/settings.json".into(),
        gemini_settings(m, a.mcp),
    ));
    argv.extend(
        [
            "--model",
            m.api_model(),
            "--output-format",
            "stream-json",
            "--approval-mode",
            "yolo",
            "--skip-trust",
            "--prompt",
            "",
        ]
        .map(s),
    );
    env.extend(
        [
            ("GOOGLE_GEMINI_BASE_URL", a.base_url),
            ("GEMINI_API_KEY", a.token),
            ("GEMINI_CLI_NO_RELAUNCH", "true"),
        ]
        .map(|(k, v)| (s(k), s(v))),
    );
}

fn codex_config(m: &ModelSpec, base_url: &str, mcp: Option<&Mcp>) -> String {
    let q = |s: &str| serde_json::to_string(s).expect("strings serialize");
    let mut text = format!(
        "# Written by fvd for one agent attempt.\n\
model = {model}\n\
model_provider = \"fvd\"\n\
approval_policy = \"never\"\n\
allow_login_shell = false\n\
check_for_update_on_startup = false\n\
web_search = \"disabled\"\n\
\n\
[analytics]\nenabled = false\n\
\n\
[feedback]\nenabled = false\n\
\n\
[history]\npersistence = \"none\"\n\
\n\
[model_providers.fvd]\n\
name = \"fvd model proxy\"\n\
base_url = {base}\n\
env_key = \"{TOKEN_ENV}\"\n\
wire_api = \"responses\"\n\
request_max_retries = 0\n\
stream_max_retries = 0\n",
        model = q(m.api_model()),
        base = q(base_url),
    );
    if let Some(mcp) = mcp {
        let env: Vec<String> = mcp
            .env
            .iter()
            .map(|(k, v)| format!("{} = {}", q(k), q(v)))
            .collect();
        text.push_str(&format!(
            "\n[mcp_servers.fvd]\ncommand = {}\nargs = [\"mcp\"]\nenv = {{ {} }}\n",
            q(&mcp.program),
            env.join(", ")
        ));
    }
    text
}

fn opencode_config(m: &ModelSpec, base_url: &str, mcp: Option<&Mcp>) -> String {
    let npm = match m.api {
        ModelApi::Anthropic => "@ai-sdk/anthropic",
        _ => "@ai-sdk/openai-compatible",
    };
    let mut v = json!({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": false,
        "share": "disabled",
        "plugin": [],
        "model": format!("fvd/{}", m.api_model()),
        "provider": {"fvd": {
            "npm": npm,
            "name": "fvd model proxy",
            "options": {"baseURL": base_url, "apiKey": format!("{{env:{TOKEN_ENV}}}")},
            "models": {m.api_model(): {"name": m.api_model()}},
        }},
        // Fetching from the network is not the agent's job: refused (and
        // listed on the attempt). A rule is not a sandbox either.
        "permission": {
            "edit": "allow",
            "bash": {"*": "allow", "curl *": "deny", "wget *": "deny"},
            "webfetch": "deny",
        },
    });
    if let Some(mcp) = mcp {
        v["mcp"] = json!({"fvd": {
            "type": "local",
            "command": [mcp.program, "mcp"],
            "environment": mcp.env_json(),
            "enabled": true,
        }});
    }
    v.to_string()
}

fn gemini_settings(m: &ModelSpec, mcp: Option<&Mcp>) -> String {
    let mut v = json!({
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
    });
    if let Some(t) = m.max_turns {
        v["model"] = json!({"maxSessionTurns": t});
    }
    if let Some(mcp) = mcp {
        v["mcpServers"] = json!({"fvd": {
            "command": mcp.program,
            "args": ["mcp"],
            "env": mcp.env_json(),
            "trust": true,
        }});
    }
    v.to_string()
}

/// A cap of the CLI's own that ended the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    Turns,
    Budget,
}

/// What the CLI said about its run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Its final answer's text.
    pub result: Option<String>,
    /// The handoff of its structured output.
    pub structured_handoff: Option<String>,
    pub turns: Option<u32>,
    /// Its own usage figures, when it reports them.
    pub tokens: Option<Tokens>,
    /// Its own cost figure, when it reports one.
    pub cost_usd: Option<f64>,
    /// Tool calls it refused to make, as `TOOL: input`.
    pub permission_denials: Vec<String>,
    pub cap: Option<Cap>,
    /// Its last error message.
    pub error: Option<String>,
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn text(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_string)
}

/// A tool call's input in one short line.
fn brief(tool: &str, input: &Value) -> String {
    let shown = ["command", "cmd", "file_path", "filePath", "url", "pattern"]
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| input.to_string());
    let line = format!("{tool}: {shown}");
    crate::agent::tail(&line, 300).to_string()
}

/// Reads the CLI's stdout: one JSON event per line (others are skipped).
pub fn report(preset: Preset, stdout: &str) -> Report {
    let events: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .filter(Value::is_object)
        .collect();
    let mut r = Report::default();
    match preset {
        Preset::ClaudeCode => claude(&events, &mut r),
        Preset::Codex => codex(&events, &mut r),
        Preset::Opencode => opencode(&events, &mut r),
        Preset::Gemini => gemini(&events, &mut r),
    }
    r
}

fn claude(events: &[Value], r: &mut Report) {
    let mut texts = Vec::new();
    for e in events {
        match e.get("type").and_then(Value::as_str) {
            Some("assistant") => {
                for c in e
                    .pointer("/message/content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(t) = c.get("text").and_then(Value::as_str) {
                        texts.push(t.to_string());
                    }
                }
            }
            Some("result") => {
                r.result = text(e, "result");
                r.turns = e.get("num_turns").and_then(Value::as_u64).map(|n| n as u32);
                r.cost_usd = e.get("total_cost_usd").and_then(Value::as_f64);
                if let Some(us) = e.get("usage") {
                    r.tokens = Some(Tokens {
                        input: u(us, "input_tokens"),
                        output: u(us, "output_tokens"),
                        cache_read: u(us, "cache_read_input_tokens"),
                        cache_write: u(us, "cache_creation_input_tokens"),
                    });
                }
                r.structured_handoff = e
                    .pointer("/structured_output/handoff")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                r.permission_denials = e
                    .get("permission_denials")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|d| {
                        brief(
                            d.get("tool_name").and_then(Value::as_str).unwrap_or("?"),
                            d.get("tool_input").unwrap_or(&Value::Null),
                        )
                    })
                    .collect();
                let sub = e.get("subtype").and_then(Value::as_str).unwrap_or("");
                let reason = e
                    .get("terminal_reason")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if sub == "error_max_turns" || reason == "max_turns" {
                    r.cap = Some(Cap::Turns);
                } else if sub.contains("budget") || reason.contains("budget") {
                    r.cap = Some(Cap::Budget);
                }
                if e.get("is_error").and_then(Value::as_bool) == Some(true) {
                    r.error = Some(format!(
                        "{}{}",
                        if sub.is_empty() { "error" } else { sub },
                        r.result
                            .as_deref()
                            .map(|t| format!(": {}", crate::agent::tail(t, 300)))
                            .unwrap_or_default()
                    ));
                }
            }
            _ => {}
        }
    }
    if r.result.is_none() {
        r.result = texts.pop();
    }
}

fn codex(events: &[Value], r: &mut Report) {
    let mut tokens: Option<Tokens> = None;
    for e in events {
        match e.get("type").and_then(Value::as_str) {
            Some("item.completed") => {
                let item = e.get("item").unwrap_or(&Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("agent_message") {
                    r.result = text(item, "text");
                }
            }
            Some("turn.completed") => {
                if let Some(us) = e.get("usage") {
                    let cached = u(us, "cached_input_tokens");
                    tokens.get_or_insert_with(Tokens::default).add(&Tokens {
                        input: u(us, "input_tokens").saturating_sub(cached),
                        output: u(us, "output_tokens"),
                        cache_read: cached,
                        cache_write: u(us, "cache_write_input_tokens"),
                    });
                }
            }
            Some("turn.failed") => {
                r.error = e
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(|m| crate::agent::tail(m, 300).to_string());
            }
            Some("error") => {
                r.error = text(e, "message").map(|m| crate::agent::tail(&m, 300).to_string());
            }
            _ => {}
        }
    }
    r.tokens = tokens;
    r.structured_handoff = r.result.as_deref().and_then(structured_handoff);
}

fn opencode(events: &[Value], r: &mut Report) {
    let mut tokens: Option<Tokens> = None;
    let mut cost: Option<f64> = None;
    let mut turns = 0u32;
    for e in events {
        let part = e.get("part").unwrap_or(&Value::Null);
        match e.get("type").and_then(Value::as_str) {
            Some("text") => r.result = text(part, "text"),
            Some("step_finish") => {
                turns += 1;
                if let Some(t) = part.get("tokens") {
                    let cache = t.get("cache").unwrap_or(&Value::Null);
                    tokens.get_or_insert_with(Tokens::default).add(&Tokens {
                        input: u(t, "input"),
                        output: u(t, "output") + u(t, "reasoning"),
                        cache_read: u(cache, "read"),
                        cache_write: u(cache, "write"),
                    });
                }
                if let Some(c) = part.get("cost").and_then(Value::as_f64) {
                    *cost.get_or_insert(0.0) += c;
                }
            }
            Some("tool_use") => {
                let state = part.get("state").unwrap_or(&Value::Null);
                let err = state.get("error").and_then(Value::as_str).unwrap_or("");
                // A rule's refusal, or a person's ("rejected permission").
                let refused = ["prevents you from using", "rejected permission", "denied"];
                if state.get("status").and_then(Value::as_str) == Some("error")
                    && refused.iter().any(|r| err.contains(r))
                {
                    r.permission_denials.push(brief(
                        part.get("tool").and_then(Value::as_str).unwrap_or("?"),
                        state.get("input").unwrap_or(&Value::Null),
                    ));
                }
            }
            Some("error") => {
                let msg = e
                    .pointer("/error/data/message")
                    .or_else(|| e.pointer("/error/name"))
                    .and_then(Value::as_str)
                    .unwrap_or("error");
                r.error = Some(crate::agent::tail(msg, 300).to_string());
            }
            _ => {}
        }
    }
    r.turns = (turns > 0).then_some(turns);
    r.tokens = tokens;
    r.cost_usd = cost.filter(|c| *c > 0.0);
}

fn gemini(events: &[Value], r: &mut Report) {
    let mut reply = String::new();
    let mut tool_calls = 0u32;
    for e in events {
        match e.get("type").and_then(Value::as_str) {
            Some("message") if e.get("role").and_then(Value::as_str) == Some("assistant") => {
                if e.get("delta").and_then(Value::as_bool) != Some(true) {
                    reply.clear();
                }
                reply.push_str(e.get("content").and_then(Value::as_str).unwrap_or(""));
            }
            Some("tool_use") => {
                // A reply after tools starts a new final text.
                reply.clear();
                tool_calls += 1;
            }
            Some("tool_result") => {
                let status = e.get("status").and_then(Value::as_str).unwrap_or("");
                let msg = e
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if status == "error" && (msg.contains("denied") || msg.contains("not allowed")) {
                    r.permission_denials
                        .push(crate::agent::tail(msg, 300).to_string());
                }
            }
            Some("result") => {
                let stats = e.get("stats").unwrap_or(&Value::Null);
                let cached = u(stats, "cached");
                r.tokens = Some(Tokens {
                    input: u(stats, "input_tokens").saturating_sub(cached),
                    output: u(stats, "output_tokens"),
                    cache_read: cached,
                    cache_write: 0,
                });
                if e.get("status").and_then(Value::as_str) == Some("error") {
                    r.error = e
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .map(|m| crate::agent::tail(m, 300).to_string());
                }
            }
            Some("error") => {
                r.error = text(e, "message").map(|m| crate::agent::tail(&m, 300).to_string());
            }
            _ => {}
        }
    }
    r.turns = Some(tool_calls + 1).filter(|_| r.tokens.is_some());
    if !reply.is_empty() {
        r.result = Some(reply);
    }
}

/// A cap a CLI tells only by its exit code: Gemini CLI exits 53 when its
/// session's turns are spent.
pub fn exit_cap(preset: Preset, code: Option<i32>) -> Option<Cap> {
    (preset == Preset::Gemini && code == Some(53)).then_some(Cap::Turns)
}

/// `{"handoff": "…"}` as a final message's text.
fn structured_handoff(text: &str) -> Option<String> {
    serde_json::from_str::<Value>(text.trim())
        .ok()?
        .get("handoff")?
        .as_str()
        .map(str::to_string)
}

/// Where a preset's CLI is found: `FVD_AGENT_CLI_DIR` (a folder of
/// programs, e.g. an npm prefix's `node_modules/.bin`) first, then `PATH`.
pub fn find_program(preset: Preset, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let dirs = std::env::var_os("FVD_AGENT_CLI_DIR")
        .into_iter()
        .chain(path.map(|p| p.to_os_string()))
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    for d in dirs {
        let f = d.join(preset.program());
        if f.is_file() {
            return Some(f);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn model(api: ModelApi, model: &str) -> ModelSpec {
        ModelSpec {
            api,
            model: model.into(),
            key_env: api.default_key_env().into(),
            max_turns: Some(7),
            budget: Default::default(),
            prices: BTreeMap::new(),
        }
    }

    /// Every preset starts `fvd mcp` as its MCP server `fvd`, with the
    /// variables that scope it to the attempt, and Claude Code may call its
    /// tools without asking.
    #[test]
    fn each_preset_configures_fvd_mcp_for_the_attempt() {
        let mcp = Mcp {
            program: "{fvd}".into(),
            env: vec![
                ("FVD_TOOLS_ADDR".into(), "{tools_addr}".into()),
                ("FVD_ATTEMPT_BASE".into(), "base-commit".into()),
            ],
        };
        for (preset, api, m) in [
            (Preset::ClaudeCode, ModelApi::Anthropic, "claude-sonnet-4-5"),
            (Preset::Codex, ModelApi::OpenAiResponses, "gpt-5"),
            (Preset::Opencode, ModelApi::OpenAiChat, "openai/gpt-5"),
            (Preset::Gemini, ModelApi::Gemini, "gemini-2.5-pro"),
        ] {
            let spec = model(api, m);
            let p = plan(&Attempt {
                preset,
                model: &spec,
                extra_args: &[],
                packet: "the packet",
                dir: Path::new("{attempt_dir}"),
                base_url: "{proxy_url}/v1",
                token: "fvd-token",
                jailed: true,
                mcp: Some(&mcp),
            });
            // Wherever the preset keeps it: its argv, its env or a file.
            let mut all = p.launch.argv.join("\n");
            for (k, v) in &p.launch.env {
                all.push_str(&format!("\n{k}={v}"));
            }
            for (path, text) in &p.files {
                all.push_str(&format!("\n{path}:\n{text}"));
                assert!(!path.starts_with('/') && !path.contains(".."), "{path}");
            }
            for want in [
                "{fvd}",
                "mcp",
                "FVD_TOOLS_ADDR",
                "{tools_addr}",
                "base-commit",
            ] {
                assert!(
                    all.contains(want),
                    "{}: {want} missing from\n{all}",
                    preset.name()
                );
            }
            if preset == Preset::ClaudeCode {
                assert!(
                    p.launch.argv.contains(&"mcp__fvd".to_string()),
                    "{:?}",
                    p.launch.argv
                );
                let i = p
                    .launch
                    .argv
                    .iter()
                    .position(|a| a == "--mcp-config")
                    .unwrap();
                let config: Value = serde_json::from_str(&p.launch.argv[i + 1]).unwrap();
                assert_eq!(config["mcpServers"]["fvd"]["args"], json!(["mcp"]));
            }
            // Without tools, no MCP server.
            let bare = plan(&Attempt {
                preset,
                model: &spec,
                extra_args: &[],
                packet: "the packet",
                dir: Path::new("{attempt_dir}"),
                base_url: "{proxy_url}/v1",
                token: "fvd-token",
                jailed: true,
                mcp: None,
            });
            let text = format!("{:?}", bare);
            assert!(
                !text.contains("FVD_TOOLS_ADDR"),
                "{}: {text}",
                preset.name()
            );
        }
    }

    #[test]
    fn each_preset_gets_the_token_and_the_proxy_never_a_key() {
        let dir = tempfile::tempdir().unwrap();
        for (preset, api, m) in [
            (Preset::ClaudeCode, ModelApi::Anthropic, "claude-sonnet-4-5"),
            (Preset::Codex, ModelApi::OpenAiResponses, "gpt-5"),
            (Preset::Opencode, ModelApi::OpenAiChat, "openai/gpt-5"),
            (Preset::Gemini, ModelApi::Gemini, "gemini-2.5-pro"),
        ] {
            let spec = model(api, m);
            let attempt_dir = dir.path().join(preset.name());
            std::fs::create_dir_all(&attempt_dir).unwrap();
            let l = launch(&Attempt {
                preset,
                model: &spec,
                extra_args: &["--x".to_string()],
                packet: "the packet",
                dir: &attempt_dir,
                base_url: "http://127.0.0.1:9/v1",
                token: "fvd-token",
                jailed: false,
                mcp: None,
            })
            .unwrap();
            assert_eq!(l.argv[0], preset.program());
            assert!(l.argv.contains(&"--x".to_string()), "{:?}", l.argv);
            assert_eq!(l.stdin, b"the packet");
            let home = attempt_dir.join("home").display().to_string();
            assert!(l.env.contains(&("HOME".into(), home)), "{:?}", l.env);
            // The token reaches the CLI, by its variable or its config.
            let mut seen = l.env.iter().any(|(_, v)| v == "fvd-token");
            seen |= l
                .env
                .iter()
                .any(|(k, v)| k == TOKEN_ENV && v == "fvd-token");
            assert!(seen, "{preset:?}: {:?}", l.env);
            // No API key variable is set from fvd's environment.
            for (k, v) in &l.env {
                assert!(
                    !(k.ends_with("_API_KEY") && v != "fvd-token"),
                    "{preset:?}: {k}"
                );
            }
            let all = format!("{:?}", l.argv);
            match preset {
                Preset::ClaudeCode => assert!(all.contains("\"--max-turns\", \"7\""), "{all}"),
                Preset::Codex => {
                    assert_eq!(l.argv.last().unwrap(), "-");
                    let cfg = std::fs::read_to_string(attempt_dir.join("home/.codex/config.toml"))
                        .unwrap();
                    assert!(
                        cfg.contains("base_url = \"http://127.0.0.1:9/v1\""),
                        "{cfg}"
                    );
                    assert!(cfg.contains("env_key = \"FVD_MODEL_TOKEN\""), "{cfg}");
                    let parsed: toml::Table = cfg.parse().unwrap();
                    assert_eq!(parsed["model"].as_str(), Some("gpt-5"));
                }
                Preset::Opencode => {
                    let cfg = &l
                        .env
                        .iter()
                        .find(|(k, _)| k == "OPENCODE_CONFIG_CONTENT")
                        .unwrap()
                        .1;
                    let v: Value = serde_json::from_str(cfg).unwrap();
                    assert_eq!(
                        v["provider"]["fvd"]["options"]["baseURL"],
                        "http://127.0.0.1:9/v1"
                    );
                    assert!(all.contains("\"fvd/gpt-5\""), "{all}");
                }
                Preset::Gemini => {
                    let s = std::fs::read_to_string(attempt_dir.join("home/.gemini/settings.json"))
                        .unwrap();
                    assert!(s.contains("\"maxSessionTurns\":7"), "{s}");
                }
            }
        }
    }

    #[test]
    fn claude_code_results_give_usage_cost_denials_and_the_structured_handoff() {
        let out = concat!(
            r#"{"type":"system","subtype":"init"}"#,
            "\n",
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"working"}]}}"#,
            "\nnot json\n",
            r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":5,"total_cost_usd":0.0154,"usage":{"input_tokens":4000,"output_tokens":200,"cache_read_input_tokens":800,"cache_creation_input_tokens":40},"permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"curl http://x"}}],"structured_output":{"handoff":"component: c"}}"#,
        );
        let r = report(Preset::ClaudeCode, out);
        assert_eq!(r.turns, Some(5));
        assert_eq!(r.cost_usd, Some(0.0154));
        assert_eq!(
            r.tokens,
            Some(Tokens {
                input: 4000,
                output: 200,
                cache_read: 800,
                cache_write: 40
            })
        );
        assert_eq!(r.permission_denials, ["Bash: curl http://x"]);
        assert_eq!(r.structured_handoff.as_deref(), Some("component: c"));
        assert_eq!(r.cap, Some(Cap::Turns));
        assert_eq!(r.result.as_deref(), Some("working"));
    }

    #[test]
    fn codex_opencode_and_gemini_events_are_read() {
        let codex_out = concat!(
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"{\"handoff\": \"component: c\"}"}}"#,
            "\n",
            r#"{"type":"turn.completed","usage":{"input_tokens":4800,"cached_input_tokens":800,"output_tokens":200}}"#,
        );
        let r = report(Preset::Codex, codex_out);
        assert_eq!(r.structured_handoff.as_deref(), Some("component: c"));
        assert_eq!(r.tokens.unwrap().input, 4000);

        let oc = concat!(
            r#"{"type":"step_finish","part":{"tokens":{"input":1000,"output":50,"reasoning":0,"cache":{"read":200,"write":0}},"cost":0.01}}"#,
            "\n",
            r#"{"type":"tool_use","part":{"tool":"bash","state":{"status":"error","input":{"command":"curl http://x"},"error":"The user has specified a rule which prevents you from using this specific tool call."}}}"#,
            "\n",
            r#"{"type":"text","part":{"text":"Done.\n\ncomponent: c\n"}}"#,
            "\n",
            r#"{"type":"step_finish","part":{"tokens":{"input":1000,"output":50,"reasoning":0,"cache":{"read":200,"write":0}},"cost":0.01}}"#,
        );
        let r = report(Preset::Opencode, oc);
        assert_eq!(r.turns, Some(2));
        assert_eq!(r.tokens.unwrap().cache_read, 400);
        assert_eq!(r.cost_usd, Some(0.02));
        assert_eq!(r.permission_denials, ["bash: curl http://x"]);
        assert_eq!(r.result.as_deref(), Some("Done.\n\ncomponent: c\n"));

        let gem = concat!(
            r#"{"type":"tool_use","tool_name":"read_file"}"#,
            "\n",
            r#"{"type":"message","role":"assistant","content":"Done.\n\n","delta":true}"#,
            "\n",
            r#"{"type":"message","role":"assistant","content":"component: c\n","delta":true}"#,
            "\n",
            r#"{"type":"result","status":"success","stats":{"input_tokens":4800,"output_tokens":200,"cached":800}}"#,
        );
        let r = report(Preset::Gemini, gem);
        assert_eq!(r.result.as_deref(), Some("Done.\n\ncomponent: c\n"));
        assert_eq!(r.tokens.unwrap().input, 4000);
    }
}
