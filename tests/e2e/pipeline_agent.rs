//! The pipeline's own agent (issue #42, P7): `[pipeline] agent = true`
//! loops the spec's agent on a red pipeline step as a component's agent
//! loops on its test, with a `pipeline_context` packet and a
//! `pipeline_handoff` back. Its fix is what the rest of the port runs at;
//! its `return_to_phase_6` sends the port back to P6 for the component its
//! blockers name, whose agent gets the pipeline agent's evidence. The
//! agents are the recorded replay agent (`examples/tinyport/tools`), which
//! refuses a packet that lacks what its recording expects.

use crate::agent::git;
use crate::later_phases::{
    answer, component, first_outcome, gate_outcomes, out, status, submit, write_quality,
};
use crate::support::{Sandbox, TestComponent, fvd};

const AGENT: &str = "\n[agent]\ncommand = [\"python3\", \"-B\", \"tools/replay_agent.py\", \"--patches\", \"tools/replay/{component}\", \"--attempt\", \"{attempt}\", \"--prompt\", \"{prompt_file}\", \"--handoff\", \"{handoff_file}\", \"--worktree\", \"{worktree}\"]\ntimeout_s = 60\nmax_attempts = 2\n";

/// A pipeline parity test that compares the port's pipeline with the
/// official one: the scheduler shift (the pipeline's own glue,
/// `fastvideo/pipeline.py`) and block 1's norm key (component `body`'s
/// weight mapping, `fastvideo/mapping.py`, which `body`'s own test does
/// not see).
const PIPELINE_TEST: &str = r#"def test_pipeline_parity():
    from fastvideo import mapping, pipeline
    assert pipeline.SHIFT == 5.0, f"scheduler shift {pipeline.SHIFT} against the official 5.0"
    assert mapping.NORM_1 == "blocks.1.norm.weight", "the pipeline's video differs from the official one from block 1 on"
"#;

/// A `pipeline_handoff` whose next step and blockers are as given.
fn pipeline_handoff(next_step: &str, blockers: &str, files: &str) -> String {
    format!(
        "pipeline_handoff:\n  model_family: glued\n  mode: pipeline-parity-debug\n  files_changed: {files}\n  official_files_used:\n    - official/pipeline.py\n  required_config_modules:\n    emitted: stem, body\n    model_index: stem, body\n    status: match\n  pipeline_class_resolution:\n    model_index_class_name: GluedPipeline\n    entry_class_names: GluedPipeline\n    status: exact_match\n  sampling_param:\n    fields_added: none\n    cli_fields_added: none\n    unknown_kwargs_checked: yes\n  stage_chain:\n    - DenoisingStage\n  pipeline_config:\n    file: fastvideo/pipeline.py\n    classes: GluedConfig\n    official_defaults_checked: yes\n  presets:\n    file: none\n    names: none\n    status: pass\n  registry:\n    status: pass\n    detectors: GluedPipeline\n  smoke_test:\n    path: none\n    status: not_run\n    pytest_output: none\n  pipeline_parity:\n    path: tests/local_tests/glued/test_glued_pipeline_parity.py\n    status: debug_red\n    pytest_output: 1 failed\n    comparison_target: latents\n  example:\n    path: examples/glued.py\n    status: pass\n    output: outputs/glued.mp4\n  readme_updated: no\n  port_state_updated: no\n  blockers: {blockers}\n  next_step: {next_step}\n  escape_hatch: none\n"
    )
}

/// Records attempt `n` of `who`'s replay agent: its patch (if any), its
/// handoff, and the lines its packet must hold.
fn record(sb: &Sandbox, who: &str, n: u32, patch: Option<&str>, handoff: &str, expect: &str) {
    let dir = sb.repo().join(format!("tools/replay/{who}"));
    std::fs::create_dir_all(&dir).unwrap();
    if let Some(p) = patch {
        std::fs::write(dir.join(format!("{n:04}.patch")), p).unwrap();
    }
    std::fs::write(dir.join(format!("{n:04}.handoff")), handoff).unwrap();
    std::fs::write(dir.join(format!("{n:04}.expect")), expect).unwrap();
}

