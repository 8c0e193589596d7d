//! Reliable-connected queue pair (`ibv_qp`), created on an rdma_cm id.

use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::sys::{
    bind_mw_t, ibv_mw_bind_info, ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_cap,
    ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wr_opcode,
    rdma_create_qp, rdma_destroy_qp, rdma_t,
};

use super::cm_id::{CmId, CmIdInner};
use super::cq::CompletionQueue;
use super::error::{check, Result, VerbsError};
use super::mr::{AccessFlags, MemoryRegion, StableBuffer};
use super::mw::MemoryWindow;
use super::pd::ProtectionDomain;
use super::srq::SharedReceiveQueue;
use super::wr::{RecvRequest, SendFlags, SendOp, SendRequest, Sge};

/// Queue sizes and limits of a QP (`ibv_qp_cap`). On creation the device may round them up;
/// [`QueuePair::caps`] reports what it granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCapabilities {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// Largest payload of an [`SendFlags::INLINE`] send.
    pub max_inline_data: u32,
}

impl Default for QpCapabilities {
    fn default() -> Self {
        QpCapabilities {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }
}

/// What to create a QP with.
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    pub send_cq: Arc<CompletionQueue>,
    pub recv_cq: Arc<CompletionQueue>,
    pub caps: QpCapabilities,
    /// Every send generates a completion (else only those with [`SendFlags::SIGNALED`]).
    pub sq_sig_all: bool,
    /// Receives come from this shared receive queue (the QP then has no receive queue of
    /// its own: `caps.max_recv_wr` is ignored and `post_recv` fails).
    pub srq: Option<Arc<SharedReceiveQueue>>,
}

/// An RC queue pair. Holds `Arc`s to its completion queues, protection domain and rdma_cm id,
/// so it is destroyed before all of them.
#[derive(Debug)]
pub struct QueuePair {
    raw: NonNull<ibv_qp>,
    caps: QpCapabilities,
    id: Arc<CmIdInner>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
    srq: Option<Arc<SharedReceiveQueue>>,
}

