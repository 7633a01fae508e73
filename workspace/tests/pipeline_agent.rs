//! The pipeline's own agent (issue #42): a pipeline step's packet is a
//! valid `pipeline_context`, its agent's `pipeline_handoff` is read as the
//! step's, and a `return_to_phase_6` names the component to reopen.

use std::collections::BTreeMap;
use std::path::Path;

use fvd_contracts::Contract;
use fvd_contracts::block::fenced_blocks;
use fvd_contracts::pipeline::PipelineContext;
use fvd_store::states::{HandoffStatus, RecordedVerdict};
use fvd_workspace::agent::pipeline::{PipelineFacts, named_component};
use fvd_workspace::agent::{self, LastRun, Packet};

const SPEC: &str = r#"[prep]
model_family = "mapped"
official_ref_dir = "official"
port_state_file = "tests/local_tests/mapped/PORT_STATUS.md"
source_layout = "raw_official"

[[component]]
name = "stem"
type = "encoder"
parity_test = "tests/test_stem.py"
coverage_scope = "both"

[[component]]
name = "body"
type = "dit"
parity_test = "tests/test_body.py"
coverage_scope = "both"

[pipeline]
smoke_test = "tests/test_smoke.py"
parity_test = "tests/test_pipeline.py"
comparison_target = "the official pipeline's latents, seed 0"
example = ["python", "examples/mapped.py"]
agent = true

[agent]
command = ["agent", "{prompt_file}"]
"#;

/// A `pipeline_handoff` with `next_step` and `blockers` as given.
fn handoff(next_step: &str, blockers: &str) -> String {
    format!(
        "pipeline_handoff:
  model_family: mapped
  mode: pipeline-parity-debug
  files_changed: none
  official_files_used:
    - official/pipeline.py
  required_config_modules:
    emitted: stem, body
    model_index: stem, body
    status: match
  pipeline_class_resolution:
    model_index_class_name: MappedPipeline
    entry_class_names: MappedPipeline
    status: exact_match
  sampling_param:
    fields_added: none
    cli_fields_added: none
    unknown_kwargs_checked: yes
  stage_chain:
    - DenoisingStage
  pipeline_config:
    file: fastvideo/configs/pipelines/mapped.py
    classes: MappedConfig
    official_defaults_checked: yes
  presets:
    file: none
    names: none
    status: pass
  registry:
    status: pass
    detectors: MappedPipeline
  smoke_test:
    path: tests/test_smoke.py
    status: non_skip_pass
    pytest_output: 1 passed
  pipeline_parity:
    path: tests/test_pipeline.py
    status: debug_red
    pytest_output: 1 failed
    comparison_target: latents
  example:
    path: examples/mapped.py
    status: pass
    output: outputs/mapped.mp4
  readme_updated: no
  port_state_updated: no
  blockers: {blockers}
  next_step: {next_step}
  escape_hatch: none
"
    )
}

#[test]
fn a_pipeline_step_packet_is_a_valid_pipeline_context_that_asks_for_a_pipeline_handoff() {
    let spec = fvd_spec::parse(Path::new("port.toml"), SPEC).unwrap();
    let step = spec.pipeline_steps().nth(1).unwrap().clone();
    assert_eq!(step.name, fvd_spec::later::PARITY_STEP);
    let facts = PipelineFacts::of(&spec);
    let prep: BTreeMap<String, String> = spec.prep.clone();
    let text = agent::packet(&Packet {
        family: "mapped",
        spec: &step,
        prep: &prep,
        attempt: 1,
        budget_used: 1,
        max_attempts: 2,
        last: LastRun {
            job_id: "mapped.pipeline_parity.1",
            verdict: RecordedVerdict::DebugRed,
            reason: "AssertionError: the pipeline's video differs",
            output_tail: "1 failed",
        },
        ledger: &[],
        workdir: "/w/port",
        handoff_file: "/h.txt",
        answers: &[],
        judge_decisions: &[],
        next_escape_id: "E002",
        trace: None,
        variants: None,
        pipeline: Some(&facts),
    });
    let block = fenced_blocks(&text)
        .into_iter()
        .find(|f| f.body.starts_with("pipeline_context:"))
        .unwrap_or_else(|| panic!("no pipeline_context block in\n{text}"));
    let checked = PipelineContext::check(&block.body, 1);
    assert!(checked.is_valid(), "{:?}\n{}", checked.findings, block.body);
    let ctx = checked.value.unwrap();
    let names: Vec<String> = ctx.components.iter().map(|c| c.name.to_string()).collect();
    assert_eq!(names, ["stem", "body"]);
    assert_eq!(ctx.mode.as_str(), "pipeline-parity-debug");
    assert!(
        text.starts_with("# fvd pipeline-parity-debug: mapped / pipeline_parity"),
        "{text}"
    );
    assert!(text.contains("write a `pipeline_handoff` block"), "{text}");
    assert!(text.contains("`next_step: return_to_phase_6`"), "{text}");
    assert!(!text.contains("component_skill_handoff"), "{text}");
    assert!(text.contains("A skip is not a pass"), "{text}");
    // the smoke step's agent defines the pipeline
    let smoke = spec.pipeline_steps().next().unwrap().clone();
    assert_eq!(agent::pipeline::mode(&smoke), "pipeline-definition");
}

