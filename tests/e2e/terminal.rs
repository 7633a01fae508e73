//! The terminal surface of the binary (issue #34): `fvd --version` names
//! the commit it was built from, `fvd completions` prints scripts a shell
//! accepts, `fvd man` writes roff pages naming every subcommand, and
//! `fvd logs --follow` exits with its run's outcome (`--json`: one object
//! a line).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::port::blocks_until;
use crate::support::{Sandbox, TestComponent, components, fvd, wait_for};

fn stdout(args: &[&str]) -> String {
    let out = fvd().args(args).output().expect("run fvd");
    assert!(
        out.status.success(),
        "fvd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn version_names_the_package_version_the_commit_and_the_build_day() {
    let text = stdout(&["--version"]);
    let line = text.trim();
    let rest = line
        .strip_prefix(&format!("fvd {} (commit ", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("no version and commit: {line}"));
    let head = std::process::Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let (commit, built) = rest.split_once(", built ").expect("a build day");
    match head {
        // Built in this checkout: its HEAD, `-dirty` or not.
        Some(sha) => assert!(
            commit == sha || commit == format!("{sha}-dirty"),
            "HEAD is {sha}: {line}"
        ),
        None => assert_eq!(commit, "unknown", "{line}"),
    }
    let day = built.strip_suffix(')').expect("closing parenthesis");
    let parts: Vec<&str> = day.split('-').collect();
    assert!(
        parts.len() == 3
            && [4, 2, 2]
                .iter()
                .zip(&parts)
                .all(|(n, p)| p.len() == *n && p.bytes().all(|b| b.is_ascii_digit())),
        "the build day is YYYY-MM-DD: {line}"
    );
    assert_eq!(stdout(&["-V"]), text, "-V says the same");
}

/// The top-level subcommands `fvd --help` lists.
fn subcommands() -> Vec<String> {
    let help = stdout(&["--help"]);
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect();
    assert!(
        names.iter().any(|n| n == "submit") && names.iter().any(|n| n == "man"),
        "the help lists the subcommands: {names:?}\n{help}"
    );
    names
}

/// The first line of a roff page after the string definitions clap_mangen
/// puts before its title (`.ie`/`.el`).
fn title(page: &str) -> &str {
    page.lines()
        .find(|l| !l.starts_with(".ie ") && !l.starts_with(".el "))
        .unwrap_or_default()
}

#[test]
fn the_bash_completion_script_parses_and_completes_the_subcommands() {
    let script = stdout(&["completions", "bash"]);
    assert!(script.contains("submit"), "{script}");
    assert!(script.contains("--log-format"), "global flags complete too");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fvd.bash");
    std::fs::write(&path, &script).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("run bash -n");
    assert!(
        check.status.success(),
        "bash -n refused the script: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shell in ["zsh", "fish"] {
        let script = stdout(&["completions", shell]);
        assert!(script.contains("submit"), "{shell}: {script}");
    }
    let bad = fvd().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("tcsh"));
}

#[test]
fn the_man_page_is_roff_and_names_every_subcommand() {
    let page = stdout(&["man"]);
    assert!(
        title(&page).starts_with(".TH fvd 1 "),
        "not a roff page: {page}"
    );
    for name in subcommands() {
        assert!(
            page.contains(&format!("fvd\\-{name}(1)")),
            "the page does not name fvd-{name}"
        );
    }
    assert!(!page.contains("fvd\\-help(1)"), "no page for help exists");
    // Issue #43: the page and `--help` say the exit statuses and the
    // variables fvd reads.
    let help = stdout(&["--help"]);
    for (section, help_heading, items) in [
        (
            ".SH \"EXIT STATUS\"",
            "Exit status:",
            &["0", "3", "5", "6", "125"][..],
        ),
        (
            ".SH ENVIRONMENT",
            "Environment:",
            &["FVD_ORCHESTRATOR", "FVD_TOKEN_FILE", "FVD_LOG"][..],
        ),
    ] {
        let at = page
            .find(section)
            .unwrap_or_else(|| panic!("no {section}: {page}"));
        assert!(help.contains(help_heading), "{help}");
        for item in items {
            assert!(
                page[at..].contains(&format!("\\fB{item}\\fR")),
                "{section} lacks {item}"
            );
            assert!(help.contains(item), "--help lacks {item}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let out = fvd()
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in subcommands()
        .iter()
        .map(|n| format!("fvd-{n}"))
        .chain(["fvd".into(), "fvd-orchestrator-serve".into()])
    {
        let text = std::fs::read_to_string(dir.path().join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("no page {name}.1: {e}"));
        assert!(
            title(&text).starts_with(&format!(".TH {name} 1 ")),
            "{name}.1: {text}"
        );
    }
    let missing = dir.path().join("missing");
    let out = fvd().args(["man", "--dir"]).arg(&missing).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&missing.display().to_string()),
        "the error names the folder"
    );
}

/// Runs the port's tests with `-s`, so pytest lets their output through
/// as it happens (a follower sees it before the run ends).
fn unbuffered(repo: &std::path::Path, family: &str) {
    let spec = repo.join(format!("tests/local_tests/{family}/port.toml"));
    let text = std::fs::read_to_string(&spec).unwrap().replace(
        "timeout_s = 60",
        "timeout_s = 60\ncommand = [\"python3\", \"-m\", \"pytest\", \"{test}\", \"-q\", \"-s\", \"-p\", \"no:cacheprovider\", \"--junitxml={junitxml}\"]",
    );
    std::fs::write(&spec, text).unwrap();
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object ({e}): {l}"))
        })
        .collect()
}

