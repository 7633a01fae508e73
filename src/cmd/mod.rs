//! The subcommands of `fvd`. Each parses its arguments, calls the library
//! crates and returns the [`exit::Exit`] it wants; an `Err` becomes
//! [`exit::Exit::Usage`] with the error printed once by `main`.

pub mod agents;
pub mod auth;
pub mod contracts;
pub mod dashboard;
pub mod dry_run;
pub mod embedded;
pub mod exit;
pub mod gc;
pub mod init;
pub mod mcp;
pub mod port;
pub mod read;
pub mod render;
pub mod server;
pub mod source;
pub mod terminal;
pub mod trace;
pub mod trace_show;

use clap::{Parser, Subcommand};

/// The repository whose embedded state (`.fvd/state.db`) holds the ports,
/// found from `repo` or any folder below it; `repo` itself when none does.
pub fn find_state(repo: &std::path::Path) -> std::path::PathBuf {
    let Ok(start) = repo.canonicalize() else {
        return repo.to_path_buf();
    };
    start
        .ancestors()
        .find(|d| d.join(".fvd").join("state.db").is_file())
        .map_or(start.clone(), std::path::Path::to_path_buf)
}

/// The repository of a family's port, found from `repo` or any folder
/// below it, as git finds its top: the nearest of `repo` and its parents
/// that holds `tests/local_tests/<family>/` (a run from inside the family
/// folder, say). When none does, the nearest that looks like a checkout
/// (it holds `.git` or `tests/local_tests`), else `repo` itself, so the
/// error names it. A `repo` that does not exist (a mistyped family folder)
/// is searched from its nearest existing parent.
pub fn find_repo(repo: &std::path::Path, family: &str) -> std::path::PathBuf {
    let Some(start) = repo.ancestors().find_map(|d| {
        let d = if d.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            d
        };
        d.canonicalize().ok()
    }) else {
        return repo.to_path_buf();
    };
    let rel = std::path::Path::new("tests/local_tests").join(family);
    let checkout =
        |d: &std::path::Path| d.join(".git").exists() || d.join("tests/local_tests").is_dir();
    start
        .ancestors()
        .find(|d| d.join(&rel).is_dir())
        .or_else(|| start.ancestors().find(|d| checkout(d)))
        .map_or(start.clone(), std::path::Path::to_path_buf)
}

/// fvd: parity-driven model ports on GPU fleets.
#[derive(Debug, Parser)]
/// `--version` names the commit and the build day too (see `build.rs`).
#[command(name = "fvd", version = env!("FVD_VERSION"), about, after_long_help = long_help_end())]
pub struct Cli {
    /// Export spans and metrics over OTLP/gRPC to this collector
    /// (`http://HOST:4317`); `OTEL_EXPORTER_OTLP_ENDPOINT` does the same.
    /// Off when neither is set.
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Log fvd's own lines to stderr (-v info, -vv debug). A command prints
    /// none otherwise; servers (`orchestrator`, `worker`, `dashboard`) log
    /// at info, one line per event, and -v makes them log debug. `FVD_LOG`
    /// sets the filter outright.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// How log lines are written to stderr: `text` (one line per event) or
    /// `json` (one JSON object per line: timestamp, level, target, message,
    /// fields and span).
    #[arg(
        long,
        global = true,
        value_name = "FORMAT",
        env = "FVD_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Colour in the output: `auto` (only on a terminal, and not when
    /// `NO_COLOR` is set), `always` or `never`.
    #[arg(long, global = true, value_name = "WHEN", default_value = "auto")]
    pub color: ColorChoice,
    #[command(subcommand)]
    pub command: Command,
}

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl From<LogFormat> for fvd_telemetry::LogFormat {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Text => fvd_telemetry::LogFormat::Text,
            LogFormat::Json => fvd_telemetry::LogFormat::Json,
        }
    }
}

