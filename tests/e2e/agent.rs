//! The agent loop end to end (issue #5): the example port's planted-bug
//! component is driven by the replay agent, in its own git worktree, through
//! a wrong attempt and a fix to `non_skip_pass`; a budget of one attempt
//! blocks it with the last verdict as evidence; the escape-hatch component
//! parks in `ask_user` until `fvd answer`; the cleanup gate sends a dirty
//! pass back to the agent; `confirm_runs` catches a flaky pass; a conversion
//! retry request reopens P5; and a `kill -9` of the orchestrator in the
//! middle of an agent attempt neither loses nor duplicates a ledger row.

use std::path::Path;
use std::process::Command;

use crate::port::copy_tree;
use crate::support::{Sandbox, components, fvd};

const COMPONENT: &str = "timestep_embed";
const BRANCH: &str = "fvd/tinyport/timestep_embed";

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
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
pub(crate) fn example_repo(sb: &Sandbox, edit: impl Fn(String) -> String) -> String {
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

/// Runs `cmd`; its exit code and its stdout and stderr, labelled.
fn outcome(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.output().unwrap();
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn submit(sb: &Sandbox) -> (Option<i32>, String) {
    outcome(
        fvd()
            .args(["submit", "--family", "tinyport", "--wait", "--repo"])
            .arg(sb.repo()),
    )
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

pub(crate) fn component(status: &serde_json::Value, name: &str) -> serde_json::Value {
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
    // time_shift's agent asks a question: the port pauses (exit 3) once
    // everything else is final.
    assert_eq!(code, Some(3), "{out}");

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
    assert!(out.contains("E001 time_shift asks (ambiguity)"), "{out}");

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
    assert_eq!(code, Some(3), "{out}");

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

    // --rerun starts the budget over; the ledger keeps attempt 1 as history
    // and the agent's next attempt (the recorded fix) goes on from it.
    let (code, out) = outcome(
        fvd()
            .args([
                "submit", "--family", "tinyport", "--wait", "--rerun", "--repo",
            ])
            .arg(sb.repo()),
    );
    // time_shift's replay agent is at its recorded attempt 2, which needs
    // an answer its packet no longer has (E001 was withdrawn): it refuses,
    // and with its one attempt spent the component is blocked.
    assert_eq!(code, Some(1), "{out}");
    let c = component(&sb.local_status("tinyport").unwrap(), COMPONENT);
    assert_eq!(c["status"], "non_skip_pass", "{c}");
    let l = ledger(&sb);
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{l}");
    assert_eq!(attempts[1]["verdict_after"], "non_skip_pass", "{l}");
    // The old run's question is withdrawn, not left open.
    let status = sb.local_status("tinyport").unwrap();
    let escapes = status["escapes"].as_array().unwrap();
    assert_eq!(escapes.len(), 1, "{status}");
    assert_eq!(escapes[0]["status"], "withdrawn", "{status}");
    let t = component(&status, "time_shift");
    assert!(
        t["reason"]
            .as_str()
            .unwrap()
            .contains("agent budget spent: 1 of 1 attempts"),
        "{t}"
    );
}

/// A patch of `path` (relative to the port folder) from `old` to `new`, one
/// hunk over the whole file; both must have the same number of lines.
fn whole_file_patch(path: &str, old: &str, new: &str) -> String {
    let (o, n): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    assert_eq!(o.len(), n.len(), "same line count");
    let mut p = format!(
        "diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,{len} +1,{len} @@\n",
        len = o.len()
    );
    for (a, b) in o.iter().zip(&n) {
        if a == b {
            p.push_str(&format!(" {a}\n"));
        } else {
            p.push_str(&format!("-{a}\n+{b}\n"));
        }
    }
    p
}

/// The planted bug's fix as one patch against the example's base commit.
fn fix_patch() -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/tinyport/fastvideo/layers/timestep.py");
    let old = std::fs::read_to_string(file).unwrap();
    let bug = "[np.sin(args), np.cos(args)]";
    assert!(old.contains(bug), "{old}");
    let new = old.replace(bug, "[np.cos(args), np.sin(args)]");
    whole_file_patch("fastvideo/layers/timestep.py", &old, &new)
}

/// Whether process `pid` runs (a zombie nobody reaped yet does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_string())
        })
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// The example's spec (without the escape-hatch component) whose agent
/// command runs `sh -c "if [ timestep_embed ] && <cond_then_body>; fi"`
/// first, then the replay agent: `cond_then_body` is the rest of an `if`'s
/// condition, `; then`, and its body.
fn before_the_agent(spec: String, cond_then_body: &str) -> String {
    let wrapper = format!(
        "command = [\"sh\", \"-c\", \"if [ \\\"$FVD_COMPONENT\\\" = timestep_embed ] && {cond_then_body}; fi; exec python3 -B tools/replay_agent.py \\\"$@\\\"\", \"agent\", "
    );
    without_time_shift(spec).replace(
        "command = [\"python3\", \"-B\", \"tools/replay_agent.py\", ",
        &wrapper,
    )
}

