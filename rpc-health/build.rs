fn main() -> std::io::Result<()> {
    rpc_codegen::configure()
        // Below the facade, which re-exports this crate.
        .core_path("::rpc_core")
        .compile_protos(&["../proto/grpc/health/v1/health.proto"], &["../proto"])
}
