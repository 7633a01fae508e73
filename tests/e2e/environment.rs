//! An environment problem is not a component bug (issue #11): failures whose
//! cause lies outside the repository (a package that is not installed,
//! pytest itself missing) are grouped by worker and cause, never counted as
//! runs, never handed to an agent, and leave the port waiting for a fixed
//! environment; a module missing from the repository itself stays a code
//! error. Embedded mode refuses what its machine can never run, re-reads a
//! changed spec on resume, and can be cancelled and reset without an
//! orchestrator.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{Sandbox, TestComponent, components, fvd, wait_for};

/// A package no machine has installed.
const MISSING: &str = "fvd_e2e_not_installed_pkg";

fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(repo)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Appends `lines` to the `[[component]]` table of `component` in the spec.
fn edit_component(sb: &Sandbox, family: &str, component: &str, lines: &str) {
    let path = sb
        .repo()
        .join(format!("tests/local_tests/{family}/port.toml"));
    let spec = std::fs::read_to_string(&path).unwrap();
    let head = format!("name = \"{component}\"\n");
    let at = spec.find(&head).expect("component in spec") + head.len();
    let edited = format!("{}{lines}\n{}", &spec[..at], &spec[at..]);
    std::fs::write(&path, edited).unwrap();
}

fn submit(sb: &Sandbox, family: &str, extra: &[&str]) -> std::process::Output {
    fvd()
        .args(["submit", "--family", family, "--wait", "--repo"])
        .arg(sb.repo())
        .args(extra)
        .output()
        .expect("run fvd submit")
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn environment_failures_are_one_cause_never_a_run_and_never_an_agent_attempt() {
    let sb = Sandbox::new();
    sb.port(
        "envy",
        &[
            TestComponent::new("vae", &format!("import {MISSING}")),
            TestComponent::new("text_encoder", &format!("import {MISSING}.sub")),
            TestComponent::new("scheduler", "assert 1 + 1 == 2"),
            // A module of the repository's own package that does not exist:
            // the port's code is wrong, not the machine.
            TestComponent::new("transformer", "import portpkg.missing_module"),
            TestComponent::new("runner", "assert True"),
        ],
    );
    let repo = sb.repo();
    std::fs::create_dir_all(repo.join("portpkg")).unwrap();
    std::fs::write(repo.join("portpkg/__init__.py"), "").unwrap();
    // `vae` has an agent that must never be asked about an environment
    // failure; `runner` runs "pytest" through a module that is not
    // installed, as a machine without pytest does.
    let marker = repo.join("agent-ran");
    let spec_path = repo.join("tests/local_tests/envy/port.toml");
    let mut spec = std::fs::read_to_string(&spec_path).unwrap();
    spec.push_str(&format!(
        "\n[agent]\ncommand = [\"sh\", \"-c\", \"touch {}\"]\nmax_attempts = 2\n",
        marker.display()
    ));
    std::fs::write(&spec_path, spec).unwrap();
    edit_component(&sb, "envy", "vae", "agent = true");
    edit_component(
        &sb,
        "envy",
        "runner",
        &format!("command = [\"python3\", \"-m\", \"{MISSING}_pytest\", \"{{test}}\"]"),
    );
    git(repo, &["init", "-q"]);
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "port"]);

    let out = submit(&sb, "envy", &["--gpus", "none"]);
    let all = text(&out);
    assert_eq!(
        out.status.code(),
        Some(4),
        "paused for the environment: {all}"
    );
    let status = sb.local_status("envy").expect("status");
    assert_eq!(status["state"], "environment", "{status:#}");
    let rows = components(&status);
    let row = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
    for name in ["vae", "text_encoder", "runner"] {
        let (_, st, runs, _) = row(name);
        assert_eq!(
            (st.as_str(), runs),
            ("environment", 0),
            "{name} waits, uncounted: {status:#}"
        );
    }
    assert_eq!(row("scheduler").1, "non_skip_pass");
    // The port's own code error is the component's, named once.
    let transformer = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "transformer")
        .unwrap()
        .clone();
    assert_eq!(transformer["status"], "blocked", "{status:#}");
    let reason = transformer["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("debug_red: ")
            && reason.contains("No module named 'portpkg.missing_module'"),
        "{reason}"
    );
    // One line per worker and cause, not one blocker per component.
    let grouped = all
        .lines()
        .find(|l| l.starts_with("2 components could not run on worker "))
        .unwrap_or_else(|| panic!("grouped cause: {all}"));
    assert!(
        grouped.contains(&format!("No module named '{MISSING}")),
        "{grouped}"
    );
    assert!(
        all.lines()
            .any(|l| l.starts_with("1 component could not run on worker ")
                && l.contains(&format!("No module named '{MISSING}_pytest'"))
                && l.ends_with("(runner)")),
        "pytest missing is the environment too: {all}"
    );
    assert!(
        !marker.exists(),
        "the agent never ran on an environment failure"
    );
    // fvd's state never shows up as a change of the repository.
    assert_eq!(
        std::fs::read_to_string(repo.join(".fvd/.gitignore"))
            .unwrap()
            .lines()
            .last(),
        Some("*")
    );
    let porcelain = git(repo, &["status", "--porcelain"]);
    assert!(!porcelain.contains(".fvd"), "{porcelain}");

    // The environment is fixed (the package is installed where the worker
    // finds it): the next submit runs only what waited, once each.
    let site = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(site.path().join(MISSING)).unwrap();
    std::fs::write(site.path().join(MISSING).join("__init__.py"), "").unwrap();
    std::fs::write(site.path().join(MISSING).join("sub.py"), "").unwrap();
    let out = fvd()
        .args([
            "submit", "--family", "envy", "--wait", "--gpus", "none", "--repo",
        ])
        .arg(repo)
        .env("PYTHONPATH", site.path())
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(
        out.status.code(),
        Some(4),
        "runner still has no pytest, so the port waits again: {all}"
    );
    let status = sb.local_status("envy").unwrap();
    let rows = components(&status);
    let row = |name: &str| rows.iter().find(|r| r.0 == name).unwrap().clone();
    assert_eq!(row("vae").1, "non_skip_pass", "{status:#}");
    assert_eq!(row("vae").2, 1, "one counted run: {status:#}");
    assert_eq!(row("text_encoder").1, "non_skip_pass", "{status:#}");
    assert_eq!(row("scheduler").2, 1, "recorded verdicts are not rerun");
    assert!(!marker.exists(), "a pass needs no agent");
    // `runner` still has no pytest: it waits again, still uncounted.
    assert_eq!(row("runner").1, "environment", "{status:#}");
    assert_eq!(row("runner").2, 0);
}

