//! Compiles `proto/echo.proto` and `proto/streaming.proto` with tonic-prost-build for the
//! tonic baselines of `rpc-bench tcp-compare` and `rpc-bench stream`. protox parses the
//! files, so no `protoc` is needed.

fn main() -> std::io::Result<()> {
    let proto_dir = "../proto";
    let protos = ["../proto/echo.proto", "../proto/streaming.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, [proto_dir]).map_err(std::io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // As in rdma-rpc's own build: the comparison decodes payloads the same way.
        .bytes(".echo")
        .bytes(".rpc.streaming.Chunk.payload")
        .compile_fds(fds)
}
