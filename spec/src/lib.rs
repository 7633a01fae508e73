//! The port spec: `tests/local_tests/<family>/port.toml` in the port's
//! repository. It carries the prep handoff fields of the contract and the
//! components with their parity tests. Environment variables are named,
//! never valued: a spec holding a token value is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub mod agent_model;
pub mod cleanup;
pub mod init;
pub mod later;
pub mod preconditions;
pub mod trace_spec;

/// Default parity command; `{test}` is the component's parity test path and
/// `{junitxml}` the JUnit file the worker collects.
pub const DEFAULT_COMMAND: &[&str] = &[
    "python3",
    "-m",
    "pytest",
    "{test}",
    "-q",
    "-p",
    "no:cacheprovider",
    "--junitxml={junitxml}",
];

/// What a job needs of the worker that runs it beyond a GPU count, and how
/// its port ranks against others. Derived from the spec each time a job is
/// queued, so it is not stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// Higher is served first; ports of equal priority take turns.
    pub priority: i32,
    /// Each leased GPU has at least this much memory; with `gpu_share`, it
    /// is also what a single-GPU run is counted as using on a shared GPU.
    pub gpu_memory_mib: u64,
    /// A single-GPU run with a known `gpu_memory_mib` may share its GPU
    /// with other such runs (the spec's `gpu_share`, true unless the
    /// component or `[defaults]` says false); false keeps the GPU whole.
    /// `Placement::default()` does not share: a run fvd knows nothing of
    /// gets whole GPUs.
    pub gpu_share: bool,
    /// The worker carries every one of these labels with the same value.
    pub labels: BTreeMap<String, String>,
    /// Paths relative to the port folder that the worker must have for the
    /// job (weights: large untracked files code by commit does not ship),
    /// sorted: `[defaults] worker_paths` and the component's own.
    pub worker_paths: Vec<String>,
    /// The component's `expected_s` in milliseconds: how long a run takes,
    /// for placement by expected duration while the store holds no run of
    /// it yet (its recent runs win once there are some).
    pub expected_ms: Option<u64>,
}

impl Placement {
    /// Whether the job constrains the worker beyond a GPU count.
    pub fn is_constrained(&self) -> bool {
        self.gpu_memory_mib > 0 || !self.labels.is_empty() || !self.worker_paths.is_empty()
    }
}

/// Why a spec could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read port spec {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    /// The value is deliberately not part of the error.
    #[error("{path}:{line}: {key}: {message}")]
    Secret {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

/// A parsed, validated port spec.
#[derive(Debug, Clone, PartialEq)]
pub struct PortSpec {
    pub family: String,
    /// The file the spec was read from, as given (for `file:line` in the
    /// gate's conditions).
    pub path: String,
    /// Prep handoff fields, keyed by the contract's field names, as written.
    pub prep: BTreeMap<String, String>,
    /// 1-based line of each prep field in the spec file.
    pub prep_lines: BTreeMap<String, usize>,
    pub components: Vec<ComponentSpec>,
    /// `[runner]`: how workers start the port's test processes.
    pub runner: RunnerSpec,
    /// `[pipeline]`: P7's and P9's pipeline tests, when declared.
    pub pipeline: Option<later::PipelineSpec>,
    /// `[quality]`: P10's regression tests, when declared.
    pub quality: Option<later::QualitySpec>,
}

/// `[runner] mode`: a fresh interpreter per run (`cold`, the default) or a
/// fork of a per-worker zygote that imported `preload` once (`warm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunnerMode {
    #[default]
    Cold,
    Warm,
}

/// The `[runner]` table of a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerSpec {
    pub mode: RunnerMode,
    /// Top-level (or dotted) modules the zygote imports before it forks a
    /// run: libraries only, never the repository's own packages.
    pub preload: Vec<String>,
    /// 1-based line and column of each `preload` entry, for errors.
    pub preload_at: Vec<(usize, usize)>,
}

impl PortSpec {
    /// The components P6 runs (every [`Stage::Component`]).
    pub fn parity_components(&self) -> impl Iterator<Item = &ComponentSpec> {
        self.components
            .iter()
            .filter(|c| c.stage == Stage::Component)
    }

    /// The component that owns `module` of a traced pipeline run: the one
    /// whose `modules` holds the longest prefix of it (a prefix owns the
    /// module itself and those below it, `blocks.2` → `blocks.2.norm`).
    pub fn owner_of(&self, module: &str) -> Option<&ComponentSpec> {
        self.parity_components()
            .filter_map(|c| {
                c.modules
                    .iter()
                    .filter(|p| {
                        module == p.as_str()
                            || module
                                .strip_prefix(p.as_str())
                                .is_some_and(|rest| rest.starts_with('.'))
                    })
                    .map(|p| p.len())
                    .max()
                    .map(|n| (n, c))
            })
            .max_by_key(|(n, _)| *n)
            .map(|(_, c)| c)
    }

    /// The pipeline's steps P7 runs, in order (smoke, then parity).
    pub fn pipeline_steps(&self) -> impl Iterator<Item = &ComponentSpec> {
        self.components
            .iter()
            .filter(|c| c.stage == Stage::Pipeline)
    }

    /// The basic example P9 runs last (`[pipeline] example`).
    pub fn example_step(&self) -> Option<&ComponentSpec> {
        self.components.iter().find(|c| c.stage == Stage::Example)
    }

    /// The quality regression tests P10 runs, in order (`[quality]`).
    pub fn quality_steps(&self) -> impl Iterator<Item = &ComponentSpec> {
        self.components.iter().filter(|c| c.stage == Stage::Quality)
    }
}

impl RunnerSpec {
    /// The modules a warm run's zygote preloads; `None` for a cold run.
    pub fn warm_preload(&self) -> Option<Vec<String>> {
        (self.mode == RunnerMode::Warm).then(|| self.preload.clone())
    }
}

/// Which phase runs a [`ComponentSpec`]: a component's parity test (P6),
/// or a step of the pipeline's (P7: `[pipeline]`'s smoke, then parity
/// test), run once every component holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stage {
    #[default]
    Component,
    Pipeline,
    /// P9's last step: the basic example, judged by its exit status.
    Example,
    /// P10: a quality regression test.
    Quality,
}

/// One component and how to run its parity test.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentSpec {
    pub name: String,
    /// A component's parity test, or a pipeline step (see [`Stage`]).
    pub stage: Stage,
    pub component_type: String,
    /// Repo-relative paths of the parity test files (one or more); `{test}`
    /// in the command stands for all of them.
    pub parity_tests: Vec<String>,
    pub coverage_scope: String,
    /// Other names `PORT_STATUS.md` uses for this component (a matrix row
    /// `text_encoder/tokenizer`, a Parity Commands scope).
    pub aliases: Vec<String>,
    /// The code the test exercises (files or folders, relative to the port
    /// folder, like `fastvideo/models/dits/widget.py`). A submit at another
    /// commit keeps the component's verdict only when none of these, its
    /// test files and the `conftest.py` files above them changed; without
    /// any, any change of the tree reruns it.
    pub paths: Vec<String>,
    /// Module names this component owns in a traced pipeline run
    /// (`blocks.2` owns `blocks.2` and `blocks.2.norm`): how a red pipeline
    /// parity test's first divergence is sent back to its component.
    pub modules: Vec<String>,
    /// Literal, non-secret environment of the runs (`PYTHONPATH`); `{repo}`
    /// in a value stands for the checkout the run tests.
    pub set_env: BTreeMap<String, String>,
    /// 1-based line of each of the component's fields in the spec file
    /// (`name`, `type`, `coverage_scope`, …).
    pub lines: BTreeMap<String, usize>,
    /// `[defaults] preflight`: argv each worker runs once per port before
    /// its first job of it; a worker where it fails takes none of them.
    pub preflight: Vec<String>,
    /// Number of GPUs of one host the test needs (0 = a CPU slot).
    pub gpus: u32,
    pub timeout: Duration,
    /// Names of environment variables passed through to the test.
    pub env: Vec<String>,
    /// Command template with `{test}` and `{junitxml}` placeholders.
    pub command: Vec<String>,
    /// The coding agent that changes the code between red runs; `None`
    /// keeps the old behaviour (a red run blocks the component).
    pub agent: Option<AgentSpec>,
    /// Port priority, minimum GPU memory and worker labels of its runs.
    pub placement: crate::Placement,
    /// Passing runs in a row (since the last change of its code) before a
    /// pass counts: 1 takes the first pass, more catch a flaky one.
    pub confirm_runs: u32,
    /// `[component.trace]`: drill down with activation traces when red.
    pub trace: Option<crate::trace_spec::TraceSpec>,
    /// `[[component.variant]]`: hypotheses about a red run's cause, each an
    /// environment override the test runs under once more, all at once.
    pub variants: Vec<VariantSpec>,
    /// The spec's `[runner]`: a warm run gives the same verdict as a cold
    /// one, so it is not part of [`ComponentSpec::same_run`].
    pub runner: RunnerSpec,
}

