//! `fvd contracts …`: validate handoff blocks and `PORT_STATUS.md` files.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ContractsCmd {}

pub fn run(cmd: ContractsCmd) -> anyhow::Result<u8> {
    match cmd {}
}