/// A port `glued` whose components `stem` and `body` pass their own tests
/// and whose pipeline parity test is red while `shift` and `norm` are the
/// port's values; `[pipeline] agent = true`, `body` has the agent too, an
/// example that imports the code and a quality test. Committed.
fn glued(sb: &Sandbox, shift: &str, norm: &str) -> String {
    sb.port(
        "glued",
        &[
            TestComponent::new("stem", "assert True"),
            TestComponent::new("body", "assert True"),
        ],
    );
    let spec = sb.repo().join("tests/local_tests/glued/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    let text = text.replacen("name = \"body\"\n", "name = \"body\"\nagent = true\n", 1);
    assert!(text.contains("agent = true"), "{text}");
    let pipeline = "\n[pipeline]\nparity_test = \"tests/local_tests/glued/test_glued_pipeline_parity.py\"\nexample = [\"python\", \"examples/glued.py\"]\nagent = true\n\n[quality]\ntests = [\"tests/ssim/test_glued_similarity.py\"]\n";
    std::fs::write(&spec, format!("{text}{pipeline}{AGENT}")).unwrap();
    std::fs::write(
        sb.repo()
            .join("tests/local_tests/glued/test_glued_pipeline_parity.py"),
        PIPELINE_TEST,
    )
    .unwrap();
    let tools = sb.repo().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/tinyport/tools/replay_agent.py"),
        tools.join("replay_agent.py"),
    )
    .unwrap();
    std::fs::create_dir_all(sb.repo().join("fastvideo")).unwrap();
    std::fs::write(sb.repo().join("fastvideo/__init__.py"), "").unwrap();
    std::fs::write(
        sb.repo().join("fastvideo/pipeline.py"),
        format!("SHIFT = {shift}\n"),
    )
    .unwrap();
    std::fs::write(
        sb.repo().join("fastvideo/mapping.py"),
        format!("NORM_1 = \"{norm}\"\n"),
    )
    .unwrap();
    // the example imports the port's code: it must be the fixed commit's
    std::fs::create_dir_all(sb.repo().join("examples")).unwrap();
    std::fs::write(
        sb.repo().join("examples/glued.py"),
        "from fastvideo import mapping, pipeline\nassert pipeline.SHIFT == 5.0, pipeline.SHIFT\nassert mapping.NORM_1 == 'blocks.1.norm.weight', mapping.NORM_1\nprint('wrote outputs/glued.mp4')\n",
    )
    .unwrap();
    write_quality(sb, "glued", "assert True");
    git(sb.repo(), &["init", "-q", "-b", "main"]);
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "base"]);
    git(sb.repo(), &["rev-parse", "HEAD"])
}

