//! The phases after component parity (issue #42, first slices): a spec's
//! `[pipeline]` and `[quality]` are read, the dry run shows the P7–P11
//! plan, and once every component passes P7 runs the pipeline's smoke test
//! then its parity test, each as a component runs (a real pytest and
//! JUnit verdict); a red smoke test stops before the parity test, and
//! what fvd does not run yet (P8–P11, the quality tests) stays pending by
//! name, never a pass.

use std::process::Output;

use crate::support::{Sandbox, TestComponent, fvd};

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Declares a pipeline whose smoke test runs `smoke` and whose parity
/// test passes; the quality test is declared and absent.
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

fn submit(sb: &Sandbox, family: &str) -> Output {
    fvd()
        .args(["submit", "--family", family, "--wait", "--repo"])
        .arg(sb.repo())
        .env_remove("FVD_LOG")
        .output()
        .unwrap()
}

fn status(sb: &Sandbox, family: &str) -> serde_json::Value {
    let out = fvd()
        .args(["status", family, "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

fn component<'a>(json: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    json["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no component {name} in {json}"))
}

#[test]
fn p7_runs_the_pipeline_after_the_components_and_names_what_it_does_not_run() {
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
        "gate P10: pending: quality regression tests/ssim/test_piped_similarity.py declared",
        "note: tests/ssim/test_piped_similarity.py is not in the checkout",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }

    let run = submit(&sb, "piped");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(text.contains("gate P7 entered"), "{text}");
    assert!(
        text.contains(
            "gate P7 passed: pipeline_smoke non_skip_pass, pipeline_parity non_skip_pass"
        ),
        "{text}"
    );
    let json = status(&sb, "piped");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P8".into(), &"waiting".into()),
        "{json}"
    );
    for step in ["pipeline_smoke", "pipeline_parity"] {
        let c = component(&json, step);
        assert_eq!(
            (&c["status"], &c["runs"]),
            (&"non_skip_pass".into(), &1.into()),
            "{c}"
        );
    }
    // P7 ran after P6 had passed: its steps' runs started after every
    // component's run ended
    let solo_end = component(&json, "solo")["run_finished_ms"]
        .as_i64()
        .unwrap();
    let smoke_start = component(&json, "pipeline_smoke")["run_started_ms"]
        .as_i64()
        .unwrap();
    assert!(smoke_start >= solo_end, "{json}");
    let gate = json["gate"].as_array().unwrap();
    assert!(
        gate.iter()
            .any(|g| g["phase"] == "P10" && g["outcome"] == "pending"),
        "{json}"
    );
    assert!(
        !gate.iter().any(|g| g["outcome"] == "passed"
            && ["P8", "P9", "P10", "P11"].contains(&g["phase"].as_str().unwrap())),
        "{json}"
    );
    // resubmitted: the verdicts hold, nothing runs again
    let again = submit(&sb, "piped");
    assert_eq!(again.status.code(), Some(0), "{}", out(&again));
    let json = status(&sb, "piped");
    assert_eq!(component(&json, "pipeline_parity")["runs"], 1, "{json}");
    assert_eq!(json["phase"], "P8", "{json}");
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
