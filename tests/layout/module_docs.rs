//! Every Rust file of the repository opens with a `//!` doc saying what it
//! is: the crates' sources, their tests, benches, examples and build
//! scripts, `tests/`, `fuzz/`. Generated code lives under `target/` (the
//! protobuf types are written into cargo's `OUT_DIR`), which the walk
//! skips, as it skips `.git` and `node_modules`.

use crate::{read, rust_files};

/// Whether a file's text opens with a `//!` line.
fn opens_with_module_doc(text: &str) -> bool {
    text.starts_with("//!")
}

/// The files of `files` (relative path, text) that do not open with `//!`.
fn undocumented<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut out: Vec<String> = files
        .into_iter()
        .filter(|(_, text)| !opens_with_module_doc(text))
        .map(|(rel, text)| {
            let first = text.lines().next().unwrap_or("").trim();
            format!("{rel}:1: opens with {first:?}, not `//!`")
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let files: Vec<(String, String)> = rust_files()
        .into_iter()
        .map(|(rel, path)| (rel, read(&path)))
        .collect();
    assert!(files.len() > 200, "found only {} Rust files", files.len());
    let bad = undocumented(files.iter().map(|(r, t)| (r.as_str(), t.as_str())));
    assert!(
        bad.is_empty(),
        "{} file(s) without a `//!` doc:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn a_file_without_a_module_doc_is_named() {
    let files = [
        ("a.rs", "//! What a is.\nfn a() {}\n"),
        ("b.rs", "/// An item's doc.\nfn b() {}\n"),
        ("c.rs", "\n//! Too late.\n"),
        ("d.rs", "#![allow(dead_code)]\n//! After an attribute.\n"),
    ];
    assert_eq!(
        undocumented(files),
        [
            "b.rs:1: opens with \"/// An item's doc.\", not `//!`",
            "c.rs:1: opens with \"\", not `//!`",
            "d.rs:1: opens with \"#![allow(dead_code)]\", not `//!`",
        ]
    );
}
