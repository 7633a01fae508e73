//! `fvd trace compare` and `fvd trace dumps` must not be fooled: a
//! comparison of nothing fails (issue #14), and the comparator checks
//! (false-cliff signatures, issue #19) are named on cases the project
//! generates itself with a small Llama-like model (`trace/tests/synth`).

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::support::fvd;

#[path = "../../trace/tests/synth/mod.rs"]
mod synth;

fn run(args: &[&str]) -> Output {
    fvd().args(args).output().expect("run fvd")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}; stderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn codes(report: &Value) -> Vec<String> {
    report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap().to_string())
        .collect()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_trace_comparison_of_nothing_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let pair = synth::write_case(tmp.path(), synth::Case::Clean);
    let empty = tmp.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let reference = p(&pair.reference_trace);

    // An empty port trace.
    let args = [
        "trace",
        "compare",
        "--reference",
        reference,
        "--port",
        p(&empty),
    ];
    let out = run(&args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an empty port trace is no success"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("nothing compared: "), "{text}");
    assert!(!text.contains("no divergence"), "{text}");
    let out = run(&[&args[..], &["--json"]].concat());
    assert_eq!(out.status.code(), Some(1));
    let r = json_of(&out);
    assert_eq!(codes(&r)[0], "nothing_compared", "{r}");
    assert_eq!(r["verdict"], "nothing_compared");
    assert!(r["first_divergence"].is_null());

    // A port trace whose module names have nothing in common with the reference's.
    let out = run(&[
        "trace",
        "compare",
        "--json",
        "--reference",
        reference,
        "--port",
        p(&pair.port_trace),
        "--rename",
        "^model=>other",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r = json_of(&out);
    assert_eq!(codes(&r)[0], "nothing_compared", "{r}");

    // The same traces with their names in common pass: the check is not a
    // blanket failure.
    let out = run(&[
        "trace",
        "compare",
        "--reference",
        reference,
        "--port",
        p(&pair.port_trace),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_dump_comparison_of_nothing_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let pair = synth::write_case(tmp.path(), synth::Case::Clean);
    let args = [
        "trace",
        "dumps",
        p(&pair.reference),
        p(&pair.port),
        "--rename",
        "^model=>other",
    ];
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1), "no common tensor is no success");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("nothing compared: "), "{text}");
    assert!(!text.contains("0 tensors compared"), "{text}");
    let out = run(&[&args[..], &["--json"]].concat());
    assert_eq!(out.status.code(), Some(1));
    let r = json_of(&out);
    assert_eq!(codes(&r)[0], "nothing_compared", "{r}");
    assert_eq!(r["verdict"], "nothing_compared");
}

#[test]
fn trace_dumps_names_each_signature_on_its_generated_case() {
    use synth::Case::*;
    let cases = [
        (Clean, None, "match"),
        (ReferenceShifted, Some("layer_shift"), "untrusted"),
        (PortShifted, Some("layer_shift"), "untrusted"),
        (Padding, Some("token_subset"), "diverged"),
        (Positions, Some("token_zero"), "diverged"),
        (Embedding, Some("inputs_differ"), "untrusted"),
        (Channels, Some("channels"), "diverged"),
    ];
    for (case, kind, verdict) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let pair = synth::write_case(tmp.path(), case);
        let args = [
            "trace",
            "dumps",
            p(&pair.reference),
            p(&pair.port),
            "--token-dim",
            "1",
        ];
        let out = run(&[&args[..], &["--json"]].concat());
        let r = json_of(&out);
        let kinds: Vec<&str> = r["signatures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, kind.into_iter().collect::<Vec<_>>(), "{case:?}: {r}");
        assert_eq!(r["verdict"], verdict, "{case:?}");
        assert_eq!(
            out.status.code(),
            Some(if kind.is_none() { 0 } else { 1 }),
            "{case:?}"
        );
        let Some(kind) = kind else { continue };
        // Each is also the first diagnostic, with its evidence and what to check.
        assert_eq!(codes(&r)[0], kind, "{case:?}");
        let sig = &r["signatures"][0];
        assert!(sig["evidence"].is_object(), "{sig}");
        assert!(!sig["check"].as_str().unwrap().is_empty(), "{sig}");
        match case {
            ReferenceShifted => {
                assert_eq!(sig["evidence"]["direction"], "reference_ahead");
                assert!(r["first_divergence"].is_null(), "{case:?}: {r}");
            }
            PortShifted => assert_eq!(sig["evidence"]["direction"], "reference_behind"),
            Padding => assert_eq!(sig["evidence"]["ranges"], serde_json::json!([[48, 63]])),
            Channels => assert_eq!(sig["evidence"]["channels"], serde_json::json!([3, 17, 29])),
            _ => {}
        }
        // In text, the check comes before the verdict.
        let text = String::from_utf8_lossy(&run(&args).stdout).into_owned();
        let at = text
            .find(&format!("[{kind}]"))
            .unwrap_or_else(|| panic!("{text}"));
        let verdict_at = text
            .find("first divergence: ")
            .or_else(|| text.find("comparison untrusted ("))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(at < verdict_at, "{case:?}: {text}");
    }
}

#[test]
fn trace_compare_calls_a_shifted_dumper_untrusted_instead_of_blaming_layer_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let pair = synth::write_case(tmp.path(), synth::Case::ReferenceShifted);
    let args = [
        "trace",
        "compare",
        "--reference",
        p(&pair.reference_trace),
        "--port",
        p(&pair.port_trace),
    ];
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("comparator checks:\n  [layer_shift] (untrusted) port model.layers.N:out matches reference model.layers.N+1:out"), "{text}");
    assert!(
        text.contains("\ncomparison untrusted (layer_shift): no first divergence is named"),
        "{text}"
    );
    assert!(!text.contains("first divergence: model.layers.0"), "{text}");
    assert!(!text.contains("next trace:"), "{text}");
    let r = json_of(&run(&[&args[..], &["--json"]].concat()));
    assert_eq!(r["verdict"], "untrusted");
    assert!(
        r["first_divergence"].is_null() && r["drill_down"].is_null(),
        "{r}"
    );
    assert_eq!(
        r["signatures"][0]["evidence"]["pairs"],
        serde_json::json!([[0, 1], [1, 2], [2, 3]])
    );
}
