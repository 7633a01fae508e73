//! One comparison says one thing (issue 43, item 9): on the project's own
//! tinylm traces (`tests/fixtures/traces`, the `bug` case: block 2's second
//! norm is broken), a comparison scoped to where the bug starts must not
//! list findings that exclude each other, and a row without a step must not
//! print as `step null`.

use std::path::{Path, PathBuf};

use fvd_trace::{CompareOptions, Diagnostic, Report, compare};

/// Port names → reference names of the fixture's tinylm (its README).
const RENAMES: [&str; 10] = [
    r"^blocks\.(\d+)=>model.layers.$1",
    r"\.norm1$=>.attn_norm",
    r"\.norm2$=>.mlp_norm",
    r"\.attn$=>.self_attn",
    r"\.ffn(\.|$)=>.mlp$1",
    r"\.fc_in$=>.up_proj",
    r"\.fc_out$=>.down_proj",
    r"^tok_embed$=>model.embed_tokens",
    r"^pos_embed$=>model.embed_positions",
    r"^final_norm$=>model.norm",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/traces")
        .join(name)
}

/// The bug case, reference rows kept by `layers` (reference names).
fn bug_case(layers: &str) -> Report {
    compare(
        &[fixture("official.jsonl")],
        &[fixture("port_bug.jsonl")],
        &CompareOptions {
            rename: RENAMES.iter().map(|r| r.to_string()).collect(),
            layers: Some(layers.into()),
            ..CompareOptions::default()
        },
    )
    .unwrap()
}

fn codes(r: &Report) -> Vec<&str> {
    r.diagnostics.iter().map(|d| d.code.as_str()).collect()
}

/// Block 2's MLP half: its first row, the broken norm, diverges and every
/// row after it does, so the rows call the inputs different; a divergence
/// at the first row is then what the different inputs produce, not a second
/// finding.
#[test]
fn inputs_that_differ_are_the_one_finding_not_an_early_divergence_too() {
    let r = bug_case(r"^model\.layers\.2\.mlp");
    assert_eq!(
        r.first_divergence.as_ref().unwrap().port_module,
        "blocks.2.norm2"
    );
    assert!(r.rows.iter().all(|row| row.diverged), "{r:#?}");
    let found = codes(&r);
    assert!(found.contains(&"inputs_differ"), "{found:?}");
    assert!(!found.contains(&"early_divergence"), "{found:?}");
    let text = r.render_text();
    assert!(text.contains("[inputs_differ]"), "{text}");
    assert!(!text.contains("[early_divergence]"), "{text}");
}

/// The trace actor's narrowed step: block 2 alone, after a step that saw
/// every block before it match. That the scope starts inside the model
/// explains both whole-trace findings; neither is shown beside it, in the
/// stored report (JSON) or its text.
#[test]
fn a_narrowed_scope_is_the_one_finding_about_where_the_trace_starts() {
    for layers in [r"^model\.layers\.2\.mlp", r"^model\.layers\.2(\.|$)"] {
        let mut r = bug_case(layers);
        // What the trace actor does to a narrowed step's report.
        r.diagnostics.push(Diagnostic::new(
            "narrowed_scope",
            "this trace covers only ^blocks\\.2(\\.|$) (the previous step's first divergence was blocks.2, every module before it matched): diagnostics about inputs or the first block speak of this scope, not of the model",
        ));
        r.drop_signatures("inputs_differ");
        let found = codes(&r);
        assert!(found.contains(&"narrowed_scope"), "{layers}: {found:?}");
        for gone in ["inputs_differ", "early_divergence"] {
            assert!(!found.contains(&gone), "{layers}: {found:?}");
        }
        let text = r.render_text();
        assert!(text.contains("[narrowed_scope]"), "{text}");
        assert!(
            !text.contains("[inputs_differ]") && !text.contains("[early_divergence]"),
            "{text}"
        );
        // The JSON says the same as the text.
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(codes(&back), found);
    }
}

/// A report read back from storage, with every finding as `compare` wrote
/// it before the rule existed, renders the one finding too.
#[test]
fn a_stored_report_with_every_finding_renders_one() {
    let mut r = bug_case(r"^model\.layers\.2\.mlp");
    for code in ["early_divergence", "narrowed_scope"] {
        r.diagnostics
            .push(Diagnostic::new(code, format!("{code} as stored")));
    }
    let text = r.render_text();
    assert!(text.contains("[narrowed_scope]"), "{text}");
    assert!(
        !text.contains("[inputs_differ]") && !text.contains("[early_divergence]"),
        "{text}"
    );
}

/// The tinylm traces have no steps: no `null` where a step would be, in
/// the verdict line or the table.
#[test]
fn a_trace_without_steps_prints_no_null_step() {
    let r = bug_case(r"^model\.layers\.2(\.|$)");
    assert_eq!(r.first_divergence.as_ref().unwrap().step, None);
    let text = r.render_text();
    assert!(!text.contains("null"), "{text}");
    assert!(!text.contains("None"), "{text}");
    assert!(
        text.contains(
            "first divergence: blocks.2.norm2 (reference model.layers.2.mlp_norm) tensor out: abs_mean "
        ),
        "{text}"
    );
    assert!(!text.contains(" step "), "{text}");
}

/// A row missing on one rank is named without a step when it has none
/// (the merge wrote `step None`).
#[test]
fn a_partial_rank_without_a_step_prints_no_none() {
    let dir = tempfile::tempdir().unwrap();
    let row = |m: &str| {
        format!(
            "{{\"module\":\"{m}\",\"tensor\":\"out\",\"step\":null,\"abs_mean\":1.0,\"shape\":[2]}}\n"
        )
    };
    let (r0, r1) = (
        dir.path().join("rank0.jsonl"),
        dir.path().join("rank1.jsonl"),
    );
    std::fs::write(&r0, row("a") + &row("b")).unwrap();
    std::fs::write(&r1, row("a")).unwrap();
    let files = fvd_trace::read_side(&[r0, r1]).unwrap();
    let merged = fvd_trace::merge_ranks(files, None, &fvd_trace::MergeOptions::default());
    let partial: Vec<&str> = merged
        .diagnostics
        .iter()
        .filter(|d| d.code == "partial_ranks")
        .map(|d| d.message.as_str())
        .collect();
    assert!(!partial.is_empty(), "{:?}", merged.diagnostics);
    for m in partial {
        assert!(!m.contains("None") && !m.contains("step"), "{m}");
        assert!(m.starts_with("b out "), "{m}");
    }
}
