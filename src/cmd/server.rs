//! `fvd orchestrator serve` and `fvd worker`: the two long-running
//! processes of a fleet, plus the runtime and worker set-up that embedded
//! mode shares with them.

use super::exit::Exit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use fvd_proto::auth::{Token, TokenSource};
use fvd_store::Store;
use fvd_worker::client::WorkerConfig;
use fvd_worker::gpu::{self, GpuSelection};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Subcommand)]
pub enum OrchestratorCmd {
    /// Serve the worker and port services until interrupted.
    Serve(ServeArgs),
}

/// Where the bearer token comes from (a file, or a variable named here);
/// without either, no token is sent or required. A client (the CLI, a
/// worker) given neither reads the file `FVD_TOKEN_FILE` names.
#[derive(Debug, Clone, Args, Default)]
pub struct TokenArgs {
    /// File holding the bearer token (a client without this or --token-env
    /// reads the file FVD_TOKEN_FILE names).
    #[arg(long, conflicts_with = "token_env", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Name of the environment variable holding the bearer token (its name,
    /// never its value).
    #[arg(long, value_name = "NAME")]
    pub token_env: Option<String>,
}

/// The variable a client reads its token file's path from when neither
/// `--token-file` nor `--token-env` is given.
pub const TOKEN_FILE_ENV: &str = "FVD_TOKEN_FILE";

impl TokenArgs {
    /// Where the token comes from, when one is configured.
    pub fn source(&self) -> Option<TokenSource> {
        match (&self.token_file, &self.token_env) {
            (Some(p), _) => Some(TokenSource::File(p.clone())),
            (None, Some(name)) => Some(TokenSource::Env(name.clone())),
            (None, None) => None,
        }
    }

    /// The token file this process reads: `--token-file`, or for a
    /// client without a source, the file [`TOKEN_FILE_ENV`] names.
    fn file(&self, client: bool) -> Option<PathBuf> {
        match (&self.token_file, self.source()) {
            (Some(p), _) => Some(p.clone()),
            (None, None) if client => std::env::var_os(TOKEN_FILE_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            _ => None,
        }
    }

    /// Warns on stderr, in one line naming it, when the token file this
    /// process reads (a `client`'s: [`TokenArgs::load_client`]'s) is
    /// readable by its group or by others: anyone who can read it can act
    /// as its credential.
    pub fn warn_if_readable(&self, client: bool) {
        if let Some(line) = self.file(client).and_then(|p| readable_by_others(&p)) {
            super::say(super::Said::Warning, &line);
        }
    }

    pub fn load(&self) -> anyhow::Result<Option<Token>> {
        match self.source() {
            Some(source) => Ok(Some(Token::load(&source)?)),
            None => Ok(None),
        }
    }

    /// A client's token: [`TokenArgs::load`], else the file
    /// [`TOKEN_FILE_ENV`] names (a server's own token never comes from it:
    /// a variable left in an operator's shell must not open a server).
    pub fn load_client(&self) -> anyhow::Result<Option<Token>> {
        if self.source().is_some() {
            return self.load();
        }
        match std::env::var_os(TOKEN_FILE_ENV).filter(|v| !v.is_empty()) {
            Some(path) => Ok(Some(
                Token::load(&TokenSource::File(PathBuf::from(path)))
                    .with_context(|| format!("the token file {TOKEN_FILE_ENV} names"))?,
            )),
            None => Ok(None),
        }
    }
}

/// The warning for a token file at `path` that its group or others may
/// read (mode `& 0o044`); `None` when they may not, or when it cannot be
/// looked at (reading it then says why).
pub fn readable_by_others(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o044 != 0).then(|| {
        format!(
            "the token file {} is readable by {} (mode {mode:04o}): anyone who reads it acts as its credential; chmod 600 it",
            path.display(),
            match (mode & 0o040 != 0, mode & 0o004 != 0) {
                (true, true) => "its group and others",
                (true, false) => "its group",
                _ => "others",
            }
        )
    })
}

