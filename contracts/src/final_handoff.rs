//! The final handoff: the checklist `/add-model` completes before handing
//! the port back to the user or opening a pull request.

use crate::block::{Map, Value};
use crate::common::{ParityState, RunStatus, YesNo};
use crate::contract::{Contract, ask_user_rule};
use crate::escape_hatch::EscapeHatch;
use crate::fields::{Slot, Text, block_struct, wire_enum};
use crate::findings::Finding;
use crate::kind::ContractKind;

wire_enum! {
    /// Conversion outcome of the port.
    pub enum ConversionStatus { NotNeeded = "not_needed", Pass = "pass", Blocked = "blocked" }
}

wire_enum! {
    /// Whether a component was reused or ported.
    pub enum ReuseOrPort { Reused = "reused", Ported = "ported" }
}

wire_enum! {
    /// Whether a quality regression test was added.
    pub enum QualityRegression {
        Added = "added",
        DeferredWithReason = "deferred_with_reason",
        NotApplicable = "not_applicable",
    }
}

wire_enum! {
    /// Only `no` is acceptable: raw token values are never committed.
    pub enum TokenValuesCommitted { No = "no" }
}

wire_enum! {
    /// Runtime imports of third-party model classes in production code.
    pub enum ThirdPartyImports { None = "none", ListedWithRationale = "listed_with_rationale" }
}

block_struct! {
    /// One component of the final checklist.
    pub struct FinalComponent {
        name: Text,
        reuse_or_port: ReuseOrPort,
        parity_test: Text,
        parity_status: ParityState,
        concerns_or_unknowns: Vec<Text>,
    }
}

block_struct! {
    /// The inner fields of a `final_handoff` block.
    pub struct FinalHandoff {
        prep_handoff_complete: YesNo,
        conversion_status: ConversionStatus,
        components: Vec<FinalComponent>,
        pipeline_smoke: RunStatus,
        pipeline_parity: RunStatus,
        example_status: RunStatus,
        quality_regression: QualityRegression,
        local_tests_readme: Text,
        port_state_file: Text,
        token_values_committed: TokenValuesCommitted,
        runtime_third_party_model_imports: ThirdPartyImports,
        blockers: Vec<Text>,
        escape_hatch: Slot<EscapeHatch>,
    }
}

impl FinalHandoff {
    /// Whether the handoff lists any blocker (`none` does not count).
    pub fn has_blockers(&self) -> bool {
        self.blockers
            .iter()
            .any(|b| b.known().is_none_or(|s| s != "none"))
    }
}

impl Contract for FinalHandoff {
    const KIND: ContractKind = ContractKind::FinalHandoff;
    const ROOT: Option<&'static str> = Some("final_handoff");

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        let asks = self
            .escape_hatch
            .block()
            .is_some_and(|h| h.needs_user_input == YesNo::Yes);
        ask_user_rule(asks, &self.escape_hatch, map, findings);
        if self.has_blockers() {
            return;
        }
        // without an explicit blocker, everything must be green
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
                    "must be non_skip_pass unless a blocker is listed",
                ));
            }
        }
        for (field, status) in [
            ("pipeline_smoke", self.pipeline_smoke),
            ("pipeline_parity", self.pipeline_parity),
            ("example_status", self.example_status),
        ] {
            if status != RunStatus::Pass {
                findings.push(Finding::new(
                    map.line_of(field),
                    field,
                    "must be pass unless a blocker is listed",
                ));
            }
        }
        if self.conversion_status == ConversionStatus::Blocked {
            findings.push(Finding::new(
                map.line_of("conversion_status"),
                "conversion_status",
                "blocked requires a listed blocker",
            ));
        }
    }
}
