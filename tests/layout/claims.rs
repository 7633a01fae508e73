//! The Rust items the documents name: every code span of `README.md`,
//! `ARCHITECTURE.md` and `docs/*.md` that names an item of a file
//! (`actors/src/attempt/launch.rs::run_where`, `file.rs::Type::field`) or
//! of a workspace crate (`fvd_store::steps`, `fvd-workspace::session`,
//! `fvd_orchestrator::embedded::Embedded::start`, `fvd_contracts::recorded_enum!`)
//! must resolve, so a renamed or deleted function leaves no claim behind.
//!
//! A file's item is one the file defines: `fn`, `struct`, `enum`, `const`,
//! `static`, `mod`, `trait`, `type`, `union` or `macro_rules!` of that
//! name; a later segment (`Type::name`) may also be a variant or a field
//! (a line that starts with the name). A crate's path is followed module by
//! module from its library root (`cargo metadata`): `name.rs` or
//! `name/mod.rs` beside it; the first segment that is no module file must
//! be defined or re-exported (`pub use`) by the module it is in, or be an
//! inline module (whose insides, generated code among them, are not
//! followed); segments after it (a method, a variant) must be defined
//! somewhere in the crate. Spans with a placeholder (`<x>`, `*`, `{`, `…`,
//! `$`, `|`) or a space are not claims.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::{code_spans, metadata, read, root};

/// The documents whose claims are checked: `README.md`, `ARCHITECTURE.md`
/// and `docs/*.md`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect()
        })
        .unwrap_or_default();
    more.sort();
    docs.extend(more);
    docs
}

