//! The words of the pipeline's move back to P6 (text only): the gate
//! records the condition, `PORT_STATUS.md` reads the component and the
//! module back from it.

/// The condition of P6's reopening by the pipeline: `owner` owns `module`,
/// where the pipeline parity test diverges first. [`pipeline_divergence`]
/// reads it back (`PORT_STATUS.md` explains the move with it).
pub fn reopened_by_pipeline(owner: &str, module: &str) -> String {
    format!(
        "component {owner}: the pipeline parity test diverges first at {module}, one of its modules, although its own parity test passes"
    )
}

/// The component and module of a [`reopened_by_pipeline`] condition.
pub fn pipeline_divergence(condition: &str) -> Option<(String, String)> {
    let rest = condition.strip_prefix("component ")?;
    let (component, rest) = rest.split_once(": the pipeline parity test diverges first at ")?;
    let (module, _) = rest.split_once(", one of its modules")?;
    Some((component.to_string(), module.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pipeline_reopening_reads_back_its_component_and_module() {
        let c = super::reopened_by_pipeline("vae", "vae.decoder.up.0");
        assert_eq!(
            super::pipeline_divergence(&c),
            Some(("vae".into(), "vae.decoder.up.0".into()))
        );
        assert_eq!(super::pipeline_divergence("component vae is blocked"), None);
    }
}
