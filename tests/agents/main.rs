//! Real coding-agent CLIs as the component subagent (issue 29): Claude
//! Code, Codex and opencode, installed from the npm registry at pinned
//! versions (`scripts/agent-clis.sh`), each run by its `[agent] preset`
//! against the repository's scripted model server, inside `unshare -n`
//! (nothing but loopback: the proof that nothing else is contacted).
//!
//! Per preset:
//! - the example's `timestep_embed` goes red → the CLI makes the real fix
//!   with its own tools → `non_skip_pass`; the first model request fails
//!   with a 500 and fvd's proxy retries it; the ledger's usage is the
//!   server's to the token and priced; the key is in neither the agent's
//!   environment nor any file fvd wrote nor fvd's output;
//! - a looping agent is ended mid-run by `usd_per_attempt`, within
//!   seconds of the reply that crossed it and within one reply's cost;
//! - a key the API refuses (401) is an environment cause: exit 4, nothing
//!   counted, the variable named (Claude Code: the same attempt then runs
//!   with the right key and passes);
//! - the turn cap ends a looping agent (its own flag, or the proxy's count
//!   for Codex);
//! - an invalid handoff is recorded as such, and a tool call the CLI
//!   refused is listed on the attempt (Claude Code, opencode).
//!
//! Built only with `--features agents` (Node, the CLIs and root for
//! `unshare -n` needed); `scripts/test.sh` installs them and runs it:
//!
//! ```sh
//! bash scripts/agent-clis.sh && cargo test --locked --features agents --test agents
//! ```

mod cheats;
mod lab;

#[cfg(feature = "agents-gemini")]
use lab::GEMINI;
use lab::{
    CLAUDE, CODEX, Cli, Lab, NEW, OLD, OPENCODE, TEST, dump_env, handoff, isolated, only_attempt,
    reply_usd, script,
};
use serde_json::{Value, json};

/// The steps of a fix: read the file, fix it with the CLI's edit tool, show
/// the environment, run the parity test, hand off. The first request fails
/// once with a 500.
fn fix_steps() -> Value {
    json!([
        {"read": "{workdir}/fastvideo/layers/timestep.py", "fail": {"status": 500, "times": 1}},
        {"edit": {"path": "{workdir}/fastvideo/layers/timestep.py", "old": OLD, "new": NEW}},
        dump_env(),
        {"bash": format!("python3 -B -m pytest {TEST} -q -p no:cacheprovider")},
        {"handoff": handoff()},
        {"text": "done"},
    ])
}

/// An agent that never finishes.
fn loop_steps() -> Value {
    json!([{"loop": {"bash": "python3 -c pass"}}])
}

fn component(status: &Value) -> Value {
    status["components"][0].clone()
}

/// Where each preset's handoff comes from.
fn handoff_source(cli: Cli) -> &'static str {
    match cli.preset {
        "opencode" | "gemini" => "output",
        _ => "structured_output",
    }
}