#[test]
fn a_pipeline_steps_handoff_is_a_pipeline_handoff_and_a_component_block_is_not_one() {
    let spec = fvd_spec::parse(Path::new("port.toml"), SPEC).unwrap();
    let step = spec.pipeline_steps().nth(1).unwrap().clone();
    let back = handoff(
        "return_to_phase_6",
        "body maps blocks.1.norm from blocks.1.ln",
    );
    let read = agent::read_handoff_for(&step, None, Some(&back), "");
    assert_eq!(read.status, HandoffStatus::Valid, "{}", read.summary);
    assert!(read.value.is_none() && read.pipeline.is_some());
    assert_eq!(
        read.stop_reason().as_deref(),
        Some("the pipeline's agent returns to phase 6: body maps blocks.1.norm from blocks.1.ln")
    );
    // printed as the last block of the output, after other text
    let printed = format!("I traced it.\n\n{back}\nbye\n");
    let read = agent::read_handoff_for(&step, None, None, &printed);
    assert_eq!(read.status, HandoffStatus::Valid, "{}", read.summary);
    // moving on is no stop: the rerun decides
    let on = handoff("phase_10_quality_regression", "none");
    let read = agent::read_handoff_for(&step, None, Some(&on), "");
    assert_eq!(read.stop_reason(), None);
    assert!(
        read.summary
            .contains("next_step=phase_10_quality_regression"),
        "{}",
        read.summary
    );
    // a component's block is not the pipeline's
    let other = "component: pipeline_parity\nmode: parity-debug\nnext_step: phase_6_continue\n";
    let read = agent::read_handoff_for(&step, None, Some(other), "");
    assert_eq!(read.status, HandoffStatus::Invalid, "{}", read.summary);
    let none = agent::read_handoff_for(&step, None, None, "done\n");
    assert_eq!(none.status, HandoffStatus::Missing);
    assert_eq!(none.summary, "the agent returned no pipeline_handoff block");
}

#[test]
fn a_return_to_phase_6_reopens_only_the_one_component_its_blockers_name() {
    use fvd_contracts::pipeline::PipelineHandoff;
    let names = vec!["stem".to_string(), "body".to_string()];
    let read =
        |blockers: &str| PipelineHandoff::parse(&handoff("return_to_phase_6", blockers)).unwrap();
    assert_eq!(
        named_component(&read("body: block 1's norm maps blocks.1.ln"), &names),
        Ok("body")
    );
    // a word inside another is no name
    let none = named_component(&read("the embodied scheduler shifts"), &names).unwrap_err();
    assert!(
        none.contains("name none of the port's components (stem, body)"),
        "{none}"
    );
    let many = named_component(&read("stem and body both drift"), &names).unwrap_err();
    assert!(many.contains("several components (stem, body)"), "{many}");
}

/// A question the pipeline's agent asked through its `ask_user` tool
/// becomes the hatch of a `pipeline_handoff` at P7: of one fvd writes when
/// the agent returned none, and of the agent's own, whose fields stay.
#[test]
fn a_question_asked_by_tool_in_a_pipeline_step_is_a_pipeline_handoffs_hatch_at_p7() {
    let spec = fvd_spec::parse(Path::new("port.toml"), SPEC).unwrap();
    let step = spec.pipeline_steps().nth(1).unwrap().clone();
    let q = agent::AskedQuestion {
        decision_type: "ambiguity".into(),
        question: "Which scheduler shift?".into(),
        recommended_option: "5.0".into(),
        options: vec!["5.0".into(), "3.0".into()],
        safe_default: "none".into(),
    };
    let files = vec!["fastvideo/pipeline.py".to_string()];
    let at = agent::AskedAt {
        component: &step.name,
        parity_test: "tests/test_pipeline.py",
        parity_status: "error",
        evidence: "RuntimeError: the scheduler refused shift 3.0",
        escape_id: "E002",
        files_changed: &files,
        port_state_file: "tests/local_tests/mapped/PORT_STATUS.md",
        pipeline_mode: Some(agent::pipeline::mode(&step)),
    };
    let none = agent::read_handoff_for(&step, None, None, "");
    for read in [
        none,
        agent::read_handoff_for(
            &step,
            None,
            Some(&handoff("phase_10_quality_regression", "none")),
            "",
        ),
    ] {
        let own = read.pipeline.is_some();
        let merged = agent::with_question(&read, &q, &at);
        // the agent's own fields stay
        assert_eq!(
            merged.text.contains("official/pipeline.py"),
            own,
            "{}",
            merged.text
        );
        assert_eq!(
            merged.status,
            HandoffStatus::Valid,
            "{}\n{}",
            merged.summary,
            merged.text
        );
        assert!(merged.pipeline.is_some() && merged.value.is_none());
        let e = merged.escape().expect("the hatch");
        assert_eq!(e.question.to_string(), "Which scheduler shift?");
        assert!(merged.text.contains("      phase: P7"), "{}", merged.text);
        assert_eq!(merged.stop_reason(), None);
    }
}
