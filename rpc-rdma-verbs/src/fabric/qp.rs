//! Queue pairs and shared receive queues: their receive queues, error state and peer, and
//! the post calls (the work itself is in [`super::work`]).

use std::collections::VecDeque;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rdma_sys::{
    ibv_event_type, ibv_pd, ibv_qp, ibv_qp_init_attr, ibv_qp_state, ibv_recv_wr, ibv_send_wr,
    ibv_sge, ibv_srq, ibv_srq_attr, ibv_srq_attr_mask, ibv_srq_init_attr, ibv_wc, ibv_wc_opcode,
    ibv_wc_status, rdma_cm_id,
};

use super::cq::{shared as cq_shared, CqShared};
use super::device::{device, MAX_INLINE, MAX_QUEUE, MAX_SGE};
use super::{boxed_at, cm, fail, work};

/// A queue pair: the C struct first, so a `*mut ibv_qp` is a `*mut Qp`.
#[repr(C)]
struct Qp {
    raw: ibv_qp,
    shared: Arc<QpShared>,
}

/// A posted receive: where its bytes go.
pub(super) struct Recv {
    pub(super) wr_id: u64,
    pub(super) sges: Vec<ibv_sge>,
}

impl std::fmt::Debug for Recv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recv")
            .field("wr_id", &self.wr_id)
            .field("sges", &self.sges.len())
            .finish()
    }
}

/// A queue pair's state, shared with its peer (which delivers into it) and its rdma_cm id.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub(super) qp_num: u32,
    pub(super) pd: usize,
    pub(super) send_cq: Arc<CqShared>,
    pub(super) recv_cq: Arc<CqShared>,
    srq: Option<Arc<SrqShared>>,
    pub(super) sq_sig_all: bool,
    /// The connection's `rnr_retry_count` (7: retry without end).
    rnr_retry: AtomicU8,
    /// Sends waiting for receives at the peer.
    pub(super) waiting: Mutex<work::Waiting>,
    max_recv_wr: usize,
    max_sge: usize,
    state: Mutex<QpState>,
}

#[derive(Debug, Default)]
struct QpState {
    peer: Weak<QpShared>,
    error: bool,
    recvs: VecDeque<Recv>,
}

/// Why a receive could not be taken.
pub(super) enum NoRecv {
    /// The queue pair is in the error state.
    Error,
    /// Nothing is posted: receiver not ready.
    Empty,
}

impl QpShared {
    /// Pairs two queue pairs: each delivers into the other.
    pub(crate) fn connect(a: &Arc<QpShared>, b: &Arc<QpShared>) {
        a.state.lock().peer = Arc::downgrade(b);
        b.state.lock().peer = Arc::downgrade(a);
    }

    /// Sets the connection's receiver-not-ready retry count (rdma_cm's connect parameter).
    pub(crate) fn set_rnr_retry(&self, count: u8) {
        self.rnr_retry.store(count, Ordering::Relaxed);
    }

    pub(super) fn rnr_retry(&self) -> u8 {
        self.rnr_retry.load(Ordering::Relaxed)
    }

    /// The connected peer, unless this queue pair is in the error state or unconnected.
    pub(super) fn peer(&self) -> Option<Arc<QpShared>> {
        let state = self.state.lock();
        if state.error {
            None
        } else {
            state.peer.upgrade()
        }
    }

    pub(super) fn in_error(&self) -> bool {
        self.state.lock().error
    }

    /// Moves to the error state: unpairs, and flushes every posted receive and every send
    /// waiting for one.
    pub(crate) fn fail(&self) {
        let flushed = {
            let mut state = self.state.lock();
            state.error = true;
            state.peer = Weak::new();
            std::mem::take(&mut state.recvs)
        };
        let flush = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        for recv in flushed {
            self.recv_cq
                .push(completion(recv.wr_id, self.qp_num, flush));
        }
        let waiting = self.waiting.lock().flush();
        for transfer in waiting {
            let mut wc = completion(transfer.wr_id(), self.qp_num, flush);
            wc.opcode = transfer.opcode();
            self.send_cq.push(wc);
        }
    }

    /// A receive was posted here: the peer may send what waits for one.
    fn received(&self) {
        let peer = self.state.lock().peer.upgrade();
        if let Some(peer) = peer {
            work::retry_waiting(&peer);
        }
    }

    /// The next posted receive, from the shared receive queue if the queue pair has one.
    pub(super) fn take_recv(&self) -> Result<Recv, NoRecv> {
        if self.in_error() {
            return Err(NoRecv::Error);
        }
        let taken = match &self.srq {
            Some(srq) => srq.take(),
            None => self.state.lock().recvs.pop_front(),
        };
        taken.ok_or(NoRecv::Empty)
    }
}

