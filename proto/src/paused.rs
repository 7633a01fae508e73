//! How a server says "reachable, but paused: it cannot record changes"
//! (its database's disk is full, read-only or failing), so that a client
//! tells it apart from an unreachable one by an enum and a key, never by
//! the message's words: `RESOURCE_EXHAUSTED` carrying the metadata key
//! [`PAUSED_KEY`]. A `RESOURCE_EXHAUSTED` without it (a message over
//! gRPC's size limit, say) is not a pause.

use tonic::{Code, Status};

/// The metadata key a pause carries; its value names the cause (`disk`).
pub const PAUSED_KEY: &str = "fvd-paused";

/// The status a server answers a change with while it cannot write.
pub fn paused(message: impl Into<String>) -> Status {
    let mut status = Status::resource_exhausted(message);
    status.metadata_mut().insert(
        PAUSED_KEY,
        tonic::metadata::MetadataValue::from_static("disk"),
    );
    status
}

/// Whether `status` is a server's pause (see the module's doc).
pub fn is_paused(status: &Status) -> bool {
    status.code() == Code::ResourceExhausted && status.metadata().contains_key(PAUSED_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_is_told_apart_from_other_exhaustion() {
        assert!(is_paused(&paused("the orchestrator cannot write")));
        assert!(!is_paused(&Status::resource_exhausted("message too large")));
        assert!(!is_paused(&Status::unavailable(
            "the orchestrator cannot write"
        )));
    }
}
