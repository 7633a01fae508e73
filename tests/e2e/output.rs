//! Output a person reads once (issue #28, item 7): a refusal's findings
//! printed once, a cause many components share said once, no replay of an
//! earlier run's gate decisions on resume, no log lines in a command's
//! output unless asked, colour only when wanted, `fvd logs` saying why a
//! run has no output, and `fvd status` after Ctrl-C saying the port is
//! interrupted.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::support::{Sandbox, TestComponent, fvd, wait_for};

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn submit(repo: &Path, family: &str, extra: &[&str]) -> Output {
    fvd()
        .args(["submit", "--family", family, "--wait", "--repo"])
        .arg(repo)
        .args(extra)
        .env_remove("FVD_LOG")
        .output()
        .unwrap()
}

fn edit_spec(repo: &Path, family: &str, f: impl Fn(String) -> String) {
    let path = repo.join(format!("tests/local_tests/{family}/port.toml"));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, f(text)).unwrap();
}

#[test]
fn each_finding_and_cause_is_said_once_and_history_is_not_replayed() {
    let sb = Sandbox::new();
    sb.port(
        "quiet",
        &[
            TestComponent::new("a", "assert True"),
            TestComponent::new("b", "assert True"),
            TestComponent::new("c", "assert True"),
        ],
    );
    let repo = sb.repo();
    // a refused P0: each finding once
    edit_spec(repo, "quiet", |t| {
        t.replace(
            "hf_token_env = \"HF_TOKEN\"",
            "hf_token_env = \"<fill in: a variable>\"",
        )
    });
    let refused = submit(repo, "quiet", &[]);
    let text = out(&refused);
    assert_eq!(refused.status.code(), Some(1), "{text}");
    assert_eq!(text.matches("prep.hf_token_env").count(), 1, "{text}");
    // three components that need a GPU on a machine without one: the
    // cause is said once
    edit_spec(repo, "quiet", |t| {
        t.replace(
            "hf_token_env = \"<fill in: a variable>\"",
            "hf_token_env = \"HF_TOKEN\"",
        )
        .replace(
            "coverage_scope = \"implementation_subcomponent\"\n",
            "coverage_scope = \"implementation_subcomponent\"\ngpus = 1\n",
        )
    });
    let gpu = submit(repo, "quiet", &["--gpus", "none"]);
    let text = out(&gpu);
    assert_eq!(gpu.status.code(), Some(1), "{text}");
    assert_eq!(text.matches("this machine has none").count(), 1, "{text}");
    assert!(
        text.contains("3 components cannot run on this machine"),
        "{text}"
    );
    // no log lines, no colour codes in a command's output
    assert!(
        !text.contains(" WARN ") && !text.contains(" INFO "),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "{text}");
    // back to CPU: a resume prints this run's gate decisions only
    edit_spec(repo, "quiet", |t| t.replace("gpus = 1\n", ""));
    let first = submit(repo, "quiet", &[]);
    assert_eq!(first.status.code(), Some(0), "{}", out(&first));
    let again = submit(repo, "quiet", &[]);
    let text = out(&again);
    assert_eq!(again.status.code(), Some(0), "{text}");
    assert!(
        !text.contains("gate P0 refused"),
        "an old refusal replayed: {text}"
    );
    assert!(
        !text.contains("gate P0 passed"),
        "an old decision replayed: {text}"
    );
    // colour and log lines when asked, none when told not to
    let status = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = fvd();
        c.args(args).args(["status", "quiet", "--repo"]).arg(repo);
        for (k, v) in env {
            c.env(k, v);
        }
        out(&c.output().unwrap())
    };
    assert!(status(&["--color", "always"], &[("FVD_LOG", "debug")]).contains('\u{1b}'));
    assert!(!status(&["--color", "never"], &[("FVD_LOG", "debug")]).contains('\u{1b}'));
    assert!(!status(&[], &[("FVD_LOG", "debug"), ("NO_COLOR", "1")]).contains('\u{1b}'));
}

