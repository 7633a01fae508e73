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
fn strip_colours(text: &str) -> String {
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
    let disk = SmallDisk::mount(16);
    let mut sb = Sandbox::new();
    let release = sb.repo().join("release");
    sb.port(
        "fullish",
        &[
            TestComponent::new("first", &blocks_until(&release)),
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
    assert!(
        stdout.contains("cannot write its database") && stdout.contains("full"),
        "the reason is named: {stdout}"
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
    for name in ["first", "second"] {
        let r = rows.iter().find(|r| r.0 == name).unwrap();
        assert_eq!(
            (r.1.as_str(), r.2),
            ("non_skip_pass", 1),
            "{name}: one run, its verdict recorded, nothing rerun: {status}"
        );
    }
    assert_eq!(
        status["pause_reason"].as_str().unwrap_or(""),
        "",
        "{status}"
    );
    // Its output (pytest's, all of it written while the disk was full)
    // is there to its last line.
    let logs = fvd()
        .args(["logs", "fullish", "first", "--orchestrator", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(text.contains("1 passed"), "{text}");
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
