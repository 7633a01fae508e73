//! The subcommands of `fvd`. Each parses its arguments, calls the library
//! crates and returns the [`exit::Exit`] it wants; an `Err` becomes
//! [`exit::Exit::Usage`] with the error printed once by `main`.

pub mod agents;
pub mod contracts;
pub mod dashboard;
pub mod dry_run;
pub mod embedded;
pub mod exit;
pub mod init;
pub mod port;
pub mod server;
pub mod trace;
pub mod trace_show;

use clap::{Parser, Subcommand};

/// fvd: parity-driven model ports on GPU fleets.
#[derive(Debug, Parser)]
#[command(name = "fvd", version, about)]
pub struct Cli {
    /// Export spans and metrics over OTLP/gRPC to this collector
    /// (`http://HOST:4317`); `OTEL_EXPORTER_OTLP_ENDPOINT` does the same.
    /// Off when neither is set.
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
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
    Status(port::StatusArgs),
    /// Print the output of a component's run.
    Logs(port::LogsArgs),
    /// Show the agent-attempt ledger of a component.
    Attempts(port::AttemptsArgs),
    /// Cancel a running port.
    Cancel(port::CancelArgs),
    /// Forget a port's embedded state so the next submit starts it over
    /// (PORT_STATUS.md, the spec and agent branches are left alone).
    Reset(port::ResetArgs),
    /// Answer a question (escape hatch E###) an agent asked; the component
    /// that waits on it goes on.
    Answer(port::AnswerArgs),
    /// Run the orchestrator server.
    #[command(subcommand)]
    Orchestrator(server::OrchestratorCmd),
    /// Run a GPU worker that dials an orchestrator.
    Worker(server::WorkerArgs),
    /// Serve the web dashboard of an embedded state (REPO/.fvd/state.db),
    /// read-only, while or after `fvd submit` runs there.
    Dashboard(dashboard::DashboardArgs),
    /// Check the coding-agent presets of the repository's ports: CLI,
    /// model, endpoint, key.
    #[command(subcommand)]
    Agents(agents::AgentsCmd),
}

pub fn run(cli: Cli) -> anyhow::Result<exit::Exit> {
    match cli.command {
        Command::Contracts(c) => contracts::run(c),
        Command::Trace(c) => trace::run(c),
        Command::Init(a) => init::run(a),
        Command::Submit(a) => port::submit(a),
        Command::Status(a) => port::status(a),
        Command::Logs(a) => port::logs(a),
        Command::Attempts(a) => port::attempts(a),
        Command::Cancel(a) => port::cancel(a),
        Command::Reset(a) => port::reset(a),
        Command::Answer(a) => port::answer(a),
        Command::Orchestrator(c) => server::serve(c),
        Command::Worker(a) => server::worker(a),
        Command::Dashboard(a) => dashboard::run(a),
        Command::Agents(c) => agents::run(c),
    }
}
