//! Why the test command builds no release binary (`scripts/test.sh`): the
//! release build compiles the very code the test build does, so CI's
//! two-core machine need not compile everything twice. That holds while
//! no code of fvd's is compiled for one profile only
//! (`cfg(debug_assertions)`, `cfg(not(debug_assertions))`) and
//! `[profile.release]` changes only how much is optimized and kept for
//! debuggers. Either changing fails here, naming the file and line; put the
//! release build back into the test command then.

use crate::{lines_where, read, root, rust_files};

/// `file:line: text` of each line of `text` naming `debug_assertions`.
fn profile_only(file: &str, text: &str) -> Vec<String> {
    lines_where(file, text, |l| l.contains("debug_assertions"))
}

#[test]
fn no_code_is_compiled_for_the_release_profile_only() {
    let files = rust_files();
    assert!(files.len() > 50, "found only {} Rust files", files.len());
    let mut found = Vec::new();
    for (rel, path) in &files {
        if rel != "tests/layout/profiles.rs" {
            found.extend(profile_only(rel, &read(path)));
        }
    }
    assert!(
        found.is_empty(),
        "code for one profile only:\n{}",
        found.join("\n")
    );
    assert_eq!(
        profile_only("x.rs", "#[cfg(not(debug_assertions))]\nfn a() {}\n"),
        ["x.rs:1: #[cfg(not(debug_assertions))]"]
    );
}

#[test]
fn the_release_profile_changes_only_optimization_and_debug_info() {
    let text = read(&root().join("Cargo.toml"));
    let mut in_release = false;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with('[') {
            in_release = t == "[profile.release]" || t.starts_with("[profile.release.");
            continue;
        }
        if in_release && !t.is_empty() && !t.starts_with('#') {
            let key = t.split('=').next().unwrap_or_default().trim().to_string();
            keys.push((i + 1, key));
        }
    }
    assert!(!keys.is_empty(), "Cargo.toml has no [profile.release] keys");
    for (line, key) in keys {
        assert!(
            matches!(
                key.as_str(),
                "debug" | "opt-level" | "codegen-units" | "strip" | "incremental"
            ),
            "Cargo.toml:{line}: [profile.release] sets {key}: the release build may then fail where the test build passes; build it in scripts/test.sh again"
        );
    }
}
