//! The port loop end to end through the real binary: embedded mode on the
//! example port, a fleet of real processes on loopback, kill -9 and resume,
//! and the gate's refusals.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::support::{Proxy, Sandbox, TestComponent, components, fvd, wait_for};

/// Copies a folder tree (the example port) so a test can write into it.
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == ".fvd" || name == "__pycache__" || name == ".pytest_cache" {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

pub(crate) fn status_of<'a>(
    rows: &'a [(String, String, u64, String)],
    name: &str,
) -> &'a (String, String, u64, String) {
    rows.iter()
        .find(|r| r.0 == name)
        .unwrap_or_else(|| panic!("component {name} missing from {rows:?}"))
}

#[test]
fn example_port_runs_embedded_end_to_end() {
    let sb = Sandbox::new();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    copy_tree(&example, sb.repo());
    let out = submit_embedded(&sb, "tinyport", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // One component skips and one fails numerically: the port is blocked.
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    let status = sb.local_status("tinyport").expect("status after the port");
    let rows = components(&status);
    assert_eq!(status_of(&rows, "embed").1, "non_skip_pass", "{rows:?}");
    assert_eq!(
        status_of(&rows, "transformer").1,
        "non_skip_pass",
        "{rows:?}"
    );
    assert_eq!(status_of(&rows, "vae").1, "blocked", "{rows:?}");
    assert_eq!(status_of(&rows, "decoder_norm").1, "blocked", "{rows:?}");
    // The agent components need a git repository for their worktrees;
    // this copy is in none (tests/e2e/agent.rs runs the loop in one).
    assert_eq!(status_of(&rows, "timestep_embed").1, "blocked", "{rows:?}");
    assert_eq!(status_of(&rows, "time_shift").1, "blocked", "{rows:?}");
    // Each component says its verdict and when its latest run started and
    // ended (issue #43), not only its reason.
    for c in status["components"].as_array().unwrap() {
        if c["name"] == "vae" {
            assert_eq!(c["verdict"], "scaffold_skip", "{c}");
        }
        if c["name"] == "embed" {
            assert_eq!(c["verdict"], "non_skip_pass", "{c}");
            let (start, end) = (
                c["run_started_ms"].as_i64().unwrap(),
                c["run_finished_ms"].as_i64().unwrap(),
            );
            assert!(start > 0 && end >= start, "{c}");
            assert_eq!(c["run_duration_ms"].as_i64(), Some(end - start), "{c}");
            assert!(c["updated_ms"].as_i64().unwrap() >= end, "{c}");
        }
    }
    assert!(
        stdout.contains(" runs=1 (") && stdout.contains(" s) 1 passed"),
        "the table says how long each run took:\n{stdout}"
    );
    // The gate's refusal names the blocked components and leaves their
    // reasons to the table: each is said once (issue #43).
    assert!(
        stdout.contains("are blocked (their lines below say why)"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("needs private dependency tinyport_private_ops")
            .count(),
        1,
        "{stdout}"
    );
    let reasons: Vec<&str> = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons.iter().any(|r| r.starts_with("scaffold_skip:")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.starts_with("debug_red:")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("is not inside a git repository")),
        "{reasons:?}"
    );
    assert_eq!(status["state"], "blocked");
    assert_eq!(status["phase"], "P7", "the gate refuses the pipeline phase");

    // PORT_STATUS.md is written through the contracts crate and reads back.
    let ps = sb.repo().join("tests/local_tests/tinyport/PORT_STATUS.md");
    let text = std::fs::read_to_string(&ps).expect("PORT_STATUS.md written");
    assert!(text.contains("## Parity Commands"), "{text}");
    assert!(text.contains("test_tinyport_embed_parity.py"), "{text}");
    let check = fvd()
        .args(["contracts", "check", "--json"])
        .arg(&ps)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&check.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&check.stdout)));
    assert_eq!(report["summary"]["model_family"], "tinyport", "{report}");
    let parity: Vec<(String, String)> = report["summary"]["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["parity"]
                    .as_str()
                    .unwrap_or_default()
                    .trim_matches('`')
                    .to_string(),
            )
        })
        .collect();
    assert!(
        parity.contains(&("embed".into(), "non_skip_pass".into())),
        "{parity:?}"
    );
    assert!(
        parity.contains(&("vae".into(), "scaffold_skip".into())),
        "{parity:?}"
    );
    assert!(
        parity.contains(&("decoder_norm".into(), "debug_red".into())),
        "{parity:?}"
    );

    // A second submit resumes: nothing is rerun, the same outcome comes back.
    let again = submit_embedded(&sb, "tinyport", &[]);
    assert_eq!(again.status.code(), Some(1));
    let rows = components(&sb.local_status("tinyport").unwrap());
    assert!(
        rows.iter()
            .all(|r| r.2 == 1 || (r.0.starts_with("time") && r.2 == 0)),
        "recorded verdicts must not rerun: {rows:?}"
    );

    // --rerun runs every component again; the first runs stay as history.
    let rerun = submit_embedded(&sb, "tinyport", &["--rerun"]);
    assert_eq!(rerun.status.code(), Some(1));
    let rows = components(&sb.local_status("tinyport").unwrap());
    assert!(
        rows.iter()
            .all(|r| r.2 == 2 || (r.0.starts_with("time") && r.2 == 0)),
        "every component ran a second time: {rows:?}"
    );
    let first = fvd()
        .args(["logs", "tinyport", "embed", "--run", "1", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(first.status.success(), "run 1 is still readable");

    // Logs of a run come back from the store.
    let logs = fvd()
        .args(["logs", "tinyport", "decoder_norm", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(logs.status.success());
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.contains("failed"),
        "pytest output of the red run: {logs}"
    );
}

#[test]
fn two_workers_run_components_at_the_same_time() {
    let mut sb = Sandbox::new();
    // Each test waits for the other's marker: both pass only if they run
    // concurrently, which one worker with one slot cannot do.
    let barrier = |me: &str, other: &str| {
        format!(
            "d = os.environ['BARRIER_DIR']\nopen(os.path.join(d, '{me}'), 'w').close()\ndeadline = time.time() + 30\nwhile not os.path.exists(os.path.join(d, '{other}')):\n    assert time.time() < deadline, 'the other component never ran concurrently'\n    time.sleep(0.02)\nassert os.environ['CUDA_VISIBLE_DEVICES'] == ''"
        )
    };
    let dir = sb.repo().join("barrier");
    std::fs::create_dir_all(&dir).unwrap();
    let a = barrier("a", "b").replace(
        "os.environ['BARRIER_DIR']",
        &format!("{:?}", dir.display().to_string()),
    );
    let b = barrier("b", "a").replace(
        "os.environ['BARRIER_DIR']",
        &format!("{:?}", dir.display().to_string()),
    );
    sb.port(
        "duo",
        &[
            TestComponent::new("left", &a),
            TestComponent::new("right", &b),
        ],
    );
    let url = sb.serve();
    sb.worker("w1", 1);
    sb.worker("w2", 1);
    let out = sb.submit_remote("duo", &["--wait"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status = fvd()
        .args(["status", "duo", "--json", "--orchestrator", &url])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let rows = components(&status);
    let mut workers: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    workers.sort();
    assert_eq!(
        workers,
        ["w1", "w2"],
        "one component on each worker: {rows:?}"
    );
    assert!(rows.iter().all(|r| r.1 == "non_skip_pass"), "{rows:?}");
}

#[test]
fn kill_dash_nine_then_resume_reruns_only_what_was_in_flight() {
    let sb = Sandbox::new();
    let gate = sb.repo().join("release-slow");
    let slow = format!(
        "deadline = time.time() + 30\nwhile not os.path.exists({:?}):\n    assert time.time() < deadline, 'never released'\n    time.sleep(0.02)",
        gate.display().to_string()
    );
    sb.port(
        "crashy",
        &[
            TestComponent::new("fast", "assert 1 + 1 == 2"),
            TestComponent::new("slow", &slow),
        ],
    );
    let mut child = fvd()
        .args(["submit", "--family", "crashy", "--wait", "--repo"])
        .arg(sb.repo())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until `fast` has its verdict recorded and `slow` is running.
    wait_for(
        "fast recorded and slow running",
        Duration::from_secs(60),
        || {
            let s = sb.local_status("crashy")?;
            let rows = components(&s);
            let fast = rows.iter().find(|r| r.0 == "fast")?;
            let slow = rows.iter().find(|r| r.0 == "slow")?;
            (fast.1 == "non_skip_pass" && slow.1 == "running").then_some(())
        },
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    std::fs::write(&gate, "go").unwrap();

    let out = submit_embedded(&sb, "crashy", &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("resumed port crashy"));
    let rows = components(&sb.local_status("crashy").unwrap());
    assert_resumed(&rows, "fast", "slow");
}

#[test]
fn malformed_spec_names_line_and_column() {
    let sb = Sandbox::new();
    sb.port("broken", &[TestComponent::new("x", "pass")]);
    let spec = sb.repo().join("tests/local_tests/broken/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&spec, text.replace("timeout_s = 60", "timeout_s = = 60")).unwrap();
    let line = text.lines().position(|l| l == "timeout_s = 60").unwrap() + 1;
    let out = submit_embedded(&sb, "broken", &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("port.toml:{line}:13:")),
        "error names file, line {line} and column 13: {err}"
    );
}

/// The reproduction of issue #14: a component name that climbs out of the
/// repository used to put the traced rerun's files wherever it pointed.
#[test]
fn a_component_name_that_leaves_the_repository_is_refused_before_anything_runs() {
    let sb = Sandbox::new();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    copy_tree(&example, sb.repo());
    let outside = tempfile::tempdir().unwrap();
    let escape = outside.path().join("esc");
    let climb = format!("{}{}", "../".repeat(12), escape.display());
    let spec = sb.repo().join("tests/local_tests/tinyport/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    let line = text
        .lines()
        .position(|l| l == "name = \"refiner\"")
        .unwrap()
        + 1;
    std::fs::write(
        &spec,
        text.replace("name = \"refiner\"", &format!("name = {climb:?}")),
    )
    .unwrap();
    let out = submit_embedded(&sb, "tinyport", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("port.toml:{line}:8: component name")),
        "{err}"
    );
    assert!(err.contains("is not an identifier"), "{err}");
    assert!(!escape.exists() && !sb.repo().join(".fvd/state.db").exists());
}

#[test]
fn missing_parity_test_is_a_gate_refusal_at_p2() {
    let sb = Sandbox::new();
    sb.port(
        "holey",
        &[
            TestComponent::new("here", "pass"),
            TestComponent::new("gone", "pass"),
        ],
    );
    std::fs::remove_file(
        sb.repo()
            .join("tests/local_tests/generic/test_holey_gone_parity.py"),
    )
    .unwrap();
    let out = submit_embedded(&sb, "holey", &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = sb.local_status("holey").unwrap();
    assert_eq!(status["state"], "blocked");
    assert_eq!(status["phase"], "P2");
    let refusal = status["gate"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["outcome"] == "refused")
        .expect("a recorded refusal");
    assert_eq!(refusal["phase"], "P2");
    let conditions = refusal["conditions"].to_string();
    assert!(
        conditions.contains("test_holey_gone_parity.py does not exist"),
        "{conditions}"
    );
    // Nothing ran.
    assert!(components(&status).iter().all(|r| r.2 == 0));
}

#[test]
fn a_report_not_written_or_unreadable_is_classified_from_its_status() {
    let sb = Sandbox::new();
    sb.port(
        "reportless",
        &[
            TestComponent::new("missing", "pass"),
            TestComponent::new("unreadable", "pass"),
        ],
    );
    // One run writes no report; the other makes a folder where the report
    // should be, so reading it fails.
    let spec = sb.repo().join("tests/local_tests/reportless/port.toml");
    let text = std::fs::read_to_string(&spec)
        .unwrap()
        .replace(
            "name = \"missing\"\n",
            "name = \"missing\"\ncommand = [\"python3\", \"-c\", \"print('ran')\", \"{junitxml}\"]\n",
        )
        .replace(
            "name = \"unreadable\"\n",
            "name = \"unreadable\"\ncommand = [\"python3\", \"-c\", \"import os, sys; os.mkdir(sys.argv[1])\", \"{junitxml}\"]\n",
        );
    std::fs::write(&spec, text).unwrap();
    let out = submit_embedded(&sb, "reportless", &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = sb.local_status("reportless").unwrap();
    let reason = |name: &str| {
        let c = status["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no component {name}: {status}"));
        assert_eq!(c["status"], "blocked", "{c}");
        c["reason"].as_str().unwrap_or_default().to_string()
    };
    let missing = reason("missing");
    assert!(missing.starts_with("error:junit_missing: "), "{missing}");
    let unreadable = reason("unreadable");
    assert!(
        unreadable.starts_with("error:junit_unreadable: "),
        "{unreadable}"
    );
}

#[test]
fn token_values_in_a_spec_are_refused_and_never_stored_or_echoed() {
    let sb = Sandbox::new();
    sb.port("leaky", &[TestComponent::new("x", "pass")]);
    let spec = sb.repo().join("tests/local_tests/leaky/port.toml");
    let secret = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
    let text = std::fs::read_to_string(&spec).unwrap().replace(
        "open_questions = \"none\"",
        &format!("open_questions = \"{secret}\""),
    );
    let line = text
        .lines()
        .position(|l| l.starts_with("open_questions"))
        .unwrap()
        + 1;
    std::fs::write(&spec, text).unwrap();
    let out = submit_embedded(&sb, "leaky", &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("port.toml:{line}: open_questions:")),
        "{stderr}"
    );
    let mut seen = format!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    // Nothing was stored either.
    if let Ok(db) = std::fs::read(sb.repo().join(".fvd/state.db")) {
        seen.push_str(&String::from_utf8_lossy(&db));
    }
    assert!(
        !seen.contains(secret),
        "the token value must not be echoed or stored"
    );
}

/// After a crash and resume: `recorded` kept its one run, `in_flight`
/// was rerun exactly once, and both passed.
fn assert_resumed(rows: &[(String, String, u64, String)], recorded: &str, in_flight: &str) {
    let r = status_of(rows, recorded);
    assert_eq!(
        (r.1.as_str(), r.2),
        ("non_skip_pass", 1),
        "a recorded verdict is not rerun"
    );
    let f = status_of(rows, in_flight);
    assert_eq!(
        (f.1.as_str(), f.2),
        ("non_skip_pass", 2),
        "the in-flight run is rerun once"
    );
}

/// `fvd submit --wait` of `family` in embedded mode, with `extra` flags.
fn submit_embedded(sb: &Sandbox, family: &str, extra: &[&str]) -> std::process::Output {
    fvd()
        .args(["submit", "--family", family, "--wait"])
        .args(extra)
        .arg("--repo")
        .arg(sb.repo())
        .output()
        .unwrap()
}

/// A test body that blocks until `release` exists (bounded, so a stray
/// process cannot hang the suite).
pub(crate) fn blocks_until(release: &Path) -> String {
    format!(
        "deadline = time.time() + 60\nwhile not os.path.exists({:?}):\n    assert time.time() < deadline, 'never released'\n    time.sleep(0.02)",
        release.display().to_string()
    )
}

#[test]
fn a_lost_worker_s_job_finishes_on_another_worker_with_one_verdict() {
    // A team's fleet: named credentials (`--auth`).
    let mut sb = Sandbox::new().with_auth();
    let release = sb.repo().join("release");
    sb.port(
        "lossy",
        &[TestComponent::new("only", &blocks_until(&release))],
    );
    sb.serve();
    sb.worker("w1", 1);
    sb.worker("w2", 1);
    let submit = sb.submit_remote("lossy", &[]);
    assert!(
        submit.status.success(),
        "{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    let first = wait_for(
        "the job running on a worker",
        Duration::from_secs(60),
        || {
            let rows = components(&sb.remote_status("lossy")?);
            let r = rows.into_iter().next()?;
            (r.1 == "running" && !r.3.is_empty()).then_some(r.3)
        },
    );
    sb.kill_worker(&first);
    let second = wait_for(
        "the job re-placed on the other worker",
        Duration::from_secs(60),
        || {
            let rows = components(&sb.remote_status("lossy")?);
            let r = rows.into_iter().next()?;
            (r.1 == "running" && r.3 != first).then_some(r.3)
        },
    );
    assert_ne!(first, second);
    std::fs::write(&release, "go").unwrap();
    let done = wait_for("the verdict", Duration::from_secs(60), || {
        let s = sb.remote_status("lossy")?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&done);
    assert_eq!(rows[0].1, "non_skip_pass", "{done}");
    assert_eq!(
        rows[0].2, 1,
        "a lost worker is not an attempt: one run, one verdict"
    );
    assert_eq!(rows[0].3, second);
}

#[test]
fn cancel_stops_a_running_port_and_its_job() {
    // A team's fleet: named credentials (`--auth`).
    let mut sb = Sandbox::new().with_auth();
    let never = sb.repo().join("never-created");
    let pidfile = sb.repo().join("pid");
    let body = format!(
        "open({:?}, 'w').write(str(os.getpid()))\n{}",
        pidfile.display().to_string(),
        blocks_until(&never)
    );
    sb.port("stoppy", &[TestComponent::new("stuck", &body)]);
    let url = sb.serve();
    sb.worker("w1", 1);
    let submit = sb.submit_remote("stoppy", &[]);
    assert!(submit.status.success());
    let pid: u32 = wait_for("the test process to start", Duration::from_secs(60), || {
        std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok()
    });
    let out = fvd()
        .args(["cancel", "stoppy", "--orchestrator", &url])
        .args(sb.token_args("porter"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_for("the port to end", Duration::from_secs(30), || {
        let s = sb.remote_status("stoppy")?;
        (s["state"] == "cancelled").then_some(s)
    });
    let rows = components(&status);
    assert_eq!(rows[0].1, "blocked", "{status}");
    // A second cancel says there is nothing left to cancel.
    let again = fvd()
        .args(["cancel", "stoppy", "--orchestrator", &url])
        .args(sb.token_args("porter"))
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not running here"));
    wait_for(
        "the test process to be killed",
        Duration::from_secs(30),
        || (!Path::new(&format!("/proc/{pid}")).exists()).then_some(()),
    );
}

#[test]
fn calls_without_the_token_are_refused_and_the_token_is_never_logged() {
    let mut sb = Sandbox::new();
    let token = "tok-7f3a9c1e5b2d4f6a8c0e";
    let token_file = sb.repo().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let tf = token_file.display().to_string();
    sb.port("guarded", &[TestComponent::new("ok", "assert True")]);
    let url = sb.serve_with(&["--token-file", &tf]);

    // A worker without the token is refused at registration and exits 6
    // (refused), not 2 (a usage error).
    let out = sb.worker_with("intruder", 1, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(6));
    assert!(
        sb.logs().contains("refused by the orchestrator"),
        "{}",
        sb.logs()
    );

    // So is a client, and a wrong token too.
    let out = fvd()
        .args(["status", "--orchestrator", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no token"));
    let wrong = sb.repo().join("wrong-token");
    std::fs::write(&wrong, "not-the-token").unwrap();
    let out = fvd()
        .args(["status", "--orchestrator", &url, "--token-file"])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token not known to this orchestrator"));

    // With the token (from an env var named on the command line), it works.
    let w = sb.worker_with("w1", 1, &["--token-env", "FVD_TEST_TOKEN"]);
    let mut w = w;
    w.env("FVD_TEST_TOKEN", token);
    sb.spawn_worker("w1", w);
    let out = sb.submit_remote("guarded", &["--wait", "--token-file", &tf]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = format!(
        "{}{}{}",
        sb.logs(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(token), "the token value must never be logged");
}

#[test]
fn logs_follow_streams_a_running_component_to_its_last_line() {
    let sb = Sandbox::new();
    let release = sb.repo().join("release");
    let body = format!(
        "print('first-line', flush=True)\n{}\nprint('last-line', flush=True)",
        blocks_until(&release)
    );
    sb.port("chatty", &[TestComponent::new("talk", &body)]);
    // `-s` so pytest lets the test's output through as it happens.
    let spec = sb.repo().join("tests/local_tests/chatty/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap().replace(
        "timeout_s = 60",
        "timeout_s = 60\ncommand = [\"python3\", \"-m\", \"pytest\", \"{test}\", \"-q\", \"-s\", \"-p\", \"no:cacheprovider\", \"--junitxml={junitxml}\"]",
    );
    std::fs::write(&spec, text).unwrap();
    let mut submit = fvd()
        .args(["submit", "--family", "chatty", "--wait", "--repo"])
        .arg(sb.repo())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the component running", Duration::from_secs(60), || {
        let rows = components(&sb.local_status("chatty")?);
        (rows[0].1 == "running").then_some(())
    });
    let out_path = sb.repo().join("follow.out");
    let mut follow = fvd()
        .args(["logs", "chatty", "talk", "--follow", "--repo"])
        .arg(sb.repo())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .spawn()
        .unwrap();
    wait_for("the first line streamed", Duration::from_secs(60), || {
        std::fs::read_to_string(&out_path)
            .ok()?
            .contains("first-line")
            .then_some(())
    });
    std::fs::write(&release, "go").unwrap();
    let status = wait_for(
        "logs --follow to end with the run",
        Duration::from_secs(60),
        || follow.try_wait().unwrap(),
    );
    assert!(status.success());
    let text = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        text.contains("last-line"),
        "the last line before the end is there: {text}"
    );
    assert_eq!(submit.wait().unwrap().code(), Some(0));
}

#[test]
fn an_orchestrator_restart_with_workers_connected_loses_no_job() {
    // A team's fleet: named credentials (`--auth`).
    let mut sb = Sandbox::new().with_auth();
    let release = sb.repo().join("release");
    sb.port(
        "restarty",
        &[
            TestComponent::new("done", "assert True"),
            TestComponent::new("inflight", &blocks_until(&release)),
        ],
    );
    // A fixed address, so the worker finds the restarted orchestrator.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    sb.serve_at(&addr, &[]);
    sb.worker("w1", 2);
    let submit = sb.submit_remote("restarty", &[]);
    assert!(submit.status.success());
    wait_for(
        "done recorded and inflight running",
        Duration::from_secs(60),
        || {
            let rows = components(&sb.remote_status("restarty")?);
            let done = rows.iter().find(|r| r.0 == "done")?;
            let inflight = rows.iter().find(|r| r.0 == "inflight")?;
            (done.1 == "non_skip_pass" && inflight.1 == "running").then_some(())
        },
    );
    sb.kill_orchestrator();
    sb.serve_at(&addr, &[]);
    // The worker kept running the run in flight; the restarted
    // orchestrator adopts it (same job, same epoch) instead of cancelling
    // it and running it again.
    wait_for("the in-flight run adopted", Duration::from_secs(60), || {
        sb.orchestrator_log()
            .contains("adopted a run in flight")
            .then_some(())
    });
    std::fs::write(&release, "go").unwrap();
    let status = wait_for("the port to end", Duration::from_secs(60), || {
        let s = sb.remote_status("restarty")?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&status);
    for name in ["done", "inflight"] {
        let r = status_of(&rows, name);
        assert_eq!(
            (r.1.as_str(), r.2),
            ("non_skip_pass", 1),
            "{name}: one run, not rerun: {status}"
        );
    }
    let log = sb.orchestrator_log();
    assert!(
        !log.contains("lease it does not hold") && !log.contains("no longer holds"),
        "the run in flight was not cancelled: {log}"
    );
}

#[test]
fn a_drained_worker_finishes_its_job_takes_no_new_one_and_exits() {
    let mut sb = Sandbox::new();
    let release = sb.repo().join("release");
    // Both block until released: with one slot, one runs and one waits.
    sb.port(
        "drainy",
        &[
            TestComponent::new("a", &blocks_until(&release)),
            TestComponent::new("b", &blocks_until(&release)),
        ],
    );
    sb.serve();
    sb.worker("w1", 1);
    let submit = sb.submit_remote("drainy", &[]);
    assert!(submit.status.success());
    let (on_w1, waiting) = wait_for(
        "one running on w1, one queued",
        Duration::from_secs(60),
        || {
            let rows = components(&sb.remote_status("drainy")?);
            let running = rows.iter().find(|r| r.1 == "running" && r.3 == "w1")?;
            let queued = rows.iter().find(|r| r.1 == "queued")?;
            Some((running.0.clone(), queued.0.clone()))
        },
    );
    let out = fvd()
        .args(["worker", "drain", "--workspace"])
        .arg(sb.repo().join("ws-w1"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        "the drain to reach the orchestrator",
        Duration::from_secs(30),
        || sb.logs().contains("worker drains").then_some(()),
    );
    std::fs::write(&release, "go").unwrap();
    let exit = sb.wait_worker_exit("w1", Duration::from_secs(60));
    assert!(exit.success(), "a drained worker exits cleanly: {exit:?}");
    let rows = components(&sb.remote_status("drainy").unwrap());
    let done = status_of(&rows, &on_w1);
    assert_eq!(
        (done.1.as_str(), done.2),
        ("non_skip_pass", 1),
        "the running job finished and was reported once"
    );
    assert_eq!(
        status_of(&rows, &waiting).1,
        "queued",
        "nothing new went to the draining worker"
    );
    sb.worker("w2", 1);
    let status = wait_for("the port to end", Duration::from_secs(60), || {
        let s = sb.remote_status("drainy")?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&status);
    let later = status_of(&rows, &waiting);
    assert_eq!(
        (later.1.as_str(), later.2, later.3.as_str()),
        ("non_skip_pass", 1, "w2"),
        "{status}"
    );
}

#[test]
fn a_partitioned_worker_s_late_result_is_fenced() {
    // A team's fleet: named credentials (`--auth`).
    let mut sb = Sandbox::new().with_auth();
    let release = sb.repo().join("release");
    sb.port(
        "split",
        &[TestComponent::new("only", &blocks_until(&release))],
    );
    let url = sb.serve_with(&["--lease-ttl", "1.5"]);
    // w1 reaches the orchestrator through a proxy the test can stall.
    let proxy = Proxy::start(url.trim_start_matches("http://"));
    let w1 = sb.worker_at(&proxy.url(), "w1", 1, &[]);
    sb.spawn_worker("w1", w1);
    let submit = sb.submit_remote("split", &[]);
    assert!(submit.status.success());
    wait_for("the job running on w1", Duration::from_secs(60), || {
        let rows = components(&sb.remote_status("split")?);
        (rows[0].1 == "running" && rows[0].3 == "w1").then_some(())
    });
    sb.worker("w2", 1);
    // Partition w1: silence both ways, connections stay open.
    proxy.pause(true);
    wait_for(
        "the lease to expire and the job to move to w2",
        Duration::from_secs(60),
        || {
            let rows = components(&sb.remote_status("split")?);
            (rows[0].1 == "running" && rows[0].3 == "w2").then_some(())
        },
    );
    // Both copies finish; only w2's result may count.
    std::fs::write(&release, "go").unwrap();
    let status = wait_for("the verdict from w2", Duration::from_secs(60), || {
        let s = sb.remote_status("split")?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&status);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2, rows[0].3.as_str()),
        ("non_skip_pass", 1, "w2"),
        "{status}"
    );
    // The partition heals: w1's late result arrives under its old epoch.
    proxy.pause(false);
    wait_for(
        "w1's late result to be fenced",
        Duration::from_secs(60),
        || {
            sb.logs()
                .contains("rejected a message with a stale or unknown lease")
                .then_some(())
        },
    );
    let rows = components(&sb.remote_status("split").unwrap());
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2, rows[0].3.as_str()),
        ("non_skip_pass", 1, "w2"),
        "exactly one verdict"
    );
}

#[test]
fn a_tls_orchestrator_serves_verified_clients_only() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut sb = Sandbox::new();
    // A CA of the test's own and a server certificate for 127.0.0.1.
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let dir = sb.repo().to_path_buf();
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&ca, ca_cert.pem()).unwrap();
    std::fs::write(&cert, server_cert.pem()).unwrap();
    std::fs::write(&key, server_key.serialize_pem()).unwrap();
    let (ca, cert, key) = (
        ca.display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
    );

    sb.port("secure", &[TestComponent::new("ok", "assert True")]);
    let url = sb.serve_with(&["--tls-cert", &cert, "--tls-key", &key]);
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    // Plain http to the TLS listener finds no orchestrator it can talk to
    // (exit 5, naming the URL); https without the CA is refused before
    // dialling.
    let plain = url.replacen("https://", "http://", 1);
    let out = fvd()
        .args(["status", "--orchestrator", &plain])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("cannot reach the orchestrator at {plain}")),
        "{out:?}"
    );
    let out = fvd()
        .args(["status", "--orchestrator", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-ca"));

    // With the CA, a worker and a client work end to end.
    let w = sb.worker_with("w1", 1, &["--tls-ca", &ca]);
    sb.spawn_worker("w1", w);
    let out = sb.submit_remote("secure", &["--wait", "--tls-ca", &ca]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
