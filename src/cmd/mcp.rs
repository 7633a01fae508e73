//! `fvd mcp`: fvd as a coding agent's tools (issue #32), a stdio MCP server
//! (JSON-RPC 2.0, one message per line) that the agent presets configure
//! for every attempt. It is scoped to one attempt by its environment:
//! `FVD_TOOLS_ADDR` and `FVD_TOOLS_TOKEN` (the attempt's tools on the
//! orchestrator, through the worker's tunnel on a fleet) and
//! `FVD_ATTEMPT_BASE` (the commit the attempt started from). It runs where
//! the agent runs, in the agent's work tree.
//!
//! Tools:
//! - `run_parity`: snapshots the work tree as a commit (a private index;
//!   the agent's HEAD, index and files are left as they are), sends its
//!   objects as a pack thin against the base, and returns fvd's verdict of
//!   the component's parity test run on the fleet at that commit;
//! - `trace`: the component's latest drill-down report;
//! - `attempts`: the ledger;
//! - `ask_user`: the escape hatch as a tool call (one question an attempt);
//! - `compare_dumps`: two dump files or folders compared here, where they
//!   are, by fvd's comparator (recorded on the attempt like the others).

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use clap::Args;
use serde_json::{Value, json};

use super::exit::Exit;

#[derive(Debug, Args)]
pub struct McpArgs {}

/// The MCP versions this server speaks; the newest when the client asks
/// for another.
const VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

/// Where the attempt's tools are.
struct Scope {
    addr: String,
    token: String,
    base: String,
}

pub fn run(_: McpArgs) -> anyhow::Result<Exit> {
    let var = |name: &str| {
        std::env::var(name).with_context(|| {
            format!(
                "fvd mcp serves one agent attempt: {name} is not set (the agent presets set it)"
            )
        })
    };
    let token = match std::env::var(TOKEN_VAR) {
        Ok(t) => t,
        Err(_) => ancestor_var(TOKEN_VAR).with_context(|| {
            format!(
                "fvd mcp serves one agent attempt: {TOKEN_VAR} is in neither its environment nor its agent's (fvd sets it in the agent's)"
            )
        })?,
    };
    let scope = Scope {
        addr: var("FVD_TOOLS_ADDR")?,
        token,
        base: var("FVD_ATTEMPT_BASE")?,
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line.context("cannot read stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Err(e) => Some(json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": -32700, "message": format!("parse error: {e}")}})),
            Ok(msg) => answer(&scope, &msg),
        };
        if let Some(r) = reply {
            writeln!(out, "{r}").context("cannot write stdout")?;
            out.flush().context("cannot write stdout")?;
        }
    }
    Ok(Exit::Success)
}

/// The attempt's tools token: only in the agent's environment (issue #38),
/// never in the MCP configuration, which is an argument or a file other
/// processes can read.
const TOKEN_VAR: &str = "FVD_TOOLS_TOKEN";

/// `name` in the environment of the nearest ancestor that has it: the agent
/// whose CLI started this server (a CLI may start it with its own
/// environment only in part). Readable because the agent and its children
/// share a uid and a jail; a process of another job cannot read it.
fn ancestor_var(name: &str) -> Option<String> {
    let mut pid = std::os::unix::process::parent_id();
    for _ in 0..32 {
        if pid <= 1 {
            return None;
        }
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            let key = format!("{name}=");
            if let Some(v) = env
                .split(|b| *b == 0)
                .find_map(|kv| kv.strip_prefix(key.as_bytes()))
            {
                return String::from_utf8(v.to_vec()).ok();
            }
        }
        // The parent: the field after the command, which may hold spaces
        // or parentheses itself.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 1..];
        pid = after.split_whitespace().nth(1)?.parse().ok()?;
    }
    None
}

