//! The co-author past P6 (issue #42): the later phases' steps (pipeline
//! smoke and parity, the example, quality tests) are not components, so
//! they get no Component Matrix row and take the porter's `pipeline`
//! Parity Commands row; Current Phase follows the gate's phase; a pipeline
//! that sent the port back to P6 is explained; P11 gets its checklist.

use crate::coauthor::{
    BackReason, BackToP6, ComponentInput, GateInput, Input, Run, Stage, Standing, parse_moved_back,
    parse_moved_forward, patch, row_matches,
};
use crate::phase::Phase;
use crate::port_status::{EscapeHatchRow, import};
use crate::status_guard::owned_changes;

use super::coauthor::recorded;

const DATE: &str = "2026-12-03";

fn shape() -> String {
    std::fs::read_to_string(super::fixture("status_shapes/pipeline_rows.md")).unwrap()
}

fn step(name: &str, stage: Stage, test: &str, verdict: &str) -> ComponentInput {
    ComponentInput {
        name: name.into(),
        stage,
        component_type: "generic".into(),
        parity_tests: vec![test.into()],
        command: format!("python3 -m pytest {test} -q"),
        run: Some(Run {
            verdict: recorded(verdict, ""),
            reason: format!("{verdict}: 2 passed"),
            run_no: 1,
            worker: "w1".into(),
            ..Run::default()
        }),
        ..ComponentInput::default()
    }
}

/// The widget port: two components and every later step, all passing
/// but the quality test, whose verdict is `quality`.
fn widget(quality: &str) -> Vec<ComponentInput> {
    let mut example = step(
        "pipeline_example",
        Stage::Example,
        "examples/widget_basic.py",
        "non_skip_pass",
    );
    example.command = "python examples/widget_basic.py".into();
    vec![
        step(
            "transformer",
            Stage::Component,
            "tests/local_tests/widget/test_widget_transformer_parity.py",
            "non_skip_pass",
        ),
        step(
            "vae",
            Stage::Component,
            "tests/local_tests/widget/test_widget_vae_parity.py",
            "non_skip_pass",
        ),
        step(
            "pipeline_smoke",
            Stage::Pipeline,
            "tests/local_tests/pipelines/test_widget_pipeline_smoke.py",
            "non_skip_pass",
        ),
        step(
            "pipeline_parity",
            Stage::Pipeline,
            "tests/local_tests/pipelines/test_widget_pipeline_parity.py",
            "non_skip_pass",
        ),
        example,
        step(
            "quality_widget_similarity",
            Stage::Quality,
            "fastvideo/tests/ssim/test_widget_similarity.py",
            quality,
        ),
    ]
}

fn input(components: Vec<ComponentInput>, gate: GateInput) -> Input {
    Input {
        date: DATE.into(),
        components,
        escapes: Vec::new(),
        gate,
    }
}

fn at(phase: Phase, standing: Standing) -> GateInput {
    GateInput {
        phase: Some(phase),
        standing,
        ..GateInput::default()
    }
}

fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text
        .find(&format!("## {title}\n"))
        .unwrap_or_else(|| panic!("no {title} in\n{text}"));
    let rest = &text[start + 3..];
    &text[start..start + 3 + rest.find("\n## ").unwrap_or(rest.len())]
}

fn field<'a>(text: &'a str, key: &str) -> &'a str {
    let prefix = format!("- {key}: ");
    section(text, "Current Phase")
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
}

/// The findings `fvd contracts check` reports about a file.
fn findings(text: &str) -> Vec<String> {
    import(text).1.iter().map(|f| format!("{f:?}")).collect()
}

