//! `fvd trace …` on the project's own activation traces and dumps
//! (`tests/fixtures/traces`, written by its `generate.py`): every case of
//! its `expected.json`, the shard merges, the dump comparator, and bad
//! input. The same checks run on the real GPT-2 traces in the conformance
//! suite.

use std::path::Path;

use serde_json::Value;

use crate::checks::trace::{self as check, TraceCases, codes, run};
use crate::support::fixtures;

/// Port names → reference names of the fixture's tinylm (its README).
pub const RENAMES: [&str; 10] = [
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

/// The project's trace cases and what the checks need to know about them.
pub fn own() -> TraceCases {
    TraceCases {
        dir: fixtures().join("traces"),
        renames: &RENAMES,
        rows: 32,
        tokens: 32,
        bug_port: "blocks.2.norm2",
        bug_reference: "model.layers.2.mlp_norm",
        rows_before_bug: 18,
        drill_down: [r"^blocks\.2(\.|$)", r"^model\.layers\.2(\.|$)"],
        first_reference: "model.embed_tokens",
        last_reference: "lm_head",
        column_parallel: ("blocks.0.ffn.fc_in", [1, 32, 256]),
        layers: (r"^model\.layers\.3\.", 6, "model.layers.3.attn_norm"),
        nearest: ("blocks.0.norm1", "model.layers.0.attn_norm", 3),
        sorted_blocks: ("model.layers.1", "model.layers.2"),
    }
}

#[test]
fn every_expected_case_gives_the_expected_first_divergence() {
    check::every_expected_case(&own());
}

#[test]
fn bug_case_reports_drift_drill_down_and_no_unmatched() {
    check::bug_case_drift_drill_down_and_order(&own());
}

#[test]
fn tensor_parallel_shards_merge_to_the_single_rank_answer() {
    check::tensor_parallel_merge(&own());
}

#[test]
fn sequence_parallel_merge_reproduces_the_reference_shapes() {
    check::sequence_parallel_merge(&own());
}

#[test]
fn noise_case_is_clean_and_says_why_nothing_is_exact() {
    check::noise_case_is_clean(&own());
}

#[test]
fn steps_case_at_defaults_flags_step_two_only_and_reports_exact_steps() {
    check::steps_case_at_defaults(&own());
}

#[test]
fn embedding_divergence_is_called_early() {
    check::embedding_divergence_is_called_early(&own());
}

#[test]
fn layers_filter_and_unmatched_modules_with_nearest_names() {
    check::layers_filter_and_nearest_names(&own());
}

#[test]
fn text_report_and_plot() {
    check::text_report_and_plot(&own());
}

#[test]
fn dump_comparator_names_the_broken_norm_despite_its_high_cosine() {
    check::dumps_name_the_broken_norm(&own());
}

#[test]
fn dump_comparator_without_order_says_it_fell_back_to_sorting() {
    check::dumps_without_order_fall_back_to_sorting(&own());
}

#[test]
fn bad_input_exits_two_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"module\": \"a\", \"tensor\": \"out\", \"step\": null, \"abs_mean\": 1}\nnot json\n",
    )
    .unwrap();
    let official = own().dir.join("official.jsonl").display().to_string();
    let out = run(&[
        "trace".into(),
        "compare".into(),
        "--reference".into(),
        official.clone(),
        "--port".into(),
        bad.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.jsonl:2"), "{err}");

    let out = run(&[
        "trace".into(),
        "compare".into(),
        "--reference".into(),
        official.clone(),
        "--port".into(),
        tmp.path().join("missing.jsonl").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.jsonl"));

    let out = run(&[
        "trace".into(),
        "compare".into(),
        "--reference".into(),
        official.clone(),
        "--port".into(),
        official,
        "--rename".into(),
        "([=>x".into(),
    ]);
    assert_eq!(out.status.code(), Some(2));
}

/// A minimal `.npy` (v1, little-endian f4) writer for the test.
fn write_npy(path: &Path, shape: &[usize], data: &[f32]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn npy_folders_and_inputs_differ() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let x: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) / 7.0).collect();
    let mut y = x.clone();
    y[5] += 0.5;
    write_npy(&a.join("embed:out.npy"), &[2, 3, 4], &x);
    write_npy(&b.join("embed:out.npy"), &[2, 3, 4], &y);
    write_npy(&a.join("layers.0:out.npy"), &[24], &x);
    write_npy(&b.join("layers.0:out.npy"), &[24], &x);
    let order = tmp.path().join("order.jsonl");
    std::fs::write(
        &order,
        "{\"module\":\"embed\",\"tensor\":\"out\",\"step\":null}\n{\"module\":\"layers.0\",\"tensor\":\"out\",\"step\":null}\n",
    )
    .unwrap();
    let out = run(&[
        "trace".into(),
        "dumps".into(),
        a.display().to_string(),
        b.display().to_string(),
        "--order".into(),
        order.display().to_string(),
        "--json".into(),
    ]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(r["first_divergence"]["port_module"], "embed");
    let m = &r["tensors"][0]["metrics"];
    assert_eq!(m["max_abs_diff_at"], serde_json::json!([0, 1, 1]));
    assert!((m["max_abs_diff"].as_f64().unwrap() - 0.5).abs() < 1e-6);
    assert!(codes(&r).contains(&"inputs_differ".to_string()));
    assert_eq!(r["tensors"][1]["metrics"]["identical"], true);
}

/// One comparison says one thing (issue 43, item 9), through the binary:
/// block 2's MLP half of the bug case diverges from its first row on, so
/// the rows call the inputs different, and the divergence at that first
/// row is not listed again as an early one; the tinylm traces have no
/// steps, and no `null` stands in for one. Text and JSON list the same
/// findings.
#[test]
fn a_scoped_comparison_lists_one_finding_and_no_null_step() {
    let c = own();
    let mut args: Vec<String> = vec![
        "trace".into(),
        "compare".into(),
        "--reference".into(),
        c.dir.join("official.jsonl").display().to_string(),
        "--port".into(),
        c.dir.join("port_bug.jsonl").display().to_string(),
        "--layers".into(),
        r"^model\.layers\.2\.mlp".into(),
    ];
    for r in RENAMES {
        args.extend(["--rename".to_string(), r.to_string()]);
    }
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.starts_with(
            "first divergence: blocks.2.norm2 (reference model.layers.2.mlp_norm) tensor out: abs_mean "
        ),
        "{text}"
    );
    assert!(
        text.contains("\n  [inputs_differ] every compared row diverges"),
        "{text}"
    );
    assert!(!text.contains("[early_divergence]"), "{text}");
    assert!(!text.contains("null") && !text.contains("None"), "{text}");

    args.push("--json".into());
    let r: Value = serde_json::from_slice(&run(&args).stdout).unwrap();
    let found = codes(&r);
    assert!(found.contains(&"inputs_differ".to_string()), "{found:?}");
    assert!(
        !found.contains(&"early_divergence".to_string()),
        "{found:?}"
    );
    for code in &found {
        assert!(
            text.contains(&format!("[{code}]")),
            "{code} not in:\n{text}"
        );
    }
}
