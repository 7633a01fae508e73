//! `fvd submit`, `fvd answer`, `fvd cancel`, `fvd reset`: the porter's
//! commands that change a port (the reads are in [`super::read`]). Without
//! `--orchestrator`, `submit` runs embedded: the same orchestrator and one
//! local worker in this process, talking real gRPC on loopback, with state
//! in `REPO/.fvd/state.db`.

use super::exit::Exit;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::HashMap;

use anyhow::{Context, bail};
use clap::Args;
use fvd_orchestrator::query::ComponentSnapshot;
use fvd_orchestrator::wire::{self, WatchEvent};
use fvd_proto::auth::{ClientAuth, Token};
use fvd_proto::v1 as pb;
use fvd_proto::v1::port_service_client::PortServiceClient;
use fvd_store::Store;
use fvd_store::model::{ComponentStatus, GateEventRow, GateOutcome};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tracing::Instrument;

use super::exit::Remote;
use super::render::{self, Shown, say};
use super::server::{local_worker_config, runtime};
use super::source::Target;

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Model family, as in `tests/local_tests/<family>/port.toml`.
    #[arg(long)]
    pub family: String,
    /// Port spec (default: REPO/tests/local_tests/FAMILY/port.toml).
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// Show progress until the port ends and exit with its outcome.
    /// Embedded mode always waits: the port runs in this process.
    #[arg(long)]
    pub wait: bool,
    /// Run every component again instead of resuming recorded verdicts.
    #[arg(long)]
    pub rerun: bool,
    /// Pin the port to this commit (any revision git understands) instead
    /// of the checkout's HEAD, or a snapshot of its uncommitted changes.
    #[arg(long, value_name = "REV")]
    pub commit: Option<String>,
    /// Start and write nothing: check the spec and the gate's P0/P2
    /// conditions, show the PORT_STATUS.md rows each component matches and
    /// the diff fvd would write there now from the recorded state.
    #[arg(long)]
    pub dry_run: bool,
    /// Warn when a snapshot of uncommitted changes adds more than this to
    /// the repository's objects (MiB).
    #[arg(long, value_name = "MIB", default_value_t = 16)]
    pub snapshot_warn_mib: u64,
    #[command(flatten)]
    pub local: LocalWorker,
    #[command(flatten)]
    pub target: Target,
}

/// What the local worker of embedded mode offers.
#[derive(Debug, Args)]
pub struct LocalWorker {
    /// Embedded mode: GPUs the local worker offers (all, none, or 0,1).
    #[arg(long, default_value = "all", value_name = "GPUS")]
    pub gpus: String,
    /// Embedded mode: parallel CPU slots of the local worker (default: cores).
    #[arg(long, value_name = "N")]
    pub cpu_slots: Option<u32>,
    /// Embedded mode: the jail tests and agents start in: auto (a namespace
    /// if this machine allows one, else Landlock, else none, with a
    /// warning), namespace, landlock or off.
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub job_sandbox: fvd_sandbox::Mode,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("choice").required(true).args(["option", "text"])))]
pub struct AnswerArgs {
    /// The port's family.
    pub family: String,
    /// The escape hatch, as `fvd status` and PORT_STATUS.md name it (`E001`).
    pub id: String,
    /// Pick one of the hatch's options (1-based).
    #[arg(long)]
    pub option: Option<u32>,
    /// Answer in words instead.
    #[arg(long)]
    pub text: Option<String>,
    /// With --orchestrator: show progress until the port ends or pauses
    /// again. Embedded mode always waits.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub local: LocalWorker,
    #[command(flatten)]
    pub target: Target,
}

/// Without --orchestrator, the `fvd submit` process running the port is
/// told, or, when none runs, the port is marked cancelled in
/// REPO/.fvd/state.db.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The port's family.
    pub family: String,
    #[command(flatten)]
    pub target: Target,
}

/// With --orchestrator, the port is forgotten there (its owner or an admin;
/// cancel a running port first): the next submit, from any checkout,
/// starts it over.
#[derive(Debug, Args)]
pub struct ResetArgs {
    /// The port's family.
    pub family: String,
    #[command(flatten)]
    pub target: Target,
}

/// The state database of embedded mode inside a repository.
pub fn state_db(repo: &Path) -> PathBuf {
    repo.join(".fvd").join("state.db")
}

/// What to say when a family has no spec at its default path (issue #41:
/// a never-initialised family got a raw `No such file or directory`): the
/// folder that is missing, or the spec `fvd init` writes, and the families
/// this repository has. `None` for any other error.
pub(crate) fn no_spec_hint(
    e: &fvd_spec::SpecError,
    repo: &Path,
    args: &SubmitArgs,
) -> Option<String> {
    let fvd_spec::SpecError::Read { path, source } = e else {
        return None;
    };
    if source.kind() != std::io::ErrorKind::NotFound || args.spec.is_some() {
        return None;
    }
    let local = repo.join("tests/local_tests");
    let mut families: Vec<String> = std::fs::read_dir(&local)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.path().join("port.toml").is_file())
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    families.sort();
    let known = if families.is_empty() {
        "no family here has a port.toml yet".to_string()
    } else {
        format!("families with a spec here: {}", families.join(", "))
    };
    let folder = path.parent().unwrap_or(repo);
    let family = &args.family;
    Some(if folder.is_dir() {
        format!(
            "family {family} has no spec: {} does not exist; `fvd init --family {family}` writes it from that folder's PORT_STATUS.md and tests ({known})",
            path.display()
        )
    } else {
        format!(
            "no family {family} in {}: {} does not exist ({known}); a new port starts with `fvd init --family {family}` once its folder holds PORT_STATUS.md or its parity tests",
            repo.display(),
            folder.display()
        )
    })
}

