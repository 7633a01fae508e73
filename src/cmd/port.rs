//! `fvd submit`, `fvd status`, `fvd logs`, `fvd cancel`, `fvd answer`,
//! `fvd attempts`: the porter's commands. Without `--orchestrator`, `submit` runs embedded: the same
//! orchestrator and one local worker in this process, talking real gRPC on
//! loopback, with state in `REPO/.fvd/state.db`.

use super::exit::Exit;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::HashMap;

use anyhow::{Context, bail};
use clap::Args;
use fvd_proto::auth::{ClientAuth, Token};
use fvd_proto::v1 as pb;
use fvd_proto::v1::port_service_client::PortServiceClient;
use fvd_store::Store;
use fvd_store::model::{ComponentStatus, PortState};
use fvd_store::states::AttemptState;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::exit::Remote;
use super::server::{ClientTls, TokenArgs, local_worker_config, runtime};

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Model family, as in `tests/local_tests/<family>/port.toml`.
    #[arg(long)]
    pub family: String,
    /// The port's repository (default: the current directory).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Port spec (default: REPO/tests/local_tests/FAMILY/port.toml).
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// Orchestrator URL (`http://HOST:PORT`); embedded mode when absent.
    #[arg(long)]
    pub orchestrator: Option<String>,
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
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

/// What the local worker of embedded mode offers.
#[derive(Debug, Args)]
pub struct LocalWorker {
    /// Embedded mode: GPUs the local worker offers (all, none, or 0,1).
    #[arg(long, default_value = "all")]
    pub gpus: String,
    /// Embedded mode: parallel CPU slots of the local worker (default: cores).
    #[arg(long)]
    pub cpu_slots: Option<u32>,
    /// Embedded mode: the jail tests and agents start in: auto (a namespace
    /// if this machine allows one, else Landlock, else none, with a
    /// warning), namespace, landlock or off.
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub job_sandbox: fvd_sandbox::Mode,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One family, or every port when absent.
    pub family: Option<String>,
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    #[arg(long)]
    pub orchestrator: Option<String>,
    #[arg(long)]
    pub json: bool,
    /// Exit non-zero unless every port shown is running or passed, as
    /// `git diff --exit-code` does: 1 blocked, failed or cancelled, 3
    /// waiting for an answer, 4 waiting for an environment (the worst
    /// first, in that order).
    #[arg(long)]
    pub exit_status: bool,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub family: String,
    pub component: String,
    /// Run number (1-based); the latest run when absent.
    #[arg(long)]
    pub run: Option<u32>,
    /// Keep streaming until the run ends.
    #[arg(long)]
    pub follow: bool,
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    #[arg(long)]
    pub orchestrator: Option<String>,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

#[derive(Debug, Args)]
pub struct AttemptsArgs {
    pub family: String,
    pub component: String,
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Every recorded field, diffs and handoff blocks included.
    #[arg(long)]
    pub json: bool,
    /// Ask this orchestrator instead of reading REPO/.fvd/state.db.
    #[arg(long)]
    pub orchestrator: Option<String>,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("choice").required(true).args(["option", "text"])))]
