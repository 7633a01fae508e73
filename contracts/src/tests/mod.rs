//! Crate-level tests: contract examples and rules, round trips and the real
//! `PORT_STATUS.md` fixtures. Every parser is fuzzed in `fvd-fuzz`.

mod examples;
mod port_status;
mod roundtrip;
mod rules;

use std::path::PathBuf;

/// A file under `shared/fixtures`, which CI lays out beside the checkout.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/fixtures"
    ))
    .join(rel)
}

/// The four real status files.
pub const PORT_STATUS_FIXTURES: [&str; 4] = [
    "port_status/dreamx_world.md",
    "port_status/flux.md",
    "port_status/lingbotworld2.md",
    "port_status/minimax_h3.md",
];