/// Every workspace library crate by its Rust name (`fvd_store`), with the
/// path of its root file relative to the repository (`store/src/lib.rs`).
fn crate_roots(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for p in metadata()["packages"].as_array().expect("a package list") {
        for t in p["targets"].as_array().unwrap() {
            let lib = t["kind"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "lib" || k == "rlib");
            if lib {
                let src = PathBuf::from(t["src_path"].as_str().unwrap());
                let rel = src.strip_prefix(root).unwrap_or(&src).to_path_buf();
                out.insert(t["name"].as_str().unwrap().replace('-', "_"), rel);
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `word` occurs in `text` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The lines of Rust source that are code (not `//` comments).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

/// Whether `text` defines an item `name` with one of the item keywords.
fn defines_item(text: &str, name: &str) -> bool {
    let keywords = [
        "fn",
        "struct",
        "enum",
        "const",
        "static",
        "mod",
        "trait",
        "type",
        "union",
        "macro_rules!",
    ];
    code_lines(text).any(|l| {
        keywords.iter().any(|k| {
            let needle = format!("{k} {name}");
            l.match_indices(&needle).any(|(at, _)| {
                let before = l[..at].chars().next_back();
                let after = l[at + needle.len()..].chars().next();
                !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
            })
        })
    })
}

/// Whether `text` defines `name` as an item, an enum variant or a field: a
/// line that, past its visibility, starts with the name followed by `,`,
/// `(`, `{`, `:` (not `::`) or `=`, or is the name alone.
fn defines_member(text: &str, name: &str) -> bool {
    defines_item(text, name)
        || code_lines(text).any(|l| {
            let mut t = l.trim_start();
            for vis in ["pub(crate) ", "pub(super) ", "pub "] {
                t = t.strip_prefix(vis).unwrap_or(t);
            }
            let Some(rest) = t.strip_prefix(name) else {
                return false;
            };
            let rest = rest.trim_start();
            rest.is_empty()
                || rest.starts_with([',', '(', '{', '='])
                || (rest.starts_with(':') && !rest.starts_with("::"))
        })
}

/// Whether `text` re-exports `name` (`pub use …name…;`), or re-exports a
/// whole module (`pub use x::*;`, returned as `None`: look further).
fn reexports(text: &str, name: &str) -> Option<bool> {
    let mut glob = false;
    let mut rest = text;
    while let Some(at) = rest.find("pub use ") {
        let after = &rest[at..];
        let end = after.find(';').unwrap_or(after.len());
        let stmt = &after[..end];
        if has_word(stmt, name) {
            return Some(true);
        }
        glob |= stmt.contains('*');
        rest = &after[end..];
    }
    if glob { None } else { Some(false) }
}

/// Every `.rs` file below `dir` (the crate's source folder).
fn crate_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// A span's path segments with a call's `()` dropped; a macro keeps its
/// `!`.
fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim_end_matches("()").to_string())
        .collect()
}

/// What is wrong with the claim `span` (`None`: it resolves, or it is no
/// claim this check reads).
fn check(root: &Path, crates: &BTreeMap<String, PathBuf>, span: &str) -> Option<String> {
    if !span.contains("::") || span.contains([' ', '<', '*', '{', '…', '$', '|']) {
        return None;
    }
    if let Some(at) = span.find(".rs::") {
        let file = &span[..at + 3];
        let path = root.join(file);
        if !path.is_file() {
            return Some(format!("no such file {file}"));
        }
        let text = read(&path);
        for (i, seg) in segments(&span[at + 5..]).iter().enumerate() {
            let name = seg.trim_end_matches('!');
            let found = if i == 0 {
                defines_item(&text, name)
            } else {
                defines_member(&text, name)
            };
            if !found {
                return Some(format!("{file} defines no `{name}`"));
            }
        }
        return None;
    }
    let first = span.split("::").next()?;
    if !first.starts_with("fvd_") && !first.starts_with("fvd-") {
        return None;
    }
    let krate = first.replace('-', "_");
    let Some(lib) = crates.get(&krate) else {
        return Some(format!("no workspace crate `{krate}`"));
    };
    let src_dir = root.join(lib).parent().unwrap().to_path_buf();
    let anywhere = |name: &str| {
        crate_files(&src_dir)
            .iter()
            .any(|f| defines_member(&read(f), name))
    };
    let segs = segments(span);
    let mut file = root.join(lib);
    let mut k = 1;
    // Down the module files.
    while k < segs.len() {
        let seg = segs[k].as_str();
        let text = read(&file);
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = if matches!(stem.as_str(), "lib" | "main" | "mod") {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        let child = [dir.join(format!("{seg}.rs")), dir.join(seg).join("mod.rs")]
            .into_iter()
            .find(|p| p.is_file());
        match child {
            Some(c) if has_word(&text, &format!("mod {seg}")) => {
                file = c;
                k += 1;
            }
            _ => break,
        }
    }
    if k == segs.len() {
        return None;
    }
    let text = read(&file);
    let rel = file
        .strip_prefix(root)
        .unwrap_or(&file)
        .display()
        .to_string();
    let seg = segs[k].as_str();
    let found = if let Some(mac) = seg.strip_suffix('!') {
        // `#[macro_export]` puts a macro at the crate's root, wherever it is.
        let needle = format!("macro_rules! {mac}");
        crate_files(&src_dir)
            .iter()
            .any(|f| code_lines(&read(f)).any(|l| has_word(l, &needle)))
    } else if text.contains(&format!("mod {seg} {{")) {
        // An inline module (`fvd_proto::v1`, generated): not followed.
        return None;
    } else {
        defines_item(&text, seg)
            || match reexports(&text, seg) {
                Some(found) => found,
                None => anywhere(seg),
            }
    };
    if !found {
        return Some(format!("{rel} neither defines nor re-exports `{seg}`"));
    }
    for seg in &segs[k + 1..] {
        let name = seg.trim_end_matches('!');
        if !anywhere(name) {
            return Some(format!(
                "no `{name}` in {}",
                src_dir.strip_prefix(root).unwrap_or(&src_dir).display()
            ));
        }
    }
    None
}

/// `(line, span)` of a text's claims, and every broken one as `file:line:
/// `span`: why`.
fn broken(
    root: &Path,
    crates: &BTreeMap<String, PathBuf>,
    name: &str,
    text: &str,
) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut bad = Vec::new();
    for (line, span) in code_spans(text) {
        if span.contains("::") {
            checked += 1;
        }
        if let Some(why) = check(root, crates, &span) {
            bad.push(format!("{name}:{line}: `{span}`: {why}"));
        }
    }
    (checked, bad)
}

#[test]
fn every_rust_item_the_documents_name_exists() {
    let root = root();
    let crates = crate_roots(&root);
    assert!(
        crates.contains_key("fvd_store") && crates.contains_key("fvd_actors"),
        "cargo metadata lists the crates: {:?}",
        crates.keys()
    );
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        let (n, b) = broken(&root, &crates, &name, &read(&doc));
        checked += n;
        bad.extend(b);
    }
    assert!(checked > 50, "the documents name items: {checked} checked");
    assert!(bad.is_empty(), "{} broken:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn a_stale_item_of_a_file_or_a_crate_is_reported_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let src = root.join("store/src");
    std::fs::create_dir_all(src.join("steps")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "//! x\npub mod steps;\nmod usage;\npub use usage::Totals;\npub mod v1 {\n    include!(\"gen.rs\");\n}\n\
         #[macro_export]\nmacro_rules! recorded_enum { () => {} }\n\
         pub struct Store {\n    pub path: String,\n}\nimpl Store {\n    pub async fn write(&self) {}\n}\n\
         pub enum Verdict {\n    Pass,\n    Tampered { why: String },\n}\n// fn gone() {}\n",
    )
    .unwrap();
    std::fs::write(src.join("usage.rs"), "pub struct Totals;\n").unwrap();
    std::fs::write(
        src.join("steps/mod.rs"),
        "pub(crate) async fn record_verdict(x: u32) {}\n",
    )
    .unwrap();
    let crates = BTreeMap::from([("fvd_store".to_string(), PathBuf::from("store/src/lib.rs"))]);
    let text = "# T\n\
        `store/src/lib.rs::Store::write` `store/src/lib.rs::Verdict::Tampered` `store/src/lib.rs::gone`\n\
        `fvd_store::steps::record_verdict` `fvd-store::steps` `fvd_store::Totals` `fvd_store::v1::Anything`\n\
        `fvd_store::recorded_enum!` `fvd_store::Store::path` `fvd_store::steps::record_run`\n\
        `fvd_store::Store::read` `fvd_stor::x` `store/src/gone.rs::x` `tokio::spawn` `a <x>::y`\n\
        a wrapped `code\n\
        span` then `store/src/lib.rs::Verdict::Gone` and ``store/src/lib.rs::Verdict::Pass``\n\
        ```\n`store/src/lib.rs::nothing`\n```\n";
    let (checked, bad) = broken(root, &crates, "README.md", text);
    assert_eq!(checked, 17);
    assert_eq!(
        bad,
        [
            "README.md:2: `store/src/lib.rs::gone`: store/src/lib.rs defines no `gone`",
            "README.md:4: `fvd_store::steps::record_run`: store/src/steps/mod.rs neither defines nor re-exports `record_run`",
            "README.md:5: `fvd_store::Store::read`: no `read` in store/src",
            "README.md:5: `fvd_stor::x`: no workspace crate `fvd_stor`",
            "README.md:5: `store/src/gone.rs::x`: no such file store/src/gone.rs",
            "README.md:7: `store/src/lib.rs::Verdict::Gone`: store/src/lib.rs defines no `Gone`",
        ]
    );
}
