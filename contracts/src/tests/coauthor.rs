//! The co-author on status files the project writes itself, shaped like
//! real ones: a finished port (phase 11, rich Parity cells, dated notes, a
//! composite `text_encoder/tokenizer` row, a `Transformer (`Class`)` row, a
//! two-file command with a `PYTHONPATH=` prefix, an escaped pipe, a final
//! handoff block with table rows after it) and a free-form file that lacks
//! most contract sections.

use crate::coauthor::{
    ComponentInput, Input, Outcome, Run, create, patch, reads_as_pass, row_matches,
};
use crate::port_status::{EscapeHatchRow, PortStatus, import};
use crate::recorded::RecordedVerdict;
use crate::status_guard::owned_changes;

const FINISHED: &str = include_str!("status_files/finished.md");
const FREEFORM: &str = include_str!("status_files/freeform.md");
const DATE: &str = "2026-11-26";

fn component(name: &str, tests: &[&str]) -> ComponentInput {
    let tests: Vec<String> = tests
        .iter()
        .map(|t| format!("tests/local_tests/widget_world/{t}"))
        .collect();
    ComponentInput {
        name: name.into(),
        stage: Default::default(),
        aliases: Vec::new(),
        component_type: "generic".into(),
        command: format!(
            "python3 -m pytest {} -q -p no:cacheprovider",
            tests.join(" ")
        ),
        parity_tests: tests,
        run: None,
    }
}

/// The widget port's spec components.
fn widget() -> Vec<ComponentInput> {
    vec![
        component("transformer", &["test_widget_transformer_parity.py"]),
        component("vae", &["test_widget_vae_parity.py"]),
        component("text_encoder", &["test_widget_text_encoder_parity.py"]),
        component("scheduler", &["test_widget_scheduler_parity.py"]),
        component(
            "ar_stack",
            &["test_widget_ar_conversion.py", "test_widget_ar_parity.py"],
        ),
    ]
}

/// The recorded verdict a test names by its text; an `error` takes the kind
/// its reason names (`error:collection: …`), as the run's classification
/// gave it.
pub(crate) fn recorded(verdict: &str, reason: &str) -> RecordedVerdict {
    let v: RecordedVerdict = verdict.parse().expect("a verdict text");
    if v.as_str() != "error" {
        return v;
    }
    let kind = reason
        .match_indices("error:")
        .find_map(|(at, _)| reason[at + 6..].split(':').next()?.parse().ok());
    RecordedVerdict::Error(kind)
}

fn run(verdict: &str, reason: &str) -> Option<Run> {
    Some(Run {
        verdict: recorded(verdict, reason),
        reason: reason.into(),
        run_no: 1,
        worker: "w1".into(),
        gpu: String::new(),
        variants: String::new(),
        by: String::new(),
    })
}

fn with_runs(mut comps: Vec<ComponentInput>, runs: &[(&str, Option<Run>)]) -> Input {
    for (name, r) in runs {
        let c = comps.iter_mut().find(|c| c.name == *name).expect(name);
        c.run = r.clone();
    }
    Input {
        date: DATE.into(),
        components: comps,
        escapes: Vec::new(),
        gate: Default::default(),
    }
}

fn all(comps: &[ComponentInput], verdict: &str, reason: &str) -> Vec<(String, Option<Run>)> {
    comps
        .iter()
        .map(|c| (c.name.clone(), run(verdict, reason)))
        .collect()
}

fn input_all(verdict: &str, reason: &str) -> Input {
    let comps = widget();
    let runs = all(&comps, verdict, reason);
    let runs: Vec<(&str, Option<Run>)> =
        runs.iter().map(|(n, r)| (n.as_str(), r.clone())).collect();
    with_runs(comps, &runs)
}

/// The line of `text` that starts with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starts with {prefix:?} in\n{text}"))
}

fn assert_owned(before: &str, after: &str) -> crate::status_guard::Changes {
    owned_changes(before, after).unwrap_or_else(|e| panic!("{e}\n--- after:\n{after}"))
}

