//! The README's main command, on a copy (issue #42): `examples/tinyport`'s
//! `tinypipe` family goes past P7 with nothing but its own files. Both
//! components pass their own tests; the pipeline's parity test is red from
//! a weight-mapping bug in the head that the head's test cannot see; fvd
//! traces the pipeline to `head.norm`, sends the port back to P6 for
//! `head`, whose replay agent fixes the mapping; P7 passes at the fix, P9
//! verifies in order there, P10's SSIM test passes against the seeded
//! references, and the port waits at P11 for a person.

use crate::agent::git;
use crate::later_phases::{component, first_outcome, gate_outcomes, out, status, submit};
use crate::port::copy_tree;
use crate::support::{Sandbox, fvd};

const MAPPING: &str = "fastvideo/models/loader/tinyport_head_mapping.py";
const STATUS: &str = "tests/local_tests/tinypipe/PORT_STATUS.md";

/// A copy of `examples/tinyport` as its own git repository; its commit.
fn example(sb: &Sandbox) -> String {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    copy_tree(&example, sb.repo());
    git(sb.repo(), &["init", "-q", "-b", "main"]);
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "base"]);
    git(sb.repo(), &["rev-parse", "HEAD"])
}

#[test]
fn the_example_pipeline_is_traced_back_to_its_head_fixed_and_ends_at_p11() {
    let sb = Sandbox::new();
    let base = example(&sb);
    let porter_status = std::fs::read_to_string(sb.repo().join(STATUS)).unwrap();

    let run = submit(&sb, "tinypipe");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(
        text.contains("first divergence: head.norm max drift")
            && text.contains("its first divergence, head.norm, is in component head's modules: back to P6 for head"),
        "{text}"
    );
    let json = status(&sb, "tinypipe");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    // P7 refused, P6 reopened for the head and passed, then P7, P9, P10
    let outcomes = gate_outcomes(&json);
    let at = |what: &str| first_outcome(&outcomes, what);
    let (refused, reopened) = (at("P7 refused"), at("P6 reopened"));
    let p7 = outcomes.iter().rposition(|o| o == "P7 passed").unwrap();
    let (p9, p10) = (at("P9 passed"), at("P10 passed"));
    assert!(
        refused < reopened && reopened < p7 && p7 < p9 && p9 < p10,
        "{outcomes:?}"
    );
    for step in [
        "transformer",
        "head",
        "pipeline_smoke",
        "pipeline_parity",
        "pipeline_example",
        "quality_tinypipe_similarity",
    ] {
        assert_eq!(component(&json, step)["status"], "non_skip_pass", "{json}");
    }
    assert!(
        text.contains("quality_tinypipe_similarity non_skip_pass  run 1  3 passed"),
        "{text}"
    );

    // the head's one attempt fixed the mapping, on fvd's branch only
    let ledger = fvd()
        .args(["attempts", "tinypipe", "head", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let ledger: serde_json::Value =
        serde_json::from_slice(&ledger.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&ledger)));
    assert_eq!(ledger["attempts"].as_array().unwrap().len(), 1, "{ledger}");
    let fixed = git(
        sb.repo(),
        &["show", &format!("fvd/tinypipe/head:{MAPPING}")],
    );
    assert!(fixed.contains(r#"(r"^head\.ln\.weight$""#), "{fixed}");
    let checkout = std::fs::read_to_string(sb.repo().join(MAPPING)).unwrap();
    assert!(
        checkout.contains(r#"(r"^head\.norm\.weight$""#),
        "{checkout}"
    );
    assert_eq!(git(sb.repo(), &["rev-parse", "HEAD"]), base);

    // the porter's file: valid, moved on to P11 with the porter's values kept,
    // the move back and the checklist in fvd's section
    let path = sb.repo().join(STATUS);
    let check = fvd()
        .args(["contracts", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", out(&check));
    let written = std::fs::read_to_string(&path).unwrap();
    assert!(
        written.contains("- phase: `phase_11_post_parity_review_handoff`")
            && written.contains("moved forward from phase: \"`phase_6_component_parity_debug`\"")
            && written.contains("owner: \"`parity`\""),
        "{written}"
    );
    assert!(
        written.contains("diverged first at `head.norm`, in component `head`'s modules"),
        "{written}"
    );
    assert!(
        written.contains("- [x] quality regression passed (`quality_tinypipe_similarity`)"),
        "{written}"
    );
    // every line the porter wrote outside what fvd owns is still there
    for line in porter_status
        .lines()
        .filter(|l| l.starts_with("- ") && !l.starts_with("- phase:") && !l.starts_with("- owner:"))
    {
        assert!(written.contains(line), "lost {line:?}:\n{written}");
    }
}
