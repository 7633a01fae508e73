//! The pipeline's own agent (issue #42, P7): a pipeline step's packet is a
//! `pipeline_context` block and its agent hands back a `pipeline_handoff`.
//! The attempt machinery is the component's: only what the agent reads and
//! what fvd reads back differ. `return_to_phase_6` stops the step's loop;
//! the gate then sends the port back to P6 for the component the handoff's
//! blockers name.

use std::collections::BTreeMap;

use fvd_contracts::Contract;
use fvd_contracts::pipeline::{PipelineHandoff, PipelineNextStep};
use fvd_spec::ComponentSpec;
use fvd_store::states::HandoffStatus;

use super::{AskedAt, HandoffRead, LastRun, kept_text, one_line, pick_block};

/// What a pipeline step's packet says of the rest of the port: the
/// components the pipeline loads (all passing: P7 starts only then) and
/// the pipeline's declared tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineFacts {
    pub components: Vec<PortComponent>,
    pub smoke_test: Option<String>,
    pub parity_test: Option<String>,
    pub comparison_target: Option<String>,
    pub example: Vec<String>,
}

/// A component of the port, as the pipeline's packet lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortComponent {
    pub name: String,
    pub component_type: String,
    pub parity_test: String,
}

impl PipelineFacts {
    /// The facts of `spec`'s pipeline.
    pub fn of(spec: &fvd_spec::PortSpec) -> PipelineFacts {
        let p = spec.pipeline.clone().unwrap_or_default();
        PipelineFacts {
            components: spec
                .parity_components()
                .map(|c| PortComponent {
                    name: c.name.clone(),
                    component_type: c.component_type.to_string(),
                    parity_test: c.parity_tests.join(", "),
                })
                .collect(),
            smoke_test: p.smoke_test,
            parity_test: p.parity_test,
            comparison_target: p.comparison_target,
            example: p.example,
        }
    }
}

/// The mode a step's agent works in: the smoke test asks for a pipeline
/// that runs at all (`pipeline-definition`), the parity test for one that
/// matches (`pipeline-parity-debug`).
pub fn mode(spec: &ComponentSpec) -> &'static str {
    if spec.name == fvd_spec::later::SMOKE_STEP {
        "pipeline-definition"
    } else {
        "pipeline-parity-debug"
    }
}

/// The `pipeline_context` block of a step's packet. What `port.toml` does
/// not say is `unknown`, with where fvd looked.
pub(super) fn context(
    family: &str,
    spec: &ComponentSpec,
    prep: &BTreeMap<String, String>,
    facts: &PipelineFacts,
    last: &LastRun<'_>,
) -> String {
    let get = |k: &str| {
        prep.get(k)
            .filter(|v| !v.is_empty())
            .map(|v| one_line(v))
            .unwrap_or_else(|| format!("unknown (searched: prep.{k} of port.toml)"))
    };
    let unknown = "unknown (searched: port.toml)";
    let or_unknown = |v: &Option<String>| v.as_deref().map(one_line).unwrap_or(unknown.into());
    let mut components = String::new();
    for c in &facts.components {
        components.push_str(&format!(
            "    - name: {}\n      component_type: {}\n      parity_test: {}\n      parity_status: non_skip_pass\n      fastvideo_target_files: unknown (searched: port.toml names none; the parity test imports them)\n      converted_component_dir: {}\n",
            c.name,
            c.component_type,
            one_line(&c.parity_test),
            get("converted_weights_dir"),
        ));
    }
    if components.is_empty() {
        components.push_str("    none\n");
    }
    let layout = match prep.get("source_layout").map(|s| s.trim()) {
        Some(
            l @ ("diffusers"
            | "raw_official"
            | "monolithic"
            | "separate_components"
            | "mixed"
            | "custom"),
        ) => l.to_string(),
        _ => "custom".into(),
    };
    let example = if facts.example.is_empty() {
        unknown.to_string()
    } else {
        one_line(&facts.example.join(" "))
    };
    let mut concerns = one_line(&format!(
        "{} is {}: {}",
        spec.name, last.verdict, last.reason
    ));
    if let Some(t) = &facts.comparison_target {
        concerns = format!(
            "{concerns}; the parity test compares against {}",
            one_line(t)
        );
    }
    format!(
        "pipeline_context:
  model_family: {family}
  mode: {mode}
  workload_types:
    - {workloads}
  modalities:
    inputs: {unknown}
    outputs: {unknown}
  official_ref_dir: {ref_dir}
  official_pipeline_files:
    - path: {unknown}
      symbols: {unknown}
      notes: search {ref_dir}
  official_call:
    command_or_api: {unknown}
    args_and_defaults: {unknown}
    preset_source: {unknown}
    scheduler_and_rng: {unknown}
    output_contract: {unknown}
  model_index:
    class_name: {class}
    entry_class_names: {class}
    required_modules: {unknown}
    passthrough_modules: {unknown}
  sampling_param:
    new_fields: {unknown}
    cli_fields: {unknown}
    placeholder_fields: {unknown}
  components:
{components}  conversion:
    converted_weights_dir: {converted}
    source_layout: {layout}
    model_index_path: {unknown}
  fastvideo_targets:
    pipeline_files:
      - {unknown}
    stage_files: none
    pipeline_config_files:
      - {unknown}
    preset_file: {unknown}
    registry_file: {unknown}
    example_files:
      - {example}
    smoke_test: {smoke}
    parity_test: {parity}
  local_tests_readme: {readme}
  port_state_file: {state}
  concerns_or_unknowns:
    - {concerns}
",
        mode = mode(spec),
        workloads = get("workload_types"),
        ref_dir = get("official_ref_dir"),
        class = get("model_index_class"),
        converted = get("converted_weights_dir"),
        smoke = or_unknown(&facts.smoke_test),
        parity = or_unknown(&facts.parity_test),
        readme = get("local_tests_readme"),
        state = get("port_state_file"),
    )
}

