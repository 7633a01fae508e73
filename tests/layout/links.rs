//! The documents' links and paths: every relative Markdown link of
//! `README.md`, `ARCHITECTURE.md`, `docs/**/*.md` and `deploy/**/README.md`
//! names a file or folder of the checkout (and a `#heading` of it that
//! exists), and every code span that names a path of the repository
//! (`actors/src/gate.rs`, `store/migrations/`, `src/cmd/port.rs::submit`)
//! names one that exists, so a moved or deleted file cannot leave the map
//! pointing at nothing. A section named in quotes after its document
//! anywhere in the repository (`README "Run the tests"`, `docs/fleet.md
//! "Containment"`, in prose, comments and messages) must exist too, so a
//! section moved to another document leaves no reference behind.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::{read, root};

/// The documents the check covers.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    fn walk(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, keep, out);
            } else if keep(&p) {
                out.push(p);
            }
        }
    }
    walk(
        &root.join("docs"),
        &|p| p.extension().is_some_and(|e| e == "md"),
        &mut docs,
    );
    walk(
        &root.join("deploy"),
        &|p| p.file_name().is_some_and(|n| n == "README.md"),
        &mut docs,
    );
    docs
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped but `-`
/// and `_`, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings (outside code blocks), with
/// GitHub's `-1`, `-2` for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// `(line, target)` of every inline Markdown link outside code blocks.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// `(line, path)` of every code span that names a path inside one of the
/// repository's top-level folders: `actors/src/gate.rs`,
/// `src/cmd/port.rs::submit` (the item after `::` dropped). Spans with a
/// placeholder (`<family>`, `*`, `{repo}`, `…`) or a space are not paths,
/// and neither are those of a port's own repository
/// (`tests/local_tests/F/port.toml`).
fn code_paths(text: &str, top: &BTreeSet<String>) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (k, span) in line.split('`').enumerate() {
            if k % 2 == 0 || span.contains([' ', '<', '*', '{', '…', '$', '|']) {
                continue;
            }
            let path = span.split("::").next().unwrap_or(span);
            let Some((first, _)) = path.split_once('/') else {
                continue;
            };
            if top.contains(first) && !path.starts_with("tests/local_tests/") {
                out.push((i + 1, path.to_string()));
            }
        }
    }
    out
}

/// The top-level folders of the checkout that hold the project's code and
/// documents (not build output).
fn top_folders(root: &Path) -> BTreeSet<String> {
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect()
}

/// Every broken link or path of `doc`, one line each (`file:line: …`).
fn broken(root: &Path, doc: &Path, text: &str, top: &BTreeSet<String>) -> Vec<String> {
    let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
    let dir = doc.parent().unwrap();
    let mut bad = Vec::new();
    for (line, target) in links(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        let headings = if file.is_empty() {
            anchors(text)
        } else {
            let path = dir.join(file);
            if !path.exists() {
                bad.push(format!("{name}:{line}: link to {target}: no such file"));
                continue;
            }
            if path.extension().is_none_or(|e| e != "md") {
                continue;
            }
            anchors(&read(&path))
        };
        if let Some(a) = anchor
            && !headings.contains(a)
        {
            bad.push(format!("{name}:{line}: link to {target}: no such heading"));
        }
    }
    for (line, p) in code_paths(text, top) {
        if !root.join(&p).exists() {
            bad.push(format!(
                "{name}:{line}: `{p}`: no such path in the repository"
            ));
        }
    }
    bad
}

/// The names a section can be referred to by in `text`: its headings
/// (outside code blocks, `#`s and code quotes dropped) and the bold leads
/// of its paragraphs and list items (`**Run the tests**`,
/// `**Stopping a worker.**`).
fn section_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.starts_with('#') {
            names.push(line.trim_start_matches('#').trim().replace('`', ""));
        }
        let mut rest = line;
        while let Some(at) = rest.find("**") {
            let after = &rest[at + 2..];
            let Some(end) = after.find("**") else { break };
            names.push(after[..end].trim_end_matches('.').replace('`', ""));
            rest = &after[end + 2..];
        }
    }
    names
}

/// `(line, document, section)` of every reference to a section of one of
/// the project's documents by its name in quotes: `README "Run the
/// tests"`, `docs/fleet.md "Containment"`, also inside a Rust string
/// (`docs/fleet.md \"Containment\"`) and across a line break of a comment.
/// `README` alone is the top-level `README.md`; another folder's
/// (`deploy/slurm/README.md`) is named with its path.
fn section_refs(text: &str, documents: &[String]) -> Vec<(usize, String, String)> {
    // The text as one line, comment markers and indentation of each line
    // dropped, with where each line starts.
    let mut flat = String::new();
    let mut starts = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        let l = ["//!", "///", "//", "#"]
            .iter()
            .find_map(|m| l.strip_prefix(m))
            .unwrap_or(l)
            .trim_start();
        starts.push(flat.len());
        flat.push_str(l);
        flat.push(' ');
    }
    let line_of = |at: usize| starts.partition_point(|&s| s <= at);
    let mut out = Vec::new();
    for doc in documents {
        let names: Vec<&str> = if doc == "README.md" {
            vec!["README.md", "README"]
        } else {
            vec![doc.as_str()]
        };
        for name in names {
            for (at, _) in flat.match_indices(name) {
                let before = flat[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
                {
                    continue;
                }
                let after = &flat[at + name.len()..];
                let (quote, rest) = if let Some(r) = after.strip_prefix(" \"") {
                    ("\"", r)
                } else if let Some(r) = after.strip_prefix(" \\\"") {
                    ("\\\"", r)
                } else {
                    continue;
                };
                let Some(end) = rest.find(quote) else {
                    continue;
                };
                out.push((line_of(at), doc.clone(), rest[..end].to_string()));
            }
        }
    }
    out.sort();
    out
}

