//! The phases after component parity (issue #42, first slices): a spec's
//! `[pipeline]` and `[quality]` are read, the dry run shows the P7–P11
//! plan, and once every component passes P7 runs the pipeline's smoke test
//! then its parity test, each as a component runs (a real pytest and
//! JUnit verdict); a red smoke test stops before the parity test, and
//! what fvd does not run yet (P8–P11, the quality tests) stays pending by
//! name, never a pass.

use std::process::Output;

use crate::support::{Sandbox, TestComponent, fvd};

pub(crate) fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Declares a pipeline whose smoke test runs `smoke` and whose parity
/// test passes, its example and its quality test; the example and the
/// quality test are written by [`write_example`] and [`write_quality`].
fn declare_pipeline(sb: &Sandbox, family: &str, smoke: &str) {
    let spec = sb
        .repo()
        .join(format!("tests/local_tests/{family}/port.toml"));
    let mut text = std::fs::read_to_string(&spec).unwrap();
    text.push_str(&format!(
        "\n[pipeline]\nsmoke_test = \"tests/local_tests/{family}/test_{family}_pipeline_smoke.py\"\nparity_test = \"tests/local_tests/{family}/test_{family}_pipeline_parity.py\"\ncomparison_target = \"the official pipeline, seed 0\"\nexample = [\"python\", \"examples/{family}.py\"]\n\n[quality]\ntests = [\"tests/ssim/test_{family}_similarity.py\"]\n"
    ));
    std::fs::write(&spec, text).unwrap();
    for (kind, body) in [("smoke", smoke), ("parity", "assert True")] {
        std::fs::write(
            sb.repo().join(format!(
                "tests/local_tests/{family}/test_{family}_pipeline_{kind}.py"
            )),
            format!("def test_pipeline_{kind}():\n    {body}\n"),
        )
        .unwrap();
    }
}

/// The example: a program that exits with `code` (after writing its
/// output), and refuses arguments it does not know (so a `--junitxml`
/// fvd added would fail it).
fn write_example(sb: &Sandbox, family: &str, code: i32) {
    std::fs::create_dir_all(sb.repo().join("examples")).unwrap();
    std::fs::write(
        sb.repo().join(format!("examples/{family}.py")),
        // like a real example, it refuses arguments it does not know
        format!(
            "import argparse, sys\nargparse.ArgumentParser().parse_args()\nprint('wrote outputs/{family}.mp4')\nsys.exit({code})\n"
        ),
    )
    .unwrap();
}

/// The quality test: `body` is its test function's body.
pub(crate) fn write_quality(sb: &Sandbox, family: &str, body: &str) {
    std::fs::create_dir_all(sb.repo().join("tests/ssim")).unwrap();
    std::fs::write(
        sb.repo()
            .join(format!("tests/ssim/test_{family}_similarity.py")),
        format!("import os, pytest\n\n\ndef test_similarity():\n    {body}\n"),
    )
    .unwrap();
}

pub(crate) fn answer(sb: &Sandbox, family: &str, id: &str, option: &str) -> Output {
    fvd()
        .args(["answer", family, id, "--option", option, "--repo"])
        .arg(sb.repo())
        .env_remove("FVD_LOG")
        .output()
        .unwrap()
}

pub(crate) fn gate_outcomes(json: &serde_json::Value) -> Vec<String> {
    json["gate"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            format!(
                "{} {}",
                g["phase"].as_str().unwrap(),
                g["outcome"].as_str().unwrap()
            )
        })
        .collect()
}

/// Where `what` first stands among the gate's `outcomes` (of
/// [`gate_outcomes`]); a missing one fails the test, naming them all.
pub(crate) fn first_outcome(outcomes: &[String], what: &str) -> usize {
    outcomes
        .iter()
        .position(|o| o == what)
        .unwrap_or_else(|| panic!("no {what} in {outcomes:?}"))
}

pub(crate) fn submit(sb: &Sandbox, family: &str) -> Output {
    fvd()
        .args(["submit", "--family", family, "--wait", "--repo"])
        .arg(sb.repo())
        .env_remove("FVD_LOG")
        .output()
        .unwrap()
}

