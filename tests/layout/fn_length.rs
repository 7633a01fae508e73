//! No function of the project's own code runs over [`MAX_LINES`] lines
//! (issue #40): a function that long is a module that has not been named
//! yet. Counted from its `fn` line to its closing brace, as rustfmt lays
//! them out; test code (`#[cfg(test)]` modules, `tests/` folders) is not
//! counted.

use std::path::PathBuf;

use crate::rust_files;

/// The longest a function may be.
const MAX_LINES: usize = 120;

/// `(lines, name, line it starts on)` of every function in `text` before
/// its `#[cfg(test)]` module.
fn functions(text: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.starts_with("#[cfg(test)]"))
        .unwrap_or(lines.len());
    let lines = &lines[..end];
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((indent, name)) = fn_start(line) else {
            continue;
        };
        let close = format!("{indent}}}");
        if let Some(j) = lines[i + 1..].iter().position(|l| *l == close) {
            out.push((j + 2, name, i + 1));
        }
    }
    out
}

/// The indentation and name of a function that opens on `line` (one with a
/// body: not a trait's declaration ending in `;`).
fn fn_start(line: &str) -> Option<(String, String)> {
    let trimmed = line.trim_start();
    let indent = &line[..line.len() - trimmed.len()];
    // A declaration without a body, a one-line function, a comment.
    let end = line.trim_end();
    if end.ends_with(';') || end.ends_with('}') || trimmed.starts_with("//") {
        return None;
    }
    let mut rest = trimmed;
    for prefix in ["pub(crate) ", "pub(super) ", "pub "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    for prefix in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then(|| (indent.to_string(), name))
}

#[test]
fn no_function_of_the_project_runs_over_120_lines() {
    // The project's own code: not its tests.
    let files: Vec<(String, PathBuf)> = rust_files()
        .into_iter()
        .filter(|(rel, _)| !rel.split('/').any(|c| c == "tests"))
        .collect();
    let mut long = Vec::new();
    for (rel, f) in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, name, at) in functions(&text) {
            if n > MAX_LINES {
                long.push(format!("{rel}:{at}: {name} is {n} lines"));
            }
        }
    }
    assert!(
        files.len() > 100,
        "the walk found only {} files",
        files.len()
    );
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

#[test]
fn a_planted_long_function_is_counted_and_tests_are_not() {
    let body = "    let x = 1;\n".repeat(130);
    let text = format!(
        "//! doc\n\npub async fn long() {{\n{body}}}\n\nfn short() {{}}\n\n#[cfg(test)]\nmod tests {{\n    fn also_long() {{\n{body}    }}\n}}\n"
    );
    let found = functions(&text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0], (132, "long".to_string(), 3));
    assert_eq!(fn_start("    fn declared(&self) -> u8;"), None);
    assert_eq!(fn_start("fn one() -> u8 { 1 }"), None);
    assert_eq!(
        fn_start("    pub(crate) fn f<'a>("),
        Some(("    ".into(), "f".into()))
    );
}
