//! fvd co-authors a hand-written `PORT_STATUS.md` through the real binary:
//! a port in a git repository whose stand-in parity tests (no torch) pass
//! where the file records a pass, fail numerically where it records one
//! (a regression), skip where the file knows nothing, and fail to import a
//! package the machine lacks where it records a pass (an environment
//! failure, which changes nothing). `git diff` shows that no human line changed but
//! the cells fvd owns, a second `submit --rerun` changes nothing,
//! `--dry-run` prints the diff and writes nothing, and a fixed regression
//! gives the porter's phase back.

use std::path::Path;

use fvd_contracts::status_guard::owned_changes;

use crate::agent::git;
use crate::support::{Sandbox, TestComponent, fvd};

const FAMILY: &str = "gizmo";
const STATUS: &str = "tests/local_tests/gizmo/PORT_STATUS.md";

/// The porter's file, in the project's own words: phase 11 complete, rich
/// Parity cells, dated notes, a composite encoder row, a classed
/// transformer row, a final handoff block and rows after it.
const HAND_WRITTEN: &str = "# Gizmo Port Status

## Summary

- model_family: `gizmo`
- workload_types: `T2V`
- official_ref: `official.gizmo`
- official_ref_dir: `official`
- hf_weights_path: `none`
- local_weights_dir: `official_weights/gizmo`
- source_layout: `custom`
- local_tests_readme: `tests/local_tests/gizmo/README.md`

## Current Phase

- phase: `phase_11_post_parity_handoff`
- status: `complete`
- owner: `orchestrator`
- last_updated: `2026-06-01`

## Component Matrix

| Component | Type | Reuse/Port | Official Definition | Official Instantiation | FastVideo Target | Prototype | Conversion | Parity | Open Issues |
|---|---|---|---|---|---|---|---|---|---|
| Transformer (`GizmoDiT`) | dit | ported | `official/dit.py` | `official/run.py::build` | `fastvideo/models/dits/gizmo.py` | prototype_pass | key_map_pass | forward_parity_pass | none |
| vae | vae | reused | `official/vae.py` | `official/run.py::build` | `fastvideo/models/vaes/gizmo.py` | config_pass | key_map_pass | encode_parity_pass | none |
| text_encoder/tokenizer | encoder | reused | `official/t5.py` | `official/run.py::build` | `fastvideo/models/encoders/t5.py` | config_pass | staged_pass | hidden_state_parity_pass | none |
| scheduler | generic | reused | upstream scheduler | `official/run.py::build` | `fastvideo/models/schedulers/flow.py` | pass | not_required | non_skip_pass | none |

## Conversion State

- conversion_script: `none`
- converted_weights_dir: `none`
- source_layout: `custom`
- strict_load_status: `not_required`
- passthrough_components: `none`
- retry_history: `none`

## Parity Commands

| Scope | Command | Last Result | Notes |
|---|---|---|---|
| transformer | `python -m pytest tests/local_tests/generic/test_gizmo_transformer_parity.py -v -s` | forward_parity_pass | 2026-05-30: fp32 forward agrees on a small input (`max_abs=0.02`). |
| vae | `PYTHONPATH=/srv/gizmo python -m pytest tests/local_tests/generic/test_gizmo_vae_parity.py -q -rs` | encode_parity_pass | 2026-05-29: encode agrees after the latent scaling. |
| text encoder | `python -m pytest tests/local_tests/generic/test_gizmo_text_encoder_parity.py -v -s` | hidden_state_parity_pass | 2026-05-29: last hidden states agree. |
| scheduler | `python -m pytest tests/local_tests/generic/test_gizmo_scheduler_parity.py -v -s` | non_skip_pass | 2026-05-28: timesteps match upstream. |

## Open Questions

| ID | Question | Owner | Needed By Phase | Status | Resolution |
|---|---|---|---|---|---|
| Q001 | Ship the camera path in the first PR? | user | prep | resolved | Later. |

## Issues And Blockers

| ID | Phase | Component | Severity | Issue | Evidence | Owner | Status | Resolution |
|---|---|---|---|---|---|---|---|---|
| I001 | P6 | vae | medium | Encode drifted before the scaling fix. | diff 0.3 before, 0.001 after | component:vae | resolved | Scaling applied. |

## Escape Hatches

| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |
|---|---|---|---|---|---|---|

## Decisions

