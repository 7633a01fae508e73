//! Agents on the fleet (issue #32): `fvd orchestrator serve` (agents on the
//! fleet by default) and two workers, each in a mount namespace where a
//! tmpfs hides the port's repository, as the code-by-commit tests do. The
//! example's agent is a program only the workers' PATH has. Each attempt
//! runs on a worker in a checkout of its own and comes back as a commit;
//! the example's agent components reach the verdicts embedded mode
//! reaches; each attempt records the worker it ran on; and no agent
//! process ever descends from the orchestrator.
//!
//! CI runs as root; without `unshare` and a tmpfs mount this test fails, it
//! never skips.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::agent::{example_repo, git};
use crate::bycommit::{assert_hidden, plain_log, spawn_hidden_worker_with, verdicts};
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

fn outcome(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.output().unwrap();
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
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
    let embedded = Sandbox::new();
    example_repo(&embedded, |t| t);
    let (code, out) = outcome(
        fvd()
            .args(["submit", "--family", "tinyport", "--wait", "--repo"])
            .arg(embedded.repo()),
    );
    assert_eq!(code, Some(3), "{out}");
    let (code, out) = outcome(
        fvd()
            .args(["answer", "tinyport", "E001", "--option", "1", "--repo"])
            .arg(embedded.repo()),
    );
    assert_eq!(code, Some(1), "{out}");
    let want = statuses(&embedded.local_status("tinyport").unwrap());

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
    let (code, out) = outcome(fvd().args([
        "answer",
        "tinyport",
        "E001",
        "--option",
        "1",
        "--wait",
        "--orchestrator",
        &url,
    ]));
    assert_eq!(code, Some(1), "{out}\n{}", sb.logs());
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
