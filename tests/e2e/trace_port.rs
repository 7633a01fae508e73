//! Drill-down tracing inside a port (issue 4, item 6), through the real
//! binary: the example's red `refiner` is rerun traced, its rank files come
//! back from the worker, and the investigation narrows from the blocks to
//! the first divergent block's modules; embedded, and with the orchestrator
//! and a worker as separate processes whose folders differ.

use std::path::Path;

use crate::port::copy_tree;
use crate::support::{Sandbox, TestComponent, fvd};

const BLOCKS: &str = r"^blocks\.\d+$";
const BLOCK_2: &str = r"^blocks\.2(\.|$)";

fn example(sb: &Sandbox) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    copy_tree(&example, sb.repo());
}

fn text(out: &std::process::Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn row(status: &serde_json::Value, name: &str) -> (String, String, u64) {
    let c = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("component {name} missing from {status}"));
    (
        c["status"].as_str().unwrap().to_string(),
        c["reason"].as_str().unwrap().to_string(),
        c["runs"].as_u64().unwrap(),
    )
}

/// `fvd trace show tinyport refiner --json` with `where_` (`--repo DIR` or
/// `--orchestrator URL`).
fn show_json(where_: &[&str]) -> serde_json::Value {
    let out = fvd()
        .args(["trace", "show", "tinyport", "refiner", "--json"])
        .args(where_)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// The investigation's shape: two steps, blocks first, then block 2, whose
/// norm is the first divergent leaf. Returns the steps.
fn assert_drilled_to_the_norm(inv: &serde_json::Value) -> Vec<serde_json::Value> {
    assert_eq!(inv["outcome"], "leaf", "{inv:#}");
    assert_eq!(inv["job_id"], "tinyport.refiner.1", "{inv:#}");
    let steps = inv["steps"].as_array().unwrap().clone();
    assert_eq!(steps.len(), 2, "{inv:#}");
    assert_eq!(steps[0]["layers"], BLOCKS);
    assert_eq!(steps[0]["reference_layers"], r"^layers\.\d+$");
    assert_eq!(steps[0]["first_module"], "blocks.2");
    assert_eq!(steps[1]["layers"], BLOCK_2);
    assert_eq!(steps[1]["reference_layers"], r"^layers\.2(\.|$)");
    assert_eq!(steps[1]["first_module"], "blocks.2.norm");
    assert_eq!(steps[1]["job_id"], "tinyport.refiner#trace.2");

    // Step 1: blocks 0 and 1 match, block 2 diverges; the port's two
    // sequence-parallel ranks were merged back to the reference's shape.
    let r1 = &steps[0]["report"];
    let rows = r1["rows"].as_array().unwrap();
    let modules: Vec<&str> = rows
        .iter()
        .map(|r| r["port_module"].as_str().unwrap())
        .collect();
    assert_eq!(modules, ["blocks.0", "blocks.1", "blocks.2"], "{r1:#}");
    let diverged: Vec<bool> = rows.iter().map(|r| r["diverged"] == true).collect();
    assert_eq!(diverged, [false, false, true], "{r1:#}");
    for r in rows {
        assert_eq!(r["reference_shape"], serde_json::json!([16, 32]), "{r}");
        assert_eq!(r["port_shape"], r["reference_shape"], "{r}");
    }
    assert_eq!(r1["drill_down"], BLOCK_2);

    // Step 2: inside block 2, the norm runs first and diverges first (its
    // scale was never converted), under its reference name after renaming.
    let fd = &steps[1]["report"]["first_divergence"];
    assert_eq!(fd["port_module"], "blocks.2.norm", "{fd}");
    assert_eq!(fd["reference_module"], "layers.2.ln", "{fd}");
    assert!(fd["drift"].as_f64().unwrap() > 0.1, "{fd}");
    steps
}

#[test]
fn embedded_submit_drills_the_red_refiner_down_to_its_norm() {
    let sb = Sandbox::new();
    example(&sb);
    let out = fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    let status = sb.local_status("tinyport").expect("status after the port");
    // The other components' verdicts are what they were before tracing.
    assert_eq!(row(&status, "embed").0, "non_skip_pass");
    assert_eq!(row(&status, "transformer").0, "non_skip_pass");
    assert_eq!(row(&status, "vae").0, "blocked");
    let (st, reason, _) = row(&status, "decoder_norm");
    assert_eq!(st, "blocked");
    assert!(!reason.contains("first divergence"), "{reason}");
    // The refiner: blocked, its reason naming the leaf before the assertion;
    // the traced reruns are not runs of the component.
    let (st, reason, runs) = row(&status, "refiner");
    assert_eq!((st.as_str(), runs), ("blocked", 1), "{reason}");
    assert!(
        reason.starts_with("debug_red: first divergence: blocks.2.norm "),
        "{reason}"
    );
    assert!(reason.contains("leaf after 2 trace steps"), "{reason}");
    assert!(reason.contains("AssertionError"), "{reason}");

    let inv = show_json(&["--repo", sb.repo().to_str().unwrap()]);
    let steps = assert_drilled_to_the_norm(&inv);
    // The gathered files sit in the repository's .fvd, one folder per rerun.
    for (step, run) in steps.iter().zip(["1", "2"]) {
        let dir = sb.repo().join(".fvd/trace/tinyport/refiner").join(run);
        assert_eq!(step["files_dir"], dir.to_str().unwrap());
        for f in [
            "port_rank0.jsonl",
            "port_rank1.jsonl",
            "reference_rank0.jsonl",
        ] {
            assert!(dir.join(f).is_file(), "{} missing", dir.join(f).display());
        }
    }

    // The text view: the summary, the drill path, the final report.
    let human = fvd()
        .args(["trace", "show", "tinyport", "refiner", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(human.status.code(), Some(0), "{}", text(&human));
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.starts_with("tinyport / refiner: trace of run tinyport.refiner.1 (leaf, 2 steps)\nfirst divergence: blocks.2.norm "),
        "{human}"
    );
    let wants: [String; 4] = [
        format!(
            "  1. FASTVIDEO_TRACE_LAYERS={BLOCKS}  (reference ^layers\\.\\d+$)\n     run tinyport.refiner#trace.1: first divergence blocks.2\n"
        ),
        format!(
            "  2. FASTVIDEO_TRACE_LAYERS={BLOCK_2}  (reference ^layers\\.2(\\.|$))\n     run tinyport.refiner#trace.2: first divergence blocks.2.norm\n"
        ),
        "report of step 2:\nfirst divergence: blocks.2.norm (reference layers.2.ln)".into(),
        "[narrowed_scope]".into(),
    ];
    for want in &wants {
        assert!(human.contains(want), "missing {want:?} in:\n{human}");
    }

    // PORT_STATUS.md's evidence keeps the module within its cut.
    let ps = std::fs::read_to_string(sb.repo().join("tests/local_tests/tinyport/PORT_STATUS.md"))
        .unwrap();
    assert!(
        ps.lines().any(|l| l.starts_with("| I0")
            && l.contains("| refiner | blocker |")
            && l.contains("first divergence: blocks.2.norm")),
        "{ps}"
    );
    // The traced reruns' output is kept like any run's.
    let logs = fvd()
        .args(["logs", "tinyport", "refiner#trace", "--run", "2", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(logs.status.success(), "{}", text(&logs));
    assert!(String::from_utf8_lossy(&logs.stdout).contains("1 failed"));

    // The dashboard's component page: each step's drift plot with its rows
    // in a table beside it, the first divergence marked.
    let (_d, addr) = crate::dashboard::read_only_dashboard(sb.repo());
    let (st, page) = crate::dashboard::http(&addr, "GET", "/ports/tinyport/components/refiner", "");
    assert!(st.contains("200"), "{st}");
    assert_eq!(
        page.matches("<table class=\"drift\">").count(),
        2,
        "a table per step"
    );
    let first = page
        .split("<tr class=\"diverged first\">")
        .nth(2)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("step 2 marks its first divergence: {page}"));
    assert!(first.contains("<code>blocks.2.norm</code>"), "{first}");
    let (st, svg) = crate::dashboard::http(
        &addr,
        "GET",
        "/ports/tinyport/components/refiner/trace/2/plot.svg",
        "",
    );
    assert!(st.contains("200") && svg.starts_with("<svg"), "{st}");

    // A component that was never traced says so, exit 2.
    let none = fvd()
        .args(["trace", "show", "tinyport", "embed", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(2), "{}", text(&none));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("has no trace investigation"),
        "{}",
        text(&none)
    );
}

#[test]
fn a_remote_worker_sends_the_trace_files_over_its_stream() {
    let mut sb = Sandbox::new();
    example(&sb);
    let url = sb.serve_with(&["--allow-agent-commands"]);
    sb.worker("w1", 2);
    let out = sb.submit_remote("tinyport", &["--wait"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    let status = sb.remote_status("tinyport").expect("remote status");
    let (st, reason, _) = row(&status, "refiner");
    assert_eq!(st, "blocked");
    assert!(
        reason.starts_with("debug_red: first divergence: blocks.2.norm "),
        "{reason}"
    );

    let inv = show_json(&["--orchestrator", &url]);
    let steps = assert_drilled_to_the_norm(&inv);
    // The orchestrator wrote the files beside its own database; the worker
    // wrote them in its own workspace and removed them once sent. No copy
    // exists where a shared file system would have put them.
    let ws = sb.repo().join("ws-w1");
    for (step, run) in steps.iter().zip(["1", "2"]) {
        let dir = sb.repo().join("trace/tinyport/refiner").join(run);
        assert_eq!(step["files_dir"], dir.to_str().unwrap());
        assert!(dir.join("port_rank1.jsonl").is_file());
        assert!(dir.join("reference_rank0.jsonl").is_file());
        assert!(!dir.starts_with(&ws));
    }
    assert!(!sb.repo().join(".fvd/trace").exists());
    let jobs = ws.join("jobs");
    let left: Vec<_> = std::fs::read_dir(&jobs)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "the worker's job folders stay behind: {left:?}"
    );
}

/// The body of a red parity test that, when traced, writes `ranks` port
/// rank files and one reference file of `blocks` blocks × 8 modules each
/// (about 170 bytes a record; every port rank holds the same replicated
/// stats), with a planted divergence in block `bad`'s fourth module.
fn big_trace_body(ranks: u32, blocks: u32, bad: u32) -> String {
    format!(
        r#"d = os.environ.get('FVD_TRACE_DIR')
if d:
    rec = '{{{{"module": "blocks.{{}}.m{{}}", "tensor": "out", "step": 0, "abs_mean": {{}}, "max": {{}}, "shape": [1, 256, 1024], "rank": {{}}, "world_size": {{}}}}}}\n'
    def side(rank, world, port):
        out = []
        for b in range({blocks}):
            for m in range(8):
                a = 1.0 + (b % 97) * 0.01 + m * 0.001
                if port and b == {bad} and m == 3:
                    a *= 1.5
                out.append(rec.format(b, m, a, 3.0 * a, rank, world))
        return ''.join(out)
    with open(os.path.join(d, 'reference_rank0.jsonl'), 'w') as f:
        f.write(side(0, 1, False))
    for r in range({ranks}):
        with open(os.path.join(d, 'port_rank%d.jsonl' % r), 'w') as f:
            f.write(side(r, {ranks}, True))
assert 1 == 2, 'red on purpose'"#
    )
}

/// A port `big` of one component `c` whose traced rerun writes
/// [`big_trace_body`]'s files, traced at most `depth` times.
fn big_port(sb: &Sandbox, ranks: u32, blocks: u32, bad: u32, depth: u32) {
    sb.port(
        "big",
        &[TestComponent::new("c", &big_trace_body(ranks, blocks, bad))],
    );
    let spec = sb.repo().join("tests/local_tests/big/port.toml");
    let mut text_ = std::fs::read_to_string(&spec).unwrap();
    text_.push_str(&format!(
        "\n[component.trace]\nlayers = '^blocks\\.\\d+\\.m\\d+$'\nreference = \"reference_rank*.jsonl\"\nport = \"port_rank*.jsonl\"\ndepth = {depth}\n"
    ));
    std::fs::write(&spec, text_).unwrap();
}

#[test]
fn a_trace_over_the_message_limit_is_compared_on_the_worker() {
    // 4 MiB and more of rank files: once more than a job may send back, so
    // the step failed; the embedded worker now compares them where they
    // lie and sends the report.
    let sb = Sandbox::new();
    big_port(&sb, 2, 3000, 2500, 1);
    let out = fvd()
        .args(["submit", "--family", "big", "--wait", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let status = sb.local_status("big").unwrap();
    let (st, reason, runs) = row(&status, "c");
    assert_eq!((st.as_str(), runs), ("blocked", 1), "{reason}");
    assert!(
        reason.starts_with("debug_red: first divergence: blocks.2500.m3 abs_mean drift 0.333 "),
        "{reason}"
    );
    let inv = fvd()
        .args(["trace", "show", "big", "c", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let inv: serde_json::Value = serde_json::from_slice(&inv.stdout).unwrap();
    assert_eq!(inv["outcome"], "depth", "{inv:#}");
    let step = &inv["steps"][0];
    let t = &step["transport"];
    assert!(
        t["compared_on"].as_str().unwrap().starts_with("worker "),
        "{t}"
    );
    assert_eq!(t["files"], 3, "{t}");
    let bytes = t["files_bytes"].as_u64().unwrap();
    assert!(bytes > 3 * 1024 * 1024, "{t}");
    assert!(t["wire_bytes"].as_u64().unwrap() < 1024 * 1024, "{t}");
    // The report says the files stayed where they were written.
    let diags = step["report"]["diagnostics"].as_array().unwrap();
    assert!(
        diags.iter().any(|d| d["code"] == "files_on_worker"),
        "{diags:?}"
    );
    let kept = sb.repo().join(".fvd/trace/big/c/2");
    let left: Vec<_> = std::fs::read_dir(&kept)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn fifty_megabytes_of_rank_files_stay_on_a_fleet_worker() {
    // A separate `fvd worker` process with its own workspace: the
    // orchestrator never reads that folder, and the 8 port rank files (over
    // 50 MiB) and the reference never cross the wire; the report does.
    let mut sb = Sandbox::new();
    big_port(&sb, 8, 5600, 4000, 1);
    let url = sb.serve();
    sb.worker("w1", 1);
    let started = std::time::Instant::now();
    let out = sb.submit_remote("big", &["--wait"]);
    let wall = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let status = sb.remote_status("big").unwrap();
    let (st, reason, _) = row(&status, "c");
    assert_eq!(st, "blocked");
    assert!(
        reason.starts_with("debug_red: first divergence: blocks.4000.m3 abs_mean drift 0.333 "),
        "{reason}"
    );
    let out = fvd()
        .args([
            "trace",
            "show",
            "big",
            "c",
            "--json",
            "--orchestrator",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let inv: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let step = &inv["steps"][0];
    let t = &step["transport"];
    assert_eq!(t["compared_on"], "worker w1", "{t}");
    assert_eq!(t["files"], 9, "{t}");
    let files_bytes = t["files_bytes"].as_u64().unwrap();
    let wire = t["wire_bytes"].as_u64().unwrap();
    // The 8 port ranks are 8 of the 9 equal files: at least 50 MiB of them.
    assert!(files_bytes / 9 * 8 >= 50 * 1024 * 1024, "{t}");
    assert!(wire < 1024 * 1024, "{t}");
    let ms = step["finished_ms"].as_i64().unwrap() - step["started_ms"].as_i64().unwrap();
    eprintln!(
        "traced rerun on w1: {files_bytes} bytes in 9 rank files compared on the worker in {} ms; {wire} bytes on the wire; step {ms} ms (test, compare, result); port {:.1} s",
        t["compare_ms"],
        wall.as_secs_f64()
    );
    // Nothing of the files at the orchestrator, nothing left on the worker.
    let run = sb.repo().join("trace/big/c/2");
    let left: Vec<_> = std::fs::read_dir(&run)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    let jobs: Vec<_> = std::fs::read_dir(sb.repo().join("ws-w1/jobs"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(jobs.is_empty(), "{jobs:?}");
}