| Date | Decision | Rationale | Impact |
|---|---|---|---|
| 2026-05-20 | Keep the gizmo DiT in its own class. | Fewer switches in the shared one. | transformer |

## Handoff Notes

- Every component passes; hand off to review.

## Final Handoff

```text
final_handoff:
  prep_handoff_complete: yes
  conversion_status: not_required
  blockers: none
```

| 2026-06-01 | Hand off to review. | All parity holds. | none |
";

/// The failing vae test: a numeric difference where the file records a pass.
const VAE_RED: &str = "assert abs(0.5 - 0.25) < 0.01, 'encode max abs diff 0.25'";

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.port(
        FAMILY,
        &[
            TestComponent::new("transformer", "assert 1 + 1 == 2"),
            TestComponent::new("vae", VAE_RED),
            TestComponent::new("text_encoder", "assert True"),
            TestComponent::new("scheduler", "assert True"),
            TestComponent::new("camera", "pytest.skip('camera weights are not staged')"),
        ],
    );
    // the scheduler's test cannot even be imported here: a package this
    // machine lacks, so the port waits for an environment (exit 4) and the
    // scheduler's record is not touched
    std::fs::write(
        sb.repo()
            .join("tests/local_tests/generic/test_gizmo_scheduler_parity.py"),
        "import gizmo_reference_only_package\n\n\ndef test_parity():\n    pass\n",
    )
    .unwrap();
    std::fs::write(sb.repo().join(STATUS), HAND_WRITTEN).unwrap();
    std::fs::write(sb.repo().join(".gitignore"), ".fvd/\n*.log\n").unwrap();
    git(sb.repo(), &["init", "-q"]);
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-qm", "the porter's state"]);
    sb
}

fn submit(repo: &Path, extra: &[&str]) -> std::process::Output {
    fvd()
        .args(["submit", "--family", FAMILY, "--wait", "--repo"])
        .arg(repo)
        .args(extra)
        .output()
        .unwrap()
}