#[test]
fn steps_get_no_matrix_row_and_take_the_porter_s_pipeline_row() {
    let before = shape();
    let input = input(widget("non_skip_pass"), GateInput::default());
    let after = patch(&before, &input);
    owned_changes(&before, &after).unwrap();
    let matrix = section(&after, "Component Matrix");
    assert_eq!(
        matrix.lines().filter(|l| l.starts_with("| ")).count(),
        4,
        "a step got a matrix row:\n{matrix}"
    );
    for step in ["pipeline_", "quality_"] {
        assert!(!matrix.contains(step), "{step}:\n{matrix}");
    }
    let commands = section(&after, "Parity Commands");
    // the porter's `pipeline` row runs the parity test: fvd writes there
    assert!(
        commands.contains("| pipeline | `python -m pytest tests/local_tests/pipelines/test_widget_pipeline_parity.py -v -s` | `non_skip_pass` | 2026-06-01: compares against the official pipeline at 2 steps. [fvd "),
        "{commands}"
    );
    assert!(!commands.contains("| pipeline_parity |"), "{commands}");
    // the steps without a row get one, scoped as the contract scopes them
    for (scope, test) in [
        ("pipeline", "test_widget_pipeline_smoke.py"),
        ("pipeline", "examples/widget_basic.py"),
        ("quality", "test_widget_similarity.py"),
    ] {
        assert!(
            commands
                .lines()
                .any(|l| l.starts_with(&format!("| {scope} | `")) && l.contains(test)),
            "{scope} {test}:\n{commands}"
        );
    }
    assert_eq!(patch(&after, &input), after, "a second write changed it");
    assert_eq!(findings(&after), findings(&before));
}

#[test]
fn a_porter_s_row_running_smoke_and_parity_is_not_doubled() {
    // one porter's row for both pipeline tests (FastVideo's dreamx_world)
    let before = shape().replace(
        "| pipeline | `python -m pytest tests/local_tests/pipelines/test_widget_pipeline_parity.py -v -s` |",
        "| pipeline_smoke | `python -m pytest tests/local_tests/pipelines/test_widget_pipeline_smoke.py tests/local_tests/pipelines/test_widget_pipeline_parity.py -q -rs` |",
    );
    let input = input(widget("non_skip_pass"), GateInput::default());
    let after = patch(&before, &input);
    owned_changes(&before, &after).unwrap();
    let commands = section(&after, "Parity Commands");
    assert!(!commands.contains("| pipeline_parity |"), "{commands}");
    assert_eq!(
        commands
            .lines()
            .filter(|l| l.contains("test_widget_pipeline_parity.py"))
            .count(),
        1,
        "{commands}"
    );
    // the parity test's evidence is in fvd's section
    assert!(after.contains("| `pipeline_parity` |"), "{after}");
    assert_eq!(patch(&after, &input), after);
}

