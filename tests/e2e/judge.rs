//! The judge, pinned (issue #39): an agent that loosens the parity test's
//! tolerance, adds a `conftest.py` that turns failures into passes, or
//! edits the official reference to match the port's bug gets no pass: each
//! attempt's run tests its code with the port's own judge, the ledger
//! lists the judge paths it changed, and the change becomes a person's
//! question. Rejected, it is dropped from the branch and the agent's next
//! packet says so; approved, it is committed under the person's name and
//! the verdict runs with it. One whose port module swaps out numpy's
//! assertion gets `tampered`, and its next packet names the swap. The
//! honest fix still passes. The agent writes nothing outside its worktree: not the
//! state database, the main checkout or `.fvd/` (embedded), not the
//! worker's workspace (fleet).

use crate::agent::{component, example_repo};
use crate::support::{Sandbox, fvd};

const COMPONENT: &str = "timestep_embed";
const TEST: &str = "tests/local_tests/generic/test_tinyport_timestep_embed_parity.py";

/// Attempt 1 loosens the tolerance, 2 adds a report-flipping conftest.py,
/// 3 makes the official reference match the port's bug (each rejected by a
/// person, so each starts without the one before), 4 makes the port's
/// module swap out `numpy.testing.assert_allclose`, 5 fixes the port (and
/// drops the swap, after keeping the packet that named it).
const CHEATER: &str = r#"
import argparse, pathlib, shutil
ap = argparse.ArgumentParser()
ap.add_argument("--attempt", type=int)
ap.add_argument("--worktree")
ap.add_argument("--handoff")
ap.add_argument("--prompt")
a = ap.parse_args()
w = pathlib.Path(a.worktree)
SWAP = "\nimport numpy as _np\n_np.testing.assert_allclose = lambda *a, **k: None\n"
def edit(rel, old, new):
    p = w / rel
    text = p.read_text()
    assert old in text, (rel, old)
    p.write_text(text.replace(old, new))
if a.attempt == 1:
    edit("tests/local_tests/generic/test_tinyport_timestep_embed_parity.py", "atol=1e-4", "atol=10.0")
    # Writes outside its worktree, each refused by the jail (the targets and
    # where to say so are named by files of the port).
    mark = (w / "tools/mark").read_text().strip()
    lines = []
    for target in (w / "tools/targets").read_text().split():
        try:
            with open(target, "a") as f:
                f.write("forged")
            lines.append("wrote " + target)
        except OSError as e:
            lines.append("refused %s %s" % (target, e.errno))
    pathlib.Path(mark, "writes.txt").write_text("\n".join(lines) + "\n")
elif a.attempt == 2:
    (w / "tests/local_tests/generic/conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    rep = outcome.get_result()\n    if rep.failed:\n        rep.outcome = 'passed'\n")
elif a.attempt == 3:
    edit("official/tinyport_official/timestep.py",
         "np.concatenate([np.cos(args), np.sin(args)], axis=-1)",
         "np.concatenate([np.sin(args), np.cos(args)], axis=-1)")
elif a.attempt == 4:
    with open(w / "fastvideo/layers/timestep.py", "a") as f:
        f.write(SWAP)
