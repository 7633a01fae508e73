//! The terminal surface of the binary (issue #34): `fvd --version` names
//! the commit it was built from, `fvd completions` prints scripts a shell
//! accepts, `fvd man` writes roff pages naming every subcommand, and
//! `fvd logs --follow` exits with its run's outcome (`--json`: one object
//! a line).

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
    let stdout: String = chunks
        .iter()
        .filter(|c| c["stream"] == "stdout")
        .filter_map(|c| c["text"].as_str())
        .collect();
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