pub(crate) fn status(sb: &Sandbox, family: &str) -> serde_json::Value {
    let out = fvd()
        .args(["status", family, "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

pub(crate) fn component<'a>(json: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    json["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no component {name} in {json}"))
}

#[test]
fn the_port_runs_p7_then_p9_in_order_then_p10_and_waits_for_the_review() {
    let sb = Sandbox::new();
    sb.port("piped", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "piped", "assert True");
    let dry = fvd()
        .args(["submit", "--family", "piped", "--dry-run", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let text = out(&dry);
    assert_eq!(dry.status.code(), Some(0), "{text}");
    // the whole plan, P0 to P11, in order
    let at = |p: &str| {
        text.find(&format!("gate {p}: "))
            .unwrap_or_else(|| panic!("no gate {p} in:\n{text}"))
    };
    let phases: Vec<usize> = (0..=11).map(|i| at(&format!("P{i}"))).collect();
    assert!(phases.is_sorted(), "{text}");
    assert!(
        text.contains("gate P6: runs the parity tests of "),
        "{text}"
    );
    for want in [
        "gate P7: runs pipeline_smoke (tests/local_tests/piped/test_piped_pipeline_smoke.py), then pipeline_parity (tests/local_tests/piped/test_piped_pipeline_parity.py)",
        "gate P8: pending: pipeline config, presets and registry are a person's to accept",
        "gate P9: at the commit P7 passes at, in order: no conversion (needs_conversion: no); solo (a pass of another commit runs again); pipeline_smoke, pipeline_parity (P7's runs); the example `python examples/piped.py` (its exit status)",
        "gate P10: runs quality_piped_similarity (tests/ssim/test_piped_similarity.py)",
        "gate P11: pending: post-parity review and handoff need a person",
        "note: tests/ssim/test_piped_similarity.py is not in the checkout",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    write_example(&sb, "piped", 0);
    write_quality(&sb, "piped", "assert True");

    let run = submit(&sb, "piped");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "gate P7 passed: pipeline_smoke non_skip_pass, pipeline_parity non_skip_pass"
        ),
        "{text}"
    );
    assert!(
        text.contains("gate P9 passed: at the checkout (not in git), in order: needs_conversion no; solo, pipeline_smoke, pipeline_parity non_skip_pass; the example `python examples/piped.py` exited 0"),
        "{text}"
    );
    assert!(
        text.contains("gate P10 passed: quality_piped_similarity non_skip_pass"),
        "{text}"
    );
    let json = status(&sb, "piped");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    let outcomes = gate_outcomes(&json);
    let order: Vec<usize> = [
        "P6 passed",
        "P7 passed",
        "P8 pending",
        "P9 passed",
        "P10 passed",
        "P11 pending",
    ]
    .iter()
    .map(|w| {
        outcomes
            .iter()
            .position(|o| o == w)
            .unwrap_or_else(|| panic!("no {w} in {outcomes:?}"))
    })
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{outcomes:?}");
    for step in [
        "pipeline_smoke",
        "pipeline_parity",
        "pipeline_example",
        "quality_piped_similarity",
    ] {
        let c = component(&json, step);
        assert_eq!(
            (&c["status"], &c["runs"]),
            (&"non_skip_pass".into(), &1.into()),
            "{c}"
        );
    }
    // each phase ran after the one before it ended
    let ended = |name: &str| component(&json, name)["run_finished_ms"].as_i64().unwrap();
    let started = |name: &str| component(&json, name)["run_started_ms"].as_i64().unwrap();
    assert!(started("pipeline_smoke") >= ended("solo"), "{json}");
    assert!(
        started("pipeline_example") >= ended("pipeline_parity"),
        "{json}"
    );
    assert!(
        started("quality_piped_similarity") >= ended("pipeline_example"),
        "{json}"
    );
    // resubmitted: the verdicts hold, nothing runs again
    let again = submit(&sb, "piped");
    assert_eq!(again.status.code(), Some(0), "{}", out(&again));
    let json = status(&sb, "piped");
    assert_eq!(
        component(&json, "quality_piped_similarity")["runs"],
        1,
        "{json}"
    );
    assert_eq!(json["phase"], "P11", "{json}");
}

/// P9's example is its last step, judged by its exit status: a failing
/// example stops P9 as the pipeline's own, and P10 does not run.
#[test]
fn a_failing_example_stops_p9_before_the_quality_tests() {
    let sb = Sandbox::new();
    sb.port("example", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "example", "assert True");
    write_example(&sb, "example", 3);
    write_quality(&sb, "example", "assert True");
    let run = submit(&sb, "example");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(
        text.contains("the example `python examples/example.py` is blocked (debug_red"),
        "{text}"
    );
    assert!(
        text.contains("exited 3: wrote outputs/example.mp4"),
        "{text}"
    );
    let json = status(&sb, "example");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P9".into(), &"blocked".into()),
        "{json}"
    );
    let quality = component(&json, "quality_example_similarity");
    assert_eq!(
        (&quality["status"], &quality["runs"]),
        (&"pending".into(), &0.into()),
        "{quality}"
    );
}

/// A quality test that skips for want of its references is an escape
/// hatch, never a pass: answered "seeded" it runs again (and asks again
/// if it still skips), answered "defer" P10 stays pending under that
/// answer and the port waits for the review.
#[test]
fn a_missing_quality_reference_is_an_escape_hatch_never_a_pass() {
    let sb = Sandbox::new();
    sb.port("seeded", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "seeded", "assert True");
    write_example(&sb, "seeded", 0);
    write_quality(
        &sb,
        "seeded",
        "if not os.path.exists('reference.mp4'):\n        pytest.skip('reference video missing: seed it')",
    );
    let run = submit(&sb, "seeded");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(3), "{text}");
    assert!(text.contains("E001"), "{text}");
    assert!(text.contains("reference outputs are not seeded"), "{text}");
    let json = status(&sb, "seeded");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P10".into(), &"ask_user".into()),
        "{json}"
    );
    let status_md =
        std::fs::read_to_string(sb.repo().join("tests/local_tests/seeded/PORT_STATUS.md")).unwrap();
    assert!(status_md.contains("E001"), "{status_md}");

    // "seeded" without seeding: it runs again, skips again, asks again
    let second = answer(&sb, "seeded", "E001", "1");
    let text = out(&second);
    assert_eq!(second.status.code(), Some(3), "{text}");
    assert!(text.contains("E002"), "{text}");
    assert_eq!(
        component(&status(&sb, "seeded"), "quality_seeded_similarity")["runs"],
        2
    );

    // seeded for real: it passes
    std::fs::write(sb.repo().join("reference.mp4"), "frames").unwrap();
    let third = answer(&sb, "seeded", "E002", "1");
    let text = out(&third);
    assert_eq!(third.status.code(), Some(0), "{text}");
    let json = status(&sb, "seeded");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    assert!(
        gate_outcomes(&json).contains(&"P10 passed".to_string()),
        "{json}"
    );

    // another port defers instead: P10 pending under the answer, no pass
    sb.port("deferred", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "deferred", "assert True");
    write_example(&sb, "deferred", 0);
    write_quality(&sb, "deferred", "pytest.skip('reference video missing')");
    let run = submit(&sb, "deferred");
    assert_eq!(run.status.code(), Some(3), "{}", out(&run));
    // escape ids are the port's own
    let id = "E001";
    assert!(out(&run).contains(id), "{}", out(&run));
    let deferred = answer(&sb, "deferred", id, "2");
    let text = out(&deferred);
    // the quality test stays what it was, a skip: not a pass, exit 1
    assert_eq!(deferred.status.code(), Some(1), "{text}");
    assert!(
        text.contains("quality_deferred_similarity blocked"),
        "{text}"
    );
    let json = status(&sb, "deferred");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    let p10 = json["gate"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|g| g["phase"] == "P10")
        .unwrap();
    assert_eq!(p10["outcome"], "pending", "{json}");
    assert!(
        p10["conditions"][0]
            .as_str()
            .unwrap()
            .contains("reference video missing); quality regression deferred by "),
        "{p10}"
    );
    assert!(
        p10["conditions"][0]
            .as_str()
            .unwrap()
            .ends_with(&format!(" in answer to {id}")),
        "{p10}"
    );
    assert!(
        !gate_outcomes(&json).contains(&"P10 passed".to_string()),
        "{json}"
    );
}

