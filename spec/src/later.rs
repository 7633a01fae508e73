//! `[pipeline]` and `[quality]`: the tests of the phases after component
//! parity. P7 and P9 read the pipeline's smoke test, its parity test (and
//! what that compares against) and its example command; P10 the quality
//! regression tests. fvd records them and names them in the gate's
//! reasons; it does not run them yet (issue #42): a declared test is never
//! read as a pass.

use std::path::{Component, Path};

use serde::Deserialize;
use toml::Spanned;

use crate::{SpecError, line_col};

/// `[pipeline]` of a spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PipelineSpec {
    /// The pipeline smoke test (P9's first pipeline step).
    pub smoke_test: Option<String>,
    /// The pipeline parity test (P7's loop, P9's second step).
    pub parity_test: Option<String>,
    /// What the parity test compares against (the official pipeline, a
    /// reference output), in the porter's words.
    pub comparison_target: Option<String>,
    /// The basic example, as an argument vector (P9's last step).
    pub example: Vec<String>,
    /// GPUs each pipeline step's run takes (0: a CPU slot, the default).
    pub gpus: u32,
    /// A step's timeout, over `[defaults] timeout_s`.
    pub timeout_s: Option<u64>,
    /// `[pipeline.trace]`: a red parity test is drilled down as a
    /// component's is, and its first divergent module names the component
    /// that owns it.
    pub trace: Option<crate::trace_spec::TraceSpec>,
    /// `agent = true`: the spec's `[agent]` works on the smoke and parity
    /// steps between red runs, as the pipeline's own agent: its packet is a
    /// `pipeline_context`, its handoff a `pipeline_handoff`.
    pub agent: bool,
}

