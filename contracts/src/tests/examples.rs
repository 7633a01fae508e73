//! Valid example blocks of every contract, written for these tests (not
//! copied from the contract templates), plus helpers to break them one
//! field at a time.

pub const ESCAPE_NESTED: &str = "escape_hatch:
  needs_user_input: yes
  decision_type: dependency
  question: Install the private attention fork into the shared env?
  recommended_option: stub the fork for reference-only parity
  options:
    - stub the fork; parity stays reference-only
    - install the fork; core pins change
  safe_default: none
  blocked_until_answered: yes
  state_snapshot:
    phase: P0
    files_changed:
      - tests/local_tests/wan22_mini/PORT_STATUS.md
    command_or_test: python -c \"import inference\"
    evidence: E001; ModuleNotFoundError for the fork
";

pub const PREP: &str = "model_family: wan22_mini
workload_types: T2V
official_ref: https://github.com/example/wan22-mini
official_ref_dir: Wan22Mini/
official_ref_commit: unknown (searched: git -C Wan22Mini log -1 on a shallow clone)
hf_weights_path: example/Wan22-Mini
hf_revision: default
local_weights_dir: official_weights/wan22_mini
source_layout: raw_official
model_index_class: none
components_seen:
  - transformer
  - vae
  - text_encoder
needs_conversion: yes
hf_token_env: HF_TOKEN
dependency_changes: installed no-deps editable
official_env_status: imports_ok
local_tests_readme: tests/local_tests/wan22_mini/README.md
port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
gitignore_entries_added:
  - Wan22Mini/
  - official_weights/
next_step: add-model
open_questions: none
escape_hatch: none
";

pub const COMPONENT_CONTEXT: &str = "component_context:
  model_family: wan22_mini
  component: vae
  component_type: vae
  mode: prototype
  official_ref_dir: Wan22Mini/
  official_definition_files:
    - path: Wan22Mini/models/vae.py
      symbols: MiniVAE
      notes: causal conv3d encoder, latent stats in config
  official_instantiation_files:
    - path: Wan22Mini/inference.py
      symbols: setup_models
      args: z_dim=16, scale from config
  official_weight_source: Wan22_VAE.pth
  fastvideo_target_files:
    - fastvideo/models/vaes/wanvae.py
    - fastvideo/configs/models/vaes/wanvae.py
  local_tests_readme: tests/local_tests/wan22_mini/README.md
  port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
  parity_test: tests/local_tests/vaes/test_wan22_mini_vae_parity.py
  prototype_key_dumps:
    official: planned
    fastvideo: planned
  conversion:
    script: not_created
    converted_component_dir: not_created
    model_index_library: diffusers
    config_file: config.json
    mapping_notes: unknown (searched: no key dump yet)
    production_loader_strictness: strict
    strict_load: not_run
  concerns_or_unknowns:
    - official encode returns normalized latents
";

pub const PARITY_STATUS: &str = "component_parity:
  - component: transformer
    test: tests/local_tests/transformers/test_wan22_mini_transformer_parity.py
    status: scaffold_skip
    missing: fastvideo_class
    coverage_scope: production_loader
    official_definition_files: Wan22Mini/models/dit.py
    official_instantiation_files: Wan22Mini/inference.py
    concerns_or_unknowns: none
  - component: vae
    test: tests/local_tests/vaes/test_wan22_mini_vae_parity.py
    status: non_skip_pass
    missing: none
    coverage_scope: both
    official_definition_files: Wan22Mini/models/vae.py
    official_instantiation_files: Wan22Mini/inference.py
    concerns_or_unknowns: none
pipeline_parity:
  test: not-created
  status: not_started
local_tests_readme: tests/local_tests/wan22_mini/README.md
port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
notes: transformer waits for the phase 4 prototype
escape_hatch: none
";

pub const CONVERSION_REQUEST: &str = "model_family: wan22_mini
source_layout: raw_official
official_weights: example/Wan22-Mini
hf_revision: default
converted_weights_dir: converted_weights/wan22_mini
local_tests_readme: tests/local_tests/wan22_mini/README.md
port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
components:
  - name: transformer
    component_type: dit
    official_definition_files: Wan22Mini/models/dit.py MiniDiT
    official_instantiation_files: Wan22Mini/inference.py setup_models dim=1536
    official_weight_source: dit/model.safetensors
    official_keys: converted_weights/wan22_mini/_mapping/transformer_official_keys.json
    fastvideo_keys: converted_weights/wan22_mini/_mapping/transformer_fastvideo_keys.json
    fastvideo_class: WanTransformer3DModel
    model_index_library: diffusers
    config_filename: config.json
    production_loader_strictness: strict
    source_prefix_or_path: model.
    parity_test: tests/local_tests/transformers/test_wan22_mini_transformer_parity.py
    prototype_concerns_or_unknowns: none