#[test]
fn current_phase_follows_the_gate_past_p7_and_keeps_the_porter_s_values() {
    let before = shape();
    // without the gate's word, every component's pass moves it on to P7
    let p7 = patch(
        &before,
        &input(widget("non_skip_pass"), GateInput::default()),
    );
    assert_eq!(field(&p7, "phase"), "`phase_7_pipeline_stages_variants`");

    let waiting = at(Phase::PostParityReviewAndHandoff, Standing::Waiting);
    let p11 = patch(&before, &input(widget("non_skip_pass"), waiting.clone()));
    owned_changes(&before, &p11).unwrap();
    assert_eq!(
        field(&p11, "phase"),
        "`phase_11_post_parity_review_handoff`"
    );
    assert_eq!(field(&p11, "status"), "`in_progress`");
    assert_eq!(field(&p11, "owner"), "`orchestrator`");
    assert_eq!(field(&p11, "last_updated"), format!("`{DATE}`"));
    assert!(
        p11.contains(
            "- the port is at P11 (post-parity review and handoff) and waits for a person's review."
        ),
        "{p11}"
    );
    let kept = p11
        .lines()
        .find_map(parse_moved_forward)
        .expect("a moved-forward bullet");
    assert_eq!(
        kept,
        vec![
            (
                "phase".to_owned(),
                Some("`phase_6_component_parity_debug`".to_owned())
            ),
            ("status".to_owned(), Some("`in_progress`".to_owned())),
            ("owner".to_owned(), Some("`component:vae`".to_owned())),
            ("last_updated".to_owned(), Some("`2026-06-02`".to_owned())),
        ]
    );
    assert!(findings(&p11).is_empty(), "{:?}", findings(&p11));
    assert_eq!(patch(&p11, &input(widget("non_skip_pass"), waiting)), p11);

    // from P7 (fvd's values) on to where the gate is; the bullet keeps
    // the porter's values, not fvd's
    for (gate, phase, status) in [
        (
            at(Phase::QualityRegression, Standing::AskUser),
            "phase_10_quality_regression",
            "blocked",
        ),
        (
            at(
                Phase::ParityActivationAndLocalVerification,
                Standing::Blocked,
            ),
            "phase_9_parity_activation_local_verification",
            "blocked",
        ),
    ] {
        let next = patch(&p7, &input(widget("non_skip_pass"), gate));
        owned_changes(&p7, &next).unwrap();
        assert_eq!(field(&next, "phase"), format!("`{phase}`"));
        assert_eq!(field(&next, "status"), format!("`{status}`"));
        assert_eq!(next.lines().filter_map(parse_moved_forward).count(), 1);
        assert_eq!(
            next.lines().find_map(parse_moved_forward).unwrap()[2].1,
            Some("`component:vae`".to_owned())
        );
        assert!(findings(&next).is_empty(), "{:?}", findings(&next));
    }

    // a component's regression at P11 moves it back with the porter's values
    let mut red = widget("non_skip_pass");
    red[0].run.as_mut().unwrap().verdict = recorded("debug_red", "");
    red[0].run.as_mut().unwrap().reason = "debug_red: t: off by 0.4".into();
    let back = patch(
        &p11,
        &input(red, at(Phase::ComponentParityDebug, Standing::Running)),
    );
    owned_changes(&p11, &back).unwrap();
    assert_eq!(field(&back, "phase"), "`phase_6_component_parity_debug`");
    let old = back.lines().find_map(parse_moved_back).expect("moved back");
    assert_eq!(
        old[0],
        (
            "phase".to_owned(),
            Some("`phase_6_component_parity_debug`".to_owned())
        )
    );
    assert_eq!(
        old[2],
        ("owner".to_owned(), Some("`component:vae`".to_owned()))
    );
}

#[test]
fn a_move_back_by_the_pipeline_is_explained_and_then_fixed() {
    let before = shape();
    let p7 = patch(
        &before,
        &input(
            widget("non_skip_pass"),
            at(Phase::PipelineStagesAndVariants, Standing::Running),
        ),
    );
    assert_eq!(field(&p7, "owner"), "`pipeline`");
    let mut gate = at(Phase::ComponentParityDebug, Standing::Running);
    gate.back_to_p6 = Some(BackToP6 {
        component: "vae".into(),
        reason: BackReason::Diverged {
            module: "vae.decoder.up.0".into(),
        },
        fixed: false,
    });
    let mut comps = widget("non_skip_pass");
    comps[3].run.as_mut().unwrap().verdict = recorded("debug_red", "");
    let back = patch(&p7, &input(comps, gate.clone()));
    owned_changes(&p7, &back).unwrap();
    assert_eq!(field(&back, "phase"), "`phase_6_component_parity_debug`");
    assert_eq!(field(&back, "owner"), "`component:vae`");
    let line = "- back to P6: the pipeline parity test diverged first at `vae.decoder.up.0`, in component `vae`'s modules, and the port went back to P6 for it.";
    assert!(back.contains(line), "{back}");
    assert!(findings(&back).is_empty(), "{:?}", findings(&back));

    gate.phase = Some(Phase::PipelineStagesAndVariants);
    gate.back_to_p6.as_mut().unwrap().fixed = true;
    let fixed = patch(&back, &input(widget("non_skip_pass"), gate));
    owned_changes(&back, &fixed).unwrap();
    assert_eq!(field(&fixed, "phase"), "`phase_7_pipeline_stages_variants`");
    assert!(!fixed.contains(line), "{fixed}");
    assert!(
        fixed.contains("for it; fixed: the latest P7 passed."),
        "{fixed}"
    );
    // the porter's values are still the ones kept
    assert_eq!(
        fixed.lines().find_map(parse_moved_forward).unwrap()[2].1,
        Some("`component:vae`".to_owned())
    );
}

