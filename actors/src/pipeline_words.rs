//! The words of the pipeline's move back to P6 (text only): the gate
//! records the condition, `PORT_STATUS.md` reads the component and the
//! cause back from it.

use fvd_contracts::coauthor::BackReason;

/// Why a red pipeline step sends the port back to a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause<'a> {
    /// The pipeline parity test diverges first at this module, one of the
    /// component's.
    Divergence(&'a str),
    /// The pipeline's agent returned `return_to_phase_6` naming the
    /// component; its blockers, on one line.
    AgentReturned(&'a str),
}

const DIVERGES: &str = ": the pipeline parity test diverges first at ";
const ITS_MODULES: &str = ", one of its modules";
const RETURNED: &str = ": the pipeline's agent returned to phase 6 for it: ";

/// The condition of P6's reopening by the pipeline for `owner`;
/// [`moved_back`] reads it back (`PORT_STATUS.md` explains the move).
pub fn reopened_by_pipeline(owner: &str, cause: Cause<'_>) -> String {
    match cause {
        Cause::Divergence(module) => format!(
            "component {owner}{DIVERGES}{module}{ITS_MODULES}, although its own parity test passes"
        ),
        Cause::AgentReturned(evidence) => format!("component {owner}{RETURNED}{evidence}"),
    }
}

/// The gate's reason beside P7's refusal: who the pipeline sends back.
pub fn whose(owner: &str, cause: Cause<'_>) -> String {
    match cause {
        Cause::Divergence(module) => format!(
            "its first divergence, {module}, is in component {owner}'s modules: back to P6 for {owner}"
        ),
        Cause::AgentReturned(_) => format!(
            "the pipeline's agent returned to phase 6 naming component {owner}: back to P6 for {owner}"
        ),
    }
}

/// What the reopened component's agent is told (its packet's last
/// verdict): the pipeline's evidence, then the pipeline's run.
pub fn task(owner: &str, cause: Cause<'_>, run: &str) -> String {
    match cause {
        Cause::Divergence(module) => format!(
            "the pipeline parity test is red and its first divergence, {module}, is in {owner}'s modules, although {owner}'s own parity test passes: fix {owner} so that the pipeline matches (the pipeline's trace is below). The pipeline's run: {run}"
        ),
        Cause::AgentReturned(evidence) => format!(
            "the pipeline parity test is red and the pipeline's agent traced it to {owner}, although {owner}'s own parity test passes: {evidence}. Fix {owner} so that the pipeline matches. The pipeline's run: {run}"
        ),
    }
}

/// The component and cause of a [`reopened_by_pipeline`] condition.
pub fn moved_back(condition: &str) -> Option<(String, BackReason)> {
    let rest = condition.strip_prefix("component ")?;
    if let Some((component, rest)) = rest.split_once(DIVERGES) {
        let (module, _) = rest.split_once(ITS_MODULES)?;
        let module = module.to_string();
        return Some((component.to_string(), BackReason::Diverged { module }));
    }
    let (component, evidence) = rest.split_once(RETURNED)?;
    let evidence = evidence.to_string();
    Some((
        component.to_string(),
        BackReason::AgentReturned { evidence },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_reopening_reads_back_its_component_and_cause() {
        let c = reopened_by_pipeline("vae", Cause::Divergence("vae.decoder.up.0"));
        let module = "vae.decoder.up.0".to_string();
        assert_eq!(
            moved_back(&c),
            Some(("vae".into(), BackReason::Diverged { module }))
        );
        let c = reopened_by_pipeline("body", Cause::AgentReturned("body maps blocks.1.ln"));
        let evidence = "body maps blocks.1.ln".to_string();
        assert_eq!(
            moved_back(&c),
            Some(("body".into(), BackReason::AgentReturned { evidence }))
        );
        assert_eq!(moved_back("component vae is blocked"), None);
    }
}