";

pub const RETRY: &str = "conversion_retry_request:
  component: transformer
  parity_test: tests/local_tests/transformers/test_wan22_mini_transformer_parity.py
  failing_keys: blocks.0.attn.qkv.weight vs blocks.0.attn1.to_q.weight
  expected_actual_shapes: [4608, 1536] vs [1536, 1536]
  source_prefix_or_path: model.blocks
  evidence: strict load reports 120 unexpected keys
  suspected_fix: split
";

pub const CONVERSION_HANDOFF: &str =
    "conversion_script: scripts/checkpoint_conversion/wan22_mini_to_diffusers.py
source_layout: raw_official
converted_weights_dir: converted_weights/wan22_mini
port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
components_written:
  - transformer
  - vae
passthrough_components: text_encoder
strict_load: pass
component_context_updates:
  - component: transformer
    converted_component_dir: converted_weights/wan22_mini/transformer
    model_index_library: diffusers
    config_file: config.json
    config_validation: pass
    mapping_notes: qkv split into to_q/to_k/to_v
    production_loader_strictness: strict
    strict_load: pass
    retry_resolved: not_a_retry
    concerns_or_unknowns: none
blocked_on: none
next_step: phase_6_component_parity_debug
escape_hatch: none
";

pub const SKILL_HANDOFF: &str = "component: vae
mode: prototype
files_changed:
  - fastvideo/configs/models/vaes/wanvae.py
official_files_used: Wan22Mini/models/vae.py, Wan22Mini/inference.py
prototype_key_dumps: converted_weights/wan22_mini/_mapping/vae_official_keys.json
port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
concerns_or_unknowns: none
parity_test: tests/local_tests/vaes/test_wan22_mini_vae_parity.py
parity_status: scaffold_skip
production_loader_strictness: strict
strict_load: not_run
pytest_output: pytest tests/local_tests/vaes/test_wan22_mini_vae_parity.py -> 1 skipped
blocker: none
conversion_retry_request: none
readme_updated: yes
next_step: phase_5_conversion
escape_hatch: none
";

pub const PIPELINE_CONTEXT: &str = "pipeline_context:
  model_family: wan22_mini
  mode: pipeline-definition
  workload_types:
    - T2V
  modalities:
    inputs: text
    outputs: video
  official_ref_dir: Wan22Mini/
  official_pipeline_files:
    - path: Wan22Mini/pipeline.py
      symbols: MiniPipeline.__call__
      notes: cfg then scheduler step then decode
  official_call:
    command_or_api: python Wan22Mini/generate.py
    args_and_defaults: 480x832, 81 frames, 50 steps, cfg 5.0
    preset_source: Wan22Mini/configs/t2v.py
    scheduler_and_rng: flow match euler, shift 5.0, torch.Generator on cpu
    output_contract: decoded video frames in [0, 1]
  model_index:
    class_name: Wan22MiniPipeline
    entry_class_names: Wan22MiniPipeline
    required_modules: text_encoder, tokenizer, vae, transformer, scheduler
    passthrough_modules: tokenizer
  sampling_param:
    new_fields: none
    cli_fields: none
    placeholder_fields: none
  components:
    - name: transformer
      component_type: dit
      parity_test: tests/local_tests/transformers/test_wan22_mini_transformer_parity.py
      parity_status: non_skip_pass
      fastvideo_target_files: fastvideo/models/dits/wanvideo.py
      converted_component_dir: converted_weights/wan22_mini/transformer
  conversion:
    converted_weights_dir: converted_weights/wan22_mini
    source_layout: raw_official
    model_index_path: converted_weights/wan22_mini/model_index.json
  fastvideo_targets:
    pipeline_files:
      - fastvideo/pipelines/basic/wan22_mini/wan22_mini_pipeline.py
    stage_files: none
    pipeline_config_files:
      - fastvideo/configs/pipelines/wan22_mini.py
    preset_file: fastvideo/pipelines/basic/wan22_mini/presets.py
    registry_file: fastvideo/registry.py
    example_files:
      - examples/inference/basic/basic_wan22_mini.py
    smoke_test: tests/local_tests/pipelines/test_wan22_mini_pipeline_smoke.py
    parity_test: tests/local_tests/pipelines/test_wan22_mini_pipeline_parity.py
  local_tests_readme: tests/local_tests/wan22_mini/README.md
  port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
  concerns_or_unknowns: none