#[test]
fn runs_that_did_not_test_the_code_change_nothing() {
    for (verdict, reason) in [
        ("environment", "environment: No module named 'torch'"),
        ("cancelled", "cancelled: the port was cancelled"),
        (
            "error",
            "error: error:cancelled: run cancelled before it finished",
        ),
        ("infra_error", "infra_error: worker w1 lost on every retry"),
        ("cleanup_refused", "cleanup gate: untracked file x"),
        (
            "error",
            "error: agent loop cannot start: not a git repository",
        ),
        ("", ""),
    ] {
        let input = input_all(verdict, reason);
        assert_eq!(patch(FINISHED, &input), FINISHED, "{verdict}: {reason}");
        assert_eq!(patch(FREEFORM, &input), FREEFORM, "{verdict}: {reason}");
    }
    // no run at all
    let input = with_runs(widget(), &[]);
    assert_eq!(patch(FINISHED, &input), FINISHED);
}

#[test]
fn outcome_classes_are_one_list() {
    use crate::verdict::ErrorKind;
    for (v, tests) in [
        (RecordedVerdict::NonSkipPass, true),
        (RecordedVerdict::DebugRed, true),
        (RecordedVerdict::ScaffoldSkip, true),
        (RecordedVerdict::Timeout, true),
        (RecordedVerdict::Error(Some(ErrorKind::Collection)), true),
        (RecordedVerdict::Error(Some(ErrorKind::Crashed)), true),
        (RecordedVerdict::Error(Some(ErrorKind::Cancelled)), false),
        // fvd's own failure (an agent loop that cannot start): no kind
        (RecordedVerdict::Error(None), false),
        (RecordedVerdict::Environment, false),
        (RecordedVerdict::InfraError, false),
        (RecordedVerdict::CleanupRefused, false),
        (RecordedVerdict::Cancelled, false),
        (RecordedVerdict::Unplaced, false),
        (RecordedVerdict::Stopped, false),
        (RecordedVerdict::None, false),
    ] {
        assert_eq!(Outcome::of(v).tests_the_code(), tests, "{v:?}");
    }
    // The reason's words decide nothing: the kind is its own value.
    assert_eq!(
        Outcome::of(recorded("error", "error: error:cancelled: run cancelled")),
        Outcome::Untested
    );
}

#[test]
fn pass_shapes_of_real_files_read_as_passes() {
    for cell in [
        "non_skip_pass",
        "`non_skip_pass`",
        "strict_load_and_forward_parity_pass",
        "encode_decode_parity_pass",
        "pass",
        "PASS (H100, 2026-04-01)",
        "7_passed_0_skipped",
        "1 passed, 0 skipped",
        "3 passed",
        "exact encode/decode pass",
        "strict-load pass",
        "generated_video_pass",
        "non-skip PASS",
    ] {
        assert!(reads_as_pass(cell), "{cell}");
    }
    for cell in [
        "5_passed_1_skipped",
        "4 passed, 2 skipped",
        "debug_red",
        "`scaffold_skip`",
        "blocked",
        "failed",
        "2_passed_1_failed",
        "error",
        "not_started",
        "not_run",
        "in_progress",
        "pending",
        "covered by pipeline smoke",
        "exact generated parity",
        "",
        "none",
        "`debug_red` (regression; recorded encode_pass)",
        "passthrough",
    ] {
        assert!(!reads_as_pass(cell), "{cell}");
    }
}

