//! `fvd contracts check` on the real status files and contract documents.

use crate::checks::contracts::{self as check, ContractFiles};

const DREAMX: &str = "port_status/dreamx_world.md";

fn real() -> ContractFiles {
    ContractFiles {
        root: crate::real(),
        complete: DREAMX,
        family: "dreamx_world",
        phase: "phase_11_post_parity_handoff",
        components: &[
            ("transformer", "strict_load_and_forward_parity_pass"),
            ("vae", "encode_parity_pass"),
            ("text_encoder/tokenizer", "hidden_state_parity_pass"),
            ("scheduler", "non_skip_pass"),
            ("camera_conditioning", "non_skip_pass"),
            ("pipeline", "pipeline_api_vs_worker_forward_parity_pass"),
            ("ar_transformer", "real_5b_strict_load_pass"),
            ("ar_pipeline", "short_full_generation_pass"),
        ],
        final_handoff_finding: (140, "final_handoff.components[0].reuse_or_port"),
        leak: ("encode_parity_pass |", 1, 26),
        sparse: "port_status/minimax_h3.md",
        sparse_decisions_line: 30,
        status_files: &[
            (DREAMX, 0),
            ("port_status/lingbotworld2.md", 0),
            ("port_status/flux.md", 1),
            ("port_status/minimax_h3.md", 1),
        ],
        prep_placeholder_line: 6,
        retry_placeholder_line: 37,
    }
}

#[test]
fn complete_status_json_reports_family_phase_and_all_components() {
    let out = check::complete_status_summary(&real());
    insta::assert_snapshot!("check_dreamx_json", out);
}

#[test]
fn complete_status_by_absolute_path_from_elsewhere() {
    check::complete_status_by_absolute_path(&real());
}

#[test]
fn sparse_status_lists_what_the_contract_misses() {
    let out = check::sparse_status_lists_what_the_contract_misses(&real());
    insta::assert_snapshot!("check_minimax_human", out);
}

#[test]
fn every_status_file_is_checked_without_error() {
    check::every_status_file_is_checked_without_error(&real());
}

#[test]
fn contract_templates_fail_on_placeholders() {
    check::templates_fail_on_placeholders(&real());
}

#[test]
fn every_contract_template_is_recognised_and_never_valid() {
    check::every_contract_template_is_recognised_and_never_valid(&real());
}

#[test]
fn embedded_final_handoff_is_checked_with_file_lines() {
    check::embedded_final_handoff_is_checked_with_file_lines(&real());
}

#[test]
fn tokens_in_a_status_file_are_masked_in_the_summary() {
    check::tokens_in_a_status_file_are_masked_in_the_summary(&real());
}