/// One `[[component.variant]]`: a named hypothesis, as environment
/// overrides of the component's runs (`FASTVIDEO_DTYPE = "fp32"`, an
/// attention backend, TF32 off, deterministic kernels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantSpec {
    /// An identifier, not `baseline` (the name of the red run's own row).
    pub name: String,
    /// Literal, non-secret values, over the component's `set_env`; `{repo}`
    /// stands for the checkout as in `set_env`.
    pub env: BTreeMap<String, String>,
}

impl VariantSpec {
    /// `KEY=VALUE` words, in name order: how tables and reasons show it.
    pub fn env_words(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }
}

/// Most variants a component may declare: each is a run of its test.
pub const MAX_VARIANTS: usize = 16;

/// The `[agent]` table: how to run the coding agent of a component.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    /// argv template with `{prompt_file}`, `{handoff_file}`, `{worktree}`,
    /// `{family}`, `{component}` and `{attempt}` placeholders; empty when
    /// a preset makes the command.
    pub command: Vec<String>,
    /// The CLI a preset runs (`fvd_workspace::preset` knows its flags).
    pub preset: Option<agent_model::Preset>,
    /// Arguments added to a preset's command.
    pub extra_args: Vec<String>,
    /// The model API behind fvd's proxy: a preset's, or a raw command's
    /// with `api`; `None` for a raw command that reaches its model itself.
    pub model: Option<agent_model::ModelSpec>,
    pub timeout: Duration,
    /// Names of environment variables passed through to the agent.
    pub env: Vec<String>,
    /// Agent attempts a component may spend before it is blocked.
    pub max_attempts: u32,
    /// Wall time a component may spend from its first run on; `None` is
    /// no limit.
    pub max_wall: Option<Duration>,
    /// GPU-seconds (run time × GPUs) its runs may spend; `None` is no limit.
    pub max_gpu_s: Option<u64>,
    /// The cleanup gate a pass must clear before it counts.
    pub cleanup: crate::cleanup::CleanupRules,
    /// GPUs an attempt leases with it when agents run on the fleet
    /// (`gpus = 0`, the default: a CPU slot; `gpus = "component"`: the
    /// component's, so the agent can run the test itself).
    pub gpus: AgentGpus,
}

/// See [`AgentSpec::gpus`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AgentGpus {
    #[default]
    None,
    Component,
}

/// `[agent] gpus` as written.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawAgentGpus {
    Count(u32),
    Word(String),
}

/// The values an agent's argv template is filled with.
#[derive(Debug, Clone)]
pub struct AgentVars<'a> {
    pub prompt_file: &'a str,
    pub handoff_file: &'a str,
    pub worktree: &'a str,
    pub family: &'a str,
    pub component: &'a str,
    pub attempt: u32,
}

impl AgentSpec {
    /// GPUs an attempt of a component needing `component_gpus` leases.
    pub fn gpus(&self, component_gpus: u32) -> u32 {
        match self.gpus {
            AgentGpus::None => 0,
            AgentGpus::Component => component_gpus,
        }
    }

    /// The argv of one agent attempt.
    pub fn argv(&self, v: &AgentVars<'_>) -> Vec<String> {
        self.command
            .iter()
            .map(|a| {
                a.replace("{prompt_file}", v.prompt_file)
                    .replace("{handoff_file}", v.handoff_file)
                    .replace("{worktree}", v.worktree)
                    .replace("{family}", v.family)
                    .replace("{component}", v.component)
                    .replace("{attempt}", &v.attempt.to_string())
            })
            .collect()
    }
}

impl ComponentSpec {
    /// The files of its parity tests: a node id (`file.py::test_x[fp32]`)
    /// names its file.
    pub fn test_files(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for t in &self.parity_tests {
            let f = t.split_once("::").map_or(t.as_str(), |(f, _)| f);
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }

    /// The argv of a run: the template with `{test}` substituted (an
    /// argument that is exactly `{test}` becomes one argument per test
    /// file; inside a longer argument the files are joined by spaces).
    /// `{junitxml}` and `{repo}` stay for the worker, which alone knows
    /// where the file goes and where the checkout is.
    pub fn argv(&self) -> Vec<String> {
        let gpus = self.gpus.to_string();
        let mut out = Vec::with_capacity(self.command.len() + self.parity_tests.len());
        for a in &self.command {
            if a == "{test}" {
                out.extend(self.parity_tests.iter().cloned());
            } else {
                out.push(
                    a.replace("{test}", &self.parity_tests.join(" "))
                        .replace("{gpus}", &gpus),
                );
            }
        }
        out
    }

    /// The run's timeout in milliseconds, as the scheduler and workers get
    /// it (saturating: never wrapped to a short one).
    pub fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// The first parity test file (every component has at least one).
    pub fn first_test(&self) -> &str {
        self.parity_tests.first().map(String::as_str).unwrap_or("")
    }

    /// Whether a run of `other` would test the same thing in the same way:
    /// what a resumed port compares to keep a recorded verdict. Line
    /// numbers and aliases do not count.
    pub fn same_run(&self, other: &ComponentSpec) -> bool {
        self.argv() == other.argv()
            && self.set_env == other.set_env
            && self.env == other.env
            && self.gpus == other.gpus
            && self.timeout == other.timeout
            && self.placement == other.placement
            && self.confirm_runs == other.confirm_runs
            && self.agent == other.agent
            && self.trace == other.trace
            && self.component_type == other.component_type
            && self.coverage_scope == other.coverage_scope
            && self.stage == other.stage
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    prep: BTreeMap<String, Spanned<toml::Value>>,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default, rename = "component")]
    components: Vec<RawComponent>,
    agent: Option<RawAgent>,
    runner: Option<RawRunner>,
    pipeline: Option<Spanned<later::RawPipeline>>,
    quality: Option<later::RawQuality>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRunner {
    #[serde(default)]
    mode: RunnerMode,
    #[serde(default)]
    preload: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    command: Option<Vec<String>>,
    /// `claude-code`, `codex`, `opencode` or `gemini` (agent_model).
    preset: Option<Spanned<String>>,
    /// The model API of a raw command, for fvd's proxy.
    api: Option<Spanned<String>>,
    model: Option<Spanned<String>>,
    key_env: Option<Spanned<String>>,
    max_turns: Option<Spanned<u32>>,
    #[serde(default)]
    extra_args: Vec<String>,
    budget: Option<agent_model::RawBudget>,
    #[serde(default)]
    prices: BTreeMap<String, agent_model::RawPrice>,
    timeout_s: Option<Spanned<u64>>,
    #[serde(default)]
    env: Vec<String>,
    max_attempts: Option<u32>,
    max_wall_s: Option<Spanned<u64>>,
    max_gpu_s: Option<Spanned<u64>>,
    gpus: Option<Spanned<RawAgentGpus>>,
    /// Regexes refused on the lines an agent's branch adds.
    forbidden_patterns: Option<Vec<String>>,
    /// Globs of untracked files the cleanup gate lets stay.
    #[serde(default)]
    allowed_untracked: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    command: Option<Vec<String>>,
    timeout_s: Option<Spanned<u64>>,
    gpus: Option<u32>,
    env: Option<Vec<String>>,
    /// Priority of the port's runs against other ports (higher first).
    priority: Option<i32>,
    confirm_runs: Option<u32>,
    #[serde(default)]
    set_env: BTreeMap<String, String>,
    #[serde(default)]
    preflight: Vec<String>,
    /// Paths (relative to the port folder) every worker of the port must
    /// have: `fvd worker --provide PATH=DIR`.
    #[serde(default)]
    worker_paths: Vec<String>,
    /// Whether the port's single-GPU runs with a `gpu_memory_mib` may
    /// share a GPU (true when unset).
    gpu_share: Option<bool>,
}

/// `parity_test = "a.py"` or `parity_test = ["a.py", "b.py"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawComponent {
    /// Checked while deserializing, so a bad name is refused with its line
    /// and column.
    name: Spanned<ComponentName>,
    #[serde(rename = "type")]
    component_type: Spanned<String>,
    parity_test: Spanned<OneOrMany>,
    coverage_scope: Spanned<String>,
    #[serde(default)]
    aliases: Vec<String>,
    /// The code the test exercises (see [`ComponentSpec::paths`]).
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    set_env: BTreeMap<String, String>,
    gpus: Option<u32>,
    timeout_s: Option<Spanned<u64>>,
    env: Option<Vec<String>>,
    command: Option<Vec<String>>,
    /// Whether the `[agent]` works on this component between red runs.
    #[serde(default)]
    agent: bool,
    /// Minimum memory of each GPU the test gets.
    gpu_memory_mib: Option<u64>,
    /// `false`: the run has its GPU alone (see [`Placement::gpu_share`]).
    gpu_share: Option<bool>,
    /// How long a run is expected to take, for placement until the store
    /// holds runs of the component.
    expected_s: Option<Spanned<u64>>,
    /// Labels the worker must carry (`fvd worker --label KEY=VALUE`).
    labels: Option<BTreeMap<String, String>>,
    /// Paths the worker must have besides `[defaults] worker_paths`.
    #[serde(default)]
    worker_paths: Vec<String>,
    confirm_runs: Option<u32>,
    /// Validated while deserializing, so its errors carry line and column.
    trace: Option<crate::trace_spec::TraceSpec>,
    /// Module name prefixes the component owns (see [`ComponentSpec::modules`]).
    #[serde(default)]
    modules: Vec<String>,
    #[serde(default, rename = "variant")]
    variants: Vec<Spanned<RawVariant>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariant {
    /// An identifier, checked as it is read.
    name: Spanned<VariantName>,
    env: BTreeMap<String, String>,
}

/// A component name: an identifier like the family's. Names become folder
/// names, branch names and job ids, so nothing else (`..`, `/`, the
/// `#trace` suffix of traced reruns) may be one.
/// A component name, checked as it is read (see [`component_name`]).
#[derive(Debug)]
struct ComponentName(String);

impl<'de> Deserialize<'de> for ComponentName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        component_name(d).map(ComponentName)
    }
}

