//! `fvd trace …` against the real GPT-2 traces and dumps of
//! `fixtures/traces/gpt2`: every case of its `expected.json`, the shard
//! merges, the dump comparator, and bad input.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::support::{fixtures, fvd};

fn gpt2() -> PathBuf {
    fixtures().join("traces/gpt2")
}

/// Port names → reference names, as the fixture README describes them.
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

fn rename_args() -> Vec<String> {
    RENAMES
        .iter()
        .flat_map(|r| ["--rename".to_string(), r.to_string()])
        .collect()
}

fn run(args: &[String]) -> Output {
    fvd().args(args).output().expect("run fvd")
}

fn compare_json(reference: &[&str], port: &[&str], extra: &[String]) -> (i32, Value) {
    let dir = gpt2();
    let mut args = vec![
        "trace".to_string(),
        "compare".to_string(),
        "--json".to_string(),
    ];
    args.push("--reference".into());
    args.extend(reference.iter().map(|f| dir.join(f).display().to_string()));
    args.push("--port".into());
    args.extend(port.iter().map(|f| dir.join(f).display().to_string()));
    args.extend(rename_args());
    args.extend(extra.iter().cloned());
    let out = run(&args);
    let code = out.status.code().expect("exit code");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

fn codes(report: &Value) -> Vec<String> {
    report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_expected_case_gives_the_expected_first_divergence() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(gpt2().join("expected.json")).unwrap())
            .unwrap();
    let cases = expected.as_object().unwrap();
    assert!(cases.len() >= 5, "expected.json has {} cases", cases.len());
    for (name, case) in cases {
        let reference = [case["official"].as_str().unwrap()];
        let port: Vec<&str> = match case.get("port_shards") {
            Some(shards) => shards
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
                .collect(),
            None => vec![case["port"].as_str().unwrap()],
        };
        let tol: Vec<String> = match &case["tolerance"] {
            Value::Object(m) => m
                .iter()
                .flat_map(|(k, v)| ["--tol".to_string(), format!("{k}={v}")])
                .collect(),
            _ => Vec::new(),
        };
        let (code, report) = compare_json(&reference, &port, &tol);
        let want = &case["first_divergence"];
        let got = &report["first_divergence"];
        if want.is_null() {
            assert_eq!(code, 0, "case {name}: exit code; report {got}");
            assert!(got.is_null(), "case {name}: unexpected divergence {got}");
        } else {
            assert_eq!(code, 1, "case {name}: exit code");
            assert_eq!(
                got["port_module"], want["port_module"],
                "case {name}: {got}"
            );
            if let Some(official) = want.get("official_module") {
                assert_eq!(&got["reference_module"], official, "case {name}");
            }
            assert_eq!(got["tensor"], want["tensor"], "case {name}");
            assert_eq!(got["step"], want["step"], "case {name}");
        }
        // No case may ever flag a row of a bit-identical step.
        for row in report["rows"].as_array().unwrap() {
            if row["exact"].as_bool().unwrap() {
                assert!(!row["diverged"].as_bool().unwrap(), "case {name}: {row}");
            }
        }
    }
}

#[test]
fn bug_case_reports_drift_drill_down_and_no_unmatched() {
    let (code, r) = compare_json(&["official.jsonl"], &["port_bug.jsonl"], &[]);
    assert_eq!(code, 1);
    let fd = &r["first_divergence"];
    assert!(fd["drift"].as_f64().unwrap() > 0.9, "{fd}");
    assert_eq!(r["drill_down"], r"^blocks\.3(\.|$)");
    assert_eq!(r["drill_down_reference"], r"^transformer\.h\.3(\.|$)");
    assert_eq!(r["rows"].as_array().unwrap().len(), 46);
    assert!(r["unmatched"]["reference"].as_array().unwrap().is_empty());
    assert!(r["unmatched"]["port"].as_array().unwrap().is_empty());
    // Rows keep the reference's execution order: block 3 before block 4, the
    // embeddings first, lm_head last.
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows[0]["reference_module"], "transformer.wte");
    assert_eq!(rows[45]["reference_module"], "lm_head");
    let before: Vec<bool> = rows
        .iter()
        .take_while(|row| row["port_module"] != "blocks.3.norm2")
        .map(|row| row["exact"].as_bool().unwrap())
        .collect();
    assert_eq!(before.len(), 25);
    assert!(
        before.iter().all(|e| *e),
        "rows before the bug are bit-identical"
    );
}