#[test]
fn a_red_pipeline_smoke_test_stops_before_the_parity_test() {
    let sb = Sandbox::new();
    sb.port("smoky", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "smoky", "assert 1 == 2, 'the pipeline made noise'");
    let run = submit(&sb, "smoky");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(text.contains("gate refused P7:"), "{text}");
    assert!(
        text.contains("pipeline_smoke (tests/local_tests/smoky/test_smoky_pipeline_smoke.py) is blocked (debug_red"),
        "{text}"
    );
    let json = status(&sb, "smoky");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P7".into(), &"blocked".into()),
        "{json}"
    );
    let parity = component(&json, "pipeline_parity");
    assert_eq!(
        (&parity["status"], &parity["runs"]),
        (&"pending".into(), &0.into()),
        "{parity}"
    );
}

/// A pipeline parity test that is red, and when traced writes both sides'
/// activation stats: the port's drift from `blocks.1.norm` on, in the
/// order modules run.
const TRACED_PIPELINE: &str = r#"import json
import os

MODULES = ["embed", "blocks.0", "blocks.1.norm", "blocks.1", "head"]


def write(path, drift):
    with open(path, "w") as f:
        for i, m in enumerate(MODULES):
            v = 1.0 + i + (0.5 if drift and i >= 2 else 0.0)
            f.write(json.dumps({"module": m, "tensor": "out", "step": None,
                                "abs_mean": v, "sum": v * 8, "shape": [2, 4], "dtype": "float32"}) + "\n")


