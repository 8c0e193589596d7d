//! Serves the echo service on a URL until Ctrl-C or SIGTERM.
//!
//! ```text
//! echo-server tcp://0.0.0.0:50051
//! echo-server rdma://192.168.77.1:7471
//! ```

use clap::Parser;
use rdma_rpc::prelude::*;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::EchoService;

#[derive(Parser, Debug)]
#[command(about = "Serve the echo service")]
struct Args {
    /// Where to listen: tcp://host:port or rdma://host:port.
    #[arg(default_value = "tcp://127.0.0.1:50051")]
    url: String,
}

#[tokio::main]
async fn main() -> Result<(), rdma_rpc::Error> {
    rpc_examples::init_tracing();
    let args = Args::parse();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .start(&args.url)?;
    println!("echo-server listening on {}", server.local_url());
    rpc_examples::shutdown_signal().await;
    println!("shutting down");
    server.shutdown(std::time::Duration::from_secs(5)).await;
    Ok(())
}