fn attempts(sb: &Sandbox, who: &str) -> Vec<serde_json::Value> {
    let ledger = fvd()
        .args(["attempts", "glued", who, "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&ledger.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&ledger)));
    json["attempts"].as_array().cloned().unwrap_or_default()
}

/// The status file reads as the contract's.
fn status_file_checks(sb: &Sandbox) -> String {
    let status_md = sb.repo().join("tests/local_tests/glued/PORT_STATUS.md");
    let check = fvd()
        .args(["contracts", "check"])
        .arg(&status_md)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", out(&check));
    std::fs::read_to_string(&status_md).unwrap()
}

/// The pipeline's glue is wrong (the scheduler shift): the pipeline's
/// agent gets a `pipeline_context` packet and fixes it; P9's example and
/// P10 run at its fix, and the porter's checkout is untouched.
#[test]
fn the_pipeline_agent_fixes_the_pipelines_own_glue_and_the_rest_runs_at_its_fix() {
    let sb = Sandbox::new();
    let base = glued(&sb, "3.0", "blocks.1.norm.weight");
    let patch = "diff --git a/fastvideo/pipeline.py b/fastvideo/pipeline.py\n--- a/fastvideo/pipeline.py\n+++ b/fastvideo/pipeline.py\n@@ -1 +1 @@\n-SHIFT = 3.0\n+SHIFT = 5.0\n";
    let handoff = pipeline_handoff(
        "phase_10_quality_regression",
        "none",
        "fastvideo/pipeline.py",
    );
    let expect = "pipeline_context:\nmode: pipeline-parity-debug\n- name: body\nscheduler shift 3.0 against the official 5.0\n";
    record(&sb, "pipeline_parity", 1, Some(patch), &handoff, expect);
    git(sb.repo(), &["add", "-A"]);
    git(
        sb.repo(),
        &["commit", "-q", "-m", "the pipeline agent's recording"],
    );

    let run = submit(&sb, "glued");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    let json = status(&sb, "glued");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    let outcomes = gate_outcomes(&json);
    assert!(outcomes.iter().any(|o| o == "P7 passed"), "{outcomes:?}");
    assert!(!outcomes.iter().any(|o| o == "P6 reopened"), "{outcomes:?}");
    let steps = attempts(&sb, "pipeline_parity");
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["handoff_status"], "valid", "{steps:?}");
    assert_eq!(
        component(&json, "pipeline_parity")["status"],
        "non_skip_pass",
        "{json}"
    );
    // the example imported the fix: it ran at the pipeline agent's commit
    assert!(text.contains("gate P9 passed: at "), "{text}");
    assert!(
        text.contains("the example `python examples/glued.py` exited 0"),
        "{text}"
    );
    assert!(
        text.contains("gate P10 passed: quality_glued_similarity non_skip_pass"),
        "{text}"
    );
    let logs = fvd()
        .args(["logs", "glued", "pipeline_example", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let first = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let logs: serde_json::Value =
        serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first}"));
    let commit = logs["run"]["commit"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!commit.is_empty() && commit != base, "{logs}");
    let fixed = git(
        sb.repo(),
        &["show", &format!("{commit}:fastvideo/pipeline.py")],
    );
    assert_eq!(fixed.trim(), "SHIFT = 5.0");
    let mine = std::fs::read_to_string(sb.repo().join("fastvideo/pipeline.py")).unwrap();
    assert_eq!(mine, "SHIFT = 3.0\n");
    let written = status_file_checks(&sb);
    assert!(written.contains("pipeline_parity"), "{written}");
}

/// The bug is a component's weight mapping: the pipeline's agent does not
/// patch around it but returns `return_to_phase_6` naming `body`; the port
/// goes back to P6, `body`'s agent gets the pipeline agent's evidence and
/// fixes it, and P7 passes at the fix without another pipeline attempt.
#[test]
fn the_pipeline_agents_return_to_phase_6_reopens_the_component_it_names() {
    let sb = Sandbox::new();
    glued(&sb, "5.0", "blocks.1.ln");
    let evidence = "body maps block 1's norm scale from blocks.1.ln instead of blocks.1.norm.weight (fastvideo/mapping.py)";
    let handoff = pipeline_handoff("return_to_phase_6", evidence, "none");
    record(
        &sb,
        "pipeline_parity",
        1,
        None,
        &handoff,
        "pipeline_context:\nreturn_to_phase_6\n",
    );
    let patch = "diff --git a/fastvideo/mapping.py b/fastvideo/mapping.py\n--- a/fastvideo/mapping.py\n+++ b/fastvideo/mapping.py\n@@ -1 +1 @@\n-NORM_1 = \"blocks.1.ln\"\n+NORM_1 = \"blocks.1.norm.weight\"\n";
    let body = "component: body\nmode: parity-debug\nfiles_changed: fastvideo/mapping.py\nofficial_files_used: official/body.py\nprototype_key_dumps: none\nport_state_file: tests/local_tests/glued/PORT_STATUS.md\nconcerns_or_unknowns: none: block 1's norm scale was mapped from the wrong key\nparity_test: tests/local_tests/generic/test_glued_body_parity.py\nparity_status: non_skip_pass\nproduction_loader_strictness: stateless\nstrict_load: not_run\npytest_output: 1 passed\nblocker: none\nconversion_retry_request: none\nreadme_updated: no\nnext_step: phase_6_continue\nescape_hatch: none\n";
    record(
        &sb,
        "body",
        1,
        Some(patch),
        body,
        "the pipeline's agent traced it to body\nblocks.1.ln instead of blocks.1.norm.weight\n",
    );
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "the agents' recordings"]);

    let run = submit(&sb, "glued");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "the pipeline's agent returned to phase 6 naming component body: back to P6 for body"
        ),
        "{text}"
    );
    let json = status(&sb, "glued");
    assert_eq!(
        (&json["phase"], &json["state"]),
        (&"P11".into(), &"waiting".into()),
        "{json}"
    );
    let outcomes = gate_outcomes(&json);
    let at = |what: &str| first_outcome(&outcomes, what);
    let refused = at("P7 refused");
    let reopened = at("P6 reopened");
    let passed = outcomes.iter().rposition(|o| o == "P7 passed").unwrap();
    assert!(refused < reopened && reopened < passed, "{outcomes:?}");
    // one attempt each: the pipeline's returned, body's fixed
    assert_eq!(attempts(&sb, "pipeline_parity").len(), 1);
    assert_eq!(attempts(&sb, "body").len(), 1);
    let written = status_file_checks(&sb);
    assert!(
        written.contains("the pipeline's agent returned to phase 6 for component `body`"),
        "{written}"
    );
}

