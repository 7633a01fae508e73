//! An agent behind fvd's model proxy without a real CLI (issue 29): a raw
//! `[agent] command` with `api = "openai-chat"` (`tests/agents/api_agent.py`,
//! standard-library Python) talks to the repository's scripted model
//! server through the proxy. The component's USD budget spans its
//! attempts: the second attempt gets only what is left and is ended by the
//! proxy mid-run, the third is refused, and the component is blocked; the
//! ledger's usage is the server's; the agent saw a token, never the key.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::agent::example_repo;
use crate::dashboard::{Kill, http};
use crate::support::{Sandbox, fvd};

/// The repository's scripted model server on loopback, demanding `key`.
pub(crate) struct ModelServer {
    child: Child,
    pub(crate) port: u16,
    log: std::path::PathBuf,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ModelServer {
    pub(crate) fn start(dir: &Path, key: &str, script: serde_json::Value) -> ModelServer {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        std::fs::write(dir.join("key"), key).unwrap();
        std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
        let port_file = dir.join("port");
        let log = dir.join("server.jsonl");
        let child = Command::new("python3")
            .arg(root.join("tests/agents/model_server.py"))
            .arg("--script")
            .arg(dir.join("script.json"))
            .arg("--key-file")
            .arg(dir.join("key"))
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log")
            .arg(&log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                break p.trim().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the model server did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        ModelServer { child, port, log }
    }

    fn replies(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["status"] == 200)
            .collect()
    }
}

/// gpt-5 at the default prices: 1000 input, 50 output, 200 cached.
pub(crate) const REPLY_USD: f64 = (1000.0 * 1.25 + 50.0 * 10.0 + 200.0 * 0.125) / 1e6;

/// The example port whose `timestep_embed` alone has an agent: the raw
/// `api_agent.py` behind the proxy, `requests` requests per attempt, and
/// `extra` lines in its `[agent]` table; the model server it talks to.
pub(crate) fn proxied_port(sb: &Sandbox, key: &str, requests: u32, extra: &str) -> ModelServer {
    proxied_port_with(sb, key, &["--requests", &requests.to_string()], extra)
}

/// [`proxied_port`] with the agent's arguments given whole.
pub(crate) fn proxied_port_with(
    sb: &Sandbox,
    key: &str,
    args: &[&str],
    extra: &str,
) -> ModelServer {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/api_agent.py");
    let args: String = args.iter().map(|a| format!(", \"{a}\"")).collect();
    example_repo(sb, |t| {
        // time_shift keeps no agent: one agent component here.
        let (head, _) = t.split_once("agent = true\n\n[agent]").unwrap();
        format!(
            "{head}\n[agent]\ncommand = [\"python3\", \"-B\", \"{}\"{args}]\napi = \"openai-chat\"\nmodel = \"gpt-5\"\ntimeout_s = 60\n{extra}\n",
            agent.display()
        )
    });
    ModelServer::start(
        sb.dir.path(),
        key,
        serde_json::json!({"scripts": [{
            "marker": "fvd parity-debug: tinyport / timestep_embed",
            "usage": {"input": 1000, "output": 50, "cache_read": 200, "cache_write": 0},
            "steps": [{"loop": {"bash": "true"}}],
        }]}),
    )
}

#[test]
fn a_component_budget_spans_attempts_and_the_proxy_ends_the_one_that_crosses_it() {
    let sb = Sandbox::new();
    let cap = REPLY_USD * 2.5;
    let key = "sk-fvdtest-e2e-0123456789abcdef0123456789";
    let server = proxied_port(
        &sb,
        key,
        2,
        &format!("max_attempts = 5\n\n[agent.budget]\nusd_per_component = {cap}"),
    );
    let out = fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .env("OPENAI_API_KEY", key)
        .env(
            "OPENAI_BASE_URL",
            format!("http://127.0.0.1:{}/v1", server.port),
        )
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains(key), "the key is in fvd's output");