def test_pipeline_parity():
    if os.environ.get("FASTVIDEO_TRACE_ACTIVATIONS") == "1":
        write(os.path.join(os.environ["FVD_TRACE_DIR"], "reference_rank0.jsonl"), False)
        write(os.environ["FASTVIDEO_TRACE_OUTPUT"].replace("<rank>", "0"), True)
    assert False, "the pipeline's video differs from the official one"
"#;

/// Every component passes its own test, the pipeline parity test is red:
/// P7 drills it down, maps its first divergent module to the component
/// that declares it (`modules`), and sends the port back to P6 for that
/// component; a divergence in no component's modules stays the
/// pipeline's.
#[test]
fn a_red_pipeline_is_traced_back_to_the_component_that_owns_its_first_divergence() {
    let sb = Sandbox::new();
    sb.port(
        "routed",
        &[
            TestComponent::new("stem", "assert True"),
            TestComponent::new("body", "assert True"),
        ],
    );
    let spec = sb.repo().join("tests/local_tests/routed/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    // `body` owns the blocks, `stem` the embedding
    let text = text.replacen(
        "name = \"stem\"\n",
        "name = \"stem\"\nmodules = [\"embed\"]\n",
        1,
    );
    let text = text.replacen(
        "name = \"body\"\n",
        "name = \"body\"\nmodules = [\"blocks\"]\n",
        1,
    );
    assert!(text.contains("modules = [\"blocks\"]"), "{text}");
    let pipeline = "\n[pipeline]\nparity_test = \"tests/local_tests/routed/test_routed_pipeline_parity.py\"\n\n[pipeline.trace]\nlayers = '.*'\nreference = \"reference_rank*.jsonl\"\nport = \"port_rank*.jsonl\"\noutput = \"{dir}/port_rank<rank>.jsonl\"\nstats = \"abs_mean,sum\"\ndepth = 1\n";
    std::fs::write(&spec, format!("{text}{pipeline}")).unwrap();
    std::fs::write(
        sb.repo()
            .join("tests/local_tests/routed/test_routed_pipeline_parity.py"),
        TRACED_PIPELINE,
    )
    .unwrap();

    let run = submit(&sb, "routed");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(
        text.contains("its first divergence, blocks.1.norm, is in component body's modules: back to P6 for body"),
        "{text}"
    );
    let json = status(&sb, "routed");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P6".into(), &"blocked".into()),
        "{json}"
    );
    let gate = json["gate"].as_array().unwrap();
    let reopened = gate
        .iter()
        .rev()
        .find(|g| g["phase"] == "P6" && g["outcome"] == "reopened")
        .unwrap_or_else(|| panic!("P6 not reopened: {json}"));
    assert!(
        reopened["conditions"][0].as_str().unwrap().starts_with(
            "component body: the pipeline parity test diverges first at blocks.1.norm"
        ),
        "{reopened}"
    );
    // the components' own verdicts do not move
    for c in ["stem", "body"] {
        assert_eq!(component(&json, c)["status"], "non_skip_pass", "{json}");
    }

    // resubmitted unchanged: the same decision, said again
    let again = submit(&sb, "routed");
    let text = out(&again);
    assert_eq!(again.status.code(), Some(1), "{text}");
    assert!(text.contains("back to P6 for body"), "{text}");

    // with no component owning the blocks, the divergence is the pipeline's
    let spec_text = std::fs::read_to_string(&spec)
        .unwrap()
        .replace("modules = [\"blocks\"]\n", "");
    std::fs::write(&spec, spec_text).unwrap();
    let third = submit(&sb, "routed");
    let text = out(&third);
    assert_eq!(third.status.code(), Some(1), "{text}");
    assert!(
        text.contains("its first divergence, blocks.1.norm, is in no component's modules"),
        "{text}"
    );
    assert_eq!(status(&sb, "routed")["phase"], "P7");
}

