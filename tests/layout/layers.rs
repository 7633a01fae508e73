//! The layer rule: `ARCHITECTURE.md`'s "Crates" section draws the crates
//! as rows of a diagram, top layer first, and a crate may depend only on
//! crates of rows below its own (not on its own row: two crates of one
//! layer that need the same code get a lower crate for it, as `fvd-git`
//! is). The rows are read from the document, so the map and this check
//! cannot drift apart; the edges are `cargo metadata`'s.

use std::collections::BTreeMap;

use crate::{metadata, read, root};

/// The crates of each row of the diagram, top first, with the line each
/// row is on (for the message).
fn layers(doc: &str) -> Vec<(usize, Vec<String>)> {
    let start = doc
        .find("\n## Crates")
        .expect("ARCHITECTURE.md has a \"## Crates\" section");
    let body = &doc[start..];
    let open = body
        .find("```\n")
        .expect("the Crates section opens a diagram")
        + 4;
    let close = open + body[open..].find("```").expect("the diagram is closed");
    let first_line = doc[..start + open].lines().count() + 1;
    body[open..close]
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let crates = line
                .split_whitespace()
                .filter(|w| *w == "fvd" || w.starts_with("fvd-"))
                .map(str::to_string)
                .collect();
            (first_line + i, crates)
        })
        .filter(|(_, c): &(usize, Vec<String>)| !c.is_empty())
        .collect()
}

/// Every workspace package's name and its dependencies on other workspace
/// packages, with cargo's kind (`normal`, `build`, `dev`).
pub(crate) fn edges() -> BTreeMap<String, Vec<(String, String)>> {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("a package list");
    let names: Vec<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|d| {
                    let name = d["name"].as_str()?.to_string();
                    let kind = d["kind"].as_str().unwrap_or("normal").to_string();
                    names.contains(&name).then_some((name, kind))
                })
                .collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

/// The edges that break the rule, one line each.
fn violations(
    rows: &[(usize, Vec<String>)],
    edges: &BTreeMap<String, Vec<(String, String)>>,
) -> Vec<String> {
    let layer = |name: &str| rows.iter().position(|(_, c)| c.iter().any(|x| x == name));
    let mut bad = Vec::new();
    for (krate, deps) in edges {
        let Some(mine) = layer(krate) else {
            bad.push(format!(
                "{krate} is in no row of ARCHITECTURE.md's crate diagram"
            ));
            continue;
        };
        for (dep, kind) in deps {
            // A test may reach up (the orchestrator's tests run a real
            // worker): dev-dependencies are no part of the layering.
            if kind == "dev" {
                continue;
            }
            match layer(dep) {
                Some(theirs) if theirs > mine => {}
                Some(theirs) => bad.push(format!(
                    "{krate} (ARCHITECTURE.md:{}) depends on {dep} (ARCHITECTURE.md:{}), {} its layer",
                    rows[mine].0,
                    rows[theirs].0,
                    if theirs == mine { "on" } else { "above" }
                )),
                None => bad.push(format!(
                    "{krate} depends on {dep}, which is in no row of the diagram"
                )),
            }
        }
    }
    bad
}

#[test]
fn no_crate_depends_on_its_own_layer_or_one_above() {
    let doc = read(&root().join("ARCHITECTURE.md"));
    let rows = layers(&doc);
    assert!(rows.len() >= 4, "the diagram has its layers: {rows:?}");
    let edges = edges();
    assert!(
        edges.len() >= 17 && edges.contains_key("fvd-actors"),
        "cargo metadata lists the workspace: {:?}",
        edges.keys()
    );
    let bad = violations(&rows, &edges);
    assert!(bad.is_empty(), "layer rule broken:\n{}", bad.join("\n"));
}

#[test]
fn the_check_catches_an_upward_and_a_sideways_edge() {
    let doc = "x\n## Crates\n\n```\nfvd\nfvd-actors   fvd-fuzz\nfvd-store\n```\n";
    let rows = layers(doc);
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1].0, 6, "the line of a row is its line in the file");
    let e = |deps: &[(&str, &str)]| -> Vec<(String, String)> {
        deps.iter()
            .map(|(d, k)| (d.to_string(), k.to_string()))
            .collect()
    };
    let edges = BTreeMap::from([
        ("fvd".to_string(), e(&[("fvd-actors", "normal")])),
        (
            "fvd-store".to_string(),
            e(&[("fvd-actors", "normal"), ("fvd", "dev")]),
        ),
        ("fvd-actors".to_string(), e(&[("fvd-fuzz", "build")])),
        ("fvd-fuzz".to_string(), e(&[("fvd-store", "normal")])),
        ("fvd-new".to_string(), e(&[])),
    ]);
    let bad = violations(&rows, &edges);
    assert_eq!(
        bad,
        [
            "fvd-actors (ARCHITECTURE.md:6) depends on fvd-fuzz (ARCHITECTURE.md:6), on its layer",
            "fvd-new is in no row of ARCHITECTURE.md's crate diagram",
            "fvd-store (ARCHITECTURE.md:7) depends on fvd-actors (ARCHITECTURE.md:6), above its layer",
        ]
    );
}
