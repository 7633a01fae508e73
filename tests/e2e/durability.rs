//! Durability under faults a real fleet has (issue #27): a full disk under
//! the orchestrator's database pauses its ports calmly and they resume by
//! themselves with nothing lost.

use std::time::Duration;

use crate::port::blocks_until;
use crate::support::{Sandbox, SmallDisk, TestComponent, components, fvd, wait_for};

/// Lines at WARN or ERROR level in a log written with `FVD_LOG`'s format
/// (colours taken out).
fn loud_lines(log: &str) -> Vec<String> {
    let plain = strip_colours(log);
    plain
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(str::to_string)
        .collect()
}

/// `text` without ANSI colour sequences (`ESC [ … m`).
pub(crate) fn strip_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn a_full_disk_pauses_the_port_calmly_and_it_resumes_with_nothing_lost() {
    let disk = SmallDisk::mount(32);
    let mut sb = Sandbox::new();
    let release = sb.repo().join("release");
    sb.port(
        "fullish",
        &[
            // Red, with 4 MB of output pytest shows: more than the
            // database's write-ahead log can take without growing (a log
            // that is not growing reuses its own space).
            TestComponent::new(
                "first",
                &format!(
                    "{}\nprint('x' * 4_000_000)\nassert False, 'first-failed'",
                    blocks_until(&release)
                ),
            ),
            TestComponent::new("second", "print('second-ran')"),
        ],
    );
    let db = disk.dir.path().join("orchestrator.db");
    let addr = "127.0.0.1:0";
    let url = sb.serve_db(addr, &db, &[], &[]);
    // One slot: `second` waits behind `first`, so its lease is a write
    // the full disk meets too.
    sb.worker("w1", 1);
    let submit = sb.submit_remote("fullish", &[]);
    assert!(submit.status.success());
    wait_for("first running", Duration::from_secs(60), || {
        let rows = components(&sb.remote_status("fullish")?);
        rows.iter()
            .any(|r| r.0 == "first" && r.1 == "running")
            .then_some(())
    });
    let waiting = {
        let mut cmd = fvd();
        cmd.args([
            "submit",
            "--family",
            "fullish",
            "--wait",
            "--orchestrator",
            &url,
        ])
        .arg("--repo")
        .arg(sb.repo());
        std::thread::spawn(move || cmd.output().expect("run fvd submit --wait"))
    };
    let before = sb.orchestrator_log().len();
    let filler = disk.fill();
    // `first` ends now: its output and verdict meet the full disk.
    std::fs::write(&release, "go").unwrap();

    let out = waiting.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(4),
        "a port paused on its orchestrator's disk exits 4\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Said on stdout by the watch when the pause meets a port already
    // submitted, or as the refusal on stderr when it meets the submit.
    let said = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        said.contains("cannot write its database") && said.contains("full"),
        "the reason is named: {said}"
    );
    let paused = sb.remote_status("fullish").expect("status while paused");
    assert_eq!(paused["state"], "environment", "{paused}");
    // A while at the full disk: the orchestrator keeps retrying.
    wait_for(
        "a few retries against the full disk",
        Duration::from_secs(30),
        || {
            sb.orchestrator_log()[before..]
                .contains("database write failed again")
                .then_some(())
        },
    );
    std::fs::remove_file(&filler).unwrap();

    let status = wait_for("the port to end", Duration::from_secs(90), || {
        let s = sb.remote_status("fullish")?;
        (s["state"] != "running" && s["state"] != "environment").then_some(s)
    });
    let rows = components(&status);
    for (name, want) in [("first", "blocked"), ("second", "non_skip_pass")] {
        let r = rows.iter().find(|r| r.0 == name).unwrap();
        assert_eq!(
            (r.1.as_str(), r.2),
            (want, 1),
            "{name}: one run, its verdict recorded, nothing rerun: {status}"
        );
    }
    assert_eq!(
        status["pause_reason"].as_str().unwrap_or(""),
        "",
        "{status}"
    );
    // Its output, all of it written while the disk was full, is there to
    // its last line.
    let logs = fvd()
        .args(["logs", "fullish", "first", "--orchestrator", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(
        text.matches('x').count() >= 4_000_000 && text.contains("1 failed"),
        "{} bytes of output",
        text.len()
    );
    // Calm: the fault and its end are a few lines, not one per retry.
    let log = sb.orchestrator_log();
    let during = &log[before..];
    let loud = loud_lines(during);
    assert!(
        (1..=4).contains(&loud.len()),
        "one line per state change, not per retry ({} lines):\n{}\n\nlog:\n{during}",
        loud.len(),
        loud.join("\n")
    );
    assert!(
        during.contains("database writes succeed again"),
        "the recovery is logged"
    );
    assert!(
        !during.contains("non-zero transaction depth"),
        "the writer was never poisoned"
    );
    drop(sb);
    drop(disk);
}

/// The example port's spec with only the components named in `keep`
/// (each `[[component]]` block runs to the next block or `[agent]`).
pub(crate) fn keep_components(spec: &str, keep: &[&str]) -> String {
    let agent = spec.find("\n[agent]").expect("[agent] in port.toml");
    let (body, tail) = spec.split_at(agent);
    let mut parts = body.split("\n[[component]]\n");
    let mut out = parts.next().expect("the preamble").to_string();
    for block in parts {
        let name = block
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("a component name");
        if keep.contains(&name) {
            out.push_str("\n[[component]]\n");
            out.push_str(block);
        }
    }
    out.push_str(tail);
    out
}

/// `fvd submit --family tinyport --wait` in embedded mode, with `env`.
fn submit_with(sb: &Sandbox, env: &[(&str, &str)]) -> std::process::Output {
    fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .envs(env.iter().copied())
        .output()
        .expect("run fvd submit")
}

fn killed(out: &std::process::Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(9)
}

fn said(out: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn component_of(status: &serde_json::Value, name: &str) -> serde_json::Value {
    status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {status}"))
        .clone()
}

#[test]
fn a_kill_right_after_an_attempt_that_asks_keeps_its_question() {
    let sb = Sandbox::new();
    crate::agent::example_repo(&sb, |t| keep_components(&t, &["time_shift"]));
    // Killed right after the commit that records the agent's attempt:
    // before, the attempt row could be in the store without its question.
    let out = submit_with(&sb, &[("FVD_CRASH_AT", "attempt-committed")]);
    assert!(killed(&out), "{}", said(&out));
    let status = sb.local_status("tinyport").expect("status after the kill");
    let c = component_of(&status, "time_shift");
    assert_eq!(c["status"], "ask_user", "all of the step or none: {status}");
    assert_eq!(status["escapes"][0]["id"], "E001", "{status}");

    // The resumed port pauses on the same question (exit 3), not blocked
    // (exit 1) after an agent retried with no answer.
    let out = submit_with(&sb, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    let status = sb.local_status("tinyport").unwrap();
    let c = component_of(&status, "time_shift");
    assert_eq!(
        (&c["status"], &c["runs"]),
        (&"ask_user".into(), &1.into()),
        "{status}"
    );
    let escapes = status["escapes"].as_array().unwrap();
    assert_eq!(escapes.len(), 1, "asked once: {status}");
    assert_eq!(escapes[0]["status"], "open");
    let l = crate::agent::ledger_of(&sb, "time_shift", None);
    let a = l["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 1, "{l}");
    assert_eq!(
        (&a[0]["state"], &a[0]["tries"]),
        (&"recorded".into(), &1.into()),
        "{l}"
    );
}

#[test]
fn a_kill_right_after_a_red_verdict_does_not_test_the_same_commit_again() {
    let sb = Sandbox::new();
    crate::agent::example_repo(&sb, |t| keep_components(&t, &["timestep_embed"]));
    // The second verdict is attempt 1's red run: killed right after it is
    // committed, before the agent's next attempt starts.
    let out = submit_with(&sb, &[("FVD_CRASH_AT", "verdict-committed:2")]);
    assert!(killed(&out), "{}", said(&out));
    let status = sb.local_status("tinyport").unwrap();
    let c = component_of(&status, "timestep_embed");
    assert_eq!(
        (&c["status"], &c["runs"]),
        (&"agent".into(), &2.into()),
        "{status}"
    );

    let out = submit_with(&sb, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let status = sb.local_status("tinyport").unwrap();
    let c = component_of(&status, "timestep_embed");
    assert_eq!(c["status"], "non_skip_pass", "{status}");
    assert_eq!(
        c["runs"], 3,
        "one red run, then one per attempt; none again: {status}"
    );
    let l = crate::agent::ledger_of(&sb, "timestep_embed", None);
    let a = l["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 2, "{l}");
    assert_eq!(a[0]["verdict_after"], "debug_red", "{l}");
    assert_eq!(a[1]["verdict_after"], "non_skip_pass", "{l}");
}

#[test]
fn a_kill_right_after_a_final_verdict_keeps_it() {
    let sb = Sandbox::new();
    crate::agent::example_repo(&sb, |t| keep_components(&t, &["decoder_norm"]));
    let out = submit_with(&sb, &[("FVD_CRASH_AT", "verdict-committed")]);
    assert!(killed(&out), "{}", said(&out));
    let out = submit_with(&sb, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "decoder_norm is red: {}",
        said(&out)
    );
    let status = sb.local_status("tinyport").unwrap();
    let c = component_of(&status, "decoder_norm");
    assert_eq!(
        (&c["status"], &c["runs"]),
        (&"blocked".into(), &1.into()),
        "a recorded verdict is never run again: {status}"
    );
}

#[test]
fn a_deleted_fvd_folder_stops_the_port_with_the_reason_and_writes_no_status() {
    let sb = Sandbox::new();
    let release = sb.repo().join("never-released");
    sb.port(
        "vanish",
        &[
            TestComponent::new("fast", "assert True"),
            TestComponent::new("slow", &blocks_until(&release)),
        ],
    );
    let child = fvd()
        .args(["submit", "--family", "vanish", "--wait", "--repo"])
        .arg(sb.repo())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(
        "fast recorded, slow running",
        Duration::from_secs(60),
        || {
            let rows = components(&sb.local_status("vanish")?);
            let fast = rows.iter().find(|r| r.0 == "fast")?;
            let slow = rows.iter().find(|r| r.0 == "slow")?;
            (fast.1 == "non_skip_pass" && slow.1 == "running").then_some(())
        },
    );
    std::fs::remove_dir_all(sb.repo().join(".fvd")).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        stdout.contains(".fvd was deleted while the port ran")
            && stdout.contains("submit the port again"),
        "{stdout}"
    );
    assert!(
        !sb.repo()
            .join("tests/local_tests/vanish/PORT_STATUS.md")
            .exists(),
        "no verdict of a port whose state went away reaches PORT_STATUS.md"
    );
}

#[test]
fn a_flood_of_output_is_stored_capped_with_its_head_and_tail() {
    let sb = Sandbox::new();
    // 40 MiB straight to stdout (pytest -s), then a last line.
    sb.port(
        "flood",
        &[TestComponent::new(
            "loud",
            "block = b'x' * (1 << 20)\nfor _ in range(40):\n    os.write(1, block)\nos.write(1, b'\\nthe-last-line\\n')",
        )],
    );
    let spec = sb.repo().join("tests/local_tests/flood/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap().replace(
        "[defaults]\n",
        "[defaults]\ncommand = [\"python3\", \"-B\", \"-m\", \"pytest\", \"{test}\", \"-q\", \"-s\", \"-p\", \"no:cacheprovider\", \"--junitxml={junitxml}\"]\n",
    );
    std::fs::write(&spec, text).unwrap();
    let out = fvd()
        .args(["submit", "--family", "flood", "--wait", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let logs = fvd()
        .args(["logs", "flood", "loud", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let stored = logs.stdout.len();
    let text = String::from_utf8_lossy(&logs.stdout);
    // The first 8 MiB and stdout's last 4 MiB (stderr's quarter unused),
    // never more than the 16 MiB cap.
    assert!(
        (12 << 20..(12 << 20) + 64 * 1024).contains(&stored),
        "{stored} bytes stored of 40 MiB"
    );
    assert!(
        text.contains("bytes of this run's stdout left out here") && text.contains("the-last-line"),
        "the marker and the tail: {}",
        &text[text.len().saturating_sub(300)..]
    );
}