/// A completion with status `status` for `wr_id` on queue pair `qp_num`, the rest zero.
pub(super) fn completion(wr_id: u64, qp_num: u32, status: ibv_wc_status::Type) -> ibv_wc {
    // SAFETY: `ibv_wc` is plain old data; all-zero is valid.
    let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
    wc.wr_id = wr_id;
    wc.status = status;
    wc.qp_num = qp_num;
    wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
    wc
}

/// A shared receive queue: the C struct first, so a `*mut ibv_srq` is a `*mut Srq`.
#[repr(C)]
struct Srq {
    raw: ibv_srq,
    shared: Arc<SrqShared>,
}

#[derive(Debug)]
pub(super) struct SrqShared {
    /// The queue pairs that receive from it (whose peers may wait for its receives).
    attached: Mutex<Vec<Weak<QpShared>>>,
    max_wr: usize,
    max_sge: usize,
    element: usize,
    state: Mutex<SrqState>,
}

#[derive(Debug, Default)]
struct SrqState {
    recvs: VecDeque<Recv>,
    /// Armed limit: below it, one `SRQ_LIMIT_REACHED` event, and the limit disarms.
    limit: usize,
}

impl SrqShared {
    fn take(&self) -> Option<Recv> {
        let (recv, fire) = {
            let mut state = self.state.lock();
            let recv = state.recvs.pop_front();
            let fire = state.limit > 0 && state.recvs.len() < state.limit;
            if fire {
                state.limit = 0;
            }
            (recv, fire)
        };
        if fire {
            device().raise(ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED, self.element);
        }
        recv
    }
}

static NEXT_QP_NUM: AtomicU32 = AtomicU32::new(0x100);

#[inline(never)]
pub unsafe fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: `attr` is valid for the call (the caller's contract).
    let attr = unsafe { &mut *attr };
    let cap = &mut attr.cap;
    if cap.max_send_wr > MAX_QUEUE
        || cap.max_recv_wr > MAX_QUEUE
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data > MAX_INLINE
    {
        return fail(libc::EINVAL, -1);
    }
    cap.max_inline_data = MAX_INLINE;
    // SAFETY: the CQs and the SRQ are live fabric objects (the caller's contract).
    let (send_cq, recv_cq) = unsafe { (cq_shared(attr.send_cq), cq_shared(attr.recv_cq)) };
    let srq = (!attr.srq.is_null())
        // SAFETY: as above.
        .then(|| Arc::clone(unsafe { &(*attr.srq.cast::<Srq>()).shared }));
    let shared = Arc::new(QpShared {
        qp_num: NEXT_QP_NUM.fetch_add(1, Ordering::Relaxed),
        pd: pd as usize,
        send_cq,
        recv_cq,
        srq,
        sq_sig_all: attr.sq_sig_all != 0,
        rnr_retry: AtomicU8::new(work::RNR_RETRY_FOREVER),
        waiting: Mutex::default(),
        max_recv_wr: cap.max_recv_wr as usize,
        max_sge: cap.max_recv_sge as usize,
        state: Mutex::default(),
    });
    // SAFETY: `ibv_qp` is plain old data; all-zero is valid.
    let mut raw: ibv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: `pd` is live (the caller's contract).
    raw.context = unsafe { (*pd).context };
    raw.pd = pd;
    raw.send_cq = attr.send_cq;
    raw.recv_cq = attr.recv_cq;
    raw.srq = attr.srq;
    raw.qp_num = shared.qp_num;
    raw.qp_type = attr.qp_type;
    raw.state = ibv_qp_state::IBV_QPS_RTS;
    if let Some(srq) = &shared.srq {
        let mut attached = srq.attached.lock();
        attached.retain(|qp| qp.strong_count() > 0);
        attached.push(Arc::downgrade(&shared));
    }
    cm::attach_qp(id, &shared);
    let qp = Box::into_raw(Box::new(Qp { raw, shared }));
    // SAFETY: `id` is live and locked by the caller.
    unsafe { (*id).qp = qp.cast() };
    0
}

#[inline(never)]
pub unsafe fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: `id` is live and locked by the caller; its `qp` is ours or null.
    let qp = unsafe { std::mem::replace(&mut (*id).qp, ptr::null_mut()) };
    if qp.is_null() {
        return;
    }
    cm::detach_qp(id);
    // SAFETY: `qp` came from `rdma_create_qp` and is destroyed once.
    let qp = unsafe { Box::from_raw(qp.cast::<Qp>()) };
    qp.shared.fail();
    device().forget(qp.as_ref() as *const Qp as usize);
}

