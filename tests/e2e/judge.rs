//! The judge, pinned (issue #39): an agent that loosens the parity test's
//! tolerance, adds a `conftest.py` that turns failures into passes, or
//! edits the official reference to match the port's bug gets no pass: each
//! attempt's run tests its code with the port's own judge, and the ledger
//! lists the judge paths it changed. The honest fix, on top of all three,
//! still passes.

use crate::agent::{component, example_repo};
use crate::support::{Sandbox, fvd};

const COMPONENT: &str = "timestep_embed";
const TEST: &str = "tests/local_tests/generic/test_tinyport_timestep_embed_parity.py";

/// Attempt 1 loosens the tolerance, 2 adds a report-flipping conftest.py,
/// 3 makes the official reference match the port's bug, 4 fixes the port.
const CHEATER: &str = r#"
import argparse, pathlib, shutil
ap = argparse.ArgumentParser()
ap.add_argument("--attempt", type=int)
ap.add_argument("--worktree")
ap.add_argument("--handoff")
a = ap.parse_args()
w = pathlib.Path(a.worktree)
def edit(rel, old, new):
    p = w / rel
    text = p.read_text()
    assert old in text, (rel, old)
    p.write_text(text.replace(old, new))
if a.attempt == 1:
    edit("tests/local_tests/generic/test_tinyport_timestep_embed_parity.py", "atol=1e-4", "atol=10.0")
elif a.attempt == 2:
    (w / "tests/local_tests/generic/conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    rep = outcome.get_result()\n    if rep.failed:\n        rep.outcome = 'passed'\n")
elif a.attempt == 3:
    edit("official/tinyport_official/timestep.py",
         "np.concatenate([np.cos(args), np.sin(args)], axis=-1)",
         "np.concatenate([np.sin(args), np.cos(args)], axis=-1)")
else:
    edit("fastvideo/layers/timestep.py",
         "np.concatenate([np.sin(args), np.cos(args)], axis=-1)",
         "np.concatenate([np.cos(args), np.sin(args)], axis=-1)")
shutil.copy(w / "tools/replay/timestep_embed/0002.handoff", a.handoff)
"#;

#[test]
fn a_cheating_agent_gets_no_pass_and_the_honest_fix_still_passes() {
    cheats(false);
}

/// The same on a fleet worker: the agent runs there, and the verdict run
/// gets the commit with the port's judge by commit.
#[test]
fn a_cheating_agent_on_a_fleet_worker_gets_no_pass() {
    cheats(true);
}

fn cheats(fleet: bool) {
    let mut sb = Sandbox::new();
    example_repo(&sb, |t| {
        t.replace(
            r#"command = ["python3", "-B", "tools/replay_agent.py", "--patches", "tools/replay/{component}", "--attempt", "{attempt}", "--prompt", "{prompt_file}", "--handoff", "{handoff_file}", "--worktree", "{worktree}"]"#,
            r#"command = ["python3", "-B", "tools/cheater.py", "--attempt", "{attempt}", "--handoff", "{handoff_file}", "--worktree", "{worktree}"]"#,
        )
        .replace("max_attempts = 3", "max_attempts = 4")
    });
    // Only timestep_embed cheats; time_shift's agent would ask its
    // question of the replay agent, so it runs no agent here.
    let spec = sb.repo().join("tests/local_tests/tinyport/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    let (head, tail) = text.split_once("name = \"time_shift\"").unwrap();
    std::fs::write(
        &spec,
        format!(
            "{head}name = \"time_shift\"{}",
            tail.replacen("agent = true\n", "", 1)
        ),
    )
    .unwrap();
    std::fs::write(sb.repo().join("tools/cheater.py"), CHEATER).unwrap();
    crate::agent::git(sb.repo(), &["add", "-A"]);
    crate::agent::git(sb.repo(), &["commit", "-q", "-m", "a cheating agent"]);

    // Where the CLI reads from: the repository, or the orchestrator.
    let mut place: Vec<String> = vec!["--repo".into(), sb.repo().display().to_string()];
    let (out, status) = if fleet {
        let url = sb.serve_with(&["--allow-agent-commands"]);
        sb.worker("w1", 2);
        place = vec!["--orchestrator".into(), url];
        let out = sb.submit_remote("tinyport", &["--wait"]);
        (out, sb.remote_status("tinyport").expect("status"))
    } else {
        let out = fvd()
            .args(["submit", "--family", "tinyport", "--wait", "--repo"])
            .arg(sb.repo())
            .output()
            .unwrap();
        (out, sb.local_status("tinyport").expect("status"))
    };
    let text = format!(
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );
    let c = component(&status, COMPONENT);
    assert_eq!(c["status"], "non_skip_pass", "{text}\n{status}");

    let out = fvd()
        .args(["attempts", "tinyport", COMPONENT, "--json"])
        .args(&place)
        .output()
        .unwrap();
    let l: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4, "{l}");
    if fleet {
        assert!(attempts.iter().all(|a| a["worker_id"] == "w1"), "{l}");
    }
    let judge = |a: &serde_json::Value| -> Vec<String> {
        a["judge_changed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect()
    };
    let cheats = [
        vec![TEST.to_string()],
        vec![
            "tests/local_tests/generic/conftest.py".to_string(),
            TEST.to_string(),
        ],
        vec![
            "official/tinyport_official/timestep.py".to_string(),
            "tests/local_tests/generic/conftest.py".to_string(),
            TEST.to_string(),
        ],
    ];
    for (i, want) in cheats.iter().enumerate() {
        let a = &attempts[i];
        // Each cheat alone would have passed; with the port's judge, red.
        assert_eq!(a["verdict_after"], "debug_red", "attempt {}: {a}", i + 1);
        assert_eq!(&judge(a), want, "attempt {}: {a}", i + 1);
    }
    // The fix on top of all three passes the port's own judge.
    assert_eq!(attempts[3]["verdict_after"], "non_skip_pass", "{l}");
    assert_eq!(judge(&attempts[3]), cheats[2], "{l}");
    // The person reading the ledger sees it.
    let out = fvd()
        .args(["attempts", "tinyport", COMPONENT])
        .args(&place)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("changed the judge, not counted (its run used the port's own): tests/local_tests/generic/test_tinyport_timestep_embed_parity.py"),
        "{shown}"
    );
}