/// The spec without the escape-hatch component, for tests about something
/// else: the port then ends instead of pausing on its question.
fn without_time_shift(spec: String) -> String {
    let start = spec
        .find("# Red until a person decides")
        .expect("time_shift's block in port.toml");
    let end = spec.find("[agent]").expect("[agent] in port.toml");
    format!("{}{}", &spec[..start], &spec[end..])
}

fn answer(sb: &Sandbox, args: &[&str]) -> (Option<i32>, String) {
    outcome(
        fvd()
            .args(["answer", "tinyport"])
            .args(args)
            .arg("--repo")
            .arg(sb.repo()),
    )
}

/// `fvd attempts --json`: from the embedded state, or from the
/// orchestrator at `url`.
pub(crate) fn ledger_of(sb: &Sandbox, component: &str, url: Option<&str>) -> serde_json::Value {
    let mut cmd = fvd();
    cmd.args(["attempts", "tinyport", component, "--json"]);
    match url {
        Some(url) => cmd.args(["--orchestrator", url]),
        None => cmd.arg("--repo").arg(sb.repo()),
    };
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn an_escape_hatch_waits_for_fvd_answer_while_the_rest_of_the_port_finishes() {
    let sb = Sandbox::new();
    example_repo(&sb, |t| t);
    let (code, out) = submit(&sb);
    assert_eq!(code, Some(3), "{out}");

    // Paused: everything else is final, time_shift waits on E001.
    let status = sb.local_status("tinyport").unwrap();
    assert_eq!(status["state"], "ask_user", "{status}");
    let rows = components(&status);
    for (name, st, _, _) in &rows {
        if name == "time_shift" {
            assert_eq!(st, "ask_user", "{rows:?}");
        } else {
            assert!(st == "non_skip_pass" || st == "blocked", "{rows:?}");
        }
    }
    let hatch = &status["escapes"][0];
    assert_eq!(hatch["id"], "E001", "{status}");
    assert_eq!(hatch["status"], "open");
    assert_eq!(hatch["component"], "time_shift");
    assert_eq!(hatch["options"].as_array().unwrap().len(), 2);
    let ps_path = sb.repo().join("tests/local_tests/tinyport/PORT_STATUS.md");
    let ps = std::fs::read_to_string(&ps_path).unwrap();
    let row = ps
        .lines()
        .find(|l| l.starts_with("| E001 |"))
        .unwrap_or_else(|| panic!("an E001 row: {ps}"));
    assert!(
        row.contains("`open`") && row.contains("fvd answer tinyport E001"),
        "{row}"
    );

    // Bad answers are refused and change nothing.
    let (code, out) = answer(&sb, &["E001", "--option", "7"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("has options 1 to 2"), "{out}");
    let (code, out) = answer(&sb, &["E009", "--option", "1"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("no escape hatch E009"), "{out}");
    let secret = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
    let (code, out) = answer(&sb, &["E001", "--text", secret]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("token-looking") && !out.contains(secret),
        "{out}"
    );
    assert_eq!(
        sb.local_status("tinyport").unwrap()["escapes"][0]["status"],
        "open"
    );

    // The answer resumes the port here (embedded) and time_shift finishes
    // with it; the other components are not rerun.
    let (code, out) = answer(&sb, &["E001", "--option", "1"]);
    assert_eq!(code, Some(1), "decoder_norm and vae stay blocked: {out}");
    assert!(
        out.contains("answered E001 of component time_shift: option 1: 3.0"),
        "{out}"
    );
    let status = sb.local_status("tinyport").unwrap();
    let c = component(&status, "time_shift");
    assert_eq!(c["status"], "non_skip_pass", "{status}");
    assert_eq!(c["runs"], 2, "one red run, one after the answer: {status}");
    assert_eq!(component(&status, "embed")["runs"], 1, "{status}");
    assert_eq!(status["escapes"][0]["status"], "resolved", "{status}");

    let l = ledger_of(&sb, "time_shift", None);
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{l}");
    assert!(
        attempts[0]["handoff_summary"]
            .as_str()
            .unwrap()
            .contains("next_step=ask_user"),
        "{l}"
    );
    assert_eq!(attempts[1]["verdict_after"], "non_skip_pass", "{l}");
    // The second packet carried the answer (the replay agent refuses to
    // apply its patch otherwise: tools/replay/time_shift/0002.expect).
    let prompt = std::fs::read_to_string(
        sb.repo()
            .join(".fvd/agent/tinyport/time_shift/attempt-2/prompt.md"),
    )
    .unwrap();
    assert!(prompt.contains("## Answers to your questions"), "{prompt}");
    assert!(prompt.contains("Answer: option 1: 3.0"), "{prompt}");
    let ps = std::fs::read_to_string(&ps_path).unwrap();
    let row = ps.lines().find(|l| l.starts_with("| E001 |")).unwrap();
    assert!(
        row.contains("`resolved`") && row.contains("given to attempt 2"),
        "{row}"
    );
    assert_eq!(ps.matches("| E001 |").count(), 1, "{ps}");

    // An answered hatch takes no second answer.
    let (code, out) = answer(&sb, &["E001", "--option", "2"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("is resolved, not open"), "{out}");
}

#[test]
fn the_cleanup_gate_sends_a_dirty_pass_back_to_the_agent() {
    let sb = Sandbox::new();
    // Attempt 1 fixes the bug but leaves a forward hook behind: the test
    // passes and the cleanup gate refuses it. Attempt 2 removes the hook.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    let recorded = example.join("tools/replay/timestep_embed");
    let fix = fix_patch();
    let handoff = std::fs::read_to_string(recorded.join("0002.handoff")).unwrap();
    let hook = "model.register_forward_hook(print)";
    let add = format!(
        "diff --git a/debug_hook.py b/debug_hook.py\nnew file mode 100644\n--- /dev/null\n+++ b/debug_hook.py\n@@ -0,0 +1 @@\n+{hook}\n"
    );
    let remove = format!(
        "diff --git a/debug_hook.py b/debug_hook.py\ndeleted file mode 100644\n--- a/debug_hook.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-{hook}\n"
    );
    example_repo(&sb, |t| {
        let dir = sb.repo().join("tools/replay/timestep_embed");
        std::fs::write(dir.join("0001.patch"), format!("{fix}{add}")).unwrap();
        std::fs::write(dir.join("0001.handoff"), &handoff).unwrap();
        std::fs::write(dir.join("0002.patch"), &remove).unwrap();
        without_time_shift(t)
    });
    let (code, out) = submit(&sb);
    assert_eq!(code, Some(1), "{out}");
    let status = sb.local_status("tinyport").unwrap();
    let c = component(&status, COMPONENT);
    assert_eq!(c["status"], "non_skip_pass", "{status}");
    assert_eq!(c["runs"], 3, "{status}");

    let l = ledger_of(&sb, COMPONENT, None);
    let a = l["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 2, "{l}");
    assert_eq!(a[0]["kind"], "fix", "{l}");
    assert_eq!(a[0]["verdict_after"], "non_skip_pass", "{l}");
    assert_eq!(a[1]["kind"], "cleanup", "{l}");
    assert_eq!(a[1]["verdict_before"], "cleanup_refused", "{l}");
    let why = a[1]["reason_before"].as_str().unwrap();
    assert!(
        why.starts_with("cleanup gate: forbidden patterns")
            && why.contains("debug_hook.py: `model.register_forward_hook(print)`"),
        "{why}"
    );
    let prompt = std::fs::read_to_string(
        sb.repo()
            .join(".fvd/agent/tinyport/timestep_embed/attempt-2/prompt.md"),
    )
    .unwrap();
    assert!(prompt.contains("**cleanup_refused**"), "{prompt}");
    // The final branch carries no hook.
    let wt = sb.repo().join(".fvd/worktrees/tinyport/timestep_embed");
    assert!(!wt.join("debug_hook.py").exists());
}

#[test]
fn a_budget_of_one_attempt_blocks_the_cleanup_too() {
    // Same dirty fix, but only one attempt: the pass never counts.
    let sb = Sandbox::new();
    let fix = fix_patch();
    let add = "diff --git a/dbg.py b/dbg.py\nnew file mode 100644\n--- /dev/null\n+++ b/dbg.py\n@@ -0,0 +1 @@\n+breakpoint()\n";
    example_repo(&sb, |t| {
        let dir = sb.repo().join("tools/replay/timestep_embed");
        std::fs::write(dir.join("0001.patch"), format!("{fix}{add}")).unwrap();
        without_time_shift(t).replace("max_attempts = 3", "max_attempts = 1")
    });
    let (code, out) = submit(&sb);
    assert_eq!(code, Some(1), "{out}");
    let c = component(&sb.local_status("tinyport").unwrap(), COMPONENT);
    assert_eq!(c["status"], "blocked", "{c}");
    let reason = c["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("cleanup_refused: cleanup gate: forbidden patterns")
            && reason.contains("dbg.py: `breakpoint()`")
            && reason.contains("agent budget spent: 1 of 1 attempts"),
        "{reason}"
    );
}

#[test]
fn confirm_runs_catches_a_flaky_pass() {
    let sb = Sandbox::new();
    // A test that passes on its first run and fails on its second: with
    // confirm_runs = 2 its first pass does not count.
    let marker = sb.repo().join("flaky-ran-once");
    let flaky = format!(
        "import os\n\n\ndef test_flaky_parity():\n    m = {marker:?}\n    if os.path.exists(m):\n        raise AssertionError('second run differs: 0.5 max abs diff')\n    open(m, 'w').close()\n",
        marker = marker.display().to_string()
    );
    example_repo(&sb, |t| {
        std::fs::write(
            sb.repo()
                .join("tests/local_tests/generic/test_tinyport_flaky_parity.py"),
            &flaky,
        )
        .unwrap();
        format!(
            "{}\n[[component]]\nname = \"flaky\"\ntype = \"generic\"\nparity_test = \"tests/local_tests/generic/test_tinyport_flaky_parity.py\"\ncoverage_scope = \"implementation_subcomponent\"\n",
            without_time_shift(t).replace(
                "env = [\"HF_TOKEN\"]",
                "env = [\"HF_TOKEN\"]\nconfirm_runs = 2"
            )
        )
    });
    let (code, out) = submit(&sb);
    assert_eq!(code, Some(1), "{out}");
    let status = sb.local_status("tinyport").unwrap();
    let f = component(&status, "flaky");
    assert_eq!(f["status"], "blocked", "{status}");
    assert_eq!(f["runs"], 2, "{status}");
    assert!(
        f["reason"].as_str().unwrap().contains("second run differs"),
        "{f}"
    );
    // A stable pass holds twice and counts.
    let e = component(&status, "embed");
    assert_eq!(
        (e["status"].as_str(), e["runs"].as_u64()),
        (Some("non_skip_pass"), Some(2)),
        "{e}"
    );
    // The agent component's fix is confirmed on the fixed code: red, red
    // (attempt 1), pass, pass.
    let t = component(&status, COMPONENT);
    assert_eq!(
        (t["status"].as_str(), t["runs"].as_u64()),
        (Some("non_skip_pass"), Some(4)),
        "{t}"
    );
}

#[test]
fn a_conversion_retry_request_blocks_the_component_and_reopens_p5() {
    let sb = Sandbox::new();
    example_repo(&sb, |t| {
        let dir = sb.repo().join("tools/replay/timestep_embed");
        let h = std::fs::read_to_string(dir.join("0001.handoff")).unwrap();
        let h = h
            .replace(
                "next_step: phase_6_continue",
                "next_step: phase_5_conversion_retry",
            )
            .replace(
                "conversion_retry_request: none",
                "conversion_retry_request: time_embed.linear_1.weight is transposed by the mapping",
            );
        std::fs::write(dir.join("0001.handoff"), h).unwrap();
        without_time_shift(t)
    });
    let (code, out) = submit(&sb);
    assert_eq!(code, Some(1), "{out}");
    let status = sb.local_status("tinyport").unwrap();
    let c = component(&status, COMPONENT);
    assert_eq!(c["status"], "blocked", "{status}");
    assert_eq!(c["runs"], 1, "no rerun after a conversion retry: {status}");
    let reason = c["reason"].as_str().unwrap();
    assert!(
        reason.contains("conversion_retry_request after agent attempt 1: time_embed.linear_1.weight is transposed"),
        "{reason}"
    );
    let reopened: Vec<&serde_json::Value> = status["gate"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["phase"] == "P5" && g["outcome"] == "reopened")
        .collect();
    assert_eq!(reopened.len(), 1, "{status}");
    assert!(
        reopened[0]["conditions"][0]
            .as_str()
            .unwrap()
            .contains("component timestep_embed returned a conversion_retry_request"),
        "{status}"
    );
}

/// An agent on the orchestrator's host (`--agents host`) cut off by a
/// `kill -9` of its orchestrator: the restarted one ends what is left of
/// it and runs the attempt again under its number. (An agent on a worker
/// is adopted instead: `agent_model::an_agent_attempt_on_a_worker_goes_on…`.)
#[test]
fn kill_9_of_the_orchestrator_during_an_agent_attempt_neither_loses_nor_duplicates_it() {
    // The orchestrator's database and logs stay outside the checkout, so
    // the port runs its HEAD (not a snapshot holding them).
    let mut sb = Sandbox::with_repo_in("repo");
    // In the attempt's own folder, which its jailed agent may write and
    // which the attempt's second try finds again.
    let mark = sb
        .repo()
        .join(".fvd/agent/tinyport/timestep_embed/attempt-1/agent-started.pid");
    let mark_s = mark.display().to_string();
    // The first agent run of timestep_embed records its pid and hangs (the
    // orchestrator is killed meanwhile); later runs replay.
    example_repo(&sb, |t| {
        before_the_agent(
            t,
            &format!("[ ! -e {mark_s} ]; then echo $$ > {mark_s}; sleep 120"),
        )
    });
    let url = sb.serve_with(&["--allow-agent-commands", "--agents", "host"]);
    sb.worker("w1", 2);
    let out = fvd()
        .args([
            "submit",
            "--family",
            "tinyport",
            "--orchestrator",
            &url,
            "--repo",
        ])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: i32 = crate::support::wait_for(
        "the first agent run",
        std::time::Duration::from_secs(60),
        || std::fs::read_to_string(&mark).ok()?.trim().parse().ok(),
    );
    let before = ledger_of(&sb, COMPONENT, Some(&url));
    let a = before["attempts"].as_array().unwrap();
    assert_eq!(
        a.len(),
        1,
        "the attempt is on record before its agent runs: {before}"
    );
    assert_eq!(a[0]["state"], "running", "{before}");
    sb.kill_orchestrator();
    // The agent outlives its orchestrator...
    assert!(alive(pid));

    let addr = url.trim_start_matches("http://").to_string();
    sb.serve_at(&addr, &["--allow-agent-commands", "--agents", "host"]);
    // ...until the restarted orchestrator finds and ends it.
    crate::support::wait_for(
        "the leftover agent to be killed",
        std::time::Duration::from_secs(30),
        || (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(()),
    );
    let status = crate::support::wait_for(
        "the port to end",
        std::time::Duration::from_secs(120),
        || {
            let s = sb.remote_status("tinyport")?;
            (s["state"] != "running").then_some(s)
        },
    );
    let c = component(&status, COMPONENT);
    assert_eq!(c["status"], "non_skip_pass", "{status}\n{}", sb.logs());

    let l = ledger_of(&sb, COMPONENT, Some(&url));
    let a = l["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 2, "{l}");
    assert_eq!(a[0]["attempt"], 1);
    assert_eq!(
        a[0]["tries"], 2,
        "attempt 1 was cut off and rerun once: {l}"
    );
    assert_eq!(a[0]["state"], "recorded");
    assert_eq!(a[1]["tries"], 1, "{l}");
    assert_eq!(a[1]["verdict_after"], "non_skip_pass", "{l}");
    // One commit per attempt on the branch: the cut-off try left none.
    let log = git(sb.repo(), &["log", "--format=%s", BRANCH]);
    assert_eq!(
        log,
        "fvd: timestep_embed attempt 2\nfvd: timestep_embed attempt 1\nbase"
    );
}

/// The attempt runs in its own actor (issue #40), so its component answers
/// a cancel while the agent runs: the port ends cancelled and the agent's
/// whole process group is ended with it, not left to run out its time.
#[test]
fn a_cancel_during_an_agent_attempt_ends_its_agent_at_once() {
    let mut sb = Sandbox::with_repo_in("repo");
    let dir = sb
        .repo()
        .join(".fvd/agent/tinyport/timestep_embed/attempt-1");
    let (shell, child) = (dir.join("shell.pid"), dir.join("child.pid"));
    let (shell_s, child_s) = (shell.display().to_string(), child.display().to_string());
    // timestep_embed's agent records its pid and its child's, and waits on
    // the child far longer than the test.
    example_repo(&sb, |t| {
        before_the_agent(
            t,
            &format!("true; then sleep 300 & echo $! > {child_s}; echo $$ > {shell_s}; wait"),
        )
    });
    let url = sb.serve_with(&["--allow-agent-commands", "--agents", "host"]);
    sb.worker("w1", 2);
    let (code, out) = outcome(
        fvd()
            .args([
                "submit",
                "--family",
                "tinyport",
                "--orchestrator",
                &url,
                "--repo",
            ])
            .arg(sb.repo()),
    );
    assert_eq!(code, Some(0), "{out}");
    let pids: Vec<i32> = crate::support::wait_for(
        "the agent and its child",
        std::time::Duration::from_secs(60),
        || {
            let read = |p: &Path| std::fs::read_to_string(p).ok()?.trim().parse().ok();
            Some(vec![read(&shell)?, read(&child)?])
        },
    );
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");
    let (code, out) = outcome(fvd().args(["cancel", "tinyport", "--orchestrator", &url]));
    assert_eq!(code, Some(0), "{out}");
    let status = crate::support::wait_for(
        "the port to end",
        std::time::Duration::from_secs(30),
        || {
            let s = sb.remote_status("tinyport")?;
            (s["state"] == "cancelled").then_some(s)
        },
    );
    assert_eq!(
        component(&status, COMPONENT)["status"],
        "blocked",
        "{status}"
    );
    for pid in pids {
        crate::support::wait_for(
            "the agent's processes to be ended",
            std::time::Duration::from_secs(30),
            || (!alive(pid)).then_some(()),
        );
    }
}

#[test]
fn a_fleet_orchestrator_takes_the_answer_over_grpc() {
    let mut sb = Sandbox::new();
    example_repo(&sb, |t| t);
    let url = sb.serve_with(&["--allow-agent-commands"]);
    sb.worker("w1", 2);
    let out = sb.submit_remote("tinyport", &["--wait"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{}", sb.logs());
    assert!(stdout.contains("E001 time_shift asks"), "{stdout}");
    let status = sb.remote_status("tinyport").unwrap();
    assert_eq!(status["state"], "ask_user", "{status}");

    // The port stays in the orchestrator; the answer wakes its component.
    let out = fvd()
        .args([
            "answer",
            "tinyport",
            "E001",
            "--option",
            "1",
            "--wait",
            "--orchestrator",
            &url,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{}", sb.logs());
    let status = sb.remote_status("tinyport").unwrap();
    let c = component(&status, "time_shift");
    assert_eq!(c["status"], "non_skip_pass", "{status}");
    assert_eq!(status["escapes"][0]["status"], "resolved", "{status}");
    assert_eq!(status["state"], "blocked", "{status}");
}

#[test]
fn a_port_folder_inside_a_larger_checkout_runs_its_agents_in_worktrees_of_it() {
    // Like the README's own run: examples/tinyport inside fvd's checkout.
    let sb = Sandbox::new();
    let port = sb.repo().join("sub/tinyport");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    copy_tree(&example, &port);
    git(sb.repo(), &["init", "-q", "-b", "main"]);
    git(sb.repo(), &["add", "sub"]);
    git(sb.repo(), &["commit", "-q", "-m", "base"]);
    let run = |args: &[&str]| {
        let out = fvd().args(args).arg("--repo").arg(&port).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = run(&["submit", "--family", "tinyport", "--wait"]);
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains("timestep_embed   non_skip_pass  runs=3"),
        "{out}"
    );
    let (code, out) = run(&["answer", "tinyport", "E001", "--option", "1"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("time_shift       non_skip_pass  runs=2"),
        "{out}"
    );
    // The branches live in the enclosing repository and their commits name
    // the port folder's files by their path there.
    let stat = git(
        sb.repo(),
        &["show", "--stat", "--format=", "fvd/tinyport/time_shift"],
    );
    assert!(
        stat.contains("sub/tinyport/fastvideo/layers/time_shift.py"),
        "{stat}"
    );
    // The enclosing checkout shows only the PORT_STATUS.md fvd wrote.
    assert_eq!(
        git(sb.repo(), &["status", "--porcelain", "sub"]),
        " M sub/tinyport/tests/local_tests/tinyport/PORT_STATUS.md"
    );
}
