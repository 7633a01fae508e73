//! `fvd`: the command-line entry point. Parses arguments, sets up logging
//! and delegates each subcommand to its module under `cmd/`; exit codes are
//! decided there.

mod cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cmd::Cli::parse();
    // Logs go to stderr so stdout stays machine-readable (`--json`).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FVD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cmd::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("fvd: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
