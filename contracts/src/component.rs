//! Per-component contracts: the context packet sent to component subagents,
//! the parity status returned by the parity skill, and the component skill
//! handoff returned by the port skills.

use crate::block::Map;
use crate::common::{
    ComponentType, CoverageScope, DefinitionFile, InstantiationFile, LoaderStrictness, ParityState,
    StrictLoad, YesNo,
};
use crate::contract::{Contract, ask_user_rule};
use crate::conversion::ConversionRetryRequest;
use crate::escape_hatch::EscapeHatch;
use crate::fields::{Slot, Text, Val, block_struct, wire_enum};
use crate::findings::Finding;
use crate::kind::ContractKind;

wire_enum! {
    /// What a component subagent is asked to do.
    pub enum ComponentMode {
        ParityScaffold = "parity-scaffold",
        Prototype = "prototype",
        ParityDebug = "parity-debug",
    }
}

block_struct! {
    /// Paths of the Phase 4 state-dict key dumps (`planned` or `unknown` early).
    pub struct KeyDumps {
        official: Text,
        fastvideo: Text,
    }
}

block_struct! {
    /// What conversion knows about this component so far.
    pub struct ComponentConversion {
        script: Text,
        converted_component_dir: Text,
        model_index_library: Text,
        config_file: Text,
        mapping_notes: Text,
        production_loader_strictness: Val<LoaderStrictness>,
        strict_load: StrictLoad,
    }
}

block_struct! {
    /// The inner fields of a `component_context` packet.
    pub struct ComponentContext {
        model_family: Text,
        component: Text,
        component_type: ComponentType,
        mode: ComponentMode,
        official_ref_dir: Text,
        official_definition_files: Vec<DefinitionFile>,
        official_instantiation_files: Vec<InstantiationFile>,
        official_weight_source: Text,
        fastvideo_target_files: Vec<Text>,
        local_tests_readme: Text,
        port_state_file: Text,
        parity_test: Text,
        prototype_key_dumps: KeyDumps,
        conversion: ComponentConversion,
        concerns_or_unknowns: Vec<Text>,
    }
}

impl Contract for ComponentContext {
    const KIND: ContractKind = ContractKind::ComponentContext;
    const ROOT: Option<&'static str> = Some("component_context");

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        // component skills refuse to start without these; catch it before dispatch
        for (field, empty) in [
            (
                "official_definition_files",
                self.official_definition_files.is_empty(),
            ),
            (
                "official_instantiation_files",
                self.official_instantiation_files.is_empty(),
            ),
        ] {
            if empty {
                findings.push(Finding::new(
                    map.line_of(field),
                    field,
                    "must list at least one file, or unknown plus the search performed",
                ));
            }
        }
    }
}

block_struct! {
    /// One row of `component_parity`.
    pub struct ComponentParity {
        component: Text,
        test: Text,
        status: ParityState,
        missing: Text,
        coverage_scope: CoverageScope,
        official_definition_files: Vec<Text>,
        official_instantiation_files: Vec<Text>,
        concerns_or_unknowns: Vec<Text>,
    }
}

block_struct! {
    /// The pipeline parity test and its status.
    pub struct PipelineParity {
        test: Text,
        status: ParityState,
    }
}

block_struct! {
    /// The parity skill's status report.
    pub struct ParityStatus {
        component_parity: Vec<ComponentParity>,
        pipeline_parity: PipelineParity,
        local_tests_readme: Text,
        port_state_file: Text,
        notes: Vec<Text>,
        escape_hatch: Slot<EscapeHatch>,
    }
}

impl ParityStatus {
    /// Whether every listed component reached a non-skip pass (Phase 7 gate).
    pub fn all_components_pass(&self) -> bool {
        !self.component_parity.is_empty()
            && self.component_parity.iter().all(|c| c.status.is_pass())
    }
}

impl Contract for ParityStatus {
    const KIND: ContractKind = ContractKind::ParityStatus;
    const ROOT: Option<&'static str> = None;

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        let asks = self
            .escape_hatch
            .block()
            .is_some_and(|h| h.needs_user_input == YesNo::Yes);
        ask_user_rule(asks, &self.escape_hatch, map, findings);
        if self
            .component_parity
            .iter()
            .any(|c| c.status == ParityState::NotStarted)
        {
            findings.push(Finding::new(
                map.line_of("component_parity"),
                "component_parity",
                "component status not_started is not allowed here; expected scaffold_skip | debug_red | non_skip_pass | blocked",
            ));
        }
    }
}

wire_enum! {
    /// Mode of a component skill run.
    pub enum SkillMode { Prototype = "prototype", ParityDebug = "parity-debug" }
}

wire_enum! {
    /// Where a component skill hands off to.
    pub enum SkillNextStep {
        Phase5Conversion = "phase_5_conversion",
        Phase5ConversionRetry = "phase_5_conversion_retry",
        Phase6Continue = "phase_6_continue",
        AskUser = "ask_user",
        Blocked = "blocked",
    }
}

block_struct! {
    /// What a component port skill returns.
    pub struct ComponentSkillHandoff {
        component: Text,
        mode: SkillMode,
        files_changed: Vec<Text>,
        official_files_used: Vec<Text>,
        prototype_key_dumps: Text,
        port_state_file: Text,
        concerns_or_unknowns: Vec<Text>,
        parity_test: Text,
        parity_status: ParityState,
        production_loader_strictness: LoaderStrictness,
        strict_load: StrictLoad,
        pytest_output: Text,
        blocker: Text,
        /// `none`, a short description, or a full retry request block.
        conversion_retry_request: Slot<ConversionRetryRequest>,
        readme_updated: YesNo,
        next_step: SkillNextStep,
        escape_hatch: Slot<EscapeHatch>,
    }
}

impl Contract for ComponentSkillHandoff {
    const KIND: ContractKind = ContractKind::ComponentSkillHandoff;
    const ROOT: Option<&'static str> = None;

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        ask_user_rule(
            self.next_step == SkillNextStep::AskUser,
            &self.escape_hatch,
            map,
            findings,
        );
        if self.mode == SkillMode::Prototype
            && !matches!(
                self.parity_status,
                ParityState::ScaffoldSkip | ParityState::Blocked
            )
        {
            findings.push(Finding::new(
                map.line_of("parity_status"),
                "parity_status",
                "in prototype mode must be scaffold_skip or blocked",
            ));
        }
        if self.next_step == SkillNextStep::Phase5ConversionRetry
            && matches!(self.conversion_retry_request, Slot::None)
        {
            findings.push(Finding::new(
                map.line_of("conversion_retry_request"),
                "conversion_retry_request",
                "next_step phase_5_conversion_retry requires a conversion retry request, not none",
            ));
        }
        if self.production_loader_strictness == LoaderStrictness::NonStrictWithAllowedKeys
            && self.strict_load == StrictLoad::Pass
        {
            findings.push(Finding::new(
                map.line_of("strict_load"),
                "strict_load",
                "a non-strict loader must report pass_with_documented_exclusions",
            ));
        }
    }
}