fn component_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if fvd_paths::is_identifier(&name) {
        Ok(name)
    } else {
        Err(serde::de::Error::custom(format!(
            "component name {} is not an identifier: 1 to {} lowercase ascii letters, digits and _",
            fvd_paths::shown(&name),
            fvd_paths::MAX_IDENTIFIER_LEN
        )))
    }
}

/// A variant name: an identifier too (it names job rows and table rows).
#[derive(Debug)]
struct VariantName(String);

impl<'de> Deserialize<'de> for VariantName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        if fvd_paths::is_identifier(&name) {
            Ok(VariantName(name))
        } else {
            Err(serde::de::Error::custom(format!(
                "variant name {} is not an identifier: 1 to {} lowercase ascii letters, digits and _",
                fvd_paths::shown(&name),
                fvd_paths::MAX_IDENTIFIER_LEN
            )))
        }
    }
}

/// Where the spec of `family` lives inside `repo` by convention.
pub fn default_path(repo: &Path, family: &str) -> PathBuf {
    repo.join("tests/local_tests")
        .join(family)
        .join("port.toml")
}

/// Reads and parses a spec file.
pub fn load(path: &Path) -> Result<PortSpec, SpecError> {
    let bytes = std::fs::read(path).map_err(|source| SpecError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let text = fvd_contracts::text::utf8(&bytes).map_err(|e| SpecError::Syntax {
        path: path.to_path_buf(),
        line: e.line,
        column: e.column,
        message: e.to_string(),
    })?;
    parse(path, text)
}

/// Parses spec text; `path` only names the file in errors.
pub fn parse(path: &Path, text: &str) -> Result<PortSpec, SpecError> {
    refuse_secrets(path, text)?;
    let raw = raw_spec(path, text)?;
    let invalid = |message: String| SpecError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let (prep, prep_lines) = prep_table(raw.prep, text);
    let family = family_of(&prep, &invalid)?;
    let defaults = raw.defaults;
    let defaults_cmd: Vec<String> = defaults
        .command
        .clone()
        .unwrap_or_else(|| DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect());
    let agent = match raw.agent {
        None => None,
        Some(a) => Some(agent_spec(a, text, path)?),
    };
    let runner = runner(raw.runner, text, path)?;
    let pipeline_lines: BTreeMap<String, usize> = raw
        .pipeline
        .as_ref()
        .map(|p| [("pipeline".to_string(), line_col(text, p.span().start).0)].into())
        .unwrap_or_default();
    let pipeline = later::pipeline(raw.pipeline, text, path)?;
    let quality = later::quality(raw.quality, text, path)?;
    let default_timeout = seconds(defaults.timeout_s.clone(), "defaults.timeout_s", text, path)?;
    for name in defaults.set_env.keys() {
        if !is_env_name(name) {
            return Err(invalid(format!(
                "defaults.set_env: {name:?} is not a variable name"
            )));
        }
    }
    let shared = Shared {
        defaults: &defaults,
        command: &defaults_cmd,
        timeout: default_timeout,
        agent: agent.as_ref(),
        runner: &runner,
    };
    let mut components = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for c in raw.components {
        components.push(component_spec(c, &shared, &mut seen, text, path)?);
    }
    if components.is_empty() {
        return Err(invalid("no [[component]] is listed".into()));
    }
    // The pipeline's steps run as components do (the same actor, verdict
    // and ledger), after them: P7.
    if let Some(p) = &pipeline {
        for (name, test) in p.steps_to_run() {
            let snippet = p.step_toml(name, test);
            let raw: RawComponent = toml::from_str(&snippet)
                .map_err(|e| invalid(format!("[pipeline] step {name}: {}", e.message())))?;
            let mut step = component_spec(raw, &shared, &mut seen, &snippet, path)?;
            step.stage = Stage::Pipeline;
            if name == later::PARITY_STEP {
                step.trace = p.trace.clone();
            }
            step.lines = pipeline_lines.clone();
            components.push(step);
        }
        if let Some(snippet) = p.example_toml() {
            let raw: RawComponent = toml::from_str(&snippet)
                .map_err(|e| invalid(format!("[pipeline] example: {}", e.message())))?;
            let mut step = component_spec(raw, &shared, &mut seen, &snippet, path)?;
            step.stage = Stage::Example;
            step.lines = pipeline_lines.clone();
            checkout_first(&mut step);
            components.push(step);
        }
    }
    if let Some(q) = &quality {
        for (name, test) in q.steps_to_run() {
            let snippet = later::quality_toml(&name, test);
            let raw: RawComponent = toml::from_str(&snippet)
                .map_err(|e| invalid(format!("[quality] test {test}: {}", e.message())))?;
            let mut step = component_spec(raw, &shared, &mut seen, &snippet, path)?;
            step.stage = Stage::Quality;
            components.push(step);
        }
    }
    Ok(PortSpec {
        family,
        path: path.display().to_string(),
        prep,
        prep_lines,
        components,
        runner,
        pipeline,
        quality,
    })
}

/// The example runs the code of the commit P9 verifies, not a copy of the
/// package installed elsewhere (an editable install points at the
/// porter's checkout, not at the commit a worker runs): the checkout comes
/// first on its `PYTHONPATH`, unless the spec passes that variable
/// through.
fn checkout_first(step: &mut ComponentSpec) {
    if step.env.iter().any(|v| v == "PYTHONPATH") {
        return;
    }
    let path = match step.set_env.get("PYTHONPATH") {
        Some(p) if p.split(':').any(|x| x == "{repo}") => p.clone(),
        Some(p) => format!("{{repo}}:{p}"),
        None => "{repo}".to_string(),
    };
    step.set_env.insert("PYTHONPATH".into(), path);
}

/// Refuses a spec holding a token value, before anything is parsed or
/// stored: a token value in a spec must never reach the database, a log or
/// PORT_STATUS.md. Scanned with toml's escapes decoded, so `"\u00e9hf_…"`
/// does not hide one. The error names the line and the key.
fn refuse_secrets(path: &Path, text: &str) -> Result<(), SpecError> {
    let scanned = decoded_for_scan(text);
    if let Some(f) = fvd_contracts::secrets::scan_text(&scanned, 1)
        .into_iter()
        .next()
    {
        let line = scanned.lines().nth(f.line - 1).unwrap_or_default();
        // The key is named, unless it is itself the token (a pasted
        // `hf_… = …` line; found by fvd-fuzz).
        let key = line
            .split_once('=')
            .map(|(k, _)| fvd_contracts::secrets::redact(k.trim()))
            .unwrap_or(f.field);
        return Err(SpecError::Secret {
            path: path.to_path_buf(),
            line: f.line,
            key: fvd_paths::cut(&key),
            message: f.message,
        });
    }
    Ok(())
}

/// The spec's toml read into its raw tables, or a syntax error with the
/// line and column of the fault.
fn raw_spec(path: &Path, text: &str) -> Result<RawSpec, SpecError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        SpecError::Syntax {
            path: path.to_path_buf(),
            line,
            column,
            // An unknown key or a bad value is quoted in the message: cut.
            message: fvd_paths::cut_quoted(e.message()),
        }
    })
}

/// The `[prep]` table as text (an array joined with `, `) and the line of
/// each of its keys.
fn prep_table(
    raw: BTreeMap<String, Spanned<toml::Value>>,
    text: &str,
) -> (BTreeMap<String, String>, BTreeMap<String, usize>) {
    let mut prep = BTreeMap::new();
    let mut prep_lines = BTreeMap::new();
    for (k, v) in raw {
        prep_lines.insert(k.clone(), line_col(text, v.span().start).0);
        let s = match v.into_inner() {
            toml::Value::String(s) => s,
            toml::Value::Array(items) => items
                .iter()
                .map(|i| {
                    i.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| i.to_string())
                })
                .collect::<Vec<_>>()
                .join(", "),
            other => other.to_string(),
        };
        prep.insert(k, s);
    }
    (prep, prep_lines)
}