/// The rules of a pipeline step's packet, after the ones every agent gets.
pub(super) fn rules(spec: &ComponentSpec, next_escape_id: &str, handoff_file: &str) -> String {
    format!(
        "- Fix the pipeline's own code (its stages, glue, scheduler defaults, presets) until the test above is a non-skip pass.\n\
- Do not patch around a component, the conversion or strict loading in the pipeline: when the evidence points at a component's code or weights, return `next_step: return_to_phase_6` and name that component (one of `components` above, by name) in `blockers` with the exact failing evidence; fvd sends the port back to P6 for it.\n\
- If a decision needs a person, return `next_step: ask_user` with an `escape_hatch` whose evidence cites {next_escape_id}.\n\n\
## Handoff\n\n\
When done, write a `pipeline_handoff` block (the contract's fields, `mode: {mode}`) to `{handoff_file}`, or print it as the last block of your output.\n",
        mode = mode(spec),
    )
}

/// The `pipeline_handoff` a step's agent returned (see
/// [`super::read_handoff_of`] for where it is looked for).
pub fn read_handoff_of(structured: Option<&str>, file: Option<&str>, text: &str) -> HandoffRead {
    let Some((block, source)) = pick_block(structured, file, text, "pipeline_handoff:") else {
        return HandoffRead::missing("pipeline_handoff");
    };
    let checked = PipelineHandoff::check(&block, 1);
    let text = kept_text(&block);
    let findings: Vec<String> = checked.findings.iter().map(|f| f.to_string()).collect();
    let Some(v) = checked.value.filter(|_| findings.is_empty()) else {
        let why = match findings.is_empty() {
            true => "the block could not be read".to_string(),
            false => findings.join("; "),
        };
        return HandoffRead {
            status: HandoffStatus::Invalid,
            summary: one_line(&why),
            text,
            value: None,
            pipeline: None,
            source,
        };
    };
    let files = v
        .files_changed
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    HandoffRead {
        status: HandoffStatus::Valid,
        summary: one_line(&format!(
            "smoke={} parity={} next_step={} files_changed={} blockers={}",
            v.smoke_test.status.as_str(),
            v.pipeline_parity.status.as_str(),
            v.next_step.as_str(),
            if files.is_empty() { "none" } else { &files },
            blockers(&v),
        )),
        text,
        value: None,
        pipeline: Some(v),
        source,
    }
}

/// The handoff's blockers, on one line.
pub fn blockers(h: &PipelineHandoff) -> String {
    let all: Vec<String> = h
        .blockers
        .iter()
        .map(|b| one_line(&b.to_string()))
        .collect();
    match all.is_empty() {
        true => "none".into(),
        false => all.join("; "),
    }
}

