//! A pass comes from a run (issue #39): a component row set to
//! `non_skip_pass` in the state database by hand, over a red run, is an
//! integrity error naming the row for every reader, the resubmit ends
//! (no hang) without a pass, and `PORT_STATUS.md` never records it. The
//! same when the run's own row is forged too: its stored report is red.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Sandbox, TestComponent, fvd};

/// Runs `cmd`, killed at `limit`: a hang is a failure, never a wait.
fn bounded(mut cmd: Command, limit: Duration) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = child.id();
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
            panic!("hung for {:?}", start.elapsed());
        }
    }
}

fn sql(sb: &Sandbox, statement: &str) {
    let db = sb.repo().join(".fvd/state.db");
    let out = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); n = c.execute(sys.argv[2]).rowcount; c.commit(); assert n > 0, n",
        ])
        .arg(&db)
        .arg(statement)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn submit(sb: &Sandbox) -> (Option<i32>, String) {
    let mut cmd = fvd();
    cmd.args(["submit", "--family", "forge", "--wait", "--repo"])
        .arg(sb.repo());
    let out = bounded(cmd, Duration::from_secs(120));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn a_forged_pass_is_an_integrity_error_never_a_pass() {
    let sb = Sandbox::new();
    sb.port(
        "forge",
        &[
            TestComponent::new("good", "assert 1 == 1"),
            TestComponent::new("bad", "assert 1 == 2, 'off by one'"),
        ],
    );
    let (code, text) = submit(&sb);
    assert_eq!(code, Some(1), "{text}");
    let status_file = sb.repo().join("tests/local_tests/forge/PORT_STATUS.md");
    let before = std::fs::read_to_string(&status_file).unwrap();

    for (forge, says) in [
        (
            "UPDATE components SET status = 'non_skip_pass', verdict = 'non_skip_pass', error_kind = '' WHERE family = 'forge' AND name = 'bad'",
            "recorded debug_red",
        ),
        (
            "UPDATE jobs SET verdict = 'non_skip_pass', error_kind = '' WHERE family = 'forge' AND component = 'bad'",
            "reads debug_red",
        ),
    ] {
        sql(&sb, forge);
        let row = "state database integrity: component forge/bad reads non_skip_pass, but ";
        // Every reader refuses it, naming the row.
        let mut cmd = fvd();
        cmd.args(["status", "forge", "--repo"]).arg(sb.repo());
        let out = bounded(cmd, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains(row) && err.contains(says), "{err}");
        // The resubmit ends, without a pass.
        let (code, text) = submit(&sb);
        assert_ne!(code, Some(0), "{text}");
        assert!(text.contains(row), "{text}");
        // No line but the error's own reads as a pass of it.
        let shown: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("non_skip_pass") && !l.contains(row))
            .collect();
        assert!(
            !shown.iter().any(|l| l.contains("bad")),
            "{shown:?}\n{text}"
        );
        // PORT_STATUS.md was not rewritten with it.
        assert_eq!(std::fs::read_to_string(&status_file).unwrap(), before);
    }
}

/// Forged while the port runs: the component whose run is still going is
/// set to `non_skip_pass`. Readers refuse it meanwhile; its run's red
/// verdict then replaces the forgery, and the submit ends blocked.
#[test]
fn a_pass_forged_under_a_running_port_does_not_hang_it() {
    let sb = Sandbox::new();
    let release = sb.repo().join("release");
    let body = format!(
        "{}\nassert 1 == 2, 'off by one'",
        crate::port::blocks_until(&release)
    );
    sb.port("forge", &[TestComponent::new("slow", &body)]);
    let mut cmd = fvd();
    cmd.args(["submit", "--family", "forge", "--wait", "--repo"])
        .arg(sb.repo());
    let submit = std::thread::spawn(move || bounded(cmd, Duration::from_secs(120)));
    crate::support::wait_for("slow running", Duration::from_secs(60), || {
        let rows = crate::support::components(&sb.local_status("forge")?);
        rows.iter()
            .any(|r| r.0 == "slow" && r.1 == "running")
            .then_some(())
    });
    sql(
        &sb,
        "UPDATE components SET status = 'non_skip_pass', verdict = 'non_skip_pass' WHERE family = 'forge' AND name = 'slow'",
    );
    let mut cmd = fvd();
    cmd.args(["status", "forge", "--repo"]).arg(sb.repo());
    let out = bounded(cmd, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("component forge/slow reads non_skip_pass, but it has no finished run"),
        "{err}"
    );
    std::fs::write(&release, "go").unwrap();
    let out = submit.join().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    let rows = crate::support::components(&sb.local_status("forge").expect("status"));
    assert_eq!(rows[0].1, "blocked", "{rows:?}\n{text}");
    let status =
        std::fs::read_to_string(sb.repo().join("tests/local_tests/forge/PORT_STATUS.md")).unwrap();
    assert!(!status.contains("`non_skip_pass`"), "{status}");
}
