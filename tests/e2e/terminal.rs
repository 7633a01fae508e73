//! The terminal surface of the binary (issue #34): `fvd --version` names
//! the commit it was built from.

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
