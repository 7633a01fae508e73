//! `fvd agents check`: runs each configured agent preset once, behind the
//! same model proxy as a real attempt, with a one-line task in a throw-away
//! folder, and says which CLI version answered, with which model, at which
//! endpoint, whether the key works, and what the check cost.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use fvd_agentproxy::Trip;
use fvd_spec::AgentSpec;
use fvd_workspace::session::{self, Allowance, Session};

use super::exit::Exit;

#[derive(Debug, Subcommand)]
pub enum AgentsCmd {
    /// Run each port's agent preset once with a one-line task: the CLI's
    /// version, the model, the endpoint, whether the key works, the cost.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The repository whose ports to check.
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Only this family's spec (`tests/local_tests/<family>/port.toml`);
    /// every port of the repository when left out.
    #[arg(long)]
    pub family: Option<String>,
    /// Seconds one check may take.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    /// Print one JSON object per check.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: AgentsCmd) -> anyhow::Result<Exit> {
    match cmd {
        AgentsCmd::Check(a) => check(a),
    }
}

/// What one spec's check found.
#[derive(Debug, serde::Serialize)]
struct Checked {
    spec: String,
    preset: String,
    program: String,
    version: String,
    model: String,
    endpoint: String,
    key_env: String,
    /// `works`, `refused`, `not_set`, `unreachable`, `unchecked`.
    key: String,
    reply: String,
    requests: u32,
    tokens: u64,
    cost_usd: f64,
    problem: String,
}

/// The specs to check: the family's, or every `tests/local_tests/*/port.toml`.
fn specs(args: &CheckArgs) -> anyhow::Result<Vec<PathBuf>> {
    if let Some(f) = &args.family {
        return Ok(vec![fvd_spec::default_path(&args.repo, f)]);
    }
    let root = args.repo.join("tests/local_tests");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&root)
        .with_context(|| format!("cannot list {} (pass --family)", root.display()))?
    {
        let p = e?.path().join("port.toml");
        if p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn check(args: CheckArgs) -> anyhow::Result<Exit> {
    let rt = super::server::runtime()?;
    let mut exit = Exit::Success;
    let mut seen = 0;
    for path in specs(&args)? {
        let spec = fvd_spec::load(&path)?;
        let Some(agent) = spec.components.iter().find_map(|c| c.agent.clone()) else {
            continue;
        };
        seen += 1;
        let c = rt.block_on(check_one(
            &path,
            &agent,
            Duration::from_secs(args.timeout_s),
        ))?;
        // A key or an endpoint to fix (4) outranks anything else (1).
        exit = match (c.key.as_str(), exit) {
            ("refused" | "not_set" | "unreachable", _) => Exit::Environment,
            (_, Exit::Environment) => Exit::Environment,
            ("works", e) if c.problem.is_empty() => e,
            _ => Exit::Findings,
        };
        if args.json {
            println!("{}", serde_json::to_string(&c)?);
        } else {
            print(&c);
        }
    }
    if seen == 0 {
        anyhow::bail!(
            "no port of {} has an agent (an [agent] table and a component with agent = true)",
            args.repo.display()
        );
    }
    Ok(exit)
}

fn print(c: &Checked) {
    println!("{}: {}", c.spec, c.preset);
    if !c.program.is_empty() {
        println!("  cli: {} {}", c.program, c.version);
    }
    println!("  model: {} at {}", c.model, c.endpoint);
    let key = match c.key.as_str() {
        "works" => "works".to_string(),
        "refused" => "refused by the API".to_string(),
        "not_set" => "not set in fvd's environment".to_string(),
        "unreachable" => "not checked: the API cannot be reached".to_string(),
        _ => "not checked".to_string(),
    };
    println!("  key ({}): {key}", c.key_env);
    if c.requests > 0 {
        println!(
            "  the check: {} request(s), {} tokens, ${:.4}; the agent said: {}",
            c.requests, c.tokens, c.cost_usd, c.reply
        );
    }
    if !c.problem.is_empty() {
        println!("  problem: {}", c.problem);
    }
}

/// The check of `agent` before anything ran: its spec and preset, the key
/// not checked.
fn unchecked(path: &Path, agent: &AgentSpec) -> Checked {
    Checked {
        spec: path.display().to_string(),
        preset: agent
            .preset
            .map(|p| p.name().to_string())
            .unwrap_or_else(|| "command".into()),
        program: String::new(),
        version: String::new(),
        model: String::new(),
        endpoint: String::new(),
        key_env: String::new(),
        key: "unchecked".into(),
        reply: String::new(),
        requests: 0,
        tokens: 0,
        cost_usd: 0.0,
        problem: String::new(),
    }
}

/// The one-line task of a check.
const TASK: &str =
    "fvd agents check: reply with the single word ok. Do not use any tool or read any file.\n";

/// Runs `agent` (of the spec at `path`) once on the one-line task and says
/// what answered, whether the key works and what the check cost.
async fn check_one(path: &Path, agent: &AgentSpec, timeout: Duration) -> anyhow::Result<Checked> {
    let mut c = unchecked(path, agent);
    let (Some(preset), Some(model)) = (agent.preset, agent.model.as_ref()) else {
        c.problem = "a raw [agent] command is not checked: run it yourself".into();
        return Ok(c);
    };
    c.model = model.api_model().to_string();
    c.key_env = model.key_env.clone();
    c.endpoint = std::env::var(model.api.base_url_env())
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| model.api.default_base_url().to_string());
    let Some(program) =
        fvd_workspace::preset::find_program(preset, std::env::var_os("PATH").as_deref())
    else {
        c.problem = format!(
            "{} is not installed (not on PATH nor in FVD_AGENT_CLI_DIR)",
            preset.program()
        );
        return Ok(c);
    };
    c.program = program.display().to_string();
    let dir = tempfile::tempdir()?;
    c.version = version(&program, dir.path()).await;
    // A check spends at most two turns and ten cents.
    let mut m = model.clone();
    m.max_turns = Some(2);
    let allowance = Allowance {
        usd: Some(model.budget.usd_per_attempt.unwrap_or(0.10).min(0.10)),
        tokens: None,
    };
    let sess = match Session::start(
        agent,
        &m,
        allowance,
        "check".into(),
        session::default_retry(),
        None,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            c.key = if std::env::var(&model.key_env)
                .unwrap_or_default()
                .trim()
                .is_empty()
            {
                "not_set".into()
            } else {
                "unchecked".into()
            };
            c.problem = e.0;
            return Ok(c);
        }
    };
    let exit = run_check(&sess, agent, m, preset, &c.program, dir.path(), timeout).await?;
    judge(&mut c, &sess, exit, preset, timeout);
    Ok(c)
}