/// TLS for a client (a worker or the CLI) of an `https://` orchestrator.
#[derive(Debug, Clone, Args, Default)]
pub struct ClientTls {
    /// CA certificate (PEM) that signed the orchestrator's certificate
    /// (for an `https://` orchestrator).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

impl ClientTls {
    pub fn load(&self) -> anyhow::Result<Option<Vec<u8>>> {
        self.tls_ca
            .as_ref()
            .map(|p| {
                std::fs::read(p)
                    .with_context(|| format!("cannot read CA certificate {}", p.display()))
            })
            .transpose()
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, e.g. 0.0.0.0:7070 (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// State database, `sqlite://PATH`.
    #[arg(long)]
    pub db: String,
    /// Seconds without a heartbeat after which a worker's jobs are
    /// re-queued elsewhere (workers heartbeat every second).
    #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
    pub lease_ttl: f64,
    /// Most output of one run stored, in MiB, whatever a worker sends:
    /// chunks past it are dropped (workers keep to the same cap by
    /// default, sending each stream's tail at the end).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024 * 1024), value_name = "MIB")]
    pub max_output_mib: u64,
    /// Seconds after a start during which the runs an earlier orchestrator
    /// left in flight wait for their workers to come back and report them:
    /// such a run is adopted (same job, same epoch), not run again; one no
    /// worker reports in time runs again. 0 runs them all again at once.
    #[arg(long, default_value_t = 15.0, value_parser = non_negative_seconds)]
    pub adopt_grace: f64,
    /// How a port's queued jobs are placed: `duration` (longest expected
    /// GPU-time first, from the component's recent runs, else its
    /// `expected_s`; gangs reserve a worker), `widest` (a wider job behind
    /// the first that fits goes first) or `fifo` (the first that fits).
    #[arg(long, default_value = "duration", value_name = "POLICY")]
    pub placement: fvd_actors::scheduler::Policy,
    /// Most runs on one shared GPU: single-GPU runs with a gpu_memory_mib
    /// (and gpu_share not false) share a GPU while their memory stays
    /// within 90% of it; 1 gives every run whole GPUs.
    #[arg(long, default_value_t = fvd_actors::scheduler::DEFAULT_GPU_SHARE_CAP, value_parser = clap::value_parser!(u32).range(1..))]
    pub gpu_share_cap: u32,
    /// The single shared token of earlier versions: every call that
    /// carries it is an admin named `admin` (also beside --auth).
    #[command(flatten)]
    pub token: TokenArgs,
    /// Named credentials with roles (worker, viewer, porter, admin), one
    /// `[[token]]` each, stored as SHA-256 hashes: `fvd auth add NAME --role
    /// ROLE --file FILE` makes one. Re-read on SIGHUP, so a deleted entry
    /// is refused from then on.
    #[arg(long, value_name = "FILE")]
    pub auth: Option<PathBuf>,
    /// Serve TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Also serve the web dashboard (plain HTTP) on this address, e.g.
    /// 127.0.0.1:7080; off unless given. Answers from it need a porter or
    /// admin token when the orchestrator has credentials.
    #[arg(long, value_name = "ADDR")]
    pub dashboard: Option<String>,
    /// A `Host` name the dashboard answers to besides its listen address
    /// and localhost (NAME, or NAME:PORT); repeatable. Any other is refused
    /// (a DNS-rebinding page names its own).
    #[arg(long = "dashboard-host", value_name = "NAME", requires = "dashboard")]
    pub dashboard_hosts: Vec<String>,
    /// Every dashboard page, twin and stream needs a viewer, porter or
    /// admin token (a sign-in form for browsers, `Authorization: Bearer`
    /// for scripts).
    #[arg(long, requires = "dashboard")]
    pub dashboard_require_viewer: bool,
    /// Dashboard connections held at most (default: a quarter of the
    /// process's file-descriptor limit, 16 to 1,024); live streams at most
    /// a quarter of them.
    #[arg(long, value_name = "N", requires = "dashboard")]
    pub dashboard_max_connections: Option<usize>,
    /// A dashboard connection with no byte either way for this long is
    /// closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = idle_seconds, requires = "dashboard")]
    pub dashboard_idle_timeout: f64,
    /// Also answer `grpc.health.v1` health checks on this address, in
    /// plaintext and without a token (for Kubernetes' grpc probes when the
    /// main listener speaks TLS). The main listener answers them too.
    #[arg(long, value_name = "ADDR")]
    pub health_listen: Option<String>,
    /// Largest pack of a commit's code sent to a worker that cannot see the
    /// checkout, in MiB; a larger one fails the job on that worker.
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub max_code_mib: u64,
    /// Run the `[agent] command` of the specs sent here, on this host.
    /// Without it a spec with an agent command is refused: whoever holds
    /// the token would run a command of their choice here.
    #[arg(long)]
    pub allow_agent_commands: bool,
    /// With --allow-agent-commands, the jail agents start in: auto (a
    /// namespace if this host allows one, else Landlock; neither is an
    /// error), namespace, landlock or off.
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub agent_sandbox: fvd_sandbox::Mode,
    /// A file or folder agents may not read, besides the token file and
    /// the TLS key (repeatable).
    #[arg(long = "agent-hide", value_name = "PATH")]
    pub agent_hide: Vec<PathBuf>,
    /// Where agent attempts run: fleet (a job on a worker with a free
    /// slot, in a checkout of its own; the model proxy and its key stay
    /// here) or host (here, in the component's worktree).
    #[arg(long, default_value = "fleet", value_name = "WHERE", value_parser = ["fleet", "host"])]
    pub agents: String,
    /// Largest git pack an agent attempt (or its `run_parity`) sends back,
    /// in MiB, checked as it arrives; a larger one is refused as the
    /// attempt's outcome.
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    pub max_attempt_pack_mib: u64,
    /// Most bytes, in MiB, of the files an attempt's commit adds or changes
    /// (what it unpacks to), checked before it is checked out.
    #[arg(long, default_value_t = 128, value_name = "MIB")]
    pub max_attempt_unpacked_mib: u64,
    /// Most files an attempt's commit adds or changes.
    #[arg(long, default_value_t = 5000, value_name = "N")]
    pub max_attempt_files: u64,
    /// Most gRPC connections held at once (workers, CLIs, agents' tools);
    /// one more is accepted and closed at once. Default: half the process's
    /// open-file limit, 64 to 4096.
    #[arg(long, value_name = "N")]
    pub max_grpc_connections: Option<usize>,
    /// Seconds a gRPC connection may pass with no byte either way before it
    /// is closed (fvd's clients ping every 20 s).
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub grpc_idle_secs: u64,
    /// Largest single file of an attempt's commit, in MiB.
    #[arg(long, default_value_t = 32, value_name = "MIB")]
    pub max_attempt_file_mib: u64,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct WorkerArgs {
    #[command(subcommand)]
    pub command: Option<WorkerCmd>,
    /// Orchestrator URL, `http://HOST:PORT`.
    #[arg(long, required = true, env = "FVD_ORCHESTRATOR", value_name = "URL", value_parser = super::source::orchestrator_url)]
    pub orchestrator: Option<String>,
    /// Scratch folder for job files.
    #[arg(long, required = true)]
    pub workspace: Option<PathBuf>,
    /// GPUs to offer: all, none, or host indices like 0,1.
    #[arg(long, default_value = "all")]
    pub gpus: String,
    /// Jobs that need no GPU run in this many parallel slots.
    #[arg(long)]
    pub cpu_slots: Option<u32>,
    /// Stable worker id (default: host name and process id).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// A label components can ask for (`labels` in port.toml), KEY=VALUE;
    /// repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// A path the port specs' `worker_paths` may ask for (weights), relative
    /// to a port folder, and where it is here: PATH=DIR, linked into this
    /// worker's checkouts of code by commit. Plain PATH: only in a checkout
    /// this worker shares with the orchestrator. Repeatable.
    #[arg(long = "provide", value_name = "PATH[=DIR]", value_parser = fvd_worker::code::Provide::parse)]
    pub provides: Vec<fvd_worker::code::Provide>,
    /// Cap of the total size of this worker's checkouts of code by commit
    /// (WORKSPACE/code/checkouts), in MiB; the least recently used go first.
    #[arg(long, default_value_t = 20480, value_name = "MIB")]
    pub code_cache_mib: u64,
    /// Most output of one run sent to the orchestrator, in MiB: past half
    /// of it, each stream's last quarter is kept and sent when the run
    /// ends, after a line saying how much was left out.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024 * 1024), value_name = "MIB")]
    pub max_output_mib: u64,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
    /// Answer `grpc.health.v1` health checks on this address (plaintext,
    /// no token): `""` is SERVING while connected and registered,
    /// `liveness` until the worker stops. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub health_listen: Option<String>,
    /// The jail jobs start in: auto (a namespace if this host allows one,
    /// else Landlock; neither is an error), namespace, landlock, or off
    /// (jobs can read what this worker's user can, its token file too).
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub job_sandbox: fvd_sandbox::Mode,
    /// A file or folder jobs may not read, besides the token file
    /// (repeatable): keys of other services on this host, say.
    #[arg(long = "job-hide", value_name = "PATH")]
    pub job_hide: Vec<PathBuf>,
    /// An agent CLI this worker runs attempts of (claude-code, codex,
    /// opencode, gemini; repeatable), whether or not it is found on PATH.
    /// Those found on PATH (or in FVD_AGENT_CLI_DIR) are offered anyway.
    #[arg(long = "agent-preset", value_name = "NAME", value_parser = parse_preset)]
    pub agent_presets: Vec<fvd_spec::agent_model::Preset>,
    /// Run GPU jobs under CUDA MPS: the worker starts its own
    /// `nvidia-cuda-mps-control` daemon for the GPUs it offers (folders in
    /// WORKSPACE/mps), so runs sharing a GPU execute side by side instead of
    /// taking turns, and stops it when it exits. Off by default.
    #[arg(long)]
    pub mps: bool,
}

fn parse_preset(s: &str) -> Result<fvd_spec::agent_model::Preset, String> {
    fvd_spec::agent_model::Preset::parse(s).ok_or_else(|| {
        let names: Vec<&str> = fvd_spec::agent_model::Preset::ALL
            .iter()
            .map(|p| p.name())
            .collect();
        format!("unknown agent preset {s:?}: one of {}", names.join(", "))
    })
}

/// The jail of `mode` hiding `hidden`, with this binary as its launcher;
/// its warnings printed.
pub fn jail(mode: fvd_sandbox::Mode, hidden: &[PathBuf]) -> anyhow::Result<fvd_sandbox::Jail> {
    let exe =
        std::env::current_exe().context("cannot find this fvd binary, the launcher of the jail")?;
    let jail = fvd_sandbox::Jail::start(mode, &exe, hidden)?;
    for w in jail.warnings() {
        super::say(super::Said::Warning, &w);
    }
    Ok(jail)
}

#[derive(Debug, Subcommand)]
pub enum WorkerCmd {
    /// Ask the worker using WORKSPACE to take no new job and to exit once
    /// the jobs it runs have finished and been reported (SIGUSR1).
    Drain {
        /// The worker's scratch folder (it holds `worker.pid`).
        #[arg(long)]
        workspace: PathBuf,
        /// Return only once the worker has exited (a Kubernetes preStop
        /// hook: the container is stopped when the hook returns).
        #[arg(long)]
        wait: bool,
    },
}

/// Labels `config` with the agent CLIs this worker has (found on `PATH`,
/// or named by `--agent-preset`): an attempt of a preset goes only to a
/// worker labelled with it (issue #32).
fn label_agents(config: &mut WorkerConfig, presets: &[fvd_spec::agent_model::Preset]) {
    let path = std::env::var_os("PATH");
    let mut agents = Vec::new();
    for p in fvd_spec::agent_model::Preset::ALL {
        let found = fvd_workspace::preset::find_program(p, path.as_deref()).is_some();
        if found || presets.contains(&p) {
            config.labels.insert(
                format!("{}{}", fvd_actors::attempt::AGENT_LABEL_PREFIX, p.name()),
                "yes".into(),
            );
            agents.push(p.name());
        }
    }
    if !agents.is_empty() {
        tracing::info!(agents = ?agents, "agent CLIs this worker runs");
    }
}

/// The file a running worker keeps its pid in, inside its workspace.
fn pid_file(workspace: &std::path::Path) -> PathBuf {
    workspace.join("worker.pid")
}

/// `fvd worker drain`: SIGUSR1 to the worker named by the pid file; with
/// `wait`, then polls until that process is gone.
fn drain(workspace: &std::path::Path, wait: bool) -> anyhow::Result<Exit> {
    let path = pid_file(workspace);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no running worker: cannot read {}", path.display()))?;
    let pid: i32 = text
        .trim()
        .parse()
        .with_context(|| format!("{} does not hold a pid", path.display()))?;
    // A stale file may name a pid the system gave to another process since.
    if let Err(why) = worker_of(pid, workspace) {
        anyhow::bail!(
            "{} names process {pid}, which is not the fvd worker of {}: {why}; nothing was signalled (the file is stale: the worker is gone)",
            path.display(),
            workspace.display()
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .with_context(|| format!("cannot signal worker {pid} named by {}", path.display()))?;
    println!("asked worker {pid} to drain");
    if wait {
        let pid = nix::unistd::Pid::from_raw(pid);
        // Signal 0 only checks that the process exists.
        while nix::sys::signal::kill(pid, None).is_ok() && path.exists() {
            std::thread::sleep(Duration::from_millis(200));
        }
        println!("worker {pid} drained and exited");
    }
    Ok(Exit::Success)
}

/// Whether process `pid` is `fvd worker … --workspace W` with `W` this
/// workspace (its command line read from `/proc`, a relative `W` taken
/// from the process's own folder); why not otherwise.
fn worker_of(pid: i32, workspace: &std::path::Path) -> Result<(), String> {
    let raw =
        std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|_| "no such process".to_string())?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let shown = args.join(" ");
    let fvd = args.first().is_some_and(|a| {
        std::path::Path::new(a)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("fvd"))
    });
    if !fvd || !args.iter().any(|a| a == "worker") {
        return Err(format!("it runs `{shown}`"));
    }
    let theirs = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--workspace=")
            .map(str::to_string)
            .or_else(|| {
                (a == "--workspace")
                    .then(|| args.get(i + 1).cloned())
                    .flatten()
            })
    });
    let Some(theirs) = theirs else {
        return Err(format!("it runs `{shown}`, with no --workspace"));
    };
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
    let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    if canon(&cwd.join(&theirs)) != canon(workspace) {
        return Err(format!("it is the worker of {theirs}"));
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM: both end a server or worker normally, so
/// `main` flushes buffered spans and metrics before the process exits.
pub async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn idle_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.1 => Ok(v),
        _ => Err(format!("{s} is not a number of seconds of at least 0.1")),
    }
}

/// Raises this process's soft limit of open files to its hard limit (a
/// server of many connections; Go and systemd services do the same), and
/// returns the limit in force.
fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// The dashboard's guard from `serve`'s flags.
fn dashboard_options(
    args: &ServeArgs,
    fds: Option<u64>,
) -> fvd_orchestrator::dashboard::guard::Options {
    use fvd_orchestrator::dashboard::guard::{Limits, Options};
    let mut limits = Limits::for_fd_limit(fds.unwrap_or(1024));
    if let Some(n) = args.dashboard_max_connections {
        let n = n.max(1);
        limits.max_connections = n;
        limits.max_connections_per_client = limits.max_connections_per_client.min(n);
        limits.max_streams = (n / 4).max(1);
        limits.max_streams_per_client = limits.max_streams_per_client.min(limits.max_streams);
    }
    limits.idle = Duration::from_secs_f64(args.dashboard_idle_timeout);
    Options {
        hosts: args.dashboard_hosts.clone(),
        require_viewer: args.dashboard_require_viewer,
        limits: Some(limits),
    }
}

/// Re-reads the credentials on every SIGHUP: a deleted entry is refused
/// from the next call on (and its streams end); a file that does not parse
/// keeps the previous set and says why.
fn reload_on_sighup(credentials: fvd_proto::auth::Credentials) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    fvd_telemetry::spawn(async move {
        while hup.recv().await.is_some() {
            match credentials.reload() {
                Ok(n) => super::say(
                    super::Said::Info,
                    &format!("reloaded the credentials (SIGHUP): {n} hold"),
                ),
                Err(e) => super::say(
                    super::Said::Error,
                    &format!("kept the previous credentials: the new ones do not load: {e}"),
                ),
            }
        }
    });
    Ok(())
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("label {s:?} is not KEY=VALUE")),
    }
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.5 => Ok(v),
        Ok(_) => Err(format!(
            "{s} is too short: workers heartbeat every second, so at least 1.5"
        )),
        Err(_) => Err(format!("{s} is not a number of seconds")),
    }
}