fn fixes_the_planted_bug_offline(cli: Cli) {
    let lab = Lab::new(cli, "max_turns = 12\nmax_attempts = 2", script(fix_steps()));
    let started = std::time::Instant::now();
    let (code, out) = lab.submit();
    let wall = started.elapsed();
    assert_eq!(code, Some(0), "{out}");
    let status = lab.status();
    let c = component(&status);
    assert_eq!(c["status"], "non_skip_pass", "{status:#}\n{out}");
    assert_eq!(c["runs"], 2, "{status:#}");

    let ledger = lab.ledger();
    let a = only_attempt(&ledger);
    assert_eq!(a["verdict_before"], "debug_red", "{a:#}");
    assert_eq!(a["verdict_after"], "non_skip_pass", "{a:#}");
    assert!(
        a["diff"]
            .as_str()
            .unwrap()
            .contains(&format!("+    return np.concatenate({NEW}")),
        "{a:#}"
    );
    assert_eq!(a["handoff_status"], "valid", "{a:#}");
    let u = &a["usage"];
    assert_eq!(u["preset"], cli.preset, "{a:#}");
    assert_eq!(u["source"], "proxy");
    assert_eq!(u["outcome"], "completed", "{u:#}");
    assert_eq!(u["handoff_source"], handoff_source(cli), "{u:#}");
    // The 500 was retried by the proxy: the CLI never saw it.
    assert_eq!(u["retries"], 1, "{u:#}");
    let log = lab.requests();
    assert_eq!(
        log.iter().filter(|r| r["status"] == 500).count(),
        1,
        "{log:?}"
    );
    assert!(
        log.iter().all(|r| r["auth"] == "ok" || r["status"] == 500),
        "{log:?}"
    );
    // The ledger's usage is the server's, to the token.
    let (i, o, cr, cw) = lab.served();
    assert_eq!(
        (
            u["input_tokens"].as_u64().unwrap(),
            u["output_tokens"].as_u64().unwrap(),
            u["cache_read_tokens"].as_u64().unwrap(),
            u["cache_write_tokens"].as_u64().unwrap(),
        ),
        (i, o, cr, cw),
        "{u:#}"
    );
    let answered = log.iter().filter(|r| r["status"] == 200).count() as u64;
    assert_eq!(u["requests"].as_u64().unwrap(), answered, "{u:#} {log:?}");
    // Priced at the default table (the scripted replies; a side request a
    // CLI makes is priced at the same model's price).
    let scripted = log
        .iter()
        .filter(|r| r["status"] == 200 && r["script"] == "timestep_embed")
        .count() as f64;
    let cost = u["cost_usd"].as_f64().unwrap();
    assert!(cost >= scripted * reply_usd(cli) - 1e-9, "{cost} {u:#}");
    assert!(cost < (scripted + 1.0) * reply_usd(cli), "{cost} {u:#}");
    // fvd status --json shows the spend per component and per port.
    assert_eq!(c["agent_spend"]["cost_usd"], u["cost_usd"], "{status:#}");
    assert_eq!(status["agent_spend"]["attempts"], 1, "{status:#}");

    // The agent's own environment: a token of the attempt, never the key.
    let env: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(lab.attempt_dir(1).join("prompt.md.env.json"))
            .expect("the agent ran the env step"),
    )
    .unwrap();
    assert!(
        env.values()
            .all(|v| !v.as_str().unwrap_or("").contains(&lab.key)),
        "the key is in the agent's environment"
    );
    assert!(
        env.iter()
            .any(|(k, v)| (k.ends_with("_API_KEY") || k == "FVD_MODEL_TOKEN")
                && v.as_str().unwrap().starts_with("fvd-")),
        "{:?}",
        env.keys().collect::<Vec<_>>()
    );
    lab.assert_key_absent(&[&out]);
    eprintln!(
        "timing: {}: fvd submit, red run to non_skip_pass: {:.1} s; the agent: {:.1} s",
        cli.preset,
        wall.as_secs_f64(),
        a["duration_ms"].as_f64().unwrap() / 1000.0
    );
}

fn a_budget_stops_a_looping_agent_mid_run(cli: Cli) {
    let per = reply_usd(cli);
    let cap = per * 5.5;
    let lab = Lab::new(
        cli,
        &format!("max_attempts = 1\n\n[agent.budget]\nusd_per_attempt = {cap}"),
        script(loop_steps()),
    );
    let (code, out) = lab.submit();
    assert_ne!(code, Some(0), "{out}");
    let a = only_attempt(&lab.ledger());
    let u = &a["usage"];
    assert_eq!(u["outcome"], "budget_cap", "{a:#}\n{out}");
    assert!(
        u["stop_reason"]
            .as_str()
            .unwrap()
            .contains(&format!("of {cap} USD")),
        "{u:#}"
    );
    // The cap holds before the request (issue #43): the request that
    // would cross it is refused before it leaves, so the spend stays
    // under the cap, within one reply of it. A request with Anthropic's
    // extended thinking (Claude Code's) needs room for 1,025 output
    // tokens at least, and is refused once less is left.
    let reason = u["stop_reason"].as_str().unwrap();
    let thinking = reason.contains("too few for the request's extended thinking (1025 at least)");
    let room = if thinking { 1025.0 * 15.0 / 1e6 } else { 0.0 };
    let cost = u["cost_usd"].as_f64().unwrap();
    assert!(
        cost <= cap + 1e-9 && cost > cap - per - room - 1e-6,
        "{cost} vs {cap}: {u:#}"
    );
    assert!(u["requests"].as_u64().unwrap() >= 1, "{u:#}");
    assert!(
        thinking || reason.contains("not one output token is left"),
        "{u:#}"
    );
    // Nothing was forwarded after the last reply, and the agent was ended
    // within seconds of it.
    let log = lab.requests();
    let last = log.iter().rfind(|r| r["status"] == 200).unwrap();
    let crossed_ms = (last["time"].as_f64().unwrap() * 1000.0) as i64;
    let ended_ms = a["finished_ms"].as_i64().unwrap();
    assert!(
        ended_ms - crossed_ms < 5_000,
        "the agent ran {} ms past its budget",
        ended_ms - crossed_ms
    );
    assert_eq!(a["exit_code"], Value::Null, "killed, not exited: {a:#}");
    assert_eq!(a["signal"], 9, "{a:#}");
    let c = component(&lab.status());
    assert_eq!(c["status"], "blocked", "{c:#}");
    assert!(
        c["reason"].as_str().unwrap().contains("agent budget spent"),
        "{c:#}"
    );
    lab.assert_key_absent(&[&out]);
}

