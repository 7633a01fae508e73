//! The "Used by" lines of `ARCHITECTURE.md`: each crate's section of
//! "## Crates" (a `###` heading naming its package in backquotes) has one
//! paragraph starting `**Used by:**` that names, in backquotes, exactly the
//! workspace packages that depend on it in `[dependencies]` or
//! `[build-dependencies]` (`cargo metadata`). Dev-dependencies do not
//! count, as in the layer rule (`layers.rs`): a test may reach anywhere.
//! A crate nothing depends on says so without naming one.

use std::collections::{BTreeMap, BTreeSet};

use crate::layers::edges;
use crate::{read, root};

/// Every workspace package with the packages that depend on it, dev
/// dependencies left out.
fn users(edges: &BTreeMap<String, Vec<(String, String)>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> =
        edges.keys().map(|k| (k.clone(), BTreeSet::new())).collect();
    for (krate, deps) in edges {
        for (dep, kind) in deps {
            if kind != "dev" {
                out.entry(dep.clone()).or_default().insert(krate.clone());
            }
        }
    }
    out
}

/// The backquoted words of `line` that are one of `packages`.
fn named(line: &str, packages: &BTreeSet<String>) -> BTreeSet<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| packages.contains(*w))
        .map(str::to_string)
        .collect()
}

/// Each crate section of the document's "## Crates": its package, and the
/// line number and names of its "Used by" paragraph (`None` when it has
/// none). The paragraph runs to the next blank line, so a list may wrap.
#[allow(clippy::type_complexity)]
fn sections(
    doc: &str,
    packages: &BTreeSet<String>,
) -> Vec<(usize, String, Option<(usize, BTreeSet<String>)>)> {
    let mut out: Vec<(usize, String, Option<(usize, BTreeSet<String>)>)> = Vec::new();
    let mut in_crates = false;
    let mut fenced = false;
    // Inside a "Used by" paragraph.
    let mut used_by = false;
    for (i, line) in doc.lines().enumerate() {
        if used_by && !line.trim().is_empty() && !line.starts_with('#') {
            if let Some((_, _, Some((_, names)))) = out.last_mut() {
                names.extend(named(line, packages));
            }
            continue;
        }
        used_by = false;
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.starts_with("## ") {
            in_crates = line.trim() == "## Crates";
            continue;
        }
        if !in_crates {
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            if let Some(p) = named(h, packages).into_iter().next() {
                out.push((i + 1, p, None));
            }
            continue;
        }
        if line.starts_with("**Used by:**")
            && let Some(last) = out.last_mut()
            && last.2.is_none()
        {
            last.2 = Some((i + 1, named(line, packages)));
            used_by = true;
        }
    }
    out
}

/// Every way the document's "Used by" lines differ from `users`.
fn mismatches(doc: &str, users: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let packages: BTreeSet<String> = users.keys().cloned().collect();
    let found = sections(doc, &packages);
    let mut bad = Vec::new();
    for (krate, used_by) in users {
        let mine: Vec<_> = found.iter().filter(|(_, p, _)| p == krate).collect();
        match mine.as_slice() {
            [] => bad.push(format!(
                "ARCHITECTURE.md: {krate} has no section under \"## Crates\""
            )),
            [(line, _, None)] => bad.push(format!(
                "ARCHITECTURE.md:{line}: the section of {krate} has no \"**Used by:**\" line"
            )),
            [(_, _, Some((line, said)))] if said != used_by => bad.push(format!(
                "ARCHITECTURE.md:{line}: {krate} is used by {} (cargo metadata), the line says {}",
                list(used_by),
                list(said)
            )),
            [_] => {}
            more => bad.push(format!(
                "ARCHITECTURE.md:{}: {krate} has {} sections",
                more[1].0,
                more.len()
            )),
        }
    }
    bad
}

fn list(names: &BTreeSet<String>) -> String {
    if names.is_empty() {
        "nothing".into()
    } else {
        names.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

#[test]
fn every_used_by_line_names_the_crates_reverse_dependencies() {
    let doc = read(&root().join("ARCHITECTURE.md"));
    let users = users(&edges());
    assert!(
        users.len() >= 17 && users["fvd-contracts"].contains("fvd-store"),
        "cargo metadata lists the workspace: {users:?}"
    );
    let bad = mismatches(&doc, &users);
    assert!(bad.is_empty(), "{} wrong:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn a_stale_missing_or_absent_used_by_line_is_reported() {
    let e = |deps: &[(&str, &str)]| -> Vec<(String, String)> {
        deps.iter()
            .map(|(d, k)| (d.to_string(), k.to_string()))
            .collect()
    };
    let edges = BTreeMap::from([
        ("fvd".to_string(), e(&[("fvd-store", "normal")])),
        (
            "fvd-actors".to_string(),
            e(&[("fvd-store", "normal"), ("fvd-paths", "build")]),
        ),
        ("fvd-store".to_string(), e(&[("fvd-paths", "normal")])),
        ("fvd-paths".to_string(), e(&[])),
        ("fvd-fuzz".to_string(), e(&[("fvd-actors", "dev")])),
        ("fvd-new".to_string(), e(&[])),
    ]);
    let users = users(&edges);
    assert!(users["fvd-actors"].is_empty(), "a dev-dependency is no use");
    let doc = "# A\n## Crates\n```\n**Used by:** `fvd`\n```\n\
        ### `store/` (`fvd-store`)\n\nText naming `fvd-paths`.\n\n**Used by:** `fvd`, `fvd-actors`.\n\
        ### `paths/` (`fvd-paths`)\n**Used by:** `fvd-store`\n(and `fvd-fuzz`'s tests)\n\n`fvd-actors`\n\
        ### `actors/` (`fvd-actors`)\n**Used by:** nothing.\n\
        ### `fuzz/` (`fvd-fuzz`)\nNo line.\n\
        ### `fvd` (root package)\n**Used by:** nothing: it is the binary.\n\
        ## Flows\n### `new/` (`fvd-new`)\n**Used by:** nothing.\n";
    assert_eq!(
        mismatches(doc, &users),
        [
            "ARCHITECTURE.md:18: the section of fvd-fuzz has no \"**Used by:**\" line",
            "ARCHITECTURE.md: fvd-new has no section under \"## Crates\"",
            "ARCHITECTURE.md:12: fvd-paths is used by fvd-actors, fvd-store (cargo metadata), the line says fvd-fuzz, fvd-store",
        ]
    );
}