#[test]
fn embedded_mode_refuses_what_this_machine_cannot_run_and_rereads_a_changed_spec() {
    let sb = Sandbox::new();
    sb.port(
        "gpuish",
        &[
            TestComponent::new("transformer", "assert True"),
            TestComponent::new("vae", "assert True"),
        ],
    );
    edit_component(&sb, "gpuish", "transformer", "gpus = 1");
    let out = submit(&sb, "gpuish", &["--gpus", "none"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let status = sb.local_status("gpuish").unwrap();
    let t = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "transformer")
        .unwrap()
        .clone();
    assert_eq!(t["status"], "blocked", "{status:#}");
    assert_eq!(t["runs"], 0, "never started: {status:#}");
    assert_eq!(
        t["reason"],
        "unplaced: needs 1 GPU; this machine has none: run it on a fleet or set gpus = 0"
    );
    assert!(
        all.lines().any(|l| l
            == "1 component cannot run on this machine: needs 1 GPU; this machine has none: run it on a fleet or set gpus = 0 (transformer)"),
        "{all}"
    );

    // The porter follows the advice: the resumed port re-reads its spec,
    // says what changed, and runs only that component again.
    let path = sb.repo().join("tests/local_tests/gpuish/port.toml");
    let spec = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, spec.replace("gpus = 1\n", "gpus = 0\n")).unwrap();
    let out = submit(&sb, "gpuish", &["--gpus", "none"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("spec changed: component transformer: gpus 1 -> 0; it runs again"),
        "{all}"
    );
    let status = sb.local_status("gpuish").unwrap();
    let rows = components(&status);
    assert!(
        rows.iter()
            .all(|(_, st, runs, _)| st == "non_skip_pass" && *runs == 1),
        "{rows:?}"
    );
}

#[test]
fn a_killed_submit_is_resumed_rerun_cancelled_and_reset_without_an_orchestrator() {
    let sb = Sandbox::new();
    let release = sb.repo().join("release");
    let started = sb.repo().join("started");
    sb.port(
        "stuck",
        &[TestComponent::new(
            "slow",
            &format!(
                "open({started:?}, 'w').write(str(os.getpid()))\ndeadline = time.time() + 60\nwhile not os.path.exists({release:?}):\n    assert time.time() < deadline, 'never released'\n    time.sleep(0.02)"
            ),
        )],
    );
    let spawn = |sb: &Sandbox| {
        fvd()
            .args([
                "submit", "--family", "stuck", "--wait", "--gpus", "none", "--repo",
            ])
            .arg(sb.repo())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let test_pid = |path: &Path| -> u32 {
        wait_for("the test to start", Duration::from_secs(30), || {
            std::fs::read_to_string(path).ok()?.trim().parse().ok()
        })
    };
    let gone = |pid: u32| !Path::new(&format!("/proc/{pid}")).exists();

    // A live submit is reached by `fvd cancel` through its run file: the
    // test it runs is ended and the submit exits.
    let mut first = spawn(&sb);
    let pid = test_pid(&started);
    let out = fvd()
        .args(["cancel", "stuck", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let code = first.wait().unwrap();
    assert_eq!(code.code(), Some(1), "the cancelled port ends blocked");
    wait_for("the cancelled test to end", Duration::from_secs(15), || {
        gone(pid).then_some(())
    });
    let status = sb.local_status("stuck").unwrap();
    assert_eq!(status["state"], "cancelled", "{status:#}");

    // A cancelled component has no verdict: the next submit runs it, and
    // a kill -9 of that submit leaves a port the next one resumes.
    std::fs::remove_file(&started).unwrap();
    let mut second = spawn(&sb);
    let pid = test_pid(&started);
    second.kill().unwrap();
    second.wait().unwrap();
    // no process runs it any more: status says so, not "running"
    let status = sb.local_status("stuck").unwrap();
    assert_eq!(status["state"], "interrupted", "{status:#}");
    // The orphaned test would hold the slot's work forever: end it as a
    // person would before trying again.
    let _ = Command::new("kill").arg(pid.to_string()).status();

    // With nobody running it, the port can be cancelled in place, rerun
    // without a cancel, and reset.
    std::fs::write(&release, "").unwrap();
    let out = fvd()
        .args([
            "submit", "--family", "stuck", "--wait", "--rerun", "--gpus", "none", "--repo",
        ])
        .arg(sb.repo())
        .output()
        .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("reran every component of port stuck"), "{all}");
    let out = fvd()
        .args(["cancel", "stuck", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("no fvd process was running it"),
        "{}",
        text(&out)
    );
    let out = fvd()
        .args(["reset", "stuck", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(sb.local_status("stuck").is_none(), "forgotten");
    let out = submit(&sb, "stuck", &["--gpus", "none"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("submitted port stuck"), "started over: {all}");
}

#[test]
fn a_failed_preflight_keeps_every_job_of_the_port_off_that_worker() {
    let sb = Sandbox::new();
    let ran = sb.repo().join("ran");
    let body = format!("open({ran:?}, 'a').write('x')");
    sb.port(
        "checked",
        &[
            TestComponent::new("a", &body),
            TestComponent::new("b", &body),
            TestComponent::new("c", &body),
        ],
    );
    let path = sb.repo().join("tests/local_tests/checked/port.toml");
    let spec = std::fs::read_to_string(&path).unwrap().replace(
        "[defaults]\n",
        &format!("[defaults]\npreflight = [\"python3\", \"-c\", \"import {MISSING}\"]\n"),
    );
    std::fs::write(&path, spec).unwrap();
    let out = submit(&sb, "checked", &["--gpus", "none"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(4), "{all}");
    assert!(
        !ran.exists(),
        "no parity test ran on a worker whose preflight failed"
    );
    let line = all
        .lines()
        .find(|l| l.starts_with("3 components could not run on worker "))
        .unwrap_or_else(|| panic!("one grouped cause: {all}"));
    assert!(
        line.contains(&format!("preflight `python3 -c import {MISSING}` failed (exit 1): ModuleNotFoundError: No module named '{MISSING}'")),
        "{line}"
    );
    let status = sb.local_status("checked").unwrap();
    assert!(
        components(&status)
            .iter()
            .all(|(_, st, runs, _)| st == "environment" && *runs == 0),
        "{status:#}"
    );
    // A worker started where the preflight passes takes them all.
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join(format!("{MISSING}.py")), "").unwrap();
    let out = fvd()
        .args([
            "submit", "--family", "checked", "--wait", "--gpus", "none", "--repo",
        ])
        .arg(sb.repo())
        .env("PYTHONPATH", site.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "xxx");
}