fn non_negative_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=86_400.0).contains(&v) => Ok(v),
        Ok(_) => Err(format!("{s} is not between 0 and 86400 seconds")),
        Err(_) => Err(format!("{s} is not a number of seconds")),
    }
}

/// The multi-threaded runtime every networked command runs on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// A worker configuration for this host: its GPUs (filtered by `gpus`) and
/// CPU slots (default: the number of cores).
pub async fn local_worker_config(
    orchestrator: String,
    workspace: PathBuf,
    gpus: &str,
    cpu_slots: Option<u32>,
    worker_id: Option<String>,
    token: Option<Token>,
    tls_ca: Option<Vec<u8>>,
) -> anyhow::Result<WorkerConfig> {
    let selection = GpuSelection::parse(gpus)?;
    let inventory = if selection == GpuSelection::None {
        Vec::new()
    } else {
        gpu::inventory().await
    };
    let gpus = selection.apply(&inventory)?;
    let host = host_name();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    std::fs::create_dir_all(&workspace)
        .with_context(|| format!("cannot create workspace {}", workspace.display()))?;
    // Jobs run in their own folders and are handed paths inside the
    // workspace (their JUnit file, pytest's plugin): a relative workspace
    // (`--workspace fvd-worker`, say) must not be read from
    // the job's folder.
    let workspace = std::path::absolute(&workspace)
        .with_context(|| format!("workspace {}", workspace.display()))?;
    Ok(WorkerConfig {
        orchestrator,
        worker_id: worker_id.unwrap_or_else(|| format!("{host}-{}", std::process::id())),
        host,
        workspace,
        gpus,
        cpu_slots: cpu_slots.unwrap_or(cores).max(1),
        labels: Default::default(),
        grace: Duration::from_secs(5),
        max_backoff: Duration::from_secs(5),
        token,
        tls_ca,
        provides: Vec::new(),
        code_cache_bytes: fvd_worker::code::DEFAULT_CACHE_BYTES,
        max_output_bytes: fvd_worker::exec::DEFAULT_MAX_OUTPUT_BYTES,
        jail: fvd_sandbox::Jail::off(),
        mps: None,
    })
}

