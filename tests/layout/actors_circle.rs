//! The actors' import graph stays open (issue #40): inside `actors/src`,
//! the only modules that reach each other through `crate::` paths are the
//! gate and the component (a parent and the children it spawns, which tell
//! it where they stand). A red run answers its component through a derived
//! ref, a diagnoser takes its supervisor's cell, and pure text lives in
//! modules of its own; an import that closes a circle again fails here
//! with the circle named.

use std::collections::{BTreeMap, BTreeSet};

use crate::rust_files;

/// The one circle allowed.
const ALLOWED: &[&str] = &["component", "gate"];

/// The top-level module of each `actors/src` file and the top-level
/// modules its code (not its comments, not its tests) names as
/// `crate::<module>`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, path) in rust_files() {
        let Some(inside) = rel.strip_prefix("actors/src/") else {
            continue;
        };
        let top = inside
            .split('/')
            .next()
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        g.entry(top.clone())
            .or_default()
            .extend(uses(&text).into_iter().filter(|m| *m != top));
    }
    g
}

/// The modules `text` names as `crate::<module>` before its tests, in code
/// lines only.
fn uses(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = BTreeSet::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The circles of `g` (strongly connected sets of two modules or more).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    // Reachability by a walk from each module: the graph is small.
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for n in g.get(&m).into_iter().flatten() {
                if g.contains_key(n) && seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for m in g.keys() {
        let circle: BTreeSet<String> = reached[m]
            .iter()
            .filter(|n| reached[*n].contains(m))
            .cloned()
            .collect();
        if circle.len() >= 2 && !out.contains(&circle) {
            out.push(circle);
        }
    }
    out
}

#[test]
fn only_the_gate_and_the_component_import_each_other() {
    let g = graph();
    assert!(
        g.contains_key("component") && g.contains_key("attempt"),
        "{g:?}"
    );
    let allowed: BTreeSet<String> = ALLOWED.iter().map(|s| s.to_string()).collect();
    let found = circles(&g);
    assert_eq!(
        found,
        vec![allowed],
        "the actors' modules import each other in a circle; the edges: {g:#?}"
    );
}

#[test]
fn a_planted_import_back_up_is_a_circle() {
    let edges = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, BTreeSet<String>> {
        pairs
            .iter()
            .map(|(m, to)| (m.to_string(), to.iter().map(|t| t.to_string()).collect()))
            .collect()
    };
    let open = edges(&[
        ("component", &["gate", "red_run"]),
        ("gate", &["component", "diagnosis"]),
        ("red_run", &["run_verdict"]),
        ("diagnosis", &["red_run"]),
        ("run_verdict", &[]),
    ]);
    assert_eq!(circles(&open).len(), 1);
    // `red_run` naming the component's message type again.
    let closed = edges(&[
        ("component", &["gate", "red_run"]),
        ("gate", &["component", "diagnosis"]),
        ("red_run", &["run_verdict", "component"]),
        ("diagnosis", &["red_run"]),
        ("run_verdict", &[]),
    ]);
    let c = circles(&closed);
    assert_eq!(c.len(), 1);
    assert!(
        c[0].contains("red_run") && c[0].contains("component"),
        "{c:?}"
    );
    // Comments and tests do not count; code does.
    let text = "//! see crate::component\nuse crate::red_run;\n#[cfg(test)]\nuse crate::gate;\n";
    assert_eq!(uses(text), BTreeSet::from(["red_run".to_string()]));
}