fn a_refused_key_is_an_environment_cause(cli: Cli, then_fix: bool) {
    let lab = Lab::new(cli, "max_turns = 12\nmax_attempts = 1", script(fix_steps()));
    let wrong = "sk-fvdtest-wrong-key";
    let (code, out) = lab.submit_with_key(wrong);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains("timestep_embed: the agent could not work:") && out.contains(cli.key_env),
        "{out}"
    );
    assert!(!out.contains(wrong), "the refused key is in fvd's output");
    let c = component(&lab.status());
    assert_eq!(c["status"], "environment", "{c:#}");
    let reason = c["reason"].as_str().unwrap();
    assert!(
        reason.contains(cli.key_env) && reason.contains("(401)"),
        "{reason}"
    );
    let a = only_attempt(&lab.ledger());
    assert_eq!(a["state"], "environment", "{a:#}");
    assert_eq!(a["usage"]["outcome"], "auth", "{a:#}");
    let log = lab.requests();
    assert!(
        !log.is_empty() && log.iter().all(|r| r["status"] == 401),
        "{log:?}"
    );
    assert!(log.len() <= 2, "the agent went on after a 401: {log:?}");
    // The worktree is where the attempt began.
    assert!(a["commit_sha"].as_str().unwrap().is_empty(), "{a:#}");
    if then_fix {
        // Fixed: the same attempt runs again (not a second one) and the
        // budget of one attempt was never spent on the refusal.
        let (code, out) = lab.submit();
        assert_eq!(code, Some(0), "{out}");
        let a = only_attempt(&lab.ledger());
        assert_eq!(
            (a["attempt"].as_u64(), a["tries"].as_u64()),
            (Some(1), Some(2)),
            "{a:#}"
        );
        assert_eq!(a["verdict_after"], "non_skip_pass", "{a:#}");
        lab.assert_key_absent(&[&out]);
    }
}

fn the_turn_cap_ends_a_looping_agent(cli: Cli) {
    let lab = Lab::new(cli, "max_turns = 3\nmax_attempts = 1", script(loop_steps()));
    let (code, out) = lab.submit();
    assert_ne!(code, Some(0), "{out}");
    let a = only_attempt(&lab.ledger());
    let u = &a["usage"];
    assert_eq!(u["outcome"], "turn_cap", "{a:#}\n{out}");
    let scripted = lab
        .requests()
        .iter()
        .filter(|r| r["status"] == 200 && r["script"] == "timestep_embed")
        .count();
    assert!((3..=4).contains(&scripted), "{scripted} turns: {u:#}");
    assert_eq!(a["handoff_status"], "missing", "{a:#}");
}

fn an_invalid_handoff_and_a_refused_tool_are_recorded(cli: Cli, refused: Option<Value>) {
    let mut steps = vec![];
    if let Some(r) = &refused {
        steps.push(r.clone());
    }
    steps.push(json!({"handoff": "component: timestep_embed\nmode: parity-debug\nparity_status: non_skip_pass"}));
    steps.push(json!({"text": "done"}));
    let lab = Lab::new(
        cli,
        "max_turns = 12\nmax_attempts = 1",
        script(Value::Array(steps)),
    );
    let (code, out) = lab.submit();
    assert_ne!(code, Some(0), "{out}");
    let a = only_attempt(&lab.ledger());
    assert_eq!(a["handoff_status"], "invalid", "{a:#}\n{out}");
    assert!(
        a["handoff_summary"].as_str().unwrap().contains("missing"),
        "{a:#}"
    );
    assert_eq!(a["usage"]["handoff_source"], handoff_source(cli), "{a:#}");
    if refused.is_some() {
        let denials = a["usage"]["permission_denials"].as_array().unwrap();
        assert!(
            denials
                .iter()
                .any(|d| d.as_str().unwrap().contains("127.0.0.1:9")),
            "{a:#}"
        );
    }
}

/// The JSON object `fvd agents check --json` printed, in `out`.
fn check_json(out: &str) -> Value {
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in {out}"));
    serde_json::from_str(line).unwrap()
}

