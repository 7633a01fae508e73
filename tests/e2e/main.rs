//! The one integration-test binary of fvd: every test here runs the real
//! `fvd` binary (or boots real servers) against the project's own inputs
//! (`tests/fixtures`); the same checks on the real FastVideo files are the
//! conformance suite (`tests/conformance`).

mod agent;
mod agent_model;
mod agents_on_the_fleet;
mod bycommit;
mod chaos;
#[path = "../checks/mod.rs"]
mod checks;
mod coauthor;
mod containment;
mod contracts;
mod dashboard;
mod dashboard_guard;
mod durability;
mod environment;
mod example_pipeline;
mod fastvideo_checkout;
mod fleet;
mod forged;
mod gc;
mod git_escape;
mod init;
mod judge;
mod later_phases;
mod logging;
mod mps;
mod output;
mod pipeline_agent;
mod port;
mod record;
mod snapshot;
mod support;
mod team;
mod telemetry;
mod terminal;
mod trace;
mod trace_checks;
mod trace_port;
mod variants;
mod warm;
mod workers;
