//! Comparator checks on the cases the small Llama-like generator writes
//! (`synth`): each false-cliff signature is named on its case with its
//! evidence (direction, token range, channels), on full dumps and, where
//! stats can show it, on JSONL traces; the clean case (bf16 noise only)
//! carries none.

mod synth;

use std::path::PathBuf;

use fvd_trace::dumps::{DumpOptions, DumpReport, compare_dumps};
use fvd_trace::{CompareOptions, Evidence, Report, Signature, Verdict, compare};
use synth::Case;

fn dumps(case: Case) -> DumpReport {
    let dir = tempfile::tempdir().unwrap();
    let pair = synth::write_case(dir.path(), case);
    compare_dumps(
        &pair.reference,
        &pair.port,
        &DumpOptions {
            token_dim: Some(1),
            ..DumpOptions::default()
        },
    )
    .unwrap()
}

fn traces(case: Case, keep: impl Fn(&str) -> bool) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let pair = synth::write_case(dir.path(), case);
    let filter = |path: &PathBuf| {
        let text = std::fs::read_to_string(path).unwrap();
        let kept: String = text
            .lines()
            .filter(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                keep(v["module"].as_str().unwrap())
            })
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(path, kept).unwrap();
    };
    filter(&pair.reference_trace);
    filter(&pair.port_trace);
    compare(
        &[pair.reference_trace],
        &[pair.port_trace],
        &CompareOptions::default(),
    )
    .unwrap()
}

fn kinds(s: &[Signature]) -> Vec<&'static str> {
    s.iter().map(Signature::kind).collect()
}

#[test]
fn the_clean_case_carries_no_signature() {
    let r = dumps(Case::Clean);
    assert_eq!(kinds(&r.signatures), Vec::<&str>::new(), "{r:#?}");
    assert_eq!(r.verdict, Verdict::Match);
    assert!(r.first_divergence.is_none());
    // bf16 noise on the embedding is not "inputs differ".
    assert!(!r.diagnostics.iter().any(|d| d.code == "inputs_differ"));
    assert_eq!(r.tensors.len(), 2 + 5 * synth::LAYERS);

    let t = traces(Case::Clean, |_| true);
    assert_eq!(kinds(&t.signatures), Vec::<&str>::new(), "{t:#?}");
    assert_eq!(t.verdict, Verdict::Match);
}

fn shift(s: &Signature) -> &fvd_trace::signature::LayerShift {
    match &s.evidence {
        Evidence::LayerShift(e) => e,
        other => panic!("not a layer shift: {other:?}"),
    }
}

#[test]
fn a_shifted_reference_dumper_is_a_layer_shift_not_a_divergence() {
    let r = dumps(Case::ReferenceShifted);
    assert_eq!(kinds(&r.signatures), ["layer_shift"], "{r:#?}");
    let ev = shift(&r.signatures[0]);
    assert_eq!((ev.offset, ev.direction.as_str()), (1, "reference_ahead"));
    assert_eq!(ev.prefix, "model.layers");
    assert_eq!(ev.pairs, vec![[0, 1], [1, 2], [2, 3]]);
    // Four sub-modules per probed block, all matching in place.
    assert_eq!((ev.insides_compared, ev.insides_matching), (12, 12));
    assert!(r.signatures[0].untrusted);
    assert_eq!(r.verdict, Verdict::Untrusted);
    assert!(
        r.first_divergence.is_none(),
        "the model is not reported as diverging: {:?}",
        r.first_divergence
    );
    assert_eq!(r.diagnostics[0].code, "layer_shift");
    let text = r.render_text();
    let check = text.find("[layer_shift]").unwrap();
    let verdict = text.find("comparison untrusted (layer_shift)").unwrap();
    assert!(check < verdict, "{text}");
    assert!(!text.contains("first divergence:"), "{text}");

    // The stat traces of the same run show the same shift.
    let t = traces(Case::ReferenceShifted, |_| true);
    assert_eq!(kinds(&t.signatures), ["layer_shift"], "{t:#?}");
    let ev = shift(&t.signatures[0]);
    assert_eq!(ev.offset, 1);
    assert_eq!(ev.pairs, vec![[0, 1], [1, 2], [2, 3]]);
    assert_eq!(t.verdict, Verdict::Untrusted);
    assert!(t.first_divergence.is_none() && t.drill_down.is_none());
}

#[test]
fn a_shifted_port_dumper_is_a_layer_shift_the_other_way() {
    let r = dumps(Case::PortShifted);
    assert_eq!(kinds(&r.signatures), ["layer_shift"], "{r:#?}");
    let ev = shift(&r.signatures[0]);
    assert_eq!((ev.offset, ev.direction.as_str()), (-1, "reference_behind"));
    assert_eq!(ev.pairs, vec![[1, 0], [2, 1], [3, 2]]);
    assert!(r.first_divergence.is_none());
}

#[test]
fn block_outputs_alone_make_a_shift_candidate_that_keeps_the_verdict() {
    // Only the block outputs traced: a shifted port looks the same, so the
    // signature says so and distrusts nothing.
    let t = traces(Case::ReferenceShifted, |m| {
        m.strip_prefix("model.layers.")
            .is_some_and(|n| n.parse::<u32>().is_ok())
    });
    assert_eq!(t.rows.len(), synth::LAYERS, "{t:#?}");
    assert_eq!(kinds(&t.signatures), ["layer_shift"], "{t:#?}");
    let ev = shift(&t.signatures[0]);
    assert_eq!(ev.insides_compared, 0);
    assert!(!t.signatures[0].untrusted);
    assert_eq!(t.verdict, Verdict::Diverged);
    assert!(
        t.signatures[0]
            .check
            .contains("trace the blocks' sub-modules")
    );
}

