//! [`Attachment`]: a connection's place in its engine.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use rpc_core::Status;

use super::{Engine, SharedCq};

/// A connection's place in an engine: its tag, its CQ and the entries it reserved there.
/// Dropped after the connection's queue pair is destroyed; gives everything back.
pub(crate) struct Attachment {
    pub(crate) engine: Arc<Engine>,
    pub(crate) tag: u32,
    pub(crate) cq: Arc<SharedCq>,
    pub(super) entries: u32,
    /// A client's rdma_cm channel, watched by the poller (-1: none).
    pub(super) cm_fd: AtomicI32,
    /// The connection's queue pair, once created.
    pub(super) qp_num: std::sync::OnceLock<u32>,
}

impl Attachment {
    /// Lets the poller watch a client connection's rdma_cm channel.
    pub(crate) fn watch_cm(&self, fd: RawFd) -> Result<(), Status> {
        self.engine.epoll.add(fd, u64::from(self.tag))?;
        self.cm_fd.store(fd, Ordering::Release);
        Ok(())
    }

    /// The connection's queue pair is `qp_num`: route its shared receive queue's receives
    /// and the device's events about it here.
    pub(crate) fn bind_qp(&self, qp_num: u32) {
        if self.qp_num.set(qp_num).is_ok() {
            self.engine.registry.bind_qp(qp_num, self.tag);
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let fd = self.cm_fd.load(Ordering::Acquire);
        if fd >= 0 {
            self.engine.epoll.remove(fd);
        }
        self.engine
            .registry
            .remove(self.tag, self.qp_num.get().copied());
        self.cq.released.fetch_add(self.entries, Ordering::AcqRel);
        if self.engine.attached.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last one: the poller leaves.
            self.engine.kick.kick();
        }
    }
}
