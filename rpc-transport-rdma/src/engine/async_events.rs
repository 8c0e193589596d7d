//! The device's asynchronous events: the only word that a queue pair on a shared receive
//! queue went to the error state (it has no receives of its own to flush), and of CQ, SRQ
//! and device failures.
//!
//! The event fd belongs to the device context, which every engine on the device shares (a
//! process that is client and server has two), so every engine's poller watches it and
//! whichever reads an event routes it, by `qp_num` or object, among all of them.

use std::sync::Arc;

use rpc_core::Status;

use super::{Engine, ENGINES};
use crate::verbs::{AsyncEvent, AsyncEventKind, EventSubject};

impl Engine {
    /// Reads and routes every pending asynchronous event of the engine's device.
    pub(super) fn async_events(&self) {
        loop {
            match self.context.try_get_async_event() {
                Ok(Some(event)) => self.route_event(event),
                Ok(None) => return,
                Err(e) => {
                    // The fd would stay readable and spin the poller: stop watching it.
                    // Keepalive probes still notice a queue pair in the error state.
                    tracing::error!(
                        %e,
                        "reading the device's asynchronous events failed; no longer watching them"
                    );
                    self.epoll.remove(self.context.async_fd());
                    return;
                }
            }
        }
    }

    fn route_event(&self, event: AsyncEvent) {
        let engines: Vec<Arc<Engine>> = ENGINES
            .lock()
            .iter()
            .filter(|e| e.context.is_same(&self.context))
            .cloned()
            .collect();
        let status = || Status::unavailable(format!("the RDMA device reported {event}"));
        match (event.kind, event.subject) {
            (kind, EventSubject::Qp(qp_num)) if kind.is_qp_error() => {
                let found = engines
                    .iter()
                    .find_map(|e| e.registry.qp_conn(qp_num).map(|conn| (e, conn)));
                let Some((engine, conn)) = found else {
                    tracing::debug!(%event, "asynchronous event of a queue pair that is gone");
                    return;
                };
                if !conn.is_closed() {
                    tracing::warn!(%event, peer = conn.peer(), "closing the connection");
                }
                // What completed before the error goes up before the close.
                engine.poll(conn.cq());
                conn.close(Status::unavailable(format!(
                    "connection to {} failed: the RDMA device reported {event}",
                    conn.peer()
                )));
            }
            (AsyncEventKind::CqErr, EventSubject::Cq(id)) => {
                for engine in &engines {
                    let (_, cqs) = engine.cqs();
                    for cq in cqs.iter().filter(|cq| cq.cq.id() == id) {
                        engine.fail_cq(cq, status());
                    }
                }
            }
            (AsyncEventKind::SrqErr, EventSubject::Srq(id)) => {
                tracing::error!(%event, "closing the connections on a failed shared receive queue");
                for conn in engines.iter().flat_map(|e| e.registry.live()) {
                    if conn.uses_srq(id) {
                        conn.close(status());
                    }
                }
            }
            (AsyncEventKind::DeviceFatal, _) => {
                tracing::error!(%event, "closing every connection on the device");
                for conn in engines.iter().flat_map(|e| e.registry.live()) {
                    conn.close(status());
                }
            }
            (AsyncEventKind::PortErr, _) => {
                tracing::warn!(%event, "connections on the port fail once their retries run out");
            }
            _ => tracing::debug!(%event, "asynchronous event"),
        }
    }
}