/// `[quality]` of a spec: P10's regression tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QualitySpec {
    pub tests: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPipeline {
    smoke_test: Option<Spanned<String>>,
    parity_test: Option<Spanned<String>>,
    comparison_target: Option<Spanned<String>>,
    #[serde(default)]
    example: Vec<Spanned<String>>,
    #[serde(default)]
    gpus: u32,
    timeout_s: Option<u64>,
    trace: Option<crate::trace_spec::TraceSpec>,
    #[serde(default)]
    agent: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQuality {
    tests: Spanned<Vec<Spanned<String>>>,
}

fn refused(path: &Path, text: &str, at: usize, message: String) -> SpecError {
    let (line, column) = line_col(text, at);
    SpecError::Syntax {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

/// A test path as a spec names it: relative to the repository, inside it.
fn test_path(v: Spanned<String>, key: &str, text: &str, path: &Path) -> Result<String, SpecError> {
    let at = v.span().start;
    let p = v.into_inner();
    let inside = !p.trim().is_empty()
        && Path::new(&p)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if inside {
        Ok(p)
    } else {
        Err(refused(
            path,
            text,
            at,
            format!("{key} is {p:?}: it must be a test file relative to the repository, inside it"),
        ))
    }
}

/// Validates `[pipeline]`: at least one test, a comparison target only
/// beside a parity test, an example that names a program.
pub(crate) fn pipeline(
    raw: Option<Spanned<RawPipeline>>,
    text: &str,
    path: &Path,
) -> Result<Option<PipelineSpec>, SpecError> {
    let Some(raw) = raw else { return Ok(None) };
    let at = raw.span().start;
    let r = raw.into_inner();
    let smoke_test = r
        .smoke_test
        .map(|v| test_path(v, "pipeline.smoke_test", text, path))
        .transpose()?;
    let parity_test = r
        .parity_test
        .map(|v| test_path(v, "pipeline.parity_test", text, path))
        .transpose()?;
    if smoke_test.is_none() && parity_test.is_none() {
        return Err(refused(
            path,
            text,
            at,
            "[pipeline] names no test: give smoke_test, parity_test or both".into(),
        ));
    }
    if let Some(t) = &r.comparison_target
        && parity_test.is_none()
    {
        return Err(refused(
            path,
            text,
            t.span().start,
            "pipeline.comparison_target needs a pipeline.parity_test that compares against it"
                .into(),
        ));
    }
    if let Some(first) = r.example.first()
        && first.get_ref().trim().is_empty()
    {
        return Err(refused(
            path,
            text,
            first.span().start,
            "pipeline.example must start with the program to run".into(),
        ));
    }
    Ok(Some(PipelineSpec {
        smoke_test,
        parity_test,
        comparison_target: r.comparison_target.map(Spanned::into_inner),
        example: r.example.into_iter().map(Spanned::into_inner).collect(),
        gpus: r.gpus,
        timeout_s: r.timeout_s,
        trace: r.trace,
        agent: r.agent,
    }))
}

/// Validates `[quality]`: one test at least, each inside the repository.
pub(crate) fn quality(
    raw: Option<RawQuality>,
    text: &str,
    path: &Path,
) -> Result<Option<QualitySpec>, SpecError> {
    let Some(raw) = raw else { return Ok(None) };
    let at = raw.tests.span().start;
    let tests = raw
        .tests
        .into_inner()
        .into_iter()
        .map(|t| test_path(t, "quality.tests", text, path))
        .collect::<Result<Vec<_>, _>>()?;
    if tests.is_empty() {
        return Err(refused(
            path,
            text,
            at,
            "quality.tests is empty: name the quality regression tests, or leave [quality] out"
                .into(),
        ));
    }
    Ok(Some(QualitySpec { tests }))
}

/// The component names P7's steps run under.
pub const SMOKE_STEP: &str = "pipeline_smoke";
pub const PARITY_STEP: &str = "pipeline_parity";
/// The component name P9's example runs under.
pub use fvd_contracts::verdict::EXAMPLE_STEP;
/// The prefix of the component names P10's quality tests run under.
pub const QUALITY_PREFIX: &str = "quality_";

impl QualitySpec {
    /// P10's steps, in order, as (component name, test file): the test's
    /// file name without `test_` and `.py` after [`QUALITY_PREFIX`]
    /// (`tests/ssim/test_x_similarity.py` runs as `quality_x_similarity`),
    /// numbered where two would share a name.
    pub fn steps_to_run(&self) -> Vec<(String, &str)> {
        let mut out: Vec<(String, &str)> = Vec::new();
        for t in &self.tests {
            let file = t.split("::").next().unwrap_or(t);
            let stem = Path::new(file)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stem = stem.strip_prefix("test_").unwrap_or(&stem);
            let clean: String = stem
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let mut name = format!("{QUALITY_PREFIX}{clean}");
            if out.iter().any(|(n, _)| *n == name) {
                name = format!("{name}_{}", out.len() + 1);
            }
            out.push((name, t.as_str()));
        }
        out
    }
}

/// A quality test as the `[[component]]` it runs as.
pub(crate) fn quality_toml(name: &str, test: &str) -> String {
    let quoted = |s: &str| toml::Value::String(s.to_string()).to_string();
    format!(
        "name = {}\ntype = \"quality\"\nparity_test = {}\ncoverage_scope = \"pipeline\"\n",
        quoted(name),
        quoted(test)
    )
}

impl PipelineSpec {
    /// The steps P7 runs, in order, as (component name, test file).
    pub fn steps_to_run(&self) -> Vec<(&'static str, &str)> {
        let mut out = Vec::new();
        if let Some(t) = &self.smoke_test {
            out.push((SMOKE_STEP, t.as_str()));
        }
        if let Some(t) = &self.parity_test {
            out.push((PARITY_STEP, t.as_str()));
        }
        out
    }

    /// A step as the `[[component]]` it runs as: its test, the `[pipeline]`
    /// GPUs and timeout, everything else from `[defaults]`.
    pub(crate) fn step_toml(&self, name: &str, test: &str) -> String {
        let quoted = |s: &str| toml::Value::String(s.to_string()).to_string();
        let mut t = format!(
            "name = {}\ntype = \"pipeline\"\nparity_test = {}\ncoverage_scope = \"pipeline\"\ngpus = {}\n",
            quoted(name),
            quoted(test),
            self.gpus
        );
        if let Some(s) = self.timeout_s {
            t.push_str(&format!("timeout_s = {s}\n"));
        }
        if self.agent {
            t.push_str("agent = true\n");
        }
        t
    }

    /// The example as the `[[component]]` it runs as: its command is the
    /// example's argument vector, judged by its exit status; its "test" is
    /// the script it runs (the first `.py` argument, else the program).
    pub(crate) fn example_toml(&self) -> Option<String> {
        let program = self.example.first()?;
        let quoted = |s: &str| toml::Value::String(s.to_string()).to_string();
        let script = self
            .example
            .iter()
            .find(|a| a.ends_with(".py"))
            .unwrap_or(program);
        let argv: Vec<String> = self.example.iter().map(|a| quoted(a)).collect();
        let mut t = format!(
            "name = {}\ntype = \"example\"\nparity_test = {}\ncoverage_scope = \"pipeline\"\ngpus = {}\ncommand = [{}]\n",
            quoted(EXAMPLE_STEP),
            quoted(script),
            self.gpus,
            argv.join(", ")
        );
        if let Some(s) = self.timeout_s {
            t.push_str(&format!("timeout_s = {s}\n"));
        }
        Some(t)
    }

    /// The declared steps, in P9's order, for a plan or a reason.
    pub fn steps(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(t) = &self.smoke_test {
            out.push(format!("smoke test {t}"));
        }
        if let Some(t) = &self.parity_test {
            match &self.comparison_target {
                Some(against) => out.push(format!("parity test {t} (against {against})")),
                None => out.push(format!("parity test {t}")),
            }
        }
        if !self.example.is_empty() {
            out.push(format!("example `{}`", self.example.join(" ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[prep]\nmodel_family = \"tiny\"\n\n[[component]]\nname = \"a\"\ntype = \"generic\"\nparity_test = \"t/a.py\"\ncoverage_scope = \"both\"\n";

    fn parse(extra: &str) -> Result<crate::PortSpec, SpecError> {
        crate::parse(Path::new("port.toml"), &format!("{BASE}{extra}"))
    }

    #[test]
    fn the_example_imports_the_checkout_first() {
        let spec = parse("\n[pipeline]\nsmoke_test = \"t/s.py\"\nexample = [\"python\", \"ex/run.py\", \"--steps\", \"2\"]\n").unwrap();
        let ex = spec.example_step().unwrap();
        assert_eq!(ex.name, EXAMPLE_STEP);
        assert_eq!(ex.argv(), ["python", "ex/run.py", "--steps", "2"]);
        assert_eq!(ex.parity_tests, ["ex/run.py"]);
        assert_eq!(ex.set_env["PYTHONPATH"], "{repo}");
        let with = parse("\n[defaults]\nset_env = { PYTHONPATH = \"src\" }\n\n[pipeline]\nsmoke_test = \"t/s.py\"\nexample = [\"python\", \"ex/run.py\"]\n").unwrap();
        assert_eq!(
            with.example_step().unwrap().set_env["PYTHONPATH"],
            "{repo}:src"
        );
        // the components keep theirs
        assert_eq!(with.components[0].set_env["PYTHONPATH"], "src");
    }

    #[test]
    fn pipeline_and_quality_are_read_in_p9_order() {
        let spec = parse(
            "\n[pipeline]\nsmoke_test = \"t/test_tiny_pipeline_smoke.py\"\nparity_test = \"t/test_tiny_pipeline_parity.py\"\ncomparison_target = \"the official pipeline at seed 0\"\nexample = [\"python\", \"examples/tiny.py\"]\n\n[quality]\ntests = [\"t/ssim/test_tiny_similarity.py\"]\n",
        )
        .unwrap();
        let p = spec.pipeline.expect("a pipeline");
        assert_eq!(
            p.steps(),
            [
                "smoke test t/test_tiny_pipeline_smoke.py",
                "parity test t/test_tiny_pipeline_parity.py (against the official pipeline at seed 0)",
                "example `python examples/tiny.py`",
            ]
        );
        assert_eq!(
            spec.quality.unwrap().tests,
            ["t/ssim/test_tiny_similarity.py"]
        );
        let none = parse("").unwrap();
        assert_eq!((none.pipeline, none.quality), (None, None));
    }

    #[test]
    fn the_pipeline_steps_run_as_components_after_the_parity_components() {
        let spec = parse(
            "\n[defaults]\ntimeout_s = 300\n\n[pipeline]\nsmoke_test = \"t/smoke.py\"\nparity_test = \"t/parity.py\"\ngpus = 1\n",
        )
        .unwrap();
        let parity: Vec<&str> = spec.parity_components().map(|c| c.name.as_str()).collect();
        assert_eq!(parity, ["a"]);
        let steps: Vec<(&str, &str, u32, u64)> = spec
            .pipeline_steps()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.parity_tests[0].as_str(),
                    c.gpus,
                    c.timeout.as_secs(),
                )
            })
            .collect();
        assert_eq!(
            steps,
            [
                ("pipeline_smoke", "t/smoke.py", 1, 300),
                ("pipeline_parity", "t/parity.py", 1, 300)
            ]
        );
        assert_eq!(spec.components[1].lines.get("pipeline"), Some(&13));
        // a component may not take a step's name
        let e = crate::parse(
            Path::new("port.toml"),
            &format!(
                "{}\n[pipeline]\nsmoke_test = \"t/s.py\"\n",
                BASE.replace("name = \"a\"", "name = \"pipeline_smoke\"")
            ),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("\"pipeline_smoke\" is listed twice"),
            "{e}"
        );
    }

    #[test]
    fn a_module_belongs_to_the_component_with_its_longest_prefix() {
        let spec = crate::parse(
            Path::new("port.toml"),
            &format!(
                "{}modules = [\"blocks\"]\n\n[[component]]\nname = \"b\"\ntype = \"generic\"\nparity_test = \"t/b.py\"\ncoverage_scope = \"both\"\nmodules = [\"blocks.2\", \"head\"]\n",
                BASE
            ),
        )
        .unwrap();
        let owner = |m: &str| spec.owner_of(m).map(|c| c.name.as_str());
        assert_eq!(owner("blocks.2.norm"), Some("b"));
        assert_eq!(owner("blocks.2"), Some("b"));
        assert_eq!(owner("blocks.20.norm"), Some("a"));
        assert_eq!(owner("blocks.1"), Some("a"));
        assert_eq!(owner("head"), Some("b"));
        assert_eq!(owner("headless"), None);
        assert_eq!(owner("embed"), None);
    }

    #[test]
    fn the_pipeline_agent_works_on_the_smoke_and_parity_steps_never_on_the_example() {
        let spec = parse("\n[pipeline]\nsmoke_test = \"t/s.py\"\nparity_test = \"t/p.py\"\nexample = [\"python\", \"ex.py\"]\nagent = true\n\n[agent]\ncommand = [\"agent\", \"{prompt_file}\"]\n").unwrap();
        let with: Vec<(&str, bool)> = spec
            .components
            .iter()
            .map(|c| (c.name.as_str(), c.agent.is_some()))
            .collect();
        assert_eq!(
            with,
            [
                ("a", false),
                (SMOKE_STEP, true),
                (PARITY_STEP, true),
                (EXAMPLE_STEP, false)
            ]
        );
        let without =
            parse("\n[pipeline]\nparity_test = \"t/p.py\"\n\n[agent]\ncommand = [\"agent\"]\n")
                .unwrap();
        assert!(without.components.iter().all(|c| c.agent.is_none()));
    }

    #[test]
    fn a_pipeline_without_a_test_or_outside_the_repository_is_refused_at_its_line() {
        let e = parse("\n[pipeline]\nexample = [\"python\", \"x.py\"]\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "port.toml:10:1: [pipeline] names no test: give smoke_test, parity_test or both"
        );
        let e = parse("\n[pipeline]\nparity_test = \"../elsewhere/test_p.py\"\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("port.toml:11:15: pipeline.parity_test is \"../elsewhere/test_p.py\""),
            "{e}"
        );
        let e = parse("\n[pipeline]\nsmoke_test = \"t/s.py\"\ncomparison_target = \"x\"\n")
            .unwrap_err();
        assert!(e.to_string().starts_with("port.toml:12:"), "{e}");
        let e = parse("\n[quality]\ntests = []\n").unwrap_err();
        assert!(e.to_string().contains("quality.tests is empty"), "{e}");
        let e = parse("\n[quality]\ntests = [\"/abs/test_q.py\"]\n").unwrap_err();
        assert!(e.to_string().contains("inside it"), "{e}");
        let e = parse("\n[pipeline]\nsmoke_test = \"t/s.py\"\nagent = true\n").unwrap_err();
        assert!(
            e.to_string().contains(
                "component pipeline_smoke: agent = true but the spec has no [agent] table"
            ),
            "{e}"
        );
    }
}
