//! Typed contracts of the add-model workflow, the phase model P0–P11 and
//! `PORT_STATUS.md` import and render.
//!
//! This crate is pure: it performs no IO, spawns nothing and depends on no
//! other workspace crate, so every other part of fvd can share one reading of
//! the contracts.

pub mod block;
pub mod coauthor;
pub mod common;
pub mod component;
pub mod contract;
pub mod conversion;
pub mod escape_hatch;
pub mod fields;
pub mod final_handoff;
pub mod findings;
pub mod ids;
pub mod kind;
pub mod phase;
pub mod pipeline;
pub mod port_status;
pub mod prep;
pub mod recorded;
pub mod redactor;
pub mod secrets;
pub mod status_doc;
pub mod status_guard;
pub mod status_match;
pub mod status_read;
#[cfg(test)]
mod tests;
pub mod text;
pub mod verdict;

pub use contract::{Checked, Contract};
pub use findings::{ContractError, Finding};
pub use kind::{ContractKind, Report};
pub use phase::Phase;
pub use port_status::PortStatus;
