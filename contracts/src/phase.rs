//! The phase model of `/add-model`: P0 to P11 in workflow order.
//!
//! Status files and handoffs spell phases many ways (`P6`, `6`,
//! `phase_6`, `Phase 6: Component Parity Debug`, `component parity debug`,
//! `phase_11_post_parity_handoff`); [`Phase::from_str`] reads them all so
//! the gate can compare phases without caring who wrote them.

use std::fmt;
use std::str::FromStr;

/// One phase of the add-model workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// P0: lock scope and accept the prep handoff.
    ScopeAndHandoffGate,
    /// P1: study the official reference and its architecture.
    ReferenceAndArchitectureStudy,
    /// P2: write skipping parity tests before any port code.
    EarlyParityScaffolding,
    /// P3: decide reuse versus port and dispatch one subagent per component.
    ReuseGateAndComponentDispatch,
    /// P4: minimal native components with random weights and key dumps.
    NativeComponentPrototype,
    /// P5: map parameters and convert weights.
    ParamMappingAndWeightConversion,
    /// P6: drive each component parity test to a non-skip pass.
    ComponentParityDebug,
    /// P7: pipeline stages and variants, after every component is green.
    PipelineStagesAndVariants,
    /// P8: pipeline config, presets, registry entries and examples.
    PipelineConfigPresetsRegistryExamples,
    /// P9: activate the scaffolds and verify locally without skips.
    ParityActivationAndLocalVerification,
    /// P10: quality regression tests.
    QualityRegression,
    /// P11: post-parity review and handoff.
    PostParityReviewAndHandoff,
}

impl Phase {
    /// Every phase in workflow order.
    pub const ALL: [Phase; 12] = [
        Phase::ScopeAndHandoffGate,
        Phase::ReferenceAndArchitectureStudy,
        Phase::EarlyParityScaffolding,
        Phase::ReuseGateAndComponentDispatch,
        Phase::NativeComponentPrototype,
        Phase::ParamMappingAndWeightConversion,
        Phase::ComponentParityDebug,
        Phase::PipelineStagesAndVariants,
        Phase::PipelineConfigPresetsRegistryExamples,
        Phase::ParityActivationAndLocalVerification,
        Phase::QualityRegression,
        Phase::PostParityReviewAndHandoff,
    ];

    /// 0 to 11.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The phase with that number.
    pub fn from_number(n: u8) -> Option<Phase> {
        Phase::ALL.get(usize::from(n)).copied()
    }

    /// `P0` to `P11`.
    pub fn id(self) -> String {
        format!("P{}", self.number())
    }

    /// The phase's name as the workflow titles it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::ScopeAndHandoffGate => "scope and handoff gate",
            Phase::ReferenceAndArchitectureStudy => "reference and architecture study",
            Phase::EarlyParityScaffolding => "early parity scaffolding",
            Phase::ReuseGateAndComponentDispatch => "reuse gate and component dispatch",
            Phase::NativeComponentPrototype => "native component prototype",
            Phase::ParamMappingAndWeightConversion => "param mapping and weight conversion",
            Phase::ComponentParityDebug => "component parity debug",
            Phase::PipelineStagesAndVariants => "pipeline stages and variants",
            Phase::PipelineConfigPresetsRegistryExamples => {
                "pipelineconfig, presets, registry, examples"
            }
            Phase::ParityActivationAndLocalVerification => {
                "parity activation and local verification"
            }
            Phase::QualityRegression => "quality regression",
            Phase::PostParityReviewAndHandoff => "post-parity review and handoff",
        }
    }

    /// `phase_6_component_parity_debug`: the snake-case form status files use.
    pub fn slug(self) -> String {
        format!("phase_{}_{}", self.number(), words(self.name()).join("_"))
    }

    /// The phase after this one; `None` after P11.
    pub fn next(self) -> Option<Phase> {
        Phase::from_number(self.number() + 1)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.id(), self.name())
    }
}

/// A string that names no phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid phase; expected P0..P11, 0..11 or a phase name")]
pub struct PhaseError;

/// Lowercase alphanumeric words, dropping "and" so `pipeline stages and
/// variants` matches `pipeline, stages, variants`.
fn words(s: &str) -> Vec<String> {
    s.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty() && *w != "and")
        .map(str::to_owned)
        .collect()
}

impl FromStr for Phase {
    type Err = PhaseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut w = words(s.trim().trim_matches('`'));
        if w.is_empty() {
            return Err(PhaseError);
        }
        // `P6`, `p6`
        if w[0].len() > 1
            && let Some(n) = w[0].strip_prefix('p').and_then(|d| d.parse::<u8>().ok())
        {
            return Phase::from_number(n).ok_or(PhaseError);
        }
        // `phase 6 …`, `phase_6_…`
        if w[0] == "phase" {
            w.remove(0);
        }
        if let Some(n) = w.first().and_then(|d| d.parse::<u8>().ok()) {
            return Phase::from_number(n).ok_or(PhaseError);
        }
        // a name, with "pipelineconfig" also accepted as "pipeline config"
        let joined = w.concat();
        Phase::ALL
            .into_iter()
            .find(|p| words(p.name()).concat() == joined)
            .ok_or(PhaseError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_order_and_next() {
        assert_eq!(Phase::ALL.len(), 12);
        assert_eq!(Phase::ScopeAndHandoffGate.id(), "P0");
        assert_eq!(Phase::PostParityReviewAndHandoff.id(), "P11");
        assert_eq!(
            Phase::ComponentParityDebug.next(),
            Some(Phase::PipelineStagesAndVariants)
        );
        assert_eq!(Phase::PostParityReviewAndHandoff.next(), None);
        for w in Phase::ALL.windows(2) {
            assert!(w[0] < w[1]);
            assert_eq!(w[0].next(), Some(w[1]));
        }
    }

    #[test]
    fn parses_every_spelling() {
        for p in Phase::ALL {
            assert_eq!(p.id().parse::<Phase>(), Ok(p));
            assert_eq!(p.number().to_string().parse::<Phase>(), Ok(p));
            assert_eq!(p.name().parse::<Phase>(), Ok(p));
            assert_eq!(p.slug().parse::<Phase>(), Ok(p));
            assert_eq!(p.to_string().parse::<Phase>(), Ok(p));
        }
        assert_eq!("P6".parse(), Ok(Phase::ComponentParityDebug));
        assert_eq!("6".parse(), Ok(Phase::ComponentParityDebug));
        assert_eq!(
            "Phase 8: PipelineConfig, Presets, Registry, Examples".parse(),
            Ok(Phase::PipelineConfigPresetsRegistryExamples)
        );
        assert_eq!(
            "`phase_11_post_parity_handoff`".parse(),
            Ok(Phase::PostParityReviewAndHandoff)
        );
        assert_eq!(
            "Component Parity Debug".parse(),
            Ok(Phase::ComponentParityDebug)
        );
        for bad in ["P12", "12", "", "port verified", "prep", "p"] {
            assert_eq!(bad.parse::<Phase>(), Err(PhaseError), "{bad}");
        }
    }
}