#[test]
fn p11_gets_a_checklist_ticked_from_fvd_s_records() {
    let before = shape();
    let mut gate = at(Phase::PostParityReviewAndHandoff, Standing::Waiting);
    gate.quality_deferred = Some("E001".into());
    let mut input = input(widget("scaffold_skip"), gate);
    input.escapes = vec![EscapeHatchRow {
        id: "E001".into(),
        phase: "P10".into(),
        decision_type: "`blocker`".into(),
        question: "seed the references or defer?".into(),
        recommended_option: "seed".into(),
        status: "`resolved`".into(),
        resolution: "answered: defer".into(),
    }];
    let after = patch(&before, &input);
    owned_changes(&before, &after).unwrap();
    for line in [
        "- [x] every required component has a non-skip parity pass (`transformer`, `vae`)",
        "- [x] pipeline step `pipeline_smoke` has a non-skip pass",
        "- [x] pipeline step `pipeline_parity` has a non-skip pass",
        "- [x] the basic example ran to exit status 0",
        "- [ ] quality regression deferred in answer to E001",
        "- [x] every escape hatch fvd raised is answered",
        "- [ ] a person's: ",
    ] {
        assert!(after.contains(line), "{line}:\n{after}");
    }
    assert!(findings(&after).is_empty(), "{:?}", findings(&after));
    assert_eq!(patch(&after, &input), after);

    // an open question and a red example are not ticked
    input.escapes[0].status = "`open`".into();
    input.gate.quality_deferred = None;
    input.components[4].run.as_mut().unwrap().verdict = recorded("debug_red", "");
    let open = patch(&before, &input);
    for line in [
        "- [ ] every escape hatch answered (open: E001)",
        "- [ ] the basic example ran to exit status 0",
        "- [ ] quality regression has no pass yet (`quality_widget_similarity`)",
    ] {
        assert!(open.contains(line), "{line}:\n{open}");
    }
    // before P11 there is no checklist
    input.gate.phase = Some(Phase::QualityRegression);
    assert!(!patch(&before, &input).contains("pre-handoff checklist"));
}

#[test]
fn a_step_s_evidence_without_a_commands_table_goes_to_fvd_s_section() {
    // the matrix only: a step has no row to add there
    let shape = shape();
    let start = shape.find("## Parity Commands").unwrap();
    let end = shape.find("## Open Questions").unwrap();
    let before = format!("{}{}", &shape[..start], &shape[end..]);
    let comps = widget("non_skip_pass");
    let after = patch(&before, &input(comps.clone(), GateInput::default()));
    owned_changes(&before, &after).unwrap();
    assert!(!after.contains("| `pipeline_smoke` | `"), "{after}");
    assert!(
        after.contains("| `pipeline_parity` | no pass recorded |"),
        "{after}"
    );
    let m = row_matches(&before, &comps);
    assert!(m[2].matrix.is_none() && m[2].section, "{:?}", m[2]);
    // the dry run's matches: a step never matches a matrix row; one whose
    // test another step's row runs is said to go to fvd's section
    let both = shape.replace(
        "| pipeline | `python -m pytest tests/local_tests/pipelines/test_widget_pipeline_parity.py -v -s` |",
        "| pipeline_smoke | `python -m pytest tests/local_tests/pipelines/test_widget_pipeline_smoke.py tests/local_tests/pipelines/test_widget_pipeline_parity.py` |",
    );
    let m = row_matches(&both, &comps);
    assert!(m[2].parity.is_some() && !m[2].section, "{:?}", m[2]);
    assert!(m[3].parity.is_none() && m[3].section, "{:?}", m[3]);
    assert!(m.iter().skip(2).all(|r| r.matrix.is_none()), "{m:?}");
}
