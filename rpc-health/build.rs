fn main() -> std::io::Result<()> {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    rpc_codegen::configure()
        // Below the facade, which re-exports this crate.
        .core_path("::rpc_core")
        .file_descriptor_set_path(out.join("health_descriptors.bin"))
        .compile_protos(&["../proto/grpc/health/v1/health.proto"], &["../proto"])
}
