//! `fvd trace …` checks over one set of activation-trace cases laid out like
//! `tests/fixtures/traces` (an `expected.json`, the single-rank, sharded and
//! multi-step traces, and the two dumps). The e2e tests run them on the
//! project's own cases, the conformance suite on the real GPT-2 ones: same
//! checks, each set's own names and numbers.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use super::fvd;

/// One set of trace cases and the facts about it the checks rely on.
#[derive(Debug, Clone)]
pub struct TraceCases {
    pub dir: PathBuf,
    /// `--rename` rules turning the port's module names into the reference's.
    pub renames: &'static [&'static str],
    /// Rows of one single-step trace.
    pub rows: usize,
    /// Tokens (sequence length) of every traced output.
    pub tokens: usize,
    /// The planted bug, on each side.
    pub bug_port: &'static str,
    pub bug_reference: &'static str,
    /// Rows before the bug (all bit-identical).
    pub rows_before_bug: usize,
    /// `drill_down` and `drill_down_reference` of the bug case.
    pub drill_down: [&'static str; 2],
    /// First and last reference modules in execution order.
    pub first_reference: &'static str,
    pub last_reference: &'static str,
    /// The column-parallel port module of the TP case and its merged shape.
    pub column_parallel: (&'static str, [u64; 3]),
    /// A `--layers` regex for one block after the bug, the rows it keeps and
    /// the first of them (which the bug reaches).
    pub layers: (&'static str, usize, &'static str),
    /// Without rename rules: a port module, the reference module it should
    /// have been renamed to, and within how many nearest names that one is.
    pub nearest: (&'static str, &'static str, usize),
    /// Two block outputs whose reference keys sort in execution order.
    pub sorted_blocks: (&'static str, &'static str),
}

impl TraceCases {
    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    fn rename_args(&self) -> Vec<String> {
        self.renames
            .iter()
            .flat_map(|r| ["--rename".to_string(), r.to_string()])
            .collect()
    }

    /// `fvd trace compare --json` of reference files against port files.
    pub fn compare(&self, reference: &[&str], port: &[&str], extra: &[String]) -> (i32, Value) {
        let mut args: Vec<String> = vec!["trace".into(), "compare".into(), "--json".into()];
        args.push("--reference".into());
        args.extend(reference.iter().map(|f| self.path(f)));
        args.push("--port".into());
        args.extend(port.iter().map(|f| self.path(f)));
        args.extend(self.rename_args());
        args.extend(extra.iter().cloned());
        let out = run(&args);
        (code(&out), json(&out))
    }

    fn dumps(&self, extra: &[String]) -> (i32, Value) {
        let mut args: Vec<String> = vec![
            "trace".into(),
            "dumps".into(),
            self.path("official_dump.safetensors"),
            self.path("port_bug_dump.safetensors"),
            "--json".into(),
        ];
        args.extend(self.rename_args());
        args.extend(extra.iter().cloned());
        let out = run(&args);
        (code(&out), json(&out))
    }
}

pub fn run(args: &[String]) -> Output {
    fvd().args(args).output().expect("run fvd")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exit code")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn codes(report: &Value) -> Vec<String> {
    report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap().to_string())
        .collect()
}

fn rows(report: &Value) -> &Vec<Value> {
    report["rows"].as_array().expect("rows")
}

/// Every case of `expected.json` gives its first divergence (or none), and
/// no case flags a bit-identical row.
pub fn every_expected_case(c: &TraceCases) {
    let text = std::fs::read_to_string(c.dir.join("expected.json")).expect("expected.json");
    let expected: Value = serde_json::from_str(&text).unwrap();
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
        let (code, report) = c.compare(&reference, &port, &tol);
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
        for row in rows(&report) {
            if row["exact"].as_bool().unwrap() {
                assert!(!row["diverged"].as_bool().unwrap(), "case {name}: {row}");
            }
        }
    }
}

/// The bug case: its drift, the drill-down scopes, no unmatched module, rows
/// in the reference's execution order, bit-identical rows before the bug.
pub fn bug_case_drift_drill_down_and_order(c: &TraceCases) {
    let (code, r) = c.compare(&["official.jsonl"], &["port_bug.jsonl"], &[]);
    assert_eq!(code, 1);
    let fd = &r["first_divergence"];
    assert_eq!(fd["port_module"], c.bug_port, "{fd}");
    assert!(fd["drift"].as_f64().unwrap() > 0.9, "{fd}");
    assert_eq!(r["drill_down"], c.drill_down[0]);
    assert_eq!(r["drill_down_reference"], c.drill_down[1]);
    assert_eq!(rows(&r).len(), c.rows);
    assert!(r["unmatched"]["reference"].as_array().unwrap().is_empty());
    assert!(r["unmatched"]["port"].as_array().unwrap().is_empty());
    let rows = rows(&r);
    assert_eq!(rows[0]["reference_module"], c.first_reference);
    assert_eq!(rows[c.rows - 1]["reference_module"], c.last_reference);
    let before: Vec<bool> = rows
        .iter()
        .take_while(|row| row["port_module"] != c.bug_port)
        .map(|row| row["exact"].as_bool().unwrap())
        .collect();
    assert_eq!(before.len(), c.rows_before_bug);
    assert!(before.iter().all(|e| *e), "rows before the bug are exact");
}

