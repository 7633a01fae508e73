//! `fvd contracts check` end to end: the project's status files and
//! contract templates (`tests/fixtures`), handoff blocks written to temp
//! files, and every exit code. The same checks on the real FastVideo files
//! are in the conformance suite.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::checks::contracts::{self as check, ContractFiles, code, stderr, stdout};
use crate::support::fixtures;

fn check_in(dir: &Path, args: &[&str]) -> Output {
    check::check_in(dir, args)
}

const ORBITCAM: &str = "fastvideo/tests/local_tests/orbitcam/PORT_STATUS.md";

/// The project's contract inputs and what the checks need to know about them.
fn own() -> ContractFiles {
    ContractFiles {
        root: fixtures(),
        complete: ORBITCAM,
        family: "orbitcam",
        phase: "phase_11_post_parity_handoff",
        components: &[
            (
                "Transformer (`OrbitCamTransformer3DModel`)",
                "forward_parity_pass",
            ),
            ("vae", "encode_decode_parity_pass"),
            ("text_encoder/tokenizer", "hidden_state_parity_pass"),
            ("scheduler", "non_skip_pass"),
            ("camera_embedding", "non_skip_pass"),
            ("pipeline", "latent_parity_pass"),
        ],
        final_handoff_finding: (106, "final_handoff.components[0].reuse_or_port"),
        leak: ("encode_decode_parity_pass |", 1, 26),
        sparse: "port_status/sparse.md",
        sparse_decisions_line: 29,
        status_files: &[
            (ORBITCAM, 0),
            ("fastvideo/tests/local_tests/tidewave/PORT_STATUS.md", 0),
            ("fastvideo/tests/local_tests/pixelflow/PORT_STATUS.md", 1),
            ("port_status/sparse.md", 1),
            ("port_status/leaky.md", 1),
        ],
        prep_placeholder_line: 6,
        retry_placeholder_line: 35,
    }
}

const PREP: &str = "model_family: wan22_mini
workload_types: T2V
official_ref: https://github.com/example/wan22-mini
official_ref_dir: Wan22Mini/
official_ref_commit: unknown (searched: git -C Wan22Mini log -1)
hf_weights_path: example/Wan22-Mini
hf_revision: default
local_weights_dir: official_weights/wan22_mini
source_layout: raw_official
model_index_class: none
components_seen: transformer, vae, text_encoder
needs_conversion: yes
hf_token_env: HF_TOKEN
dependency_changes: none
official_env_status: imports_ok
local_tests_readme: tests/local_tests/wan22_mini/README.md
port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
gitignore_entries_added: Wan22Mini/
next_step: add-model
open_questions: none
escape_hatch: none
";

#[test]
fn complete_status_json_reports_family_phase_and_all_components() {
    let out = check::complete_status_summary(&own());
    insta::assert_snapshot!("check_orbitcam_json", out);
}

#[test]
fn complete_status_by_absolute_path_from_elsewhere() {
    check::complete_status_by_absolute_path(&own());
}

#[test]
fn sparse_status_lists_what_the_contract_misses() {
    let out = check::sparse_status_lists_what_the_contract_misses(&own());
    insta::assert_snapshot!("check_sparse_human", out);
}

#[test]
fn every_status_file_is_checked_without_error() {
    check::every_status_file_is_checked_without_error(&own());
}

#[test]
fn contract_templates_fail_on_placeholders() {
    check::templates_fail_on_placeholders(&own());
}

#[test]
fn every_contract_template_is_recognised_and_never_valid() {
    check::every_contract_template_is_recognised_and_never_valid(&own());
}

#[test]
fn embedded_final_handoff_is_checked_with_file_lines() {
    check::embedded_final_handoff_is_checked_with_file_lines(&own());
}

#[test]
fn tokens_in_a_status_file_are_masked_in_the_summary() {
    check::tokens_in_a_status_file_are_masked_in_the_summary(&own());
}