pub struct AnswerArgs {
    pub family: String,
    /// The escape hatch, as `fvd status` and PORT_STATUS.md name it (`E001`).
    pub id: String,
    /// Pick one of the hatch's options (1-based).
    #[arg(long)]
    pub option: Option<u32>,
    /// Answer in words instead.
    #[arg(long)]
    pub text: Option<String>,
    /// The port's repository, for embedded mode (default: the current directory).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Orchestrator URL; embedded mode (the port resumes in this process)
    /// when absent.
    #[arg(long)]
    pub orchestrator: Option<String>,
    /// With --orchestrator: show progress until the port ends or pauses
    /// again. Embedded mode always waits.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub local: LocalWorker,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    pub family: String,
    /// The port's repository, for embedded mode (default: the current
    /// directory).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Orchestrator URL; embedded mode when absent: the `fvd submit`
    /// process running the port is told, or, when none runs, the port is
    /// marked cancelled in REPO/.fvd/state.db.
    #[arg(long)]
    pub orchestrator: Option<String>,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

#[derive(Debug, Args)]
pub struct ResetArgs {
    pub family: String,
    /// The port's repository (default: the current directory).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Forget the port on this orchestrator instead (its owner or an
    /// admin; cancel a running port first): the next submit, from any
    /// checkout, starts it over.
    #[arg(long)]
    pub orchestrator: Option<String>,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

/// The state database of embedded mode inside a repository.
pub fn state_db(repo: &Path) -> PathBuf {
    repo.join(".fvd").join("state.db")
}

pub fn submit(mut args: SubmitArgs) -> anyhow::Result<Exit> {
    if args.spec.is_none() {
        args.repo = super::find_repo(&args.repo, &args.family);
    }
    if args.dry_run {
        return super::dry_run::run(&args);
    }
    let repo = match args.repo.canonicalize() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fvd: error: repository {}: {e}", args.repo.display());
            return Ok(Exit::Usage);
        }
    };
    let spec_path = args
        .spec
        .clone()
        .unwrap_or_else(|| fvd_spec::default_path(&repo, &args.family));
    // Validate locally first: a bad spec is a usage error named by file,
    // line and column, before anything starts.
    let parsed = match fvd_spec::load(&spec_path)
        .and_then(|s| fvd_spec::check_preload(&s, &repo).map(|()| s))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fvd: error: {e}");
            return Ok(Exit::Usage);
        }
    };
    if parsed.family != args.family {
        eprintln!(
            "fvd: error: {}: prep.model_family is {} but --family is {}",
            spec_path.display(),
            parsed.family,
            args.family
        );
        return Ok(Exit::Usage);
    }
    let spec_toml = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("cannot read {}", spec_path.display()))?;
    let rt = runtime()?;
    // The commit every job of the port runs (README "Running on a fleet").
    let fvd_writes: Vec<String> = parsed
        .prep
        .get("port_state_file")
        .into_iter()
        .cloned()
        .collect();
    let pin = rt.block_on(fvd_workspace::commit::pin(
        &repo,
        &args.family,
        args.commit.as_deref(),
        &fvd_writes,
    ));
    if let Ok(Some(p)) = &pin
        && p.snapshot.is_some()
        && let Ok(Some(view)) = rt.block_on(fvd_workspace::commit::preview(&repo, &fvd_writes))
        && view.bytes > args.snapshot_warn_mib.saturating_mul(1024 * 1024)
    {
        eprintln!("fvd: warning: {}", snapshot_warning(&view));
    }
    let commit = match pin {
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
            p.sha
        }
        Ok(None) => String::new(),
        Err(e) => {
            eprintln!("fvd: error: {e}");
            return Ok(Exit::Usage);
        }
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
        family = %args.family,
        embedded = args.orchestrator.is_none()
    );
    if !span.is_disabled() {
        let stored = match &args.orchestrator {
            None => rt.block_on(stored_trace(&repo, &args.family)),
            Some(_) => None,
        };
        continue_trace(&span, stored, args.rerun);
    }
    // `block_on` polls the command's future on this thread, inside the span.
    let _in_span = span.enter();
    rt.block_on(async move {
        match args.orchestrator {
            Some(url) => {
                let mut client = client(&url, args.token.load()?, args.tls.load()?).await?;
                let since = history_end(&mut client, &args.family).await;
                send(&mut client, request, &format!("on {url}")).await?;
                if args.wait {
                    watch(&mut client, &args.family, since).await
                } else {
                    Ok(Exit::Success)
                }
            }
            None => embedded(&repo, Action::Submit(request), &args.local).await,
        }
    })
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
    args.repo = super::find_repo(&args.repo, &args.family);
    let request = pb::AnswerRequest {
        family: args.family.clone(),
        id: args.id.trim().to_uppercase(),
        choice: match (args.option, &args.text) {
            (Some(n), _) => Some(pb::answer_request::Choice::Option(n)),
            (None, Some(t)) => Some(pb::answer_request::Choice::Text(t.clone())),
            (None, None) => unreachable!("clap requires one of --option and --text"),
        },
    };
    let rt = runtime()?;
    // `fvd answer` resumes the port: its span continues the port's trace
    // (read from the port's state in embedded mode), and the resumed run
    // hangs under it.
    let span = tracing::info_span!(
        "answer",
        family = %args.family,
        id = %request.id,
        embedded = args.orchestrator.is_none()
    );
    if !span.is_disabled() {
        let stored = match (&args.orchestrator, args.repo.canonicalize()) {
            (None, Ok(repo)) => rt.block_on(stored_trace(&repo, &args.family)),
            _ => None,
        };
        continue_trace(&span, stored, false);
    }
    let _in_span = span.enter();
    rt.block_on(async move {
        match &args.orchestrator {
            Some(url) => {
                let mut client = client(url, args.token.load()?, args.tls.load()?).await?;
                let since = history_end(&mut client, &args.family).await;
                send_answer(&mut client, request).await?;
                if args.wait {
                    watch(&mut client, &args.family, since).await
                } else {
                    Ok(Exit::Success)
                }
            }
            None => {
                let repo = args
                    .repo
                    .canonicalize()
                    .with_context(|| format!("repository {}", args.repo.display()))?;
                // The port must exist here: answering starts nothing new.
                open_local(&repo).await?;
                embedded(&repo, Action::Answer(request), &args.local).await
            }
        }
    })
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
    let r = client
        .answer(traced(request))
        .await
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
    let r = client
        .submit(traced(request))
        .await
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
    Ok(())
}

