//! The `[component.trace]` table of a port spec: how a red component's
//! parity test is rerun with activation tracing on, where each side's rank
//! files land, and how the two sides are compared.
//!
//! One traced run writes both sides' files into one folder fvd hands it
//! (`FVD_TRACE_DIR`; the port side also gets `FASTVIDEO_TRACE_OUTPUT`), and
//! a glob per side picks that side's rank files out of it. Everything that
//! the comparison needs maps one to one onto [`fvd_trace::CompareOptions`].
//!
//! The table is validated while the spec is deserialized, so a bad regex or
//! rule is a syntax error with the file, line and column of the table, like
//! every other error of the spec.

use serde::Deserialize;

/// Value of `FASTVIDEO_TRACE_OUTPUT` when the spec names none: one file per
/// rank in the run's trace folder (`<rank>` is filled by the tracer).
pub const DEFAULT_OUTPUT: &str = "{dir}/port_rank<rank>.jsonl";
/// Stats the tracers compute when the spec names none: the three the
/// comparison checks by default (shape, abs_mean, max) plus sum.
pub const DEFAULT_STATS: &str = "abs_mean,sum,max,shape";
/// Traced runs an investigation may spend when the spec names no `depth`.
pub const DEFAULT_DEPTH: u32 = 3;
/// The largest `depth` accepted: each step is a full run of the parity test.
pub const MAX_DEPTH: u32 = 16;

/// A validated `[component.trace]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawTrace")]
pub struct TraceSpec {
    /// First `FASTVIDEO_TRACE_LAYERS` regex, in the port's module names.
    pub layers: String,
    /// The same scope in the reference's names (`FVD_TRACE_REFERENCE_LAYERS`),
    /// for the harness that traces the reference; defaults to `layers`.
    pub reference_layers: String,
    /// Glob, relative to the run's trace folder, of the reference's rank files.
    pub reference: String,
    /// Glob of the port's rank files.
    pub port: String,
    /// `FASTVIDEO_TRACE_OUTPUT` with `{dir}` standing for the trace folder.
    pub output: String,
    /// `FASTVIDEO_TRACE_STATS`.
    pub stats: String,
    /// `FASTVIDEO_TRACE_STEPS` and the steps compared (`None`: all).
    pub steps: Option<String>,
    /// `REGEX=>TEMPLATE` rules from port names to reference names.
    pub rename: Vec<String>,
    /// `STAT=REL` or `MODULE_REGEX:STAT=REL` tolerances.
    pub tol: Vec<String>,
    /// Most traced runs per investigation.
    pub depth: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrace {
    layers: String,
    reference_layers: Option<String>,
    reference: String,
    port: String,
    output: Option<String>,
    stats: Option<String>,
    steps: Option<String>,
    #[serde(default)]
    rename: Vec<String>,
    #[serde(default)]
    tol: Vec<String>,
    depth: Option<u32>,
}

impl TryFrom<RawTrace> for TraceSpec {
    type Error = String;

    fn try_from(r: RawTrace) -> Result<Self, String> {
        for (key, re) in [
            ("layers", Some(&r.layers)),
            ("reference_layers", r.reference_layers.as_ref()),
        ] {
            if let Some(re) = re {
                regex::Regex::new(re).map_err(|e| {
                    // The regex crate's message spans lines (pattern, caret,
                    // error); its last line says what is wrong.
                    let e = e.to_string();
                    let why = e.lines().last().unwrap_or_default().trim().to_string();
                    format!("trace.{key}: invalid regex {re:?}: {why}")
                })?;
            }
        }
        for (key, glob) in [("reference", &r.reference), ("port", &r.port)] {
            if glob.is_empty() || glob.starts_with('/') || glob.split('/').any(|p| p == "..") {
                return Err(format!(
                    "trace.{key}: {glob:?} must be a glob relative to the trace folder"
                ));
            }
        }
        fvd_trace::Renamer::parse(&r.rename).map_err(|e| format!("trace.rename: {e}"))?;
        fvd_trace::compare::Tolerances::parse(&r.tol).map_err(|e| format!("trace.tol: {e}"))?;
        if let Some(s) = &r.steps {
            fvd_trace::parse_steps(s).map_err(|e| format!("trace.steps: {e}"))?;
        }
        let output = r.output.unwrap_or_else(|| DEFAULT_OUTPUT.to_string());
        if !output.contains("{dir}") {
            return Err(format!(
                "trace.output: {output:?} must contain {{dir}}, the folder fvd collects"
            ));
        }
        let depth = r.depth.unwrap_or(DEFAULT_DEPTH);
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(format!(
                "trace.depth: {depth} is outside 1..={MAX_DEPTH} (traced runs per investigation)"
            ));
        }
        Ok(TraceSpec {
            reference_layers: r.reference_layers.unwrap_or_else(|| r.layers.clone()),
            layers: r.layers,
            reference: r.reference,
            port: r.port,
            output,
            stats: r.stats.unwrap_or_else(|| DEFAULT_STATS.to_string()),
            steps: r.steps,
            rename: r.rename,
            tol: r.tol,
            depth,
        })
    }
}

