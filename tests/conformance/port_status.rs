//! The contract library on the real files: each status file imports and
//! renders back without losing a row, bullet or line, and re-imports to the
//! same value; known sections are typed; loose files are read with findings
//! for what they miss; every finding message keeps the house style; and no
//! parser panics on mutated copies of the real documents.

use std::path::PathBuf;

use fvd_contracts::ContractKind;
use fvd_contracts::common::ParityState;
use fvd_contracts::ids::IdKind;
use fvd_contracts::phase::Phase;
use fvd_contracts::port_status::{PhaseStatus, import, plain, split_row};

const STATUS_FILES: [&str; 4] = [
    "port_status/dreamx_world.md",
    "port_status/flux.md",
    "port_status/lingbotworld2.md",
    "port_status/minimax_h3.md",
];

fn path(rel: &str) -> PathBuf {
    crate::real().join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// What must survive a round trip: each table row as its cells, each bullet
/// with whitespace collapsed, every other non-blank line trimmed.
fn content(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let t = l.trim();
            if t.starts_with('|') {
                let cells = split_row(t);
                if cells
                    .iter()
                    .all(|c| c.trim_matches(':').chars().all(|ch| ch == '-'))
                {
                    return None;
                }
                Some(format!("row:{}", cells.join("\u{1f}")))
            } else if let Some(b) = t.strip_prefix("- ") {
                Some(format!(
                    "bullet:{}",
                    b.split_whitespace().collect::<Vec<_>>().join(" ")
                ))
            } else {
                Some(format!("line:{t}"))
            }
        })
        .collect();
    out.sort();
    out
}

/// Every element of `want` is in `have`, counting repeats.
fn contained(want: &[String], have: &[String]) -> Result<(), String> {
    let mut have = have.to_vec();
    for w in want {
        match have.iter().position(|h| h == w) {
            Some(i) => {
                have.swap_remove(i);
            }
            None => return Err(w.clone()),
        }
    }
    Ok(())
}

#[test]
fn every_status_file_keeps_every_row_bullet_and_line() {
    for rel in STATUS_FILES {
        let original = read(rel);
        let (status, _) = import(&original);
        let rendered = status.render();
        if let Err(missing) = contained(&content(&original), &content(&rendered)) {
            panic!("{rel}: render dropped `{missing}`");
        }
        let (again, _) = import(&rendered);
        assert_eq!(again.render(), rendered, "{rel}: render is not stable");
        assert_eq!(again, status, "{rel}: re-import differs");
    }
}

#[test]
fn the_family_folders_hold_the_same_status_files() {
    for family in ["dreamx_world", "flux", "lingbotworld2"] {
        let folder = path(&format!(
            "fastvideo/tests/local_tests/{family}/PORT_STATUS.md"
        ));
        let text = std::fs::read_to_string(&folder)
            .unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
        assert_eq!(text, read(&format!("port_status/{family}.md")), "{family}");
    }
    assert!(!path("fastvideo/tests/local_tests/ltx2/PORT_STATUS.md").exists());
}

#[test]
fn known_rows_and_bullets_are_typed_not_verbatim() {
    let (s, findings) = import(&read("port_status/dreamx_world.md"));
    assert!(findings.is_empty(), "{findings:#?}");
    assert_eq!(s.model_family().as_deref(), Some("dreamx_world"));
    assert_eq!(s.phase(), Some(Phase::PostParityReviewAndHandoff));
    assert_eq!(s.phase_status(), Some(PhaseStatus::Complete));
    assert_eq!(s.summary.get("source_layout"), Some("`raw_official`"));
    assert_eq!(
        s.conversion_state
            .get_plain("model_index_status")
            .as_deref(),
        Some("smoke_pass")
    );
    let comps = s.components();
    assert_eq!(comps.len(), 8);
    assert_eq!(comps[0].name, "transformer");
    assert_eq!(
        comps[0].parity.as_deref(),
        Some("strict_load_and_forward_parity_pass")
    );
    assert_eq!(comps[3].parity_status, Some(ParityState::NonSkipPass));
    assert_eq!(s.parity_commands.table.rows.len(), 14);
    assert_eq!(s.open_questions.table.rows.len(), 7);
    assert_eq!(s.issues_and_blockers.table.rows.len(), 9);
    assert!(s.escape_hatches.table.rows.is_empty());
    assert_eq!(s.handoff_notes.bullets().count(), 8);
    let extras: Vec<&str> = s
        .extra_sections
        .iter()
        .map(|x| x.lines[0].as_str())
        .collect();
    assert_eq!(extras, ["## Quality Regression", "## Final Handoff"]);
    assert_eq!(s.next_id(IdKind::Question).to_string(), "Q008");
    assert_eq!(s.next_id(IdKind::EscapeHatch).to_string(), "E001");
}