pub fn submit(mut args: SubmitArgs) -> anyhow::Result<Exit> {
    if args.spec.is_none() {
        args.target.repo = super::find_repo(&args.target.repo, &args.family);
    }
    if args.dry_run {
        return super::dry_run::run(&args);
    }
    // Validate locally first: a bad spec is a usage error named by file,
    // line and column, before anything starts.
    let Some((repo, spec_path, parsed)) = checked_spec(&args) else {
        return Ok(Exit::Usage);
    };
    let spec_toml = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("cannot read {}", spec_path.display()))?;
    let rt = runtime()?;
    let Some(commit) = pinned_commit(&rt, &repo, &args, &parsed) else {
        return Ok(Exit::Usage);
    };
    let request = pb::SubmitRequest {
        family: args.family.clone(),
        repo: repo.display().to_string(),
        spec_path: spec_path.display().to_string(),
        spec_toml,
        rerun: args.rerun,
        commit,
    };
    let rt = runtime()?;
    // The port's run continues this command's span, which continues the
    // port's trace (an embedded resume, read from the port's state here)
    // or the caller's (an agent's `TRACEPARENT`).
    let span = tracing::info_span!(
        "submit",
        "fvd.family" = %args.family,
        "fvd.embedded" = args.target.orchestrator.is_none()
    );
    if !span.is_disabled() {
        let stored = match &args.target.orchestrator {
            None => rt.block_on(stored_trace(&repo, &args.family)),
            Some(_) => None,
        };
        continue_trace(&span, stored, args.rerun);
    }
    // `block_on` polls the command's future on this thread, inside the span.
    let _in_span = span.enter();
    rt.block_on(async move {
        match &args.target.orchestrator {
            Some(url) => {
                let mut client = args.target.client(url).await?;
                let before = history_end(&mut client, &args.family).await;
                send(&mut client, request, &format!("on {url}")).await?;
                if args.wait {
                    watch(&mut client, &args.family, before, &args.target).await
                } else {
                    Ok(Exit::Success)
                }
            }
            None => embedded(&repo, Action::Submit(request), &args.local, &args.target).await,
        }
    })
}

/// The repository, the spec's path and the spec of a submit, loaded and
/// checked against `--family`; `None` once the error is printed (a usage
/// error).
pub(super) fn checked_spec(args: &SubmitArgs) -> Option<(PathBuf, PathBuf, fvd_spec::PortSpec)> {
    let repo = match args.target.repo.canonicalize() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fvd: error: repository {}: {e}", args.target.repo.display());
            return None;
        }
    };
    let spec_path = args
        .spec
        .clone()
        .unwrap_or_else(|| fvd_spec::default_path(&repo, &args.family));
    let parsed = match fvd_spec::load(&spec_path)
        .and_then(|s| fvd_spec::check_preload(&s, &repo).map(|()| s))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "fvd: error: {}",
                no_spec_hint(&e, &repo, args).unwrap_or(e.to_string())
            );
            return None;
        }
    };
    if parsed.family != args.family {
        eprintln!(
            "fvd: error: {}: prep.model_family is {} but --family is {}",
            spec_path.display(),
            parsed.family,
            args.family
        );
        return None;
    }
    Some((repo, spec_path, parsed))
}

/// The commit every job of the port runs (docs/fleet.md "Running on a
/// fleet"): `--commit`, HEAD, or a snapshot of the uncommitted changes on top
/// of HEAD, said on stderr with a warning when the snapshot is large; empty
/// outside a git work tree, `None` once the error is printed (a usage error).
fn pinned_commit(
    rt: &tokio::runtime::Runtime,
    repo: &Path,
    args: &SubmitArgs,
    parsed: &fvd_spec::PortSpec,
) -> Option<String> {
    let fvd_writes: Vec<String> = parsed
        .prep
        .get("port_state_file")
        .into_iter()
        .cloned()
        .collect();
    let pin = rt.block_on(fvd_workspace::commit::pin(
        repo,
        &args.family,
        args.commit.as_deref(),
        &fvd_writes,
    ));
    if let Ok(Some(p)) = &pin
        && p.snapshot.is_some()
        && let Ok(Some(view)) = rt.block_on(fvd_workspace::commit::preview(repo, &fvd_writes))
        && view.bytes > args.snapshot_warn_mib.saturating_mul(1024 * 1024)
    {
        eprintln!("fvd: warning: {}", snapshot_warning(&view));
    }
    match pin {
        Ok(Some(p)) => {
            match &p.snapshot {
                Some(name) => say(format_args!(
                    "port {} runs commit {}: a snapshot of the uncommitted changes on top of HEAD, kept as {name} (the checkout, its index and HEAD are untouched)",
                    args.family,
                    &p.sha[..12]
                )),
                None => say(format_args!(
                    "port {} runs commit {}",
                    args.family,
                    &p.sha[..12]
                )),
            }
            Some(p.sha)
        }
        Ok(None) => Some(String::new()),
        Err(e) => {
            eprintln!("fvd: error: {e}");
            None
        }
    }
}