/// A pipeline parity test that sees a weight-mapping bug no component's
/// own test sees: the norm scale of block 1 is mapped from the wrong key
/// (`fastvideo/mapping.py`), so the port drifts from `blocks.1.norm` on.
const MAPPED_PIPELINE: &str = r#"import json
import os

MODULES = ["embed", "blocks.0", "blocks.1.norm", "blocks.1", "head"]


def write(path, drift):
    with open(path, "w") as f:
        for i, m in enumerate(MODULES):
            v = 1.0 + i + (0.5 if drift and i >= 2 else 0.0)
            f.write(json.dumps({"module": m, "tensor": "out", "step": None,
                                "abs_mean": v, "sum": v * 8, "shape": [2, 4], "dtype": "float32"}) + "\n")


def test_pipeline_parity():
    with open("fastvideo/mapping.py") as f:
        drift = "blocks.1.ln" in f.read()
    if os.environ.get("FASTVIDEO_TRACE_ACTIVATIONS") == "1":
        write(os.path.join(os.environ["FVD_TRACE_DIR"], "reference_rank0.jsonl"), False)
        write(os.environ["FASTVIDEO_TRACE_OUTPUT"].replace("<rank>", "0"), drift)
    assert not drift, "the pipeline's video differs from the official one"
"#;

/// `body`'s recorded agent: its one attempt fixes the mapping, and it
/// refuses to run unless its packet carries the pipeline's evidence.
fn record_body_agent(sb: &Sandbox) {
    let tools = sb.repo().join("tools");
    std::fs::create_dir_all(tools.join("replay/body")).unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/tinyport/tools/replay_agent.py"),
        tools.join("replay_agent.py"),
    )
    .unwrap();
    let patch = "diff --git a/fastvideo/mapping.py b/fastvideo/mapping.py\n--- a/fastvideo/mapping.py\n+++ b/fastvideo/mapping.py\n@@ -1 +1 @@\n-NORM_1 = \"blocks.1.ln\"\n+NORM_1 = \"blocks.1.norm.weight\"\n";
    std::fs::write(tools.join("replay/body/0001.patch"), patch).unwrap();
    std::fs::write(
        tools.join("replay/body/0001.expect"),
        "pipeline parity test\nblocks.1.norm\n",
    )
    .unwrap();
    let handoff = "component: body\nmode: parity-debug\nfiles_changed: fastvideo/mapping.py\nofficial_files_used: official/body.py\nprototype_key_dumps: none\nport_state_file: tests/local_tests/mapped/PORT_STATUS.md\nconcerns_or_unknowns: none: block 1's norm scale was mapped from the wrong key\nparity_test: tests/local_tests/generic/test_mapped_body_parity.py\nparity_status: non_skip_pass\nproduction_loader_strictness: stateless\nstrict_load: not_run\npytest_output: 1 passed\nblocker: none\nconversion_retry_request: none\nreadme_updated: no\nnext_step: phase_6_continue\nescape_hatch: none\n";
    std::fs::write(tools.join("replay/body/0001.handoff"), handoff).unwrap();
    std::fs::create_dir_all(sb.repo().join("fastvideo")).unwrap();
    std::fs::write(
        sb.repo().join("fastvideo/mapping.py"),
        "NORM_1 = \"blocks.1.ln\"\n",
    )
    .unwrap();
}