/// `prep.model_family`, which must be present and snake_case.
fn family_of(
    prep: &BTreeMap<String, String>,
    invalid: &dyn Fn(String) -> SpecError,
) -> Result<String, SpecError> {
    let family = prep
        .get("model_family")
        .cloned()
        .ok_or_else(|| invalid("prep.model_family is missing".into()))?;
    if !fvd_paths::is_identifier(&family) {
        return Err(invalid(format!(
            "prep.model_family {} is not snake_case (1 to {} lowercase ascii letters, digits and _)",
            fvd_paths::shown(&family),
            fvd_paths::MAX_IDENTIFIER_LEN
        )));
    }
    Ok(family)
}

/// The `[agent]` table, checked: its command, model, variables, attempts,
/// limits, cleanup rules and GPUs.
fn agent_spec(a: RawAgent, text: &str, path: &Path) -> Result<AgentSpec, SpecError> {
    let invalid = |message: String| SpecError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    if a.command.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid("agent.command is empty".into()));
    }
    let model = agent_model::parse(
        agent_model::RawModel {
            preset: a.preset,
            api: a.api,
            model: a.model,
            key_env: a.key_env,
            max_turns: a.max_turns,
            budget: a.budget,
            prices: a.prices,
            has_command: a.command.is_some(),
            env: a.env.clone(),
        },
        |offset| line_col(text, offset).0,
    )
    .map_err(|(line, message)| match line {
        0 => invalid(message),
        line => SpecError::Syntax {
            path: path.to_path_buf(),
            line,
            column: 1,
            message,
        },
    })?;
    if model.preset.is_none() && !a.extra_args.is_empty() {
        return Err(invalid(
            "agent.extra_args adds to a preset's command: put them in agent.command".into(),
        ));
    }
    if a.env.iter().any(|n| !is_env_name(n)) {
        return Err(invalid(
            "agent.env entry is not a variable name (specs name variables, never values)".into(),
        ));
    }
    let max_attempts = a.max_attempts.unwrap_or(3);
    if max_attempts == 0 {
        return Err(invalid("agent.max_attempts must be at least 1".into()));
    }
    let cleanup = crate::cleanup::CleanupRules {
        forbidden: a.forbidden_patterns.unwrap_or_else(|| {
            crate::cleanup::DEFAULT_FORBIDDEN
                .iter()
                .map(|s| s.to_string())
                .collect()
        }),
        allowed_untracked: a.allowed_untracked,
    };
    cleanup
        .validate()
        .map_err(|e| invalid(format!("agent.forbidden_patterns: {e}")))?;
    Ok(AgentSpec {
        command: a.command.unwrap_or_default(),
        preset: model.preset,
        extra_args: a.extra_args,
        model: model.model,
        timeout: Duration::from_secs(
            seconds(a.timeout_s, "agent.timeout_s", text, path)?.unwrap_or(1800),
        ),
        env: a.env,
        max_attempts,
        max_wall: seconds(a.max_wall_s, "agent.max_wall_s", text, path)?.map(Duration::from_secs),
        max_gpu_s: seconds(a.max_gpu_s, "agent.max_gpu_s", text, path)?,
        cleanup,
        gpus: agent_gpus(a.gpus, text, path)?,
    })
}

/// What every component of a spec starts from: the `[defaults]` table, its
/// command and timeout, the `[agent]` and the `[runner]`.
struct Shared<'a> {
    defaults: &'a RawDefaults,
    command: &'a [String],
    timeout: Option<u64>,
    agent: Option<&'a AgentSpec>,
    runner: &'a RunnerSpec,
}

/// One `[[component]]`, checked and filled in from the defaults; `seen`
/// holds the names read so far (a name listed twice is refused).
fn component_spec(
    c: RawComponent,
    shared: &Shared<'_>,
    seen: &mut std::collections::BTreeSet<String>,
    text: &str,
    path: &Path,
) -> Result<ComponentSpec, SpecError> {
    let invalid = |message: String| SpecError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let defaults = shared.defaults;
    let lines = component_lines(&c, text);
    let name = c.name.into_inner().0;
    if !seen.insert(name.clone()) {
        return Err(invalid(format!("component {name:?} is listed twice")));
    }
    let (env, set_env) = component_env(&name, c.env, c.set_env, defaults, &invalid)?;
    let parity_tests = match c.parity_test.into_inner() {
        OneOrMany::One(t) => vec![t],
        OneOrMany::Many(ts) => ts,
    };
    if parity_tests.is_empty() || parity_tests.iter().any(|t| t.trim().is_empty()) {
        return Err(invalid(format!(
            "component {name}: parity_test names no file"
        )));
    }
    let command = c.command.unwrap_or_else(|| shared.command.to_vec());
    if c.agent && shared.agent.is_none() {
        return Err(invalid(format!(
            "component {name}: agent = true but the spec has no [agent] table"
        )));
    }
    if command.is_empty() {
        return Err(invalid(format!("component {name}: command is empty")));
    }
    let worker_paths = component_worker_paths(&name, defaults, c.worker_paths, &invalid)?;
    let confirm_runs = c.confirm_runs.or(defaults.confirm_runs).unwrap_or(1);
    if confirm_runs == 0 {
        return Err(invalid(format!(
            "component {name}: confirm_runs must be at least 1"
        )));
    }
    for p in &c.paths {
        if let Err(e) = worker_path(p) {
            return Err(invalid(format!("component {name}: paths: {e}")));
        }
    }
    let variants = variants(&name, c.variants, &env, text, &|m| invalid(m))?;
    Ok(ComponentSpec {
        name,
        stage: Stage::Component,
        component_type: c.component_type.into_inner(),
        parity_tests,
        coverage_scope: c.coverage_scope.into_inner(),
        aliases: c.aliases,
        paths: c.paths,
        set_env,
        lines,
        preflight: defaults.preflight.clone(),
        gpus: c.gpus.or(defaults.gpus).unwrap_or(0),
        timeout: Duration::from_secs(
            seconds(c.timeout_s, "timeout_s", text, path)?
                .or(shared.timeout)
                .unwrap_or(600),
        ),
        env,
        command,
        agent: if c.agent { shared.agent.cloned() } else { None },
        placement: crate::Placement {
            priority: defaults.priority.unwrap_or(0),
            gpu_memory_mib: c.gpu_memory_mib.unwrap_or(0),
            gpu_share: c.gpu_share.or(defaults.gpu_share).unwrap_or(true),
            labels: c.labels.unwrap_or_default(),
            worker_paths,
            expected_ms: seconds(c.expected_s, "expected_s", text, path)?
                .map(|s| s.saturating_mul(1000)),
        },
        confirm_runs,
        trace: c.trace,
        modules: c.modules,
        variants,
        runner: shared.runner.clone(),
    })
}

/// The line of each of the component's required keys: `name`, `type`,
/// `parity_test` and `coverage_scope`.
fn component_lines(c: &RawComponent, text: &str) -> BTreeMap<String, usize> {
    let line_of = |start: usize| line_col(text, start).0;
    let mut lines = BTreeMap::new();
    lines.insert("name".to_string(), line_of(c.name.span().start));
    lines.insert("type".to_string(), line_of(c.component_type.span().start));
    lines.insert(
        "parity_test".to_string(),
        line_of(c.parity_test.span().start),
    );
    lines.insert(
        "coverage_scope".to_string(),
        line_of(c.coverage_scope.span().start),
    );
    lines
}

/// The variables component `name` passes through (its `env`, else the
/// default's) and those it sets (the default `set_env` with its own over
/// it), checked: names only, and none both passed and set.
fn component_env(
    name: &str,
    env: Option<Vec<String>>,
    own_set_env: BTreeMap<String, String>,
    defaults: &RawDefaults,
    invalid: &dyn Fn(String) -> SpecError,
) -> Result<(Vec<String>, BTreeMap<String, String>), SpecError> {
    let env = env.or_else(|| defaults.env.clone()).unwrap_or_default();
    for var in &env {
        if !is_env_name(var) {
            return Err(invalid(format!(
                "component {name}: env entry is not a variable name (specs name variables, never values)"
            )));
        }
    }
    let mut set_env = defaults.set_env.clone();
    for (var, value) in own_set_env {
        if !is_env_name(&var) {
            return Err(invalid(format!(
                "component {name}: set_env: {var:?} is not a variable name"
            )));
        }
        set_env.insert(var, value);
    }
    if let Some(var) = set_env.keys().find(|v| env.contains(v)) {
        return Err(invalid(format!(
            "component {name}: {var} is both passed through (env) and set (set_env)"
        )));
    }
    Ok((env, set_env))
}

/// The default `worker_paths` and component `name`'s own, each checked,
/// sorted and without repeats.
fn component_worker_paths(
    name: &str,
    defaults: &RawDefaults,
    own: Vec<String>,
    invalid: &dyn Fn(String) -> SpecError,
) -> Result<Vec<String>, SpecError> {
    let mut worker_paths: Vec<String> = defaults.worker_paths.clone();
    worker_paths.extend(own);
    for p in &worker_paths {
        if let Err(e) = worker_path(p) {
            return Err(invalid(format!("component {name}: worker_paths: {e}")));
        }
    }
    worker_paths.sort();
    worker_paths.dedup();
    Ok(worker_paths)
}

