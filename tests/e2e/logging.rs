//! What the servers log (issue #34, logging): at info by default, one line
//! per event and nothing per heartbeat or poll, plain text with no colour
//! codes when stderr is a file, one JSON object per line with
//! `--log-format json`, and never a token's value.

use std::time::Duration;

use crate::support::{Sandbox, TestComponent, components, fvd, wait_for};

/// `last_seen_ms` of worker `id` as `fvd workers` reports it.
fn last_seen(sb: &Sandbox, id: &str) -> Option<i64> {
    let out = fvd()
        .args(["workers", "--json", "--orchestrator"])
        .arg(sb.url.as_deref()?)
        .args(sb.token_args("viewer"))
        .output()
        .expect("run fvd workers");
    let fleet: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    fleet["workers"]
        .as_array()?
        .iter()
        .find(|w| w["worker_id"] == id)?["last_seen_ms"]
        .as_i64()
}

/// Waits (bounded) until the orchestrator has had `n` more heartbeats from
/// worker `id` (one a second) than it had when called.
fn heartbeats(sb: &Sandbox, id: &str, n: i64) {
    let from = wait_for(
        "the worker's last heartbeat",
        Duration::from_secs(30),
        || last_seen(sb, id),
    );
    wait_for(
        &format!("{n} more heartbeats of {id}"),
        Duration::from_secs(30),
        || last_seen(sb, id).filter(|t| *t >= from + n * 1000),
    );
}

fn lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| !l.trim().is_empty()).collect()
}

#[test]
fn servers_log_info_as_one_json_object_a_line_with_no_token_and_no_heartbeat_flood() {
    let mut sb = Sandbox::new()
        .with_auth()
        .with_default_logs(&["--log-format", "json"]);
    sb.port("jsonlog", &[TestComponent::new("ok", "assert True")]);
    sb.serve();
    sb.worker("w1", 1);
    let submit = sb.submit_remote("jsonlog", &["--wait"]);
    assert!(
        submit.status.success(),
        "{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    let status = sb.remote_status("jsonlog").expect("status of the port");
    assert_eq!(components(&status)[0].1, "non_skip_pass", "{status}");
    // Whatever the end of the port still logs is out after two
    // heartbeats; from then on an idle fleet logs nothing at info, however
    // many heartbeats and scheduler ticks pass.
    heartbeats(&sb, "w1", 2);
    let before = (sb.orchestrator_log(), sb.worker_log("w1"));
    heartbeats(&sb, "w1", 3);
    let after = (sb.orchestrator_log(), sb.worker_log("w1"));
    assert_eq!(
        lines(&before.0).len(),
        lines(&after.0).len(),
        "the orchestrator logged while idle:\n{}",
        &after.0[before.0.len()..]
    );
    assert_eq!(
        lines(&before.1).len(),
        lines(&after.1).len(),
        "the worker logged while idle:\n{}",
        &after.1[before.1.len()..]
    );
    let mut messages = Vec::new();
    for (who, log) in [("orchestrator", &after.0), ("worker", &after.1)] {
        assert!(!lines(log).is_empty(), "the {who} logged nothing at info");
        for line in lines(log) {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a {who} log line is not JSON ({e}): {line}"));
            let level = v["level"].as_str().unwrap_or_default();
            assert!(
                ["INFO", "WARN", "ERROR"].contains(&level),
                "the {who} logs at info by default, not {level}: {line}"
            );
            assert!(v["timestamp"].is_string(), "{line}");
            assert!(v["target"].is_string(), "{line}");
            messages.push(v["message"].as_str().unwrap_or_default().to_string());
        }
    }
    for expected in ["orchestrator listening", "worker registered", "job started"] {
        assert!(
            messages.iter().any(|m| m == expected),
            "no {expected:?} among {messages:?}"
        );
    }
    let all = sb.logs();
    for token in sb.auth.as_ref().unwrap().tokens() {
        assert!(!all.contains(&token), "a token's value is in the logs");
    }

    // What a server says to a person is a JSON event too (issue #43): a
    // credentials reload (SIGHUP), and a worker's last error as it exits.
    let pid = nix::unistd::Pid::from_raw(sb.orchestrator_pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for("the reload's line", Duration::from_secs(20), || {
        sb.orchestrator_log()
            .contains("reloaded the credentials")
            .then_some(())
    });
    let wrong = sb.dir.path().join("wrong.token");
    std::fs::write(&wrong, "fvd_not_a_known_token_0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let refused = fvd()
        .args(["--log-format", "json", "worker", "--orchestrator"])
        .arg(sb.url.as_deref().unwrap())
        .args(["--gpus", "none", "--worker-id", "w9", "--workspace"])
        .arg(sb.dir.path().join("ws-w9"))
        .arg("--token-file")
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(6), "{refused:?}");
    let worker_err = String::from_utf8_lossy(&refused.stderr).into_owned();
    let mut last = serde_json::Value::Null;
    for (who, text) in [
        ("orchestrator", sb.orchestrator_log()),
        ("refused worker", worker_err.clone()),
    ] {
        for line in lines(&text) {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a {who} stderr line is not JSON ({e}): {line}"));
            assert!(
                v["timestamp"].is_string() && v["level"].is_string(),
                "{line}"
            );
            if who == "refused worker" {
                last = v;
            }
        }
    }
    assert_eq!(last["level"], "ERROR", "{worker_err}");
    assert!(
        last["message"]
            .as_str()
            .unwrap_or_default()
            .contains("refused"),
        "{worker_err}"
    );
}

#[test]
fn a_server_logging_to_a_file_writes_plain_text_lines_without_colour() {
    let mut sb = Sandbox::new().with_auth().with_default_logs(&[]);
    sb.serve();
    sb.worker("w1", 1);
    // Each side logs the registration: the orchestrator's line may come
    // before the worker's.
    wait_for("the worker registered", Duration::from_secs(30), || {
        (sb.orchestrator_log().contains("worker registered")
            && sb.worker_log("w1").contains("registered"))
        .then_some(())
    });
    for (who, log) in [
        ("orchestrator", sb.orchestrator_log()),
        ("worker", sb.worker_log("w1")),
    ] {
        assert!(
            !log.contains('\x1b'),
            "the {who}'s log file has colour codes:\n{log}"
        );
        let lines = lines(&log);
        assert!(
            lines.iter().any(|l| l.contains(" INFO ")),
            "the {who} logs at info by default:\n{log}"
        );
        for line in lines {
            assert!(
                serde_json::from_str::<serde_json::Value>(line).is_err(),
                "text is the default format, not JSON: {line}"
            );
            assert!(!line.contains(" DEBUG "), "{line}");
        }
    }
    let all = sb.logs();
    for token in sb.auth.as_ref().unwrap().tokens() {
        assert!(!all.contains(&token), "a token's value is in the logs");
    }

    // And what it says to a person is a plain line there: the
    // credentials reload (SIGHUP).
    let pid = nix::unistd::Pid::from_raw(sb.orchestrator_pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for("the reload's line", Duration::from_secs(20), || {
        sb.orchestrator_log()
            .contains("fvd: reloaded the credentials (SIGHUP): ")
            .then_some(())
    });
}