#[test]
fn credential_looking_values_in_a_fixture_are_never_printed() {
    let path = "port_status/leaky.md";
    let text = std::fs::read_to_string(fixtures().join(path)).unwrap();
    let secrets = [
        "hf_QuillonFixtureNotARealToken7x2Kq9Lm",
        "qF1xtureB3arerValue9Zk27Lm44Np",
        "QfixtureApiKey0a9b8c7d6e5f4",
    ];
    for s in secrets {
        assert!(text.contains(s), "{path} holds {s}");
    }
    for args in [vec![path], vec![path, "--json"]] {
        let o = check_in(&fixtures(), &args);
        assert_eq!(code(&o), 1);
        for s in secrets {
            assert!(!stdout(&o).contains(s), "{}", stdout(&o));
            assert!(!stderr(&o).contains(s), "{}", stderr(&o));
        }
    }
    let o = check_in(&fixtures(), &[path, "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let lines: Vec<u64> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [26, 42, 54]);
    assert_eq!(v["summary"]["components"][1]["parity"], "[redacted]");
    assert_eq!(v["summary"]["components"][0]["parity"], "`non_skip_pass`");
}

#[test]
fn handoff_blocks_bare_and_fenced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prep.txt"), PREP).unwrap();
    let o = check_in(dir.path(), &["prep.txt"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert_eq!(stdout(&o), "prep.txt: valid prep_handoff\n");
    let o = check_in(dir.path(), &["prep.txt", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["kind"], "prep_handoff");
    assert_eq!(v["summary"]["model_family"], "wan22_mini");
    assert_eq!(v["summary"]["next_step"], "add-model");

    // in a markdown file the lines are the file's, not the fence's
    let asks = PREP.replace("next_step: add-model", "next_step: ask_user");
    let md = format!("# Prep result\n\nSome prose.\n\n```text\n{asks}```\n");
    std::fs::write(dir.path().join("prep.md"), md).unwrap();
    let o = check_in(dir.path(), &["prep.md"]);
    assert_eq!(code(&o), 1);
    assert_eq!(
        stdout(&o),
        "prep.md:26: escape_hatch: next_step ask_user requires an escape_hatch block, not none\n\
         prep.md: 1 finding(s) in prep_handoff\n"
    );
    insta::assert_snapshot!("check_prep_ask_user_human", stdout(&o));

    let blocked = PREP.replace(
        "official_env_status: imports_ok",
        "official_env_status: blocked",
    );
    std::fs::write(dir.path().join("blocked.txt"), blocked).unwrap();
    let o = check_in(dir.path(), &["blocked.txt", "--kind", "prep_handoff"]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).starts_with(
        "blocked.txt:15: official_env_status: must be imports_ok or private_deps_need_stubs"
    ));
}

#[test]
fn raw_tokens_are_reported_but_never_printed() {
    let token = format!("hf_{}", "k3Q".repeat(11));
    let dir = tempfile::tempdir().unwrap();
    let leaked = PREP.replace("hf_token_env: HF_TOKEN", &format!("hf_token_env: {token}"));
    std::fs::write(dir.path().join("leak.txt"), leaked).unwrap();
    for args in [vec!["leak.txt"], vec!["leak.txt", "--json"]] {
        let o = check_in(dir.path(), &args);
        assert_eq!(code(&o), 1);
        assert!(stdout(&o).contains("hf_token_env"), "{}", stdout(&o));
        assert!(!stdout(&o).contains(&token));
        assert!(!stderr(&o).contains(&token));
    }
}

#[test]
fn unreadable_or_unparsable_input_exits_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let o = check_in(dir.path(), &["missing.md"]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).starts_with("fvd: error: cannot read missing.md"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty());

    std::fs::write(dir.path().join("binary.bin"), [0xff, 0xfe, 0x00, 0x9f]).unwrap();
    let o = check_in(dir.path(), &["binary.bin"]);
    assert_eq!(code(&o), 2);
    assert_eq!(
        stderr(&o),
        "fvd: error: binary.bin:1:1: not utf-8 text (byte 0xff)\n"
    );

    std::fs::write(
        dir.path().join("prose.md"),
        "# Notes\n\nNothing structured here.\n",
    )
    .unwrap();
    let o = check_in(dir.path(), &["prose.md"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).starts_with("fvd: error: cannot parse prose.md: no contract block found"));

    std::fs::write(dir.path().join("empty.txt"), "").unwrap();
    let o = check_in(dir.path(), &["empty.txt"]);
    assert_eq!(code(&o), 2);
    assert_eq!(
        stderr(&o),
        "fvd: error: cannot parse empty.txt: input is empty\n"
    );

    let o = check_in(dir.path(), &["prose.md", "--kind", "nonsense"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("unknown contract kind `nonsense`"));
}
