//! The external conformance suite: the checks of the e2e tests (and the
//! contract library's import and render checks), run on the real FastVideo
//! documents and the real GPT-2 traces instead of the project's own inputs.
//!
//! It reads the folder named by `FVD_CONFORMANCE_FIXTURES` (laid out as
//! `../shared/fixtures`: `contracts/`, `port_status/`, `traces/gpt2/`) and
//! fails, never passes, when that is unset or incomplete. Built only with
//! `--features conformance`, so `cargo test --workspace` never needs it:
//!
//! ```sh
//! FVD_CONFORMANCE_FIXTURES=../shared/fixtures \
//!     cargo test --locked --features conformance --test conformance
//! ```

#[path = "../checks/mod.rs"]
mod checks;
mod contracts;
mod fastvideo;
mod port_status;
mod trace;

use std::path::PathBuf;

/// The real fixtures folder, or a panic saying why it cannot be used.
pub fn real() -> PathBuf {
    const VAR: &str = "FVD_CONFORMANCE_FIXTURES";
    let Some(dir) = std::env::var_os(VAR) else {
        panic!(
            "{VAR} is not set: the conformance suite needs the real fixtures folder \
             (e.g. {VAR}=../shared/fixtures); it never passes without it"
        );
    };
    let dir = std::path::absolute(PathBuf::from(&dir))
        .unwrap_or_else(|e| panic!("{VAR}={}: {e}", dir.to_string_lossy()));
    for sub in ["contracts", "port_status", "traces/gpt2"] {
        assert!(
            dir.join(sub).is_dir(),
            "{VAR}={}: no {sub}/ in it; is this the real fixtures folder?",
            dir.display()
        );
    }
    dir
}