/// The stdout chunks of `fvd logs --json` output, in order, joined; a
/// line still being written (no newline yet) is left out.
fn streamed_stdout(text: &str) -> String {
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|c| c["stream"] == "stdout")
        .filter_map(|c| c["text"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn logs_follow_exits_with_a_red_run_s_status_and_json_is_one_object_a_line() {
    let sb = Sandbox::new();
    let release = sb.repo().join("release");
    let red = format!(
        "print('first-line', flush=True)\n{}\nprint('last-line', flush=True)\nassert False, 'red on purpose'",
        blocks_until(&release)
    );
    sb.port(
        "redlog",
        &[
            TestComponent::new("red", &red),
            TestComponent::new("green", "print('green-line')"),
        ],
    );
    unbuffered(sb.repo(), "redlog");
    let mut submit = fvd()
        .args(["submit", "--family", "redlog", "--wait", "--repo"])
        .arg(sb.repo())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("red running", Duration::from_secs(60), || {
        let rows = components(&sb.local_status("redlog")?);
        (rows.iter().find(|r| r.0 == "red")?.1 == "running").then_some(())
    });
    // Followed live, as JSON: the run, each chunk, the run as it ended.
    let out_path = sb.repo().join("follow.jsonl");
    let mut follow = fvd()
        .args(["logs", "redlog", "red", "--follow", "--json", "--repo"])
        .arg(sb.repo())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .spawn()
        .unwrap();
    // The stdout chunks put together: a line may come in two chunks (the
    // streaming redactor holds back a tail that could begin a secret until
    // the next bytes show it does not).
    wait_for("the first line streamed", Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&out_path).ok()?;
        streamed_stdout(&text).contains("first-line").then_some(())
    });
    std::fs::write(&release, "go").unwrap();
    let status = wait_for(
        "logs --follow to end with the run",
        Duration::from_secs(60),
        || follow.try_wait().unwrap(),
    );
    let text = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "a red run's follower exits 1, as fvd status --exit-status does: {text}"
    );
    let lines = json_lines(&text);
    assert!(lines.len() >= 3, "{text}");
    assert_eq!(lines[0]["run"]["component"], "red", "{text}");
    assert_eq!(lines[0]["run"]["state"], "running", "{text}");
    let end = &lines[lines.len() - 1]["end"];
    assert_eq!(end["state"], "finished", "{text}");
    assert_ne!(end["verdict"], "non_skip_pass", "{text}");
    let chunks = &lines[1..lines.len() - 1];
    assert!(
        chunks.iter().all(|c| ["stdout", "stderr"]
            .contains(&c["stream"].as_str().unwrap_or_default())
            && c["text"].is_string()),
        "{text}"
    );
    let stdout = streamed_stdout(&text);
    let (first, last) = (
        stdout.find("first-line").expect("first line"),
        stdout.find("last-line").expect("last line"),
    );
    assert!(first < last, "{stdout}");
    assert_eq!(submit.wait().unwrap().code(), Some(1), "the port is red");

    // Followed after the end: the same statuses, red 1 and green 0.
    let logs = |component: &str, extra: &[&str]| {
        fvd()
            .args(["logs", "redlog", component, "--repo"])
            .arg(sb.repo())
            .args(extra)
            .output()
            .unwrap()
    };
    let red = logs("red", &["--follow"]);
    assert_eq!(red.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&red.stdout).contains("last-line"));
    let green = logs("green", &["--follow"]);
    assert_eq!(green.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&green.stdout).contains("green-line"));
    // Without --follow the command reports, and exits 0 either way.
    let shown = logs("red", &["--json"]);
    assert_eq!(shown.status.code(), Some(0));
    let lines = json_lines(&String::from_utf8_lossy(&shown.stdout));
    assert_eq!(lines[0]["run"], lines[lines.len() - 1]["end"]);
}

/// Every `fvd …` command quoted in backticks in `text`.
fn quoted_commands(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|q| q.starts_with("fvd "))
        .map(str::to_string)
        .collect()
}