#[test]
fn loose_files_import_with_findings_for_what_is_missing() {
    let (s, f) = import(&read("port_status/lingbotworld2.md"));
    assert!(f.is_empty(), "{f:#?}");
    assert_eq!(s.phase_text().as_deref(), Some("port verified"));
    assert_eq!(s.phase(), None);
    let rows = s.component_rows();
    assert_eq!(rows.len(), 6);
    assert_eq!(rows[1].component, "VAE");
    assert_eq!(rows[1].parity, "exact encode/decode pass");
    assert!(rows[1].official_definition.starts_with('`'));
    assert!(plain(&rows[1].official_definition).ends_with("/wan/modules/vae2_1.py"));

    let (s, f) = import(&read("port_status/flux.md"));
    assert_eq!(s.model_family().as_deref(), Some("flux"));
    assert_eq!(f.len(), 10, "{f:#?}");
    assert!(
        f.iter()
            .all(|x| x.message.starts_with("missing required section"))
    );
    assert_eq!(s.extra_sections.len(), 7);
    assert!(s.components().is_empty());

    let (s, f) = import(&read("port_status/minimax_h3.md"));
    assert!(f.iter().any(|x| x.field == "Component Matrix"
        && x.message == "missing required section `## Component Matrix`"));
    assert!(
        f.iter().any(|x| x.field == "Decisions"
            && x.line == 30
            && x.message.starts_with("missing table"))
    );
    assert_eq!(s.decisions.before.len(), 7);
    assert!(s.decisions.table.rows.is_empty());
    assert_eq!(s.model_family(), None);
}

#[test]
fn the_status_template_is_all_placeholders() {
    let (_, f) = import(&read("contracts/port_status_template.md"));
    let n = f
        .iter()
        .filter(|x| x.message.starts_with("placeholder"))
        .count();
    assert!(n >= 10, "{f:#?}");
}

#[test]
fn finding_messages_follow_the_house_style() {
    let mut findings = Vec::new();
    for rel in [
        "contracts/prep_handoff.md",
        "contracts/escape_hatch.md",
        "contracts/component_context.md",
        "contracts/parity_status.md",
        "contracts/conversion_request.md",
        "contracts/conversion_handoff.md",
        "contracts/component_skill_handoff.md",
        "contracts/pipeline_context.md",
        "contracts/pipeline_handoff.md",
        "contracts/final_handoff.md",
        "contracts/port_status_template.md",
        "port_status/flux.md",
        "port_status/minimax_h3.md",
    ] {
        let report = fvd_contracts::kind::check(&read(rel), None).unwrap();
        assert!(!report.findings.is_empty(), "{rel}");
        findings.extend(report.findings);
    }
    for f in &findings {
        let first = f.message.chars().next().unwrap();
        assert!(!first.is_uppercase(), "{f:?}");
        assert!(!f.message.ends_with('.'), "{f:?}");
        assert!(!f.field.is_empty(), "{f:?}");
    }
}

/// A small deterministic generator (xorshift64*), so the mutations are the
/// same on every run without a property-testing dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// Drops, duplicates, truncates, swaps, re-indents lines and drops table
/// cells, as the contract library's own fuzz test does.
fn mutate(text: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for _ in 0..1 + rng.below(12) {
        if lines.is_empty() {
            break;
        }
        let i = rng.below(lines.len());
        match rng.below(6) {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
            2 => {
                let keep = rng.below(lines[i].chars().count() + 1);
                lines[i] = lines[i].chars().take(keep).collect();
            }
            3 => {
                let mut cells: Vec<&str> = lines[i].split('|').collect();
                if cells.len() > 2 {
                    cells.remove(rng.below(cells.len()));
                    lines[i] = cells.join("|");
                }
            }
            4 => {
                let j = rng.below(lines.len());
                lines.swap(i, j);
            }
            _ => {
                let pad = " ".repeat(rng.below(7));
                lines[i] = format!("{pad}{}", lines[i].trim_start());
            }
        }
    }
    lines.join("\n")
}

#[test]
fn no_parser_panics_on_mutated_real_documents() {
    let mut sources: Vec<String> = STATUS_FILES.iter().map(|r| read(r)).collect();
    for entry in std::fs::read_dir(path("contracts")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().and_then(|e| e.to_str()) == Some("md") {
            sources.push(std::fs::read_to_string(&p).unwrap());
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for text in &sources {
        for _ in 0..16 {
            let text = mutate(text, &mut rng);
            let _ = fvd_contracts::block::parse(&text, 1);
            let _ = fvd_contracts::block::fenced_blocks(&text);
            let (status, _) = import(&text);
            let rendered = status.render();
            let (again, _) = import(&rendered);
            assert_eq!(
                again.render(),
                rendered,
                "render of an import is not stable"
            );
            for k in ContractKind::ALL {
                let _ = fvd_contracts::kind::check_block(k, &text, 1);
                let _ = fvd_contracts::kind::check(&text, Some(k));
            }
            let _ = fvd_contracts::kind::check(&text, None);
        }
    }
}