/// Most seconds a `timeout_s`, `max_wall_s` or `max_gpu_s` may hold: 366
/// days. More is a typo or an attempt at "forever", and as milliseconds it
/// would overflow (18446744073709552 s became 384 ms).
pub const MAX_SECONDS: u64 = 366 * 24 * 3600;

/// A number of seconds of the spec, checked: 1 to [`MAX_SECONDS`], or a
/// `file:line:col` error naming `key`.
fn seconds(
    v: Option<Spanned<u64>>,
    key: &str,
    text: &str,
    path: &Path,
) -> Result<Option<u64>, SpecError> {
    let Some(v) = v else { return Ok(None) };
    let (line, column) = line_col(text, v.span().start);
    let n = *v.get_ref();
    if (1..=MAX_SECONDS).contains(&n) {
        return Ok(Some(n));
    }
    Err(SpecError::Syntax {
        path: path.to_path_buf(),
        line,
        column,
        message: format!("{key} is {n}: it must be 1 to {MAX_SECONDS} seconds (366 days)"),
    })
}

/// `[agent] gpus`: 0 or `"component"`, else refused with its line and
/// column.
fn agent_gpus(
    v: Option<Spanned<RawAgentGpus>>,
    text: &str,
    path: &Path,
) -> Result<AgentGpus, SpecError> {
    let Some(v) = v else {
        return Ok(AgentGpus::None);
    };
    let (line, column) = line_col(text, v.span().start);
    match v.into_inner() {
        RawAgentGpus::Count(0) => Ok(AgentGpus::None),
        RawAgentGpus::Word(w) if w == "component" => Ok(AgentGpus::Component),
        other => Err(SpecError::Syntax {
            path: path.to_path_buf(),
            line,
            column,
            message: format!(
                "agent.gpus is {}: it must be 0 (a CPU slot) or \"component\" (the component's GPUs)",
                match other {
                    RawAgentGpus::Count(n) => n.to_string(),
                    RawAgentGpus::Word(w) => format!("{w:?}"),
                }
            ),
        }),
    }
}

/// The `[runner]` table, checked: each preload entry a dotted Python
/// module name, named with its line and column when it is not.
fn runner(raw: Option<RawRunner>, text: &str, path: &Path) -> Result<RunnerSpec, SpecError> {
    let Some(raw) = raw else {
        return Ok(RunnerSpec::default());
    };
    let mut out = RunnerSpec {
        mode: raw.mode,
        ..Default::default()
    };
    for m in raw.preload {
        let (line, column) = line_col(text, m.span().start);
        let name = m.into_inner();
        let ok = !name.is_empty()
            && name.split('.').all(|part| {
                !part.is_empty()
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !part.starts_with(|c: char| c.is_ascii_digit())
            });
        if !ok {
            return Err(SpecError::Syntax {
                path: path.to_path_buf(),
                line,
                column,
                message: format!(
                    "runner.preload: {} is not a python module name (dotted identifiers)",
                    fvd_paths::shown(&name)
                ),
            });
        }
        if out.preload.contains(&name) {
            continue;
        }
        out.preload.push(name);
        out.preload_at.push((line, column));
    }
    Ok(out)
}

/// Refuses a `[runner] preload` module that is part of the repository: a
/// warm zygote imports its preload once and forks every later run from it,
/// so a preloaded repository module would hide the next edit. A module is
/// the repository's when its top-level name is a package folder or a `.py`
/// file in `port_dir` (the folder `fvd submit --repo` names), in the top of
/// its git repository, or in a folder inside either that a `PYTHONPATH` of
/// the spec's `set_env` names (`{repo}` stands for `port_dir`). Reads only
/// whether those paths exist.
pub fn check_preload(spec: &PortSpec, port_dir: &Path) -> Result<(), SpecError> {
    let mut roots = vec![port_dir.to_path_buf()];
    if let Some(top) = port_dir.ancestors().find(|a| a.join(".git").exists()) {
        roots.push(top.to_path_buf());
    }
    let inside: Vec<PathBuf> = roots.clone();
    for c in &spec.components {
        if let Some(pp) = c.set_env.get("PYTHONPATH") {
            let pp = pp.replace("{repo}", &port_dir.to_string_lossy());
            for entry in pp.split(':').filter(|e| !e.is_empty()) {
                let p = Path::new(entry);
                let p = if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    port_dir.join(p)
                };
                // Only the repository's own paths: a library folder
                // elsewhere is what preloading is for.
                let p: PathBuf = p.components().collect();
                if inside.iter().any(|r| p.starts_with(r)) {
                    roots.push(p);
                }
            }
        }
    }
    roots.dedup();
    for (i, module) in spec.runner.preload.iter().enumerate() {
        let top = module.split('.').next().unwrap_or(module);
        let found = roots.iter().find(|r| {
            r.join(top).is_dir()
                || r.join(format!("{top}.py")).is_file()
                || r.join(format!("{top}.pyc")).is_file()
        });
        if let Some(root) = found {
            let (line, column) = spec.runner.preload_at.get(i).copied().unwrap_or((1, 1));
            return Err(SpecError::Syntax {
                path: PathBuf::from(&spec.path),
                line,
                column,
                message: format!(
                    "runner.preload: {module} is part of the repository ({}): a warm zygote would keep it across edits; preload libraries only",
                    root.join(top).display()
                ),
            });
        }
    }
    Ok(())
}

/// The component's variants, checked: unique identifiers other than
/// `baseline`, at most [`MAX_VARIANTS`], each overriding at least one
/// variable, by name, and none passed through by `env`.
fn variants(
    component: &str,
    raw: Vec<Spanned<RawVariant>>,
    passed: &[String],
    text: &str,
    invalid: &dyn Fn(String) -> SpecError,
) -> Result<Vec<VariantSpec>, SpecError> {
    if raw.len() > MAX_VARIANTS {
        return Err(invalid(format!(
            "component {component}: {} variants, more than {MAX_VARIANTS} (each is a run of the test)",
            raw.len()
        )));
    }
    let mut out: Vec<VariantSpec> = Vec::with_capacity(raw.len());
    for v in raw {
        let line = line_col(text, v.span().start).0;
        let v = v.into_inner();
        let name = v.name.into_inner().0;
        let at = |m: String| {
            invalid(format!(
                "component {component}: variant {name} (line {line}): {m}"
            ))
        };
        if name == "baseline" {
            return Err(at(
                "`baseline` names the red run's own row; pick another name".into(),
            ));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(at("listed twice".into()));
        }
        if v.env.is_empty() {
            return Err(at("env overrides no variable".into()));
        }
        if let Some(k) = v.env.keys().find(|k| !is_env_name(k)) {
            return Err(at(format!(
                "env: {} is not a variable name",
                fvd_paths::shown(k)
            )));
        }
        if let Some(k) = v.env.keys().find(|k| passed.contains(k)) {
            return Err(at(format!(
                "env: {k} is passed through (env); a variant sets only literal variables"
            )));
        }
        out.push(VariantSpec { name, env: v.env });
    }
    Ok(out)
}

/// A `worker_paths` entry: a relative path inside the port folder, written
/// with `/`, without `.` or `..` parts, so that a worker can link it into a
/// checkout at one place and placement can compare it with what workers
/// provide as plain strings.
pub fn worker_path(p: &str) -> Result<(), String> {
    let parts: Vec<&str> = p.split('/').collect();
    if p.is_empty()
        || p.starts_with('/')
        || parts
            .iter()
            .any(|x| x.is_empty() || *x == "." || *x == ".." || x.contains('\\'))
    {
        return Err(format!(
            "{} is not a relative path inside the port folder (parts joined by /, no . or .., no trailing /)",
            fvd_paths::shown(p)
        ));
    }
    Ok(())
}

pub(crate) fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// `text` with toml's escapes (`\uXXXX`, `\UXXXXXXXX`, `\xHH`, `\t`, `\"`,
/// …) decoded, line for line: the token scan then sees the strings the
/// parser will (found by fvd-fuzz: an escaped first character put a token
/// past the scan of the raw text and into an error message). Decoded
/// newlines and other control characters become spaces, so line numbers
/// stay those of the file.
fn decoded_for_scan(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let esc = &rest[at + 1..];
        let hex = |n: usize| {
            esc.get(1..=n)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .map(|v| (char::from_u32(v).unwrap_or(' '), n + 1))
        };
        let decoded = match esc.chars().next() {
            Some('u') => hex(4),
            Some('U') => hex(8),
            Some('x') => hex(2),
            Some(c @ ('"' | '\\')) => Some((c, 1)),
            Some('t' | 'n' | 'r' | 'b' | 'f' | 'e') => Some((' ', 1)),
            _ => None,
        };
        match decoded {
            Some((c, len)) => {
                out.push(if c.is_control() { ' ' } else { c });
                rest = &esc[len..];
            }
            None => {
                out.push('\\');
                rest = esc;
            }
        }
    }
    out.push_str(rest);
    out
}

/// 1-based line and column of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[prep]
model_family = "tiny"
official_env_status = "imports_ok"