pub fn serve(cmd: OrchestratorCmd) -> anyhow::Result<Exit> {
    let OrchestratorCmd::Serve(args) = cmd;
    let fds = raise_fd_limit();
    runtime()?.block_on(async move {
        args.token.warn_if_readable(false);
        let single = args.token.source();
        let credentials =
            fvd_proto::auth::Credentials::load(args.auth.as_deref(), single.as_ref())?;
        // The single token's value, for the redactors (named credentials
        // are hashes: there is no value to redact).
        let token = args.token.load()?;
        warn_about_credentials(&args, &credentials);
        let store = Store::open(&args.db).await?;
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let config = server_config(&args, &credentials, token)?;
        let health_listener = match &args.health_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen for health checks on {addr}"))?,
            ),
            None => None,
        };
        let mut server = fvd_orchestrator::start(listener, store, config).await?;
        reload_on_sighup(credentials.clone())?;
        // The first line names the address, so scripts can use port 0.
        println!("fvd orchestrator listening on {}", server.url());
        let _dashboard = start_dashboard(&args, &server, &credentials, fds).await?;
        let health = match health_listener {
            Some(l) => {
                tracing::info!(addr = %l.local_addr()?, "answering health checks");
                Some(server.health.serve_on(l))
            }
            None => None,
        };
        tokio::select! {
            r = server.wait() => r.map_err(|e| anyhow::anyhow!("server stopped: {e}"))?,
            _ = interrupted() => {
                // NOT_SERVING first, while the listeners still answer.
                server.begin_shutdown().await;
                server.shutdown().await;
            }
        }
        if let Some(h) = health {
            h.abort();
        }
        Ok(Exit::Success)
    })
}

