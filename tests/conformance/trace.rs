//! `fvd trace …` on the real GPT-2 traces and dumps, with their own names
//! and numbers (`traces/gpt2/expected.json` and the fixture README).

use serde_json::Value;

use crate::checks::trace::{self as check, TraceCases};

/// Port names → reference names, as the real fixture's README gives them.
const RENAMES: [&str; 8] = [
    r"^blocks\.(\d+)=>transformer.h.$1",
    r"\.norm1$=>.ln_1",
    r"\.norm2$=>.ln_2",
    r"\.attention$=>.attn",
    r"\.ffn(\.|$)=>.mlp$1",
    r"^tok_embed$=>transformer.wte",
    r"^pos_embed$=>transformer.wpe",
    r"^final_norm$=>transformer.ln_f",
];

fn gpt2() -> TraceCases {
    TraceCases {
        dir: crate::real().join("traces/gpt2"),
        renames: &RENAMES,
        rows: 46,
        tokens: 64,
        bug_port: "blocks.3.norm2",
        bug_reference: "transformer.h.3.ln_2",
        rows_before_bug: 25,
        drill_down: [r"^blocks\.3(\.|$)", r"^transformer\.h\.3(\.|$)"],
        first_reference: "transformer.wte",
        last_reference: "lm_head",
        column_parallel: ("blocks.0.ffn.c_fc", [1, 64, 768]),
        layers: (r"^transformer\.h\.4\.", 6, "transformer.h.4.ln_1"),
        nearest: ("blocks.0.norm1", "transformer.h.0.ln_1", 1),
        sorted_blocks: ("transformer.h.2", "transformer.h.3"),
    }
}

#[test]
fn every_expected_case_gives_the_expected_first_divergence() {
    check::every_expected_case(&gpt2());
}

#[test]
fn bug_case_reports_drift_drill_down_and_no_unmatched() {
    check::bug_case_drift_drill_down_and_order(&gpt2());
}

#[test]
fn tensor_parallel_shards_merge_to_the_single_rank_answer() {
    check::tensor_parallel_merge(&gpt2());
}

#[test]
fn sequence_parallel_merge_reproduces_the_reference_shapes() {
    check::sequence_parallel_merge(&gpt2());
}

#[test]
fn noise_case_is_clean_and_says_why_nothing_is_exact() {
    check::noise_case_is_clean(&gpt2());
}

#[test]
fn steps_case_at_defaults_flags_step_two_only_and_reports_exact_steps() {
    check::steps_case_at_defaults(&gpt2());
}

#[test]
fn embedding_divergence_is_called_early() {
    check::embedding_divergence_is_called_early(&gpt2());
}

#[test]
fn layers_filter_and_unmatched_modules_with_nearest_names() {
    check::layers_filter_and_nearest_names(&gpt2());
}

#[test]
fn text_report_and_plot() {
    check::text_report_and_plot(&gpt2());
}

#[test]
fn dump_comparator_names_the_broken_norm_despite_its_high_cosine() {
    check::dumps_name_the_broken_norm(&gpt2());
}

#[test]
fn dump_comparator_without_order_says_it_fell_back_to_sorting() {
    check::dumps_without_order_fall_back_to_sorting(&gpt2());
}

/// Every line of every real trace reads (through the fast path where it
/// applies) to what a plain JSON parser reads from it.
#[test]
fn every_real_trace_line_reads_as_json_says() {
    let dir = gpt2().dir;
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            continue;
        }
        for (i, line) in std::fs::read_to_string(&path).unwrap().lines().enumerate() {
            let at = format!("{}:{}", path.display(), i + 1);
            let record = fvd_trace::record::parse_line(line)
                .unwrap_or_else(|e| panic!("{at}: {e}"))
                .unwrap_or_else(|| panic!("{at}: blank"));
            let json: Value = serde_json::from_str(line).unwrap();
            same_as_json(&record, &json, &at);
            n += 1;
        }
    }
    assert_eq!(n, 598, "lines read in {}", dir.display());
}

fn same_as_json(r: &fvd_trace::Record, j: &Value, at: &str) {
    assert_eq!(&*r.module, j["module"].as_str().unwrap(), "{at}");
    assert_eq!(&*r.tensor, j["tensor"].as_str().unwrap(), "{at}");
    assert_eq!(r.step, j["step"].as_i64(), "{at}");
    assert_eq!(r.dtype.as_deref(), j["dtype"].as_str(), "{at}");
    let shape: Vec<u64> = j["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    assert_eq!(r.shape.as_deref(), Some(shape.as_slice()), "{at}");
    for stat in fvd_trace::record::KNOWN_STATS {
        assert_eq!(r.stat_f64(stat), j[stat].as_f64(), "{at}: {stat}");
    }
}
