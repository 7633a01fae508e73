//! Each contract: the example is valid, and every rule fires on a block
//! broken in exactly that way (and names the field and line).

use super::examples::*;
use crate::component::{ComponentContext, ComponentSkillHandoff, ParityStatus};
use crate::contract::Contract;
use crate::conversion::{ConversionHandoff, ConversionRequest, ConversionRetryRequest};
use crate::escape_hatch::EscapeHatch;
use crate::final_handoff::FinalHandoff;
use crate::findings::Finding;
use crate::pipeline::{PipelineContext, PipelineHandoff};
use crate::prep::{OfficialEnvStatus, PrepHandoff, PrepNextStep};

fn check<T: Contract>(text: &str) -> Vec<Finding> {
    T::check(text, 1).findings
}

/// Asserts exactly one finding on `field` whose message contains `needle`.
fn fires(findings: &[Finding], field: &str, needle: &str) {
    let hits: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.field == field && f.message.contains(needle))
        .collect();
    assert_eq!(hits.len(), 1, "want `{field}: …{needle}…` in {findings:#?}");
    assert!(hits[0].line > 0, "finding without a line: {:?}", hits[0]);
}

fn assert_valid<T: Contract + std::fmt::Debug>(text: &str) -> T {
    let checked = T::check(text, 1);
    assert!(checked.findings.is_empty(), "{:#?}", checked.findings);
    checked.value.expect("valid block has a value")
}

fn ask_user_prep(hatch: Option<&str>) -> String {
    let t = edit(PREP, "next_step", Some("next_step: ask_user"));
    match hatch {
        Some(h) => replace_block(&t, "escape_hatch", h),
        None => t,
    }
}

#[test]
fn every_example_is_valid() {
    assert_valid::<PrepHandoff>(PREP);
    assert_valid::<EscapeHatch>(ESCAPE_NESTED);
    assert_valid::<ComponentContext>(COMPONENT_CONTEXT);
    assert_valid::<ParityStatus>(PARITY_STATUS);
    assert_valid::<ConversionRequest>(CONVERSION_REQUEST);
    assert_valid::<ConversionRetryRequest>(RETRY);
    assert_valid::<ConversionHandoff>(CONVERSION_HANDOFF);
    assert_valid::<ComponentSkillHandoff>(SKILL_HANDOFF);
    assert_valid::<PipelineContext>(PIPELINE_CONTEXT);
    assert_valid::<PipelineHandoff>(PIPELINE_HANDOFF);
    assert_valid::<FinalHandoff>(FINAL);
}

#[test]
fn prep_reads_typed_values_and_unknown_with_search() {
    let p: PrepHandoff = assert_valid(PREP);
    assert_eq!(p.official_env_status, OfficialEnvStatus::ImportsOk);
    assert_eq!(p.next_step, PrepNextStep::AddModel);
    assert_eq!(p.components_seen.len(), 3);
    assert_eq!(
        p.official_ref_commit.to_string(),
        "unknown (searched: git -C Wan22Mini log -1 on a shallow clone)"
    );
    assert!(p.ready_for_parity_scaffolding());
    assert_eq!(PrepHandoff::parse(&p.render()).unwrap(), p);
}

#[test]
fn ask_user_needs_an_escape_hatch_block() {
    let f = check::<PrepHandoff>(&ask_user_prep(None));
    fires(&f, "escape_hatch", "requires an escape_hatch block");
    assert_eq!(f[0].line, 26, "line of escape_hatch: {f:?}");

    let ok = ask_user_prep(Some(ESCAPE_NESTED));
    let p: PrepHandoff = assert_valid(&ok);
    assert!(!p.ready_for_parity_scaffolding());
    assert!(p.escape_hatch.block().is_some());
}

