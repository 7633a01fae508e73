//! `fvd trace …`: offline activation-trace and tensor-dump comparison.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum TraceCmd {}

pub fn run(cmd: TraceCmd) -> anyhow::Result<u8> {
    match cmd {}
}