/// A `return_to_phase_6` whose blockers name no component of the port is
/// not guessed at: P7 is refused with the agent's words, and nothing
/// reopens.
#[test]
fn a_return_to_phase_6_that_names_no_component_refuses_p7_and_reopens_nothing() {
    let sb = Sandbox::new();
    glued(&sb, "5.0", "blocks.1.ln");
    let handoff = pipeline_handoff(
        "return_to_phase_6",
        "a component's weights drift from block 1 on",
        "none",
    );
    record(
        &sb,
        "pipeline_parity",
        1,
        None,
        &handoff,
        "pipeline_context:\n",
    );
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "the agent's recording"]);
    let run = submit(&sb, "glued");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(
        text.contains("the pipeline's agent returned to phase 6, but its blockers name none of the port's components (stem, body): a component's weights drift from block 1 on"),
        "{text}"
    );
    let json = status(&sb, "glued");
    assert_eq!(json["phase"], "P7", "{json}");
    assert!(
        !gate_outcomes(&json).iter().any(|o| o == "P6 reopened"),
        "{json}"
    );
    assert_eq!(attempts(&sb, "body").len(), 0);
}

/// The pipeline's agent asks a person (`ask_user` with its escape hatch):
/// the question is raised at P7 and the port pauses (exit 3); the answer
/// reaches the agent's next packet, whose fix passes P7.
#[test]
fn the_pipeline_agents_question_is_asked_at_p7_and_its_answer_reaches_the_next_attempt() {
    let sb = Sandbox::new();
    glued(&sb, "3.0", "blocks.1.norm.weight");
    let hatch = "escape_hatch:\n    needs_user_input: yes\n    decision_type: ambiguity\n    question: Which scheduler shift should the pipeline default to, the official 5.0 or the preset's 3.0?\n    recommended_option: 5.0, the official default the parity test compares against\n    options:\n      - 5.0, the official default the parity test compares against\n      - 3.0, the preset's (the parity test must then change)\n    safe_default: none\n    blocked_until_answered: yes\n    state_snapshot:\n      phase: P7\n      files_changed:\n        - none\n      command_or_test: python3 -m pytest tests/local_tests/glued/test_glued_pipeline_parity.py\n      evidence: E001; the shift 3.0 drifts from the official 5.0\n";
    let ask = pipeline_handoff("ask_user", "none", "none")
        .replace("  escape_hatch: none\n", &format!("  {hatch}"));
    record(&sb, "pipeline_parity", 1, None, &ask, "pipeline_context:\n");
    let patch = "diff --git a/fastvideo/pipeline.py b/fastvideo/pipeline.py\n--- a/fastvideo/pipeline.py\n+++ b/fastvideo/pipeline.py\n@@ -1 +1 @@\n-SHIFT = 3.0\n+SHIFT = 5.0\n";
    let done = pipeline_handoff(
        "phase_10_quality_regression",
        "none",
        "fastvideo/pipeline.py",
    );
    record(
        &sb,
        "pipeline_parity",
        2,
        Some(patch),
        &done,
        "5.0, the official default\n",
    );
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "the agent's recording"]);

    let run = submit(&sb, "glued");
    let text = out(&run);
    assert_eq!(run.status.code(), Some(3), "{text}");
    assert!(
        text.contains("Which scheduler shift should the pipeline default to"),
        "{text}"
    );
    let json = status(&sb, "glued");
    let escapes = json["escapes"].as_array().cloned().unwrap_or_default();
    let e = escapes
        .iter()
        .find(|e| e["id"] == "E001")
        .unwrap_or_else(|| panic!("no E001 in {json}"));
    assert_eq!(e["component"], "pipeline_parity", "{e}");

    let answered = answer(&sb, "glued", "E001", "1");
    let text = out(&answered);
    assert_eq!(answered.status.code(), Some(0), "{text}");
    let json = status(&sb, "glued");
    assert_eq!(json["phase"], "P11", "{json}");
    assert_eq!(attempts(&sb, "pipeline_parity").len(), 2);
    assert_eq!(
        component(&json, "pipeline_parity")["status"],
        "non_skip_pass",
        "{json}"
    );
}