fn agents_check_reports_the_cli_the_model_and_the_key(cli: Cli) {
    let lab = Lab::new(cli, "max_attempts = 1", script(loop_steps()));
    let (code, out) = lab.check_with_key(&lab.key.clone());
    assert_eq!(code, Some(0), "{out}");
    let c = check_json(&out);
    assert_eq!(c["preset"], cli.preset, "{c:#}");
    assert_eq!(c["key"], "works", "{c:#}");
    assert_eq!(c["model"], cli.model.rsplit('/').next().unwrap(), "{c:#}");
    assert!(!c["version"].as_str().unwrap().is_empty(), "{c:#}");
    assert!(c["requests"].as_u64().unwrap() >= 1, "{c:#}");
    let (code, out) = lab.check_with_key("sk-fvdtest-wrong-key");
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains("\"key\":\"refused\"") && out.contains(cli.key_env),
        "{out}"
    );
    // The check's folder is gone and nothing of it is in the repository.
    assert!(!lab.repo.join(".fvd").exists(), "{out}");

    // A model that answers the check with a tool call, every turn: the CLI
    // stops at the check's turn cap, and the check still says what it
    // learnt (the CLI, the key and the endpoint work), not a problem
    // (issue #43).
    let (i, o, cr, cw) = lab::USAGE;
    let tools = json!({"scripts": [{
        "name": "check",
        "marker": "fvd agents check: reply with the single word ok",
        "usage": {"input": i, "output": o, "cache_read": cr, "cache_write": cw},
        "steps": [{"loop": {"bash": "true"}}],
    }]});
    let lab = Lab::new(cli, "max_attempts = 1", tools);
    let (code, out) = lab.check_with_key(&lab.key.clone());
    assert_eq!(code, Some(0), "{out}");
    let c = check_json(&out);
    assert_eq!(c["key"], "works", "{c:#}");
    assert_eq!(c["problem"], "", "{c:#}");
    assert!(
        c["reply"]
            .as_str()
            .unwrap()
            .contains("answered with a tool call"),
        "{c:#}"
    );
}

/// On a fleet (issue #32): the CLI runs on the worker, asks fvd's
/// `run_parity` (its MCP server `fvd mcp`) before and after its fix, and
/// gets fvd's verdict of a run the worker made of its work tree; the key
/// never reaches the worker.
fn runs_parity_on_a_worker_through_fvd_mcp(cli: Cli) {
    let steps = json!([
        {"mcp": "run_parity"},
        {"read": "{workdir}/fastvideo/layers/timestep.py"},
        {"edit": {"path": "{workdir}/fastvideo/layers/timestep.py", "old": OLD, "new": NEW}},
        {"mcp": "run_parity"},
        {"handoff": handoff()},
        {"text": "done"},
    ]);
    let lab = Lab::new(cli, "max_turns = 12\nmax_attempts = 1", script(steps));
    let (code, out, fleet) = lab.submit_on_fleet();
    assert_eq!(code, Some(0), "{out}");
    let ledger = fleet.ledger();
    let a = only_attempt(&ledger);
    assert_eq!(a["worker_id"], "w1", "{a:#}");
    assert_eq!(a["verdict_after"], "non_skip_pass", "{a:#}");
    let calls =
        fleet.query("SELECT tool, outcome, detail FROM attempt_tool_calls ORDER BY attempt, seq");
    let got: Vec<(&str, &str)> = calls
        .iter()
        .map(|r| (r[0].as_str().unwrap(), r[1].as_str().unwrap()))
        .collect();
    let stdout =
        std::fs::read_to_string(lab.attempt_dir(1).join("agent.stdout")).unwrap_or_default();
    assert_eq!(
        got,
        [("run_parity", "ok"), ("run_parity", "ok")],
        "{calls:?}\nthe agent's stdout:\n{stdout}\nthe model server's log: {:?}",
        lab.requests()
    );
    assert!(
        calls[0][2].as_str().unwrap().starts_with("debug_red"),
        "{calls:?}"
    );
    assert!(
        calls[1][2].as_str().unwrap().starts_with("non_skip_pass"),
        "{calls:?}"
    );
    // The worker never held the key: not in its log, its workspace, or
    // anything fvd wrote.
    let d = lab.dir.path();
    lab.assert_key_absent_in(
        &[&out],
        &[
            lab.repo.clone(),
            d.join("ws-w1"),
            d.join("worker.log"),
            d.join("orchestrator.log"),
            d.join("orchestrator.db"),
            d.join("orchestrator.db-wal"),
        ],
        "worker.log",
    );
}

macro_rules! in_netns {
    ($name:ident, $body:expr) => {
        #[test]
        fn $name() {
            if isolated(stringify!($name)) {
                $body;
            }
        }
    };
}

