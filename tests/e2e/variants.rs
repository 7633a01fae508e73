//! Hypothesis variants through the real binary (issue #19, item 2): a
//! numpy port whose layer norm carries a planted epsilon bug that
//! `EPS_FIX=1` fixes, with three variants. The red run's test runs under
//! all three at once on the embedded worker's three CPU slots; the table is
//! in `fvd status --json`, the variant that passes is named in the blocked
//! reason and in `PORT_STATUS.md`'s evidence, and a second identical run
//! changes no byte of that file.

use crate::support::{Sandbox, TestComponent, fvd};

/// A red layer norm: the port's epsilon is 1e-3 where the reference uses
/// 1e-6 (on inputs whose variance is about 1e-6, it matters), unless
/// `EPS_FIX=1`. `FASTVIDEO_DTYPE` and `CUBLAS_WORKSPACE_CONFIG` change
/// nothing that matters here.
const BODY: &str = r#"import numpy as np
x = np.random.default_rng(0).standard_normal((8, 64)) * 1e-3
def norm(x, eps):
    m = x.mean(-1, keepdims=True)
    v = x.var(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps)
expected = norm(x, 1e-6)
dtype = np.float64 if os.environ.get('FASTVIDEO_DTYPE') == 'float64' else np.float32
eps = 1e-6 if os.environ.get('EPS_FIX') == '1' else 1e-3
np.testing.assert_allclose(norm(x.astype(dtype), eps), expected, rtol=1e-3, atol=1e-3)"#;

const VARIANTS: &str = r#"
[[component.variant]]
name = "eps_fix"
env = { EPS_FIX = "1" }

[[component.variant]]
name = "float64"
env = { FASTVIDEO_DTYPE = "float64" }

[[component.variant]]
name = "deterministic"
env = { CUBLAS_WORKSPACE_CONFIG = ":4096:8" }
"#;