/// The reply to one message; `None` for a notification.
fn answer(scope: &Scope, msg: &Value) -> Option<Value> {
    let id = msg.get("id")?.clone();
    let result = match msg["method"].as_str().unwrap_or_default() {
        "initialize" => {
            let asked = msg["params"]["protocolVersion"]
                .as_str()
                .unwrap_or_default();
            let version = VERSIONS
                .iter()
                .find(|v| **v == asked)
                .unwrap_or(&VERSIONS[0]);
            Ok(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fvd", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "fvd's tools for this agent attempt: run the component's parity test on the fleet at your work tree (run_parity), read the drill-down report (trace) and the ledger (attempts), compare two dumps (compare_dumps), ask a person a decision (ask_user, then end your turn). fvd still confirms a pass with its own run.",
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => {
            let name = msg["params"]["name"].as_str().unwrap_or_default();
            let args = msg["params"]["arguments"].clone();
            let (text, is_error) = match call(scope, name, &args) {
                Ok(r) => r,
                Err(e) => (format!("{e:#}"), true),
            };
            Ok(json!({"content": [{"type": "text", "text": text}], "isError": is_error}))
        }
        other => Err(json!({"code": -32601, "message": format!("no method {other:?}")})),
    };
    Some(match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e}),
    })
}

fn tools() -> Value {
    let none = json!({"type": "object", "properties": {}, "additionalProperties": false});
    json!([
        {"name": "run_parity",
         "description": "Run the component's parity test on the fleet at your current work tree (snapshotted as a commit; your files and git state are left alone) and return fvd's verdict, the failing assertion and the output's tail. Counts against the component's GPU-second budget; it is never the component's verdict.",
         "inputSchema": none},
        {"name": "trace",
         "description": "The component's latest drill-down report: the first divergent layer or module between the port and the official model.",
         "inputSchema": none},
        {"name": "attempts",
         "description": "The ledger of this component's agent attempts: each attempt's verdicts before and after, its change and its handoff.",
         "inputSchema": none},
        {"name": "ask_user",
         "description": "Ask a person a decision you cannot make from the code and the official model (the escape hatch). The question becomes this attempt's escape hatch: end your turn after asking; the component waits for the answer, and your next attempt's packet carries it. One question per attempt.",
         "inputSchema": {"type": "object",
                         "properties": {
                             "question": {"type": "string"},
                             "options": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
                             "recommended_option": {"type": "string", "description": "one of the options"},
                             "decision_type": {"type": "string", "enum": ["scope", "dependency", "auth", "cost", "destructive", "ambiguity", "blocker"]},
                             "safe_default": {"type": "string", "description": "an option safe to take without an answer, or none"}},
                         "required": ["question", "options"], "additionalProperties": false}},
        {"name": "compare_dumps",
         "description": "Compare two tensor dumps (files or folders, paths relative to your work tree) with fvd's comparator and return its findings.",
         "inputSchema": {"type": "object",
                         "properties": {"reference": {"type": "string"}, "port": {"type": "string"}},
                         "required": ["reference", "port"], "additionalProperties": false}},
    ])
}

/// Runs one tool: its text and whether it is an error.
fn call(scope: &Scope, name: &str, args: &Value) -> anyhow::Result<(String, bool)> {
    match name {
        "run_parity" => {
            let (commit, pack) = snapshot(&scope.base)?;
            ask(scope, "run_parity", &json!({"commit": commit}), &pack)
        }
        "trace" | "attempts" => ask(scope, name, &json!({}), &[]),
        "ask_user" => ask(scope, name, args, &[]),
        "compare_dumps" => {
            let started = Instant::now();
            let (text, is_error) = compare_dumps(args);
            let detail = text.lines().next().unwrap_or_default().to_string();
            // Recorded on the attempt like the tools served there.
            let _ = ask(
                scope,
                "record",
                &json!({"tool": name, "arguments": args, "detail": detail,
                        "ms": started.elapsed().as_millis() as u64}),
                &[],
            );
            Ok((text, is_error))
        }
        other => Ok((format!("no tool {other:?}"), true)),
    }
}