/// Embedded mode: orchestrator and worker in this process over loopback.
async fn embedded(repo: &Path, action: Action, local: &LocalWorker) -> anyhow::Result<Exit> {
    let family = match &action {
        Action::Submit(r) => r.family.clone(),
        Action::Answer(r) => r.family.clone(),
    };
    if let Some(live) = super::embedded::live(repo, &family) {
        eprintln!(
            "fvd: error: port {family} is running in process {} (an fvd submit or answer in {}); wait for it, or run fvd cancel {family}",
            live.pid,
            repo.display()
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
    worker.jail = agents.jail.clone();
    worker.provides = embedded_provides(repo, spec);
    let embedded = fvd_orchestrator::embedded::Embedded::start(store, worker, agents).await?;
    // The token is in the run file for the owner's own `fvd cancel`.
    let _run_file =
        super::embedded::RunFile::write(repo, &family, &embedded.url(), embedded.token())?;
    let mut client = client(&embedded.url(), Some(embedded.token().clone()), None).await?;
    let run = async {
        let since = history_end(&mut client, &family).await;
        match action {
            Action::Submit(request) => {
                let place = format!("(embedded, state in {})", db.display());
                send(&mut client, request, &place).await?;
            }
            Action::Answer(request) => send_answer(&mut client, request).await?,
        }
        watch(&mut client, &family, since).await
    };
    let code = tokio::select! {
        code = run => code,
        why = super::embedded::interrupted() => {
            eprintln!(
                "fvd: {why}: stopping; the running tests are ended and the port resumes with the next fvd submit --family {family}"
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
/// them, so it does not hide them (README "Containment").
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
        jail,
        secrets: Default::default(),
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

/// Prints a line on stdout; a reader that went away (`fvd submit | head`)
/// does not stop the port, which keeps running to its end.
fn say(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// Just after the port's last recorded gate decision, by the
/// orchestrator's clock (0 for a port it does not know): what a watch
/// replays from before is the port's history, not this run's.
async fn history_end(client: &mut Client, family: &str) -> i64 {
    let Ok(reply) = client
        .status(pb::StatusRequest {
            family: family.to_string(),
        })
        .await
    else {
        return 0;
    };
    reply
        .into_inner()
        .ports
        .iter()
        .filter(|p| p.family == family)
        .flat_map(|p| p.gate_events.iter().map(|g| g.at_ms + 1))
        .max()
        .unwrap_or(0)
}

/// Follows a port's events until it ends; returns the exit code. Gate
/// decisions recorded before `since` (a resumed port's history, see
/// [`history_end`]) are not printed again.
async fn watch(client: &mut Client, family: &str, since: i64) -> anyhow::Result<Exit> {
    let mut stream = client
        .watch(pb::WatchRequest {
            family: family.to_string(),
        })
        .await
        .map_err(|e| client.fail(e))?
        .into_inner();
    let progress = Progress::new(std::io::stderr().is_terminal(), super::color(), since);
    while let Some(ev) = stream.message().await.map_err(|e| client.fail(e))? {
        match ev.event {
            Some(pb::port_event::Event::Component(c)) => progress.component(&c),
            Some(pb::port_event::Event::Gate(g)) => progress.gate(&g),
            Some(pb::port_event::Event::Finished(snap)) => {
                progress.finish();
                print_snapshot(&snap);
                if !snap.status_write_error.is_empty() {
                    eprintln!(
                        "fvd: error: PORT_STATUS.md was not written, so it does not show these verdicts: {}",
                        snap.status_write_error
                    );
                    return Ok(Exit::StatusNotWritten);
                }
                return Ok(outcome(&snap));
            }
            None => {}
        }
    }
    bail!("the orchestrator closed the watch of {family} before the port ended")
}

/// 0 when every component is `non_skip_pass`, 3 when the port paused on
/// questions, 4 when it waits for a fixed environment (a worker's, or the
/// orchestrator's disk), 1 otherwise.
fn outcome(snap: &pb::PortSnapshot) -> Exit {
    if snap.state == PortState::Environment.as_str() {
        Exit::Environment
    } else if snap.state == PortState::AskUser.as_str() {
        Exit::AskUser
    } else if !snap.components.is_empty()
        && snap
            .components
            .iter()
            .all(|c| c.status == ComponentStatus::NonSkipPass.as_str())
    {
        Exit::Success
    } else {
        Exit::Findings
    }
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
    /// Reasons already printed (plain lines), by state and reason, with
    /// the component that said each first: a cause many components share
    /// is said once.
    said: std::cell::RefCell<std::collections::HashMap<(String, String), String>>,
}

impl Progress {
    fn new(tty: bool, color: bool, since: i64) -> Self {
        Self {
            bars: tty.then(|| (MultiProgress::new(), Default::default())),
            color,
            since,
            said: Default::default(),
        }
    }

    fn paint(&self, code: &str, text: String) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text
        }
    }

    fn component(&self, c: &pb::ComponentSnapshot) {
        let mut line = c.status.clone();
        if c.runs > 0 {
            line.push_str(&format!("  run {}", c.runs));
        }
        let running = c.status == ComponentStatus::Running.as_str();
        if !c.worker_id.is_empty() && running {
            line.push_str(&format!(" on {}", c.worker_id));
        }
        // what the machine lacks is said once, in the summary
        let grouped =
            c.status == ComponentStatus::Environment.as_str() || c.reason.starts_with("unplaced: ");
        let Some((mp, bars)) = &self.bars else {
            if grouped {
                line.push_str("  (cause below)");
            } else if !c.reason.is_empty() && !running {
                // a cause many components share is said once: a later
                // component in the same state for the same reason names
                // the first one (a pass's "1 passed" is said each time)
                let key = (c.status.clone(), c.reason.clone());
                let pass = c.status == ComponentStatus::NonSkipPass.as_str();
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
        match c.status.parse() {
            Ok(ComponentStatus::NonSkipPass) => bar.finish_with_message(self.paint("32", line)),
            Ok(ComponentStatus::Blocked) => bar.finish_with_message(self.paint("31", line)),
            _ => bar.set_message(line),
        }
    }

    fn gate(&self, g: &pb::GateEvent) {
        if g.at_ms < self.since {
            // decided in an earlier run of the port: history
            return;
        }
        let why = match (g.outcome.as_str(), g.conditions.as_slice()) {
            (_, []) => String::new(),
            // a refusal's reasons are listed once, in the summary below
            ("refused", c) => format!(
                " ({} reason{} below)",
                c.len(),
                if c.len() == 1 { "" } else { "s" }
            ),
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

/// The port, its components and open questions. Components that wait for
/// an environment are summed up by cause (one line per worker and cause,
/// not one blocker each).
fn print_snapshot(s: &pb::PortSnapshot) {
    say(format_args!(
        "port {}: {} at {}",
        s.family, s.state, s.phase
    ));
    if !s.owner.is_empty() {
        let last = if s.submitted_by.is_empty() || s.submitted_by == s.owner {
            String::new()
        } else {
            format!(", last submitted by {}", s.submitted_by)
        };
        say(format_args!("  owner {}{last}", s.owner));
    }
    // The gate's latest refusal: why a blocked port stopped where it did.
    if let Some(g) = s.gate_events.iter().rev().find(|g| g.outcome == "refused") {
        say(format_args!("  gate refused {}:", g.phase));
        for c in grouped_conditions(&g.conditions) {
            say(format_args!("    - {c}"));
        }
    }
    for c in &s.components {
        // a cause said for a group below is not repeated on each line
        let grouped_cause = c.status == ComponentStatus::Environment.as_str()
            || (c.status == ComponentStatus::Blocked.as_str()
                && c.reason.starts_with("unplaced: "));
        let reason = if grouped_cause {
            "(cause below)"
        } else {
            c.reason.as_str()
        };
        say(format_args!(
            "  {:<16} {:<14} runs={} {}",
            c.name, c.status, c.runs, reason
        ));
        for v in &c.variants {
            say(format_args!("    {}", variant_line(v)));
        }
        if let Some(a) = &c.agent_spend {
            say(format_args!("    agent: {}", spend_line(a)));
        }
    }
    if let Some(a) = &s.agent_spend {
        say(format_args!("  agents of the port: {}", spend_line(a)));
    }
    // A component's agent whose model API refused its key (or kept
    // failing) waits too, for a different fix than a worker's.
    let (agents, workers): (Vec<_>, Vec<_>) = grouped(s, ComponentStatus::Environment, "")
        .into_iter()
        .partition(|(cause, _)| cause.starts_with("environment: agent attempt "));
    for (cause, names) in &workers {
        let n = names.len();
        say(format_args!(
            "{n} component{} could not run on {cause} ({})",
            if n == 1 { "" } else { "s" },
            names.join(", ")
        ));
    }
    for (cause, names) in &agents {
        say(format_args!(
            "{}: the agent could not work: {} (the attempt was not counted)",
            names.join(", "),
            cause.trim_start_matches("environment: ")
        ));
    }
    for (cause, names) in grouped(s, ComponentStatus::Blocked, "unplaced: ") {
        let n = names.len();
        say(format_args!(
            "{n} component{} cannot run on this machine: {cause} ({})",
            if n == 1 { "" } else { "s" },
            names.join(", ")
        ));
    }
    if !s.pause_reason.is_empty() {
        say(format_args!("  {}", s.pause_reason));
    } else if s.state == PortState::Environment.as_str() && !workers.is_empty() {
        say(format_args!(
            "  fix the environment of that worker (or start one that has it) and run fvd submit --family {} again: nothing was counted against the components",
            s.family
        ));
    }
    for e in s
        .escapes
        .iter()
        .filter(|e| e.status != "open" && !e.answered_by.is_empty())
    {
        say(format_args!(
            "  {} {} answered by {}: {}",
            e.id, e.component, e.answered_by, e.answer
        ));
    }
    for e in s.escapes.iter().filter(|e| e.status == "open") {
        say(format_args!(
            "  {} {} asks ({}): {}",
            e.id, e.component, e.decision_type, e.question
        ));
        for (i, o) in e.options.iter().enumerate() {
            let rec = if *o == e.recommended {
                " (recommended)"
            } else {
                ""
            };
            say(format_args!("      {}. {o}{rec}", i + 1));
        }
        say(format_args!(
            "    answer: fvd answer {} {} --option N  (or --text \"...\")",
            s.family, e.id
        ));
    }
    // Where the file is; whether this command changed it is not known
    // here (`fvd status` writes nothing).
    if !s.port_status_path.is_empty() {
        say(format_args!("status file {}", s.port_status_path));
    }
}

/// A refusal's conditions with components blocked for one reason said in
/// one line (`components a, b, c are blocked (…)`); a cause the summary
/// groups (an environment, a machine that cannot run them) is referred to,
/// not repeated.
fn grouped_conditions(conditions: &[String]) -> Vec<String> {
    let mut out: Vec<(Option<String>, Vec<String>, String)> = Vec::new();
    for c in conditions {
        let parsed = c
            .strip_prefix("component ")
            .and_then(|r| r.split_once(" is blocked ("))
            .and_then(|(name, rest)| Some((name.to_string(), rest.strip_suffix(')')?.to_string())));
        match parsed {
            Some((name, reason)) => match out
                .iter_mut()
                .find(|(r, _, _)| r.as_deref() == Some(&reason))
            {
                Some((_, names, _)) => names.push(name),
                None => out.push((Some(reason), vec![name], String::new())),
            },
            None => out.push((None, Vec::new(), c.clone())),
        }
    }
    out.into_iter()
        .map(|(reason, names, line)| match reason {
            None => line,
            Some(r) => {
                let cause = if r.starts_with("unplaced: ") || r.starts_with("environment") {
                    "cause below".to_string()
                } else {
                    r
                };
                if names.len() == 1 {
                    format!("component {} is blocked ({cause})", names[0])
                } else {
                    format!("components {} are blocked ({cause})", names.join(", "))
                }
            }
        })
        .collect()
}

/// One row of a component's variant table, under the component.
fn variant_line(v: &pb::VariantRow) -> String {
    let mut line = format!("{:<14}", v.name);
    if !v.env.is_empty() {
        line.push_str(&format!(" {}", v.env.join(" ")));
    }
    let verdict = if v.verdict.is_empty() {
        &v.state
    } else {
        &v.verdict
    };
    line.push_str(&format!("  {verdict}"));
    if !v.first_divergence.is_empty() {
        line.push_str(&format!(", first divergence {}", v.first_divergence));
        if let Some(d) = v.drift {
            line.push_str(&format!(" {} drift {d:.3}", v.stat));
        }
    }
    if !v.finding.is_empty() && v.finding != "baseline" && v.finding != *verdict {
        line.push_str(&format!("  [{}]", v.finding));
    }
    line
}

/// Components of `status` whose reason starts with `prefix`, grouped by
/// the rest of it (the cause: `worker W: No module named 'torch'`, `needs 1
/// GPU; this machine has none: …`), causes in order of first appearance:
/// what the machine lacks is said once, not once per component.
fn grouped(
    s: &pb::PortSnapshot,
    status: ComponentStatus,
    prefix: &str,
) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for c in s.components.iter().filter(|c| c.status == status.as_str()) {
        let Some(cause) = c.reason.strip_prefix(prefix) else {
            continue;
        };
        match out.iter_mut().find(|(known, _)| known == cause) {
            Some((_, names)) => names.push(c.name.clone()),
            None => out.push((cause.to_string(), vec![c.name.clone()])),
        }
    }
    out
}

pub fn status(args: StatusArgs) -> anyhow::Result<Exit> {
    let rt = runtime()?;
    rt.block_on(async move {
        let ports = match &args.orchestrator {
            Some(url) => {
                let mut client = client(url, args.token.load()?, args.tls.load()?).await?;
                client
                    .status(pb::StatusRequest {
                        family: args.family.clone().unwrap_or_default(),
                    })
                    .await
                    .map_err(|e| client.fail(e))?
                    .into_inner()
                    .ports
            }
            None => {
                let repo = match &args.family {
                    Some(f) => super::find_repo(&args.repo, f),
                    None => super::find_state(&args.repo),
                };
                let store = open_local(&repo).await?;
                let mut ports =
                    fvd_orchestrator::query::status(&store, args.family.as_deref()).await?;
                mark_interrupted(&repo, &mut ports);
                ports
            }
        };
        if args.json {
            let v: Vec<serde_json::Value> = ports.iter().map(snapshot_json).collect();
            let out = if args.family.is_some() && v.len() == 1 {
                v.into_iter().next().expect("one port")
            } else {
                serde_json::Value::Array(v)
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            for p in &ports {
                print_snapshot(p);
            }
        }
        Ok(if args.exit_status {
            exit_status(&ports)
        } else {
            Exit::Success
        })
    })
}

/// `fvd status --exit-status`: 0 while every port runs or has passed; else
/// the worst of 1 (blocked, failed, cancelled), 3 (waits for an answer)
/// and 4 (waits for an environment).
fn exit_status(ports: &[pb::PortSnapshot]) -> Exit {
    let each: Vec<Exit> = ports
        .iter()
        .map(|p| {
            if p.state == PortState::Running.as_str() {
                Exit::Success
            } else {
                outcome(p)
            }
        })
        .collect();
    [Exit::Findings, Exit::AskUser, Exit::Environment]
        .into_iter()
        .find(|e| each.contains(e))
        .unwrap_or(Exit::Success)
}

fn snapshot_json(s: &pb::PortSnapshot) -> serde_json::Value {
    serde_json::json!({
        "family": s.family,
        "state": s.state,
        "pause_reason": s.pause_reason,
        "phase": s.phase,
        "repo": s.repo,
        "repo_identity": s.repo_identity,
        "owner": s.owner,
        "submitted_by": s.submitted_by,
        "actions": s.actions.iter().map(|a| serde_json::json!({
            "action": a.action,
            "actor": a.actor,
            "detail": a.detail,
            "at_ms": a.at_ms,
        })).collect::<Vec<_>>(),
        "port_status_path": s.port_status_path,
        "components": s.components.iter().map(|c| serde_json::json!({
            "name": c.name,
            "status": c.status,
            "reason": c.reason,
            "runs": c.runs,
            "worker_id": c.worker_id,
            "variants": c.variants.iter().map(|v| serde_json::json!({
                "name": v.name,
                "env": v.env,
                "state": v.state,
                "verdict": v.verdict,
                "reason": v.reason,
                "first_divergence": v.first_divergence,
                "stat": v.stat,
                "drift": v.drift,
                "finding": v.finding,
                "trace_error": v.trace_error,
                "job_id": v.job_id,
                "spawned_ms": v.spawned_ms,
                "finished_ms": v.finished_ms,
            })).collect::<Vec<_>>(),
            "agent_spend": c.agent_spend.as_ref().map(spend_json),
        })).collect::<Vec<_>>(),
        "agent_spend": s.agent_spend.as_ref().map(spend_json),
        "escapes": s.escapes.iter().map(|e| serde_json::json!({
            "id": e.id,
            "component": e.component,
            "decision_type": e.decision_type,
            "question": e.question,
            "recommended": e.recommended,
            "options": e.options,
            "status": e.status,
            "answer": e.answer,
            "answered_by": e.answered_by,
            "attempt": e.attempt,
        })).collect::<Vec<_>>(),
        "gate": s.gate_events.iter().map(|g| serde_json::json!({
            "phase": g.phase,
            "outcome": g.outcome,
            "conditions": g.conditions,
        })).collect::<Vec<_>>(),
    })
}

fn spend_line(a: &pb::AgentSpend) -> String {
    let tokens = a.input_tokens + a.output_tokens + a.cache_read_tokens + a.cache_write_tokens;
    let mut line = format!(
        "{} attempt(s), {} request(s), {tokens} tokens, ${:.4}",
        a.attempts, a.requests, a.cost_usd
    );
    if a.unpriced_tokens > 0 {
        line.push_str(&format!(" (+{} tokens without a price)", a.unpriced_tokens));
    }
    line
}

fn spend_json(a: &pb::AgentSpend) -> serde_json::Value {
    serde_json::json!({
        "attempts": a.attempts,
        "input_tokens": a.input_tokens,
        "output_tokens": a.output_tokens,
        "cache_read_tokens": a.cache_read_tokens,
        "cache_write_tokens": a.cache_write_tokens,
        "cost_usd": a.cost_usd,
        "unpriced_tokens": a.unpriced_tokens,
        "requests": a.requests,
    })
}

pub fn logs(args: LogsArgs) -> anyhow::Result<Exit> {
    let rt = runtime()?;
    rt.block_on(async move {
        let mut out = std::io::stdout().lock();
        match &args.orchestrator {
            Some(url) => {
                let mut client = client(url, args.token.load()?, args.tls.load()?).await?;
                let mut stream = client
                    .logs(pb::LogsRequest {
                        family: args.family.clone(),
                        component: args.component.clone(),
                        run: args.run.unwrap_or(0),
                        follow: args.follow,
                    })
                    .await
                    .map_err(|e| client.fail(e))?
                    .into_inner();
                let mut wrote = 0;
                while let Some(chunk) = stream.message().await.map_err(|e| client.fail(e))? {
                    wrote += chunk.data.len();
                    out.write_all(&chunk.data)?;
                }
                if wrote == 0 {
                    eprintln!(
                        "fvd: run of {} {} has no output (a run that failed on its environment before it printed, or printed nothing); fvd status {} --orchestrator {url} says why",
                        args.family, args.component, args.family
                    );
                }
            }
            None => {
                let store = open_local(&super::find_repo(&args.repo, &args.family)).await?;
                let mut job = fvd_orchestrator::query::run_of(
                    &store,
                    &args.family,
                    &args.component,
                    args.run,
                )
                .await?;
                // without --run: the latest run that started (a run queued
                // again after an environment failure has no output yet)
                if args.run.is_none() && job.state == fvd_store::model::JobState::Queued {
                    let runs = store.jobs_of(&args.family, &args.component).await?;
                    if let Some(started) = runs
                        .iter()
                        .rev()
                        .find(|r| r.state != fvd_store::model::JobState::Queued)
                    {
                        eprintln!(
                            "fvd: run {} is queued; showing run {}",
                            job.run_no, started.run_no
                        );
                        job = started.clone();
                    }
                }
                let mut chunks =
                    fvd_orchestrator::query::log_pump(store.clone(), job.job_id.clone(), args.follow);
                let mut wrote = 0;
                while let Some(chunk) = chunks.recv().await {
                    let chunk = chunk?.1;
                    wrote += chunk.len();
                    out.write_all(&chunk)?;
                    out.flush()?;
                }
                if wrote == 0 {
                    let runs = store.jobs_of(&args.family, &args.component).await?;
                    eprintln!("fvd: {}", no_output(&args.family, &args.component, &job, &runs));
                }
            }
        }
        out.flush()?;
        Ok(Exit::Success)
    })
}

/// Embedded ports the store says are running while no fvd process runs
/// them (its submit was interrupted: Ctrl-C, a lost terminal): shown as
/// `interrupted`, their unfinished components too, with how to resume.
fn mark_interrupted(repo: &Path, ports: &mut [pb::PortSnapshot]) {
    for p in ports.iter_mut() {
        if p.state != PortState::Running.as_str()
            || super::embedded::live(repo, &p.family).is_some()
        {
            continue;
        }
        p.state = "interrupted".to_string();
        let resume = format!(
            "interrupted: no fvd process runs it; fvd submit --family {} resumes it",
            p.family
        );
        for c in p.components.iter_mut().filter(|c| {
            matches!(
                c.status.parse::<ComponentStatus>(),
                Ok(ComponentStatus::Running
                    | ComponentStatus::Queued
                    | ComponentStatus::Confirming
                    | ComponentStatus::Pending)
            )
        }) {
            c.status = "interrupted".to_string();
            c.reason = resume.clone();
        }
    }
}

/// Why run `job` of a component printed nothing, and which run has output.
fn no_output(
    family: &str,
    component: &str,
    job: &fvd_store::model::JobRecord,
    runs: &[fvd_store::model::JobRecord],
) -> String {
    use fvd_store::model::JobState;
    let why = match job.state {
        JobState::Environment => format!(
            "it failed on its environment{}: {}",
            if job.worker_id.is_empty() {
                String::new()
            } else {
                format!(" on worker {}", job.worker_id)
            },
            job.reason
        ),
        JobState::Queued => "it has not started".to_string(),
        JobState::Running => "it has printed nothing yet (add --follow)".to_string(),
        JobState::Unplaced => format!("no worker could take it: {}", job.reason),
        JobState::Abandoned => "it was in flight when its port stopped".to_string(),
        JobState::Finished => "it printed nothing".to_string(),
    };
    let with_output = runs
        .iter()
        .rev()
        .find(|r| r.job_id != job.job_id && !r.output_tail.is_empty());
    let other = match with_output {
        Some(r) => format!(
            "; run {} has output: fvd logs {family} {component} --run {}",
            r.run_no, r.run_no
        ),
        None => String::new(),
    };
    format!(
        "run {} of {family} {component} has no output: {why}{other}",
        job.run_no
    )
}

pub fn cancel(args: CancelArgs) -> anyhow::Result<Exit> {
    let rt = runtime()?;
    rt.block_on(async move {
        let (url, token, tls) = match &args.orchestrator {
            Some(url) => (url.clone(), args.token.load()?, args.tls.load()?),
            None => {
                let repo = super::find_repo(&args.repo, &args.family)
                    .canonicalize()
                    .with_context(|| format!("repository {}", args.repo.display()))?;
                match super::embedded::live(&repo, &args.family) {
                    // The process running the port ends it, its tests
                    // first.
                    Some(live) => (live.url, Some(live.token), None),
                    None => {
                        let store = open_local(&repo).await?;
                        let port = store.port(&args.family).await?.with_context(|| {
                            format!("no port {} in {}", args.family, state_db(&repo).display())
                        })?;
                        let names = store.cancel_port(&args.family).await?;
                        say(format_args!(
                            "cancelled port {} (it was {}; no fvd process was running it){}",
                            args.family,
                            port.state,
                            if names.is_empty() {
                                String::new()
                            } else {
                                format!(": {} stopped", names.join(", "))
                            }
                        ));
                        return Ok(Exit::Success);
                    }
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

/// `fvd reset F`: forgets the port's embedded state. Refused while a
/// process runs the port.
pub fn reset(args: ResetArgs) -> anyhow::Result<Exit> {
    if let Some(url) = &args.orchestrator {
        return runtime()?.block_on(async {
            let mut client = client(url, args.token.load()?, args.tls.load()?).await?;
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
    let repo = super::find_repo(&args.repo, &args.family)
        .canonicalize()
        .with_context(|| format!("repository {}", args.repo.display()))?;
    if let Some(live) = super::embedded::live(&repo, &args.family) {
        eprintln!(
            "fvd: error: port {} is running in process {}; fvd cancel {} first",
            args.family, live.pid, args.family
        );
        return Ok(Exit::Usage);
    }
    let rt = runtime()?;
    rt.block_on(async move {
        let store = open_local(&repo).await?;
        if !store.delete_port(&args.family).await? {
            eprintln!(
                "fvd: error: no port {} in {}",
                args.family,
                state_db(&repo).display()
            );
            return Ok(Exit::Usage);
        }
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

/// `fvd attempts`: the agent-attempt ledger of a component, from the
/// embedded state of the repository or from an orchestrator.
pub fn attempts(args: AttemptsArgs) -> anyhow::Result<Exit> {
    let rt = runtime()?;
    rt.block_on(async move {
        let (worktree, ledger) = match &args.orchestrator {
            Some(url) => {
                let mut client = client(url, args.token.load()?, args.tls.load()?).await?;
                let r = client
                    .attempts(pb::AttemptsRequest {
                        family: args.family.clone(),
                        component: args.component.clone(),
                    })
                    .await
                    .map_err(|e| client.fail(e))?
                    .into_inner();
                let worktree = r.worktree.map(|w| fvd_workspace::worktree::Worktree {
                    path: w.path.into(),
                    branch: w.branch,
                    base_commit: w.base_commit,
                    prefix: String::new(),
                });
                let ledger = r
                    .attempts
                    .into_iter()
                    .map(|a| {
                        fvd_orchestrator::port_api::attempt_row(&args.family, &args.component, a)
                    })
                    .collect::<Vec<_>>();
                (worktree, ledger)
            }
            None => {
                let store = open_local(&super::find_repo(&args.repo, &args.family)).await?;
                fvd_orchestrator::query::attempts(&store, &args.family, &args.component).await?
            }
        };
        let mut out = std::io::stdout().lock();
        if args.json {
            let v = serde_json::json!({
                "family": args.family,
                "component": args.component,
                "worktree": worktree.as_ref().map(|w| serde_json::json!({
                    "path": w.path,
                    "branch": w.branch,
                    "base_commit": w.base_commit,
                })),
                "attempts": ledger,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            return Ok(Exit::Success);
        }
        match &worktree {
            Some(w) => writeln!(
                out,
                "{} / {}: {} attempt(s) on branch {} from {} ({})",
                args.family,
                args.component,
                ledger.len(),
                w.branch,
                &w.base_commit[..w.base_commit.len().min(12)],
                w.path.display()
            )?,
            None => writeln!(
                out,
                "{} / {}: no agent worktree (the component has no [agent], or it never started)",
                args.family, args.component
            )?,
        }
        for a in &ledger {
            writeln!(
                out,
                "attempt {}  commit {}  agent {} in {:.1}s  verdict {} -> {}",
                a.attempt,
                &a.commit_sha[..a.commit_sha.len().min(12)],
                fvd_workspace::agent::exit_text(a.exit_code, a.signal, a.timed_out),
                a.duration_ms as f64 / 1000.0,
                a.verdict_before,
                if a.state == AttemptState::Running {
                    "(agent running or cut off)"
                } else if a.handoff_summary.contains("next_step=ask_user") {
                    "(asked the user)"
                } else if a.verdict_after.is_none() {
                    "(not run yet)"
                } else {
                    a.verdict_after.as_str()
                },
            )?;
            writeln!(out, "  handoff {}: {}", a.handoff_status, a.handoff_summary)?;
            if let Some(u) = &a.usage {
                writeln!(out, "  model: {}", usage_line(u))?;
                for d in &u.permission_denials {
                    writeln!(out, "  permission denied: {d}")?;
                }
            }
            if a.state == AttemptState::Environment {
                writeln!(
                    out,
                    "  ended by its environment (not counted; runs again when the port resumes)"
                )?;
            }
            let mut notes = vec![format!("{} turn", a.kind)];
            if a.gpu_ms_after > 0 {
                notes.push(format!(
                    "{:.1} GPU-s in its run",
                    a.gpu_ms_after as f64 / 1000.0
                ));
            }
            if a.tries > 1 {
                notes.push(format!("run {} times (cut off by a restart)", a.tries));
            }
            writeln!(out, "  {}", notes.join("; "))?;
            if a.diff_stat.is_empty() {
                writeln!(out, "  no changes")?;
            }
            for line in a.diff_stat.lines() {
                writeln!(out, "  {line}")?;
            }
        }
        let used: Vec<_> = ledger.iter().filter_map(|a| a.usage.as_ref()).collect();
        if !used.is_empty() {
            let tokens: u64 = used.iter().map(|u| u.total_tokens()).sum();
            let usd: f64 = used.iter().filter_map(|u| u.cost_usd).sum();
            writeln!(
                out,
                "total: {tokens} tokens, ${usd:.4} over {} attempt(s)",
                used.len()
            )?;
        }
        Ok(Exit::Success)
    })
}

/// One attempt's model usage in a line: what it cost, from what, and how
/// it ended on the model side.
pub fn usage_line(u: &fvd_store::usage::AttemptUsage) -> String {
    let cost = match u.cost_usd {
        Some(c) => format!("${c:.4}"),
        None => "cost unknown (no price)".into(),
    };
    let mut parts = vec![
        format!(
            "{} {} via {}",
            if u.preset.is_empty() {
                "command"
            } else {
                &u.preset
            },
            u.model,
            u.source
        ),
        format!(
            "{} in + {} out tokens ({} cache read, {} cache write)",
            u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens
        ),
        cost,
        format!("{} request(s)", u.requests),
    ];
    if u.unpriced_tokens > 0 {
        parts.push(format!("{} tokens without a price", u.unpriced_tokens));
    }
    if u.retries > 0 {
        parts.push(format!("{} retried", u.retries));
    }
    if let Some(t) = u.turns {
        parts.push(format!("{t} turn(s)"));
    }
    if let Some(c) = u.cli_cost_usd {
        parts.push(format!("the CLI says ${c:.4}"));
    }
    let ended = if u.stop_reason.is_empty() {
        u.outcome.clone()
    } else {
        format!("{}: {}", u.outcome, u.stop_reason)
    };
    parts.push(ended);
    parts.join("; ")
}

pub async fn open_local(repo: &Path) -> anyhow::Result<Store> {
    let db = state_db(repo);
    if !db.is_file() {
        bail!(
            "no fvd state at {} (run fvd submit there first, or pass --orchestrator)",
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