#[test]
fn ask_user_hatch_must_cite_its_e_row_and_limit_alternatives() {
    let no_id = ESCAPE_NESTED.replace("evidence: E001;", "evidence: see log;");
    let f = check::<PrepHandoff>(&ask_user_prep(Some(&no_id)));
    fires(&f, "escape_hatch.state_snapshot.evidence", "E###");

    let many = ESCAPE_NESTED.replace(
        "    - install the fork; core pins change\n",
        "    - b\n    - c\n    - d\n    - e\n",
    );
    let f = check::<EscapeHatch>(&many);
    fires(&f, "escape_hatch.options", "at most 3 alternatives");

    let says_no = ESCAPE_NESTED.replace("needs_user_input: yes", "needs_user_input: no");
    let f = check::<PrepHandoff>(&ask_user_prep(Some(&says_no)));
    fires(&f, "escape_hatch.needs_user_input", "must be yes");
}

#[test]
fn official_env_gate() {
    for s in OfficialEnvStatus::ALL {
        let text = edit(
            PREP,
            "official_env_status",
            Some(&format!("official_env_status: {s}")),
        );
        let f = check::<PrepHandoff>(&text);
        if s.allows_parity_scaffolding() {
            assert!(f.is_empty(), "{s}: {f:?}");
        } else {
            fires(
                &f,
                "official_env_status",
                "imports_ok or private_deps_need_stubs",
            );
        }
    }
    assert!(OfficialEnvStatus::PrivateDepsNeedStubs.allows_parity_scaffolding());
    assert!(!OfficialEnvStatus::Blocked.allows_parity_scaffolding());
}

#[test]
fn enums_reject_unknown_spellings_and_template_alternatives() {
    let text = edit(
        PREP,
        "official_env_status",
        Some("official_env_status: imports_ok | private_deps_need_stubs | blocked"),
    );
    let f = check::<PrepHandoff>(&text);
    fires(
        &f,
        "official_env_status",
        "expected one of imports_ok | private_deps_need_stubs | blocked",
    );
    // a contract enum that allows unknown accepts it, one that does not refuses it
    let u = edit(
        PREP,
        "needs_conversion",
        Some("needs_conversion: unknown (searched: hf ls)"),
    );
    assert!(check::<PrepHandoff>(&u).is_empty());
    let u = edit(
        PREP,
        "official_env_status",
        Some("official_env_status: unknown"),
    );
    fires(
        &check::<PrepHandoff>(&u),
        "official_env_status",
        "invalid value",
    );
}

#[test]
fn required_fields_must_be_present() {
    let text = edit(PREP, "hf_revision", None);
    let f = check::<PrepHandoff>(&text);
    fires(&f, "hf_revision", "missing required field");
    assert!(PrepHandoff::parse(&text).is_err());

    let nested = edit(COMPONENT_CONTEXT, "strict_load", None);
    fires(
        &check::<ComponentContext>(&nested),
        "component_context.conversion.strict_load",
        "missing required field",
    );

    let empty = edit(PREP, "model_family", Some("model_family:"));
    fires(
        &check::<PrepHandoff>(&empty),
        "model_family",
        "missing value",
    );

    let extra = format!("{PREP}surprise: 1\n");
    fires(&check::<PrepHandoff>(&extra), "surprise", "unknown field");
}

#[test]
fn placeholders_are_rejected() {
    let text = edit(PREP, "model_family", Some("model_family: <snake_case>"));
    let f = check::<PrepHandoff>(&text);
    fires(&f, "model_family", "placeholder");
    assert_eq!(f[0].line, 1);
    let text = edit(COMPONENT_CONTEXT, "official", Some("official: <path>"));
    fires(
        &check::<ComponentContext>(&text),
        "component_context.prototype_key_dumps.official",
        "placeholder",
    );
    // angle brackets inside a real value are not a placeholder
    let ok = edit(
        PREP,
        "workload_types",
        Some("workload_types: T2V (<= 81 frames)"),
    );
    assert!(check::<PrepHandoff>(&ok).is_empty());
}