#[inline(never)]
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is live (the caller's contract) and a `Qp`.
    let shared = unsafe { &(*qp.cast::<Qp>()).shared };
    let mut next = wr;
    while !next.is_null() {
        // SAFETY: the chain and its SGE lists are valid for the call (the caller's contract).
        let request = unsafe { &*next };
        // SAFETY: as above.
        if let Err(errno) = unsafe { work::execute(shared, request) } {
            // SAFETY: the caller passes a valid out-pointer.
            unsafe { *bad_wr = next };
            return errno;
        }
        next = request.next;
    }
    0
}

#[inline(never)]
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is live (the caller's contract) and a `Qp`.
    let shared = unsafe { &(*qp.cast::<Qp>()).shared };
    if shared.srq.is_some() {
        // SAFETY: the caller passes a valid out-pointer.
        unsafe { *bad_wr = wr };
        return libc::EINVAL;
    }
    // SAFETY: the chain is valid for the call (the caller's contract).
    let ret = unsafe {
        post_recvs(wr, bad_wr, shared.max_sge, |recv| {
            let mut state = shared.state.lock();
            if state.error {
                drop(state);
                shared.recv_cq.push(completion(
                    recv.wr_id,
                    shared.qp_num,
                    ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
                ));
                return Ok(());
            }
            if state.recvs.len() >= shared.max_recv_wr {
                return Err(libc::ENOMEM);
            }
            state.recvs.push_back(recv);
            Ok(())
        })
    };
    shared.received();
    ret
}

/// Walks a receive chain, handing each request to `post`; stops at the first failure.
///
/// # Safety
/// `wr` is a valid chain whose SGE lists are valid for the call.
unsafe fn post_recvs(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_sge: usize,
    mut post: impl FnMut(Recv) -> Result<(), c_int>,
) -> c_int {
    let mut next = wr;
    while !next.is_null() {
        // SAFETY: per the contract.
        let request = unsafe { &*next };
        let n = usize::try_from(request.num_sge).unwrap_or(usize::MAX);
        let result = if n > max_sge {
            Err(libc::EINVAL)
        } else {
            // SAFETY: per the contract, `sg_list` holds `num_sge` entries.
            let sges = unsafe { work::sges(request.sg_list, n) }.to_vec();
            post(Recv {
                wr_id: request.wr_id,
                sges,
            })
        };
        if let Err(errno) = result {
            // SAFETY: the caller passes a valid out-pointer.
            unsafe { *bad_wr = next };
            return errno;
        }
        next = request.next;
    }
    0
}

#[inline(never)]
pub unsafe fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    // SAFETY: `init` is valid for the call (the caller's contract).
    let attr = unsafe { &(*init).attr };
    if attr.max_wr == 0 || attr.max_wr > MAX_QUEUE || attr.max_sge > MAX_SGE {
        return fail(libc::EINVAL, ptr::null_mut());
    }
    // SAFETY: `ibv_srq` is plain old data; all-zero is valid.
    let mut raw: ibv_srq = unsafe { std::mem::zeroed() };
    // SAFETY: `pd` is live (the caller's contract).
    raw.context = unsafe { (*pd).context };
    raw.pd = pd;
    boxed_at(|element| Srq {
        raw,
        shared: Arc::new(SrqShared {
            attached: Mutex::default(),
            max_wr: attr.max_wr as usize,
            max_sge: attr.max_sge as usize,
            element,
            state: Mutex::new(SrqState {
                recvs: VecDeque::new(),
                limit: attr.srq_limit as usize,
            }),
        }),
    })
    .cast()
}

#[inline(never)]
pub unsafe fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    device().forget(srq as usize);
    // SAFETY: `srq` came from `ibv_create_srq` and is destroyed once (after its queue pairs).
    drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
    0
}

#[inline(never)]
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is live (the caller's contract) and a `Srq`.
    let shared = unsafe { &(*srq.cast::<Srq>()).shared };
    // SAFETY: the chain is valid for the call (the caller's contract).
    let ret = unsafe {
        post_recvs(wr, bad_wr, shared.max_sge, |recv| {
            let mut state = shared.state.lock();
            if state.recvs.len() >= shared.max_wr {
                return Err(libc::ENOMEM);
            }
            state.recvs.push_back(recv);
            Ok(())
        })
    };
    let attached: Vec<_> = shared
        .attached
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for qp in attached {
        qp.received();
    }
    ret
}

#[inline(never)]
pub unsafe fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    if mask as u32 != ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 {
        return libc::EINVAL;
    }
    // SAFETY: `srq` is live and `attr` valid for the call (the caller's contract).
    let (shared, limit) = unsafe { (&(*srq.cast::<Srq>()).shared, (*attr).srq_limit) };
    let mut state = shared.state.lock();
    if limit as usize > shared.max_wr {
        return libc::EINVAL;
    }
    state.limit = limit as usize;
    0
}