";

pub const PIPELINE_HANDOFF: &str = "pipeline_handoff:
  model_family: wan22_mini
  mode: pipeline-definition
  files_changed:
    - fastvideo/pipelines/basic/wan22_mini/wan22_mini_pipeline.py
    - fastvideo/registry.py
  official_files_used:
    - Wan22Mini/pipeline.py
  required_config_modules:
    emitted: text_encoder, tokenizer, vae, transformer, scheduler
    model_index: text_encoder, tokenizer, vae, transformer, scheduler
    status: match
  pipeline_class_resolution:
    model_index_class_name: Wan22MiniPipeline
    entry_class_names: Wan22MiniPipeline
    status: exact_match
  sampling_param:
    fields_added: none
    cli_fields_added: none
    unknown_kwargs_checked: yes
  stage_chain:
    - InputValidationStage
    - TextEncodingStage
    - DenoisingStage
    - DecodingStage
  pipeline_config:
    file: fastvideo/configs/pipelines/wan22_mini.py
    classes: Wan22MiniT2VConfig
    official_defaults_checked: yes
  presets:
    file: fastvideo/pipelines/basic/wan22_mini/presets.py
    names: wan22_mini_t2v
    status: pass
  registry:
    status: pass
    detectors: example/Wan22-Mini, Wan22MiniPipeline
  smoke_test:
    path: tests/local_tests/pipelines/test_wan22_mini_pipeline_smoke.py
    status: non_skip_pass
    pytest_output: 2 passed
  pipeline_parity:
    path: tests/local_tests/pipelines/test_wan22_mini_pipeline_parity.py
    status: non_skip_pass
    pytest_output: 1 passed
    comparison_target: latents
  example:
    path: examples/inference/basic/basic_wan22_mini.py
    status: pass
    output: outputs_video/wan22_mini.mp4
  readme_updated: yes
  port_state_updated: yes
  blockers: none
  next_step: phase_10_quality_regression
  escape_hatch: none
";

pub const FINAL: &str = "final_handoff:
  prep_handoff_complete: yes
  conversion_status: pass
  components:
    - name: transformer
      reuse_or_port: ported
      parity_test: tests/local_tests/transformers/test_wan22_mini_transformer_parity.py
      parity_status: non_skip_pass
      concerns_or_unknowns: none
    - name: vae
      reuse_or_port: reused
      parity_test: tests/local_tests/vaes/test_wan22_mini_vae_parity.py
      parity_status: non_skip_pass
      concerns_or_unknowns: none
  pipeline_smoke: pass
  pipeline_parity: pass
  example_status: pass
  quality_regression: added
  local_tests_readme: tests/local_tests/wan22_mini/README.md
  port_state_file: tests/local_tests/wan22_mini/PORT_STATUS.md
  token_values_committed: no
  runtime_third_party_model_imports: none
  blockers: none
  escape_hatch: none
";

/// A token-shaped value for the secret tests; built at run time so no
/// token-looking literal sits in the source.
pub fn fake_hf_token() -> String {
    format!("hf_{}", "Zq7".repeat(12))
}

/// `text` with the first line whose trimmed form starts with `key:` replaced
/// by `replacement` (keeping its indentation), or removed when `None`.
pub fn edit(text: &str, key: &str, replacement: Option<&str>) -> String {
    let prefix = format!("{key}:");
    let mut done = false;
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if !done && (t.starts_with(&prefix) || t.starts_with(&format!("- {prefix}"))) {
            done = true;
            if let Some(r) = replacement {
                let indent = &line[..line.len() - t.len()];
                out.push_str(indent);
                out.push_str(r);
                out.push('\n');
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    assert!(done, "no line for {key}");
    out
}

/// Replaces a whole `key: …` line (and the block nested under it) at the top
/// level with `replacement`.
pub fn replace_block(text: &str, key: &str, replacement: &str) -> String {
    let prefix = format!("{key}:");
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if skipping {
            if line.starts_with(' ') {
                continue;
            }
            skipping = false;
        }
        if line.starts_with(&prefix) {
            out.push_str(replacement);
            if !replacement.ends_with('\n') {
                out.push('\n');
            }
            skipping = true;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