/// The variables fvd reads, for `--help` and the man page's ENVIRONMENT.
pub const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "FVD_ORCHESTRATOR",
        "the orchestrator URL when --orchestrator is not given",
    ),
    (
        "FVD_TOKEN_FILE",
        "a client's token file when --token-file is not given",
    ),
    (
        "FVD_LOG",
        "the log filter, an EnvFilter (info,fvd_worker=debug)",
    ),
    ("FVD_LOG_FORMAT", "text or json, as --log-format"),
    ("NO_COLOR", "no colour in the output"),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "where spans and metrics go, as --otlp-endpoint (other OTEL_* variables are honoured)",
    ),
    (
        "FVD_AGENT_CLI_DIR",
        "a folder of agent CLIs, looked in before PATH",
    ),
    (
        "ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY",
        "a model API's key (or the variable a spec's key_env names), read by the model proxy, never given to an agent",
    ),
    (
        "ANTHROPIC_BASE_URL, OPENAI_BASE_URL, GOOGLE_GEMINI_BASE_URL",
        "another endpoint for that API (a gateway, a test server)",
    ),
];

/// The end of `fvd --help`: EXIT STATUS and ENVIRONMENT, as the man page
/// has them.
fn long_help_end() -> String {
    let mut s = String::from("Exit status:\n");
    for (code, meaning) in exit::STATUSES {
        s.push_str(&format!("  {code:<5} {meaning}\n"));
    }
    s.push_str("\nEnvironment:\n");
    for (name, meaning) in ENVIRONMENT {
        s.push_str(&format!("  {name}\n          {meaning}\n"));
    }
    s
}

/// Whether this process writes colour (set once by `main`).
pub static COLOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether log lines are JSON objects (`--log-format json`; set once by
/// `main`).
pub static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How a line [`say`] writes reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// `fvd: TEXT`.
    Info,
    /// `fvd: warning: TEXT`.
    Warning,
    /// `fvd: error: TEXT`.
    Error,
}

/// A line for a person on stderr (a server's warning or news, the last
/// error): `fvd: warning: TEXT` as text, or under `--log-format json` one
/// JSON log event, so that every stderr line of a process parses as JSON.
pub fn say(said: Said, text: &str) {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        let level = match said {
            Said::Info => "INFO",
            Said::Warning => "WARN",
            Said::Error => "ERROR",
        };
        eprintln!("{}", fvd_telemetry::json_event(level, text));
    } else {
        let prefix = match said {
            Said::Info => "fvd: ",
            Said::Warning => "fvd: warning: ",
            Said::Error => "fvd: error: ",
        };
        eprintln!("{prefix}{text}");
    }
}

/// Whether output may carry colour codes.
pub fn color() -> bool {
    COLOR.load(std::sync::atomic::Ordering::Relaxed)
}

