fn main() -> std::io::Result<()> {
    rpc_codegen::configure()
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