#[test]
fn secrets_are_refused_without_echo() {
    let token = fake_hf_token();
    let text = edit(
        PREP,
        "hf_token_env",
        Some(&format!("hf_token_env: {token}")),
    );
    let f = check::<PrepHandoff>(&text);
    fires(&f, "hf_token_env", "hugging face token");
    let bearer = edit(
        PREP,
        "open_questions",
        Some("open_questions: curl -H 'Authorization: Bearer x9Kd83jdL2mQ0zPw'"),
    );
    fires(
        &check::<PrepHandoff>(&bearer),
        "open_questions",
        "bearer token",
    );
    for finding in f {
        assert!(!finding.message.contains(&token));
        assert!(!finding.field.contains(&token));
    }
    // nothing a check reports, summary included, carries the value
    let report = crate::kind::check(&text, None).unwrap();
    assert!(!report.valid);
    assert!(!format!("{report:?}").contains(&token));
}

#[test]
fn component_rules() {
    let f = check::<ComponentContext>(&COMPONENT_CONTEXT.replace(
        "  official_instantiation_files:\n    - path: Wan22Mini/inference.py\n      symbols: setup_models\n      args: z_dim=16, scale from config\n",
        "  official_instantiation_files:\n",
    ));
    fires(&f, "official_instantiation_files", "at least one file");

    let p: ParityStatus = assert_valid(PARITY_STATUS);
    assert!(!p.all_components_pass());
    let f = check::<ParityStatus>(
        &PARITY_STATUS.replace("status: scaffold_skip", "status: not_started"),
    );
    fires(&f, "component_parity", "not_started is not allowed");

    let f = check::<ComponentSkillHandoff>(&edit(
        SKILL_HANDOFF,
        "parity_status",
        Some("parity_status: non_skip_pass"),
    ));
    fires(&f, "parity_status", "prototype mode");
    let debug = edit(SKILL_HANDOFF, "mode", Some("mode: parity-debug"));
    let debug = edit(
        &debug,
        "parity_status",
        Some("parity_status: non_skip_pass"),
    );
    assert!(check::<ComponentSkillHandoff>(&debug).is_empty());

    let retry = edit(
        SKILL_HANDOFF,
        "next_step",
        Some("next_step: phase_5_conversion_retry"),
    );
    fires(
        &check::<ComponentSkillHandoff>(&retry),
        "conversion_retry_request",
        "requires a conversion retry request",
    );
    // the nested request has the same shape as the standalone block
    let with_req = replace_block(&retry, "conversion_retry_request", RETRY);
    let h: ComponentSkillHandoff = assert_valid(&with_req);
    assert!(h.conversion_retry_request.block().is_some());

    let nonstrict = edit(
        SKILL_HANDOFF,
        "production_loader_strictness",
        Some("production_loader_strictness: non_strict_with_allowed_keys"),
    );
    let nonstrict = edit(&nonstrict, "strict_load", Some("strict_load: pass"));
    fires(
        &check::<ComponentSkillHandoff>(&nonstrict),
        "strict_load",
        "pass_with_documented_exclusions",
    );

    let ask = edit(SKILL_HANDOFF, "next_step", Some("next_step: ask_user"));
    fires(
        &check::<ComponentSkillHandoff>(&ask),
        "escape_hatch",
        "requires an escape_hatch block",
    );
}

