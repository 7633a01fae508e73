//! The subcommands of `fvd`. Each returns the process exit code it wants
//! (0 success, 1 findings or divergence, 2 usage or input error); an `Err`
//! becomes exit code 2 with the error printed once by `main`.

pub mod contracts;
pub mod trace;

use clap::{Parser, Subcommand};

/// fvd: parity-driven model ports on GPU fleets.
#[derive(Debug, Parser)]
#[command(name = "fvd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate workflow contracts and PORT_STATUS.md files.
    #[command(subcommand)]
    Contracts(contracts::ContractsCmd),
    /// Compare, merge and inspect activation traces and tensor dumps.
    #[command(subcommand)]
    Trace(trace::TraceCmd),
}

pub fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Contracts(c) => contracts::run(c),
        Command::Trace(c) => trace::run(c),
    }
}
