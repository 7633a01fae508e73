//! Fuzzing of fvd's parsers on the stable toolchain.
//!
//! One target per parser ([`targets::TARGETS`]): contract blocks,
//! `PORT_STATUS.md` import, `port.toml`, trace JSONL, safetensors and npy
//! headers, JUnit XML verdict classification, and agent handoffs. Each is
//! fed seeds (the project's own inputs, see [`corpus`]) and their
//! mutations by [`engine`], an in-process mutation loop guided by the
//! outcomes it has seen.
//!
//! `cargo test -p fvd-fuzz` runs every target for a bounded time
//! (`FVD_FUZZ_SECS`, the total over all targets; CI sets 60) in the
//! `fvd-fuzz` binary, so a crash that aborts (a stack overflow) is caught
//! and its input found by replaying the run. Longer local runs:
//! `cargo run -p fvd-fuzz --profile fuzz -- run port_spec --secs 600`.

pub mod corpus;
pub mod engine;
pub mod targets;
