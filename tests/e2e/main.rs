//! The one integration-test binary of fvd: every test here runs the real
//! `fvd` binary (or boots real servers) against real inputs.

mod support;
mod trace;
mod port;
mod contracts;
