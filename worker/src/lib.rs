//! The fvd worker: finds the GPUs of its host, runs jobs as subprocesses in
//! their own process groups pinned to their leased GPUs, and talks to the
//! orchestrator over one bidirectional gRPC stream.

mod attempt;
pub mod client;
pub mod code;
pub mod collect;
pub mod exec;
pub mod gpu;
pub mod health;
pub mod leftovers;
pub mod mps;
mod wire;
pub mod zygote;