#[test]
fn a_pass_keeps_the_richer_human_cells_and_adds_evidence_once() {
    let input = input_all("non_skip_pass", "non_skip_pass: 3 passed");
    let after = patch(FINISHED, &input);
    let changes = assert_owned(FINISHED, &after);
    assert!(
        changes.added.is_empty() && changes.removed.is_empty(),
        "{changes:?}"
    );
    // five Parity Commands rows got a segment, nothing else changed
    assert_eq!(changes.changed.len(), 5, "{changes:?}");
    let t = line(&after, "| transformer |");
    assert!(
        t.ends_with("| strict_load_and_forward_parity_pass | 2026-05-10: converted shards load strictly; fp32 forward on a small input agrees (`max_abs=0.061`). [fvd 2026-11-26 run 1 on w1: non_skip_pass — 3 passed; command `python3 -m pytest tests/local_tests/widget_world/test_widget_transformer_parity.py -q -p no:cacheprovider`] |"),
        "{t}"
    );
    // the escaped pipe of a note survives
    assert!(line(&after, "| vae | `python").contains("212 keys map \\| encode"));
    // the human's phase (P11, complete) is ahead of anything a pass implies
    assert!(after.contains("- phase: `phase_11_post_parity_handoff`\n- status: `complete`"));
    // the same evidence again: byte-identical, even on another day and run
    let mut later = input.clone();
    later.date = "2026-12-01".into();
    for c in &mut later.components {
        if let Some(r) = &mut c.run {
            r.run_no = 4;
            r.worker = "w2".into();
        }
    }
    assert_eq!(patch(&after, &later), after);
}

#[test]
fn rows_match_by_label_alias_part_and_command() {
    let mut comps = widget();
    comps.push(component("camera", &["test_widget_camera_parity.py"]));
    let m = row_matches(FINISHED, &comps);
    let label = |k: usize| m[k].matrix.as_ref().map(|(_, l)| l.as_str());
    let scope = |k: usize| m[k].parity.as_ref().map(|(_, s)| s.as_str());
    assert_eq!(label(0), Some("Transformer (`WidgetDiT3D`)"));
    assert_eq!(label(2), Some("text_encoder/tokenizer"));
    assert_eq!(scope(2), Some("text_encoder"));
    assert_eq!(scope(4), Some("ar stack"));
    assert_eq!(label(5), None);
    assert_eq!(scope(5), None);
    assert_eq!(
        m[1].matrix.as_ref().map(|(l, _)| *l),
        Some(26),
        "1-based line"
    );

    // two components, one per file of a two-file command: the first takes
    // the row (by its command), the second gets a row of its own
    let split = vec![
        component("ar_convert", &["test_widget_ar_conversion.py"]),
        component("ar_forward", &["test_widget_ar_parity.py"]),
    ];
    let m = row_matches(FINISHED, &split);
    assert_eq!(
        m[0].parity.as_ref().map(|(_, s)| s.as_str()),
        Some("ar stack")
    );
    assert_eq!(m[1].parity, None);
    // an alias names the row
    let mut aliased = component("dit", &["test_other.py"]);
    aliased.aliases = vec!["transformer".into()];
    let m = row_matches(FINISHED, &[aliased]);
    assert_eq!(
        m[0].parity.as_ref().map(|(_, s)| s.as_str()),
        Some("transformer")
    );
    assert_eq!(
        m[0].matrix.as_ref().map(|(_, s)| s.as_str()),
        Some("Transformer (`WidgetDiT3D`)")
    );

    // written through: text_encoder gets no second row
    let input = input_all("non_skip_pass", "3 passed");
    let after = patch(FINISHED, &input);
    assert_eq!(after.matches("| text_encoder").count(), 2, "{after}");
    assert!(
        !after.lines().any(|l| l.starts_with("| component:")),
        "{after}"
    );
}