fn out(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn read(repo: &Path) -> String {
    std::fs::read_to_string(repo.join(STATUS)).unwrap()
}

/// Every file under `dir` with its bytes, to tell that nothing was written.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.extend(snapshot(&p));
            } else {
                v.push((
                    p.display().to_string(),
                    std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    v.sort();
    v
}

#[test]
fn fvd_co_authors_a_hand_written_status_file() {
    let sb = sandbox();
    let repo = sb.repo();

    // A dry run before anything ran: the matches, no diff, nothing written.
    let dry = submit(repo, &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", out(&dry));
    let text = out(&dry);
    for want in [
        "gate P0: passes",
        "gate P2: passes",
        "  transformer: python3 -m pytest tests/local_tests/generic/test_gizmo_transformer_parity.py",
        "      Component Matrix: line 25: Transformer (`GizmoDiT`)",
        "      Parity Commands: line 45: text encoder",
        "      Component Matrix: line 27: text_encoder/tokenizer",
        "  camera: ",
        "      Parity Commands: new row",
        "no state recorded for gizmo",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(!repo.join(".fvd").exists(), "a dry run creates no .fvd/");
    assert_eq!(read(repo), HAND_WRITTEN);

    // The port runs: vae regressed, camera skips.
    let first = submit(repo, &[]);
    assert_eq!(first.status.code(), Some(4), "{}", out(&first));
    let after = read(repo);
    if let Err(e) = owned_changes(HAND_WRITTEN, &after) {
        panic!("{e}\n{after}");
    }
    // git diff: no human line deleted; the lines replaced are only the
    // rows and fields fvd owns a cell of
    let diff = git(repo, &["diff", "--unified=0", "--", STATUS]);
    let removed: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .map(|l| &l[1..])
        .collect();
    let owned_rows = [
        "| vae | vae |",
        "| transformer | `python",
        "| vae | `PYTHONPATH",
        "| text encoder |",
        "- phase:",
        "- status:",
        "- owner:",
        "- last_updated:",
    ];
    for r in &removed {
        assert!(
            owned_rows.iter().any(|o| r.starts_with(o)),
            "a line fvd does not own changed: {r}\n{diff}"
        );
    }
    // the human text of each changed Parity Commands row is still there
    for human in [
        "2026-05-30: fp32 forward agrees on a small input (`max_abs=0.02`). [fvd ",
        "2026-05-29: encode agrees after the latent scaling. [fvd ",
        "2026-05-29: last hidden states agree. [fvd ",
    ] {
        assert!(after.contains(human), "{human}\n{after}");
    }
    // the regression: both evidences, one issue row, the phase moved back
    // fvd's result beside the porter's, never over it
    assert!(
        after.contains("| encode_parity_pass [fvd ")
            && after.contains("(cpu): debug_red (regression)] | I002 |"),
        "{after}"
    );
    assert!(after.contains("debug_red (regression) — "), "{after}");
    assert_eq!(
        after
            .lines()
            .filter(|l| l.starts_with("| I002 | P6 | vae | high |"))
            .count(),
        1,
        "{after}"
    );
    assert!(
        after.contains("- phase: `phase_6_component_parity_debug`\n- status: `blocked`\n- owner: `component:vae`\n"),
        "{after}"
    );
    assert!(
        after.contains(
            "moved back from phase: \"`phase_11_post_parity_handoff`\"; status: \"`complete`\""
        ),
        "{after}"
    );
    assert!(
        after.contains("  blockers: none\n```\nfvd "),
        "the handoff block is kept and marked after it: {after}"
    );
    // an environment failure changes nothing of the scheduler's record
    let scheduler_row = HAND_WRITTEN
        .lines()
        .find(|l| l.starts_with("| scheduler | `python"))
        .unwrap();
    assert!(after.lines().any(|l| l == scheduler_row), "{after}");
    // the recorded passes of the others stay as the porter wrote them
    for kept in [
        "| forward_parity_pass | none |",
        "| hidden_state_parity_pass | none |",
        "| non_skip_pass | none |",
    ] {
        assert!(after.contains(kept), "{kept}\n{after}");
    }
    // camera was unknown: its rows are added, with its issue
    assert!(after.contains("| `camera` | `generic` |"), "{after}");
    assert!(after.contains("| camera | `python3"), "{after}");
    assert!(
        after.contains("| I003 | P6 | camera | blocker |"),
        "{after}"
    );

    // fvd status writes nothing and does not say it wrote
    let status = fvd()
        .args(["status", FAMILY, "--repo"])
        .arg(repo)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", out(&status));
    assert!(!out(&status).contains("wrote"), "{}", out(&status));
    assert_eq!(read(repo), after);

    // A second run of the same code changes nothing.
    let again = submit(repo, &["--rerun"]);
    assert_eq!(again.status.code(), Some(4), "{}", out(&again));
    assert_eq!(read(repo), after, "a second identical run changed the file");

    // A dry run now: the recorded state writes nothing new, and the dry
    // run writes nothing at all.
    let before = snapshot(repo);
    let dry = submit(repo, &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", out(&dry));
    assert!(
        out(&dry).contains("fvd would leave it unchanged"),
        "{}",
        out(&dry)
    );
    assert_eq!(snapshot(repo), before, "the dry run wrote something");

    // The porter fixes the vae; its diff shows before the run.
    let vae = repo.join("tests/local_tests/generic/test_gizmo_vae_parity.py");
    let fixed = std::fs::read_to_string(&vae)
        .unwrap()
        .replace(VAE_RED, "assert True");
    std::fs::write(&vae, fixed).unwrap();
    let fixed_run = submit(repo, &["--rerun"]);
    assert_eq!(fixed_run.status.code(), Some(4), "{}", out(&fixed_run));
    let recovered = read(repo);
    owned_changes(&after, &recovered).unwrap();
    // the porter's phase, cells and handoff block come back; fvd's issue
    // row stays as history, resolved
    assert!(
        recovered.contains("- phase: `phase_11_post_parity_handoff`\n- status: `complete`\n- owner: `orchestrator`\n- last_updated: `2026-06-01`\n\n"),
        "{recovered}"
    );
    assert!(!recovered.contains("moved back"), "{recovered}");
    assert!(
        !recovered.contains("the final handoff above is superseded"),
        "{recovered}"
    );
    assert!(
        recovered.contains("| encode_parity_pass | none |"),
        "{recovered}"
    );
    let i002 = recovered
        .lines()
        .find(|l| l.starts_with("| I002 |"))
        .unwrap();
    assert!(i002.contains("| resolved | passed in fvd run "), "{i002}");

    // The porter deletes fvd's evidence by hand: the dry run shows the
    // diff that puts it back, and writes nothing.
    let vae_row = recovered
        .lines()
        .find(|l| l.starts_with("| vae | `PYTHONPATH"))
        .unwrap();
    let cut = &vae_row[vae_row.find(" [fvd ").unwrap()..vae_row.len() - 2];
    let edited = recovered.replace(cut, "");
    std::fs::write(repo.join(STATUS), &edited).unwrap();
    let dry = submit(repo, &["--dry-run"]);
    let text = out(&dry);
    assert!(
        text.contains("--- a/tests/local_tests/gizmo/PORT_STATUS.md"),
        "{text}"
    );
    assert!(text.contains("-| vae | `PYTHONPATH"), "{text}");
    assert!(text.contains("+| vae | `PYTHONPATH"), "{text}");
    assert_eq!(read(repo), edited, "the dry run wrote the file");
}

#[test]
fn a_gate_refusal_leaves_the_file_and_creates_none() {
    let sb = sandbox();
    let repo = sb.repo();
    let spec = repo.join("tests/local_tests/gizmo/port.toml");
    let undecided = std::fs::read_to_string(&spec).unwrap().replace(
        "needs_conversion = \"no\"",
        "needs_conversion = \"unknown\"",
    );
    std::fs::write(&spec, undecided).unwrap();
    let refused = submit(repo, &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", out(&refused));
    assert_eq!(read(repo), HAND_WRITTEN);
    assert!(git(repo, &["status", "--porcelain", "--", STATUS]).is_empty());
    // without a file, a refusal creates none
    std::fs::remove_file(repo.join(STATUS)).unwrap();
    let refused = submit(repo, &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", out(&refused));
    assert!(!repo.join(STATUS).exists());
    // and the dry run says the gate would refuse, exiting 1
    let dry = submit(repo, &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(1), "{}", out(&dry));
    assert!(out(&dry).contains("gate P0: would refuse"), "{}", out(&dry));
}

/// A porter's file at P6 with their own `pipeline` row for the pipeline
/// parity test: the port goes through P7, P9 and P10 to wait at P11.
const PIPED: &str = "# Relay Port Status

## Summary

- model_family: `relay`
- workload_types: `T2V`
- official_ref: `official.relay`
- official_ref_dir: `official`
- hf_weights_path: `none`
- local_weights_dir: `official_weights/relay`
- source_layout: `custom`
- local_tests_readme: `tests/local_tests/relay/README.md`

## Current Phase

- phase: `phase_6_component_parity_debug`
- status: `in_progress`
- owner: `component:solo`
- last_updated: `2026-06-02`

## Component Matrix

| Component | Type | Reuse/Port | Official Definition | Official Instantiation | FastVideo Target | Prototype | Conversion | Parity | Open Issues |
|---|---|---|---|---|---|---|---|---|---|
| solo | generic | ported | `official/solo.py` | `official/run.py::build` | `fastvideo/models/solo.py` | pass | not_required | pending | none |

## Conversion State

- conversion_script: `none`
- converted_weights_dir: `none`
- source_layout: `custom`
- strict_load_status: `not_required`
- passthrough_components: `none`
- retry_history: `none`

## Parity Commands

| Scope | Command | Last Result | Notes |
|---|---|---|---|
| solo | `python -m pytest tests/local_tests/generic/test_relay_solo_parity.py -v -s` | pending | 2026-05-30: scaffold in place. |
| pipeline | `python -m pytest tests/local_tests/relay/test_relay_pipeline_parity.py -v -s` | `not_run` | 2026-06-01: against the official pipeline, seed 0. |

## Open Questions

| ID | Question | Owner | Needed By Phase | Status | Resolution |
|---|---|---|---|---|---|

## Issues And Blockers

| ID | Phase | Component | Severity | Issue | Evidence | Owner | Status | Resolution |
|---|---|---|---|---|---|---|---|---|

## Escape Hatches

| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |
|---|---|---|---|---|---|---|

## Decisions

| Date | Decision | Rationale | Impact |
|---|---|---|---|
| 2026-05-20 | One class for the relay. | Simpler. | solo |

## Handoff Notes

- 2026-06-02: the pipeline tests are written.
";

/// The pipeline's steps are not components: no matrix row, the porter's
/// `pipeline` row takes the parity test's result, the other steps get
/// rows scoped `pipeline` and `quality`; Current Phase follows the gate to
/// P11 (the porter's values kept), fvd's section holds P11's checklist,
/// and the file still passes `fvd contracts check`.
#[test]
fn the_later_phases_are_written_as_steps_and_current_phase_follows_the_gate() {
    let sb = Sandbox::new();
    let repo = sb.repo();
    sb.port("relay", &[TestComponent::new("solo", "assert True")]);
    let spec = repo.join("tests/local_tests/relay/port.toml");
    let mut text = std::fs::read_to_string(&spec).unwrap();
    text.push_str("\n[pipeline]\nsmoke_test = \"tests/local_tests/relay/test_relay_pipeline_smoke.py\"\nparity_test = \"tests/local_tests/relay/test_relay_pipeline_parity.py\"\ncomparison_target = \"the official pipeline, seed 0\"\nexample = [\"python\", \"examples/relay.py\"]\n\n[quality]\ntests = [\"tests/ssim/test_relay_similarity.py\"]\n");
    std::fs::write(&spec, text).unwrap();
    for kind in ["smoke", "parity"] {
        std::fs::write(
            repo.join(format!(
                "tests/local_tests/relay/test_relay_pipeline_{kind}.py"
            )),
            format!("def test_pipeline_{kind}():\n    assert True\n"),
        )
        .unwrap();
    }
    std::fs::create_dir_all(repo.join("examples")).unwrap();
    std::fs::write(repo.join("examples/relay.py"), "print('wrote out.mp4')\n").unwrap();
    std::fs::create_dir_all(repo.join("tests/ssim")).unwrap();
    std::fs::write(
        repo.join("tests/ssim/test_relay_similarity.py"),
        "def test_similarity():\n    assert True\n",
    )
    .unwrap();
    let status = repo.join("tests/local_tests/relay/PORT_STATUS.md");
    std::fs::write(&status, PIPED).unwrap();

    let run = fvd()
        .args(["submit", "--family", "relay", "--wait", "--repo"])
        .arg(repo)
        .env_remove("FVD_LOG")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", out(&run));
    let after = std::fs::read_to_string(&status).unwrap();
    owned_changes(PIPED, &after).unwrap_or_else(|e| panic!("{e}\n{after}"));
    let matrix: Vec<&str> = after
        .lines()
        .skip_while(|l| *l != "## Component Matrix")
        .take_while(|l| *l != "## Conversion State")
        .filter(|l| l.starts_with("| "))
        .collect();
    assert_eq!(matrix.len(), 2, "a step got a matrix row: {matrix:#?}");
    assert!(
        after.contains("| pipeline | `python -m pytest tests/local_tests/relay/test_relay_pipeline_parity.py -v -s` | `non_skip_pass` | 2026-06-01: against the official pipeline, seed 0. [fvd "),
        "{after}"
    );
    assert!(!after.contains("| pipeline_parity |"), "{after}");
    for (scope, file) in [
        ("pipeline", "test_relay_pipeline_smoke.py"),
        ("pipeline", "examples/relay.py"),
        ("quality", "test_relay_similarity.py"),
    ] {
        assert!(
            after
                .lines()
                .any(|l| l.starts_with(&format!("| {scope} | `")) && l.contains(file)),
            "{scope} {file}:\n{after}"
        );
    }
    for line in [
        "- phase: `phase_11_post_parity_review_handoff`",
        "- status: `in_progress`",
        "moved forward from phase: \"`phase_6_component_parity_debug`\"; status: \"`in_progress`\"; owner: \"`component:solo`\"",
        "- the port is at P11 (post-parity review and handoff) and waits for a person's review.",
        "- [x] every required component has a non-skip parity pass (`solo`)",
        "- [x] pipeline step `pipeline_smoke` has a non-skip pass",
        "- [x] pipeline step `pipeline_parity` has a non-skip pass",
        "- [x] the basic example ran to exit status 0",
        "- [x] quality regression passed (`quality_relay_similarity`)",
        "- [x] every escape hatch fvd raised is answered",
        "- [ ] a person's: ",
    ] {
        assert!(after.contains(line), "{line}:\n{after}");
    }
    let check = fvd()
        .args(["contracts", "check"])
        .arg(&status)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", out(&check));
    // submitted again: nothing new, not a byte changes
    let again = fvd()
        .args(["submit", "--family", "relay", "--wait", "--repo"])
        .arg(repo)
        .env_remove("FVD_LOG")
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", out(&again));
    assert_eq!(std::fs::read_to_string(&status).unwrap(), after);
}
