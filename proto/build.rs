//! Compiles `fvd/v1/fvd.proto` with protox (pure Rust: no protoc on the
//! build machine) and generates the prost types and tonic services.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=fvd");
    let fds = protox::compile(["fvd/v1/fvd.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The worker rpc is named `Connect`, which clashes with the generated
        // `connect` constructor; clients are built from a `Channel` instead.
        .build_transport(false)
        // Small first buffers: see `src/codec.rs`.
        .codec_path("crate::codec::LeanCodec")
        .compile_fds(fds)?;
    Ok(())
}