impl TraceSpec {
    /// The globs and options of every step's comparison, as the worker that
    /// ran the step (or the orchestrator, given the files) applies them.
    pub fn folder_spec(&self) -> fvd_trace::FolderSpec {
        fvd_trace::FolderSpec {
            reference: self.reference.clone(),
            port: self.port.clone(),
            rename: self.rename.clone(),
            tol: self.tol.clone(),
            steps: self.steps.clone(),
        }
    }

    /// The comparison options of every step. No `layers` filter: each side's
    /// tracer already wrote only the modules of the step's regex.
    pub fn compare_options(&self) -> fvd_trace::CompareOptions {
        self.folder_spec()
            .options()
            .expect("validated when the spec was parsed")
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::parse;

    const BASE: &str = r#"
[prep]
model_family = "tiny"
official_env_status = "imports_ok"

[[component]]
name = "refiner"
type = "generic"
parity_test = "t.py"
coverage_scope = "both"
"#;

    #[test]
    fn a_trace_table_maps_onto_compare_options() {
        let text = format!(
            "{BASE}\n[component.trace]\nlayers = '^blocks\\.\\d+$'\nreference_layers = '^layers\\.\\d+$'\nreference = \"reference_rank*.jsonl\"\nport = \"port_rank*.jsonl\"\nrename = ['^blocks\\.=>layers.']\ntol = [\"abs_mean=0.01\"]\nsteps = \"0,null\"\ndepth = 4\n"
        );
        let s = parse(Path::new("p.toml"), &text).unwrap();
        let t = s.components[0].trace.as_ref().expect("trace table");
        assert_eq!(t.layers, r"^blocks\.\d+$");
        assert_eq!(t.reference_layers, r"^layers\.\d+$");
        assert_eq!(t.output, super::DEFAULT_OUTPUT);
        assert_eq!(t.depth, 4);
        let o = t.compare_options();
        assert_eq!(o.rename, vec![r"^blocks\.=>layers.".to_string()]);
        assert_eq!(o.tolerances, vec!["abs_mean=0.01".to_string()]);
        assert_eq!(o.steps, Some(vec![Some(0), None]));
        assert_eq!(o.layers, None);
    }

    #[test]
    fn defaults_fill_what_the_table_leaves_out() {
        let text = format!(
            "{BASE}\n[component.trace]\nlayers = \"^a$\"\nreference = \"r/*\"\nport = \"p/*\"\n"
        );
        let s = parse(Path::new("p.toml"), &text).unwrap();
        let t = s.components[0].trace.as_ref().unwrap();
        assert_eq!(t.reference_layers, "^a$");
        assert_eq!(t.stats, super::DEFAULT_STATS);
        assert_eq!(t.depth, super::DEFAULT_DEPTH);
        assert_eq!(t.steps, None);
    }

    #[test]
    fn a_bad_regex_names_file_line_and_column() {
        let text = format!(
            "{BASE}\n[component.trace]\nlayers = \"^blocks\\\\.(\"\nreference = \"r/*\"\nport = \"p/*\"\n"
        );
        let err = parse(Path::new("x/port.toml"), &text)
            .unwrap_err()
            .to_string();
        // The line of the `[component.trace]` header.
        let line = BASE.lines().count() + 2;
        assert!(err.starts_with(&format!("x/port.toml:{line}:1: ")), "{err}");
        assert!(
            err.contains("trace.layers: invalid regex \"^blocks\\\\.(\": error: unclosed group"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }

    #[test]
    fn bad_rules_depth_and_globs_are_refused() {
        for (extra, want) in [
            ("rename = [\"no arrow\"]", "trace.rename"),
            ("tol = [\"abs_mean=lots\"]", "trace.tol"),
            ("depth = 0", "trace.depth: 0 is outside"),
            ("output = \"/tmp/x.jsonl\"", "must contain {dir}"),
            ("bogus = 1", "bogus"),
        ] {
            let text = format!(
                "{BASE}\n[component.trace]\nlayers = \"^a$\"\nreference = \"r/*\"\nport = \"p/*\"\n{extra}\n"
            );
            let err = parse(Path::new("p.toml"), &text).unwrap_err().to_string();
            assert!(err.contains(want), "{extra}: {err}");
        }
        let text = format!(
            "{BASE}\n[component.trace]\nlayers = \"^a$\"\nreference = \"../r/*\"\nport = \"p/*\"\n"
        );
        let err = parse(Path::new("p.toml"), &text).unwrap_err().to_string();
        assert!(err.contains("relative to the trace folder"), "{err}");
    }
}
