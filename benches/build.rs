//! Compiles `proto/echo.proto` with tonic-prost-build for the tonic baseline of
//! `rpc-bench tcp-compare`. protox parses the file, so no `protoc` is needed.

fn main() -> std::io::Result<()> {
    let proto_dir = "../proto";
    let proto = "../proto/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], [proto_dir]).map_err(std::io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // As in rdma-rpc's own build: the comparison decodes payloads the same way.
        .bytes(".echo")
        .compile_fds(fds)
}
