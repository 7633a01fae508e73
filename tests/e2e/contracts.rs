//! `fvd contracts check` end to end: the real status files and contract
//! documents, handoff blocks written to temp files, and every exit code.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::support::{fixtures, fvd};

/// Runs `fvd contracts check ARGS…` from the fixtures folder, so paths in
/// the output are the short relative ones the snapshots record.
fn check_in(dir: &Path, args: &[&str]) -> Output {
    fvd()
        .current_dir(dir)
        .arg("contracts")
        .arg("check")
        .args(args)
        .output()
        .expect("run fvd")
}

fn check(args: &[&str]) -> Output {
    check_in(&fixtures(), args)
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("fvd exited by signal")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
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
fn dreamx_status_json_reports_family_phase_and_all_components() {
    let o = check(&["port_status/dreamx_world.md", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["kind"], "port_status");
    assert_eq!(v["valid"], true);
    assert_eq!(v["findings"], Value::Array(vec![]));
    assert_eq!(v["summary"]["model_family"], "dreamx_world");
    assert_eq!(v["summary"]["phase"], "phase_11_post_parity_handoff");
    let comps = v["summary"]["components"].as_array().expect("components");
    let pairs: Vec<(&str, &str)> = comps
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["parity"].as_str().unwrap()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("transformer", "strict_load_and_forward_parity_pass"),
            ("vae", "encode_parity_pass"),
            ("text_encoder/tokenizer", "hidden_state_parity_pass"),
            ("scheduler", "non_skip_pass"),
            ("camera_conditioning", "non_skip_pass"),
            ("pipeline", "pipeline_api_vs_worker_forward_parity_pass"),
            ("ar_transformer", "real_5b_strict_load_pass"),
            ("ar_pipeline", "short_full_generation_pass"),
        ]
    );
    insta::assert_snapshot!("check_dreamx_json", stdout(&o));
}

#[test]
fn dreamx_status_from_the_workspace_root_path() {
    // the path the issue names, run from the workspace root
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = fixtures().join("port_status/dreamx_world.md");
    let o = check_in(root, &[path.to_str().unwrap(), "--json"]);
    assert_eq!(code(&o), 0);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["summary"]["components"].as_array().unwrap().len(), 8);
}

#[test]
fn minimax_status_lists_what_the_contract_misses() {
    let o = check(&["port_status/minimax_h3.md"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(
        "port_status/minimax_h3.md:0: Component Matrix: missing required section `## Component Matrix`\n"
    ));
    assert!(out.contains("port_status/minimax_h3.md:30: Decisions: missing table"));
    insta::assert_snapshot!("check_minimax_human", out);

    let o = check(&["port_status/minimax_h3.md", "--json"]);
    assert_eq!(code(&o), 1);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["summary"]["model_family"], Value::Null);
    assert_eq!(v["summary"]["components"], Value::Array(vec![]));
    let f = &v["findings"][0];
    assert!(f["line"].is_u64() && f["field"].is_string() && f["message"].is_string());
}

#[test]
fn every_real_status_file_is_checked_without_error() {
    for (file, want) in [
        ("port_status/dreamx_world.md", 0),
        ("port_status/lingbotworld2.md", 0),
        ("port_status/flux.md", 1),
        ("port_status/minimax_h3.md", 1),
    ] {
        let o = check(&[file]);
        assert_eq!(code(&o), want, "{file}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).is_empty(), "{file}: {}", stderr(&o));
    }
}

#[test]
fn contract_templates_fail_on_placeholders() {
    let o = check(&["contracts/prep_handoff.md"]);
    assert_eq!(code(&o), 1);
    let out = stdout(&o);
    assert!(
        out.contains(
            "contracts/prep_handoff.md:6: model_family: placeholder copied from the template"
        ),
        "{out}"
    );
    assert!(out.ends_with("finding(s) in prep_handoff\n"));
    // the second fence of conversion_request.md is the retry request
    let o = check(&[
        "contracts/conversion_request.md",
        "--kind",
        "conversion_retry_request",
    ]);
    assert_eq!(code(&o), 1);
    assert!(
        stdout(&o).contains(
            "contracts/conversion_request.md:37: conversion_retry_request.component: placeholder"
        ),
        "{}",
        stdout(&o)
    );
}

#[test]
fn embedded_final_handoff_is_checked_with_file_lines() {
    let o = check(&[
        "port_status/dreamx_world.md",
        "--kind",
        "final_handoff",
        "--json",
    ]);
    assert_eq!(code(&o), 1);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["kind"], "final_handoff");
    assert_eq!(v["findings"][0]["line"], 140);
    assert_eq!(
        v["findings"][0]["field"],
        "final_handoff.components[0].reuse_or_port"
    );
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

#[test]
fn tokens_in_a_status_file_are_masked_in_the_summary() {
    let token = format!("hf_{}", "Pw4".repeat(11));
    let original = std::fs::read_to_string(fixtures().join("port_status/dreamx_world.md")).unwrap();
    let leaked = original.replacen("encode_parity_pass |", &format!("{token} |"), 1);
    assert_ne!(leaked, original);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("PORT_STATUS.md"), leaked).unwrap();
    let o = check_in(dir.path(), &["PORT_STATUS.md", "--json"]);
    assert_eq!(code(&o), 1);
    let out = stdout(&o);
    assert!(!out.contains(&token), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["summary"]["components"][1]["parity"], "[redacted]");
    assert_eq!(v["findings"][0]["field"], "table row");
    assert_eq!(v["findings"][0]["line"], 26);
}