/// Tensor-parallel shards, in either order, merge to the single-rank answer
/// and the column-parallel output to its full shape.
pub fn tensor_parallel_merge(c: &TraceCases) {
    let (_, single) = c.compare(&["official.jsonl"], &["port_bug.jsonl"], &[]);
    let (code, tp) = c.compare(
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
    let (module, shape) = c.column_parallel;
    let row = rows(&tp)
        .iter()
        .find(|r| r["port_module"] == module)
        .unwrap_or_else(|| panic!("no row for {module}"));
    assert_eq!(row["port_shape"], serde_json::json!(shape));
    assert!(!codes(&tp).iter().any(|c| c == "shard_dim_unknown"));
}

/// Sequence-parallel shards merge to the reference's shapes and stats; with
/// no reference the sharded dim is not guessed.
pub fn sequence_parallel_merge(c: &TraceCases) {
    let out_dir = tempfile::tempdir().unwrap();
    let merged = out_dir.path().join("merged.jsonl");
    let mut args: Vec<String> = vec!["trace".into(), "merge".into()];
    args.push(c.path("port_sp2_rank0.jsonl"));
    args.push(c.path("port_sp2_rank1.jsonl"));
    args.push("--reference".into());
    args.push(c.path("official.jsonl"));
    args.extend(c.rename_args());
    args.push("-o".into());
    args.push(merged.display().to_string());
    let out = run(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let merged = read_jsonl(&merged);
    let official = read_jsonl(&c.dir.join("official.jsonl"));
    assert_eq!(merged.len(), official.len());
    let renamed_prefix = c.first_reference.split('.').next().unwrap();
    for (m, o) in merged.iter().zip(&official) {
        assert_eq!(m["shape"], o["shape"], "{} vs {}", m["module"], o["module"]);
        assert_eq!(m["shape"][1], c.tokens as u64, "{}", m["module"]);
        // The merged trace keeps the port's own names.
        assert!(
            !m["module"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{renamed_prefix}.")),
            "{}",
            m["module"]
        );
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

    let bare = out_dir.path().join("bare.jsonl");
    let out = run(&[
        "trace".into(),
        "merge".into(),
        c.path("port_sp2_rank0.jsonl"),
        c.path("port_sp2_rank1.jsonl"),
        "-o".into(),
        bare.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("shard_dim_unknown"));
    assert!(read_jsonl(&bare).iter().all(|r| r.get("shape").is_none()));
}

fn read_jsonl(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The noise case is clean, says why no row is exact, and its near-zero
/// sums and means stay small even when asked for.
pub fn noise_case_is_clean(c: &TraceCases) {
    let (code, r) = c.compare(&["official.jsonl"], &["port_noise.jsonl"], &[]);
    assert_eq!(code, 0);
    let found = codes(&r);
    assert!(found.contains(&"dtype_differs".to_string()), "{found:?}");
    assert!(!found.contains(&"inputs_differ".to_string()), "{found:?}");
    // Without the floor some sum drifts by ~100% relatively.
    let official = read_jsonl(&c.dir.join("official.jsonl"));
    let noise = read_jsonl(&c.dir.join("port_noise.jsonl"));
    let worst_sum = official
        .iter()
        .zip(&noise)
        .map(|(a, b)| {
            let (a, b) = (a["sum"].as_f64().unwrap(), b["sum"].as_f64().unwrap());
            (a - b).abs() / a.abs().max(b.abs())
        })
        .fold(0.0, f64::max);
    assert!(
        worst_sum > 0.5,
        "the noise case has no near-zero sum: {worst_sum}"
    );
    let (code, r) = c.compare(
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

/// At the defaults the steps case flags step 2 only, later than the
/// embedding, and reports the exact steps; `--steps 0,1` is clean.
pub fn steps_case_at_defaults(c: &TraceCases) {
    let (code, r) = c.compare(&["official_steps.jsonl"], &["port_steps.jsonl"], &[]);
    assert_eq!(code, 1);
    assert_eq!(r["first_divergence"]["step"], 2);
    assert_ne!(
        r["first_divergence"]["reference_module"], c.first_reference,
        "{}",
        r["first_divergence"]
    );
    assert_eq!(r["exact_steps"], serde_json::json!([0, 1]));
    for row in rows(&r) {
        if row["step"] != 2 {
            assert!(!row["diverged"].as_bool().unwrap(), "{row}");
        }
    }
    assert!(codes(&r).contains(&"exact_steps".to_string()));
    let (code, r) = c.compare(
        &["official_steps.jsonl"],
        &["port_steps.jsonl"],
        &["--steps".into(), "0,1".into()],
    );
    assert_eq!(code, 0);
    assert_eq!(rows(&r).len(), 2 * c.rows);
}

/// A tight tolerance names the embedding at step 2, which is an early
/// divergence.
pub fn embedding_divergence_is_called_early(c: &TraceCases) {
    let (code, r) = c.compare(
        &["official_steps.jsonl"],
        &["port_steps.jsonl"],
        &["--tol".into(), "abs_mean=1e-4".into()],
    );
    assert_eq!(code, 1);
    assert_eq!(r["first_divergence"]["reference_module"], c.first_reference);
    assert!(codes(&r).contains(&"early_divergence".to_string()));
}

/// Without rename rules only the shared head aligns (and the bug reaches
/// it); unmatched modules get nearest-name hints; `--layers` narrows.
pub fn layers_filter_and_nearest_names(c: &TraceCases) {
    let out = run(&[
        "trace".into(),
        "compare".into(),
        "--json".into(),
        "--reference".into(),
        c.path("official.jsonl"),
        "--port".into(),
        c.path("port_bug.jsonl"),
    ]);
    let r = json(&out);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(rows(&r).len(), 1);
    assert_eq!(rows(&r)[0]["reference_module"], c.last_reference);
    let found = codes(&r);
    assert!(
        found.contains(&"only_in_reference".to_string())
            && found.contains(&"only_in_port".to_string())
    );
    let (port, reference, within) = c.nearest;
    let unmatched = r["unmatched"]["port"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["module"] == port)
        .unwrap_or_else(|| panic!("{port} is not unmatched"));
    let nearest = unmatched["nearest"].as_array().unwrap();
    assert!(
        nearest.iter().take(within).any(|n| n == reference),
        "{reference} not within the first {within} of {unmatched}"
    );

    let (regex, n, first) = c.layers;
    let (_, r) = c.compare(
        &["official.jsonl"],
        &["port_bug.jsonl"],
        &["--layers".into(), regex.into()],
    );
    assert_eq!(rows(&r).len(), n);
    assert_eq!(r["first_divergence"]["reference_module"], first);
}

/// The human report names the bug and the next trace regex; `--plot`
/// writes an SVG with the drift line.
pub fn text_report_and_plot(c: &TraceCases) {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("drift.svg");
    let mut args: Vec<String> = vec![
        "trace".into(),
        "compare".into(),
        "--reference".into(),
        c.path("official.jsonl"),
        "--port".into(),
        c.path("port_bug.jsonl"),
        "--plot".into(),
        svg.display().to_string(),
    ];
    args.extend(c.rename_args());
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("first divergence: {}", c.bug_port)),
        "{text}"
    );
    assert!(
        text.contains(&format!("FASTVIDEO_TRACE_LAYERS='{}'", c.drill_down[0])),
        "{text}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains(c.bug_port) && svg.contains("<polyline"));
}

/// The dump comparator names the broken norm by rel_diff although its
/// cosine stays above 0.99, in the execution order of `--order`.
pub fn dumps_name_the_broken_norm(c: &TraceCases) {
    let order = c.path("official.jsonl");
    let (code, r) = c.dumps(&["--order".into(), order, "--token-dim".into(), "1".into()]);
    assert_eq!(code, 1);
    let fd = &r["first_divergence"];
    assert_eq!(fd["port_module"], c.bug_port, "{fd}");
    assert_eq!(fd["reference_module"], c.bug_reference);
    assert_eq!(fd["tensor"], "out");
    assert_eq!(fd["stat"], "rel_diff");
    assert!(fd["drift"].as_f64().unwrap() > 0.5, "{fd}");
    assert_eq!(r["order_source"], "order_file");
    let tensors = r["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), c.rows);
    assert_eq!(
        tensors[0]["reference_key"],
        format!("{}:out", c.first_reference)
    );
    let norm = tensors
        .iter()
        .find(|t| t["port_module"] == c.bug_port)
        .unwrap();
    let m = &norm["metrics"];
    assert!(
        m["cosine"].as_f64().unwrap() > 0.99,
        "cosine alone misses it: {m}"
    );
    assert_eq!(m["max_abs_diff_at"].as_array().unwrap().len(), 3);
    assert_eq!(m["token_cosine"].as_array().unwrap().len(), c.tokens);
    let found = codes(&r);
    assert!(found.contains(&"scale_error".to_string()), "{found:?}");
    assert!(!found.contains(&"inputs_differ".to_string()), "{found:?}");
    assert!(
        tensors[..c.rows_before_bug]
            .iter()
            .all(|t| t["metrics"]["identical"] == true)
    );
}

/// Without an order the dumps are sorted by name, and the report says so:
/// the shared head then sorts first although it runs last.
pub fn dumps_without_order_fall_back_to_sorting(c: &TraceCases) {
    let (code, r) = c.dumps(&[]);
    assert_eq!(code, 1);
    assert_eq!(r["order_source"], "sorted");
    assert!(codes(&r).contains(&"order_fallback".to_string()));
    assert_eq!(r["first_divergence"]["port_module"], c.last_reference);
    let keys: Vec<&str> = r["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["reference_key"].as_str().unwrap())
        .collect();
    let pos = |k: &str| {
        keys.iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("{k} not in {keys:?}"))
    };
    let (a, b) = c.sorted_blocks;
    assert!(pos(&format!("{a}:out")) < pos(&format!("{b}:out")));
}