#[test]
fn padding_divergence_is_confined_to_tokens_48_to_63() {
    let r = dumps(Case::Padding);
    assert_eq!(kinds(&r.signatures), ["token_subset"], "{r:#?}");
    let Evidence::TokenSubset(ev) = &r.signatures[0].evidence else {
        unreachable!()
    };
    assert_eq!(ev.tensor, "model.layers.0.self_attn:out");
    assert_eq!(ev.ranges, vec![[synth::PAD_FROM, synth::TOKENS - 1]]);
    assert_eq!((ev.tokens, ev.token_dim, ev.period), (64, 1, None));
    assert_eq!(ev.diverging, 16);
    // A localized error, not a distrusted comparison: the verdict stands.
    assert_eq!(r.verdict, Verdict::Diverged);
    assert_eq!(
        r.first_divergence.as_ref().unwrap().reference_module,
        "model.layers.0.self_attn"
    );
    assert!(r.signatures[0].message.contains("tokens 48–63 of 64"));
    // Without a token dim there is nothing to slice by token.
    let dir = tempfile::tempdir().unwrap();
    let pair = synth::write_case(dir.path(), Case::Padding);
    let r = compare_dumps(&pair.reference, &pair.port, &DumpOptions::default()).unwrap();
    assert!(!kinds(&r.signatures).contains(&"token_subset"));
}

#[test]
fn a_wrong_rotary_base_leaves_only_token_zero_right() {
    let r = dumps(Case::Positions);
    assert_eq!(kinds(&r.signatures), ["token_zero"], "{r:#?}");
    let Evidence::TokenZero(ev) = &r.signatures[0].evidence else {
        unreachable!()
    };
    assert_eq!(ev.tensor, "model.layers.0.self_attn:out");
    assert!(ev.token0_rel_diff < 1e-4, "{ev:?}");
    assert!(ev.later_diverging >= 60 && ev.tokens == 64, "{ev:?}");
    assert_eq!(r.verdict, Verdict::Diverged);
}

#[test]
fn different_embeddings_are_different_inputs() {
    let r = dumps(Case::Embedding);
    assert_eq!(kinds(&r.signatures), ["inputs_differ"], "{r:#?}");
    let Evidence::InputsDiffer(ev) = &r.signatures[0].evidence else {
        unreachable!()
    };
    assert_eq!(ev.reference, "model.embed_tokens:out");
    assert_eq!(ev.stat, "rel_diff");
    assert!(ev.value.unwrap() > 0.5, "{ev:?}");
    assert!(r.signatures[0].check.contains("validate the dumpers first"));
    assert_eq!(r.verdict, Verdict::Untrusted);
    // The first difference is still there to see: the input itself.
    assert_eq!(
        r.first_divergence.as_ref().unwrap().reference_module,
        "model.embed_tokens"
    );

    let t = traces(Case::Embedding, |_| true);
    assert_eq!(kinds(&t.signatures), ["inputs_differ"], "{t:#?}");
    assert_eq!(t.verdict, Verdict::Untrusted);
    assert!(
        t.drill_down.is_none(),
        "an untrusted comparison is not drilled"
    );
}

#[test]
fn a_few_channels_carrying_the_error_are_named() {
    let r = dumps(Case::Channels);
    assert_eq!(kinds(&r.signatures), ["channels"], "{r:#?}");
    let Evidence::Channels(ev) = &r.signatures[0].evidence else {
        unreachable!()
    };
    assert_eq!(ev.tensor, "model.layers.0.mlp:out");
    assert_eq!(ev.channels, synth::BROKEN_CHANNELS);
    assert_eq!((ev.channel_dim, ev.size), (2, synth::DIMS));
    assert!(ev.error_share > 0.9 && ev.rest_cosine > 0.9999, "{ev:?}");
    // A 1.25 scale keeps each channel's cosine at 1; rel_diff shows it.
    assert!(ev.cosines.iter().all(|c| *c > 0.9999), "{ev:?}");
    assert!(ev.rel_diffs.iter().all(|r| *r > 1e-2), "{ev:?}");
    assert_eq!(r.verdict, Verdict::Diverged);
    // The channel dim can be named; naming the token dim finds nothing.
    let dir = tempfile::tempdir().unwrap();
    let pair = synth::write_case(dir.path(), Case::Channels);
    let r = compare_dumps(
        &pair.reference,
        &pair.port,
        &DumpOptions {
            channel_dim: Some(1),
            ..DumpOptions::default()
        },
    )
    .unwrap();
    assert!(r.signatures.is_empty(), "{:?}", r.signatures);
}

#[test]
fn a_report_renders_its_checks_before_its_verdict_and_round_trips() {
    let r = dumps(Case::Padding);
    let text = r.render_text();
    let check = text.find("[token_subset]").unwrap();
    let verdict = text
        .find("first divergence: model.layers.0.self_attn")
        .unwrap();
    assert!(check < verdict, "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["verdict"], "diverged");
    assert_eq!(json["signatures"][0]["kind"], "token_subset");
    assert_eq!(
        json["signatures"][0]["evidence"]["ranges"],
        serde_json::json!([[48, 63]])
    );
    let back: DumpReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, r);
}