/// The issue's drill: every component passes its own test, the pipeline
/// is red from a weight-mapping bug in `body`; P7 traces it to `body`'s
/// modules, the port goes back to P6, `body`'s agent gets the pipeline's
/// evidence and fixes it, and P7 passes at the fix's commit.
#[test]
fn a_component_the_pipeline_sends_back_is_fixed_by_its_agent_and_p7_passes_at_the_fix() {
    let sb = Sandbox::new();
    sb.port(
        "mapped",
        &[
            TestComponent::new("stem", "assert True"),
            TestComponent::new("body", "assert True"),
        ],
    );
    let spec = sb.repo().join("tests/local_tests/mapped/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    let text = text.replacen(
        "name = \"stem\"\n",
        "name = \"stem\"\nmodules = [\"embed\"]\n",
        1,
    );
    let text = text.replacen(
        "name = \"body\"\n",
        "name = \"body\"\nmodules = [\"blocks\"]\nagent = true\n",
        1,
    );
    assert!(text.contains("agent = true"), "{text}");
    let pipeline = "\n[pipeline]\nparity_test = \"tests/local_tests/mapped/test_mapped_pipeline_parity.py\"\nexample = [\"python\", \"examples/mapped.py\"]\n\n[quality]\ntests = [\"tests/ssim/test_mapped_similarity.py\"]\n\n[pipeline.trace]\nlayers = '.*'\nreference = \"reference_rank*.jsonl\"\nport = \"port_rank*.jsonl\"\noutput = \"{dir}/port_rank<rank>.jsonl\"\nstats = \"abs_mean,sum\"\ndepth = 1\n\n[agent]\ncommand = [\"python3\", \"-B\", \"tools/replay_agent.py\", \"--patches\", \"tools/replay/{component}\", \"--attempt\", \"{attempt}\", \"--prompt\", \"{prompt_file}\", \"--handoff\", \"{handoff_file}\", \"--worktree\", \"{worktree}\"]\ntimeout_s = 60\nmax_attempts = 2\n";
    std::fs::write(&spec, format!("{text}{pipeline}")).unwrap();
    std::fs::write(
        sb.repo()
            .join("tests/local_tests/mapped/test_mapped_pipeline_parity.py"),
        MAPPED_PIPELINE,
    )
    .unwrap();
    record_body_agent(&sb);
    // the example imports the port's code: it must be the fix's commit
    std::fs::create_dir_all(sb.repo().join("examples")).unwrap();
    std::fs::write(
        sb.repo().join("examples/mapped.py"),
        "from fastvideo import mapping\nassert mapping.NORM_1 == 'blocks.1.norm.weight', mapping.NORM_1\nprint('wrote outputs/mapped.mp4')\n",
    )
    .unwrap();
    write_quality(&sb, "mapped", "assert True");
    let git = crate::agent::git;
    git(sb.repo(), &["init", "-q", "-b", "main"]);
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "base"]);
    let base = git(sb.repo(), &["rev-parse", "HEAD"]);

    let run = submit(&sb, "mapped");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(
        text.contains("its first divergence, blocks.1.norm, is in component body's modules: back to P6 for body; its agent gets the pipeline's evidence"),
        "{text}"
    );
    let json = status(&sb, "mapped");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    // P9 ran `stem` again at the fix's commit (its pass was of the port's)
    // and kept `body`'s (of that commit already)
    assert_eq!(component(&json, "stem")["runs"], 2, "{json}");
    assert!(text.contains("gate P9 passed: at "), "{text}");
    assert!(
        text.contains("gate P10 passed: quality_mapped_similarity non_skip_pass"),
        "{text}"
    );
    let gate = json["gate"].as_array().unwrap();
    let outcomes: Vec<String> = gate
        .iter()
        .map(|g| {
            format!(
                "{} {}",
                g["phase"].as_str().unwrap(),
                g["outcome"].as_str().unwrap()
            )
        })
        .collect();
    let at = |what: &str| first_outcome(&outcomes, what);
    // P7 refused, P6 reopened and passed again, then P7 passed
    let refused = at("P7 refused");
    let reopened = at("P6 reopened");
    let passed = outcomes.iter().rposition(|o| o == "P7 passed").unwrap();
    assert!(refused < reopened && reopened < passed, "{outcomes:?}");
    assert!(
        outcomes[reopened..passed].iter().any(|o| o == "P6 passed"),
        "{outcomes:?}"
    );
    // one attempt, whose packet carried the pipeline's evidence (the replay
    // agent refuses without it)
    let ledger = fvd()
        .args(["attempts", "mapped", "body", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let ledger: serde_json::Value =
        serde_json::from_slice(&ledger.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&ledger)));
    let attempts = ledger["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{ledger}");
    // the pipeline's pass is of the fix's commit, not of the port's
    let pipeline = component(&json, "pipeline_parity");
    assert_eq!(pipeline["status"], "non_skip_pass", "{pipeline}");
    let logs = fvd()
        .args(["logs", "mapped", "pipeline_parity", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let first = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let logs: serde_json::Value =
        serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first}"));
    let commit = logs["run"]["commit"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!commit.is_empty() && commit != base, "{logs}");
    let fixed = git(
        sb.repo(),
        &["show", &format!("{commit}:fastvideo/mapping.py")],
    );
    assert!(fixed.contains("blocks.1.norm.weight"), "{fixed}");
    // the status file holds the steps and still reads as the contract's
    let status_md = sb.repo().join("tests/local_tests/mapped/PORT_STATUS.md");
    let check = fvd()
        .args(["contracts", "check"])
        .arg(&status_md)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", out(&check));
    let written = std::fs::read_to_string(&status_md).unwrap();
    assert!(written.contains("pipeline_parity"), "{written}");
    // the porter's checkout is untouched: the fix waits on fvd's branch
    let mapping = std::fs::read_to_string(sb.repo().join("fastvideo/mapping.py")).unwrap();
    assert!(mapping.contains("blocks.1.ln"), "{mapping}");

    // resubmitted at the same commit: every verdict holds, nothing runs
    let runs = |json: &serde_json::Value| -> Vec<(String, u64)> {
        json["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["runs"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let before = runs(&status(&sb, "mapped"));
    let again = submit(&sb, "mapped");
    assert_eq!(again.status.code(), Some(0), "{}", out(&again));
    let json = status(&sb, "mapped");
    assert_eq!(runs(&json), before, "{json}");
    assert_eq!(json["phase"], "P11", "{json}");
}

/// P9 starts with the conversion, which fvd does not run: a port that needs
/// one waits there for a person once P7 passes, its example not run; a
/// wait is no finding (exit 0), as at P8 or P11.
#[test]
fn a_port_that_needs_a_conversion_waits_at_p9_before_its_example() {
    let sb = Sandbox::new();
    sb.port("converts", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "converts", "assert True");
    write_example(&sb, "converts", 0);
    write_quality(&sb, "converts", "assert True");
    let spec = sb.repo().join("tests/local_tests/converts/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("needs_conversion = \"no\""), "{text}");
    std::fs::write(
        &spec,
        text.replace("needs_conversion = \"no\"", "needs_conversion = \"yes\""),
    )
    .unwrap();
    let run = submit(&sb, "converts");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(
        text.contains("gate P9 pending: needs_conversion: yes; P9 starts with the conversion, which fvd does not run"),
        "{text}"
    );
    let json = status(&sb, "converts");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P9".into(), &"waiting".into()),
        "{json}"
    );
    let example = component(&json, "pipeline_example");
    assert_eq!(
        (&example["status"], &example["runs"]),
        (&"pending".into(), &0.into()),
        "{example}"
    );
}

