//! The one integration-test binary of fvd: every test here runs the real
//! `fvd` binary (or boots real servers) against real inputs.

mod agent;
mod contracts;
mod port;
mod support;
mod telemetry;
mod trace;
mod trace_checks;
mod trace_port;