/// `hint` run as a person pastes it: by `sh -c` from another folder, with
/// the `fvd` under test first on `PATH`.
fn paste(hint: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let bin = Path::new(env!("CARGO_BIN_EXE_fvd"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let elsewhere = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("sh")
        .args(["-c", hint])
        .current_dir(elsewhere.path())
        .env("PATH", path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{hint}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The hints fvd prints are commands a newcomer pastes as they are, from
/// any folder: the answer of a paused embedded port (with `--repo`), the
/// same on a fleet with named credentials (with `--orchestrator` and
/// `--token-file`), and the worker `submit --wait` suggests when none is
/// connected. Each is run by a shell and does what it says.
#[test]
fn every_hint_pasted_into_a_shell_works() {
    // Embedded: the example pauses on time_shift's question.
    let sb = Sandbox::new();
    crate::agent::example_repo(&sb, |t| t);
    let out = fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(3), "{text}");
    let answers: Vec<String> = quoted_commands(&text)
        .into_iter()
        .filter(|c| c.starts_with("fvd answer "))
        .collect();
    assert_eq!(answers.len(), 1, "one answer hint: {text}");
    assert!(answers[0].contains(" --repo "), "{}", answers[0]);
    let (code, said) = paste(&answers[0], &[]);
    assert!(
        matches!(code, Some(0 | 1)),
        "the pasted answer resumes the port to its end: {said}"
    );
    let status = sb.local_status("tinyport").unwrap();
    assert!(
        status["escapes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["status"] != "open"),
        "{status}"
    );

    // A fleet with named credentials and no worker: `submit --wait` says
    // which worker to start; pasted, it takes the run.
    let mut fleet = Sandbox::new().with_auth();
    fleet.port("pasted", &[TestComponent::new("a", "assert True")]);
    let url = fleet.serve();
    let err_path = fleet.dir.path().join("submit.err");
    let mut waiting = fvd()
        .args([
            "submit",
            "--family",
            "pasted",
            "--wait",
            "--orchestrator",
            &url,
        ])
        .args(fleet.token_args("porter"))
        .arg("--repo")
        .arg(fleet.repo())
        .env_remove("FVD_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let said = wait_for("the worker hint", Duration::from_secs(60), || {
        let t = std::fs::read_to_string(&err_path).ok()?;
        t.contains("no worker is connected").then_some(t)
    });
    let workers: Vec<String> = quoted_commands(&said)
        .into_iter()
        .filter(|c| c.starts_with("fvd worker "))
        .collect();
    assert_eq!(workers.len(), 1, "{said}");
    // The hint never names the porter's token file (a worker may not use
    // it): it leaves a placeholder for a worker credential, the one thing
    // a person fills in (issue #43).
    let auth = fleet.auth.clone().unwrap();
    let porter = auth.token("porter").display().to_string();
    assert!(!workers[0].contains(&porter), "{}", workers[0]);
    assert!(workers[0].contains("WORKER_TOKEN_FILE"), "{}", workers[0]);
    let hint = workers[0].replace(
        "WORKER_TOKEN_FILE",
        &auth.token("fleet").display().to_string(),
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_fvd"))
        .parent()
        .unwrap()
        .to_path_buf();
    let cwd = tempfile::tempdir().unwrap();
    let mut worker = std::process::Command::new("sh")
        .args(["-c", &format!("exec {hint}")])
        .current_dir(cwd.path())
        // the hint's workspace is `$HOME/fvd-worker`
        .env("HOME", cwd.path())
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(fleet.dir.path().join("pasted-worker.log")).unwrap())
        .spawn()
        .unwrap();
    let code = wait_for("the submit to end", Duration::from_secs(60), || {
        waiting.try_wait().unwrap()
    });
    let _ = worker.kill();
    let _ = worker.wait();
    assert_eq!(
        code.code(),
        Some(0),
        "{}\nthe pasted worker said:\n{}",
        std::fs::read_to_string(&err_path).unwrap(),
        std::fs::read_to_string(fleet.dir.path().join("pasted-worker.log")).unwrap_or_default()
    );

    // Its status then offers nothing to paste but says where it stands;
    // a status of the fleet port names the flags a rerun needs.
    let out = fvd()
        .args(["status", "pasted", "--orchestrator", &url])
        .args(fleet.token_args("viewer"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for hint in quoted_commands(&String::from_utf8_lossy(&out.stdout)) {
        let (code, said) = paste(&hint, &[]);
        assert_ne!(
            code,
            Some(2),
            "a pasted hint is never a usage error: {said}"
        );
    }
}

/// Issue #43's small mistakes: an orchestrator URL without its scheme is a
/// usage error (exit 2) that names the URL meant, from the flag or from
/// `FVD_ORCHESTRATOR`, not an unreachable orchestrator (exit 5); a missing
/// token file says its cause once.
#[test]
fn a_url_without_its_scheme_is_a_usage_error_and_a_missing_token_file_says_why_once() {
    for (flag, env) in [
        (Some("127.0.0.1:27070"), None),
        (None, Some("127.0.0.1:27070")),
    ] {
        let mut cmd = fvd();
        cmd.args(["status", "tinyport"]);
        if let Some(f) = flag {
            cmd.args(["--orchestrator", f]);
        }
        match env {
            Some(v) => cmd.env("FVD_ORCHESTRATOR", v),
            None => cmd.env_remove("FVD_ORCHESTRATOR"),
        };
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("did you mean http://127.0.0.1:27070"), "{err}");
    }
    let out = fvd()
        .args(["status", "tinyport", "--orchestrator", "http://127.0.0.1:1"])
        .args(["--token-file", "/nonexistent/fvd.token"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot read token file /nonexistent/fvd.token"),
        "{err}"
    );
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}
