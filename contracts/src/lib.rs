//! Typed contracts of the add-model workflow, the phase model P0–P11 and
//! `PORT_STATUS.md` import and render.
//!
//! This crate is pure: it performs no IO, spawns nothing and depends on no
//! other workspace crate, so every other part of fvd can share one reading of
//! the contracts.

pub mod verdict;
