//! What the RDMA transport reports through the [`metrics`] facade, for the whole process
//! (one connection's own figures: [`crate::RdmaClient::stats`]):
//!
//! * `rdma_rpc_sent_bytes_total{path}`: frames posted by SEND (`path="send"`), and large
//!   bodies handed to the peer's RDMA WRITE (`path="write"`);
//! * `rdma_rpc_received_bytes_total`: frames received by SEND/RECV;
//! * `rdma_rpc_credit_stalls_total`: sends that found no credit or free send slot and had to
//!   wait for the peer;
//! * `rdma_rpc_connections` and `rdma_rpc_registered_bytes` (gauges): RDMA connections open,
//!   and memory registered for large bodies, against [`crate::ProcessLimits`].
//!
//! The handles are registered at first use, with the recorder installed then.

use std::sync::OnceLock;

use metrics::{Counter, Gauge};

pub(crate) struct TransportMetrics {
    pub(crate) sent_by_send: Counter,
    pub(crate) sent_by_write: Counter,
    pub(crate) received: Counter,
    pub(crate) credit_stalls: Counter,
    pub(crate) connections: Gauge,
    pub(crate) registered_bytes: Gauge,
}

/// The process's RDMA transport metrics.
pub(crate) fn rdma() -> &'static TransportMetrics {
    static METRICS: OnceLock<TransportMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        metrics::describe_counter!(
            "rdma_rpc_sent_bytes_total",
            metrics::Unit::Bytes,
            "Bytes sent over RDMA, by SEND or by the peer's RDMA WRITE of large bodies"
        );
        metrics::describe_counter!(
            "rdma_rpc_received_bytes_total",
            metrics::Unit::Bytes,
            "Bytes of frames received over RDMA SEND/RECV"
        );
        metrics::describe_counter!(
            "rdma_rpc_credit_stalls_total",
            "RDMA sends that waited for credits or send slots"
        );
        metrics::describe_gauge!("rdma_rpc_connections", "RDMA connections open");
        metrics::describe_gauge!(
            "rdma_rpc_registered_bytes",
            metrics::Unit::Bytes,
            "Memory registered for large bodies"
        );
        TransportMetrics {
            sent_by_send: metrics::counter!("rdma_rpc_sent_bytes_total", "path" => "send"),
            sent_by_write: metrics::counter!("rdma_rpc_sent_bytes_total", "path" => "write"),
            received: metrics::counter!("rdma_rpc_received_bytes_total"),
            credit_stalls: metrics::counter!("rdma_rpc_credit_stalls_total"),
            connections: metrics::gauge!("rdma_rpc_connections"),
            registered_bytes: metrics::gauge!("rdma_rpc_registered_bytes"),
        }
    })
}