else:
    mark = (w / "tools/mark").read_text().strip()
    shutil.copy(a.prompt, pathlib.Path(mark, "packet5.txt"))
    edit("fastvideo/layers/timestep.py", SWAP, "")
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
            r#"command = ["python3", "-B", "tools/cheater.py", "--attempt", "{attempt}", "--handoff", "{handoff_file}", "--prompt", "{prompt_file}", "--worktree", "{worktree}"]"#,
        )
        .replace("max_attempts = 3", "max_attempts = 5")
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
    // What attempt 1 tries to write besides its worktree: the state
    // database, the main checkout and `.fvd/` embedded; the worker's
    // workspace on a fleet.
    // Outside the repository (the sandbox's folder is the repository).
    let mark_dir = tempfile::tempdir().unwrap();
    let mark = mark_dir.path().to_path_buf();
    std::fs::write(sb.repo().join("tools/mark"), mark.display().to_string()).unwrap();
    let targets: Vec<std::path::PathBuf> = if fleet {
        let ws = sb.dir.path().join("ws-w1");
        vec![
            ws.join("jobs/forged.txt"),
            ws.join("code/forged.txt"),
            ws.join("forged.txt"),
        ]
    } else {
        let r = sb.repo();
        vec![
            r.join(".fvd/state.db"),
            r.join("fastvideo/layers/timestep.py"),
            r.join(".fvd/worktrees/forged.txt"),
        ]
    };
    let listed: Vec<String> = targets.iter().map(|t| t.display().to_string()).collect();
    std::fs::write(sb.repo().join("tools/targets"), listed.join("\n")).unwrap();
    // Every test tries the same writes (a port's module can run anything
    // when a test imports it): the port's own root conftest.py does.
    std::fs::write(
        sb.repo().join("conftest.py"),
        format!(
            "import os\nlines = []\nfor t in {listed:?}:\n    try:\n        open(t, 'a').close()\n        lines.append('wrote ' + t)\n    except OSError as e:\n        lines.append('refused %s %s' % (t, e.errno))\nopen(os.path.join({mark:?}, 'test-writes-%d.txt' % os.getpid()), 'w').write('\\n'.join(lines) + '\\n')\n",
            mark = mark.display().to_string(),
        ),
    )
    .unwrap();
    crate::agent::git(sb.repo(), &["add", "-A"]);
    crate::agent::git(sb.repo(), &["commit", "-q", "-m", "a cheating agent"]);

    // Who answers the questions: the checkout's git user.
    crate::agent::git(sb.repo(), &["config", "user.name", "Ada Reviewer"]);
    let base = crate::agent::git(sb.repo(), &["rev-parse", "HEAD"]);

    // Where the CLI reads from: the repository, or the orchestrator.
    let mut place: Vec<String> = vec!["--repo".into(), sb.repo().display().to_string()];
    let (code, text) = if fleet {
        let url = sb.serve_with(&["--allow-agent-commands"]);
        sb.worker("w1", 2);
        place.extend(["--orchestrator".to_string(), url]);
        let out = sb.submit_remote("tinyport", &["--wait"]);
        (out.status.code(), said(&out))
    } else {
        let out = fvd()
            .args(["submit", "--family", "tinyport", "--wait", "--repo"])
            .arg(sb.repo())
            .output()
            .unwrap();
        (out.status.code(), said(&out))
    };
    let status = |sb: &Sandbox| {
        if fleet {
            sb.remote_status("tinyport").expect("status")
        } else {
            sb.local_status("tinyport").expect("status")
        }
    };
    // Each of the first three attempts changed the judge: its run judged
    // its code with the port's own (red), and the port waits for a person.
    let conftest = "tests/local_tests/generic/conftest.py";
    let official = "official/tinyport_official/timestep.py";
    let asked = [
        (
            "E001",
            TEST,
            "reject: the tolerance is the port's; fix the code",
        ),
        ("E002", conftest, "option 2"),
        ("E003", official, "option 2"),
    ];
    let (mut code, mut text) = (code, text);
    for (id, path, answer) in asked {
        assert_eq!(code, Some(3), "{id}: {text}\n{}", sb.logs());
        let now = status(&sb);
        assert_eq!(component(&now, COMPONENT)["status"], "ask_user", "{now}");
        let q = now["escapes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {now}"))
            .clone();
        assert_eq!(q["about"], "judge", "{q}");
        assert_eq!(q["status"], "open", "{q}");
        let question = q["question"].as_str().unwrap();
        assert!(question.contains(path), "{question}");
        assert!(question.contains("is debug_red"), "{question}");
        if id == "E001" {
            assert!(
                question
                    .contains("`-np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4)`"),
                "{question}"
            );
        }
        let mut cmd = fvd();
        cmd.args(["answer", "tinyport", id, "--wait"]).args(&place);
        cmd.args(sb.token_args("porter"));
        match answer.strip_prefix("option ") {
            Some(n) => cmd.args(["--option", n]),
            None => cmd.args(["--text", answer]),
        };
        let out = cmd.output().unwrap();
        (code, text) = (out.status.code(), said(&out));
    }
    // time_shift, without an agent, ends blocked; nothing waits any more.
    assert_ne!(code, Some(3), "{text}\n{}", sb.logs());
    let text = format!("{text}\n{}", sb.logs());
    let now = status(&sb);
    let c = component(&now, COMPONENT);
    assert_eq!(c["status"], "non_skip_pass", "{text}\n{now}");

    let out = fvd()
        .args(["attempts", "tinyport", COMPONENT, "--json"])
        .args(&place)
        .args(sb.token_args("viewer"))
        .output()
        .unwrap();
    let l: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 5, "{l}");
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
    // Each cheat alone would have passed; with the port's judge, red. A
    // rejected change is gone before the next attempt starts.
    for (i, (_, path, _)) in asked.iter().enumerate() {
        let a = &attempts[i];
        assert_eq!(a["verdict_after"], "debug_red", "attempt {}: {a}", i + 1);
        assert_eq!(judge(a), vec![path.to_string()], "attempt {}: {a}", i + 1);
        assert!(
            a["judge_diff"].as_str().unwrap().contains(path),
            "attempt {}: {a}",
            i + 1
        );
    }
    // Every question was the person's, and each rejection is recorded.
    let questions = l["judge_questions"].as_array().unwrap();
    assert_eq!(questions.len(), 3, "{l}");
    // The credential's name, or on a server without credentials the git
    // user of the answering checkout.
    let who = if sb.token_args("porter").is_empty() {
        "Ada Reviewer"
    } else {
        "porter"
    };
    for q in questions {
        assert_eq!(q["status"], "resolved", "{q}");
        assert_eq!(q["judge_commit"], "", "{q}");
        assert_eq!(q["answered_by"], who, "{q}");
    }
    // The swapped assertion would have passed too: tampered, never green,
    // and the agent's next packet names what it swapped and where.
    assert_eq!(attempts[3]["verdict_after"], "tampered", "{l}");
    assert!(judge(&attempts[3]).is_empty(), "{l}");
    let packet = std::fs::read_to_string(mark.join("packet5.txt")).expect("attempt 5's packet");
    assert!(
        packet.contains("numpy.testing.assert_allclose replaced by fastvideo/layers/timestep.py:"),
        "{packet}"
    );
    // It also says what a person made of its judge changes.
    assert!(packet.contains("## Your changes to the judge"), "{packet}");
    assert!(
        packet.contains(&format!(
            "E001 (attempt 1): rejected by {who}: it is no longer on your branch"
        )),
        "{packet}"
    );
    assert!(
        packet.contains("the tolerance is the port's; fix the code"),
        "{packet}"
    );
    // The fix passes the port's own judge, and the branch holds none of
    // the judge changes.
    assert_eq!(attempts[4]["verdict_after"], "non_skip_pass", "{l}");
    assert!(judge(&attempts[4]).is_empty(), "{l}");
    let branch = format!("fvd/tinyport/{COMPONENT}");
    let left = crate::agent::git(
        sb.repo(),
        &[
            "diff",
            "--name-only",
            &base,
            &branch,
            "--",
            TEST,
            conftest,
            official,
        ],
    );
    assert_eq!(left, "", "judge changes left on {branch}");
    // PORT_STATUS.md says who rejected each.
    let port_status =
        std::fs::read_to_string(sb.repo().join("tests/local_tests/tinyport/PORT_STATUS.md"))
            .unwrap();
    assert_eq!(
        port_status.matches(&format!("rejected by {who}")).count(),
        3,
        "{port_status}"
    );
    // Nothing outside its worktree took a write.
    let writes =
        std::fs::read_to_string(mark.join("writes.txt")).expect("attempt 1 tried its writes");
    for t in &listed {
        assert!(writes.contains(&format!("refused {t}")), "{t}:\n{writes}");
    }
    // Nor did any test's: embedded the state database; on a fleet any of
    // the worker's workspace but the test's own checkout and scratch.
    let refused: &[String] = if fleet { &listed } else { &listed[..1] };
    let mut tried = 0;
    for e in std::fs::read_dir(&mark).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("test-writes-") {
            tried += 1;
            let text = std::fs::read_to_string(e.path()).unwrap();
            for t in refused {
                assert!(
                    text.contains(&format!("refused {t}")),
                    "a test wrote {t}:\n{text}"
                );
            }
        }
    }
    assert!(tried >= 7, "the tests' write attempts: {tried}");
    // The person reading the ledger sees it.
    let out = fvd()
        .args(["attempts", "tinyport", COMPONENT])
        .args(&place)
        .args(sb.token_args("viewer"))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("changed the judge, not counted (its run used the port's own): tests/local_tests/generic/test_tinyport_timestep_embed_parity.py"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "judge change: E001 rejected by {who}: dropped from the branch"
        )),
        "{shown}"
    );
}

