//! Activation-trace algorithms: read FastVideo-shaped JSONL stat traces, merge
//! per-rank shards, compare two implementations in execution order, and
//! compare full-tensor dumps.
//!
//! The library knows nothing of actors, gRPC or the orchestrator: it is usable
//! offline from the `fvd trace` CLI.
