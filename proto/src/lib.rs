//! Generated wire types of `fvd.v1`. These types stop at the gRPC edge: the
//! orchestrator and the worker convert them into their own domain types in
//! their service handlers and never pass them further.

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

/// Package `fvd.v1`.
pub mod v1 {
    tonic::include_proto!("fvd.v1");
}