/// Launches the agent's CLI (`program`) on the one-line task in the
/// throw-away folder `dir`, behind the session's model proxy, and waits for
/// it to end.
async fn run_check(
    sess: &Session,
    agent: &AgentSpec,
    m: fvd_spec::agent_model::ModelSpec,
    preset: fvd_spec::agent_model::Preset,
    program: &str,
    dir: &Path,
    timeout: Duration,
) -> anyhow::Result<fvd_workspace::agent::AgentExit> {
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    let spec = AgentSpec {
        model: Some(m),
        ..agent.clone()
    };
    let launch = session::launch(
        sess,
        &spec,
        preset,
        TASK,
        session::Place {
            dir,
            jailed: false,
            mcp: None,
        },
    )?;
    let mut argv = launch.argv;
    argv[0] = program.to_string();
    // fvd's own command in a throw-away folder: no jail, the environment
    // any agent gets.
    let policy = fvd_workspace::agent::AgentPolicy::default();
    let exit = fvd_workspace::agent::run_with(
        &argv,
        fvd_workspace::agent::RunAgent {
            cwd: &work,
            env_names: &agent.env,
            extra: &launch.env,
            timeout,
            log_dir: dir,
            policy: &policy,
        },
        Some(launch.stdin),
        sess.stopped(),
    )
    .await;
    Ok(exit)
}

/// Fills in what the check found from the agent's exit and what its model
/// proxy saw: usage, the reply, whether the key works, the problem if any.
fn judge(
    c: &mut Checked,
    sess: &Session,
    exit: fvd_workspace::agent::AgentExit,
    preset: fvd_spec::agent_model::Preset,
    timeout: Duration,
) {
    let report = fvd_workspace::preset::report(preset, &exit.stdout);
    let u = sess.proxy().usage();
    c.requests = u.requests;
    c.tokens = u.tokens.total();
    c.cost_usd = u.cost_usd;
    c.reply =
        fvd_workspace::agent::tail(report.result.as_deref().unwrap_or("").trim(), 200).to_string();
    // A model that answers the check with a tool call (the check allows
    // none) walks the CLI into its turn cap: the CLI, the key and the
    // endpoint answered, which is what the check asks (issue #43).
    let turn_capped = matches!(sess.proxy().tripped(), Some(Trip::Turns(_)))
        || report.cap == Some(fvd_workspace::preset::Cap::Turns);
    match sess.proxy().tripped() {
        Some(Trip::Auth { status }) => {
            c.key = "refused".into();
            c.problem = format!(
                "the API answered {status}: fix {} in fvd's environment",
                c.key_env
            );
        }
        Some(Trip::Upstream { message, .. }) => {
            c.key = "unreachable".into();
            c.problem = message;
        }
        _ if u.tokens.total() > 0 => c.key = "works".into(),
        _ => {}
    }
    if let Some(e) = &exit.spawn_error {
        c.problem = e.clone();
    } else if exit.timed_out {
        c.problem = format!("the check did not end within {} s", timeout.as_secs());
    } else if c.problem.is_empty() && turn_capped && c.key == "works" {
        c.reply = "(the model answered with a tool call, which the check allows none of: the CLI stopped at its turn cap; the CLI, the key and the endpoint work)".into();
    } else if c.problem.is_empty() && exit.exit_code != Some(0) {
        c.problem = report.error.unwrap_or_else(|| {
            fvd_workspace::agent::exit_text(exit.exit_code, exit.signal, exit.timed_out)
        });
    }
}

/// `PROGRAM --version`, first line, in a throw-away HOME.
async fn version(program: &Path, home: &Path) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(program)
            .arg("--version")
            .env("HOME", home)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await;
    match out {
        Ok(Ok(o)) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        _ => "unknown (--version did not answer)".into(),
    }
}