/// The size warning of a large snapshot, in one line.
pub fn snapshot_warning(view: &fvd_workspace::commit::Preview) -> String {
    format!(
        "the snapshot of uncommitted changes adds {} file(s), {}, to the repository's objects (largest: {}); git-ignore outputs and data, or commit what belongs to the port (--snapshot-warn-mib sets this warning)",
        view.files,
        human_bytes(view.bytes),
        view.largest
            .iter()
            .map(|(p, b)| format!("{p} {}", human_bytes(*b)))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Bytes as people read them.
pub fn human_bytes(b: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if b >= MIB {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    } else if b >= 1024 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// What an embedded run asks of the orchestrator it starts.
enum Action {
    Submit(pb::SubmitRequest),
    Answer(pb::AnswerRequest),
}

/// `fvd answer`: records the answer to an escape hatch; the component that
/// asked goes on with it.
pub fn answer(mut args: AnswerArgs) -> anyhow::Result<Exit> {
    args.target.repo = super::find_repo(&args.target.repo, &args.family);
    let request = pb::AnswerRequest {
        family: args.family.clone(),
        id: args.id.trim().to_uppercase(),
        choice: match (args.option, &args.text) {
            (Some(n), _) => Some(pb::answer_request::Choice::Option(n)),
            (None, Some(t)) => Some(pb::answer_request::Choice::Text(t.clone())),
            (None, None) => unreachable!("clap requires one of --option and --text"),
        },
        said_by: local_person(&args.target.repo),
    };
    let rt = runtime()?;
    // `fvd answer` resumes the port: its span continues the port's trace
    // (read from the port's state in embedded mode), and the resumed run
    // hangs under it.
    let span = tracing::info_span!(
        "answer",
        "fvd.family" = %args.family,
        "fvd.id" = %request.id,
        "fvd.embedded" = args.target.orchestrator.is_none()
    );
    if !span.is_disabled() {
        let stored = match (&args.target.orchestrator, args.target.repo.canonicalize()) {
            (None, Ok(repo)) => rt.block_on(stored_trace(&repo, &args.family)),
            _ => None,
        };
        continue_trace(&span, stored, false);
    }
    let _in_span = span.enter();
    rt.block_on(async move {
        match &args.target.orchestrator {
            Some(url) => {
                let mut client = args.target.client(url).await?;
                let before = history_end(&mut client, &args.family).await;
                send_answer(&mut client, request).await?;
                if args.wait {
                    watch(&mut client, &args.family, before, &args.target).await
                } else {
                    Ok(Exit::Success)
                }
            }
            None => {
                let repo = args
                    .target
                    .repo
                    .canonicalize()
                    .with_context(|| format!("repository {}", args.target.repo.display()))?;
                // The port must exist here: answering starts nothing new.
                open_local(&repo).await?;
                embedded(&repo, Action::Answer(request), &args.local, &args.target).await
            }
        }
    })
}

/// Who is answering, as this machine knows its person: the repository's
/// git `user.name`, else the login name; empty when neither is known. A
/// server that checks credentials records the credential's name instead.
fn local_person(repo: &Path) -> String {
    // The person's own configuration is what names them: fvd's git reads
    // no global configuration, this one read does (it runs nothing).
    let git = fvd_git::blocking_command(repo)
        .env_remove("GIT_CONFIG_GLOBAL")
        .env_remove("GIT_CONFIG_NOSYSTEM")
        .args(["config", "--get", "user.name"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|n| !n.is_empty());
    let name = git
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .unwrap_or_default();
    // One line of printable text, short: it goes into records.
    name.chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect::<String>()
        .trim()
        .to_string()
}

/// The trace context stored with an embedded port, if the repository has
/// fvd state and the port recorded one. Telemetry never fails a command:
/// an unreadable state is no context.
async fn stored_trace(repo: &Path, family: &str) -> Option<String> {
    let db = state_db(repo);
    if !db.is_file() {
        return None;
    }
    let store = Store::open_path(&db).await.ok()?;
    store.port_traceparent(family).await.ok().flatten()
}

/// Hangs this command's span where the port's run belongs: under the
/// port's stored trace (`stored`), linking the caller's `TRACEPARENT`, or
/// under the caller's when the port has none or `rerun` starts it over; a
/// caller who does not sample is honoured.
fn continue_trace(span: &tracing::Span, stored: Option<String>, rerun: bool) {
    let caller = std::env::var(fvd_telemetry::TRACEPARENT).ok();
    fvd_telemetry::Continuation::decide(stored.as_deref(), caller.as_deref(), rerun).apply(span);
}

async fn send_answer(client: &mut Client, request: pb::AnswerRequest) -> anyhow::Result<()> {
    let span = rpc_span("Answer", &client.url);
    let request = span.in_scope(|| traced(request));
    let r = client.answer(request).instrument(span.clone()).await;
    let r = rpc_ended(&span, r)
        .map_err(|e| client.fail(e))?
        .into_inner();
    let e = r
        .escape
        .context("the orchestrator returned no escape hatch")?;
    println!(
        "answered {} of component {}: {}",
        e.id, e.component, e.answer
    );
    Ok(())
}

/// Submits and says whether the port started or resumed, and where.
async fn send(client: &mut Client, request: pb::SubmitRequest, place: &str) -> anyhow::Result<()> {
    let span = rpc_span("Submit", &client.url);
    let request = span.in_scope(|| traced(request));
    let r = client.submit(request).instrument(span.clone()).await;
    let r = rpc_ended(&span, r)
        .map_err(|e| client.fail(e))?
        .into_inner();
    let verb = if r.rerun {
        "reran every component of"
    } else if r.resumed {
        "resumed"
    } else {
        "submitted"
    };
    say(format_args!("{verb} port {} {place}", r.family));
    for change in &r.changes {
        say(format_args!("  spec changed: {change}"));
    }
    if !r.commit_change.is_empty() {
        say(format_args!("  commit changed: {}", r.commit_change));
    }
    Ok(())
}

/// Embedded mode: orchestrator and worker in this process over loopback.
async fn embedded(
    repo: &Path,
    action: Action,
    local: &LocalWorker,
    target: &Target,
) -> anyhow::Result<Exit> {
    let family = match &action {
        Action::Submit(r) => r.family.clone(),
        Action::Answer(r) => r.family.clone(),
    };
    if let Some(live) = super::embedded::live(repo, &family) {
        eprintln!(
            "fvd: error: port {family} is running in process {} (an fvd submit or answer in {}); wait for it, or run `{}`",
            live.pid,
            repo.display(),
            target.hint(repo, &["cancel", &family])
        );
        return Ok(Exit::Usage);
    }
    super::embedded::state_dir(repo)?;
    let db = state_db(repo);
    let store = Store::open_path(&db).await?;
    let spec = match &action {
        Action::Submit(r) => Some((r.spec_path.clone(), r.spec_toml.clone())),
        Action::Answer(_) => store
            .port(&family)
            .await?
            .map(|p| (p.spec_path, p.spec_toml)),
    };
    // The worker's address and token are the embedded server's own.
    let mut worker = local_worker_config(
        String::new(),
        repo.join(".fvd").join("worker"),
        &local.gpus,
        local.cpu_slots,
        None,
        None,
        None,
    )
    .await?;
    let agents = embedded_agents(repo, spec.as_ref(), local.job_sandbox)?;
    // Tests may not write `.fvd/` (the state database, the agents' files)
    // but for the worker's folder and the worktrees they run in (issue
    // #39: a forged state database).
    let fvd = repo.join(".fvd");
    std::fs::create_dir_all(fvd.join("worktrees"))
        .with_context(|| format!("cannot create {}", fvd.join("worktrees").display()))?;
    worker.jail = agents
        .jail
        .read_only(std::slice::from_ref(&fvd))
        .writable(&[fvd.join("worker"), fvd.join("worktrees")]);
    worker.provides = embedded_provides(repo, spec);
    let embedded = fvd_orchestrator::embedded::Embedded::start(store, worker, agents).await?;
    // The token is in the run file for the owner's own `fvd cancel`.
    let _run_file =
        super::embedded::RunFile::write(repo, &family, &embedded.url(), embedded.token())?;
    let mut client = client(&embedded.url(), Some(embedded.token().clone()), None).await?;
    let run = async {
        let before = history_end(&mut client, &family).await;
        match action {
            Action::Submit(request) => {
                let place = format!("(embedded, state in {})", db.display());
                send(&mut client, request, &place).await?;
            }
            Action::Answer(request) => send_answer(&mut client, request).await?,
        }
        watch(&mut client, &family, before, target).await
    };
    let code = tokio::select! {
        code = run => code,
        why = super::embedded::interrupted() => {
            eprintln!(
                "fvd: {why}: stopping; the running tests are ended and the port resumes with `{}`",
                target.hint(repo, &["submit", "--family", &family])
            );
            Ok(Exit::Interrupted)
        }
    };
    embedded.stop().await;
    code
}

/// Embedded mode's jail and agent policy. The porter runs their own spec on
/// their own machine: its agent commands run (those of the spec this
/// command read, no other: a test that reached the loopback orchestrator
/// could otherwise submit one of its own). Tests and agents start in the
/// jail `mode` asks for; `auto` without any goes on unjailed, with a
/// warning. With a namespace, the run files of `.fvd/run` (the loopback
/// token `fvd cancel` uses) are hidden too; Landlock would make every file
/// created later directly in the repository's top folder unreadable to
/// them, so it does not hide them (docs/fleet.md "Containment").
fn embedded_agents(
    repo: &Path,
    spec: Option<&(String, String)>,
    mode: fvd_sandbox::Mode,
) -> anyhow::Result<fvd_workspace::agent::AgentPolicy> {
    let commands = spec
        .and_then(|(path, text)| fvd_spec::parse(Path::new(path), text).ok())
        .map(|s| {
            s.components
                .iter()
                .filter_map(|c| c.agent.as_ref().map(|a| a.command.clone()))
                .collect()
        })
        .unwrap_or_default();
    let jail = match super::server::jail(mode, &[]) {
        Ok(j) => j,
        Err(e) if mode == fvd_sandbox::Mode::Auto => {
            eprintln!("fvd: warning: tests and agents run unjailed: {e:#}");
            fvd_sandbox::Jail::off()
        }
        Err(e) => return Err(e),
    };
    let jail = if jail.mechanism() == Some(fvd_sandbox::Mechanism::Namespace) {
        let run = repo.join(".fvd").join("run");
        std::fs::create_dir_all(&run)
            .with_context(|| format!("cannot create {}", run.display()))?;
        jail.hiding(&[run])
    } else {
        jail
    };
    Ok(fvd_workspace::agent::AgentPolicy {
        commands: fvd_workspace::agent::AgentCommands::Only(commands),
        // Embedded mode's one worker is this host: the agent works in the
        // component's worktree, with no pack to carry back.
        on: fvd_workspace::agent::AgentsOn::Host,
        jail,
        secrets: Default::default(),
        registry: Default::default(),
        // `run_parity`'s snapshots are capped as a fleet's attempts are.
        limits: Default::default(),
    })
}

/// What embedded mode's worker provides: the spec's `worker_paths` that
/// this machine's checkout has (it runs the jobs there, or links them into
/// a checkout of its own when the checkout has moved on from the port's
/// commit). A path the checkout lacks is not provided, so the scheduler
/// says at once which path is missing.
fn embedded_provides(
    repo: &Path,
    spec: Option<(String, String)>,
) -> Vec<fvd_worker::code::Provide> {
    let Some((path, text)) = spec else {
        return Vec::new();
    };
    let Ok(spec) = fvd_spec::parse(Path::new(&path), &text) else {
        return Vec::new();
    };
    let mut paths: Vec<String> = spec
        .components
        .iter()
        .flat_map(|c| c.placement.worker_paths.iter().cloned())
        .collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|p| {
            let at = repo.join(&p);
            at.exists().then_some(fvd_worker::code::Provide {
                path: p,
                target: Some(at),
            })
        })
        .collect()
}

/// Just after the port's last recorded gate decision, by the
/// orchestrator's clock (0 for a port it does not know): what a watch
/// replays from before is the port's history, not this run's.
async fn history_end(client: &mut Client, family: &str) -> Before {
    let Ok(reply) = client
        .status(pb::StatusRequest {
            family: family.to_string(),
        })
        .await
    else {
        return Before::default();
    };
    let ports: Vec<pb::PortSnapshot> = reply
        .into_inner()
        .ports
        .into_iter()
        .filter(|p| p.family == family)
        .collect();
    let since = ports
        .iter()
        .flat_map(|p| p.gate_events.iter().map(|g| g.at_ms + 1))
        .max()
        .unwrap_or(0);
    let shown = ports
        .into_iter()
        .flat_map(|p| p.components)
        .filter_map(|c| wire::from_component(c).ok())
        .map(|c| (c.name.clone(), Line::of(&c)))
        .collect();
    Before { since, shown }
}

/// What a port showed before this command: its gate history's end (ms),
/// and each component's line, which a resumed run announces again and the
/// watch does not repeat.
#[derive(Default)]
struct Before {
    since: i64,
    shown: HashMap<String, Line>,
}

/// What a component's progress line says: a line equal to the last one
/// shown for the component is not printed again.
#[derive(PartialEq)]
struct Line {
    status: ComponentStatus,
    runs: u32,
    reason: String,
}

impl Line {
    fn of(c: &ComponentSnapshot) -> Self {
        Line {
            status: c.status,
            runs: c.runs,
            reason: c.reason.clone(),
        }
    }
}

/// How long a watched port may have runs waiting with no worker connected
/// before the watch says so.
const NO_WORKER_AFTER: Duration = Duration::from_secs(2);

/// Follows a port's events until it ends; returns the exit code. Gate
/// decisions recorded before `since` (a resumed port's history, see
/// [`history_end`]) are not printed again. While components wait for a
/// worker, the orchestrator's queue is asked every [`NO_WORKER_AFTER`]: runs
/// waiting with no worker connected are said once, with what they need.
async fn watch(
    client: &mut Client,
    family: &str,
    before: Before,
    target: &Target,
) -> anyhow::Result<Exit> {
    let mut stream = client
        .watch(pb::WatchRequest {
            family: family.to_string(),
        })
        .await
        .map_err(|e| client.fail(e))?
        .into_inner();
    let progress = Progress::new(std::io::stderr().is_terminal(), super::color(), before);
    let mut waiting: HashMap<String, bool> = HashMap::new();
    let mut told_no_worker = false;
    let mut check = tokio::time::interval(NO_WORKER_AFTER);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the first check comes one period in.
    check.tick().await;
    loop {
        let message = tokio::select! {
            m = stream.message() => m.map_err(|e| client.fail(e))?,
            _ = check.tick() => {
                if !told_no_worker && waiting.values().any(|w| *w) {
                    told_no_worker = no_worker(client, family, target).await;
                }
                continue;
            }
        };
        let Some(ev) = message else { break };
        match wire::from_event(ev)? {
            Some(WatchEvent::Component(c)) => {
                waiting.insert(
                    c.name.clone(),
                    matches!(c.status, ComponentStatus::Queued | ComponentStatus::Pending),
                );
                progress.component(&c);
            }
            Some(WatchEvent::Gate(g)) => progress.gate(&g),
            Some(WatchEvent::Finished(snap)) => {
                progress.finish();
                render::print_snapshot(
                    Shown {
                        snap: &snap,
                        interrupted: false,
                    },
                    target,
                );
                if !snap.status_write_error.is_empty() {
                    eprintln!(
                        "fvd: error: PORT_STATUS.md was not written, so it does not show these verdicts: {}",
                        snap.status_write_error
                    );
                    return Ok(Exit::StatusNotWritten);
                }
                return Ok(render::outcome(&snap));
            }
            None => {}
        }
    }
    // No summary follows: a refusal held back is said in full.
    if let Some(held) = progress.held.borrow_mut().take() {
        progress.gate_line(&held, false);
    }
    progress.finish();
    bail!("the orchestrator closed the watch of {family} before the port ended")
}

/// Asks the orchestrator's queue whether `family`'s waiting runs have any
/// worker to go to; when none is connected, says so (once) with what each
/// run needs and how to start a worker. True once said.
async fn no_worker(client: &mut Client, family: &str, target: &Target) -> bool {
    let Ok(reply) = client
        .queue(pb::QueueRequest {
            family: family.to_string(),
        })
        .await
    else {
        return false;
    };
    let queue = wire::from_queue(reply.into_inner());
    if queue.workers != Some(0) || queue.jobs.is_empty() {
        return false;
    }
    let needs: Vec<String> = queue
        .jobs
        .iter()
        .map(|j| format!("{} needs {}", j.component, j.needs.describe()))
        .collect();
    let url = target
        .orchestrator
        .as_deref()
        .unwrap_or(client.url.as_str());
    let hint = worker_hint(url, target, &queue);
    let note = hint
        .token_note
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    eprintln!(
        "fvd: no worker is connected to {url}: {} run(s) of {family} wait ({}); on a machine that has what they need, start one with `{}`{note}",
        queue.jobs.len(),
        needs.join("; "),
        hint.command
    );
    true
}

/// `fvd worker …` that would take `queue`'s runs: this orchestrator, its
/// CA, the labels and paths the runs ask for, a workspace in the home
/// folder of whatever machine runs it (never the porter's checkout), and,
/// when this client holds a token, a placeholder for a worker credential's
/// token with how to make one: a porter's own token may not connect as a
/// worker, and a relative path means nothing elsewhere (issue #43).
fn worker_hint(url: &str, target: &Target, queue: &fvd_orchestrator::query::Queue) -> WorkerHint {
    use super::source::shell_quote;
    let mut words: Vec<String> = vec![
        "fvd".into(),
        "worker".into(),
        "--orchestrator".into(),
        url.into(),
    ];
    let credentials = target.token.token_file.is_some() || target.token.token_env.is_some();
    if credentials {
        words.extend(["--token-file".into(), "WORKER_TOKEN_FILE".into()]);
    }
    if let Some(ca) = &target.tls.tls_ca {
        let ca = std::path::absolute(ca).unwrap_or_else(|_| ca.clone());
        words.extend(["--tls-ca".into(), ca.display().to_string()]);
    }
    if queue.jobs.iter().all(|j| j.needs.gpus == 0) {
        words.extend(["--gpus".into(), "none".into()]);
    }
    let mut labels: Vec<String> = queue
        .jobs
        .iter()
        .flat_map(|j| j.needs.labels.iter().map(|(k, v)| format!("{k}={v}")))
        .collect();
    labels.sort();
    labels.dedup();
    for l in labels {
        words.extend(["--label".into(), l]);
    }
    let mut line = words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ");
    // Expanded by the shell of the machine it is pasted on.
    line.push_str(" --workspace \"$HOME/fvd-worker\"");
    WorkerHint {
        command: line,
        token_note: credentials.then_some(
            "WORKER_TOKEN_FILE: a token of role worker or admin; a porter's or viewer's is refused; on the orchestrator's host `fvd auth add NAME --role worker --file AUTH_FILE --out WORKER_TOKEN_FILE` makes one",
        ),
    }
}

/// A worker command to paste, and what its token placeholder stands for.
struct WorkerHint {
    command: String,
    token_note: Option<&'static str>,
}

/// Live progress. On a terminal, one spinner line per component updated in
/// place, with gate decisions printed above them; otherwise (logs, CI,
/// pipes) one plain line per change, so the record reads the same.
struct Progress {
    bars: Option<(
        MultiProgress,
        std::cell::RefCell<HashMap<String, ProgressBar>>,
    )>,
    color: bool,
    /// Gate events before this (ms) are history, not this run's.
    since: i64,
    /// The line last shown for each component (at first, the port's state
    /// before this command).
    shown: std::cell::RefCell<HashMap<String, Line>>,
    /// Reasons already printed (plain lines), by state and reason, with
    /// the component that said each first: a cause many components share
    /// is said once.
    said: std::cell::RefCell<std::collections::HashMap<(String, String), String>>,
    /// The latest refusal, not printed yet: a later gate decision shows it
    /// with its reasons (the summary may not list them then: a red
    /// pipeline sent back to P6 whose fix passes); at the end it points to
    /// the summary, which lists them.
    held: std::cell::RefCell<Option<GateEventRow>>,
}

impl Progress {
    fn new(tty: bool, color: bool, before: Before) -> Self {
        Self {
            bars: tty.then(|| (MultiProgress::new(), Default::default())),
            color,
            since: before.since,
            shown: std::cell::RefCell::new(before.shown),
            said: Default::default(),
            held: Default::default(),
        }
    }

    fn paint(&self, code: &str, text: String) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text
        }
    }

    fn component(&self, c: &ComponentSnapshot) {
        // said already, by this watch or before it
        let now = Line::of(c);
        if self.shown.borrow().get(&c.name) == Some(&now) {
            return;
        }
        self.shown.borrow_mut().insert(c.name.clone(), now);
        let mut line = c.status.as_str().to_string();
        // the run's number, as the file and `fvd logs` name it
        if c.last_run > 0 {
            line.push_str(&format!("  run {}", c.last_run));
        }
        let running = c.status == ComponentStatus::Running;
        if !c.worker_id.is_empty() && running {
            line.push_str(&format!(" on {}", c.worker_id));
        }
        // what the machine lacks is said once, in the summary
        let grouped =
            c.status == ComponentStatus::Environment || c.reason.starts_with("unplaced: ");
        let Some((mp, bars)) = &self.bars else {
            if grouped {
                line.push_str("  (cause below)");
            } else if !c.reason.is_empty() && !running {
                // a cause many components share is said once: a later
                // component in the same state for the same reason names
                // the first one (a pass's "1 passed" is said each time)
                let key = (c.status.as_str().to_string(), c.reason.clone());
                let pass = c.status == ComponentStatus::NonSkipPass;
                let mut said = self.said.borrow_mut();
                match said.get(&key) {
                    Some(first) if !pass && first != &c.name => {
                        line.push_str(&format!("  (as {first}, above)"));
                    }
                    _ => {
                        said.insert(key, c.name.clone());
                        line.push_str(&format!("  {}", c.reason));
                    }
                }
            }
            eprintln!("  {:<16} {line}", c.name);
            return;
        };
        if !c.reason.is_empty() && !running {
            line.push_str(&format!("  {}", c.reason));
        }
        let mut bars = bars.borrow_mut();
        let bar = bars.entry(c.name.clone()).or_insert_with(|| {
            let b = mp.add(ProgressBar::new_spinner());
            let template = if self.color {
                "{spinner:.cyan} {prefix:16} {wide_msg}"
            } else {
                "{spinner} {prefix:16} {wide_msg}"
            };
            b.set_style(ProgressStyle::with_template(template).expect("valid progress template"));
            b.set_prefix(c.name.clone());
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        match c.status {
            ComponentStatus::NonSkipPass => bar.finish_with_message(self.paint("32", line)),
            ComponentStatus::Blocked => bar.finish_with_message(self.paint("31", line)),
            _ => bar.set_message(line),
        }
    }

    fn gate(&self, g: &GateEventRow) {
        if g.at_ms < self.since {
            // decided in an earlier run of the port: history
            return;
        }
        if let Some(held) = self.held.borrow_mut().take() {
            self.gate_line(&held, false);
        }
        if g.outcome == GateOutcome::Refused && !g.conditions.is_empty() {
            *self.held.borrow_mut() = Some(g.clone());
            return;
        }
        self.gate_line(g, false);
    }

    /// Prints gate decision `g`; a refusal's reasons are listed once, in
    /// the summary, when it is the last decision (`last`).
    fn gate_line(&self, g: &GateEventRow, last: bool) {
        let why = match (g.outcome.as_str(), g.conditions.as_slice()) {
            (_, []) => String::new(),
            ("refused", c) if last => {
                let n = render::grouped_conditions(c).len();
                format!(" ({n} reason{} below)", if n == 1 { "" } else { "s" })
            }
            (_, c) => format!(": {}", c.join("; ")),
        };
        let line = format!("gate {} {}{why}", g.phase, g.outcome);
        match &self.bars {
            Some((mp, _)) => {
                let _ = mp.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(held) = self.held.borrow_mut().take() {
            self.gate_line(&held, true);
        }
        if let Some((_, bars)) = &self.bars {
            for b in bars.borrow().values() {
                if !b.is_finished() {
                    b.abandon();
                }
            }
        }
        let _ = std::io::stderr().flush();
    }
}

pub fn cancel(args: CancelArgs) -> anyhow::Result<Exit> {
    let rt = runtime()?;
    rt.block_on(async move {
        let t = &args.target;
        let (url, token, tls) = match &t.orchestrator {
            Some(url) => (url.clone(), t.token.load_client()?, t.tls.load()?),
            None => {
                let repo = super::find_repo(&t.repo, &args.family)
                    .canonicalize()
                    .with_context(|| format!("repository {}", t.repo.display()))?;
                match super::embedded::live(&repo, &args.family) {
                    // The process running the port ends it, its tests
                    // first.
                    Some(live) => (live.url, Some(live.token), None),
                    None => return cancel_in_place(&repo, &args.family).await,
                }
            }
        };
        let mut client = client(&url, token, tls).await?;
        client
            .cancel(pb::CancelRequest {
                family: args.family.clone(),
            })
            .await
            .map_err(|e| client.fail(e))?;
        say(format_args!("cancelled port {}", args.family));
        Ok(Exit::Success)
    })
}

/// Runs `call` against an orchestrator over the repository's embedded
/// state that runs nothing (no worker, no port resumed): the `PortService`
/// call and the actors behind it are the ones every other change goes
/// through, so the CLI never writes the store itself.
async fn with_control<T>(
    repo: &Path,
    call: impl AsyncFnOnce(&mut Client) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let store = open_local(repo).await?;
    let control = fvd_orchestrator::embedded::Control::start(store).await?;
    let result = match client(&control.url(), Some(control.token().clone()), None).await {
        Ok(mut c) => call(&mut c).await,
        Err(e) => Err(e),
    };
    control.stop().await;
    result
}

/// `fvd cancel F` of an embedded port no process runs: cancelled in
/// place, through the orchestrator's `Cancel`.
async fn cancel_in_place(repo: &Path, family: &str) -> anyhow::Result<Exit> {
    let (port, open) = {
        let store = open_local(repo).await?;
        let port = store
            .port(family)
            .await?
            .with_context(|| format!("no port {family} in {}", state_db(repo).display()))?;
        let open: Vec<String> = store
            .components(family)
            .await?
            .into_iter()
            .filter(|c| !c.is_final())
            .map(|c| c.name)
            .collect();
        (port, open)
    };
    with_control(repo, async |c| {
        c.cancel(pb::CancelRequest {
            family: family.to_string(),
        })
        .await
        .map_err(|e| c.fail(e))
    })
    .await?;
    say(format_args!(
        "cancelled port {family} (it was {}; no fvd process was running it){}",
        port.state,
        if open.is_empty() {
            String::new()
        } else {
            format!(": {} stopped", open.join(", "))
        }
    ));
    Ok(Exit::Success)
}

/// `fvd reset F`: forgets the port's state, through the orchestrator's
/// `Reset` (an embedded port's on an orchestrator over its state that runs
/// nothing). Refused while a process runs the port.
pub fn reset(args: ResetArgs) -> anyhow::Result<Exit> {
    let t = &args.target;
    if let Some(url) = &t.orchestrator {
        return runtime()?.block_on(async {
            let mut client = t.client(url).await?;
            client
                .reset(pb::ResetRequest {
                    family: args.family.clone(),
                })
                .await
                .map_err(|e| client.fail(e))?;
            say(format_args!(
                "reset port {} on {url}: its runs, verdicts, questions and attempt ledger are forgotten there (the log of who changed it stays); the next fvd submit, from any checkout, starts it over",
                args.family
            ));
            Ok(Exit::Success)
        });
    }
    let repo = super::find_repo(&t.repo, &args.family)
        .canonicalize()
        .with_context(|| format!("repository {}", t.repo.display()))?;
    if let Some(live) = super::embedded::live(&repo, &args.family) {
        eprintln!(
            "fvd: error: port {} is running in process {}; run `{}` first",
            args.family,
            live.pid,
            t.hint(&repo, &["cancel", &args.family])
        );
        return Ok(Exit::Usage);
    }
    let rt = runtime()?;
    rt.block_on(async move {
        let known = open_local(&repo).await?.port(&args.family).await?.is_some();
        if !known {
            eprintln!(
                "fvd: error: no port {} in {}",
                args.family,
                state_db(&repo).display()
            );
            return Ok(Exit::Usage);
        }
        with_control(&repo, async |c| {
            c.reset(pb::ResetRequest {
                family: args.family.clone(),
            })
            .await
            .map_err(|e| c.fail(e))
        })
        .await?;
        // its snapshots name no recorded verdict any more
        let refs = match fvd_workspace::commit::prune_snapshots(&repo, &args.family, &[]).await {
            Ok(n) => format!("{n} snapshot ref(s) refs/fvd/snapshots/{}/* removed", args.family),
            Err(e) => format!("its snapshot refs could not be removed: {e}"),
        };
        say(format_args!(
            "reset port {}: its runs, verdicts, questions and attempt ledger are forgotten; {refs}; the next fvd submit starts it over. Kept: PORT_STATUS.md, port.toml, agent branches fvd/{}/* and their worktrees",
            args.family, args.family
        ));
        Ok(Exit::Success)
    })
}

pub async fn open_local(repo: &Path) -> anyhow::Result<Store> {
    let db = state_db(repo);
    if !db.is_file() {
        bail!(
            "no fvd state at {} (submit a port there first, or pass --orchestrator URL)",
            db.display()
        );
    }
    Ok(Store::open_path(&db).await?)
}

/// A port client that presents the token, when one is configured, and
/// knows its orchestrator's URL for the errors scripts act on.
#[derive(Debug, Clone)]
pub struct Client {
    grpc: PortServiceClient<InterceptedService<Channel, ClientAuth>>,
    pub url: String,
}

impl std::ops::Deref for Client {
    type Target = PortServiceClient<InterceptedService<Channel, ClientAuth>>;
    fn deref(&self) -> &Self::Target {
        &self.grpc
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.grpc
    }
}

impl Client {
    /// A failed call as an error: [`Remote`] (exit 5 or 6) when the
    /// orchestrator was unreachable or refused the credential, else the
    /// server's message (exit 2).
    pub fn fail(&self, s: tonic::Status) -> anyhow::Error {
        match Remote::of(&self.url, &s) {
            Some(r) => r.into(),
            None => anyhow::anyhow!("{}", s.message()),
        }
    }
}

pub async fn client(
    url: &str,
    token: Option<Token>,
    tls_ca: Option<Vec<u8>>,
) -> anyhow::Result<Client> {
    let channel = fvd_proto::transport::endpoint(url, tls_ca.as_deref())?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| {
            // The transport error's own text, then its causes, on one line.
            let mut cause = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let text = s.to_string();
                if !cause.contains(&text) {
                    cause.push_str(&format!(": {text}"));
                }
                source = s.source();
            }
            Remote::Unreachable {
                url: url.to_string(),
                cause,
            }
        })?;
    Ok(Client {
        grpc: PortServiceClient::with_interceptor(channel, ClientAuth::new(token)),
        url: url.to_string(),
    })
}

/// The client span of one call to the orchestrator's `PortService`, named
/// and described as OpenTelemetry's RPC conventions say, so a trace shows
/// which server the CLI called and how the call ended.
fn rpc_span(method: &'static str, url: &str) -> tracing::Span {
    let uri = url.parse::<tonic::codegen::http::Uri>().ok();
    let host = uri
        .as_ref()
        .and_then(|u| u.host())
        .unwrap_or_default()
        .to_string();
    let port = uri.as_ref().and_then(|u| u.port_u16()).map(i64::from);
    tracing::info_span!(
        "PortService",
        otel.name = %format!("fvd.v1.PortService/{method}"),
        otel.kind = "client",
        rpc.system = "grpc",
        rpc.service = "fvd.v1.PortService",
        rpc.method = method,
        server.address = %host,
        server.port = port,
        rpc.grpc.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Records how a call ended on its client span (gRPC's status code, and
/// the span's error status when the call failed).
fn rpc_ended<T>(
    span: &tracing::Span,
    r: Result<tonic::Response<T>, tonic::Status>,
) -> Result<tonic::Response<T>, tonic::Status> {
    let code = match &r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    };
    span.record("rpc.grpc.status_code", code as i64);
    if code != tonic::Code::Ok {
        span.record("otel.status_code", "ERROR");
    }
    r
}

/// A submit or answer call, carrying the trace context as W3C `traceparent`
/// gRPC metadata: this process's span when it exports, else an inherited
/// `TRACEPARENT`, else none (the port continues or starts its own trace).
fn traced<T>(request: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(request);
    let context = fvd_telemetry::current_traceparent()
        .or_else(|| std::env::var(fvd_telemetry::TRACEPARENT).ok());
    if let Some(value) = context.and_then(|tp| tp.parse().ok()) {
        request.metadata_mut().insert("traceparent", value);
    }
    request
}
