//! `fvd`: the command-line entry point. Parses arguments and delegates each
//! subcommand to its module under `cmd/`; exit codes are decided there.

mod cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cmd::Cli::parse();
    match cmd::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("fvd: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