#[test]
fn conversion_rules() {
    let f = check::<ConversionRequest>(&edit(
        CONVERSION_REQUEST,
        "fastvideo_keys",
        Some("fastvideo_keys: planned"),
    ));
    fires(&f, "components[0].fastvideo_keys", "phase 4 key dump");
    assert_eq!(f[0].line, 15);
    let f = check::<ConversionRequest>(&edit(
        CONVERSION_REQUEST,
        "official_keys",
        Some("official_keys: unknown"),
    ));
    fires(&f, "components[0].official_keys", "phase 4 key dump");

    let f = check::<ConversionRetryRequest>(&edit(RETRY, "evidence", Some("evidence: unknown")));
    fires(&f, "evidence", "strict-load error");
    let r: ConversionRetryRequest = assert_valid(&edit(
        RETRY,
        "suspected_fix",
        Some("suspected_fix: unknown (searched: diffed key dumps)"),
    ));
    assert!(r.suspected_fix.is_unknown());

    let blocked = CONVERSION_HANDOFF.replace(
        "strict_load: pass\ncomponent",
        "strict_load: blocked\ncomponent",
    );
    fires(
        &check::<ConversionHandoff>(&blocked),
        "blocked_on",
        "exact blocker",
    );
    let blocked = edit(
        &blocked,
        "blocked_on",
        Some("blocked_on: I004 missing vae shard"),
    );
    assert!(check::<ConversionHandoff>(&blocked).is_empty());
    let not_run = CONVERSION_HANDOFF.replace(
        "strict_load: pass\ncomponent",
        "strict_load: not_run\ncomponent",
    );
    fires(
        &check::<ConversionHandoff>(&not_run),
        "strict_load",
        "strict-load evidence",
    );
    let ask = edit(CONVERSION_HANDOFF, "next_step", Some("next_step: ask_user"));
    fires(
        &check::<ConversionHandoff>(&ask),
        "escape_hatch",
        "requires an escape_hatch block",
    );
}

#[test]
fn pipeline_and_final_rules() {
    let red = PIPELINE_CONTEXT.replace(
        "parity_status: non_skip_pass",
        "parity_status: scaffold_skip",
    );
    fires(
        &check::<PipelineContext>(&red),
        "components[0].parity_status",
        "return to phase 6",
    );

    let skip = PIPELINE_HANDOFF.replace(
        "    status: non_skip_pass\n    pytest_output: 1 passed",
        "    status: scaffold_skip\n    pytest_output: 1 skipped",
    );
    fires(
        &check::<PipelineHandoff>(&skip),
        "pipeline_parity.status",
        "blocker",
    );
    let skip = edit(
        &skip,
        "blockers",
        Some("blockers: I003 official pipeline needs private weights"),
    );
    assert!(check::<PipelineHandoff>(&skip).is_empty());
    let ask = edit(PIPELINE_HANDOFF, "next_step", Some("next_step: ask_user"));
    fires(
        &check::<PipelineHandoff>(&ask),
        "escape_hatch",
        "requires an escape_hatch block",
    );

    let blocked = FINAL.replacen("parity_status: non_skip_pass", "parity_status: blocked", 1);
    fires(
        &check::<FinalHandoff>(&blocked),
        "components[0].parity_status",
        "unless a blocker",
    );
    let with_blocker = edit(
        &blocked,
        "blockers",
        Some("blockers: I002 transformer needs an H100 run"),
    );
    let fh: FinalHandoff = assert_valid(&with_blocker);
    assert!(fh.has_blockers());
    let f = check::<FinalHandoff>(&edit(
        FINAL,
        "pipeline_smoke",
        Some("pipeline_smoke: not_run"),
    ));
    fires(&f, "pipeline_smoke", "must be pass");
    let f = check::<FinalHandoff>(&edit(
        FINAL,
        "token_values_committed",
        Some("token_values_committed: yes"),
    ));
    fires(
        &f,
        "final_handoff.token_values_committed",
        "expected one of no",
    );
}

#[test]
fn final_handoff_embedded_in_a_status_file() {
    // orbitcam's status file embeds a final_handoff whose reuse_or_port uses
    // a spelling outside the contract; the check must say exactly that
    let text = std::fs::read_to_string(super::fixture(
        "fastvideo/tests/local_tests/orbitcam/PORT_STATUS.md",
    ))
    .unwrap();
    let report = crate::kind::check(&text, Some(crate::kind::ContractKind::FinalHandoff)).unwrap();
    assert_eq!(report.findings.len(), 1, "{:#?}", report.findings);
    let f = &report.findings[0];
    assert_eq!(f.field, "final_handoff.components[0].reuse_or_port");
    assert_eq!(f.line, 106);
    assert!(f.message.contains("expected one of reused | ported"));
}

