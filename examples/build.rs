fn main() -> std::io::Result<()> {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    rpc_codegen::configure()
        // For server reflection (`rpc_examples::FILE_DESCRIPTOR_SET`).
        .file_descriptor_set_path(out.join("examples_descriptors.bin"))
        // Bulk payloads are `Bytes`: decoded as views of the received buffer, no copy.
        .bytes([
            ".rpc.testing.BulkRequest.payload",
            ".rpc.testing.BulkReply.payload",
            ".rpc.streaming.Chunk.payload",
            ".echo",
            ".kv",
        ])
        .compile_protos(
            &[
                "../proto/echo.proto",
                "../proto/testing.proto",
                "../proto/streaming.proto",
                "../proto/kv.proto",
            ],
            &["../proto"],
        )
}
