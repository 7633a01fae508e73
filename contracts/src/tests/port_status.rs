//! `PORT_STATUS.md` import and render against the project's status files
//! (`tests/fixtures`), and status files built from code.

use super::{PORT_STATUS_FIXTURES, fixture};
use crate::common::ParityState;
use crate::ids::IdKind;
use crate::phase::Phase;
use crate::port_status::{
    ComponentRow, DecisionRow, EscapeHatchRow, IssueRow, ParityCommandRow, PhaseStatus, PortStatus,
    QuestionRow, import, plain, split_row,
};

fn read(rel: &str) -> String {
    std::fs::read_to_string(fixture(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// What must survive a round trip: each table row as its cells, each bullet
/// with whitespace collapsed, every other non-blank line trimmed. Table
/// separators and blank lines are layout, not content.
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
fn every_fixture_keeps_every_row_bullet_and_line() {
    for (_, rel) in PORT_STATUS_FIXTURES {
        let original = read(rel);
        let (status, _) = import(&original);
        let rendered = status.render();
        if let Err(missing) = contained(&content(&original), &content(&rendered)) {
            panic!("{rel}: render dropped `{missing}`");
        }
        // rendering is a fixed point: importing the rendering changes nothing
        let (again, _) = import(&rendered);
        assert_eq!(again.render(), rendered, "{rel}: render is not stable");
        assert_eq!(again, status, "{rel}: re-import differs");
    }
}

#[test]
fn known_rows_and_bullets_are_typed_not_verbatim() {
    let (s, findings) = import(&read("fastvideo/tests/local_tests/orbitcam/PORT_STATUS.md"));
    assert!(findings.is_empty(), "{findings:#?}");
    assert_eq!(s.model_family().as_deref(), Some("orbitcam"));
    assert_eq!(
        s.phase_text().as_deref(),
        Some("phase_11_post_parity_handoff")
    );
    assert_eq!(s.phase(), Some(Phase::PostParityReviewAndHandoff));
    assert_eq!(s.phase_status(), Some(PhaseStatus::Complete));
    assert_eq!(s.summary.get("source_layout"), Some("`raw_official`"));
    assert_eq!(
        s.summary.get_plain("source_layout").as_deref(),
        Some("raw_official")
    );
    // an extra key the contract does not define stays in place
    assert_eq!(
        s.conversion_state
            .get_plain("model_index_status")
            .as_deref(),
        Some("written_and_loaded")
    );
    let comps = s.components();
    assert_eq!(comps.len(), 6);
    // a component named with its class in backticks keeps the whole cell
    assert_eq!(comps[0].name, "Transformer (`OrbitCamTransformer3DModel`)");
    assert_eq!(comps[0].parity.as_deref(), Some("forward_parity_pass"));
    assert_eq!(comps[0].parity_status, None);
    assert_eq!(comps[2].name, "text_encoder/tokenizer");
    assert_eq!(comps[3].parity_status, Some(ParityState::NonSkipPass));
    assert_eq!(s.parity_commands.table.rows.len(), 8);
    // the row that runs two test files under a PYTHONPATH prefix
    let two_files = s
        .parity_commands
        .table
        .cell(5, "Command")
        .expect("command cell");
    assert!(two_files.starts_with("`PYTHONPATH=/workspace/FastVideo python -m pytest "));
    assert_eq!(two_files.matches(".py").count(), 2, "{two_files}");
    assert_eq!(s.open_questions.table.rows.len(), 3);
    assert_eq!(s.issues_and_blockers.table.rows.len(), 3);
    assert!(s.escape_hatches.table.rows.is_empty());
    assert_eq!(s.decisions.table.rows.len(), 3);
    assert_eq!(s.handoff_notes.bullets().count(), 4);
    let extras: Vec<&str> = s
        .extra_sections
        .iter()
        .map(|x| x.lines[0].as_str())
        .collect();
    assert_eq!(extras, ["## Quality Regression", "## Final Handoff"]);
    // the rows written after the final handoff stay with it, verbatim
    let last = s.extra_sections[1].lines.last().expect("lines");
    assert!(last.starts_with("| 2026-08-14 |"), "{last}");
    assert_eq!(s.next_id(IdKind::Question).to_string(), "Q004");
    assert_eq!(s.next_id(IdKind::Issue).to_string(), "I004");
    assert_eq!(s.next_id(IdKind::EscapeHatch).to_string(), "E001");
}

#[test]
fn loose_files_import_with_findings_for_what_is_missing() {
    let (s, f) = import(&read("fastvideo/tests/local_tests/tidewave/PORT_STATUS.md"));
    assert!(f.is_empty(), "{f:#?}");
    assert_eq!(s.phase_text().as_deref(), Some("port verified"));
    assert_eq!(s.phase(), None);
    assert_eq!(s.phase_status(), Some(PhaseStatus::Complete));
    let rows = s.component_rows();
    assert_eq!(rows.len(), 5);
    assert_eq!(rows[1].component, "VAE");
    assert_eq!(rows[1].parity, "exact encode/decode");
    assert!(rows[1].official_definition.starts_with('`'));
    assert_eq!(
        plain(&rows[1].official_definition),
        "/data/shared/ports/tidewave-ref/tidewave/vae.py"
    );

    let (s, f) = import(&read(
        "fastvideo/tests/local_tests/pixelflow/PORT_STATUS.md",
    ));
    assert_eq!(s.model_family().as_deref(), Some("pixelflow"));
    assert_eq!(f.len(), 10, "{f:#?}");
    assert!(
        f.iter()
            .all(|x| x.message.starts_with("missing required section"))
    );
    assert_eq!(s.extra_sections.len(), 7);
    assert!(s.components().is_empty());

    let (s, f) = import(&read("port_status/sparse.md"));
    assert!(f.iter().any(|x| x.field == "Component Matrix"
        && x.message == "missing required section `## Component Matrix`"));
    // its Decisions section is bullets, not the contract's table: kept, reported
    assert!(
        f.iter().any(|x| x.field == "Decisions"
            && x.line == 29
            && x.message.starts_with("missing table"))
    );
    assert_eq!(s.decisions.before.len(), 7);
    assert!(s.decisions.table.rows.is_empty());
    assert_eq!(s.model_family(), None);
}

#[test]
fn credentials_in_a_status_file_are_found_and_never_repeated() {
    let text = read("port_status/leaky.md");
    let (s, f) = import(&text);
    let lines: Vec<(usize, &str)> = f.iter().map(|x| (x.line, x.field.as_str())).collect();
    assert_eq!(
        lines,
        [(26, "table row"), (42, "table row"), (54, "table row")],
        "{f:#?}"
    );
    for secret in [
        "hf_QuillonFixtureNotARealToken7x2Kq9Lm",
        "qF1xtureB3arerValue9Zk27Lm44Np",
        "QfixtureApiKey0a9b8c7d6e5f4",
    ] {
        assert!(text.contains(secret), "the fixture holds {secret}");
        assert!(
            f.iter()
                .all(|x| !x.message.contains(secret) && !x.field.contains(secret)),
            "{f:#?}"
        );
    }
    // the rest of the file is a normal in-progress port with an open hatch
    assert_eq!(s.phase(), Some(Phase::ComponentParityDebug));
    assert_eq!(s.phase_status(), Some(PhaseStatus::Blocked));
    assert_eq!(s.next_id(IdKind::EscapeHatch).to_string(), "E002");
}

#[test]
fn rendered_fixtures_snapshot() {
    for (name, rel) in PORT_STATUS_FIXTURES {
        let (status, _) = import(&read(rel));
        insta::assert_snapshot!(format!("render_{name}"), status.render());
    }
}

fn filled() -> PortStatus {
    let mut s = PortStatus::new("Wan22 Mini", "wan22_mini");
    for (k, v) in [
        ("workload_types", "`T2V`"),
        ("official_ref", "`https://github.com/example/wan22-mini`"),
        ("official_ref_dir", "`Wan22Mini/`"),
        ("hf_weights_path", "`example/Wan22-Mini`"),
        ("local_weights_dir", "`official_weights/wan22_mini`"),
        ("source_layout", "`raw_official`"),
        (
            "local_tests_readme",
            "`tests/local_tests/wan22_mini/README.md`",
        ),
    ] {
        s.summary.set(k, v);
    }
    s.set_phase(
        Phase::ComponentParityDebug,
        PhaseStatus::InProgress,
        "component:vae",
        "2026-11-26",
    );
    for (k, v) in [
        (
            "conversion_script",
            "`scripts/checkpoint_conversion/wan22_mini_to_diffusers.py`",
        ),
        ("converted_weights_dir", "`converted_weights/wan22_mini`"),
        ("source_layout", "`raw_official`"),
        ("strict_load_status", "`pass`"),
        ("passthrough_components", "`none`"),
        ("retry_history", "`none`"),
    ] {
        s.conversion_state.set(k, v);
    }
    s.push_component(ComponentRow {
        component: "vae".into(),
        component_type: "vae".into(),
        reuse_port: "reuse".into(),
        official_definition: "`Wan22Mini/models/vae.py`".into(),
        official_instantiation: "`Wan22Mini/inference.py`".into(),
        fastvideo_target: "`fastvideo/models/vaes/wanvae.py`".into(),
        prototype: "pass".into(),
        conversion: "pass".into(),
        parity: "`debug_red`".into(),
        open_issues: "I001".into(),
    })
    .push_parity_command(ParityCommandRow {
        scope: "vae".into(),
        command: "`pytest tests/local_tests/vaes/test_wan22_mini_vae_parity.py -v -s`".into(),
        last_result: "debug_red".into(),
        notes: "first divergence in decoder.up.2".into(),
    })
    .push_question(QuestionRow {
        id: "Q001".into(),
        question: "Ship the 480p preset only?".into(),
        owner: "user".into(),
        needed_by_phase: "P8".into(),
        status: "open".into(),
        resolution: String::new(),
    })
    .push_issue(IssueRow {
        id: "I001".into(),
        phase: "P6".into(),
        component: "vae".into(),
        severity: "high".into(),
        issue: "decoder drift".into(),
        evidence: "max abs 0.3 at decoder.up.2".into(),
        owner: "component:vae".into(),
        status: "open".into(),
        resolution: String::new(),
    })
    .push_escape_hatch(EscapeHatchRow {
        id: "E001".into(),
        phase: "P6".into(),
        decision_type: "blocker".into(),
        question: "Accept fp32 decode?".into(),
        recommended_option: "keep bf16 and fix the norm".into(),
        status: "open".into(),
        resolution: String::new(),
    })
    .push_decision(DecisionRow {
        date: "2026-11-26".into(),
        decision: "Reuse the Wan VAE".into(),
        rationale: "same graph and shapes".into(),
        impact: "vae".into(),
    });
    s.handoff_notes
        .push_bullet("vae parity is red at decoder.up.2; see I001");
    s
}

#[test]
fn a_status_built_in_code_renders_validates_and_reimports() {
    let s = filled();
    assert_eq!(s.validate(), vec![]);
    let text = s.render();
    let (back, findings) = import(&text);
    assert!(findings.is_empty(), "{findings:#?}");
    assert_eq!(back, s);
    assert_eq!(back.phase(), Some(Phase::ComponentParityDebug));
    assert_eq!(
        back.components()[0].parity_status,
        Some(ParityState::DebugRed)
    );
    assert_eq!(back.next_id(IdKind::Issue).to_string(), "I002");
    insta::assert_snapshot!("render_built_in_code", text);
}

#[test]
fn a_fresh_skeleton_reports_every_empty_required_value() {
    let s = PortStatus::new("Wan22 Mini", "wan22_mini");
    let f = s.validate();
    // 7 summary + 4 current phase + 6 conversion state values are empty
    assert_eq!(f.len(), 17, "{f:#?}");
    assert!(f.iter().all(|x| x.message == "missing value"));
    assert_eq!(PortStatus::default().validate().len(), 19);
}

#[test]
fn status_rules_fire() {
    let base = filled().render();
    let dup = base.replace("| I001 | P6 |", "| Q001 | P6 |");
    let (_, f) = import(&dup);
    assert!(
        f.iter()
            .any(|x| x.field == "ID" && x.message.contains("expected I###")),
        "{f:#?}"
    );

    let twice = base.replace(
        "| Q001 | Ship the 480p preset only? |",
        "| Q001 | Ship the 480p preset only? | user | P8 | open |  |\n| Q001 | Ship the 480p preset only? |",
    );
    let (_, f) = import(&twice);
    assert!(
        f.iter()
            .any(|x| x.message.contains("Q001 is used by more than one row")),
        "{f:#?}"
    );

    let (_, f) = import(&base.replace("- status: `in_progress`", "- status: `running`"));
    assert!(
        f.iter()
            .any(|x| x.field == "status" && x.message.contains("expected one of"))
    );
    let (_, f) = import(&base.replace("- owner: `component:vae`", "- owner: `bob`"));
    assert!(f.iter().any(|x| x.field == "owner"));

    let (_, f) = import(&base.replace("| Parity | Open Issues |", "| Open Issues |"));
    assert!(
        f.iter()
            .any(|x| x.field == "Component Matrix" && x.message == "missing column `Parity`")
    );

    let token = super::examples::fake_hf_token();
    let leaked = base.replace("decoder drift", &format!("decoder drift, used {token}"));
    let (_, f) = import(&leaked);
    let hit = f
        .iter()
        .find(|x| x.message.contains("hugging face token"))
        .expect("token finding");
    assert_eq!(hit.field, "table row");
    assert!(f.iter().all(|x| !x.message.contains(&token)));

    let (_, f) = import(&read("contracts/port_status_template.md"));
    assert!(
        f.iter()
            .filter(|x| x.message.starts_with("placeholder"))
            .count()
            >= 10,
        "{f:#?}"
    );
}

#[test]
fn a_hatch_must_match_an_escape_hatch_row() {
    use crate::contract::Contract;
    use crate::escape_hatch::EscapeHatch;
    let s = filled();
    assert_eq!(s.ids(IdKind::EscapeHatch).len(), 1);
    let hatch = EscapeHatch::parse(super::examples::ESCAPE_NESTED).unwrap();
    assert_eq!(s.check_escape_hatch(&hatch), vec![]);
    let other =
        EscapeHatch::parse(&super::examples::ESCAPE_NESTED.replace("E001", "E002")).unwrap();
    let f = s.check_escape_hatch(&other);
    assert_eq!(f.len(), 1);
    assert_eq!(
        f[0].message,
        "cites E002, which has no row in the Escape Hatches table"
    );
    let none =
        EscapeHatch::parse(&super::examples::ESCAPE_NESTED.replace("E001", "see log")).unwrap();
    assert!(s.check_escape_hatch(&none)[0].message.contains("must cite"));
}

/// Random status files built through the public fields, for the round trip.
mod random {
    use crate::fields::sample::Gen;
    use crate::port_status::{
        ExtraSection, FieldLine, FieldList, PortStatus, SectionId, Table, TableSection,
    };

    // cell and value text: backticks, pipes (escaped on render), colons,
    // angle brackets, unicode; never a newline or edge whitespace
    const WORDS: &[&str] = &[
        "`raw_official`",
        "non_skip_pass",
        "a | b",
        "x: y",
        "tests/local_tests/foo/test_foo_vae_parity.py",
        "<= 81 frames",
        "ümlaut → ok",
        "max_diff=0.5",
        "Q001",
        "--",
        "50%",
    ];

    fn text(g: &mut Gen) -> String {
        let n = 1 + g.below(3);
        (0..n)
            .map(|_| WORDS[g.below(WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Prose a section keeps verbatim: nothing a reader would take for a
    /// bullet, a table row, a heading or a fence.
    fn prose(g: &mut Gen) -> Vec<String> {
        let n = g.below(3);
        (0..n)
            .map(|i| format!("Note {i}: {}", text(g).replace('|', "/")))
            .collect()
    }

    fn fields(g: &mut Gen, keys: bool) -> FieldList {
        let n = g.below(5);
        let mut lines = Vec::new();
        for i in 0..n {
            lines.push(match g.below(4) {
                0 if keys => FieldLine::Field {
                    key: format!("key_{i}"),
                    value: String::new(),
                },
                1 | 2 if keys => FieldLine::Field {
                    key: format!("key_{i}"),
                    value: text(g),
                },
                _ if keys => FieldLine::Bullet(text(g).replace(':', ";")),
                _ => FieldLine::Bullet(text(g)),
            });
        }
        if n > 0 && g.below(3) == 0 {
            lines.push(FieldLine::Verbatim(format!(
                "Trailing prose {}",
                g.below(9)
            )));
        }
        FieldList { lines }
    }

    fn table(g: &mut Gen) -> TableSection {
        let cols = 1 + g.below(5);
        let header: Vec<String> = (0..cols).map(|c| format!("Col {c}")).collect();
        let rows = (0..g.below(4))
            .map(|_| {
                let width = if g.below(4) == 0 {
                    g.below(cols + 2)
                } else {
                    cols
                };
                (0..width)
                    .map(|_| {
                        if g.below(5) == 0 {
                            String::new()
                        } else {
                            text(g)
                        }
                    })
                    .collect()
            })
            .collect();
        TableSection {
            before: prose(g),
            table: Table { header, rows },
            after: prose(g),
        }
    }

    pub fn status(seed: u64) -> PortStatus {
        let g = &mut Gen::new(seed);
        let mut extra_sections: Vec<ExtraSection> = (0..g.below(4))
            .map(|i| {
                let pick = g.below(SectionId::ALL.len() + 1);
                let mut lines = vec![format!("## Extra {i}")];
                lines.extend(prose(g));
                ExtraSection {
                    after: SectionId::ALL.get(pick).copied(),
                    lines,
                }
            })
            .collect();
        // render groups extras by anchor in contract order; import reads
        // them back in that order
        extra_sections.sort_by_key(|x| x.after);
        PortStatus {
            title: if g.below(5) == 0 {
                String::new()
            } else {
                format!("{} Port Status", text(g))
            },
            preamble: prose(g),
            summary: fields(g, true),
            current_phase: fields(g, true),
            component_matrix: table(g),
            conversion_state: fields(g, true),
            parity_commands: table(g),
            open_questions: table(g),
            issues_and_blockers: table(g),
            escape_hatches: table(g),
            decisions: table(g),
            handoff_notes: fields(g, false),
            extra_sections,
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    #[test]
    fn port_status_round_trips(seed: u64) {
        let s = random::status(seed);
        let text = s.render();
        let (back, _) = import(&text);
        proptest::prop_assert_eq!(back, s, "rendered:\n{}", text);
    }
}

/// The co-author on the real files: a run that did not test the code
/// changes nothing; one that did changes only what fvd owns, once.
#[test]
fn the_co_author_keeps_every_real_file_but_its_own_cells() {
    use crate::coauthor::{ComponentInput, Input, Run, patch};
    use crate::status_guard::owned_changes;
    let input = |verdict: &str, names: &[&str]| Input {
        date: "2026-11-26".into(),
        components: names
            .iter()
            .map(|n| ComponentInput {
                name: (*n).into(),
                component_type: "generic".into(),
                parity_tests: vec![format!("tests/local_tests/x/test_{n}_parity.py")],
                command: format!("python3 -m pytest tests/local_tests/x/test_{n}_parity.py -q"),
                run: Some(Run {
                    verdict: super::coauthor::recorded(verdict, "error:collection:"),
                    reason: format!("{verdict}: t::{n}: 2 != 3"),
                    run_no: 1,
                    worker: "w1".into(),
                    gpu: String::new(),
                    variants: String::new(),
                    by: String::new(),
                }),
                ..ComponentInput::default()
            })
            .collect(),
        escapes: Vec::new(),
        gate: Default::default(),
    };
    let names = [
        "transformer",
        "vae",
        "text_encoder",
        "scheduler",
        "pipeline",
    ];
    for (_, rel) in PORT_STATUS_FIXTURES {
        let text = read(rel);
        for untested in ["environment", "cancelled", "infra_error"] {
            assert_eq!(
                patch(&text, &input(untested, &names)),
                text,
                "{rel} {untested}"
            );
        }
        for verdict in ["non_skip_pass", "debug_red", "scaffold_skip", "error"] {
            let i = input(verdict, &names);
            let once = patch(&text, &i);
            if let Err(e) = owned_changes(&text, &once) {
                panic!("{rel} {verdict}: {e}");
            }
            assert_eq!(patch(&once, &i), once, "{rel} {verdict}");
        }
    }
    // the finished port: a red transformer is a regression; its composite
    // text encoder row is matched, not doubled
    let text = read("fastvideo/tests/local_tests/orbitcam/PORT_STATUS.md");
    let mut i = input("non_skip_pass", &names);
    i.components[0].run.as_mut().unwrap().verdict = crate::recorded::RecordedVerdict::DebugRed;
    let once = patch(&text, &i);
    let changes = owned_changes(&text, &once).unwrap();
    assert!(
        once.contains(
            "| forward_parity_pass [fvd 2026-11-26 run 1 on w1: debug_red (regression)] |"
        ),
        "{once}"
    );
    assert_eq!(
        once.lines().filter(|l| l.contains("text_encoder")).count(),
        text.lines().filter(|l| l.contains("text_encoder")).count()
    );
    assert!(
        changes
            .added
            .iter()
            .any(|l| l.contains("the final handoff above is superseded"))
    );
    // after the block's closing fence, before the rows that follow it
    let block = once.find("final_handoff:").expect("handoff block kept");
    let fence_end = block + once[block..].find("```").unwrap();
    let superseded = once.find("the final handoff above is superseded").unwrap();
    let stray = fence_end + once[fence_end..].find("\n| 20").unwrap();
    assert!(fence_end < superseded && superseded < stray, "{once}");
}
