//! Metric handles for transports, named alike for every transport (label `transport`):
//!
//! * `rdma_rpc_sent_bytes_total{transport, path}`: bytes handed to the network (`path`:
//!   how, e.g. `socket`, or RDMA `send` and `write`);
//! * `rdma_rpc_received_bytes_total{transport}`: bytes taken from it;
//! * `rdma_rpc_send_stalls_total{transport}`: sends that found no room (no RDMA credit or
//!   send slot; a full TCP output queue) and waited for the peer.
//!
//! Transports count only with metrics on ([`super::metrics_enabled`]); they register the
//! handles at first use after that and keep them: each count is then one atomic add.

use std::sync::Once;

use metrics::{Counter, Unit};

/// Bytes `transport` sends by `path`.
pub fn sent_bytes(transport: &'static str, path: &'static str) -> Counter {
    describe();
    metrics::counter!("rdma_rpc_sent_bytes_total", "transport" => transport, "path" => path)
}

/// Bytes `transport` receives.
pub fn received_bytes(transport: &'static str) -> Counter {
    describe();
    metrics::counter!("rdma_rpc_received_bytes_total", "transport" => transport)
}

/// Sends of `transport` that waited for room.
pub fn send_stalls(transport: &'static str) -> Counter {
    describe();
    metrics::counter!("rdma_rpc_send_stalls_total", "transport" => transport)
}

fn describe() {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(|| {
        metrics::describe_counter!(
            "rdma_rpc_sent_bytes_total",
            Unit::Bytes,
            "Bytes handed to the network, by transport and how"
        );
        metrics::describe_counter!(
            "rdma_rpc_received_bytes_total",
            Unit::Bytes,
            "Bytes taken from the network, by transport"
        );
        metrics::describe_counter!(
            "rdma_rpc_send_stalls_total",
            "Sends that found no room (credits, send slots, output queue) and waited"
        );
    });
}
