//! Crate-level tests: contract examples and rules, round trips and the
//! project's own `PORT_STATUS.md` fixtures. Every parser is fuzzed in
//! `fvd-fuzz`. (The same checks on the real FastVideo files are in the root
//! package's conformance suite, `tests/conformance`.)

mod coauthor;
mod examples;
mod later_phases;
mod port_status;
mod roundtrip;
mod rules;

use std::path::PathBuf;

/// A file under the repository's `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures")).join(rel)
}

/// The project's status files: a name (for snapshots) and the path.
pub const PORT_STATUS_FIXTURES: [(&str, &str); 5] = [
    // complete, contract-shaped, with every quirk of a finished port
    (
        "orbitcam",
        "fastvideo/tests/local_tests/orbitcam/PORT_STATUS.md",
    ),
    // free-form: none of the contract's sections
    (
        "pixelflow",
        "fastvideo/tests/local_tests/pixelflow/PORT_STATUS.md",
    ),
    // the contract's sections, loosely filled and padded tables
    (
        "tidewave",
        "fastvideo/tests/local_tests/tidewave/PORT_STATUS.md",
    ),
    // barely any contract: bullets where a table belongs
    ("sparse", "port_status/sparse.md"),
    // in progress, with values that look like credentials
    ("leaky", "port_status/leaky.md"),
];