/// Why a pipeline step's loop stops after this handoff: the agent sends
/// the port back to P6 (the gate picks the component from its blockers).
pub(super) fn stop_reason(h: &PipelineHandoff) -> Option<String> {
    (h.next_step == PipelineNextStep::ReturnToPhase6)
        .then(|| format!("the pipeline's agent returns to phase 6: {}", blockers(h)))
}

/// The one component of `names` that the blockers of a `return_to_phase_6`
/// handoff name as a whole word; `Err` says why none can be chosen (none
/// named, or several).
pub fn named_component<'a>(h: &PipelineHandoff, names: &'a [String]) -> Result<&'a str, String> {
    let text = blockers(h);
    let words: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .collect();
    let named: Vec<&'a str> = names
        .iter()
        .filter(|n| words.contains(&n.as_str()))
        .map(String::as_str)
        .collect();
    match named.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "its blockers name none of the port's components ({}): {text}",
            names.join(", ")
        )),
        many => Err(format!(
            "its blockers name several components ({}), so fvd cannot tell which to reopen: {text}",
            many.join(", ")
        )),
    }
}

/// [`super::with_question`] for a pipeline step: `hatch` (`next_step:
/// ask_user` and its `escape_hatch`, at P7) replaces the agent's own next
/// step and hatch in its `pipeline_handoff`; without a valid one of its
/// own, the block is what fvd knows (the step's test and verdict, the files
/// changed as `files`, nothing claimed passed).
pub(super) fn with_question(
    read: &HandoffRead,
    hatch: &str,
    at: &AskedAt<'_>,
    mode: &str,
    files: &str,
) -> HandoffRead {
    let mut block = String::new();
    if read.pipeline.is_some() && read.status == HandoffStatus::Valid {
        // the agent's block without its next step and hatch (a field of the
        // root and the lines indented under it)
        let mut skipping = false;
        for line in read.text.lines() {
            let depth = line.len() - line.trim_start().len();
            if depth <= 2 {
                let field = line.trim_start();
                skipping = depth == 2
                    && (field.starts_with("next_step:") || field.starts_with("escape_hatch:"));
            }
            if !skipping {
                block.push_str(line);
                block.push('\n');
            }
        }
    } else {
        let smoke = at.component == fvd_spec::later::SMOKE_STEP;
        let (smoke_path, parity_path) = match smoke {
            true => (one_line(at.parity_test), "none".to_string()),
            false => ("none".to_string(), one_line(at.parity_test)),
        };
        // the contract's words for the step's last verdict: a failure that
        // is not a numeric one (an error, a timeout) is `blocked`
        let parity = match at.parity_status {
            v @ ("non_skip_pass" | "debug_red" | "scaffold_skip" | "blocked") => v,
            _ => "blocked",
        };
        let smoke_status = match at.parity_status {
            "non_skip_pass" => "non_skip_pass",
            _ => "blocked",
        };
        block = format!(
            "pipeline_handoff:\n  model_family: unknown\n  mode: {mode}\n  files_changed:{files}  official_files_used: none\n  required_config_modules:\n    emitted: unknown\n    model_index: unknown\n    status: blocked\n  pipeline_class_resolution:\n    model_index_class_name: unknown\n    entry_class_names: unknown\n    status: blocked\n  sampling_param:\n    fields_added: none\n    cli_fields_added: none\n    unknown_kwargs_checked: blocked\n  stage_chain: none\n  pipeline_config:\n    file: unknown\n    classes: unknown\n    official_defaults_checked: blocked\n  presets:\n    file: none\n    names: none\n    status: not_run\n  registry:\n    status: not_run\n    detectors: unknown\n  smoke_test:\n    path: {smoke_path}\n    status: {}\n    pytest_output: {evidence}\n  pipeline_parity:\n    path: {parity_path}\n    status: {}\n    pytest_output: {evidence}\n    comparison_target: unknown\n  example:\n    path: unknown\n    status: not_run\n    output: none\n  readme_updated: no\n  port_state_updated: no\n  blockers: none\n",
            if smoke { smoke_status } else { "not_run" },
            if smoke { "not_started" } else { parity },
            evidence = one_line(at.evidence),
        );
    }
    for line in hatch.lines() {
        block.push_str("  ");
        block.push_str(line);
        block.push('\n');
    }
    let mut merged = read_handoff_of(None, Some(&block), "");
    merged.source = "ask_user";
    merged
}
