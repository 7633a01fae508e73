//! Checks of the repository's shape that no crate's own tests see: the
//! one git runner (`git.rs`), the
//! layer rule of `ARCHITECTURE.md` against the crates' real dependencies
//! (`cargo metadata`), and the links and paths the documents name.
//!
//! Both read the checkout only; neither builds or runs fvd.

mod git;
mod layers;
mod links;
mod profiles;

use std::path::{Path, PathBuf};

/// The repository's root: this package's manifest folder.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}
