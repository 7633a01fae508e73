//! Pipeline contracts: the Phase 7 packet sent to the pipeline skill once
//! every component is green, and the pipeline skill's handoff.

use crate::block::{Map, Value};
use crate::common::{
    ComponentType, DefinitionFile, ParityState, RunStatus, SourceLayout, YesNo, YesNoBlocked,
};
use crate::contract::{Contract, ask_user_rule, nested};
use crate::escape_hatch::EscapeHatch;
use crate::fields::{Slot, Text, block_struct, wire_enum};
use crate::findings::Finding;
use crate::kind::ContractKind;

wire_enum! {
    /// What the pipeline skill is asked to do.
    pub enum PipelineMode {
        PipelineDefinition = "pipeline-definition",
        PipelineParityDebug = "pipeline-parity-debug",
    }
}

block_struct! {
    /// Input and output modalities.
    pub struct Modalities { inputs: Text, outputs: Text }
}

block_struct! {
    /// How the official code is called, and where its defaults come from.
    pub struct OfficialCall {
        command_or_api: Text,
        args_and_defaults: Text,
        preset_source: Text,
        scheduler_and_rng: Text,
        output_contract: Text,
    }
}

block_struct! {
    /// What the converted `model_index.json` must name.
    pub struct ModelIndex {
        class_name: Text,
        entry_class_names: Text,
        required_modules: Text,
        passthrough_modules: Text,
    }
}

block_struct! {
    /// Sampling parameters to add.
    pub struct SamplingParamPlan {
        new_fields: Text,
        cli_fields: Text,
        placeholder_fields: Text,
    }
}

block_struct! {
    /// A component the pipeline will load.
    pub struct PipelineComponent {
        name: Text,
        component_type: ComponentType,
        parity_test: Text,
        parity_status: ParityState,
        fastvideo_target_files: Text,
        converted_component_dir: Text,
    }
}

block_struct! {
    /// Where the converted weights are.
    pub struct PipelineConversion {
        converted_weights_dir: Text,
        source_layout: SourceLayout,
        model_index_path: Text,
    }
}

block_struct! {
    /// The FastVideo files the pipeline work will write.
    pub struct FastvideoTargets {
        pipeline_files: Vec<Text>,
        stage_files: Vec<Text>,
        pipeline_config_files: Vec<Text>,
        preset_file: Text,
        registry_file: Text,
        example_files: Vec<Text>,
        smoke_test: Text,
        parity_test: Text,
    }
}

block_struct! {
    /// The inner fields of a `pipeline_context` packet.
    pub struct PipelineContext {
        model_family: Text,
        mode: PipelineMode,
        workload_types: Vec<Text>,
        modalities: Modalities,
        official_ref_dir: Text,
        official_pipeline_files: Vec<DefinitionFile>,
        official_call: OfficialCall,
        model_index: ModelIndex,
        sampling_param: SamplingParamPlan,
        components: Vec<PipelineComponent>,
        conversion: PipelineConversion,
        fastvideo_targets: FastvideoTargets,
        local_tests_readme: Text,
        port_state_file: Text,
        concerns_or_unknowns: Vec<Text>,
    }
}

impl Contract for PipelineContext {
    const KIND: ContractKind = ContractKind::PipelineContext;
    const ROOT: Option<&'static str> = Some("pipeline_context");

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        // Phase 7 starts only after every component, reused or ported, is green
        let items = match map.get("components").map(|e| &e.value) {
            Some(Value::List(items)) => items.as_slice(),
            _ => &[],
        };
        for (i, c) in self.components.iter().enumerate() {
            if !c.parity_status.is_pass() {
                let line = match items.get(i).map(|it| &it.value) {
                    Some(Value::Map(m)) => m.line_of("parity_status"),
                    _ => map.line_of("components"),
                };
                findings.push(Finding::new(
                    line,
                    format!("components[{i}].parity_status"),
                    "pipeline work starts only after non_skip_pass; return to phase 6",
                ));
            }
        }
    }
}

