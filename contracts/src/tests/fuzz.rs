//! Parsers never panic: random bytes and randomly mutated fixture files (lines
//! dropped, duplicated, truncated, swapped, re-indented, table cells
//! removed) go through every parser. The case count is bounded so the suite
//! stays quick on a two-core CI machine.

use proptest::prelude::*;

use super::examples::*;
use super::{PORT_STATUS_FIXTURES, fixture};
use crate::block;
use crate::kind::{self, ContractKind};
use crate::port_status;

fn sources() -> Vec<String> {
    let mut v: Vec<String> = PORT_STATUS_FIXTURES
        .iter()
        .map(|(_, r)| std::fs::read_to_string(fixture(r)).unwrap())
        .collect();
    for r in [
        "contracts/port_status_template.md",
        "contracts/prep_handoff.md",
        "contracts/pipeline_handoff.md",
        "contracts/conversion_request.md",
    ] {
        v.push(std::fs::read_to_string(fixture(r)).unwrap());
    }
    for e in [
        PREP,
        ESCAPE_NESTED,
        COMPONENT_CONTEXT,
        PARITY_STATUS,
        CONVERSION_HANDOFF,
        PIPELINE_CONTEXT,
        FINAL,
    ] {
        v.push(e.to_owned());
    }
    v
}

fn mutate(text: &str, ops: &[(u8, u32, u32)]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for &(op, a, b) in ops {
        if lines.is_empty() {
            break;
        }
        let i = a as usize % lines.len();
        match op % 6 {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
            2 => {
                let keep = b as usize % (lines[i].chars().count() + 1);
                lines[i] = lines[i].chars().take(keep).collect();
            }
            3 => {
                // drop one table cell
                let cells: Vec<&str> = lines[i].split('|').collect();
                if cells.len() > 2 {
                    let k = b as usize % cells.len();
                    let mut c = cells.clone();
                    c.remove(k);
                    lines[i] = c.join("|");
                }
            }
            4 => {
                let j = b as usize % lines.len();
                lines.swap(i, j);
            }
            _ => {
                let pad = " ".repeat(b as usize % 7);
                lines[i] = format!("{pad}{}", lines[i].trim_start());
            }
        }
    }
    lines.join("\n")
}

/// Runs every parser on `text`; panics are the failure being looked for.
fn every_parser(text: &str) {
    let _ = block::parse(text, 1);
    let _ = block::fenced_blocks(text);
    let (status, _) = port_status::import(text);
    let rendered = status.render();
    let (again, _) = port_status::import(&rendered);
    let twice = again.render();
    if twice != rendered {
        let a: Vec<&str> = rendered.lines().collect();
        let b: Vec<&str> = twice.lines().collect();
        let i = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        panic!(
            "render of an import is not stable at line {i}: {:?} vs {:?}",
            a.get(i.saturating_sub(1)..(i + 2).min(a.len())),
            b.get(i.saturating_sub(1)..(i + 2).min(b.len()))
        );
    }
    for k in ContractKind::ALL {
        let _ = kind::check_block(k, text, 1);
        let _ = kind::check(text, Some(k));
    }
    let _ = kind::check(text, None);
    coauthor_properties(text);
}

/// The co-author on any text: it changes only what it owns, and a second
/// write of the same evidence changes nothing.
fn coauthor_properties(text: &str) {
    use crate::coauthor::{ComponentInput, Input, Run, patch};
    for verdicts in [
        ["non_skip_pass", "debug_red", "scaffold_skip", "environment"],
        ["debug_red", "non_skip_pass", "error", "timeout"],
    ] {
        let components = ["transformer", "vae", "text_encoder", "scheduler"]
            .iter()
            .zip(verdicts)
            .map(|(name, verdict)| ComponentInput {
                name: (*name).into(),
                component_type: "generic".into(),
                parity_tests: vec![format!("tests/local_tests/x/test_{name}_parity.py")],
                command: format!("pytest tests/local_tests/x/test_{name}_parity.py"),
                run: Some(Run {
                    verdict: verdict.into(),
                    reason: format!("{verdict}: error:collection: t::{name}: 1 != 2"),
                    run_no: 1,
                    worker: "w".into(),
                }),
                ..ComponentInput::default()
            })
            .collect();
        let input = Input {
            date: "2026-11-26".into(),
            components,
            escapes: Vec::new(),
        };
        let once = patch(text, &input);
        if let Err(e) = crate::status_guard::owned_changes(text, &once) {
            panic!("{e}\n--- before:\n{text}\n--- after:\n{once}");
        }
        let twice = patch(&once, &input);
        assert_eq!(
            twice, once,
            "a second write changed the file; before:\n{text}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        every_parser(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn random_block_like_text(text in "([ -]{0,6}[a-z_|`<>:#-]{0,12}(: ?)?[a-z <>|`-]{0,12}\n){0,30}") {
        every_parser(&text);
    }

    #[test]
    fn mutated_fixture_files(
        which in 0usize..15,
        ops in proptest::collection::vec((any::<u8>(), any::<u32>(), any::<u32>()), 1..12),
    ) {
        let src = sources();
        let text = mutate(&src[which % src.len()], &ops);
        every_parser(&text);
    }
}