in_netns!(
    claude_code_fixes_the_planted_bug_offline,
    fixes_the_planted_bug_offline(CLAUDE)
);
in_netns!(
    codex_fixes_the_planted_bug_offline,
    fixes_the_planted_bug_offline(CODEX)
);
in_netns!(
    opencode_fixes_the_planted_bug_offline,
    fixes_the_planted_bug_offline(OPENCODE)
);

in_netns!(
    claude_code_is_stopped_by_its_budget,
    a_budget_stops_a_looping_agent_mid_run(CLAUDE)
);
in_netns!(
    codex_is_stopped_by_its_budget,
    a_budget_stops_a_looping_agent_mid_run(CODEX)
);
in_netns!(
    opencode_is_stopped_by_its_budget,
    a_budget_stops_a_looping_agent_mid_run(OPENCODE)
);

in_netns!(
    claude_code_refused_key_waits_then_resumes,
    a_refused_key_is_an_environment_cause(CLAUDE, true)
);
in_netns!(
    codex_refused_key_waits,
    a_refused_key_is_an_environment_cause(CODEX, false)
);
in_netns!(
    opencode_refused_key_waits,
    a_refused_key_is_an_environment_cause(OPENCODE, false)
);

in_netns!(
    claude_code_turn_cap,
    the_turn_cap_ends_a_looping_agent(CLAUDE)
);
in_netns!(codex_turn_cap, the_turn_cap_ends_a_looping_agent(CODEX));
in_netns!(
    opencode_turn_cap,
    the_turn_cap_ends_a_looping_agent(OPENCODE)
);

in_netns!(
    claude_code_agents_check,
    agents_check_reports_the_cli_the_model_and_the_key(CLAUDE)
);
in_netns!(
    opencode_agents_check,
    agents_check_reports_the_cli_the_model_and_the_key(OPENCODE)
);

in_netns!(
    claude_code_invalid_handoff_and_denied_tool,
    an_invalid_handoff_and_a_refused_tool_are_recorded(
        CLAUDE,
        Some(json!({"bash": "curl -s http://127.0.0.1:9/"}))
    )
);
in_netns!(
    codex_invalid_handoff,
    an_invalid_handoff_and_a_refused_tool_are_recorded(CODEX, None)
);
in_netns!(
    opencode_invalid_handoff_and_denied_tool,
    an_invalid_handoff_and_a_refused_tool_are_recorded(
        OPENCODE,
        Some(json!({"bash": "curl -s http://127.0.0.1:9/"}))
    )
);

// Gemini CLI needs Node 20, which Debian 12 does not ship: its tests run
// with `--features agents-gemini` where it is installed
// (`FVD_AGENT_GEMINI=1 bash scripts/agent-clis.sh`), not in CI.
#[cfg(feature = "agents-gemini")]
in_netns!(
    gemini_fixes_the_planted_bug_offline,
    fixes_the_planted_bug_offline(GEMINI)
);
#[cfg(feature = "agents-gemini")]
in_netns!(
    gemini_is_stopped_by_its_budget,
    a_budget_stops_a_looping_agent_mid_run(GEMINI)
);
#[cfg(feature = "agents-gemini")]
in_netns!(
    gemini_refused_key_waits,
    a_refused_key_is_an_environment_cause(GEMINI, false)
);
#[cfg(feature = "agents-gemini")]
in_netns!(gemini_turn_cap, the_turn_cap_ends_a_looping_agent(GEMINI));
#[cfg(feature = "agents-gemini")]
in_netns!(
    gemini_invalid_handoff,
    an_invalid_handoff_and_a_refused_tool_are_recorded(GEMINI, None)
);

in_netns!(
    claude_code_runs_parity_on_a_worker_through_fvd_mcp,
    runs_parity_on_a_worker_through_fvd_mcp(CLAUDE)
);

// Issue #39: the cheats of a coding agent, through the real CLIs; every
// row of the table through Claude Code, the tolerance and conftest cheats
// through Codex (the raw `[agent] command` is `tests/e2e/judge.rs`).
in_netns!(
    claude_code_cheats_are_named_never_passed,
    cheats::cheats_are_named_never_passed(CLAUDE, false, true)
);
in_netns!(
    claude_code_cheats_on_a_worker_are_named_never_passed,
    cheats::cheats_are_named_never_passed(CLAUDE, true, true)
);
in_netns!(
    codex_cheats_are_named_never_passed,
    cheats::cheats_are_named_never_passed(CODEX, false, false)
);
in_netns!(
    codex_cheats_on_a_worker_are_named_never_passed,
    cheats::cheats_are_named_never_passed(CODEX, true, false)
);
