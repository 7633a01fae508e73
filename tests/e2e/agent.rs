//! The agent loop end to end (issue #5): the example port's planted-bug
//! component is driven by the replay agent, in its own git worktree, through
//! a wrong attempt and a fix to `non_skip_pass`; a budget of one attempt
//! blocks it with the last verdict as evidence.

use std::path::Path;
use std::process::Command;

use crate::port::copy_tree;
use crate::support::{Sandbox, components, fvd};

const COMPONENT: &str = "timestep_embed";
const BRANCH: &str = "fvd/tinyport/timestep_embed";

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=fvd-test",
            "-c",
            "user.email=fvd-test@localhost",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// A copy of `examples/tinyport` made into its own git repository, with
/// `edit` applied to its port.toml before the first commit.
fn example_repo(sb: &Sandbox, edit: impl Fn(String) -> String) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    copy_tree(&example, sb.repo());
    let spec = sb.repo().join("tests/local_tests/tinyport/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&spec, edit(text)).unwrap();
    git(sb.repo(), &["init", "-q", "-b", "main"]);
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "base"]);
    git(sb.repo(), &["rev-parse", "HEAD"])
}

fn submit(sb: &Sandbox) -> (Option<i32>, String) {
    let out = fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn ledger(sb: &Sandbox) -> serde_json::Value {
    let out = fvd()
        .args(["attempts", "tinyport", COMPONENT, "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn component(status: &serde_json::Value, name: &str) -> serde_json::Value {
    status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("component {name} missing from {status}"))
        .clone()
}

#[test]
fn replay_agent_fixes_the_planted_bug_on_the_second_attempt() {
    let sb = Sandbox::new();
    let base = example_repo(&sb, |t| t);
    let (code, out) = submit(&sb);
    // vae and decoder_norm have no agent and stay blocked: the port exits 1.
    assert_eq!(code, Some(1), "{out}");

    let status = sb.local_status("tinyport").expect("status after the port");
    let c = component(&status, COMPONENT);
    assert_eq!(c["status"], "non_skip_pass", "{status}");
    // One red run, then one run per attempt.
    assert_eq!(c["runs"], 3, "{status}");
    let rows = components(&status);
    assert!(
        rows.iter()
            .any(|r| r.0 == "decoder_norm" && r.1 == "blocked"),
        "components without an agent keep red -> blocked: {rows:?}"
    );

    // The ledger: two attempts, the wrong guess and the fix, with their
    // commits, diffs, agent exits and the verdicts around them.
    let l = ledger(&sb);
    assert_eq!(l["worktree"]["branch"], BRANCH, "{l}");
    assert_eq!(l["worktree"]["base_commit"], base.as_str(), "{l}");
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{l}");
    let (first, second) = (&attempts[0], &attempts[1]);
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["verdict_before"], "debug_red", "{first}");
    assert_eq!(first["verdict_after"], "debug_red", "{first}");
    assert!(
        first["diff"].as_str().unwrap().contains("np.float64"),
        "{first}"
    );
    assert!(
        first["diff_stat"]
            .as_str()
            .unwrap()
            .contains("fastvideo/layers/timestep.py"),
        "{first}"
    );
    assert_eq!(first["exit_code"], 0, "{first}");
    assert_eq!(first["handoff_status"], "valid", "{first}");
    assert!(
        first["handoff_summary"]
            .as_str()
            .unwrap()
            .contains("parity_status=debug_red"),
        "{first}"
    );
    assert_eq!(second["verdict_before"], "debug_red", "{second}");
    assert_eq!(second["verdict_after"], "non_skip_pass", "{second}");
    assert!(
        second["diff"]
            .as_str()
            .unwrap()
            .contains("+    return np.concatenate([np.cos(args), np.sin(args)]"),
        "{second}"
    );
    assert_eq!(first["job_after"], second["job_before"], "{l}");

    // The branch holds both attempts on top of the base commit, with the
    // ledger's commits.
    let log = git(sb.repo(), &["log", "--format=%H %s", BRANCH]);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 3, "{log}");
    assert_eq!(
        lines[0],
        format!(
            "{} fvd: timestep_embed attempt 2",
            second["commit_sha"].as_str().unwrap()
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "{} fvd: timestep_embed attempt 1",
            first["commit_sha"].as_str().unwrap()
        )
    );
    assert_eq!(lines[2], format!("{base} base"));

    // The runs tested the worktree: the port's own checkout still holds the
    // bug, and shows no worktree (.fvd/ ignores itself); only the
    // PORT_STATUS.md fvd writes at the end changed there.
    let port_code =
        std::fs::read_to_string(sb.repo().join("fastvideo/layers/timestep.py")).unwrap();
    assert!(
        port_code.contains("[np.sin(args), np.cos(args)]"),
        "{port_code}"
    );
    assert_eq!(
        git(sb.repo(), &["status", "--porcelain"]),
        " M tests/local_tests/tinyport/PORT_STATUS.md"
    );

    // The second packet carried the contract, the last verdict and the
    // ledger of the first attempt.
    let prompt = std::fs::read_to_string(
        sb.repo()
            .join(".fvd/agent/tinyport/timestep_embed/attempt-2/prompt.md"),
    )
    .unwrap();
    assert!(prompt.contains("component_context:"), "{prompt}");
    assert!(prompt.contains("mode: parity-debug"), "{prompt}");
    assert!(prompt.contains("**debug_red**"), "{prompt}");
    assert!(prompt.contains("- attempt 1: commit"), "{prompt}");
    assert!(prompt.contains("A skip is not a pass"), "{prompt}");

    let human = fvd()
        .args(["attempts", "tinyport", COMPONENT, "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("attempt 2") && human.contains("debug_red -> non_skip_pass"),
        "{human}"
    );
}

#[test]
fn a_budget_of_one_attempt_blocks_with_the_last_verdict() {
    let sb = Sandbox::new();
    example_repo(&sb, |t| {
        assert!(t.contains("max_attempts = 3"), "{t}");
        t.replace("max_attempts = 3", "max_attempts = 1")
    });
    let (code, out) = submit(&sb);
    assert_eq!(code, Some(1), "{out}");

    let status = sb.local_status("tinyport").expect("status after the port");
    let c = component(&status, COMPONENT);
    assert_eq!(c["status"], "blocked", "{status}");
    assert_eq!(c["runs"], 2, "{status}");
    let reason = c["reason"].as_str().unwrap();
    assert!(reason.starts_with("debug_red: "), "{reason}");
    assert!(reason.contains("AssertionError"), "{reason}");
    assert!(
        reason.contains("agent budget spent: 1 of 1 attempts"),
        "{reason}"
    );

    let l = ledger(&sb);
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{l}");
    assert_eq!(attempts[0]["verdict_after"], "debug_red", "{l}");
    let log = git(sb.repo(), &["log", "--format=%s", BRANCH]);
    assert_eq!(log, "fvd: timestep_embed attempt 1\nbase");
}
