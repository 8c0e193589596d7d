//! What the RDMA transport reports through the [`metrics`] facade, for the whole process
//! (one connection's own figures: [`crate::RdmaClient::stats`]): the counters every
//! transport has ([`rpc_core::observe::transport`]: bytes by SEND (`path="send"`) and by the
//! peer's RDMA WRITE of large bodies (`path="write"`), bytes received by SEND/RECV, sends
//! that waited for credits or send slots), and two gauges against [`crate::ProcessLimits`]:
//! `rdma_rpc_connections` (RDMA connections open) and `rdma_rpc_registered_bytes` (memory
//! registered for large bodies); and `rdma_rpc_large_body_bytes_total` by `path`: bytes of
//! large bodies copied into registered buffers (`copied`) or sent from the application's
//! registered memory in place (`in_place`). Counted only with metrics on; registered at
//! first use then.

use std::sync::OnceLock;

use metrics::{Counter, Gauge};
use rpc_core::observe::transport;

pub(crate) struct TransportMetrics {
    pub(crate) sent_by_send: Counter,
    pub(crate) sent_by_write: Counter,
    pub(crate) received: Counter,
    pub(crate) credit_stalls: Counter,
    pub(crate) large_copied: Counter,
    pub(crate) large_in_place: Counter,
    pub(crate) large_landed: Counter,
    pub(crate) connections: Gauge,
    pub(crate) registered_bytes: Gauge,
}

/// The process's RDMA transport metrics, with metrics on
/// ([`rpc_core::observe::enable_metrics`]).
#[inline]
pub(crate) fn rdma() -> Option<&'static TransportMetrics> {
    rpc_core::observe::metrics_enabled().then(registered)
}

fn registered() -> &'static TransportMetrics {
    static METRICS: OnceLock<TransportMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        metrics::describe_gauge!("rdma_rpc_connections", "RDMA connections open");
        metrics::describe_gauge!(
            "rdma_rpc_registered_bytes",
            metrics::Unit::Bytes,
            "Memory registered for large bodies and application buffers"
        );
        metrics::describe_counter!(
            "rdma_rpc_large_body_bytes_total",
            metrics::Unit::Bytes,
            "Bytes of large bodies sent, copied into registered buffers (copied) or from \
             application memory (in_place), and received into application memory (landed)"
        );
        TransportMetrics {
            large_copied: metrics::counter!("rdma_rpc_large_body_bytes_total", "path" => "copied"),
            large_in_place: metrics::counter!(
                "rdma_rpc_large_body_bytes_total",
                "path" => "in_place"
            ),
            large_landed: metrics::counter!(
                "rdma_rpc_large_body_bytes_total",
                "path" => "landed"
            ),
            sent_by_send: transport::sent_bytes("rdma", "send"),
            sent_by_write: transport::sent_bytes("rdma", "write"),
            received: transport::received_bytes("rdma"),
            credit_stalls: transport::send_stalls("rdma"),
            connections: metrics::gauge!("rdma_rpc_connections"),
            registered_bytes: metrics::gauge!("rdma_rpc_registered_bytes"),
        }
    })
}
