//! The prep handoff: what `add-model-01-prep` hands to `/add-model` Phase 0,
//! and the gate that decides whether parity scaffolding may start.
//!
//! ```
//! use fvd_contracts::contract::Contract;
//! use fvd_contracts::prep::PrepHandoff;
//!
//! # let text = "model_family: x\nnext_step: ask_user\nescape_hatch: none\n";
//! let checked = PrepHandoff::check(text, 1);
//! for f in &checked.findings {
//!     println!("{}: {}: {}", f.line, f.field, f.message);
//! }
//! assert!(checked.findings.iter().any(|f| f.field == "escape_hatch"
//!     && f.message.contains("requires an escape_hatch block")));
//! if let Some(prep) = checked.value {
//!     let _may_scaffold = prep.ready_for_parity_scaffolding();
//! }
//! ```

use crate::block::Map;
use crate::common::{SourceLayout, YesNo};
use crate::contract::{Contract, ask_user_rule};
use crate::escape_hatch::EscapeHatch;
use crate::fields::{Slot, Text, Val, block_struct, wire_enum};
use crate::findings::Finding;
use crate::kind::ContractKind;

wire_enum! {
    /// What prep did to the environment's dependencies.
    pub enum DependencyChanges {
        None = "none",
        InstalledNoDepsEditable = "installed no-deps editable",
        InstalledOfficialDeps = "installed official deps in current env",
        BlockedOnUser = "blocked on user",
    }
}

wire_enum! {
    /// Whether the official reference imports in the current environment.
    pub enum OfficialEnvStatus {
        ImportsOk = "imports_ok",
        PrivateDepsNeedStubs = "private_deps_need_stubs",
        Blocked = "blocked",
    }
}

impl OfficialEnvStatus {
    /// The parity-scaffolding gate: the official side must import, possibly
    /// with stubs for private dependencies, before parity tests are written.
    pub fn allows_parity_scaffolding(self) -> bool {
        matches!(
            self,
            OfficialEnvStatus::ImportsOk | OfficialEnvStatus::PrivateDepsNeedStubs
        )
    }
}

wire_enum! {
    /// Where prep hands off to.
    pub enum PrepNextStep { AddModel = "add-model", AskUser = "ask_user" }
}

block_struct! {
    /// The prep handoff block.
    pub struct PrepHandoff {
        model_family: Text,
        workload_types: Text,
        official_ref: Text,
        official_ref_dir: Text,
        official_ref_commit: Text,
        hf_weights_path: Text,
        hf_revision: Text,
        local_weights_dir: Text,
        source_layout: Val<SourceLayout>,
        model_index_class: Text,
        components_seen: Vec<Text>,
        needs_conversion: Val<YesNo>,
        /// The env var *name* holding the token, never its value.
        hf_token_env: Text,
        dependency_changes: DependencyChanges,
        official_env_status: OfficialEnvStatus,
        local_tests_readme: Text,
        port_state_file: Text,
        gitignore_entries_added: Vec<Text>,
        next_step: PrepNextStep,
        open_questions: Vec<Text>,
        escape_hatch: Slot<EscapeHatch>,
    }
}

impl PrepHandoff {
    /// Whether `/add-model` may start parity scaffolding from this handoff.
    pub fn ready_for_parity_scaffolding(&self) -> bool {
        self.official_env_status.allows_parity_scaffolding()
            && self.next_step == PrepNextStep::AddModel
    }
}

impl Contract for PrepHandoff {
    const KIND: ContractKind = ContractKind::PrepHandoff;
    const ROOT: Option<&'static str> = None;

    fn rules(&self, map: &Map, findings: &mut Vec<Finding>) {
        ask_user_rule(
            self.next_step == PrepNextStep::AskUser,
            &self.escape_hatch,
            map,
            findings,
        );
        if self.next_step == PrepNextStep::AddModel
            && !self.official_env_status.allows_parity_scaffolding()
        {
            findings.push(Finding::new(
                map.line_of("official_env_status"),
                "official_env_status",
                "must be imports_ok or private_deps_need_stubs before handing off to add-model for parity scaffolding",
            ));
        }
        if self.dependency_changes == DependencyChanges::BlockedOnUser
            && self.next_step != PrepNextStep::AskUser
        {
            findings.push(Finding::new(
                map.line_of("dependency_changes"),
                "dependency_changes",
                "blocked on user requires next_step ask_user",
            ));
        }
    }
}