/// Warns when every call is accepted (no credentials at all) or every call
/// is refused (an `--auth` file that holds none yet).
fn warn_about_credentials(args: &ServeArgs, credentials: &fvd_proto::auth::Credentials) {
    if credentials.is_open() {
        tracing::warn!("no --auth or --token-file: every call is accepted");
    } else if args.auth.is_some() && credentials.is_empty() {
        super::say(
            super::Said::Warning,
            &format!(
                "{} holds no credential yet: every call is refused until one is added (fvd auth add) and the server gets SIGHUP",
                args.auth
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
        );
    }
}

/// The orchestrator's configuration from `serve`'s flags: credentials, TLS
/// identity, agent policy, gRPC limits and the scheduler's settings.
fn server_config(
    args: &ServeArgs,
    credentials: &fvd_proto::auth::Credentials,
    token: Option<Token>,
) -> anyhow::Result<fvd_orchestrator::ServerConfig> {
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(fvd_orchestrator::TlsIdentity {
            cert_pem: std::fs::read(cert)
                .with_context(|| format!("cannot read certificate {}", cert.display()))?,
            key_pem: std::fs::read(key)
                .with_context(|| format!("cannot read key {}", key.display()))?,
        }),
        _ => None,
    };
    let agents = agent_policy(args, token.as_ref())?;
    let mut config = fvd_orchestrator::ServerConfig {
        // What calls are checked against; `token` is only redacted.
        credentials: Some(credentials.clone()),
        token,
        tls,
        max_code_bytes: args.max_code_mib.saturating_mul(1024 * 1024),
        agents,
        ..Default::default()
    };
    if let Some(n) = args.max_grpc_connections {
        config.grpc_limits.max_connections = n.max(1);
        config.grpc_limits.max_connections_per_client = n.max(1);
    }
    config.grpc_limits.idle = Duration::from_secs(args.grpc_idle_secs.max(1));
    config.scheduler.lease_ttl = Duration::from_secs_f64(args.lease_ttl);
    config.scheduler.max_output_bytes = args.max_output_mib * 1024 * 1024;
    config.scheduler.adopt_grace = Duration::from_secs_f64(args.adopt_grace);
    config.scheduler.placement = args.placement;
    config.scheduler.sharing.cap = args.gpu_share_cap;
    Ok(config)
}

