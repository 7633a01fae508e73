//! The phases after component parity (issue #42, first slice): a spec's
//! `[pipeline]` and `[quality]` are read, the dry run shows the P7–P11
//! plan naming them, and a port whose components all pass waits at P7
//! with the gate naming the declared tests it does not run yet (never a
//! pass).

use std::process::Output;

use crate::support::{Sandbox, TestComponent, fvd};

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn declare_pipeline(sb: &Sandbox, family: &str) {
    let spec = sb
        .repo()
        .join(format!("tests/local_tests/{family}/port.toml"));
    let mut text = std::fs::read_to_string(&spec).unwrap();
    text.push_str(&format!(
        "\n[pipeline]\nsmoke_test = \"tests/local_tests/{family}/test_{family}_pipeline_smoke.py\"\nparity_test = \"tests/local_tests/{family}/test_{family}_pipeline_parity.py\"\ncomparison_target = \"the official pipeline, seed 0\"\nexample = [\"python\", \"examples/{family}.py\"]\n\n[quality]\ntests = [\"tests/ssim/test_{family}_similarity.py\"]\n"
    ));
    std::fs::write(&spec, text).unwrap();
    std::fs::write(
        sb.repo().join(format!(
            "tests/local_tests/{family}/test_{family}_pipeline_parity.py"
        )),
        "def test_pipeline():\n    assert True\n",
    )
    .unwrap();
}

#[test]
fn a_declared_pipeline_is_planned_and_named_by_the_gate_never_passed() {
    let sb = Sandbox::new();
    sb.port("piped", &[TestComponent::new("solo", "assert True")]);
    declare_pipeline(&sb, "piped");
    let dry = fvd()
        .args(["submit", "--family", "piped", "--dry-run", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let text = out(&dry);
    assert_eq!(dry.status.code(), Some(0), "{text}");
    for want in [
        "gate P7: pending: pipeline parity test tests/local_tests/piped/test_piped_pipeline_parity.py declared in the spec; fvd does not run it yet",
        "then smoke test tests/local_tests/piped/test_piped_pipeline_smoke.py, parity test tests/local_tests/piped/test_piped_pipeline_parity.py (against the official pipeline, seed 0), example `python examples/piped.py`",
        "gate P10: pending: quality regression tests/ssim/test_piped_similarity.py declared",
        "note: tests/local_tests/piped/test_piped_pipeline_smoke.py is not in the checkout",
        "note: tests/ssim/test_piped_similarity.py is not in the checkout",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(
        !text.contains("test_piped_pipeline_parity.py is not in the checkout"),
        "{text}"
    );

    let run = fvd()
        .args(["submit", "--family", "piped", "--wait", "--repo"])
        .arg(sb.repo())
        .env_remove("FVD_LOG")
        .output()
        .unwrap();
    let text = out(&run);
    assert!(
        text.contains("gate P7 pending: pipeline parity test tests/local_tests/piped/test_piped_pipeline_parity.py declared in the spec; fvd does not run it yet"),
        "{text}"
    );
    let status = fvd()
        .args(["status", "piped", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    // waiting at P7: the declared tests are not run, so nothing past P6
    // reads as passed
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P7".into(), &"waiting".into()),
        "{json}"
    );
    let gate = json["gate"].as_array().expect("gate events");
    assert!(
        !gate
            .iter()
            .any(|g| g["outcome"] == "passed" && g["phase"] == "P7"),
        "{json}"
    );
}