    let status = sb.local_status("tinyport").unwrap();
    let c = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "timestep_embed")
        .unwrap()
        .clone();
    assert_eq!(c["status"], "blocked", "{c:#}\n{text}");
    let reason = c["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "agent budget spent: {:.4} of {cap} USD for the component",
            REPLY_USD * 3.0
        )),
        "{reason}"
    );

    let l = fvd()
        .args(["attempts", "tinyport", "timestep_embed", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let l: serde_json::Value = serde_json::from_slice(&l.stdout).unwrap();
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{l:#}");
    let (first, second) = (&attempts[0]["usage"], &attempts[1]["usage"]);
    assert_eq!(
        (first["preset"].as_str(), first["source"].as_str()),
        (Some(""), Some("proxy"))
    );
    assert_eq!(first["outcome"], "completed", "{first:#}");
    assert_eq!(first["requests"], 2, "{first:#}");
    // The second got what was left (half a reply) and was ended after the
    // reply that crossed it.
    assert_eq!(second["outcome"], "budget_cap", "{second:#}");
    assert_eq!(second["requests"], 1, "{second:#}");
    assert!(
        attempts[1]["signal"] == 9 || attempts[1]["exit_code"] == 3,
        "{:#}",
        attempts[1]
    );
    // The ledger's tokens are the server's.
    let served = server.replies();
    assert_eq!(served.len(), 3, "{served:?}");
    let tokens: u64 = attempts
        .iter()
        .map(|a| {
            let u = &a["usage"];
            [
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_tokens",
            ]
            .iter()
            .map(|k| u[k].as_u64().unwrap())
            .sum::<u64>()
        })
        .sum();
    assert_eq!(tokens, 3 * 1250);
    assert_eq!(status["agent_spend"]["attempts"], 2, "{status:#}");
    let usd = status["agent_spend"]["cost_usd"].as_f64().unwrap();
    assert!((usd - 3.0 * REPLY_USD).abs() < 1e-9, "{usd}");

    // The agent held the attempt's token, never the key.
    let env: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            sb.repo()
                .join(".fvd/agent/tinyport/timestep_embed/attempt-1/prompt.md.env.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(env["OPENAI_API_KEY"].as_str().unwrap().starts_with("fvd-"));
    assert_eq!(env["OPENAI_API_KEY"], env["FVD_MODEL_TOKEN"]);
    assert!(!env.to_string().contains(key));

    // The dashboard shows the spend per port, per component and per
    // attempt, with how each attempt ended.
    let mut d = fvd()
        .args(["dashboard", "--listen", "127.0.0.1:0", "--repo"])
        .arg(sb.repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(d.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _d = Kill(d);
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .unwrap()
        .to_string();
    let (code, body) = http(&addr, "GET", "/api/ports/tinyport", "");
    assert!(code.contains("200"), "{code}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["agent_spend"]["attempts"], 2, "{v:#}");
    let (_, page) = http(
        &addr,
        "GET",
        "/ports/tinyport/components/timestep_embed",
        "",
    );
    assert!(
        page.contains("budget_cap: budget spent") && page.contains("$0.0018"),
        "{page}"
    );
    for f in ["state.db", "state.db-wal"] {
        let db = std::fs::read(sb.repo().join(".fvd").join(f)).unwrap_or_default();
        assert!(!db.windows(key.len()).any(|w| w == key.as_bytes()), "{f}");
    }
}

/// An agent attempt on a worker outlives a `kill -9` of the orchestrator
/// (issue #38): the restarted orchestrator adopts the attempt's fleet job
/// (same job, same lease), starts its model proxy and tools again admitting
/// the tokens the agent already holds (their digests were stored, never
/// their values), and the agent goes on: one agent process, one try, every
/// request metered once, every tool call answered.
#[test]
fn an_agent_attempt_on_a_worker_goes_on_through_an_orchestrator_restart() {
    let mut sb = Sandbox::new();
    let key = "sk-fvdtest-adopt-0123456789abcdef0123456789";
    let server = proxied_port_with(
        &sb,
        key,
        &[
            "--requests",
            "3",
            "--pause",
            "3",
            "--retry-for",
            "60",
            "--tools",
        ],
        "max_attempts = 1",
    );
    let upstream = format!("http://127.0.0.1:{}/v1", server.port);
    let env = [
        ("OPENAI_API_KEY", key),
        ("OPENAI_BASE_URL", upstream.as_str()),
    ];
    let addr = crate::chaos::free_addr();
    let db = sb.dir.path().join("orchestrator.db");
    let allow = ["--allow-agent-commands"];
    sb.serve_db(&addr, &db, &allow, &env);
    sb.worker("w1", 2);
    let submit = sb.submit_remote("tinyport", &[]);
    assert!(
        submit.status.success(),
        "{}",
        String::from_utf8_lossy(&submit.stderr)
    );

    // The first request answered, metered and in the store, and the first
    // tool call recorded: the orchestrator is killed while the agent
    // pauses, and started again on the same address and database.
    let metered = || {
        crate::chaos::query(
            &db,
            "SELECT (SELECT COALESCE(SUM(requests), 0) FROM agent_usage), (SELECT COUNT(*) FROM attempt_tool_calls)",
        )
        .first()
        .map(|r| (r[0].as_u64().unwrap_or(0), r[1].as_u64().unwrap_or(0)))
        .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while metered() != (1, 1) {
        assert!(
            Instant::now() < deadline,
            "the first request was never metered: {:?}\n{}",
            metered(),
            sb.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sb.kill_orchestrator();
    sb.serve_db(&addr, &db, &allow, &env);

    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = sb.remote_status("tinyport")
            && s["state"] != "running"
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the port never ended\n{}",
            sb.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = sb.orchestrator_log();
    assert!(
        log.contains("adopted a run in flight") && log.contains("/agent-1-"),
        "the attempt's fleet job was not adopted:\n{log}"
    );
    assert!(!sb.logs().contains(key), "the key is in a log");

    // One agent: the server saw one conversation of three turns, each
    // answered once.
    let served = server.replies();
    let turns: Vec<u64> = served.iter().map(|r| r["turn"].as_u64().unwrap()).collect();
    assert_eq!(turns, [0, 1, 2], "{served:?}");

    let url = sb.url.clone().unwrap();
    let l = crate::agent::ledger_of(&sb, "timestep_embed", Some(&url));
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{l:#}");
    let a = &attempts[0];
    assert_eq!(
        (a["tries"].as_u64(), a["state"].as_str()),
        (Some(1), Some("recorded")),
        "{a:#}"
    );
    assert_eq!(a["worker_id"], "w1", "{a:#}");
    assert_eq!(a["exit_code"], 0, "{a:#}");
    // Metered once each, across both processes: the usage is the server's.
    assert_eq!(a["usage"]["requests"], 3, "{a:#}");
    let usd = a["usage"]["cost_usd"].as_f64().unwrap();
    assert!((usd - 3.0 * REPLY_USD).abs() < 1e-9, "{usd}");
    // Every tool call answered, two of them by the restarted tools.
    let calls = crate::chaos::query(
        &db,
        "SELECT tool, outcome FROM attempt_tool_calls ORDER BY seq",
    );
    assert_eq!(calls.len(), 3, "{calls:?}");
    for c in &calls {
        assert_eq!(c[0], "attempts", "{calls:?}");
        assert_ne!(c[1], "error", "{calls:?}");
    }
    // The key never reached the store; the tokens' digests did.
    for f in ["orchestrator.db", "orchestrator.db-wal"] {
        let bytes = std::fs::read(sb.dir.path().join(f)).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(key),
            "the key is in {f}"
        );
    }
    let digests = crate::chaos::query(
        &db,
        "SELECT length(proxy_token_sha256), length(tools_token_sha256) FROM agent_attempts",
    );
    assert_eq!(digests, [[serde_json::json!(64), serde_json::json!(64)]]);
    let c = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "timestep_embed")
        .unwrap();
    assert_eq!(c["status"], "blocked", "{c:#}");
}
