//! The terminal surface of the binary (issue #34): `fvd --version` names
//! the commit it was built from, `fvd completions` prints scripts a shell
//! accepts, and `fvd man` writes roff pages naming every subcommand.

use crate::support::fvd;

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
