//! The escape-hatch contract: the one way a skill pauses to ask the user
//! for a decision the workflow cannot safely make on its own.

use crate::block::Map;
use crate::common::YesNo;
use crate::contract::{Contract, cites_escape_id, nested};
use crate::fields::{Text, block_struct, wire_enum};
use crate::findings::Finding;
use crate::kind::ContractKind;

wire_enum! {
    /// The kind of decision being asked for.
    pub enum DecisionType {
        Scope = "scope",
        Dependency = "dependency",
        Auth = "auth",
        Cost = "cost",
        Destructive = "destructive",
        Ambiguity = "ambiguity",
        Blocker = "blocker",
    }
}

block_struct! {
    /// Where the port stood when it paused.
    pub struct StateSnapshot {
        phase: Text,
        files_changed: Vec<Text>,
        command_or_test: Text,
        /// Short logs or paths; must cite the `E###` row when asking.
        evidence: Text,
    }
}

block_struct! {
    /// A pause-and-ask request.
    pub struct EscapeHatch {
        needs_user_input: YesNo,
        decision_type: DecisionType,
        question: Text,
        recommended_option: Text,
        options: Vec<Text>,
        safe_default: Text,
        blocked_until_answered: YesNo,
        state_snapshot: StateSnapshot,
    }
}

/// At most three alternatives besides the recommended option.
pub const MAX_ALTERNATIVES: usize = 3;

impl EscapeHatch {
    /// The `E###` ids the snapshot's evidence cites.
    pub fn cited_escape_ids(&self) -> Vec<crate::ids::StableId> {
        crate::ids::find_ids(&self.state_snapshot.evidence.to_string())
            .into_iter()
            .filter(|id| id.kind == crate::ids::IdKind::EscapeHatch)
            .collect()
    }

    /// Rules of a hatch that actually asks; `map` is the hatch's own map and
    /// `prefix` the field path leading to it.
    pub fn ask_rules(&self, map: &Map, findings: &mut Vec<Finding>, prefix: &str) {
        if self.needs_user_input != YesNo::Yes {
            findings.push(Finding::new(
                map.line_of("needs_user_input"),
                format!("{prefix}needs_user_input"),
                "must be yes when next_step is ask_user",
            ));
        }
        let alternatives = self
            .options
            .iter()
            .filter(|o| **o != self.recommended_option)
            .count();
        if alternatives > MAX_ALTERNATIVES {
            findings.push(Finding::new(
                map.line_of("options"),
                format!("{prefix}options"),
                format!("offers {alternatives} alternatives; give one recommended option and at most {MAX_ALTERNATIVES} alternatives"),
            ));
        }
        let snapshot = nested(map, "state_snapshot");
        if !cites_escape_id(&self.state_snapshot.evidence.to_string()) {
            findings.push(Finding::new(
                snapshot
                    .line_of("evidence")
                    .max(map.line_of("state_snapshot")),
                format!("{prefix}state_snapshot.evidence"),
                "must cite the E### escape-hatch row recorded in PORT_STATUS.md",
            ));
        }
    }
}

impl Contract for EscapeHatch {
    const KIND: ContractKind = ContractKind::EscapeHatch;
    const ROOT: Option<&'static str> = Some("escape_hatch");

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        if self.needs_user_input == YesNo::Yes {
            self.ask_rules(map, findings, "escape_hatch.");
        }
    }
}
