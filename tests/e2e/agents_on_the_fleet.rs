//! Agents on the fleet (issue #32): `fvd orchestrator serve` (agents on the
//! fleet by default) and two workers, each in a mount namespace where a
//! tmpfs hides the port's repository, as the code-by-commit tests do. The
//! example's agent is a program only the workers' PATH has. Each attempt
//! runs on a worker in a checkout of its own and comes back as a commit;
//! the example's agent components reach the verdicts embedded mode
//! reaches; each attempt records the worker it ran on; and no agent
//! process ever descends from the orchestrator. Agents that work through
//! `fvd mcp` get fvd's verdict of their work tree from a worker
//! (`run_parity`, agents on a worker or on the host) and ask their question
//! as a tool call (`ask_user`).
//!
//! CI runs as root; without `unshare` and a tmpfs mount this test fails, it
//! never skips.

use std::collections::BTreeSet;
use std::path::Path;

use crate::agent::{example_repo, git};
use crate::bycommit::{
    answer_first_option, assert_hidden, embedded_verdicts, outcome, plain_log,
    spawn_hidden_worker_with, verdicts,
};
use crate::support::{Sandbox, fvd};

/// The example's replay agent under a name of its own. It first writes its
/// ancestry (one pid per line, itself first) into `ancestry`, then runs
/// the example's agent from the attempt's checkout.
fn agent_program(bin: &Path, ancestry: &Path) {
    std::fs::create_dir_all(bin).unwrap();
    std::fs::create_dir_all(ancestry).unwrap();
    let script = format!(
        r#"#!/usr/bin/env python3
import os, sys, time
pid, chain = os.getpid(), []
while pid > 1:
    chain.append(pid)
    with open(f"/proc/{{pid}}/status") as f:
        pid = int(next(l for l in f if l.startswith("PPid:")).split()[1])
with open(os.path.join({dir:?}, f"{{time.time_ns()}}-{{os.getpid()}}"), "w") as f:
    f.write("\n".join(map(str, chain)) + "\n")
os.execvp("python3", ["python3", "-B", "tools/replay_agent.py", *sys.argv[1:]])
"#,
        dir = ancestry.display().to_string()
    );
    let path = bin.join("fvd-replay-agent");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `(name, status)` of every component, sorted.
fn statuses(status: &serde_json::Value) -> Vec<(String, String)> {
    verdicts(status)
        .into_iter()
        .map(|(name, status, _, _)| (name, status))
        .collect()
}

#[test]
fn agent_attempts_run_on_workers_that_cannot_see_the_repository() {
    // Embedded mode on one copy of the example port: the reference.
    let want: Vec<(String, String)> = embedded_verdicts()
        .into_iter()
        .map(|(name, status, _, _)| (name, status))
        .collect();

    // The same port on two workers that cannot see the repository, with
    // an agent program only they have.
    let mut sb = Sandbox::with_repo_in("hidden/repo");
    let base = example_repo(&sb, |t| {
        t.replace(
            r#"command = ["python3", "-B", "tools/replay_agent.py","#,
            r#"command = ["fvd-replay-agent","#,
        )
    });
    let spec =
        std::fs::read_to_string(sb.repo().join("tests/local_tests/tinyport/port.toml")).unwrap();
    assert!(spec.contains(r#"command = ["fvd-replay-agent","#), "{spec}");
    let hidden = sb.dir.path().join("hidden");
    assert_hidden(&hidden, sb.repo());
    let bin = sb.dir.path().join("agent-bin");
    let ancestry = sb.dir.path().join("ancestry");
    agent_program(&bin, &ancestry);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The orchestrator's PATH has no such program.
    assert!(
        !std::env::var("PATH")
            .unwrap_or_default()
            .contains("agent-bin")
    );
    let url = sb.serve_with(&["--allow-agent-commands"]);
    for id in ["w1", "w2"] {
        spawn_hidden_worker_with(&mut sb, id, &[], &[("PATH", path.clone())]);
    }
    let out = sb.submit_remote("tinyport", &["--wait"]);
    let text = format!(
        "{}{}\nlogs:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );
    assert_eq!(out.status.code(), Some(3), "{text}");
    answer_first_option(&sb, &url);
    let got = statuses(&sb.remote_status("tinyport").unwrap());
    assert_eq!(got, want, "agents on the fleet vs embedded");
    for name in ["timestep_embed", "time_shift"] {
        assert!(
            got.contains(&(name.to_string(), "non_skip_pass".to_string())),
            "{got:?}"
        );
    }

    // Each attempt names the worker it ran on, and its commit is on the
    // component's branch, made from the attempt before it.
    let mut ran_on = BTreeSet::new();
    let mut agent_runs = 0;
    for component in ["timestep_embed", "time_shift"] {
        let (code, out) = outcome(fvd().args([
            "attempts",
            "tinyport",
            component,
            "--json",
            "--orchestrator",
            &url,
        ]));
        assert_eq!(code, Some(0), "{out}");
        let json = out
            .split_once("stdout:\n")
            .and_then(|(_, r)| r.split_once("\nstderr:"))
            .map(|(j, _)| j)
            .unwrap();
        let l: serde_json::Value = serde_json::from_str(json).unwrap();
        let attempts = l["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{l}");
        agent_runs += attempts.len();
        for a in attempts {
            let w = a["worker_id"].as_str().unwrap_or_default();
            assert!(w == "w1" || w == "w2", "attempt ran on {w:?}: {a}");
            ran_on.insert(w.to_string());
            assert_eq!(a["state"], "recorded", "{a}");
        }
        let branch = git(
            sb.repo(),
            &[
                "log",
                "--format=%H",
                &format!("{base}..fvd/tinyport/{component}"),
            ],
        );
        let on_branch: Vec<&str> = branch.lines().collect();
        assert_eq!(on_branch.len(), 2, "{branch}");
        assert_eq!(
            attempts[1]["commit_sha"].as_str(),
            Some(on_branch[0]),
            "{l}"
        );
        assert_eq!(attempts[1]["head_before"], attempts[0]["commit_sha"]);
    }
    eprintln!("agents on the fleet: attempts ran on {ran_on:?}");

    // No agent process descends from the orchestrator; each descends from
    // a worker.
    let orchestrator = sb.orchestrator_pid().to_string();
    let workers = [sb.worker_pid("w1"), sb.worker_pid("w2")].map(|p| p.to_string());
    let mut chains = 0;
    for e in std::fs::read_dir(&ancestry).unwrap().flatten() {
        let chain = std::fs::read_to_string(e.path()).unwrap();
        let pids: Vec<&str> = chain.lines().collect();
        assert!(
            !pids.contains(&orchestrator.as_str()),
            "an agent ran under the orchestrator ({orchestrator}): {pids:?}"
        );
        assert!(
            workers.iter().any(|w| pids.contains(&w.as_str())),
            "an agent ran under no worker ({workers:?}): {pids:?}"
        );
        chains += 1;
    }
    assert_eq!(chains, agent_runs, "one agent process per attempt");

    // The workers removed each attempt's checkout once it ended.
    for id in ["w1", "w2"] {
        let log = plain_log(&sb.dir.path().join(format!("worker-{id}.log")));
        let attempts = sb.dir.path().join(format!("ws-{id}/code/attempts"));
        let left: Vec<_> = std::fs::read_dir(&attempts)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{id} kept {left:?}\n{log}");
    }
}

/// An agent that works through `fvd mcp` (a Python MCP client): it asks
/// `run_parity` of its untouched work tree, applies the example's two
/// recorded patches (the guess and the fix), asks again, reads the ledger, and hands back the recorded handoff.
/// Every reply goes to `log` (one JSON line per call).
fn mcp_agent(path: &Path, log: &Path) {
    let script = format!(
        r#"#!/usr/bin/env python3
import json, os, subprocess, sys
handoff = sys.argv[1]
log = open({log:?}, "a")
mcp = subprocess.Popen([os.environ["FVD_BIN"], "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
n = 0
def rpc(method, params=None, notify=False):
    global n
    msg = {{"jsonrpc": "2.0", "method": method}}
    if params is not None:
        msg["params"] = params
    if not notify:
        n += 1
        msg["id"] = n
    mcp.stdin.write(json.dumps(msg) + "\n")
    mcp.stdin.flush()
    if notify:
        return None
    reply = json.loads(mcp.stdout.readline())
    log.write(json.dumps({{"method": method, "params": params, "reply": reply}}) + "\n")
    log.flush()
    return reply
rpc("initialize", {{"protocolVersion": "2025-06-18", "capabilities": {{}}, "clientInfo": {{"name": "test", "version": "1"}}}})
rpc("notifications/initialized", notify=True)
rpc("tools/list")
rpc("tools/call", {{"name": "run_parity", "arguments": {{}}}})
prefix = subprocess.run(["git", "rev-parse", "--show-prefix"], capture_output=True, text=True).stdout.strip().rstrip("/")
for patch in ["0001", "0002"]:
    cmd = ["git", "apply"] + ([f"--directory={{prefix}}"] if prefix else []) + [f"tools/replay/timestep_embed/{{patch}}.patch"]
    subprocess.run(cmd, check=True)
rpc("tools/call", {{"name": "run_parity", "arguments": {{}}}})
rpc("tools/call", {{"name": "attempts", "arguments": {{}}}})
mcp.stdin.close()
mcp.wait()
open(handoff, "w").write(open("tools/replay/timestep_embed/0002.handoff").read())
"#,
        log = log.display().to_string()
    );
    std::fs::write(path, script).unwrap();
}

/// The replies `mcp_agent` logged, in order.
fn mcp_log(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn an_agent_on_a_worker_runs_the_parity_test_through_fvd_mcp() {
    parity_through_fvd_mcp("fleet");
}

/// The same agent on the orchestrator's host (`--agents host`): its
/// tools run the test on the fleet just the same.
#[test]
fn an_agent_on_the_host_runs_the_parity_test_on_a_worker_through_fvd_mcp() {
    parity_through_fvd_mcp("host");
}

fn parity_through_fvd_mcp(agents: &str) {
    let (sb, base, out) = port_with_agent(
        agents,
        |path| mcp_agent(path, &path.with_file_name("mcp.jsonl")),
        "{handoff_file}",
    );
    assert_eq!(out.0, Some(0), "{}", out.1);
    let log = sb.dir.path().join("mcp.jsonl");

    // What the agent got from its tools: the red verdict of its untouched
    // tree, the pass of its fixed one, and the ledger with its own attempt
    // running.
    let calls = mcp_log(&log);
    let methods: Vec<&str> = calls
        .iter()
        .map(|c| c["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        [
            "initialize",
            "tools/list",
            "tools/call",
            "tools/call",
            "tools/call"
        ],
        "{calls:#?}"
    );
    assert_eq!(calls[0]["reply"]["result"]["serverInfo"]["name"], "fvd");
    let listed: Vec<&str> = calls[1]["reply"]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "run_parity",
            "trace",
            "attempts",
            "ask_user",
            "compare_dumps"
        ]
    );
    let said = |i: usize| {
        let r = &calls[i]["reply"]["result"];
        assert_eq!(r["isError"], false, "{r}");
        r["content"][0]["text"].as_str().unwrap().to_string()
    };
    let red = said(2);
    assert!(red.starts_with("verdict: debug_red"), "{red}");
    assert!(red.contains("worker: w1"), "{red}");
    let green = said(3);
    assert!(green.starts_with("verdict: non_skip_pass"), "{green}");
    let ledger = said(4);
    assert!(ledger.contains("attempt 1 (fix, running)"), "{ledger}");

    // One attempt, fixed; fvd's own runs only (red, then its pass): the
    // agent's two runs are not the component's.
    let status = sb.remote_status("tinyport").unwrap();
    let got = verdicts(&status);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1, "non_skip_pass", "{got:?}");
    assert_eq!(got[0].2, 2, "fvd's runs of the component: {got:?}");
    let db = sb.dir.path().join("orchestrator.db");
    let rows = crate::chaos::query(
        &db,
        "SELECT attempt, seq, tool, outcome, detail, gpu_ms FROM attempt_tool_calls ORDER BY seq",
    );
    let tools: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[2].as_str().unwrap(), r[3].as_str().unwrap()))
        .collect();
    assert_eq!(
        tools,
        [
            ("run_parity", "ok"),
            ("run_parity", "ok"),
            ("attempts", "ok")
        ],
        "{rows:?}"
    );
    assert!(
        rows[0][4].as_str().unwrap().starts_with("debug_red"),
        "{rows:?}"
    );
    assert!(
        rows[1][4].as_str().unwrap().starts_with("non_skip_pass"),
        "{rows:?}"
    );
    let jobs = crate::chaos::query(
        &db,
        "SELECT COUNT(*) FROM jobs WHERE component = 'timestep_embed'",
    );
    assert_eq!(jobs[0][0], 2, "the agent's runs left no job rows");
    let branch = git(
        sb.repo(),
        &[
            "log",
            "--format=%H",
            &format!("{base}..fvd/tinyport/timestep_embed"),
        ],
    );
    assert_eq!(branch.lines().count(), 1, "{branch}");
}

/// An agent that asks its question through `fvd mcp`'s `ask_user` and
/// hands back nothing; given the answer in its next packet, it applies
/// the example's recorded patches and hands back the recorded handoff.
fn asking_agent(path: &Path) {
    let script = r#"#!/usr/bin/env python3
import json, os, subprocess, sys
prompt, handoff = sys.argv[1], sys.argv[2]
packet = open(prompt).read()
if "cosines first" in packet and "answer" in packet.lower():
    prefix = subprocess.run(["git", "rev-parse", "--show-prefix"], capture_output=True, text=True).stdout.strip().rstrip("/")
    for patch in ["0001", "0002"]:
        cmd = ["git", "apply"] + ([f"--directory={prefix}"] if prefix else []) + [f"tools/replay/timestep_embed/{patch}.patch"]
        subprocess.run(cmd, check=True)
    open(handoff, "w").write(open("tools/replay/timestep_embed/0002.handoff").read())
    sys.exit(0)
mcp = subprocess.Popen([os.environ["FVD_BIN"], "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def rpc(i, method, params):
    mcp.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n")
    mcp.stdin.flush()
    return json.loads(mcp.stdout.readline())
rpc(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})
r = rpc(2, "tools/call", {"name": "ask_user", "arguments": {
    "question": "Which layout does the port follow: cosines first, as the official model, or sines first?",
    "options": ["cosines first", "sines first"],
    "recommended_option": "cosines first",
    "decision_type": "ambiguity"}})
assert not r["result"]["isError"], r
mcp.stdin.close()
mcp.wait()
"#;
    std::fs::write(path, script).unwrap();
}

#[test]
fn an_agent_asks_its_question_through_fvd_mcp_and_gets_the_answer() {
    let (sb, _, out) = port_with_agent("fleet", asking_agent, r#"{prompt_file}", "{handoff_file}"#);
    let url = sb.url.clone().unwrap();
    // The question paused the port, as a handoff's escape hatch does.
    assert_eq!(out.0, Some(3), "{}", out.1);
    let status = sb.remote_status("tinyport").unwrap();
    let hatch = status["escapes"]
        .as_array()
        .and_then(|a| a.first())
        .cloned()
        .unwrap_or_default();
    assert_eq!(hatch["id"], "E001", "{status:#}");
    assert!(
        hatch["question"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Which layout"),
        "{status:#}"
    );
    let (code, out) = outcome(fvd().args([
        "answer",
        "tinyport",
        "E001",
        "--text",
        "cosines first, as the official model",
        "--wait",
        "--orchestrator",
        &url,
    ]));
    assert_eq!(code, Some(0), "{out}\n{}", sb.logs());
    let got = verdicts(&sb.remote_status("tinyport").unwrap());
    assert_eq!(got[0].1, "non_skip_pass", "{got:?}");
    let db = sb.dir.path().join("orchestrator.db");
    let rows = crate::chaos::query(
        &db,
        "SELECT attempt, tool, outcome FROM attempt_tool_calls ORDER BY attempt, seq",
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][1], "ask_user", "{rows:?}");
}

/// The red team's pack bomb (issue #38): an agent that leaves 20,000 files
/// of repetitive text, 195 MiB in all, which its worker commits into a pack
/// of about a MiB.
fn bomb_agent(path: &Path) {
    let script = r#"#!/usr/bin/env python3
import os
os.makedirs("bomb", exist_ok=True)
line = "all work and no play makes jack a dull boy\n"
for i in range(20000):
    with open(f"bomb/f{i:05}.txt", "w") as f:
        f.write((f"file {i}\n" + line * 250)[:10240])
"#;
    std::fs::write(path, script).unwrap();
}

/// The orchestrator's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    kb * 1024
}

#[test]
fn a_pack_bomb_from_an_agent_on_a_worker_is_refused_with_its_numbers() {
    let (sb, base, out) = port_with_agent("fleet", bomb_agent, "");
    let peak = peak_rss(sb.orchestrator_pid());
    let status = sb.remote_status("tinyport").unwrap();
    let got = verdicts(&status);
    let (_, state, _, reason) = &got[0];
    let refusal = "the attempt's commit unpacks to 195.3 MiB in 20000 new or changed files (largest 10.0 KiB: ";
    assert_eq!(state, "blocked", "{got:?}\n{}", out.1);
    assert!(
        reason.contains(refusal)
            && reason.contains(
                "over the limit of 128 MiB / 5000 files (--max-attempt-unpacked-mib, --max-attempt-files), after agent attempt 1"
            ),
        "{reason}\n{}",
        out.1
    );
    // Recorded as the attempt's outcome, at its base.
    let db = sb.dir.path().join("orchestrator.db");
    let rows = crate::chaos::query(
        &db,
        "SELECT attempt, state, commit_sha, diff_stat, worker_id FROM agent_attempts",
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][1], "recorded", "{rows:?}");
    assert_eq!(rows[0][2], base, "{rows:?}");
    assert!(
        rows[0][3].as_str().unwrap_or_default().contains(refusal),
        "{rows:?}"
    );
    assert_eq!(rows[0][4], "w1", "{rows:?}");
    // Nothing of it was checked out or kept.
    let branch = git(sb.repo(), &["rev-parse", "fvd/tinyport/timestep_embed"]);
    assert_eq!(branch.trim(), base);
    let worktree = sb.repo().join(".fvd/worktrees/tinyport/timestep_embed");
    let bombs: Vec<_> = walk(&worktree)
        .into_iter()
        .filter(|p| p.components().any(|c| c.as_os_str() == "bomb"))
        .collect();
    assert!(bombs.is_empty(), "{bombs:?}");
    eprintln!(
        "pack bomb: refused; the orchestrator's peak RSS {:.1} MB",
        peak as f64 / 1e6
    );
    assert!(
        peak < 100_000_000,
        "the orchestrator peaked at {:.1} MB",
        peak as f64 / 1e6
    );
}

/// Every path below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// The example port with `timestep_embed` alone, its agent the script
/// `write` makes (run as `python3 -B SCRIPT ARGS`, `args` the rest of the
/// argv's TOML), served with agents on `agents`, and one worker that
/// cannot see the repository: the sandbox, the base commit, and `submit
/// --wait`'s exit code and output (with the logs).
fn port_with_agent(
    agents: &str,
    write: impl FnOnce(&Path),
    args: &str,
) -> (Sandbox, String, (Option<i32>, String)) {
    let mut sb = Sandbox::with_repo_in("hidden/repo");
    let agent = sb.dir.path().join("agent.py");
    write(&agent);
    let agent_s = agent.display().to_string();
    let base = example_repo(&sb, |t| {
        crate::durability::keep_components(&t, &["timestep_embed"]).replace(
            r#"command = ["python3", "-B", "tools/replay_agent.py", "--patches", "tools/replay/{component}", "--attempt", "{attempt}", "--prompt", "{prompt_file}", "--handoff", "{handoff_file}", "--worktree", "{worktree}"]"#,
            &format!(r#"command = ["python3", "-B", "{agent_s}", "{args}"]"#),
        )
    });
    let hidden = sb.dir.path().join("hidden");
    assert_hidden(&hidden, sb.repo());
    sb.serve_with(&["--allow-agent-commands", "--agents", agents]);
    spawn_hidden_worker_with(&mut sb, "w1", &[], &[]);
    let out = sb.submit_remote("tinyport", &["--wait"]);
    let text = format!(
        "{}{}\nlogs:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );
    (sb, base, (out.status.code(), text))
}
