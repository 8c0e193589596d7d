fn main() -> std::io::Result<()> {
    rpc_codegen::configure()
        .compile_protos(&["../proto/grpc/health/v1/health.proto"], &["../proto"])
}