#[test]
fn ask_user_rule_fires_even_when_other_fields_are_missing() {
    let text = edit(&ask_user_prep(None), "hf_revision", None);
    let f = check::<PrepHandoff>(&text);
    fires(&f, "escape_hatch", "requires an escape_hatch block");
    fires(&f, "hf_revision", "missing required field");
    let with_hatch = edit(&ask_user_prep(Some(ESCAPE_NESTED)), "hf_revision", None);
    let f = check::<PrepHandoff>(&with_hatch);
    assert!(f.iter().all(|x| x.field != "escape_hatch"), "{f:#?}");
}

#[test]
fn kinds_are_inferred_from_bare_and_fenced_blocks() {
    use crate::kind::{ContractKind, check};
    for (text, kind) in [
        (PREP, ContractKind::PrepHandoff),
        (ESCAPE_NESTED, ContractKind::EscapeHatch),
        (COMPONENT_CONTEXT, ContractKind::ComponentContext),
        (PARITY_STATUS, ContractKind::ParityStatus),
        (CONVERSION_REQUEST, ContractKind::ConversionRequest),
        (RETRY, ContractKind::ConversionRetryRequest),
        (CONVERSION_HANDOFF, ContractKind::ConversionHandoff),
        (SKILL_HANDOFF, ContractKind::ComponentSkillHandoff),
        (PIPELINE_CONTEXT, ContractKind::PipelineContext),
        (PIPELINE_HANDOFF, ContractKind::PipelineHandoff),
        (FINAL, ContractKind::FinalHandoff),
    ] {
        let bare = check(text, None).unwrap();
        assert_eq!(bare.kind, kind);
        assert!(bare.valid, "{kind}: {:#?}", bare.findings);
        let md = format!("# Handoff\n\n```text\n{text}```\n");
        let fenced = check(&md, None).unwrap();
        assert_eq!(fenced.kind, kind);
        assert!(fenced.valid, "{kind}: {:#?}", fenced.findings);
    }
}

#[test]
fn finding_messages_follow_the_house_style() {
    // every message fvd can print for the fixture inputs: lowercase start,
    // no trailing period, and a field to point at
    let mut findings = Vec::new();
    for rel in [
        "contracts/prep_handoff.md",
        "contracts/escape_hatch.md",
        "contracts/component_context.md",
        "contracts/parity_status.md",
        "contracts/conversion_request.md",
        "contracts/conversion_handoff.md",
        "contracts/component_skill_handoff.md",
        "contracts/pipeline_context.md",
        "contracts/pipeline_handoff.md",
        "contracts/final_handoff.md",
        "contracts/port_status_template.md",
        "fastvideo/tests/local_tests/pixelflow/PORT_STATUS.md",
        "port_status/sparse.md",
        "port_status/leaky.md",
    ] {
        let text = std::fs::read_to_string(super::fixture(rel)).unwrap();
        let report = crate::kind::check(&text, None).unwrap();
        assert!(!report.findings.is_empty(), "{rel}");
        findings.extend(report.findings);
    }
    let token = edit(
        PREP,
        "hf_token_env",
        Some(&format!("hf_token_env: {}", fake_hf_token())),
    );
    findings.extend(check::<PrepHandoff>(&token));
    findings.extend(check::<PrepHandoff>(&ask_user_prep(None)));
    for f in &findings {
        let first = f.message.chars().next().unwrap();
        assert!(!first.is_uppercase(), "{f:?}");
        assert!(!f.message.ends_with('.'), "{f:?}");
        assert!(!f.field.is_empty(), "{f:?}");
    }
}
