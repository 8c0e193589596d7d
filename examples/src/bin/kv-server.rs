//! The example microservice's backend: the key-value store over rdma-rpc, with the gRPC
//! health service and Prometheus metrics, until SIGTERM (then NOT_SERVING, and a graceful
//! shutdown: running calls finish within the grace period).
//!
//! ```text
//! kv-server --listen tcp://127.0.0.1:50061 --metrics 127.0.0.1:9101
//! kv-server --listen rdma://192.168.77.1:7471
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use clap::Parser;
use rdma_rpc::prelude::*;
use rpc_examples::kv::store_server::StoreServer;
use rpc_examples::{KvLimits, KvStore};

#[derive(Parser, Debug)]
#[command(about = "Serve the key-value store")]
struct Args {
    /// Where to serve it: tcp://host:port or rdma://host:port.
    #[arg(long, default_value = "tcp://127.0.0.1:50061")]
    listen: String,
    /// Where to serve Prometheus metrics over HTTP (`/metrics`); none if not given.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Keys the store holds at most.
    #[arg(long, default_value_t = KvLimits::default().max_keys)]
    max_keys: usize,
    /// How long running calls may take to finish after SIGTERM, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    grace_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_examples::init_tracing();
    let args = Args::parse();
    let prometheus = rpc_examples::prometheus();
    let (reporter, health) = rdma_rpc::health::health_reporter();
    let store = KvStore::new(KvLimits {
        max_keys: args.max_keys,
        ..KvLimits::default()
    });
    let server = Server::builder()
        .add_service(health)
        .add_service(StoreServer::new(store))
        .start(&args.listen)?;
    reporter.set_serving::<StoreServer<KvStore>>();
    println!("kv-server listening on {}", server.local_url());
    if let Some(addr) = args.metrics {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        println!(
            "kv-server metrics on http://{}/metrics",
            listener.local_addr()?
        );
        let app =
            axum::Router::new().route("/metrics", get(move || async move { prometheus.render() }));
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    rpc_examples::shutdown_signal().await;
    println!("kv-server shutting down");
    // Probes see it going first; running calls finish; new ones are refused.
    reporter.set_not_serving::<StoreServer<KvStore>>();
    server.shutdown(Duration::from_millis(args.grace_ms)).await;
    println!("kv-server stopped");
    Ok(())
}