// SAFETY: posting to a QP is thread-safe (providers lock each queue); destruction goes through
// the id's lock; the handle is immutable after creation.
unsafe impl Send for QueuePair {}
// SAFETY: see `Send`.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates an RC QP on `id` (which must be bound to the device of `pd` and the CQs: after
    /// `resolve_route`, or an id from a connect request). One QP per id.
    pub fn new(id: &CmId, pd: &Arc<ProtectionDomain>, attr: QpInitAttr) -> Result<QueuePair> {
        let device = pd.context().as_ptr();
        if attr.send_cq.context().as_ptr() != device || attr.recv_cq.context().as_ptr() != device {
            return Err(VerbsError::invalid(
                "rdma_create_qp",
                "the completion queues belong to another device than the protection domain",
            ));
        }
        if let Some(srq) = &attr.srq {
            if srq.pd().as_ptr() != pd.as_ptr() {
                return Err(VerbsError::invalid(
                    "rdma_create_qp",
                    "the shared receive queue belongs to another protection domain",
                ));
            }
        }
        let shared = attr.srq.is_some();
        let cap = ibv_qp_cap {
            max_send_wr: attr.caps.max_send_wr,
            max_recv_wr: if shared { 0 } else { attr.caps.max_recv_wr },
            max_send_sge: attr.caps.max_send_sge,
            max_recv_sge: attr.caps.max_recv_sge,
            max_inline_data: attr.caps.max_inline_data,
        };
        let mut init = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: attr.send_cq.as_ptr(),
            recv_cq: attr.recv_cq.as_ptr(),
            srq: attr.srq.as_ref().map_or(ptr::null_mut(), |s| s.as_ptr()),
            cap,
            qp_type: ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: c_int::from(attr.sq_sig_all),
        };
        let inner = Arc::clone(id.inner());
        let qp = inner.locked(|raw_id| {
            // SAFETY: the id is alive and locked.
            let (verbs, existing) = unsafe { ((*raw_id).verbs, (*raw_id).qp) };
            if verbs.is_null() || verbs != device {
                return Err(VerbsError::invalid(
                    "rdma_create_qp",
                    "the id is not bound to the protection domain's device (resolve the route first)",
                ));
            }
            if !existing.is_null() {
                return Err(VerbsError::invalid(
                    "rdma_create_qp",
                    "the id already has a QP",
                ));
            }
            // SAFETY: the id is alive and locked; PD and CQs are alive and on the id's device;
            // `init` is valid and receives the granted capabilities.
            check("rdma_create_qp", unsafe {
                rdma_create_qp(raw_id, pd.as_ptr(), &mut init)
            })?;
            // SAFETY: on success librdmacm stored the new QP in the (still locked) id.
            Ok(unsafe { (*raw_id).qp })
        })?;
        let raw = NonNull::new(qp).ok_or_else(|| VerbsError::last_os("rdma_create_qp"))?;
        let caps = QpCapabilities {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        Ok(QueuePair {
            raw,
            caps,
            id: inner,
            send_cq: attr.send_cq,
            recv_cq: attr.recv_cq,
            pd: Arc::clone(pd),
            srq: attr.srq,
        })
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is alive; `qp_num` is immutable.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    /// The capabilities the device granted.
    pub fn caps(&self) -> QpCapabilities {
        self.caps
    }

    /// Largest payload of an inline send.
    pub fn max_inline_data(&self) -> u32 {
        self.caps.max_inline_data
    }

    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The shared receive queue the QP receives from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    /// Posts one send-queue work request.
    ///
    /// # Safety
    /// Unless the request is [`SendFlags::INLINE`] (then the data is copied during the call),
    /// the memory each SGE names must stay valid and registered — keep its `MemoryRegion`
    /// alive — until the request's completion has been polled or the QP destroyed. Until then
    /// the memory must not be written (SEND/WRITE sources) or accessed at all (RDMA READ
    /// destinations, which the device writes). SGEs made with `MemoryRegion::sge` are
    /// in bounds by construction.
    pub unsafe fn post_send(&self, wr: &SendRequest<'_>) -> Result<()> {
        let mut raw = build_send_wr(wr)?;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive; `raw` and the SGE array it points to are valid for the
        // call; the memory contract is the caller's.
        let ret = unsafe { ibv_post_send(self.raw.as_ptr(), &mut raw, &mut bad) };
        post_result("ibv_post_send", ret, 0)
    }

    /// Posts several send requests with one doorbell. On error, `VerbsError::Post` says how
    /// many were posted before the failing one.
    ///
    /// # Safety
    /// As for [`QueuePair::post_send`], for every request.
    pub unsafe fn post_send_list(&self, wrs: &[SendRequest<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut raws = wrs.iter().map(build_send_wr).collect::<Result<Vec<_>>>()?;
        let base = raws.as_mut_ptr();
        for i in 1..raws.len() {
            // SAFETY: `i` and `i - 1` are in bounds of `raws`, which is not resized after this.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive; the chained requests and their SGEs are valid for the call.
        let ret = unsafe { ibv_post_send(self.raw.as_ptr(), base, &mut bad) };
        post_result("ibv_post_send", ret, posted_before(base, bad))
    }

    /// Sends `data` inline (copied during the call, so this is safe): a SEND, SEND with
    /// immediate, or RDMA WRITE (with immediate) of at most [`QueuePair::max_inline_data`]
    /// bytes. `SIGNALED`/`SOLICITED`/`FENCE` flags may be added.
    pub fn post_send_inline(
        &self,
        wr_id: u64,
        data: &[u8],
        op: SendOp,
        flags: SendFlags,
    ) -> Result<()> {
        if matches!(op, SendOp::RdmaRead(_)) {
            return Err(VerbsError::invalid(
                "ibv_post_send",
                "RDMA READ cannot be inline",
            ));
        }
        if data.len() > self.caps.max_inline_data as usize {
            return Err(VerbsError::invalid(
                "ibv_post_send",
                format!(
                    "{} bytes exceed max_inline_data ({})",
                    data.len(),
                    self.caps.max_inline_data
                ),
            ));
        }
        let length = u32::try_from(data.len())
            .map_err(|_| VerbsError::invalid("ibv_post_send", "too long"))?;
        let sge = [Sge::new(data.as_ptr() as u64, length, 0)];
        let sges: &[Sge] = if data.is_empty() { &[] } else { &sge };
        let wr = SendRequest {
            wr_id,
            sges,
            op,
            flags: flags | SendFlags::INLINE,
        };
        // SAFETY: with IBV_SEND_INLINE the provider copies `data` before returning, so no
        // memory is referenced after the call; `data` is valid for the call.
        unsafe { self.post_send(&wr) }
    }

    /// Binds `window` to bytes `range` of `region` with `access` (remote rights, e.g.
    /// `REMOTE_WRITE`), under a fresh rkey ([`MemoryWindow::next_rkey`]), which is returned.
    /// The bind is a send-queue work request: work requests posted after it on this queue
    /// pair run after it, so a frame that carries the new rkey to the peer can follow at once.
    ///
    /// # Safety
    /// From the post until an invalidation of the returned rkey has completed (or the QP is
    /// destroyed), the peer may write the range at any time: `region` must stay registered,
    /// and its bytes there must not be read as settled data before the protocol says the
    /// peer is done.
    pub unsafe fn post_bind_window<B: StableBuffer>(
        &self,
        wr_id: u64,
        window: &mut MemoryWindow,
        region: &MemoryRegion<B>,
        range: std::ops::Range<usize>,
        access: AccessFlags,
        flags: SendFlags,
    ) -> Result<u32> {
        if range.start > range.end || range.end > region.len() || range.is_empty() {
            return Err(VerbsError::invalid(
                "ibv_post_send(BIND_MW)",
                format!(
                    "range {range:?} outside the region of {} bytes",
                    region.len()
                ),
            ));
        }
        let rkey = window.next_rkey();
        let mut raw = empty_send_wr(wr_id, flags);
        raw.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        raw.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: window.as_ptr(),
            rkey,
            bind_info: ibv_mw_bind_info {
                mr: region.as_raw(),
                addr: region.addr() + range.start as u64,
                length: (range.end - range.start) as u64,
                mw_access_flags: access.bits(),
            },
        };
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP, window and region are alive for the call; the range is inside the
        // region (checked above); what the peer may do afterwards is the caller's contract.
        let ret = unsafe { ibv_post_send(self.raw.as_ptr(), &mut raw, &mut bad) };
        post_result("ibv_post_send(BIND_MW)", ret, 0)?;
        window.set_rkey(rkey);
        Ok(rkey)
    }

    /// Invalidates `rkey` (of a memory window bound on this queue pair). Once its completion
    /// is polled, no peer operation with that rkey can reach memory any more; one that tries
    /// fails with a remote access error. Safe: it only ever takes access away.
    pub fn post_local_invalidate(&self, wr_id: u64, rkey: u32, flags: SendFlags) -> Result<()> {
        let mut raw = empty_send_wr(wr_id, flags);
        raw.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
        raw.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive; the request names no memory.
        let ret = unsafe { ibv_post_send(self.raw.as_ptr(), &mut raw, &mut bad) };
        post_result("ibv_post_send(LOCAL_INV)", ret, 0)
    }

    /// Posts a zero-length RDMA WRITE (signaled): a liveness probe. It names no memory on
    /// either side (a zero-length RDMA operation checks no rkey, IBTA C9-88) and consumes no
    /// receive at the peer, but completes only once the peer's queue pair acknowledged it:
    /// it fails with a flush if this queue pair is in the error state, and with
    /// retry-exceeded if the peer's no longer answers.
    pub fn post_probe(&self, wr_id: u64) -> Result<()> {
        let mut raw = empty_send_wr(wr_id, SendFlags::SIGNALED);
        raw.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive; the request names no memory (no SGE, remote address 0,
        // rkey 0, length 0).
        let ret = unsafe { ibv_post_send(self.raw.as_ptr(), &mut raw, &mut bad) };
        post_result("ibv_post_send(probe)", ret, 0)
    }

    /// Posts one receive.
    ///
    /// # Safety
    /// The memory the SGEs name must stay valid and registered (with `LOCAL_WRITE`) and must
    /// not be accessed until the receive's completion has been polled or the QP destroyed:
    /// the device writes into it at any time.
    pub unsafe fn post_recv(&self, wr: &RecvRequest<'_>) -> Result<()> {
        let mut raw = build_recv_wr(wr)?;
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is alive; `raw` and its SGEs are valid for the call; the memory
        // contract is the caller's.
        let ret = unsafe { ibv_post_recv(self.raw.as_ptr(), &mut raw, &mut bad) };
        post_result("ibv_post_recv", ret, 0)
    }

    /// Posts several receives at once.
    ///
    /// # Safety
    /// As for [`QueuePair::post_recv`], for every request.
    pub unsafe fn post_recv_list(&self, wrs: &[RecvRequest<'_>]) -> Result<()> {
        post_recv_chain("ibv_post_recv", wrs, |first, bad| {
            // SAFETY: the QP is alive; the chained requests and their SGEs are valid for the
            // call; the memory contract is the caller's.
            unsafe { ibv_post_recv(self.raw.as_ptr(), first, bad) }
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.id.locked(|raw_id| {
            // SAFETY: the id is alive (we hold an Arc) and locked; its `qp` is ours, created
            // in `new`, and is destroyed once. The CQs and PD are still alive (fields drop
            // later).
            unsafe { rdma_destroy_qp(raw_id) }
        });
    }
}

/// A send work request with no SGEs, opcode 0 and everything else zeroed.
fn empty_send_wr(wr_id: u64, flags: SendFlags) -> ibv_send_wr {
    // SAFETY: `ibv_send_wr` is plain old data (integers, pointers, unions of those); all-zero
    // is valid (NULL pointers, zero opcode and flags).
    let mut raw: ibv_send_wr = unsafe { std::mem::zeroed() };
    raw.wr_id = wr_id;
    raw.send_flags = flags.bits();
    raw
}

fn build_send_wr(wr: &SendRequest<'_>) -> Result<ibv_send_wr> {
    let num_sge = c_int::try_from(wr.sges.len())
        .map_err(|_| VerbsError::invalid("ibv_post_send", "too many SGEs"))?;
    // SAFETY: `ibv_send_wr` is plain old data (integers, pointers, unions of those); all-zero
    // is valid (NULL pointers, zero opcode and flags).
    let mut raw: ibv_send_wr = unsafe { std::mem::zeroed() };
    raw.wr_id = wr.wr_id;
    raw.sg_list = wr.sges.as_ptr().cast::<ibv_sge>().cast_mut();
    raw.num_sge = num_sge;
    raw.send_flags = wr.flags.bits();
    let (opcode, imm, remote) = match wr.op {
        SendOp::Send => (ibv_wr_opcode::IBV_WR_SEND, None, None),
        SendOp::SendWithImm(imm) => (ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, Some(imm), None),
        SendOp::RdmaWrite(r) => (ibv_wr_opcode::IBV_WR_RDMA_WRITE, None, Some(r)),
        SendOp::RdmaWriteWithImm(r, imm) => (
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            Some(imm),
            Some(r),
        ),
        SendOp::RdmaRead(r) => {
            if wr.flags.contains(SendFlags::INLINE) {
                return Err(VerbsError::invalid(
                    "ibv_post_send",
                    "RDMA READ cannot be inline",
                ));
            }
            (ibv_wr_opcode::IBV_WR_RDMA_READ, None, Some(r))
        }
    };
    raw.opcode = opcode;
    if let Some(imm) = imm {
        raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
    }
    if let Some(r) = remote {
        raw.wr.rdma = rdma_t {
            remote_addr: r.addr,
            rkey: r.rkey,
        };
    }
    Ok(raw)
}

/// Builds `wrs` as one chain (each `next` points at the following request) and hands its
/// head to `post` (`ibv_post_recv` or `ibv_post_srq_recv`); on error, says how many were
/// posted before the failing one.
pub(crate) fn post_recv_chain(
    verb: &'static str,
    wrs: &[RecvRequest<'_>],
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
) -> Result<()> {
    let mut one;
    let mut many;
    let raws: &mut [ibv_recv_wr] = match wrs {
        [] => return Ok(()),
        // The common re-post of one buffer: no allocation.
        [wr] => {
            one = [build_recv_wr(wr)?];
            &mut one
        }
        _ => {
            many = wrs.iter().map(build_recv_wr).collect::<Result<Vec<_>>>()?;
            &mut many
        }
    };
    let base = raws.as_mut_ptr();
    for i in 1..raws.len() {
        // SAFETY: `i` and `i - 1` are in bounds of `raws`, which is not resized after this.
        unsafe { (*base.add(i - 1)).next = base.add(i) };
    }
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    let ret = post(base, &mut bad);
    post_result(verb, ret, posted_before(base, bad))
}

fn build_recv_wr(wr: &RecvRequest<'_>) -> Result<ibv_recv_wr> {
    let num_sge = c_int::try_from(wr.sges.len())
        .map_err(|_| VerbsError::invalid("ibv_post_recv", "too many SGEs"))?;
    Ok(ibv_recv_wr {
        wr_id: wr.wr_id,
        next: ptr::null_mut(),
        sg_list: wr.sges.as_ptr().cast::<ibv_sge>().cast_mut(),
        num_sge,
    })
}

/// How many chained requests precede `bad` (all of them were posted).
fn posted_before<T>(base: *mut T, bad: *mut T) -> usize {
    if bad.is_null() {
        return 0;
    }
    (bad as usize).saturating_sub(base as usize) / std::mem::size_of::<T>().max(1)
}

fn post_result(verb: &'static str, ret: c_int, posted: usize) -> Result<()> {
    match check(verb, ret) {
        Ok(()) => Ok(()),
        Err(e) => Err(VerbsError::Post {
            verb,
            errno: e.errno().unwrap_or(libc::EIO),
            posted,
        }),
    }
}
