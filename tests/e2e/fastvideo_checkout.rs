//! fvd dropped into a FastVideo-shaped checkout (issue #11): the project's
//! own port folders (`tests/fixtures/fastvideo`: a finished port with a
//! hand-written record, a loosely kept one, a free-form one, one without a
//! status file) are laid out as a git repository; for every family
//! `fvd init` writes the spec and `fvd submit` runs it
//!
//! - on a machine without torch: nothing hangs, the one environment cause
//!   is named once, no agent is asked, and no `PORT_STATUS.md` changes;
//! - with stand-in tests (no torch) that pass and fail: only the cells fvd
//!   owns change, the porter's evidence stays, a regression is recorded as
//!   one, a created file passes `fvd contracts check`, and a second run
//!   changes nothing.
//!
//! The same walk over FastVideo's real folders is in the conformance suite.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fvd_contracts::status_guard::owned_changes;

use crate::checks::fastvideo::{
    WithoutTorch, checkout, git, init_and_decide, run, spec_path, status_path,
    submits_without_torch_keep_the_record, text,
};
use crate::support::fvd;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fastvideo")
}

#[test]
fn every_family_inits_and_submits_without_torch_and_keeps_the_porters_record() {
    let repo_dir = checkout(&fixtures());
    let repo = repo_dir.path();
    submits_without_torch_keep_the_record(
        repo,
        // the free-form record names a transformer test of FastVideo's own
        // tree
        &["fastvideo/tests/transformers/test_pixelflow.py"],
        &[
            ("orbitcam", WithoutTorch::WaitsForTorch),
            // no parity test exists yet: its placeholders stay
            ("tidewave", WithoutTorch::RefusedAtP0),
            ("pixelflow", WithoutTorch::WaitsForTorch),
            ("sonata", WithoutTorch::WaitsForTorch),
        ],
    );
}

/// Replaces every test file of `family` that `spec` runs with a stand-in
/// (no torch) from `pick`, by component name.
fn stand_ins(repo: &Path, family: &str, pick: impl Fn(&str) -> &'static str) {
    let path = spec_path(repo, family);
    let spec = fvd_spec::load(&path).expect("the decided spec parses");
    for c in &spec.components {
        for t in &c.parity_tests {
            let file = repo.join(t);
            if file.exists() {
                std::fs::write(&file, pick(&c.name)).unwrap();
            }
        }
    }
    // Stand-ins run on a CPU slot.
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("gpus = 1\n", "gpus = 0\n");
    std::fs::write(path, text).unwrap();
}

const PASSES: &str = "def test_parity():\n    assert abs(0.1 + 0.2 - 0.3) < 1e-9\n";
const RED: &str =
    "def test_parity():\n    diff_max = 0.35\n    assert diff_max < 1e-3, f'diff_max={diff_max}'\n";

#[test]
fn stand_in_tests_update_only_what_fvd_owns_and_a_second_run_changes_nothing() {
    let repo_dir = checkout(&fixtures());
    let repo = repo_dir.path();
    for family in ["orbitcam", "sonata"] {
        init_and_decide(repo, family);
    }
    // The finished port: the transformer regressed, the rest still passes.
    stand_ins(repo, "orbitcam", |name| match name {
        "transformer" => RED,
        _ => PASSES,
    });
    // The port without a status file: one passes, one is red.
    stand_ins(repo, "sonata", |name| match name {
        "vae" => RED,
        _ => PASSES,
    });
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "stand-in tests"]);
    let before = std::fs::read_to_string(status_path(repo, "orbitcam")).unwrap();
    assert!(!status_path(repo, "sonata").exists());

    let submit = |family: &str, extra: &[&str]| {
        run(
            fvd()
                .args([
                    "submit", "--family", family, "--wait", "--gpus", "none", "--repo",
                ])
                .arg(repo)
                .args(extra),
            Duration::from_secs(120),
        )
    };
    for family in ["orbitcam", "sonata"] {
        let out = submit(family, &[]);
        assert_eq!(out.status.code(), Some(1), "{family}: {}", text(&out));
    }

    // Only owned cells changed; every human line is there.
    let after = std::fs::read_to_string(status_path(repo, "orbitcam")).unwrap();
    let changes = owned_changes(&before, &after).unwrap_or_else(|e| panic!("{e}\n{after}"));
    assert!(!changes.is_empty());
    // beside the porter's pass, never over it
    assert!(
        after.contains("| forward_parity_pass [fvd ")
            && after.contains("debug_red (regression)] |"),
        "{after}"
    );
    // The regression is one issue, the phase moved back with the reason,
    // and the passes kept the porter's own Parity cells.
    assert!(
        after.matches("regression").count() >= 2,
        "regression in the matrix and the issues: {after}"
    );
    assert!(after.contains("phase_6_component_parity_debug"), "{after}");
    for kept in ["hidden_state_parity_pass", "encode_decode_parity_pass"] {
        assert!(after.contains(kept), "{kept} kept: {after}");
    }
    // Evidence beside the human's, never instead of it.
    for line in before.lines().filter(|l| l.contains("2026-08-04")) {
        let note = line.rsplit('|').nth(1).unwrap().trim();
        assert!(after.contains(note), "human note kept: {note}");
    }
    assert!(after.contains("[fvd "), "fvd's evidence is there: {after}");

    // The created record passes the contract check.
    let created = status_path(repo, "sonata");
    let check = run(
        fvd().args(["contracts", "check"]).arg(&created),
        Duration::from_secs(30),
    );
    assert!(
        check.status.success(),
        "{}\n{}",
        text(&check),
        std::fs::read_to_string(&created).unwrap()
    );

    // A second identical run changes nothing, byte for byte.
    let sonata = std::fs::read_to_string(&created).unwrap();
    for family in ["orbitcam", "sonata"] {
        let out = submit(family, &["--rerun"]);
        assert_eq!(out.status.code(), Some(1), "{family}: {}", text(&out));
    }
    assert_eq!(
        std::fs::read_to_string(status_path(repo, "orbitcam")).unwrap(),
        after
    );
    assert_eq!(std::fs::read_to_string(&created).unwrap(), sonata);
}