/// What a command said, labelled.
fn said(out: &std::process::Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Attempt 1 only loosens the tolerance; a person approves it.
const LOOSENER: &str = r#"
import argparse, pathlib, shutil
ap = argparse.ArgumentParser()
ap.add_argument("--attempt", type=int)
ap.add_argument("--worktree")
ap.add_argument("--handoff")
ap.add_argument("--prompt")
a = ap.parse_args()
w = pathlib.Path(a.worktree)
p = w / "tests/local_tests/generic/test_tinyport_timestep_embed_parity.py"
p.write_text(p.read_text().replace("atol=1e-4", "atol=10.0"))
shutil.copy(w / "tools/replay/timestep_embed/0002.handoff", a.handoff)
"#;

#[test]
fn an_approved_judge_change_passes_under_the_persons_name() {
    approved(false);
}

/// The same with the agent and the runs on a fleet worker: the approved
/// commit is run there.
#[test]
fn an_approved_judge_change_on_a_fleet_worker_passes_under_the_persons_name() {
    approved(true);
}

fn approved(fleet: bool) {
    let mut sb = Sandbox::new();
    example_repo(&sb, |t| {
        t.replace(
            r#"command = ["python3", "-B", "tools/replay_agent.py", "--patches", "tools/replay/{component}", "--attempt", "{attempt}", "--prompt", "{prompt_file}", "--handoff", "{handoff_file}", "--worktree", "{worktree}"]"#,
            r#"command = ["python3", "-B", "tools/loosener.py", "--attempt", "{attempt}", "--handoff", "{handoff_file}", "--prompt", "{prompt_file}", "--worktree", "{worktree}"]"#,
        )
    });
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
    std::fs::write(sb.repo().join("tools/loosener.py"), LOOSENER).unwrap();
    crate::agent::git(sb.repo(), &["add", "-A"]);
    crate::agent::git(sb.repo(), &["commit", "-q", "-m", "an agent that loosens"]);
    crate::agent::git(sb.repo(), &["config", "user.name", "Ada Reviewer"]);

    let mut place: Vec<String> = vec!["--repo".into(), sb.repo().display().to_string()];
    if fleet {
        let url = sb.serve_with(&["--allow-agent-commands"]);
        sb.worker("w1", 2);
        place.extend(["--orchestrator".to_string(), url]);
    }
    let run = |args: &[&str]| {
        let out = fvd()
            .args(args)
            .args(&place)
            .args(sb.token_args("porter"))
            .output()
            .unwrap();
        (out.status.code(), said(&out))
    };
    let status = |sb: &Sandbox| {
        if fleet {
            sb.remote_status("tinyport").expect("status")
        } else {
            sb.local_status("tinyport").expect("status")
        }
    };
    let (code, text) = run(&["submit", "--family", "tinyport", "--wait"]);
    assert_eq!(code, Some(3), "{text}\n{}", sb.logs());
    // Neither approve nor reject: refused, the question stays open.
    let (code, text) = run(&["answer", "tinyport", "E001", "--text", "looks fine"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("E001 asks whether to keep a judge change"),
        "{text}"
    );
    let (code, text) = run(&[
        "answer",
        "tinyport",
        "E001",
        "--text",
        "approve: bf16 noise needs it here",
        "--wait",
    ]);
    assert_ne!(code, Some(3), "{text}\n{}", sb.logs());
    let text = format!("{text}\n{}", sb.logs());
    let who = if sb.token_args("porter").is_empty() {
        "Ada Reviewer"
    } else {
        "porter"
    };
    let now = status(&sb);
    let c = component(&now, COMPONENT);
    assert_eq!(c["status"], "non_skip_pass", "{text}\n{now}");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("approved by {who} (E001)")),
        "{c}"
    );
    let (_, out) = run(&["attempts", "tinyport", COMPONENT, "--json"]);
    let json = &out[out.find('{').unwrap()..out.rfind('}').unwrap() + 1];
    let l: serde_json::Value = serde_json::from_str(json).unwrap();
    let attempts = l["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{l}");
    // The attempt's verdict is the run with its approved judge.
    assert_eq!(attempts[0]["verdict_after"], "non_skip_pass", "{l}");
    let q = &l["judge_questions"][0];
    assert_eq!(q["status"], "resolved", "{q}");
    assert_eq!(q["answered_by"], who, "{q}");
    let kept = q["judge_commit"].as_str().unwrap().to_string();
    assert_eq!(kept.len(), 40, "{q}");
    // The branch ends with the judge change alone, authored by the person.
    let branch = format!("fvd/tinyport/{COMPONENT}");
    assert_eq!(crate::agent::git(sb.repo(), &["rev-parse", &branch]), kept);
    assert_eq!(
        crate::agent::git(sb.repo(), &["log", "-1", "--format=%an", &branch]),
        who
    );
    assert_eq!(
        crate::agent::git(
            sb.repo(),
            &["diff", "--name-only", &format!("{branch}^"), &branch]
        ),
        TEST
    );
    let message = crate::agent::git(sb.repo(), &["log", "-1", "--format=%B", &branch]);
    assert!(
        message.contains("Why: bf16 noise needs it here"),
        "{message}"
    );
    // PORT_STATUS.md says the judge was changed, and by whom.
    let port_status =
        std::fs::read_to_string(sb.repo().join("tests/local_tests/tinyport/PORT_STATUS.md"))
            .unwrap();
    assert!(
        port_status.contains(&format!("approved by {who}: the judge change of attempt 1")),
        "{port_status}"
    );
    // Later runs are judged by the approved judge: a rerun passes without
    // asking again.
    let (code, text) = run(&["submit", "--family", "tinyport", "--rerun", "--wait"]);
    assert_ne!(code, Some(3), "{text}\n{}", sb.logs());
    let now = status(&sb);
    assert_eq!(
        component(&now, COMPONENT)["status"],
        "non_skip_pass",
        "{now}"
    );
    assert_eq!(now["escapes"].as_array().unwrap().len(), 1, "{now}");
}
