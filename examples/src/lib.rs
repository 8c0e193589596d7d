//! Services shared by the demo binaries, the integration tests and the benchmarks.
//!
//! * [`echo`]: generated from `proto/echo.proto`; [`EchoService`] implements it.
//! * [`testing`] (package `rpc.testing`): generated from `proto/testing.proto`; [`Tester`] sleeps or fails on
//!   request and counts what happened, so tests can observe the server.
//! * [`streaming`] (package `rpc.streaming`): generated from `proto/streaming.proto`;
//!   [`Streamer`] produces, consumes and echoes streams.
//! * [`kv`]: generated from `proto/kv.proto`; [`KvStore`] implements it, the backend of the
//!   example microservice (`kv-server`, behind the HTTP gateway `kv-gateway`).
//! * [`blob`]: a large buffer to a server and back, uncopied (`blob-transfer`).
//! * [`init_tracing`], [`shutdown_signal`] and [`prometheus`]: what the example binaries
//!   share.

pub mod echo {
    //! Generated from `proto/echo.proto`.
    rdma_rpc::include_proto!("echo");
}

pub mod kv {
    //! Generated from `proto/kv.proto`.
    rdma_rpc::include_proto!("kv");
}

pub mod rpc {
    //! Protobuf package `rpc`.
    pub mod testing {
        //! Generated from `proto/testing.proto` (package `rpc.testing`).
        rdma_rpc::include_proto!("rpc.testing");
    }
    pub mod streaming {
        //! Generated from `proto/streaming.proto` (package `rpc.streaming`).
        rdma_rpc::include_proto!("rpc.streaming");
    }
}

pub use rpc::{streaming, testing};

/// The encoded `FileDescriptorSet` of every `.proto` file above and their imports, for
/// server reflection (`rdma_rpc::reflection`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/examples_descriptors.bin"));

pub mod blob;
mod kv_store;
mod services;
mod streamer;

pub use kv_store::{KvLimits, KvStore};
pub use services::{
    asked, bulk_pattern, EchoService, Tester, TesterStats, HEADER_PREFIX, TRAILER_PREFIX,
};
pub use streamer::{ChunkStream, Streamer, StreamerStats, FAIL_WITH, STOP_AFTER};

/// Logs to stderr, filtered by `RUST_LOG` (as the example binaries do).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
}

/// Ctrl-C or SIGTERM (what service managers and container runtimes send).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            eprintln!("cannot watch SIGTERM ({e}); Ctrl-C still works");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Installs the Prometheus recorder, turns rdma-rpc's metrics on
/// ([`rdma_rpc::observe::enable_metrics`]) and returns the handle that renders them as
/// Prometheus text.
///
/// # Panics
///
/// If a recorder is installed already.
pub fn prometheus() -> metrics_exporter_prometheus::PrometheusHandle {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("no metrics recorder installed before");
    rdma_rpc::observe::enable_metrics();
    handle
}
