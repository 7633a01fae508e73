//! The variables a run of a component's parity test gets: every run's
//! ([`run_env`]), and a traced rerun's on top ([`traced_env`]: what the
//! test's tracers read), with where the worker that runs a traced rerun
//! gathers and compares its files ([`TRACE_DIR_ENV`], [`worker_compare`]).
//! Pure functions of the spec; the component, the trace and variant actors
//! and the attempt's tools build their runs with them.

use std::collections::BTreeMap;

use fvd_spec::trace_spec::TraceSpec;
use fvd_store::messages::TraceCompare;

/// Variable the worker points at the run's own folder for trace files.
pub const TRACE_DIR_ENV: &str = "FVD_TRACE_DIR";
/// The reference side's layer regex (reference module names).
pub const REFERENCE_LAYERS_ENV: &str = "FVD_TRACE_REFERENCE_LAYERS";
/// The variables every run of a component gets on top of `env`: its
/// family, name and run number.
pub fn run_env(
    mut env: BTreeMap<String, String>,
    family: &str,
    component: &str,
    run_no: u32,
) -> BTreeMap<String, String> {
    env.insert("FVD_FAMILY".to_string(), family.to_string());
    env.insert("FVD_COMPONENT".to_string(), component.to_string());
    env.insert("FVD_RUN".to_string(), run_no.to_string());
    env
}

/// The variables of a run traced with port-side regex `layers` and
/// reference-side `reference_layers`: what the test's tracers read.
pub fn traced_env(
    t: &TraceSpec,
    layers: &str,
    reference_layers: &str,
) -> std::collections::BTreeMap<String, String> {
    let mut env: std::collections::BTreeMap<String, String> = [
        ("FASTVIDEO_TRACE_ACTIVATIONS", "1".to_string()),
        ("FASTVIDEO_TRACE_LAYERS", layers.to_string()),
        ("FASTVIDEO_TRACE_STATS", t.stats.clone()),
        (
            "FASTVIDEO_TRACE_OUTPUT",
            t.output.replace("{dir}", "{collect_dir}"),
        ),
        (REFERENCE_LAYERS_ENV, reference_layers.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(steps) = &t.steps {
        env.insert("FASTVIDEO_TRACE_STEPS".to_string(), steps.clone());
    }
    env
}

/// How the worker that runs a traced rerun compares its files, where they
/// lie: the spec's globs and comparison options.
pub fn worker_compare(t: &TraceSpec) -> TraceCompare {
    let f = t.folder_spec();
    TraceCompare {
        reference: f.reference,
        port: f.port,
        rename: f.rename,
        tol: f.tol,
        steps: f.steps,
    }
}
