//! The codec of every fvd service: prost's, with a first buffer of 1 KiB
//! each way instead of tonic's 8 KiB.
//!
//! A worker's `Connect` stream keeps one decode and one encode buffer for
//! as long as the worker is connected, and tonic allocates both at their
//! first size when the stream opens: at 10,000 workers the default sizes
//! alone held 160 MB of the orchestrator. The messages on that stream are
//! small (a heartbeat is a few bytes, an assignment a few hundred); a
//! buffer grows for the few large ones (a code pack's chunks, a result
//! with collected files).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// First size of a call's encode and decode buffers.
pub const FIRST_BUFFER_BYTES: usize = 1024;

/// How much a call encodes before it yields (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`FIRST_BUFFER_BYTES`] buffers; named by the
/// generated services (`codec_path` in `build.rs`).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(FIRST_BUFFER_BYTES, YIELD_THRESHOLD)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codec::{Decoder, Encoder};

    #[test]
    fn both_directions_start_small() {
        let mut c = LeanCodec::<crate::v1::WorkerMsg, crate::v1::OrchestratorMsg>::default();
        // tonic keeps the fields private; its Debug shows them.
        let first = format!("buffer_size: {FIRST_BUFFER_BYTES},");
        assert!(format!("{:?}", c.encoder().buffer_settings()).contains(&first));
        assert!(format!("{:?}", c.decoder().buffer_settings()).contains(&first));
    }
}
