//! Shared receive queue (`ibv_srq`): one pool of posted receives for many queue pairs.

use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::sys::{
    ibv_create_srq, ibv_destroy_srq, ibv_modify_srq, ibv_post_srq_recv, ibv_srq, ibv_srq_attr,
    ibv_srq_attr_mask, ibv_srq_init_attr,
};

use super::error::{check, Result, VerbsError};
use super::pd::ProtectionDomain;
use super::qp::post_recv_chain;
use super::wr::RecvRequest;

/// A shared receive queue. Queue pairs created on it ([`super::QpInitAttr::srq`]) hold an
/// `Arc`, so it is destroyed after them; it holds an `Arc` to its protection domain. A
/// receive completion of an SRQ names the QP that received (`qp_num`), not the receive's
/// owner: route by it.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    raw: NonNull<ibv_srq>,
    max_wr: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: posting to an SRQ is thread-safe (providers lock it); the handle is immutable
// after creation.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: see `Send`.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// Creates an SRQ on `pd` holding at least `max_wr` receives of at most `max_sge`
    /// entries each.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<SharedReceiveQueue>> {
        let mut init = ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is alive (we hold an Arc); `init` is valid and receives the granted
        // sizes.
        let raw = unsafe { ibv_create_srq(pd.as_ptr(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last_os("ibv_create_srq"))?;
        Ok(Arc::new(SharedReceiveQueue {
            raw,
            max_wr: init.attr.max_wr,
            pd: Arc::clone(pd),
        }))
    }

    /// Receives the queue can hold (at least what was asked for).
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Posts several receives at once. On error, `VerbsError::Post` says how many were
    /// posted before the failing one.
    ///
    /// # Safety
    /// The memory each SGE names must stay valid and registered, and must not be accessed,
    /// until the receive's completion has been polled or the SRQ and every QP on it are
    /// destroyed: the device writes it whenever a SEND for any of those QPs arrives.
    pub unsafe fn post_recv_list(&self, wrs: &[RecvRequest<'_>]) -> Result<()> {
        post_recv_chain("ibv_post_srq_recv", wrs, |first, bad| {
            // SAFETY: the SRQ is alive; the chained requests and their SGEs are valid for the
            // call; the memory contract is the caller's.
            unsafe { ibv_post_srq_recv(self.raw.as_ptr(), first, bad) }
        })
    }

    /// Arms the queue's limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): once fewer than
    /// `limit` receives are posted, the device raises one `IBV_EVENT_SRQ_LIMIT_REACHED`
    /// asynchronous event ([`super::Context::get_async_event`]) and disarms it.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut attr = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        let mask = ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as std::os::raw::c_int;
        // SAFETY: the SRQ is alive and `attr` is valid for the call; only `srq_limit` is read.
        check("ibv_modify_srq", unsafe {
            ibv_modify_srq(self.raw.as_ptr(), &mut attr, mask)
        })
    }

    /// What names this SRQ in an [`super::EventSubject::Srq`].
    pub fn id(&self) -> usize {
        self.raw.as_ptr() as usize
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_srq {
        self.raw.as_ptr()
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: QPs on this SRQ hold Arcs to it, so none is left; the PD is alive (field).
        let ret = unsafe { ibv_destroy_srq(self.raw.as_ptr()) };
        if let Err(e) = check("ibv_destroy_srq", ret) {
            tracing::warn!(error = %e, "destroying a shared receive queue failed");
        }
    }
}
