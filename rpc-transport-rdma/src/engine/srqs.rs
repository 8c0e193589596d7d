//! The engine's shared receive queues: one per buffer size and bounds (their receives are
//! routed by `qp_num`: `Registry::route_batch`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rpc_core::Status;

use super::Engine;
use crate::config::SharedRecvConfig;
use crate::shared_recv::SharedRecv;

impl Engine {
    /// The shared receive queue for buffers of `buffer_size` bytes bounded by `config`,
    /// created if there is none yet.
    pub(crate) fn shared_recv(
        &self,
        buffer_size: u32,
        config: &SharedRecvConfig,
    ) -> Result<Arc<SharedRecv>, Status> {
        let mut srqs = self.srqs.lock();
        if let Some(srq) = srqs.iter().find(|s| s.serves(buffer_size, config)) {
            return Ok(srq.clone());
        }
        let tag = self.registry.reserve_srq().ok_or_else(|| {
            Status::resource_exhausted("this process used up its RDMA connection tags")
        })?;
        let srq = Arc::new(SharedRecv::new(
            &self.pd,
            buffer_size,
            config,
            self.max_srq_wr,
            tag,
        )?);
        self.registry.register_srq(tag, &srq);
        srqs.push(srq.clone());
        self.has_srq.store(true, Ordering::Release);
        Ok(srq)
    }
}