/// Where agents run, whether their commands may run, the jail they run in
/// and the secrets redacted from what they say, from `serve`'s flags.
fn agent_policy(
    args: &ServeArgs,
    token: Option<&Token>,
) -> anyhow::Result<fvd_workspace::agent::AgentPolicy> {
    // Agents run here: they never read the token file or the TLS key.
    // Without --allow-agent-commands none runs, so no jail is needed
    // (and a host that allows none still serves).
    let agent_jail = if args.allow_agent_commands {
        let mut hidden: Vec<PathBuf> = args.token.token_file.iter().cloned().collect();
        hidden.extend(args.auth.iter().cloned());
        hidden.extend(args.tls_key.iter().cloned());
        hidden.extend(args.agent_hide.iter().cloned());
        jail(args.agent_sandbox, &hidden)?
    } else {
        fvd_sandbox::Jail::off()
    };
    let mut agent_secrets = fvd_contracts::redactor::Redactor::default();
    if let Some(t) = token {
        agent_secrets.add(
            fvd_orchestrator::worker_api::TOKEN_NAME,
            t.value().as_bytes(),
        );
    }
    tracing::info!(jail = %agent_jail.describe(), allow_agent_commands = args.allow_agent_commands, "agents");
    Ok(fvd_workspace::agent::AgentPolicy {
        on: if args.agents == "fleet" {
            fvd_workspace::agent::AgentsOn::Fleet
        } else {
            fvd_workspace::agent::AgentsOn::Host
        },
        commands: if args.allow_agent_commands {
            fvd_workspace::agent::AgentCommands::Allowed
        } else {
            fvd_workspace::agent::AgentCommands::Refused
        },
        jail: agent_jail,
        secrets: agent_secrets,
        registry: Default::default(),
        limits: fvd_workspace::attempt_caps::AttemptLimits {
            max_pack_bytes: args.max_attempt_pack_mib.saturating_mul(1024 * 1024),
            max_unpacked_bytes: args.max_attempt_unpacked_mib.saturating_mul(1024 * 1024),
            max_files: args.max_attempt_files,
            max_file_bytes: args.max_attempt_file_mib.saturating_mul(1024 * 1024),
        },
    })
}

