//! The example microservice's front end: an HTTP API (axum) over the key-value store,
//! which it calls over rdma-rpc, balanced over one or more `kv-server`s. Health for the
//! orchestrator, Prometheus metrics (the rdma-rpc client's among them), and a graceful
//! stop on SIGTERM.
//!
//! ```text
//! kv-gateway --listen 127.0.0.1:8080 --backend tcp://127.0.0.1:50061
//! curl -X PUT --data 42 localhost:8080/kv/answer; curl localhost:8080/kv/answer
//! curl localhost:8080/healthz; curl localhost:8080/metrics
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use clap::Parser;
use metrics_exporter_prometheus::PrometheusHandle;
use rdma_rpc::health::pb::health_client::HealthClient;
use rdma_rpc::health::pb::HealthCheckRequest;
use rdma_rpc::health::ServingStatus;
use rdma_rpc::{Code, Status};
use rpc_examples::kv::store_client::StoreClient;
use rpc_examples::kv::{DeleteRequest, GetRequest, PutRequest};

#[derive(Parser, Debug)]
#[command(about = "HTTP front end of the key-value store")]
struct Args {
    /// Where to serve HTTP.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// A kv-server to call (tcp:// or rdma://); give several to balance over them.
    #[arg(long = "backend", required = true)]
    backends: Vec<String>,
    /// Time budget of each backend call, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
}

#[derive(Clone)]
struct Gateway {
    store: StoreClient,
    health: HealthClient,
    prometheus: PrometheusHandle,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    rpc_examples::init_tracing();
    let args = Args::parse();
    let prometheus = rpc_examples::prometheus();
    let channel = rdma_rpc::client()
        .timeout(Duration::from_millis(args.timeout_ms))
        .balance_list(&args.backends)?;
    let gateway = Gateway {
        store: StoreClient::new(channel.clone()),
        health: HealthClient::new(channel),
        prometheus,
    };
    let app = axum::Router::new()
        .route("/kv/{key}", get(get_key).put(put_key).delete(delete_key))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(gateway);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("kv-gateway listening on http://{}", listener.local_addr()?);
    // On SIGTERM: stop accepting, finish the requests in progress, then exit.
    axum::serve(listener, app)
        .with_graceful_shutdown(rpc_examples::shutdown_signal())
        .await?;
    println!("kv-gateway stopped");
    Ok(())
}

async fn get_key(State(gateway): State<Gateway>, Path(key): Path<String>) -> Response {
    match gateway.store.get(GetRequest { key }).await {
        Ok(reply) => (StatusCode::OK, reply.into_inner().value).into_response(),
        Err(status) => error(&status),
    }
}

async fn put_key(
    State(gateway): State<Gateway>,
    Path(key): Path<String>,
    value: Bytes,
) -> Response {
    match gateway.store.put(PutRequest { key, value }).await {
        Ok(reply) if reply.get_ref().replaced => StatusCode::OK.into_response(),
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(status) => error(&status),
    }
}

async fn delete_key(State(gateway): State<Gateway>, Path(key): Path<String>) -> Response {
    match gateway.store.delete(DeleteRequest { key }).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(status) => error(&status),
    }
}

/// Ready while a backend serves the store.
async fn healthz(State(gateway): State<Gateway>) -> Response {
    let check = HealthCheckRequest {
        service: "kv.Store".into(),
    };
    match gateway.health.check(check).await {
        Ok(reply) if reply.get_ref().status() == ServingStatus::Serving => {
            (StatusCode::OK, "SERVING\n").into_response()
        }
        Ok(reply) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{:?}\n", reply.get_ref().status()),
        )
            .into_response(),
        Err(status) => error(&status),
    }
}

async fn metrics(State(gateway): State<Gateway>) -> String {
    gateway.prometheus.render()
}

/// A backend's status as an HTTP answer.
fn error(status: &Status) -> Response {
    let code = match status.code() {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_GATEWAY,
    };
    (code, format!("{}: {}\n", status.code(), status.message())).into_response()
}
