//! What the TCP transport reports through the `metrics` facade, for the whole process: the
//! counters every transport has ([`rpc_core::observe::transport`]): bytes written to and
//! read from sockets, and sends that found a connection's output queue full and waited.

use std::sync::OnceLock;

use metrics::Counter;
use rpc_core::observe::transport;

pub(crate) struct TcpMetrics {
    pub(crate) sent: Counter,
    pub(crate) received: Counter,
    pub(crate) send_stalls: Counter,
}

/// The process's TCP transport metrics, with metrics on
/// ([`rpc_core::observe::enable_metrics`]); registered at first use then.
#[inline]
pub(crate) fn tcp() -> Option<&'static TcpMetrics> {
    rpc_core::observe::metrics_enabled().then(registered)
}

fn registered() -> &'static TcpMetrics {
    static METRICS: OnceLock<TcpMetrics> = OnceLock::new();
    METRICS.get_or_init(|| TcpMetrics {
        sent: transport::sent_bytes("tcp", "socket"),
        received: transport::received_bytes("tcp"),
        send_stalls: transport::send_stalls("tcp"),
    })
}