fn compare_dumps(args: &Value) -> (String, bool) {
    let (Some(a), Some(b)) = (args["reference"].as_str(), args["port"].as_str()) else {
        return (
            "compare_dumps needs `reference` and `port` paths".into(),
            true,
        );
    };
    let opts = fvd_trace::dumps::DumpOptions::default();
    match fvd_trace::dumps::compare_dumps(Path::new(a), Path::new(b), &opts) {
        Ok(r) => (r.render_text(), false),
        Err(e) => (format!("cannot compare {a} and {b}: {e}"), true),
    }
}

/// One request to the attempt's tools, with `pack` after it.
fn ask(scope: &Scope, tool: &str, args: &Value, pack: &[u8]) -> anyhow::Result<(String, bool)> {
    let mut sock = std::net::TcpStream::connect(&scope.addr)
        .with_context(|| format!("cannot reach the attempt's tools at {}", scope.addr))?;
    let req =
        json!({"token": scope.token, "tool": tool, "arguments": args, "pack_len": pack.len()});
    let mut line = req.to_string();
    line.push('\n');
    sock.write_all(line.as_bytes())?;
    sock.write_all(pack)?;
    sock.flush()?;
    let mut reply = String::new();
    sock.read_to_string(&mut reply)
        .context("the attempt's tools closed the connection")?;
    let v: Value = serde_json::from_str(reply.trim())
        .with_context(|| format!("the attempt's tools answered {reply:?}"))?;
    Ok((
        v["text"].as_str().unwrap_or_default().to_string(),
        v["is_error"].as_bool().unwrap_or(true),
    ))
}

fn git(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
    stdin: Option<&[u8]>,
) -> anyhow::Result<Vec<u8>> {
    let mut cmd = fvd_git::blocking_command(dir);
    cmd.args([
        "-c",
        "user.name=fvd agent",
        "-c",
        "user.email=fvd-agent@localhost",
    ])
    .args(args)
    .stdin(if stdin.is_some() {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run git {}", args[0]))?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes)?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        anyhow::bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

fn text(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).trim().to_string()
}

/// The work tree as a commit on top of HEAD, made with a private index so
/// the agent's own index, HEAD and files stay as they are; and the pack of
/// what it adds to `base`.
fn snapshot(base: &str) -> anyhow::Result<(String, Vec<u8>)> {
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let top = PathBuf::from(text(git(
        &cwd,
        &["rev-parse", "--show-toplevel"],
        &[],
        None,
    )?));
    // A private index and a private object folder (the repository's
    // objects read through it as alternates): the agent's index, HEAD and
    // files stay as they are, and nothing is written to the repository,
    // which a jailed agent sees read-only (issue #38).
    let common = PathBuf::from(text(git(
        &top,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        &[],
        None,
    )?));
    let index = tempfile::NamedTempFile::new().context("cannot make a private git index")?;
    let objects = tempfile::tempdir().context("cannot make a private git object folder")?;
    let alternates = common.join("objects");
    let env = [
        ("GIT_INDEX_FILE", index.path()),
        ("GIT_OBJECT_DIRECTORY", objects.path()),
        ("GIT_ALTERNATE_OBJECT_DIRECTORIES", alternates.as_path()),
    ];
    git(&top, &["read-tree", "HEAD"], &env, None)?;
    git(&top, &["add", "-A"], &env, None)?;
    let tree = text(git(&top, &["write-tree"], &env, None)?);
    let head = text(git(&top, &["rev-parse", "HEAD"], &env, None)?);
    let commit = text(git(
        &top,
        &[
            "commit-tree",
            &tree,
            "-p",
            &head,
            "-m",
            "fvd: run_parity snapshot",
        ],
        &env,
        None,
    )?);
    let pack = git(
        &top,
        &["pack-objects", "--revs", "--thin", "--stdout", "-q"],
        &env,
        Some(format!("{commit}\n^{base}\n").as_bytes()),
    )?;
    Ok((commit, pack))
}
