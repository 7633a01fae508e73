//! Enumerations and small blocks shared by several contracts, with the
//! contracts' wire spellings.

use crate::fields::{Text, block_struct, wire_enum};

wire_enum! {
    /// `yes | no` answers.
    pub enum YesNo { Yes = "yes", No = "no" }
}

wire_enum! {
    /// `yes | no | blocked` answers of the pipeline handoff checks.
    pub enum YesNoBlocked { Yes = "yes", No = "no", Blocked = "blocked" }
}

wire_enum! {
    /// How the official checkpoint is laid out; `unknown` is written through
    /// [`Val::Unknown`](crate::fields::Val) where a contract allows it.
    pub enum SourceLayout {
        Diffusers = "diffusers",
        RawOfficial = "raw_official",
        Monolithic = "monolithic",
        SeparateComponents = "separate_components",
        Mixed = "mixed",
        Custom = "custom",
    }
}

wire_enum! {
    /// The bucket a component belongs to.
    pub enum ComponentType {
        Dit = "dit",
        Vae = "vae",
        Encoder = "encoder",
        Scheduler = "scheduler",
        Conditioner = "conditioner",
        Upsampler = "upsampler",
        Vocoder = "vocoder",
        Generic = "generic",
    }
}

wire_enum! {
    /// How strictly the production loader loads a component's weights.
    pub enum LoaderStrictness {
        Strict = "strict",
        NonStrictWithAllowedKeys = "non_strict_with_allowed_keys",
        Stateless = "stateless",
    }
}

wire_enum! {
    /// Result of strict-loading converted weights.
    pub enum StrictLoad {
        NotRun = "not_run",
        Pass = "pass",
        PassWithDocumentedExclusions = "pass_with_documented_exclusions",
        Blocked = "blocked",
    }
}

wire_enum! {
    /// Status of a component or pipeline parity test.
    pub enum ParityState {
        /// Used by the status template and `pipeline_parity` before any test exists.
        NotStarted = "not_started",
        /// The test exists but skips for a named missing dependency, class or weight.
        ScaffoldSkip = "scaffold_skip",
        /// Both sides load and the numbers disagree.
        DebugRed = "debug_red",
        /// A local run that did not skip and passed.
        NonSkipPass = "non_skip_pass",
        /// A precise blocker prevents activation.
        Blocked = "blocked",
    }
}

impl ParityState {
    /// Whether this status satisfies the final-handoff and Phase 7 gates.
    pub fn is_pass(self) -> bool {
        self == ParityState::NonSkipPass
    }
}

wire_enum! {
    /// What a component parity test exercises.
    pub enum CoverageScope {
        /// The FastVideo side loads through the pipeline's own loader.
        ProductionLoader = "production_loader",
        /// The FastVideo side builds classes or remaps tensors directly.
        ImplementationSubcomponent = "implementation_subcomponent",
        Both = "both",
    }
}

wire_enum! {
    /// `pass | blocked | not_run` results.
    pub enum RunStatus { Pass = "pass", Blocked = "blocked", NotRun = "not_run" }
}

block_struct! {
    /// A file of the official repository with the symbols it contributes.
    pub struct DefinitionFile {
        path: Text,
        symbols: Text,
        notes: Text,
    }
}

block_struct! {
    /// A place where the official code instantiates a component.
    pub struct InstantiationFile {
        path: Text,
        symbols: Text,
        args: Text,
    }
}