/// Serves the dashboard when `--dashboard` names an address, and prints
/// where; warns when it speaks plain HTTP beyond loopback to a server that
/// checks credentials.
async fn start_dashboard(
    args: &ServeArgs,
    server: &fvd_orchestrator::Server,
    credentials: &fvd_proto::auth::Credentials,
    fds: Option<u64>,
) -> anyhow::Result<Option<fvd_orchestrator::dashboard::DashboardServer>> {
    let Some(addr) = &args.dashboard else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for the dashboard"))?;
    let dash = fvd_orchestrator::dashboard::Dashboard::live(server);
    let d = fvd_orchestrator::dashboard::serve(listener, dash, dashboard_options(args, fds))
        .context("cannot start the dashboard")?;
    if !credentials.is_open() && !fvd_orchestrator::dashboard::is_loopback(&d.addr) {
        super::say(
            super::Said::Warning,
            &format!(
                "the dashboard on {} speaks plain HTTP: a token typed into its answer form crosses the network in clear (bind it to loopback and use a tunnel)",
                d.addr
            ),
        );
    }
    println!("fvd dashboard on {}", d.url());
    Ok(Some(d))
}

pub fn worker(args: WorkerArgs) -> anyhow::Result<Exit> {
    if let Some(WorkerCmd::Drain { workspace, wait }) = &args.command {
        return drain(workspace, *wait);
    }
    let (Some(orchestrator), Some(workspace)) = (args.orchestrator, args.workspace) else {
        anyhow::bail!("fvd worker needs --orchestrator and --workspace");
    };
    args.token.warn_if_readable(true);
    runtime()?.block_on(async move {
        let mut config = local_worker_config(
            orchestrator,
            workspace,
            &args.gpus,
            args.cpu_slots,
            args.worker_id,
            args.token.load_client()?,
            args.tls.load()?,
        )
        .await?;
        config.labels = args.labels.into_iter().collect();
        label_agents(&mut config, &args.agent_presets);
        config.provides = args.provides;
        config.code_cache_bytes = args.code_cache_mib.saturating_mul(1024 * 1024);
        config.max_output_bytes = args.max_output_mib * 1024 * 1024;
        let mut hidden: Vec<PathBuf> = args.token.token_file.iter().cloned().collect();
        hidden.extend(args.job_hide.iter().cloned());
        config.jail = jail(args.job_sandbox, &hidden)?;
        if args.mps {
            let mps = fvd_worker::mps::Mps::start(&config.workspace, &config.gpus).await?;
            config.labels.insert("mps".into(), "on".into());
            config.mps = Some(mps);
        }
        println!(
            "fvd worker {} with {} GPU(s){} and {} CPU slot(s) dialing {}; jobs: {}",
            config.worker_id,
            config.gpus.len(),
            if config.mps.is_some() {
                " under CUDA MPS"
            } else {
                ""
            },
            config.cpu_slots,
            config.orchestrator,
            config.jail.describe()
        );
        let mps = config.mps.clone();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        fvd_telemetry::spawn(async move {
            interrupted().await;
            stop.cancel();
        });
        // `fvd worker drain` finds this process through the pid file.
        let drain = CancellationToken::new();
        let on_usr1 = drain.clone();
        let mut usr1 =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                .context("cannot listen for SIGUSR1")?;
        fvd_telemetry::spawn(async move {
            usr1.recv().await;
            on_usr1.cancel();
        });
        let link = fvd_worker::health::LinkReporter::default();
        let health_stop = CancellationToken::new();
        let health = match &args.health_listen {
            Some(addr) => {
                let listener = fvd_worker::health::HealthListener::bind(addr).await?;
                tracing::info!(addr = %listener.addr, "answering health checks");
                Some(fvd_telemetry::spawn(
                    listener.serve(link.clone(), health_stop.clone()),
                ))
            }
            None => None,
        };
        let pid_path = pid_file(&config.workspace);
        std::fs::write(&pid_path, std::process::id().to_string())
            .with_context(|| format!("cannot write {}", pid_path.display()))?;
        let result = fvd_worker::client::run_reporting(config, shutdown, drain, link).await;
        if let Some(mps) = mps
            && let Err(e) = mps.stop().await
        {
            super::say(
                super::Said::Warning,
                &format!("cannot stop the MPS daemon: {e}"),
            );
        }
        let _ = std::fs::remove_file(&pid_path);
        health_stop.cancel();
        if let Some(h) = health {
            let _ = h.await;
        }
        // A refused credential is exit 6, like any other command's.
        if let Err(fvd_worker::client::ClientError::Refused { url, status }) = &result
            && matches!(
                status.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            )
        {
            return Err(super::exit::Remote::Refused {
                url: url.clone(),
                message: status.message().to_string(),
            }
            .into());
        }
        result?;
        Ok(Exit::Success)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Issue #38: a token file others can read is named in a warning;
    /// one only its owner reads is not.
    #[test]
    fn a_token_file_its_group_or_others_can_read_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("worker.token");
        std::fs::write(&p, "fvd_abc\n").unwrap();
        let with_mode = |mode: u32| {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            readable_by_others(&p)
        };
        let line = with_mode(0o644).expect("0644 is readable by others");
        assert_eq!(
            line,
            format!(
                "the token file {} is readable by its group and others (mode 0644): anyone who reads it acts as its credential; chmod 600 it",
                p.display()
            )
        );
        assert!(
            with_mode(0o640)
                .unwrap()
                .contains("readable by its group (mode 0640)")
        );
        assert!(
            with_mode(0o604)
                .unwrap()
                .contains("readable by others (mode 0604)")
        );
        for private in [0o600, 0o400, 0o700, 0o622] {
            assert_eq!(with_mode(private), None, "{private:o}");
        }
        assert_eq!(readable_by_others(&dir.path().join("missing")), None);
        // Whose file: --token-file, or a client's FVD_TOKEN_FILE; none
        // for a variable.
        let args = TokenArgs {
            token_file: Some(p.clone()),
            token_env: None,
        };
        assert_eq!(args.file(false), Some(p.clone()));
        let env = TokenArgs {
            token_file: None,
            token_env: Some("FVD_TOKEN".into()),
        };
        assert_eq!(env.file(true), None);
    }
}