/// The repository's text files that may name a document's section: every
/// document, source file, script, manifest and configuration file (not
/// build output, fuzz inputs or test fixtures).
fn text_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            if p.is_dir() {
                if !name.starts_with('.')
                    && !matches!(&*name, "target" | "node_modules" | "corpus" | "fixtures")
                {
                    walk(&p, out);
                }
            } else if p.extension().is_some_and(|e| {
                matches!(
                    e.to_str(),
                    Some("md" | "rs" | "toml" | "sh" | "py" | "yaml" | "yml" | "sbatch" | "in")
                )
            }) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out.push(root.join(".ci/run"));
    out.retain(|p| p.exists());
    out
}

/// Every reference of `text` to a section that its document does not have.
fn broken_section_refs(root: &Path, name: &str, text: &str, documents: &[String]) -> Vec<String> {
    let mut bad = Vec::new();
    for (line, doc, section) in section_refs(text, documents) {
        let names = section_names(&read(&root.join(&doc)));
        if !names.iter().any(|n| n.starts_with(&section)) {
            bad.push(format!("{name}:{line}: {doc} has no section \"{section}\""));
        }
    }
    bad
}

/// The documents a section can be named in: `README.md`,
/// `ARCHITECTURE.md` and `docs/*.md`, relative to the root.
fn named_documents(root: &Path) -> Vec<String> {
    documents(root)
        .iter()
        .map(|p| p.strip_prefix(root).unwrap().to_string_lossy().into_owned())
        .filter(|p| !p.starts_with("deploy/"))
        .collect()
}

#[test]
fn every_section_a_file_names_in_quotes_exists() {
    let root = root();
    let documents = named_documents(&root);
    assert!(
        documents.iter().any(|d| d == "docs/guide.md"),
        "docs/*.md are among the documents: {documents:?}"
    );
    let mut bad = Vec::new();
    let mut checked = 0;
    for path in text_files(&root) {
        let text = read(&path);
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        checked += section_refs(&text, &documents).len();
        bad.extend(broken_section_refs(&root, &name, &text, &documents));
    }
    assert!(checked > 10, "files name sections: {checked} checked");
    assert!(bad.is_empty(), "{} broken:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn every_link_and_path_of_the_documents_exists() {
    let root = root();
    let top = top_folders(&root);
    let docs = documents(&root);
    assert!(docs.len() >= 5, "the documents are found: {docs:?}");
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = read(doc);
        checked += links(&text).len() + code_paths(&text, &top).len();
        bad.extend(broken(&root, doc, &text, &top));
    }
    assert!(checked > 100, "the documents name paths: {checked} checked");
    assert!(bad.is_empty(), "{} broken:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn a_missing_file_heading_or_path_is_reported_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("store/src")).unwrap();
    std::fs::write(root.join("store/src/lib.rs"), "").unwrap();
    std::fs::write(
        root.join("other.md"),
        "# Other\n\n## Set-up and the two commands\n",
    )
    .unwrap();
    let doc = root.join("README.md");
    let text = "# T\n\
        [ok](other.md#set-up-and-the-two-commands) and [web](https://x.y/z)\n\
        [gone](nowhere.md) [bad](other.md#nope) [self](#t)\n\
        `store/src/lib.rs::Store` `store/src/gone.rs` `REPO/.fvd/x` `store/<f>.rs`\n\
        ```\n[in code](nowhere.md) `store/x.rs`\n```\n";
    let top = top_folders(root);
    assert_eq!(
        broken(root, &doc, text, &top),
        [
            "README.md:3: link to nowhere.md: no such file",
            "README.md:3: link to other.md#nope: no such heading",
            "README.md:4: `store/src/gone.rs`: no such path in the repository",
        ]
    );
}

#[test]
fn a_section_named_in_quotes_is_found_or_reported_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(
        root.join("README.md"),
        "# fvd\n\n**Run the tests** (all of them):\n```\n## Not a heading\n```\n",
    )
    .unwrap();
    std::fs::write(
        root.join("docs/ops.md"),
        "# Running on a fleet\n\n## Containment: what a test can reach\n\n**Stopping a worker.** …\n",
    )
    .unwrap();
    let documents = ["README.md".to_string(), "docs/ops.md".to_string()];
    let text = "// (README \"Run the tests\"; docs/ops.md \"Containment\")\n\
        \"fix it (docs/ops.md \\\"Stopping a worker\\\")\"\n\
        # a comment that wraps (README\n\
        #   \"Not a heading\"), deploy/slurm/README \"Step 1\"\n\
        (docs/ops.md \"Running on a fleet\", docs/ops.md \"Deploying\")\n";
    assert_eq!(
        section_refs(text, &documents)
            .iter()
            .map(|(l, d, s)| format!("{l} {d} {s}"))
            .collect::<Vec<_>>(),
        [
            "1 README.md Run the tests",
            "1 docs/ops.md Containment",
            "2 docs/ops.md Stopping a worker",
            "3 README.md Not a heading",
            "5 docs/ops.md Deploying",
            "5 docs/ops.md Running on a fleet",
        ]
    );
    assert_eq!(
        broken_section_refs(root, "x.rs", text, &documents),
        [
            "x.rs:3: README.md has no section \"Not a heading\"",
            "x.rs:5: docs/ops.md has no section \"Deploying\"",
        ]
    );
}
