//! Conversion contracts: the Phase 5 request, the Phase 6 retry request a
//! component skill sends instead of patching conversion itself, and the
//! conversion skill's handoff.

use crate::block::{Map, Value};
use crate::common::{ComponentType, LoaderStrictness, SourceLayout, StrictLoad};
use crate::contract::{Contract, ask_user_rule};
use crate::escape_hatch::EscapeHatch;
use crate::fields::{Slot, Text, Val, block_struct, wire_enum};
use crate::findings::Finding;
use crate::kind::ContractKind;

block_struct! {
    /// One component to convert.
    pub struct ConversionComponent {
        name: Text,
        component_type: ComponentType,
        official_definition_files: Text,
        official_instantiation_files: Text,
        official_weight_source: Text,
        /// Path of the Phase 4 official key/shape dump.
        official_keys: Text,
        /// Path of the Phase 4 FastVideo prototype key/shape dump.
        fastvideo_keys: Text,
        fastvideo_class: Text,
        model_index_library: Text,
        config_filename: Text,
        production_loader_strictness: LoaderStrictness,
        source_prefix_or_path: Text,
        parity_test: Text,
        prototype_concerns_or_unknowns: Vec<Text>,
    }
}

block_struct! {
    /// The initial Phase 5 conversion request.
    pub struct ConversionRequest {
        model_family: Text,
        source_layout: SourceLayout,
        official_weights: Text,
        hf_revision: Text,
        converted_weights_dir: Text,
        local_tests_readme: Text,
        port_state_file: Text,
        components: Vec<ConversionComponent>,
    }
}

impl Contract for ConversionRequest {
    const KIND: ContractKind = ContractKind::ConversionRequest;
    const ROOT: Option<&'static str> = None;

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        let items = match map.get("components").map(|e| &e.value) {
            Some(Value::List(items)) => items.as_slice(),
            _ => &[],
        };
        // conversion derives mappings from real key dumps, so Phase 4 must have run
        for (i, c) in self.components.iter().enumerate() {
            let item = items.get(i).and_then(|it| match &it.value {
                Value::Map(m) => Some(m),
                _ => None,
            });
            for (field, v) in [
                ("official_keys", &c.official_keys),
                ("fastvideo_keys", &c.fastvideo_keys),
            ] {
                let missing = match v {
                    Val::Unknown { .. } => true,
                    Val::Known(s) => matches!(s.as_str(), "none" | "planned" | "not_created"),
                };
                if missing {
                    let line = item.map_or(map.line_of("components"), |m| m.line_of(field));
                    findings.push(Finding::new(
                        line,
                        format!("components[{i}].{field}"),
                        "conversion requires the phase 4 key dump; run the component prototype first",
                    ));
                }
            }
        }
        if self.components.is_empty() {
            findings.push(Finding::new(
                map.line_of("components"),
                "components",
                "must list at least one component",
            ));
        }
    }
}

wire_enum! {
    /// The kind of fix a retry request suspects.
    pub enum SuspectedFix {
        Rename = "rename",
        Split = "split",
        Fuse = "fuse",
        Skip = "skip",
        ComponentBucket = "component bucket",
        Config = "config",
    }
}

block_struct! {
    /// A Phase 6 request to re-run conversion for one component.
    pub struct ConversionRetryRequest {
        component: Text,
        parity_test: Text,
        failing_keys: Text,
        expected_actual_shapes: Text,
        source_prefix_or_path: Text,
        evidence: Text,
        suspected_fix: Val<SuspectedFix>,
    }
}

impl Contract for ConversionRetryRequest {
    const KIND: ContractKind = ContractKind::ConversionRetryRequest;
    const ROOT: Option<&'static str> = Some("conversion_retry_request");

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        if self.evidence.is_unknown() {
            findings.push(Finding::new(
                map.line_of("evidence"),
                "evidence",
                "a retry request must carry the strict-load error, divergent tensor or parity log excerpt",
            ));
        }
    }
}

wire_enum! {
    /// Result of validating emitted config keys through the production path.
    pub enum ConfigValidation {
        Pass = "pass",
        Blocked = "blocked",
        NotApplicable = "not_applicable",
    }
}

wire_enum! {
    /// Whether a conversion run resolved the retry it answered.
    pub enum RetryResolved { Yes = "yes", No = "no", NotARetry = "not_a_retry" }
}

wire_enum! {
    /// Where conversion hands off to.
    pub enum ConversionNextStep {
        Phase6ComponentParityDebug = "phase_6_component_parity_debug",
        AskUser = "ask_user",
    }
}

block_struct! {
    /// Per-component update conversion returns.
    pub struct ComponentContextUpdate {
        component: Text,
        converted_component_dir: Text,
        model_index_library: Text,
        config_file: Text,
        config_validation: ConfigValidation,
        mapping_notes: Text,
        production_loader_strictness: LoaderStrictness,
        strict_load: StrictLoad,
        retry_resolved: RetryResolved,
        concerns_or_unknowns: Vec<Text>,
    }
}

block_struct! {
    /// The conversion skill's handoff.
    pub struct ConversionHandoff {
        conversion_script: Text,
        source_layout: SourceLayout,
        converted_weights_dir: Text,
        port_state_file: Text,
        components_written: Vec<Text>,
        passthrough_components: Vec<Text>,
        strict_load: StrictLoad,
        component_context_updates: Vec<ComponentContextUpdate>,
        blocked_on: Text,
        next_step: ConversionNextStep,
        escape_hatch: Slot<EscapeHatch>,
    }
}

impl Contract for ConversionHandoff {
    const KIND: ContractKind = ContractKind::ConversionHandoff;
    const ROOT: Option<&'static str> = None;

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        ask_user_rule(
            self.next_step == ConversionNextStep::AskUser,
            &self.escape_hatch,
            map,
            findings,
        );
        if self.strict_load == StrictLoad::NotRun {
            findings.push(Finding::new(
                map.line_of("strict_load"),
                "strict_load",
                "conversion must report strict-load evidence: pass | pass_with_documented_exclusions | blocked",
            ));
        }
        let blocked_on_none = matches!(&self.blocked_on, Val::Known(s) if s == "none");
        if self.strict_load == StrictLoad::Blocked && blocked_on_none {
            findings.push(Finding::new(
                map.line_of("blocked_on"),
                "blocked_on",
                "strict_load blocked requires the exact blocker, not none",
            ));
        }
    }
}