/// A blocked port submitted again: its components' lines are not replayed
/// (the verdicts did not change), and the summary still says why it is
/// blocked, where the resumed gate used to leave the refusal unsaid.
#[test]
fn a_resumed_blocked_port_says_its_refusal_and_replays_no_component() {
    let sb = Sandbox::new();
    sb.port(
        "stuck",
        &[
            TestComponent::new("good", "assert True"),
            TestComponent::new("bad", "assert 1 == 2, 'the epsilon differs'"),
        ],
    );
    let repo = sb.repo();
    let first = submit(repo, "stuck", &[]);
    let text = out(&first);
    assert_eq!(first.status.code(), Some(1), "{text}");
    assert!(text.contains("gate P7 refused (1 reason below)"), "{text}");
    assert!(text.contains("gate refused P7:"), "{text}");
    let again = submit(repo, "stuck", &[]);
    let text = out(&again);
    assert_eq!(again.status.code(), Some(1), "{text}");
    assert!(
        text.contains("gate refused P7:"),
        "the refusal went unsaid: {text}"
    );
    assert!(
        text.contains("components bad") || text.contains("component bad"),
        "{text}"
    );
    // each component once: in the summary, not also as a replayed line
    assert_eq!(text.matches("the epsilon differs").count(), 1, "{text}");
    assert_eq!(text.matches("  good ").count(), 1, "{text}");
}

#[test]
fn logs_say_why_there_is_none_and_status_after_ctrl_c_says_interrupted() {
    let sb = Sandbox::new();
    sb.port(
        "paused",
        &[
            TestComponent::new("envy", "import fvd_e2e_not_installed_pkg"),
            TestComponent::new("spawnless", "assert True"),
        ],
    );
    let repo = sb.repo();
    // an interpreter that does not exist: the run fails before any output
    edit_spec(repo, "paused", |t| {
        t.replace(
            "name = \"spawnless\"\n",
            "name = \"spawnless\"\ncommand = [\"fvd-e2e-no-such-python\", \"-m\", \"pytest\", \"{test}\"]\n",
        )
    });
    let first = submit(repo, "paused", &[]);
    assert_eq!(first.status.code(), Some(4), "{}", out(&first));
    // the environment failure's own output, not an empty queued rerun
    let logs = fvd()
        .args(["logs", "paused", "envy", "--repo"])
        .arg(repo)
        .output()
        .unwrap();
    let text = out(&logs);
    assert!(logs.status.success(), "{text}");
    assert!(text.contains("fvd_e2e_not_installed_pkg"), "{text}");
    // a run that printed nothing says why
    let logs = fvd()
        .args(["logs", "paused", "spawnless", "--repo"])
        .arg(repo)
        .output()
        .unwrap();
    let text = out(&logs);
    assert!(logs.status.success(), "{text}");
    assert!(
        text.contains("has no output: it failed on its environment")
            && text.contains("fvd-e2e-no-such-python"),
        "{text}"
    );

    // a slow component, interrupted while it runs
    let slow = Sandbox::new();
    slow.port("slow", &[TestComponent::new("nap", "time.sleep(60)")]);
    let mut child = fvd()
        .args(["submit", "--family", "slow", "--wait", "--repo"])
        .arg(slow.repo())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the component to run", Duration::from_secs(60), || {
        let s = slow.local_status("slow")?;
        (s["components"][0]["status"] == "running").then_some(())
    });
    // Ctrl-C
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let code = wait_for("submit to stop", Duration::from_secs(30), || {
        child.try_wait().unwrap()
    });
    assert_eq!(code.code(), Some(130));
    let s = slow.local_status("slow").expect("status");
    assert_eq!(s["state"], "interrupted", "{s}");
    assert_eq!(s["components"][0]["status"], "interrupted", "{s}");
    let human = fvd()
        .args(["status", "slow", "--repo"])
        .arg(slow.repo())
        .output()
        .unwrap();
    // The hint to resume names the repository, so it can be pasted from
    // anywhere.
    let resume = format!(
        "`fvd submit --family slow --repo {}` resumes it",
        slow.repo().canonicalize().unwrap().display()
    );
    assert!(out(&human).contains(&resume), "{}", out(&human));
    assert!(!out(&human).contains("retrying"), "{}", out(&human));
}
