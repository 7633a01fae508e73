//! Checks shared by two test targets of the root package: `e2e` runs them
//! on the project's own inputs (`tests/fixtures`), `conformance` on the real
//! FastVideo files. Each check takes a description of the inputs it runs on
//! (paths, names, the numbers that set has), so both targets hold the same
//! assertions.

pub mod contracts;
pub mod fastvideo;
pub mod trace;

use std::process::Command;

/// The `fvd` binary cargo built for this test run.
pub fn fvd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fvd"))
}