#[test]
fn a_regression_records_both_evidences_and_moves_the_phase_back_until_it_passes() {
    let pass = run("non_skip_pass", "3 passed");
    let red = run(
        "debug_red",
        "debug_red: test_widget_vae_parity::test_decode: max abs diff 0.41 > 0.01",
    );
    let passing = with_runs(
        widget(),
        &[
            ("transformer", pass.clone()),
            ("vae", pass.clone()),
            ("text_encoder", pass.clone()),
            ("scheduler", pass.clone()),
        ],
    );
    let regressed = with_runs(
        widget(),
        &[
            ("transformer", pass.clone()),
            ("vae", red),
            ("text_encoder", pass.clone()),
            ("scheduler", pass.clone()),
        ],
    );
    let after = patch(FINISHED, &regressed);
    let changes = assert_owned(FINISHED, &after);

    // the matrix: regression with the recorded value, the issue id listed
    let vae = line(&after, "| vae | vae |");
    assert!(
        vae.ends_with(
            "| encode_decode_parity_pass [fvd 2026-11-26 run 1 on w1: debug_red (regression)] | I003 |"
        ),
        "{vae}"
    );
    // Parity Commands: both evidences, the human's note first
    let cmd = line(&after, "| vae | `python");
    assert!(
        cmd.contains("| encode_decode_parity_pass [fvd 2026-11-26 run 1 on w1: debug_red (regression)] | 2026-05-09: all 212 keys map \\| encode and decode agree after the latent scaling. [fvd 2026-11-26 run 1 on w1: debug_red (regression) — test_widget_vae_parity::test_decode: max abs diff 0.41 > 0.01; command `"),
        "{cmd}"
    );
    // one issue row
    let issue = line(&after, "| I003 |");
    assert!(
        issue.starts_with("| I003 | P6 | vae | high | regression: `debug_red` where this file records encode_decode_parity_pass (Component Matrix: vae) | [fvd 2026-11-26 run 1 on w1: debug_red (regression) — "),
        "{issue}"
    );
    assert!(issue.ends_with("| component:vae | open |  |"), "{issue}");
    assert_eq!(after.lines().filter(|l| l.starts_with("| I00")).count(), 3);
    // the phase moved back, with a reason
    assert!(after.contains(
        "- phase: `phase_6_component_parity_debug`\n- status: `blocked`\n- owner: `component:vae`\n- last_updated: `2026-11-26`\n- fvd 2026-11-26: moved back from phase: \"`phase_11_post_parity_handoff`\"; status: \"`complete`\"; owner: \"`orchestrator`\"; last_updated: \"`2026-05-14`\" — `vae` regressed (I003)\n"
    ), "{after}");
    // the final handoff block is untouched and marked superseded after it;
    // the rows after it stay where they were
    assert!(after.contains(
        "  blockers: none\n```\nfvd 2026-11-26: the final handoff above is superseded: `vae` regressed (I003); see Current Phase.\n\n| 2026-05-13 | Add the AR stack."
    ), "{after}");
    assert_eq!(
        changes.added.len(),
        3,
        "issue row, bullet, superseded line: {changes:#?}"
    );

    // the same red run again: byte-identical
    assert_eq!(patch(&after, &regressed), after);

    // it passes again: the human's cells and phase come back, fvd's lines go,
    // its issue row stays as history
    let recovered = patch(&after, &passing);
    assert_owned(&after, &recovered);
    let clean = patch(FINISHED, &passing);
    let issue_resolved = line(&recovered, "| I003 |");
    assert!(
        issue_resolved
            .ends_with("| component:vae | resolved | passed in fvd run 1 on 2026-11-26 |"),
        "{issue_resolved}"
    );
    let without_issue: String = recovered
        .lines()
        .filter(|l| !l.starts_with("| I003 |"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(without_issue, clean);
    assert_eq!(patch(&recovered, &passing), recovered);
}

#[test]
fn other_testing_verdicts_on_a_recorded_pass_only_add_evidence() {
    for (verdict, reason) in [
        (
            "scaffold_skip",
            "scaffold_skip: skipped: weights not staged",
        ),
        (
            "error",
            "error: error:collection: test_widget_vae_parity.py: No module named 'torch'",
        ),
        ("timeout", "timeout: killed at the timeout"),
    ] {
        let input = with_runs(widget(), &[("vae", run(verdict, reason))]);
        let after = patch(FINISHED, &input);
        let changes = assert_owned(FINISHED, &after);
        // the matrix row and the command row, each beside the person's words
        assert_eq!(changes.changed.len(), 2, "{verdict}: {changes:?}");
        assert!(changes.added.is_empty(), "{verdict}: {changes:?}");
        let (_, old, new) = &changes.changed[0];
        assert!(old.starts_with("| vae | vae |"), "{old}");
        assert!(
            new.contains(&format!(
                "| encode_decode_parity_pass [fvd 2026-11-26 run 1 on w1: {verdict}] | none |"
            )),
            "{new}"
        );
        let (_, old, new) = &changes.changed[1];
        assert!(old.starts_with("| vae | `python"), "{old}");
        assert!(
            new.contains(&format!(
                "agree after the latent scaling. [fvd 2026-11-26 run 1 on w1: {verdict} — "
            )),
            "{new}"
        );
        assert!(
            new.contains(&format!(
                "| encode_decode_parity_pass [fvd 2026-11-26 run 1 on w1: {verdict}] |"
            )),
            "{new}"
        );
    }
}

#[test]
fn a_blocked_component_gets_one_issue_per_cause_resolved_when_it_passes() {
    let mut comps = widget();
    comps.push(component("camera", &["test_widget_camera_parity.py"]));
    let red = run(
        "debug_red",
        "debug_red: test_camera::test_pose: assert 0.5 == 0.25",
    );
    let input = with_runs(comps.clone(), &[("camera", red)]);
    let first = patch(FINISHED, &input);
    let changes = assert_owned(FINISHED, &first);
    assert_eq!(
        changes.added.len(),
        3,
        "matrix row, command row, issue: {changes:?}"
    );
    assert!(first.contains(
        "| `camera` | `generic` | `unknown` | `unknown` | `unknown` | `unknown` | `unknown` | `unknown` | `debug_red` | I003 |"
    ), "{first}");
    assert!(first.contains(
        "| camera | `python3 -m pytest tests/local_tests/widget_world/test_widget_camera_parity.py -q -p no:cacheprovider` | `debug_red` | [fvd 2026-11-26 run 1 on w1: debug_red — test_camera::test_pose: assert 0.5 == 0.25] |"
    ), "{first}");
    assert!(
        line(&first, "| I003 |")
            .contains("| camera | blocker | `debug_red`: the parity test fails numerically |")
    );
    // the phase is ahead of P6 and nothing regressed: it stays
    assert!(first.contains("- phase: `phase_11_post_parity_handoff`"));
    // the same cause again (another number in it): no second row
    let again = with_runs(
        comps.clone(),
        &[(
            "camera",
            run(
                "debug_red",
                "debug_red: test_camera::test_pose: assert 0.75 == 0.25",
            ),
        )],
    );
    let second = patch(&first, &again);
    assert_eq!(
        second.lines().filter(|l| l.starts_with("| I00")).count(),
        3,
        "{second}"
    );
    assert_owned(&first, &second);
    // another cause: a new row; the old one is superseded
    let skip = with_runs(
        comps.clone(),
        &[(
            "camera",
            run("scaffold_skip", "scaffold_skip: skipped: no camera weights"),
        )],
    );
    let third = patch(&second, &skip);
    assert_owned(&second, &third);
    assert!(
        line(&third, "| I003 |")
            .ends_with("| resolved | superseded by I004 (fvd run 1 on 2026-11-26) |")
    );
    assert!(line(&third, "| I004 |").contains("| open |"));
    assert!(line(&third, "| `camera` |").ends_with("| `scaffold_skip` | I004 |"));
    // it passes: resolved, Open Issues back to none
    let pass = with_runs(comps, &[("camera", run("non_skip_pass", "2 passed"))]);
    let fourth = patch(&third, &pass);
    assert_owned(&third, &fourth);
    assert!(
        line(&fourth, "| I004 |").ends_with("| resolved | passed in fvd run 1 on 2026-11-26 |")
    );
    assert!(line(&fourth, "| `camera` |").ends_with("| `non_skip_pass` | none |"));
    assert!(
        line(&fourth, "| camera |").contains(
            "| `non_skip_pass` | [fvd 2026-11-26 run 1 on w1: non_skip_pass — 2 passed] |"
        )
    );
}

#[test]
fn the_phase_moves_forward_only() {
    let early = FINISHED
        .replace(
            "`phase_11_post_parity_handoff`",
            "`phase_4_native_component_prototype`",
        )
        .replace("- status: `complete`", "- status: `in_progress`");
    let mut comps = widget();
    comps.push(component("camera", &["test_widget_camera_parity.py"]));
    let red = with_runs(
        comps.clone(),
        &[("camera", run("debug_red", "debug_red: x: y"))],
    );
    let after = patch(&early, &red);
    assert_owned(&early, &after);
    assert!(after.contains("- phase: `phase_6_component_parity_debug`\n- status: `blocked`\n- owner: `orchestrator`\n- last_updated: `2026-11-26`\n\n"), "{after}");
    assert!(
        !after.contains("moved back"),
        "a forward move needs no reason: {after}"
    );
    // every component passes (the file's passes count for those not run)
    let pass = with_runs(comps, &[("camera", run("non_skip_pass", "1 passed"))]);
    let later = patch(&after, &pass);
    assert!(later.contains("- phase: `phase_7_pipeline_stages_variants`\n- status: `in_progress`\n- owner: `pipeline`\n"), "{later}");
    // a phase fvd cannot place is left as written
    let odd = FINISHED.replace("`phase_11_post_parity_handoff`", "port verified");
    let input = with_runs(
        widget(),
        &[("vae", run("scaffold_skip", "scaffold_skip: s"))],
    );
    assert!(patch(&odd, &input).contains("- phase: port verified\n- status: `complete`"));
}

#[test]
fn a_free_form_file_gets_one_fvd_section_and_nothing_else() {
    let mut dit = component("dit", &["../gadget/test_gadget_dit.py"]);
    dit.parity_tests = vec!["tests/local_tests/gadget/test_gadget_dit.py".into()];
    dit.run = run("non_skip_pass", "4 passed");
    let input = Input {
        date: DATE.into(),
        components: vec![dit.clone()],
        escapes: Vec::new(),
        gate: Default::default(),
    };
    let after = patch(FREEFORM, &input);
    let changes = assert_owned(FREEFORM, &after);
    assert!(changes.changed.is_empty(), "{changes:?}");
    // the person's table is read (by the test file), never written; no
    // contract section is added beside it
    assert!(after.starts_with(FREEFORM), "{after}");
    for absent in [
        "## Component Matrix",
        "## Parity Commands",
        "## Issues And Blockers",
        "`unknown`",
    ] {
        assert!(!after.contains(absent), "{absent}: {after}");
    }
    assert_eq!(after.matches("## fvd evidence").count(), 1, "{after}");
    assert!(
        line(&after, "| `dit` |").starts_with("| `dit` | Component Status: GadgetDiT: PASS (H100, 2026-04-01) | `non_skip_pass` | 2026-11-26 run 1 on w1 | 4 passed; command `"),
        "{after}"
    );
    assert_eq!(patch(&after, &input), after);

    // red against the person's PASS: a regression, recognised in their shape
    dit.run = run("debug_red", "debug_red: t: off by 2");
    let red = Input {
        date: DATE.into(),
        components: vec![dit.clone()],
        escapes: Vec::new(),
        gate: Default::default(),
    };
    let blocked = patch(&after, &red);
    assert_owned(&after, &blocked);
    assert_eq!(blocked.matches("## fvd evidence").count(), 1, "{blocked}");
    assert!(
        line(&blocked, "| `dit` |").contains(
            "| `debug_red` (regression) | 2026-11-26 run 1 on w1 | t: off by 2; command `"
        ),
        "{blocked}"
    );
    assert!(
        blocked.contains("- regression: `dit` fail(s) where this file records a pass"),
        "{blocked}"
    );
    assert!(blocked.starts_with(FREEFORM), "{blocked}");
    assert_eq!(patch(&blocked, &red), blocked);
    // green again: only fvd's section differs from the person's file
    let green = patch(&blocked, &input);
    assert_eq!(green, after);
}

#[test]
fn a_created_file_checks_clean_and_is_stable() {
    let mut status = PortStatus::new("Widget World", "widget_world");
    for (k, v) in [
        ("workload_types", "`T2V`"),
        ("official_ref", "`https://example.org/widget-world`"),
        ("official_ref_dir", "`WidgetWorld/`"),
        ("hf_weights_path", "`none`"),
        ("local_weights_dir", "`official_weights/widget_world`"),
        ("source_layout", "`custom`"),
        (
            "local_tests_readme",
            "`tests/local_tests/widget_world/README.md`",
        ),
    ] {
        status.summary.set(k, v);
    }
    for k in crate::port_status::CONVERSION_STATE_KEYS {
        status.conversion_state.set(k, "`none`");
    }
    status.set_phase(
        crate::Phase::ComponentParityDebug,
        crate::port_status::PhaseStatus::InProgress,
        "orchestrator",
        DATE,
    );
    let mut input = with_runs(
        widget(),
        &[
            ("transformer", run("non_skip_pass", "3 passed")),
            ("vae", run("debug_red", "debug_red: t: off")),
            ("text_encoder", run("environment", "environment: no torch")),
        ],
    );
    input.escapes.push(EscapeHatchRow {
        id: "E001".into(),
        phase: "P6".into(),
        decision_type: "`ambiguity`".into(),
        question: "which shift? (component `vae`)".into(),
        recommended_option: "3.0".into(),
        status: "`open`".into(),
        resolution: "waiting: fvd answer widget_world E001 --option N".into(),
    });
    let text = create(&status, &input);
    let (_, findings) = import(&text);
    assert!(findings.is_empty(), "{findings:?}\n{text}");
    // every component is listed; the one that did not test is not_started
    assert!(text.contains("| `text_encoder` | `generic` |"), "{text}");
    assert!(line(&text, "| `text_encoder` |").contains("| `not_started` | none |"));
    assert!(line(&text, "| `vae` |").contains("| `debug_red` | I001 |"));
    assert!(text.contains("- status: `blocked`"), "{text}");
    assert!(line(&text, "| E001 |").contains("| `open` |"));
    assert_eq!(patch(&text, &input), text);
    // an answer changes that row only
    input.escapes[0].status = "`resolved`".into();
    input.escapes[0].resolution = "answered: 3.0; given to attempt 2".into();
    let answered = patch(&text, &input);
    let changes = assert_owned(&text, &answered);
    assert_eq!(changes.changed.len(), 1, "{changes:?}");
    assert!(
        line(&answered, "| E001 |").ends_with("| `resolved` | answered: 3.0; given to attempt 2 |")
    );
}

#[test]
fn a_file_an_older_fvd_wrote_is_taken_over_without_doubles() {
    let old = "# Fam Port Status\n\n## Component Matrix\n\n| Component | Type | Parity | Open Issues |\n|---|---|---|---|\n| `b` | `generic` | `debug_red` | none |\n\n## Parity Commands\n\n| Scope | Command | Last Result | Notes |\n|---|---|---|---|\n| component:b | `pytest t/test_b.py -q` | `debug_red` | run 1 of 1; t::test_b: assert 1 == 2 |\n\n## Issues And Blockers\n\n| ID | Phase | Component | Severity | Issue | Evidence | Owner | Status | Resolution |\n|---|---|---|---|---|---|---|---|---|\n| I001 | P6 | `b` | blocker | component b is blocked | debug_red: t::test_b: assert 1 == 2 | component:b | open |  |\n";
    let mut b = component("b", &[]);
    b.parity_tests = vec!["t/test_b.py".into()];
    b.command = "pytest t/test_b.py -q".into();
    b.run = run("debug_red", "debug_red: t::test_b: assert 1 == 2");
    let mut input = Input {
        date: DATE.into(),
        components: vec![b],
        escapes: Vec::new(),
        gate: Default::default(),
    };
    let after = patch(old, &input);
    assert_owned(old, &after);
    assert_eq!(
        after.lines().filter(|l| l.starts_with("| I00")).count(),
        1,
        "{after}"
    );
    assert!(after.contains("| `debug_red` | I001 |"), "{after}");
    assert!(
        after.contains(
            "| `debug_red` | [fvd 2026-11-26 run 1 on w1: debug_red — t::test_b: assert 1 == 2] |"
        ),
        "{after}"
    );
    input.components[0].run = run("non_skip_pass", "1 passed");
    let fixed = patch(&after, &input);
    assert_owned(&after, &fixed);
    assert!(
        line(&fixed, "| I001 |").ends_with("| resolved | passed in fvd run 1 on 2026-11-26 |"),
        "{fixed}"
    );
}

#[test]
fn an_open_row_people_keep_about_a_component_is_not_doubled() {
    let kept = FINISHED.replace(
        "| I002 | P6 | transformer | medium | bf16 forward drifted in the upstream harness. | An fp32 harness agrees. | component:transformer | resolved | Compared in fp32. |",
        "| I002 | P6 | camera | medium | pose convention differs upstream | notes | component:camera | open |  |",
    );
    let mut comps = widget();
    comps.push(component("camera", &["test_widget_camera_parity.py"]));
    let input = with_runs(comps, &[("camera", run("debug_red", "debug_red: t: off"))]);
    let after = patch(&kept, &input);
    assert_owned(&kept, &after);
    assert_eq!(
        after.lines().filter(|l| l.starts_with("| I00")).count(),
        2,
        "{after}"
    );
    // the row fvd adds lists the people's open issue
    assert!(
        line(&after, "| `camera` |").ends_with("| `debug_red` | I002 |"),
        "{after}"
    );
    assert_eq!(patch(&after, &input), after);
}

#[test]
fn a_red_run_s_variants_ride_in_its_evidence_and_change_it_only_when_they_change() {
    let mut comps = widget();
    comps.push(component("camera", &["test_widget_camera_parity.py"]));
    let red = |variants: &str| {
        let mut r = run(
            "debug_red",
            "debug_red: passes with EPS_FIX=1 (variant eps_fix); test_camera::test_pose: assert 0.5 == 0.25",
        );
        if let Some(r) = &mut r {
            r.variants = variants.into();
        }
        r
    };
    let input = with_runs(
        comps.clone(),
        &[("camera", red("eps_fix passes, fp32 same"))],
    );
    let first = patch(FINISHED, &input);
    assert_owned(FINISHED, &first);
    let row = line(&first, "| camera | `python3");
    assert!(
        row.ends_with("| `debug_red` | [fvd 2026-11-26 run 1 on w1: debug_red — passes with EPS_FIX=1 (variant eps_fix); test_camera::test_pose: assert 0.5 == 0.25; variants: eps_fix passes, fp32 same] |"),
        "{row}"
    );
    // The issue's cause is the reason, not the table.
    assert!(line(&first, "| I003 |").contains("`debug_red`: the parity test fails numerically"));
    // The same table on another day and run: byte-identical.
    let mut later = input.clone();
    later.date = "2026-12-01".into();
    for c in &mut later.components {
        if let Some(r) = &mut c.run {
            r.run_no = 2;
        }
    }
    assert_eq!(patch(&first, &later), first);
    // Another table: the segment is replaced, nothing else changes.
    let moved = with_runs(
        comps,
        &[("camera", red("eps_fix passes, fp32 moves to blocks.1"))],
    );
    let second = patch(&first, &moved);
    let changes = assert_owned(&first, &second);
    assert_eq!(changes.changed.len(), 1, "{changes:?}");
    assert!(
        line(&second, "| camera | `python3")
            .ends_with("; variants: eps_fix passes, fp32 moves to blocks.1] |"),
        "{second}"
    );
    assert_eq!(
        second.lines().filter(|l| l.starts_with("| I00")).count(),
        3,
        "{second}"
    );
}
