//! Shared helpers for the end-to-end tests: locating the built binary and
//! the `shared/fixtures` folder that sits beside the checkout.

use std::path::PathBuf;
use std::process::Command;

/// The `fvd` binary cargo built for this test run.
pub fn fvd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fvd"))
}

/// `../shared/fixtures` relative to the workspace root; CI lays it out the same way.
pub fn fixtures() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [root.join("../shared/fixtures"), root.join("shared/fixtures")];
    for c in &candidates {
        if c.is_dir() {
            return c.clone();
        }
    }
    panic!("fixtures not found: looked in {candidates:?}");
}
