//! Checks of the repository's shape that no crate's own tests see: the
//! one git runner (`git.rs`), the
//! layer rule of `ARCHITECTURE.md` against the crates' real dependencies
//! (`cargo metadata`, `layers.rs`) and its "Used by" lines (`used_by.rs`),
//! the links and paths the documents name (`links.rs`), the Rust items
//! they name (`claims.rs`), and the `//!` every Rust file opens with
//! (`module_docs.rs`), and the actors' import graph with no circle but
//! the gate and the component (`actors_circle.rs`), and no function over
//! 120 lines (`fn_length.rs`).
//!
//! They read the checkout (and `cargo metadata`) only; none builds or runs
//! fvd.

mod actors_circle;
mod claims;
mod fn_length;
mod git;
mod layers;
mod links;
mod module_docs;
mod profiles;
mod used_by;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository's root: this package's manifest folder.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cargo metadata --format-version 1 --no-deps` of the workspace, run
/// once per test binary.
fn metadata() -> &'static serde_json::Value {
    static META: OnceLock<serde_json::Value> = OnceLock::new();
    META.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(root())
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("metadata is JSON")
    })
}

/// `(line, span)` of every inline code span of a Markdown text outside
/// fenced blocks, its backquotes (one or more, as CommonMark pairs them)
/// dropped and its content trimmed; a span may wrap a line (a line break
/// inside it reads as a space) but not a paragraph. The line is the one
/// the span opens on.
fn code_spans(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    // The open span: its line, its fence's length, its text so far.
    let mut open: Option<(usize, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            open = None;
            continue;
        }
        if fenced || line.trim().is_empty() {
            open = None;
            continue;
        }
        if let Some((_, _, s)) = &mut open {
            s.push(' ');
        }
        let chars: Vec<char> = line.chars().collect();
        let mut k = 0;
        while k < chars.len() {
            if chars[k] != '`' {
                if let Some((_, _, s)) = &mut open {
                    s.push(chars[k]);
                }
                k += 1;
                continue;
            }
            let run = chars[k..].iter().take_while(|c| **c == '`').count();
            match &mut open {
                None => open = Some((i + 1, run, String::new())),
                Some((at, n, s)) if *n == run => {
                    out.push((*at, s.trim().to_string()));
                    open = None;
                }
                Some((_, _, s)) => s.extend(std::iter::repeat_n('`', run)),
            }
            k += run;
        }
    }
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every `.rs` file of the repository (not below `target`, `.git` or
/// `node_modules`): its path relative to the root, and the path itself.
fn rust_files() -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let root = root();
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, p)
        })
        .collect()
}

/// `file:line: text` of each line of `text` that `hit` holds for.
fn lines_where(file: &str, text: &str, hit: impl Fn(&str) -> bool) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| hit(l))
        .map(|(i, l)| format!("{file}:{}: {}", i + 1, l.trim()))
        .collect()
}