fn text(out: &std::process::Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn submit(sb: &Sandbox, extra: &[&str]) {
    let out = fvd()
        .args(["submit", "--family", "eps", "--wait", "--cpu-slots", "3"])
        .args(extra)
        .arg("--repo")
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn a_red_component_s_variants_run_at_once_and_name_the_fix() {
    let sb = Sandbox::new();
    sb.port("eps", &[TestComponent::new("norm", BODY)]);
    let spec = sb.repo().join("tests/local_tests/eps/port.toml");
    let mut spec_text = std::fs::read_to_string(&spec).unwrap();
    spec_text.push_str(VARIANTS);
    std::fs::write(&spec, spec_text).unwrap();
    submit(&sb, &[]);

    let status = sb.local_status("eps").expect("status after the port");
    let c = &status["components"][0];
    assert_eq!(
        (c["name"].as_str(), c["status"].as_str()),
        (Some("norm"), Some("blocked"))
    );
    // The variant runs are not runs of the component.
    assert_eq!(c["runs"], 1, "{c:#}");
    let reason = c["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("debug_red: passes with EPS_FIX=1 (variant eps_fix); "),
        "{reason}"
    );
    assert!(reason.contains("Not equal to tolerance"), "{reason}");

    let table = c["variants"].as_array().expect("a variant table");
    let rows: Vec<(&str, &str, &str)> = table
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["verdict"].as_str().unwrap(),
                r["finding"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("baseline", "debug_red", "baseline"),
            ("eps_fix", "non_skip_pass", "passes"),
            ("float64", "debug_red", "red"),
            ("deterministic", "debug_red", "red"),
        ],
        "{table:#?}"
    );
    assert_eq!(table[1]["env"], serde_json::json!(["EPS_FIX=1"]));
    assert_eq!(table[0]["job_id"], "eps.norm.1");
    assert!(table.iter().all(|r| r["state"] == "done"), "{table:#?}");
    // The three ran side by side: each started before any of them ended.
    let variants = &table[1..];
    let started: Vec<i64> = variants
        .iter()
        .map(|r| r["spawned_ms"].as_i64().unwrap())
        .collect();
    let ended: Vec<i64> = variants
        .iter()
        .map(|r| r["finished_ms"].as_i64().unwrap())
        .collect();
    assert!(started.iter().all(|s| *s > 0), "{table:#?}");
    let (last_start, first_end) = (*started.iter().max().unwrap(), *ended.iter().min().unwrap());
    assert!(
        last_start < first_end,
        "the variants did not overlap: started {started:?}, ended {ended:?}"
    );
    eprintln!(
        "variants started within {} ms of each other; all three ran {} ms side by side",
        last_start - started.iter().min().unwrap(),
        first_end - last_start
    );

    // The text view lists the table under the component.
    let human = fvd()
        .args(["status", "eps", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(
        human.contains("    eps_fix        EPS_FIX=1  non_skip_pass  [passes]"),
        "{human}"
    );
    // The variant runs' output is kept like any run's.
    let logs = fvd()
        .args(["logs", "eps", "norm#variant", "--run", "1", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("1 passed"),
        "{}",
        text(&logs)
    );

    // PORT_STATUS.md: the table rides in the component's evidence.
    let ps_path = sb.repo().join("tests/local_tests/eps/PORT_STATUS.md");
    let ps = std::fs::read_to_string(&ps_path).unwrap();
    let row = ps
        .lines()
        .find(|l| l.contains("[fvd ") && l.contains("debug_red — "))
        .unwrap_or_else(|| panic!("{ps}"));
    assert!(
        row.contains("— passes with EPS_FIX=1 (variant eps_fix); ")
            && row.contains("; variants: eps_fix passes, float64 red, deterministic red]"),
        "{row}"
    );

    // The same run again, variants and all: not a byte of the file changes.
    submit(&sb, &["--rerun"]);
    let again = sb.local_status("eps").unwrap();
    let table = again["components"][0]["variants"].as_array().unwrap();
    assert_eq!(table[0]["job_id"], "eps.norm.2", "{table:#?}");
    assert_eq!(table[1]["job_id"], "eps.norm#variant.4", "{table:#?}");
    assert_eq!(std::fs::read_to_string(&ps_path).unwrap(), ps);
}

/// A red three-block numpy model that traces itself like FastVideo's hooks
/// (`FASTVIDEO_TRACE_*`, the reference into `FVD_TRACE_DIR`): each block
/// is a norm then an MLP whose output goes through `+ 1000 - 1000` (exact
/// enough in float32, ruinous in float16) and is scaled down, so the next
/// norm sees a tiny variance. Planted: block 2's norm uses eps 1e-3 instead
/// of 1e-6, unless `EPS_FIX=1`; `FASTVIDEO_DTYPE=float16` runs the port in
/// half precision.
const TRACED_BODY: &str = r#"import json, re
import numpy as np
half = os.environ.get('FASTVIDEO_DTYPE') == 'float16'
eps_fixed = os.environ.get('EPS_FIX') == '1'
x = np.random.default_rng(0).standard_normal((8, 64))
ws = [np.random.default_rng(b + 1).standard_normal((64, 64)) * 0.1 for b in range(3)]
def model(dtype, port):
    rows = []
    h = x.astype(dtype)
    for b in range(3):
        eps = 1e-3 if port and b == 2 and not eps_fixed else 1e-6
        n = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + dtype(eps))
        rows.append(('blocks.%d.norm' % b, n))
        h = ((n @ ws[b].astype(dtype) + dtype(1000)) - dtype(1000)) * dtype(1e-3)
        rows.append(('blocks.%d.mlp' % b, h))
        rows.append(('blocks.%d' % b, h))
    return h, rows
def trace(rows, layers, path):
    with open(path, 'w') as f:
        for name, t in rows:
            if re.search(layers, name):
                a = np.asarray(t, dtype=np.float64)
                f.write(json.dumps({'module': name, 'tensor': 'out', 'step': 0, 'abs_mean': float(np.abs(a).mean()), 'max': float(a.max()), 'shape': list(a.shape), 'rank': 0, 'world_size': 1}) + '\n')
expected, ref_rows = model(np.float64, False)
actual, port_rows = model(np.float16 if half else np.float32, True)
if os.environ.get('FASTVIDEO_TRACE_ACTIVATIONS') == '1':
    trace(port_rows, os.environ['FASTVIDEO_TRACE_LAYERS'], os.environ['FASTVIDEO_TRACE_OUTPUT'].replace('<rank>', '0'))
    trace(ref_rows, os.environ['FVD_TRACE_REFERENCE_LAYERS'], os.path.join(os.environ['FVD_TRACE_DIR'], 'reference_rank0.jsonl'))
np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=1e-3, atol=1e-6)"#;

const TRACED_VARIANTS: &str = r#"
[component.trace]
layers = '^blocks\.\d+$'
reference = "reference_rank*.jsonl"
port = "port_rank*.jsonl"

[[component.variant]]
name = "eps_fix"
env = { EPS_FIX = "1" }

[[component.variant]]
name = "half"
env = { FASTVIDEO_DTYPE = "float16" }

[[component.variant]]
name = "deterministic"
env = { CUBLAS_WORKSPACE_CONFIG = ":4096:8" }
"#;

#[test]
fn traced_variants_on_a_fleet_say_where_each_first_divergence_lies() {
    let mut sb = Sandbox::new();
    sb.port("vt", &[TestComponent::new("dit", TRACED_BODY)]);
    let spec = sb.repo().join("tests/local_tests/vt/port.toml");
    let mut spec_text = std::fs::read_to_string(&spec).unwrap();
    spec_text.push_str(TRACED_VARIANTS);
    std::fs::write(&spec, spec_text).unwrap();
    sb.serve();
    sb.worker("w1", 3);
    let out = sb.submit_remote("vt", &["--wait"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    let status = sb.remote_status("vt").expect("remote status");
    let c = &status["components"][0];
    let reason = c["reason"].as_str().unwrap();
    // What passes and what moves first, then the drill-down, then the
    // assertion.
    assert!(
        reason.starts_with(
            "debug_red: passes with EPS_FIX=1 (variant eps_fix); with FASTVIDEO_DTYPE=float16 (variant half) the first divergence moves to blocks.0; first divergence: blocks.2.norm "
        ),
        "{reason}"
    );
    let table = c["variants"].as_array().expect("a variant table");
    let rows: Vec<(&str, &str, &str, &str)> = table
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["verdict"].as_str().unwrap(),
                r["first_divergence"].as_str().unwrap(),
                r["finding"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("baseline", "debug_red", "blocks.2.norm", "baseline"),
            ("eps_fix", "non_skip_pass", "", "passes"),
            ("half", "debug_red", "blocks.0", "moves"),
            ("deterministic", "debug_red", "blocks.2.norm", "same"),
        ],
        "{table:#?}"
    );
    assert!(table[2]["drift"].as_f64().unwrap() > 0.005, "{table:#?}");
    assert!(table.iter().all(|r| r["trace_error"] == ""), "{table:#?}");
}
