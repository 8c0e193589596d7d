fn main() -> std::io::Result<()> {
    rpc_codegen::configure().compile_protos(
        &["../proto/echo.proto", "../proto/testing.proto"],
        &["../proto"],
    )
}