#[test]
fn tensor_parallel_shards_merge_to_the_single_rank_answer() {
    let (_, single) = compare_json(&["official.jsonl"], &["port_bug.jsonl"], &[]);
    let (code, tp) = compare_json(
        &["official.jsonl"],
        &["port_bug_tp2_rank1.jsonl", "port_bug_tp2_rank0.jsonl"],
        &[],
    );
    assert_eq!(code, 1);
    let (a, b) = (&single["first_divergence"], &tp["first_divergence"]);
    for k in ["reference_module", "port_module", "tensor", "step", "stat"] {
        assert_eq!(a[k], b[k], "{k}");
    }
    let drift = |v: &Value| v["drift"].as_f64().unwrap();
    assert!((drift(a) - drift(b)).abs() < 1e-6, "{a} vs {b}");
    // The column-parallel c_fc shards were concatenated back to 768.
    let c_fc = tp["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["port_module"] == "blocks.0.ffn.c_fc")
        .unwrap();
    assert_eq!(c_fc["port_shape"], serde_json::json!([1, 64, 768]));
    assert!(!codes(&tp).iter().any(|c| c == "shard_dim_unknown"));
}

#[test]
fn sequence_parallel_merge_reproduces_the_reference_shapes() {
    let dir = gpt2();
    let out_dir = tempfile::tempdir().unwrap();
    let merged = out_dir.path().join("merged.jsonl");
    let mut args: Vec<String> = ["trace", "merge"].iter().map(|s| s.to_string()).collect();
    args.push(dir.join("port_sp2_rank0.jsonl").display().to_string());
    args.push(dir.join("port_sp2_rank1.jsonl").display().to_string());
    args.push("--reference".into());
    args.push(dir.join("official.jsonl").display().to_string());
    args.extend(rename_args());
    args.push("-o".into());
    args.push(merged.display().to_string());
    let out = run(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |p: &Path| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let merged = read(&merged);
    let official = read(&dir.join("official.jsonl"));
    assert_eq!(merged.len(), official.len());
    for (m, o) in merged.iter().zip(&official) {
        assert_eq!(m["shape"], o["shape"], "{} vs {}", m["module"], o["module"]);
        // The merged trace keeps the port's own names.
        assert!(!m["module"].as_str().unwrap().starts_with("transformer."));
        let rel = |k: &str| {
            let (a, b) = (m[k].as_f64().unwrap(), o[k].as_f64().unwrap());
            (a - b).abs() / a.abs().max(b.abs())
        };
        // Faithful port, same dtype: merged stats equal the full tensor's up
        // to float32 rounding of the per-shard stats.
        assert!(rel("abs_mean") < 1e-5, "{}", m["module"]);
        assert!(rel("std") < 1e-5, "{}", m["module"]);
        assert_eq!(m["max"], o["max"]);
        assert_eq!(m["min"], o["min"]);
    }

    // Without a reference the sharded dim is not guessed.
    let bare = out_dir.path().join("bare.jsonl");
    let out = run(&[
        "trace".into(),
        "merge".into(),
        dir.join("port_sp2_rank0.jsonl").display().to_string(),
        dir.join("port_sp2_rank1.jsonl").display().to_string(),
        "-o".into(),
        bare.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("shard_dim_unknown"));
    assert!(read(&bare).iter().all(|r| r.get("shape").is_none()));
}

#[test]
fn noise_case_is_clean_and_says_why_nothing_is_exact() {
    let (code, r) = compare_json(&["official.jsonl"], &["port_noise.jsonl"], &[]);
    assert_eq!(code, 0);
    let c = codes(&r);
    assert!(c.contains(&"dtype_differs".to_string()), "{c:?}");
    assert!(!c.contains(&"inputs_differ".to_string()), "{c:?}");
    // sum and mean drift ~100% relatively but sit near zero: with the floor
    // they stay small even when asked for.
    let (code, r) = compare_json(
        &["official.jsonl"],
        &["port_noise.jsonl"],
        &[
            "--tol".into(),
            "sum=1e-2".into(),
            "--tol".into(),
            "mean=1e-2".into(),
        ],
    );
    assert_eq!(code, 0, "{}", r["first_divergence"]);
}

#[test]
fn steps_case_at_defaults_flags_step_two_only_and_reports_exact_steps() {
    let (code, r) = compare_json(&["official_steps.jsonl"], &["port_steps.jsonl"], &[]);
    assert_eq!(code, 1);
    assert_eq!(r["first_divergence"]["step"], 2);
    assert_ne!(r["first_divergence"]["port_module"], "tok_embed");
    assert_eq!(r["exact_steps"], serde_json::json!([0, 1]));
    for row in r["rows"].as_array().unwrap() {
        if row["step"] != 2 {
            assert!(!row["diverged"].as_bool().unwrap(), "{row}");
        }
    }
    assert!(codes(&r).contains(&"exact_steps".to_string()));
    // --steps narrows the comparison.
    let (code, r) = compare_json(
        &["official_steps.jsonl"],
        &["port_steps.jsonl"],
        &["--steps".into(), "0,1".into()],
    );
    assert_eq!(code, 0);
    assert_eq!(r["rows"].as_array().unwrap().len(), 92);
}

#[test]
fn embedding_divergence_is_called_early() {
    let (_, r) = compare_json(
        &["official_steps.jsonl"],
        &["port_steps.jsonl"],
        &["--tol".into(), "abs_mean=1e-4".into()],
    );
    assert!(codes(&r).contains(&"early_divergence".to_string()));
}

#[test]
fn layers_filter_and_unmatched_modules_with_nearest_names() {
    let dir = gpt2();
    // No rename rules: nothing matches except lm_head.
    let out = run(&[
        "trace".into(),
        "compare".into(),
        "--json".into(),
        "--reference".into(),
        dir.join("official.jsonl").display().to_string(),
        "--port".into(),
        dir.join("port_bug.jsonl").display().to_string(),
    ]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Only lm_head aligns, and the bug reaches it.
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(r["rows"].as_array().unwrap().len(), 1);
    let c = codes(&r);
    assert!(
        c.contains(&"only_in_reference".to_string()) && c.contains(&"only_in_port".to_string())
    );
    let port_side = r["unmatched"]["port"].as_array().unwrap();
    let n1 = port_side
        .iter()
        .find(|u| u["module"] == "blocks.0.norm1")
        .unwrap();
    assert_eq!(n1["nearest"][0], "transformer.h.0.ln_1", "{n1}");

    let (_, r) = compare_json(
        &["official.jsonl"],
        &["port_bug.jsonl"],
        &["--layers".into(), r"^transformer\.h\.4\.".into()],
    );
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    assert_eq!(
        r["first_divergence"]["reference_module"],
        "transformer.h.4.ln_1"
    );
}

#[test]
fn text_report_and_plot() {
    let dir = gpt2();
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("drift.svg");
    let mut args: Vec<String> = vec![
        "trace".into(),
        "compare".into(),
        "--reference".into(),
        dir.join("official.jsonl").display().to_string(),
        "--port".into(),
        dir.join("port_bug.jsonl").display().to_string(),
        "--plot".into(),
        svg.display().to_string(),
    ];
    args.extend(rename_args());
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("first divergence: blocks.3.norm2"), "{text}");
    assert!(
        text.contains(r"FASTVIDEO_TRACE_LAYERS='^blocks\.3(\.|$)'"),
        "{text}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("blocks.3.norm2") && svg.contains("<polyline"));
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
    let official = gpt2().join("official.jsonl").display().to_string();
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

fn dumps_json(extra: &[String]) -> (i32, Value) {
    let dir = gpt2();
    let mut args: Vec<String> = vec![
        "trace".into(),
        "dumps".into(),
        dir.join("official_dump.safetensors").display().to_string(),
        dir.join("port_bug_dump.safetensors").display().to_string(),
        "--json".into(),
    ];
    args.extend(rename_args());
    args.extend(extra.iter().cloned());
    let out = run(&args);
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code().unwrap(), json)
}

#[test]
fn dump_comparator_names_the_broken_norm_despite_its_high_cosine() {
    let order = gpt2().join("official.jsonl").display().to_string();
    let (code, r) = dumps_json(&["--order".into(), order, "--token-dim".into(), "1".into()]);
    assert_eq!(code, 1);
    let fd = &r["first_divergence"];
    assert_eq!(fd["port_module"], "blocks.3.norm2", "{fd}");
    assert_eq!(fd["reference_module"], "transformer.h.3.ln_2");
    assert_eq!(fd["tensor"], "out");
    assert_eq!(fd["stat"], "rel_diff");
    assert!(fd["drift"].as_f64().unwrap() > 0.5, "{fd}");
    assert_eq!(r["order_source"], "order_file");
    let tensors = r["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 46);
    assert_eq!(tensors[0]["reference_key"], "transformer.wte:out");
    let norm = tensors
        .iter()
        .find(|t| t["port_module"] == "blocks.3.norm2")
        .unwrap();
    let m = &norm["metrics"];
    assert!(
        m["cosine"].as_f64().unwrap() > 0.99,
        "cosine alone misses it: {m}"
    );
    assert_eq!(m["max_abs_diff_at"].as_array().unwrap().len(), 3);
    assert_eq!(m["token_cosine"].as_array().unwrap().len(), 64);
    // Everything before the norm is bit-identical, so no inputs_differ.
    let c = codes(&r);
    assert!(c.contains(&"scale_error".to_string()), "{c:?}");
    assert!(!c.contains(&"inputs_differ".to_string()), "{c:?}");
    assert!(
        tensors[..25]
            .iter()
            .all(|t| t["metrics"]["identical"] == true)
    );
}

#[test]
fn dump_comparator_without_order_says_it_fell_back_to_sorting() {
    let (code, r) = dumps_json(&[]);
    assert_eq!(code, 1);
    assert_eq!(r["order_source"], "sorted");
    assert!(codes(&r).contains(&"order_fallback".to_string()));
    // Name order puts lm_head before transformer.*: the "first" tensor is
    // then not the first to run, which is what the diagnostic warns about.
    assert_eq!(r["first_divergence"]["port_module"], "lm_head");
    let keys: Vec<&str> = r["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["reference_key"].as_str().unwrap())
        .collect();
    let pos = |k: &str| keys.iter().position(|x| *x == k).unwrap();
    assert!(pos("transformer.h.2:out") < pos("transformer.h.3:out"));
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