/// On a fleet, the port whose quality test asked a person ends for now
/// (its gate stops); the answer over gRPC resumes it from the store and
/// acts on it once.
#[test]
fn a_fleet_orchestrator_resumes_p10_on_the_answer() {
    let mut sb = Sandbox::new();
    sb.port("fleetq", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "fleetq", "assert True");
    write_example(&sb, "fleetq", 0);
    write_quality(
        &sb,
        "fleetq",
        "if not os.path.exists('reference.mp4'):\n        pytest.skip('reference video missing: seed it')",
    );
    let url = sb.serve();
    sb.worker("w1", 2);
    let run = sb.submit_remote("fleetq", &["--wait"]);
    assert_eq!(run.status.code(), Some(3), "{}\n{}", out(&run), sb.logs());
    let json = sb.remote_status("fleetq").unwrap();
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P10".into(), &"ask_user".into()),
        "{json}"
    );
    std::fs::write(sb.repo().join("reference.mp4"), "frames").unwrap();
    let answered = fvd()
        .args([
            "answer",
            "fleetq",
            "E001",
            "--option",
            "1",
            "--wait",
            "--orchestrator",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(
        answered.status.code(),
        Some(0),
        "{}\n{}",
        out(&answered),
        sb.logs()
    );
    let json = sb.remote_status("fleetq").unwrap();
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    assert_eq!(json["escapes"][0]["status"], "resolved", "{json}");
    assert_eq!(
        component(&json, "quality_fleetq_similarity")["runs"],
        2,
        "{json}"
    );
}
