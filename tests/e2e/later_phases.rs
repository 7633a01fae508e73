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