[[component]]
name = "embed"
type = "generic"
parity_test = "tests/local_tests/generic/test_tiny_embed_parity.py"
coverage_scope = "both"
env = ["HF_TOKEN"]
"#;

    #[test]
    fn parses_defaults() {
        let s = parse(Path::new("port.toml"), GOOD).unwrap();
        assert_eq!(s.family, "tiny");
        let c = &s.components[0];
        assert_eq!(c.gpus, 0);
        assert_eq!(c.timeout, Duration::from_secs(600));
        assert_eq!(
            c.argv()[3],
            "tests/local_tests/generic/test_tiny_embed_parity.py"
        );
        assert!(c.argv().iter().any(|a| a == "--junitxml={junitxml}"));
    }

    #[test]
    fn placement_comes_from_defaults_and_the_component() {
        let text = GOOD
            .replace("[[component]]", "[defaults]\npriority = 3\n\n[[component]]")
            .replace(
                "env = [\"HF_TOKEN\"]",
                "env = [\"HF_TOKEN\"]\ngpu_memory_mib = 40000\nlabels = { site = \"a\" }\nexpected_s = 90",
            );
        let s = parse(Path::new("port.toml"), &text).unwrap();
        let p = &s.components[0].placement;
        assert_eq!(p.priority, 3);
        assert_eq!(p.gpu_memory_mib, 40_000);
        assert_eq!(p.expected_ms, Some(90_000));
        let timed = Placement {
            expected_ms: Some(1),
            ..Placement::default()
        };
        assert!(
            !timed.is_constrained(),
            "an expected duration constrains no worker"
        );
        assert_eq!(p.labels.get("site").map(String::as_str), Some("a"));
        assert!(p.worker_paths.is_empty());
    }

    #[test]
    fn gpu_share_defaults_to_true_and_follows_defaults_then_the_component() {
        let s = parse(Path::new("port.toml"), GOOD).unwrap();
        assert!(
            s.components[0].placement.gpu_share,
            "sharing is the default"
        );
        assert!(
            !Placement::default().gpu_share,
            "an unknown run keeps whole GPUs"
        );
        let off = GOOD.replace(
            "[[component]]",
            "[defaults]\ngpu_share = false\n\n[[component]]",
        );
        let s = parse(Path::new("port.toml"), &off).unwrap();
        assert!(!s.components[0].placement.gpu_share);
        let back = off.replace(
            "env = [\"HF_TOKEN\"]",
            "env = [\"HF_TOKEN\"]\ngpu_share = true",
        );
        let s = parse(Path::new("port.toml"), &back).unwrap();
        assert!(
            s.components[0].placement.gpu_share,
            "the component's own key wins"
        );
    }

    #[test]
    fn worker_paths_join_the_defaults_and_the_component_and_stay_inside() {
        let text = GOOD
            .replace(
                "[[component]]",
                "[defaults]\nworker_paths = [\"official_weights/tiny\"]\n\n[[component]]",
            )
            .replace(
                "env = [\"HF_TOKEN\"]",
                "env = [\"HF_TOKEN\"]\nworker_paths = [\"data/a.bin\", \"official_weights/tiny\"]",
            );
        let s = parse(Path::new("port.toml"), &text).unwrap();
        let p = &s.components[0].placement;
        assert_eq!(p.worker_paths, ["data/a.bin", "official_weights/tiny"]);
        assert!(p.is_constrained());
        for bad in ["/abs", "../up", "a/../b", "a//b", "a/", "./a", ""] {
            let t = text.replace("data/a.bin", bad);
            let err = parse(Path::new("port.toml"), &t).unwrap_err().to_string();
            assert!(
                err.contains("worker_paths") && err.contains("is not a relative path"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn syntax_error_names_line_and_column() {
        let bad = "[prep]\nmodel_family = \"tiny\"\nfoo = = 3\n";
        let err = parse(Path::new("x/port.toml"), bad)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("x/port.toml:3:"), "{err}");
    }

    #[test]
    fn env_values_are_refused() {
        // Not a token (those are refused earlier, see below), but no
        // variable name either.
        let bad = GOOD.replace("[\"HF_TOKEN\"]", "[\"my-token-value\"]");
        let err = parse(Path::new("p.toml"), &bad).unwrap_err().to_string();
        assert!(err.contains("not a variable name"), "{err}");
        assert!(
            !err.contains("my-token-value"),
            "the value must not be echoed: {err}"
        );
    }

    #[test]
    fn token_values_are_refused_without_echo() {
        let secret = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
        let bad = GOOD.replace(
            "official_env_status = \"imports_ok\"",
            &format!("official_env_status = \"imports_ok\"\nnote = \"{secret}\""),
        );
        let err = parse(Path::new("p.toml"), &bad).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:5: note:"), "{err}");
        assert!(!err.contains(secret), "{err}");
        // A token where the key belongs is not named either.
        let bad = GOOD.replace(
            "official_env_status = \"imports_ok\"",
            &format!("official_env_status = \"imports_ok\"\n{secret} = 1"),
        );
        let err = parse(Path::new("p.toml"), &bad).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:5: [redacted]:"), "{err}");
        assert!(!err.contains("hf_AbCd"), "{err}");
        // Nor one behind a toml escape, which the parser would decode.
        for escaped in ["\\u00e9", "\\t", "\\U000000e9", "\\x41 "] {
            let bad = GOOD.replace(
                "official_env_status = \"imports_ok\"",
                &format!("official_env_status = \"imports_ok\"\nnote = \"{escaped}{secret}\""),
            );
            let err = parse(Path::new("p.toml"), &bad).unwrap_err().to_string();
            assert!(err.starts_with("p.toml:5: note:"), "{escaped}: {err}");
            assert!(!err.contains("hf_AbCd"), "{err}");
        }
        assert_eq!(
            decoded_for_scan("a\\\\u00e9 \\q \\u12"),
            "a\\u00e9 \\q \\u12"
        );
    }

    #[test]
    fn agent_applies_only_to_components_that_ask() {
        let text = format!(
            "{GOOD}\n[[component]]\nname = \"b\"\ntype = \"generic\"\nparity_test = \"t.py\"\ncoverage_scope = \"both\"\nagent = true\n\n[agent]\ncommand = [\"agent\", \"{{prompt_file}}\", \"--n={{attempt}}\"]\nmax_attempts = 2\nenv = [\"OPENAI_API_KEY\"]\n"
        );
        let s = parse(Path::new("p.toml"), &text).unwrap();
        assert_eq!(s.components[0].agent, None);
        let a = s.components[1].agent.as_ref().expect("b has the agent");
        assert_eq!(a.max_attempts, 2);
        assert_eq!((a.max_wall, a.max_gpu_s), (None, None));
        assert!(a.cleanup.forbidden.iter().any(|p| p.contains("breakpoint")));
        let argv = a.argv(&AgentVars {
            prompt_file: "/p.md",
            handoff_file: "/h",
            worktree: "/w",
            family: "tiny",
            component: "b",
            attempt: 2,
        });
        assert_eq!(argv, ["agent", "/p.md", "--n=2"]);
        let orphan = text.split("[agent]").next().unwrap().to_string();
        let err = parse(Path::new("p.toml"), &orphan).unwrap_err().to_string();
        assert!(err.contains("component b: agent = true but"), "{err}");
    }

    #[test]
    fn a_preset_agent_has_a_model_a_key_variable_budgets_and_prices() {
        use agent_model::{ModelApi, Preset};
        let agent = |body: &str| format!("{GOOD}agent = true\n\n[agent]\n{body}");
        let text = agent(
            "preset = \"claude-code\"\nmodel = \"claude-sonnet-4-5-20250929\"\nmax_turns = 30\nextra_args = [\"--effort\", \"high\"]\n\n[agent.budget]\nusd_per_attempt = 2.5\ntokens_per_port = 5000000\n\n[agent.prices.\"claude-sonnet-4-5\"]\ninput = 3.5\noutput = 16\n",
        );
        let s = parse(Path::new("p.toml"), &text).unwrap();
        let a = s.components[0].agent.as_ref().unwrap();
        assert_eq!(a.preset, Some(Preset::ClaudeCode));
        assert!(a.command.is_empty());
        assert_eq!(a.extra_args, ["--effort", "high"]);
        let m = a.model.as_ref().unwrap();
        assert_eq!(m.api, ModelApi::Anthropic);
        assert_eq!(m.key_env, "ANTHROPIC_API_KEY");
        assert_eq!(m.max_turns, Some(30));
        assert_eq!(m.budget.usd_per_attempt, Some(2.5));
        assert_eq!(m.budget.tokens_per_port, Some(5_000_000));
        // The spec's price wins over the default; unset cache prices are
        // charged as input.
        let p = m.price("claude-sonnet-4-5-20250929").unwrap();
        assert_eq!((p.input, p.output, p.cache_read), (3.5, 16.0, 3.5));
        assert_eq!(m.price("claude-haiku-4-5").unwrap().input, 1.0);

        // opencode takes provider/model; the provider decides the API.
        let text = agent("preset = \"opencode\"\nmodel = \"openai/gpt-5\"\nkey_env = \"MY_KEY\"\n");
        let a = parse(Path::new("p.toml"), &text).unwrap().components[0]
            .agent
            .clone()
            .unwrap();
        let m = a.model.unwrap();
        assert_eq!(
            (m.api, m.key_env.as_str(), m.api_model()),
            (ModelApi::OpenAiChat, "MY_KEY", "gpt-5")
        );

        // A raw command may use the proxy too, naming its API.
        let text = agent("command = [\"aider\"]\napi = \"openai-chat\"\nmodel = \"gpt-5\"\n");
        let a = parse(Path::new("p.toml"), &text).unwrap().components[0]
            .agent
            .clone()
            .unwrap();
        assert_eq!(
            (a.preset, a.model.unwrap().key_env.as_str()),
            (None, "OPENAI_API_KEY")
        );
    }

    #[test]
    fn bad_preset_agents_are_refused_with_their_line() {
        let agent = |body: &str| format!("{GOOD}agent = true\n\n[agent]\n{body}");
        let first = GOOD.lines().count() + 4;
        for (body, line, want) in [
            (
                "preset = \"cursor\"\nmodel = \"m\"\n",
                Some(first),
                "agent.preset \"cursor\" is not one of claude-code, codex, opencode, gemini",
            ),
            (
                "preset = \"codex\"\n",
                Some(first),
                "agent.model is required with preset codex",
            ),
            (
                "preset = \"codex\"\ncommand = [\"x\"]\nmodel = \"m\"\n",
                None,
                "either preset or command",
            ),
            ("max_attempts = 2\n", None, "give a preset or a command"),
            (
                "preset = \"opencode\"\nmodel = \"gpt-5\"\n",
                Some(first + 1),
                "names no provider",
            ),
            (
                "preset = \"codex\"\nmodel = \"gpt-5\"\nenv = [\"OPENAI_API_KEY\"]\n",
                None,
                "agent.env passes OPENAI_API_KEY to the agent",
            ),
            (
                "preset = \"codex\"\nmodel = \"gpt-5\"\nkey_env = \"sk-abc\"\n",
                Some(first + 2),
                "agent.key_env is not a variable name",
            ),
            (
                "preset = \"codex\"\nmodel = \"gpt-5\"\nmax_turns = 0\n",
                Some(first + 2),
                "max_turns must be at least 1",
            ),
            (
                "preset = \"codex\"\nmodel = \"my-model\"\n[agent.budget]\nusd_per_attempt = 1\n",
                None,
                "model \"my-model\" has no price: add [agent.prices.\"my-model\"]",
            ),
            (
                "preset = \"codex\"\nmodel = \"gpt-5\"\n[agent.budget]\nusd_per_port = -1.0\n",
                Some(first + 3),
                "usd_per_port must be a positive number",
            ),
            (
                "command = [\"a\"]\n[agent.budget]\ntokens_per_attempt = 5\n",
                None,
                "agent.budget needs fvd's model proxy",
            ),
            (
                "command = [\"a\"]\nextra_args = [\"b\"]\n",
                None,
                "extra_args adds to a preset's command",
            ),
            (
                "preset = \"gemini\"\nmodel = \"gemini-2.5-pro\"\napi = \"gemini\"\n",
                Some(first + 2),
                "agent.api is for a raw command",
            ),
        ] {
            let err = parse(Path::new("p.toml"), &agent(body))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{body}: {err}");
            match line {
                Some(l) => assert!(err.starts_with(&format!("p.toml:{l}:")), "{body}: {err}"),
                None => assert!(err.starts_with("p.toml: "), "{body}: {err}"),
            }
        }
    }

    #[test]
    fn budgets_confirm_runs_and_cleanup_rules_are_read_and_checked() {
        let text = format!(
            "{GOOD}confirm_runs = 2\nagent = true\n\n[agent]\ncommand = [\"a\"]\nmax_wall_s = 600\nmax_gpu_s = 3600\nforbidden_patterns = [\"print\\\\(\"]\nallowed_untracked = [\"dumps/**\"]\n"
        );
        let s = parse(Path::new("p.toml"), &text).unwrap();
        let c = &s.components[0];
        assert_eq!(c.confirm_runs, 2);
        let a = c.agent.as_ref().unwrap();
        assert_eq!(a.max_wall, Some(Duration::from_secs(600)));
        assert_eq!(a.max_gpu_s, Some(3600));
        assert_eq!(a.cleanup.forbidden, ["print\\("]);
        assert_eq!(a.cleanup.allowed_untracked, ["dumps/**"]);
        let bad = text.replace("print\\\\(", "print(");
        let err = parse(Path::new("p.toml"), &bad).unwrap_err().to_string();
        assert!(
            err.starts_with("p.toml: agent.forbidden_patterns: forbidden pattern \"print(\""),
            "{err}"
        );
        let zero = text.replace("confirm_runs = 2", "confirm_runs = 0");
        let err = parse(Path::new("p.toml"), &zero).unwrap_err().to_string();
        assert!(err.contains("confirm_runs must be at least 1"), "{err}");
    }

    #[test]
    fn several_test_files_aliases_and_literal_env() {
        let text = GOOD.replace(
            "parity_test = \"tests/local_tests/generic/test_tiny_embed_parity.py\"",
            "parity_test = [\"t/a.py\", \"t/b.py\"]\naliases = [\"embed/tokenizer\"]\nset_env = { PYTHONPATH = \"{repo}\" }\ncommand = [\"python\", \"-m\", \"pytest\", \"{test}\", \"--files={test}\"]",
        );
        let s = parse(Path::new("p.toml"), &text).unwrap();
        let c = &s.components[0];
        assert_eq!(c.parity_tests, ["t/a.py", "t/b.py"]);
        assert_eq!(c.aliases, ["embed/tokenizer"]);
        assert_eq!(
            c.set_env.get("PYTHONPATH").map(String::as_str),
            Some("{repo}")
        );
        // `{test}` alone is one argument per file; inside an argument, the
        // files joined
        assert_eq!(
            c.argv(),
            [
                "python",
                "-m",
                "pytest",
                "t/a.py",
                "t/b.py",
                "--files=t/a.py t/b.py"
            ]
        );
        assert_eq!(c.lines.get("name"), Some(&7));
        assert_eq!(c.lines.get("coverage_scope"), Some(&13));
        assert_eq!(s.prep_lines.get("official_env_status"), Some(&4));
        let both = text.replace("[\"HF_TOKEN\"]", "[\"PYTHONPATH\"]");
        let err = parse(Path::new("p.toml"), &both).unwrap_err().to_string();
        assert!(err.contains("PYTHONPATH is both passed through"), "{err}");
        let empty = GOOD.replace(
            "\"tests/local_tests/generic/test_tiny_embed_parity.py\"",
            "[]",
        );
        let err = parse(Path::new("p.toml"), &empty).unwrap_err().to_string();
        assert!(err.contains("parity_test names no file"), "{err}");
    }

    #[test]
    fn same_run_ignores_lines_and_aliases_but_not_the_command() {
        let a = parse(Path::new("p.toml"), GOOD)
            .unwrap()
            .components
            .remove(0);
        let moved = parse(Path::new("p.toml"), &format!("\n\n{GOOD}"))
            .unwrap()
            .components
            .remove(0);
        assert_ne!(a.lines, moved.lines);
        assert!(a.same_run(&moved));
        let mut other = a.clone();
        other.aliases.push("x".into());
        assert!(a.same_run(&other));
        other.gpus = 1;
        assert!(!a.same_run(&other));
    }

    #[test]
    fn component_names_are_identifiers_refused_with_line_and_column() {
        for bad in [
            "../../../../tmp/x/esc",
            "a/b",
            "/abs",
            "c#trace",
            "Embed",
            "",
        ] {
            let text = GOOD.replace("name = \"embed\"", &format!("name = {bad:?}"));
            let err = parse(Path::new("p.toml"), &text).unwrap_err().to_string();
            // line 7 of GOOD, the value's column
            assert!(err.starts_with("p.toml:7:8: "), "{bad:?}: {err}");
            assert!(err.contains("is not an identifier"), "{bad:?}: {err}");
        }
        let long = "x/".repeat(5_000);
        let text = GOOD.replace("name = \"embed\"", &format!("name = {long:?}"));
        let err = parse(Path::new("p.toml"), &text).unwrap_err().to_string();
        assert!(err.len() < 400, "the name is cut: {err}");
    }

    #[test]
    fn variants_are_named_literal_overrides_checked_with_their_line() {
        let text = format!(
            "{GOOD}\n[[component.variant]]\nname = \"eps_fix\"\nenv = {{ EPS_FIX = \"1\" }}\n\n[[component.variant]]\nname = \"fp32\"\nenv = {{ FASTVIDEO_DTYPE = \"fp32\", PYTHONPATH = \"{{repo}}\" }}\n"
        );
        let s = parse(Path::new("p.toml"), &text).unwrap();
        let v = &s.components[0].variants;
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "eps_fix");
        assert_eq!(
            v[1].env_words(),
            ["FASTVIDEO_DTYPE=fp32", "PYTHONPATH={repo}"]
        );
        // Variants do not change what a run of the component is.
        let plain = parse(Path::new("p.toml"), GOOD).unwrap();
        assert!(plain.components[0].same_run(&s.components[0]));

        let refused = |from: &str, to: &str| {
            let bad = text.replace(from, to);
            parse(Path::new("p.toml"), &bad).unwrap_err().to_string()
        };
        let err = refused("\"fp32\"\nenv", "\"baseline\"\nenv");
        assert!(
            err.contains("variant baseline (line 17): `baseline` names the red run's own row"),
            "{err}"
        );
        let err = refused("\"fp32\"\nenv", "\"eps_fix\"\nenv");
        assert!(
            err.contains("variant eps_fix (line 17): listed twice"),
            "{err}"
        );
        let err = refused("\"fp32\"\nenv", "\"Fp-32\"\nenv");
        assert!(err.starts_with("p.toml:18:8: "), "{err}");
        assert!(
            err.contains("variant name \"Fp-32\" is not an identifier"),
            "{err}"
        );
        let err = refused("{ EPS_FIX = \"1\" }", "{}");
        assert!(err.contains("env overrides no variable"), "{err}");
        let err = refused("EPS_FIX = ", "eps-fix = ");
        assert!(err.contains("\"eps-fix\" is not a variable name"), "{err}");
        let err = refused("EPS_FIX = ", "HF_TOKEN = ");
        assert!(err.contains("HF_TOKEN is passed through (env)"), "{err}");
        let err = refused("name = \"eps_fix\"", "name = \"eps_fix\"\nwhy = 1");
        assert!(err.contains("unknown field `why`"), "{err}");
        // A token as a value is refused before anything is parsed, unechoed.
        let secret = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
        let err = refused("EPS_FIX = \"1\"", &format!("EPS_FIX = \"{secret}\""));
        assert!(err.starts_with("p.toml:15: "), "{err}");
        assert!(!err.contains("hf_AbCd"), "{err}");
        let many: String = (0..=MAX_VARIANTS)
            .map(|i| format!("\n[[component.variant]]\nname = \"v{i}\"\nenv = {{ A = \"1\" }}\n"))
            .collect();
        let err = parse(Path::new("p.toml"), &format!("{GOOD}{many}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("17 variants, more than 16"), "{err}");
    }

    #[test]
    fn a_spec_that_is_not_utf8_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("port.toml");
        let mut bytes = GOOD.as_bytes().to_vec();
        let at = GOOD.find("generic").unwrap();
        bytes[at + 3] = 0xff; // line 8: type = "gen\xffric"
        std::fs::write(&path, &bytes).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("{}:8:12: not utf-8 text (byte 0xff)", path.display())
        );
    }

    #[test]
    fn runner_is_cold_by_default_and_warm_names_its_preload() {
        let spec = parse(Path::new("port.toml"), GOOD).unwrap();
        assert_eq!(spec.runner, RunnerSpec::default());
        assert_eq!(spec.components[0].runner.warm_preload(), None);
        let text =
            format!("{GOOD}\n[runner]\nmode = \"warm\"\npreload = [\"torch\", \"numpy.linalg\"]\n");
        let spec = parse(Path::new("port.toml"), &text).unwrap();
        assert_eq!(spec.runner.mode, RunnerMode::Warm);
        assert_eq!(
            spec.components[0].runner.warm_preload(),
            Some(vec!["torch".to_string(), "numpy.linalg".to_string()])
        );
        let line = text.lines().position(|l| l.starts_with("preload")).unwrap() + 1;
        assert_eq!(spec.runner.preload_at[0].0, line);

        let bad = format!("{GOOD}\n[runner]\nmode = \"hot\"\n");
        let err = parse(Path::new("port.toml"), &bad).unwrap_err().to_string();
        let line = bad.lines().position(|l| l.starts_with("mode =")).unwrap() + 1;
        assert!(err.starts_with(&format!("port.toml:{line}:")), "{err}");
        assert!(err.contains("hot"), "{err}");
        let bad = format!("{GOOD}\n[runner]\nmode = \"warm\"\npreload = [\"torch\", \"../x\"]\n");
        let err = parse(Path::new("port.toml"), &bad).unwrap_err().to_string();
        let line = bad.lines().position(|l| l.starts_with("preload")).unwrap() + 1;
        assert!(err.starts_with(&format!("port.toml:{line}:")), "{err}");
        assert!(err.contains("not a python module name"), "{err}");
    }

    #[test]
    fn a_preload_module_of_the_repository_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        std::fs::create_dir_all(repo.join("fastvideo")).unwrap();
        std::fs::create_dir_all(repo.join("src/mylib")).unwrap();
        std::fs::write(repo.join("helpers.py"), "").unwrap();
        let ext = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ext.path().join("extlib")).unwrap();
        let text = format!(
            "{GOOD}set_env = {{ PYTHONPATH = \"{{repo}}/src:{}\" }}\n\n[runner]\nmode = \"warm\"\npreload = [\n  \"numpy\",\n  PLACE,\n]\n",
            ext.path().display()
        );
        let line = text.lines().position(|l| l.contains("PLACE")).unwrap() + 1;
        for (module, found) in [
            ("fastvideo.models", "fastvideo"),
            ("helpers", "helpers"),
            ("mylib", "src/mylib"),
        ] {
            let t = text.replace("PLACE", &format!("\"{module}\""));
            let spec = parse(Path::new("port.toml"), &t).unwrap();
            let err = check_preload(&spec, repo).unwrap_err().to_string();
            assert!(err.starts_with(&format!("port.toml:{line}:3: ")), "{err}");
            assert!(err.contains(module) && err.contains(found), "{err}");
        }
        // A library folder outside the repository is what preloading is for.
        for module in ["torch", "extlib"] {
            let t = text.replace("PLACE", &format!("\"{module}\""));
            let spec = parse(Path::new("port.toml"), &t).unwrap();
            check_preload(&spec, repo).unwrap();
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let bad = GOOD.replace(
            "coverage_scope = \"both\"",
            "coverage_scope = \"both\"\nbogus = 1",
        );
        let err = parse(Path::new("p.toml"), &bad).unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
        let long = "k".repeat(10_000);
        let bad = GOOD.replace(
            "coverage_scope = \"both\"",
            &format!("coverage_scope = \"both\"\n{long} = 1"),
        );
        let err = parse(Path::new("p.toml"), &bad).unwrap_err().to_string();
        assert!(err.starts_with("p.toml:11:1: unknown field `kkkk"), "{err}");
        assert!(err.len() < 400, "the key is cut: {err}");
        assert!(err.contains("k…`"), "{err}");
    }

    #[test]
    fn agent_gpus_is_a_cpu_slot_or_the_component_s_and_nothing_else() {
        let with = |v: &str| {
            parse(
                Path::new("p.toml"),
                &format!("{GOOD}agent = true\n\n[agent]\ncommand = [\"a\"]\ngpus = {v}\n"),
            )
        };
        let a = |v: &str| with(v).unwrap().components[0].agent.clone().unwrap();
        assert_eq!(a("0").gpus(2), 0);
        assert_eq!(a("\"component\"").gpus(2), 2);
        for bad in ["1", "\"all\""] {
            let err = with(bad).unwrap_err().to_string();
            assert!(
                err.contains("p.toml:") && err.contains("agent.gpus is"),
                "{err}"
            );
        }
    }

    /// 18446744073709552 s as milliseconds wrapped to 384 ms; every number of
    /// seconds is now refused past 366 days, naming its line and column.
    #[test]
    fn seconds_past_a_year_are_refused_with_their_line_and_column() {
        for (field, table) in [
            ("timeout_s", "defaults"),
            ("timeout_s", "component"),
            ("expected_s", "component"),
            ("timeout_s", "agent"),
            ("max_wall_s", "agent"),
            ("max_gpu_s", "agent"),
        ] {
            let line = format!("{field} = 18446744073709552");
            let text = match table {
                "defaults" => GOOD.replacen(
                    "[[component]]",
                    &format!("[defaults]\n{line}\n\n[[component]]"),
                    1,
                ),
                "component" => format!("{GOOD}{line}\n"),
                _ => format!("{GOOD}agent = true\n\n[agent]\ncommand = [\"a\"]\n{line}\n"),
            };
            let err = parse(Path::new("p.toml"), &text).unwrap_err().to_string();
            let at = text.lines().position(|l| l == line).unwrap() + 1;
            assert!(
                err.starts_with(&format!("p.toml:{at}:")) && err.contains("must be 1 to 31622400"),
                "{table}.{field}: {err}"
            );
        }
        let zero = format!("{GOOD}timeout_s = 0\n");
        assert!(parse(Path::new("p.toml"), &zero).is_err());
        let max = format!("{GOOD}timeout_s = {MAX_SECONDS}\n");
        let spec = parse(Path::new("p.toml"), &max).unwrap();
        assert_eq!(spec.components[0].timeout_ms(), MAX_SECONDS * 1000);
    }
}