wire_enum! {
    /// Whether emitted and `model_index.json` modules agree.
    pub enum ModulesStatus { Match = "match", Mismatch = "mismatch", Blocked = "blocked" }
}

wire_enum! {
    /// How the pipeline class resolved against the registry.
    pub enum ClassResolution {
        ExactMatch = "exact_match",
        AliasAdded = "alias_added",
        Blocked = "blocked",
    }
}

wire_enum! {
    /// Status of the pipeline smoke test.
    pub enum SmokeStatus { NonSkipPass = "non_skip_pass", Blocked = "blocked", NotRun = "not_run" }
}

wire_enum! {
    /// Where the pipeline skill hands off to.
    pub enum PipelineNextStep {
        Phase10QualityRegression = "phase_10_quality_regression",
        ReturnToPhase6 = "return_to_phase_6",
        AskUser = "ask_user",
    }
}

block_struct! {
    /// Config modules emitted by the pipeline versus `model_index.json`.
    pub struct RequiredConfigModules { emitted: Text, model_index: Text, status: ModulesStatus }
}

block_struct! {
    /// Pipeline class resolution.
    pub struct PipelineClassResolution {
        model_index_class_name: Text,
        entry_class_names: Text,
        status: ClassResolution,
    }
}

block_struct! {
    /// Sampling parameters added.
    pub struct SamplingParamResult {
        fields_added: Text,
        cli_fields_added: Text,
        unknown_kwargs_checked: YesNoBlocked,
    }
}

block_struct! {
    /// The pipeline config written.
    pub struct PipelineConfigResult { file: Text, classes: Text, official_defaults_checked: YesNoBlocked }
}

block_struct! {
    /// Presets written.
    pub struct PresetsResult { file: Text, names: Text, status: RunStatus }
}

block_struct! {
    /// Registry entries.
    pub struct RegistryResult { status: RunStatus, detectors: Text }
}

block_struct! {
    /// The smoke test.
    pub struct SmokeTestResult { path: Text, status: SmokeStatus, pytest_output: Text }
}

block_struct! {
    /// The pipeline parity test.
    pub struct PipelineParityResult {
        path: Text,
        status: ParityState,
        pytest_output: Text,
        comparison_target: Text,
    }
}

block_struct! {
    /// The basic example.
    pub struct ExampleResult { path: Text, status: RunStatus, output: Text }
}

block_struct! {
    /// The inner fields of a `pipeline_handoff` block.
    pub struct PipelineHandoff {
        model_family: Text,
        mode: PipelineMode,
        files_changed: Vec<Text>,
        official_files_used: Vec<Text>,
        required_config_modules: RequiredConfigModules,
        pipeline_class_resolution: PipelineClassResolution,
        sampling_param: SamplingParamResult,
        stage_chain: Vec<Text>,
        pipeline_config: PipelineConfigResult,
        presets: PresetsResult,
        registry: RegistryResult,
        smoke_test: SmokeTestResult,
        pipeline_parity: PipelineParityResult,
        example: ExampleResult,
        readme_updated: YesNo,
        port_state_updated: YesNo,
        blockers: Vec<Text>,
        next_step: PipelineNextStep,
        escape_hatch: Slot<EscapeHatch>,
    }
}

impl Contract for PipelineHandoff {
    const KIND: ContractKind = ContractKind::PipelineHandoff;
    const ROOT: Option<&'static str> = Some("pipeline_handoff");

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        ask_user_rule(
            self.next_step == PipelineNextStep::AskUser,
            &self.escape_hatch,
            map,
            findings,
        );
        let no_blockers = self.blockers.is_empty()
            || self
                .blockers
                .iter()
                .all(|b| b.known().is_some_and(|s| s == "none"));
        if self.mode == PipelineMode::PipelineDefinition
            && self.pipeline_parity.status == ParityState::ScaffoldSkip
            && no_blockers
        {
            findings.push(Finding::new(
                nested(map, "pipeline_parity").line_of("status"),
                "pipeline_parity.status",
                "scaffold_skip requires the exact missing dependency, weight or call-path blocker in blockers",
            ));
        }
    }
}