impl Cli {
    /// Whether to write colour: `--color`, else a terminal on stderr and no
    /// `NO_COLOR` (any value, as no-color.org says).
    pub fn color_enabled(&self) -> bool {
        use std::io::IsTerminal;
        match self.color {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stderr().is_terminal()
            }
        }
    }

    /// The log filter when `FVD_LOG` sets none: servers (the
    /// orchestrator, workers, the dashboard) log at info, one line per
    /// event and nothing per heartbeat or poll, and -v makes them log
    /// debug; a command logs nothing unless asked with `-v`.
    pub fn default_log_filter(&self) -> &'static str {
        let server = matches!(
            self.command,
            Command::Orchestrator(_) | Command::Worker(_) | Command::Dashboard(_)
        );
        match (self.verbose, server) {
            (0, true) => "info",
            (0, false) => "off",
            (1, false) => "info",
            _ => "debug",
        }
    }

    /// `service.name` of this process unless `OTEL_SERVICE_NAME` says.
    pub fn service_name(&self) -> &'static str {
        match self.command {
            Command::Orchestrator(_) => "fvd-orchestrator",
            Command::Worker(_) => "fvd-worker",
            _ => "fvd",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate workflow contracts and PORT_STATUS.md files.
    #[command(subcommand)]
    Contracts(contracts::ContractsCmd),
    /// Compare, merge and inspect activation traces and tensor dumps.
    #[command(subcommand)]
    Trace(trace::TraceCmd),
    /// Write a family's port.toml from its PORT_STATUS.md, README and test files.
    Init(init::InitArgs),
    /// Start (or resume) the port of a family.
    Submit(port::SubmitArgs),
    /// Show ports, their phase and their components.
    Status(read::StatusArgs),
    /// Print the output of a component's run.
    Logs(read::LogsArgs),
    /// Show the agent-attempt ledger of a component.
    Attempts(read::AttemptsArgs),
    /// Show the workers: their GPUs, free slots, labels and the runs each
    /// holds.
    Workers(read::WorkersArgs),
    /// Show the runs waiting for a worker, what each needs and why it
    /// waits.
    Queue(read::QueueArgs),
    /// Cancel a running port.
    Cancel(port::CancelArgs),
    /// Forget a port's embedded state so the next submit starts it over
    /// (PORT_STATUS.md, the spec and agent branches are left alone).
    Reset(port::ResetArgs),
    /// Answer a question (escape hatch E###) an agent asked; the component
    /// that waits on it goes on.
    Answer(port::AnswerArgs),
    /// Remove agent worktrees and branches no port needs any more (merged
    /// and finished, or of a port or component no longer recorded).
    Gc(gc::GcArgs),
    /// Serve one agent attempt's tools over MCP on stdin/stdout (started
    /// by the agent's CLI, which the agent presets configure).
    Mcp(mcp::McpArgs),
    /// Run the orchestrator server.
    #[command(subcommand)]
    Orchestrator(server::OrchestratorCmd),
    /// Manage the credentials file of `fvd orchestrator serve --auth`.
    #[command(subcommand)]
    Auth(auth::AuthCmd),
    /// Run a GPU worker that dials an orchestrator.
    Worker(server::WorkerArgs),
    /// Serve the web dashboard of an embedded state (REPO/.fvd/state.db),
    /// read-only, while or after `fvd submit` runs there.
    Dashboard(dashboard::DashboardArgs),
    /// Check the coding-agent presets of the repository's ports: CLI,
    /// model, endpoint, key.
    #[command(subcommand)]
    Agents(agents::AgentsCmd),
    /// Print a shell completion script (bash, zsh, fish, …) to stdout.
    Completions(terminal::CompletionsArgs),
    /// Print fvd's manual page (roff) to stdout, or write one page per
    /// subcommand with --dir.
    Man(terminal::ManArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<exit::Exit> {
    match cli.command {
        Command::Contracts(c) => contracts::run(c),
        Command::Trace(c) => trace::run(c),
        Command::Init(a) => init::run(a),
        Command::Submit(a) => port::submit(a),
        Command::Status(a) => read::status(a),
        Command::Logs(a) => read::logs(a),
        Command::Attempts(a) => read::attempts(a),
        Command::Workers(a) => read::workers(a),
        Command::Queue(a) => read::queue(a),
        Command::Cancel(a) => port::cancel(a),
        Command::Reset(a) => port::reset(a),
        Command::Answer(a) => port::answer(a),
        Command::Gc(a) => gc::run(a),
        Command::Mcp(a) => mcp::run(a),
        Command::Orchestrator(c) => server::serve(c),
        Command::Auth(c) => auth::run(c),
        Command::Worker(a) => server::worker(a),
        Command::Dashboard(a) => dashboard::run(a),
        Command::Agents(c) => agents::run(c),
        Command::Completions(a) => terminal::completions(a),
        Command::Man(a) => terminal::man(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `fvd SUB SUB` of a command path.
    fn shown(path: &[&str]) -> String {
        path.join(" ")
    }

    /// The `--flags` named in `text`, each with the command path that
    /// should hold it: a flag inside a code span that starts with `fvd …`
    /// belongs to that command; one in a span that starts with another
    /// program (`git diff --exit-code`) is not fvd's; any other to `here`.
    fn named_flags(text: &str, here: &[String]) -> Vec<(Vec<String>, String)> {
        let mut found = Vec::new();
        for (i, part) in text.split('`').enumerate() {
            let code = i % 2 == 1;
            let words: Vec<&str> = part.split_whitespace().collect();
            let owner: Vec<String> = match words.first() {
                Some(&"fvd") if code => words
                    .iter()
                    .take_while(|w| !w.starts_with('-'))
                    .map(|w| w.to_string())
                    .collect(),
                Some(w) if code && !w.starts_with('-') => continue,
                _ => here.to_vec(),
            };
            let bytes = part.as_bytes();
            let mut at = 0;
            while let Some(off) = part[at..].find("--") {
                let start = at + off;
                at = start + 2;
                if start > 0
                    && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'-')
                {
                    continue;
                }
                let name: String = part[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                let name = name.trim_end_matches('-');
                if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                    continue;
                }
                found.push((owner.clone(), name.to_string()));
            }
        }
        found
    }

    /// The built command at `path` (`["fvd", "orchestrator", "serve"]`).
    fn find<'a>(root: &'a clap::Command, path: &[String]) -> Option<&'a clap::Command> {
        let mut cmd = root;
        for word in path.iter().skip(1) {
            match cmd.find_subcommand(word) {
                Some(sub) => cmd = sub,
                // `fvd submit --family F` in prose: the words after the
                // command are its arguments.
                None => break,
            }
        }
        Some(cmd)
    }

    fn walk(
        root: &clap::Command,
        cmd: &clap::Command,
        path: &mut Vec<String>,
        missing: &mut Vec<String>,
        unknown: &mut Vec<String>,
    ) {
        let mut texts: Vec<String> = [cmd.get_about(), cmd.get_long_about()]
            .into_iter()
            .flatten()
            .map(ToString::to_string)
            .collect();
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        for arg in cmd.get_arguments() {
            if matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            let name = match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => format!("<{}>", arg.get_id().as_str().to_uppercase()),
            };
            match (arg.get_help(), arg.get_long_help()) {
                (None, None) => missing.push(format!("{} {name}", shown(&refs))),
                (help, long) => texts.extend(help.into_iter().chain(long).map(ToString::to_string)),
            }
        }
        for text in &texts {
            for (owner, flag) in named_flags(text, path) {
                let Some(target) = find(root, &owner) else {
                    continue;
                };
                let known = target.get_arguments().any(|a| {
                    a.get_long() == Some(flag.as_str())
                        || a.get_all_aliases().into_iter().flatten().any(|x| x == flag)
                });
                if !known {
                    unknown.push(format!(
                        "{}: its help names --{flag}, which `{}` does not take",
                        shown(&refs),
                        shown(&owner.iter().map(String::as_str).collect::<Vec<_>>())
                    ));
                }
            }
        }
        // clap's own `help` subcommand repeats the others' abouts.
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            path.push(sub.get_name().to_string());
            walk(root, sub, path, missing, unknown);
            path.pop();
        }
    }

    #[test]
    fn every_option_has_help_and_every_flag_a_help_names_exists() {
        let mut root = Cli::command();
        root.build();
        let (mut missing, mut unknown) = (Vec::new(), Vec::new());
        walk(
            &root,
            &root,
            &mut vec!["fvd".to_string()],
            &mut missing,
            &mut unknown,
        );
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "options without help:\n{}\nhelp that names flags that do not exist:\n{}",
            missing.join("\n"),
            unknown.join("\n")
        );
    }

    #[test]
    fn the_help_check_finds_flags_and_their_commands() {
        let here = vec!["fvd".to_string(), "worker".to_string()];
        let found = named_flags(
            "a file (--token-file, or `fvd auth add NAME --role R`); as `git diff --exit-code` does; -vv",
            &here,
        );
        assert_eq!(
            found,
            vec![
                (here.clone(), "token-file".to_string()),
                (
                    vec!["fvd".into(), "auth".into(), "add".into(), "NAME".into()],
                    "role".to_string()
                ),
            ]
        );
    }

    fn filter(args: &[&str]) -> &'static str {
        let cli = Cli::try_parse_from(args).expect("arguments parse");
        cli.default_log_filter()
    }

    #[test]
    fn servers_log_info_by_default_and_commands_nothing_unless_asked() {
        let serve = ["fvd", "orchestrator", "serve", "--db", "sqlite://x.db"];
        assert_eq!(filter(&serve), "info");
        assert_eq!(filter(&[&serve[..], &["-v"]].concat()), "debug");
        assert_eq!(filter(&["fvd", "dashboard"]), "info");
        assert_eq!(filter(&["fvd", "status"]), "off");
        assert_eq!(filter(&["fvd", "status", "-v"]), "info");
        assert_eq!(filter(&["fvd", "-vv", "status"]), "debug");
    }
}
