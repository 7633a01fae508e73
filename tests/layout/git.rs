//! The one git runner (issue #38): every git process fvd starts goes
//! through `fvd_git::command` or `fvd_git::blocking_command`, which run it
//! with no hook, no fsmonitor and no program a repository names. A
//! `Command::new("git")` anywhere else in fvd's own code (a crate's `src/`
//! before its test module) fails here, naming the file and line.
//!
//! Test code (`tests/` folders, `#[cfg(test)] mod tests`) and `build.rs`
//! (git at build time, on the developer's checkout) may run git directly:
//! they are not fvd.

use crate::{lines_where, read, root, rust_files};

/// The one file allowed to start git.
const RUNNER: &str = "git/src/lib.rs";

/// The text of a source file before its test module.
fn before_tests(text: &str) -> &str {
    let mut at = 0;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod tests"))
        {
            return &text[..at];
        }
        at += line.len() + 1;
    }
    text
}

/// `(file:line, line)` of every direct git spawn in `text`.
fn spawns(file: &str, text: &str) -> Vec<String> {
    let needles = [
        "Command::new(\"git\")",
        "Command::new(\"/usr/bin/git\")",
        "Command::new(\"/usr/local/bin/git\")",
    ];
    lines_where(file, before_tests(text), |l| {
        needles.iter().any(|n| l.contains(n))
    })
}

#[test]
fn git_is_started_only_by_the_one_runner() {
    // fvd's own code: a crate's `src/`, not a `tests` folder.
    let files: Vec<_> = rust_files()
        .into_iter()
        .filter(|(rel, _)| {
            let parts: Vec<&str> = rel.split('/').collect();
            parts.contains(&"src") && !parts.contains(&"tests")
        })
        .collect();
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut found = Vec::new();
    for (rel, path) in &files {
        if rel != RUNNER {
            found.extend(spawns(rel, &read(path)));
        }
    }
    assert!(
        found.is_empty(),
        "git started outside fvd_git's runner (use fvd_git::command or fvd_git::blocking_command):\n{}",
        found.join("\n")
    );
    // The runner itself is where git is started.
    assert!(!spawns(RUNNER, &read(&root().join(RUNNER))).is_empty());
}

#[test]
fn the_check_sees_a_spawn_and_skips_test_modules() {
    let code = "fn a() {\n    let c = std::process::Command::new(\"git\");\n}\n#[cfg(test)]\nmod tests {\n    fn b() { Command::new(\"git\"); }\n}\n";
    assert_eq!(
        spawns("x.rs", code),
        ["x.rs:2: let c = std::process::Command::new(\"git\");"]
    );
    assert!(spawns("x.rs", "fn a() { Command::new(\"gitk\"); }").is_empty());
}
