//! Completion channels and completion queues.

use std::collections::VecDeque;
use std::os::raw::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::Arc;

use parking_lot::Mutex;
use rdma_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_event_type, ibv_wc};

use super::device::{device, MAX_QUEUE};
use super::notify::Mailbox;
use super::{boxed_at, fail};

/// A completion channel: the `cq_context` of each completion queue that fired.
#[repr(C)]
struct Channel {
    raw: ibv_comp_channel,
    events: Arc<Mailbox<usize>>,
}

/// A completion queue: the C struct first, so a `*mut ibv_cq` is a `*mut Cq`.
#[repr(C)]
struct Cq {
    raw: ibv_cq,
    shared: Arc<CqShared>,
}

/// What queue pairs hold of a completion queue they complete to.
#[derive(Debug)]
pub(crate) struct CqShared {
    state: Mutex<CqState>,
    capacity: usize,
    /// The `cq_context` reported on the channel.
    tag: usize,
    /// The queue's address, for its asynchronous events.
    element: usize,
    channel: Option<Arc<Mailbox<usize>>>,
}

#[derive(Default)]
struct CqState {
    wcs: VecDeque<ibv_wc>,
    armed: bool,
}

impl std::fmt::Debug for CqState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqState")
            .field("completions", &self.wcs.len())
            .field("armed", &self.armed)
            .finish()
    }
}

impl CqShared {
    /// Adds a completion; fires the channel if the queue was armed. One past the capacity
    /// is an overrun: the completion is lost and a `CQ_ERR` event raised.
    pub(crate) fn push(&self, wc: ibv_wc) {
        let fire = {
            let mut state = self.state.lock();
            if state.wcs.len() >= self.capacity {
                drop(state);
                device().raise(ibv_event_type::IBV_EVENT_CQ_ERR, self.element);
                return;
            }
            state.wcs.push_back(wc);
            std::mem::take(&mut state.armed)
        };
        if let (true, Some(channel)) = (fire, &self.channel) {
            channel.push(self.tag);
        }
    }
}

/// The shared state of the completion queue `cq`.
///
/// # Safety
/// `cq` is a live completion queue of the fabric.
pub(crate) unsafe fn shared(cq: *mut ibv_cq) -> Arc<CqShared> {
    // SAFETY: per the contract, `cq` points at a live `Cq` (its first field).
    Arc::clone(unsafe { &(*cq.cast::<Cq>()).shared })
}

#[inline(never)]
pub unsafe fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    let events = match Mailbox::new() {
        Ok(m) => Arc::new(m),
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE), ptr::null_mut()),
    };
    let raw = ibv_comp_channel {
        context,
        fd: events.fd(),
        refcnt: 0,
    };
    Box::into_raw(Box::new(Channel { raw, events })).cast()
}

#[inline(never)]
pub unsafe fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // SAFETY: `channel` came from `ibv_create_comp_channel` and is destroyed once.
    drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
    0
}

#[inline(never)]
pub unsafe fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: `channel` is live (the caller's contract) and a `Channel`.
    let channel = unsafe { &*channel.cast::<Channel>() };
    match channel.events.take() {
        Ok(tag) => {
            // SAFETY: the caller passes valid out-pointers. The queue is not named (it may
            // be gone by now); callers identify it by its context.
            unsafe {
                *cq = ptr::null_mut();
                *cq_context = tag as *mut c_void;
            }
            0
        }
        Err(e) => fail(e.raw_os_error().unwrap_or(libc::EIO), -1),
    }
}

#[inline(never)]
pub unsafe fn ibv_ack_cq_events(_cq: *mut ibv_cq, _nevents: c_uint) {}

#[inline(never)]
pub unsafe fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    let Ok(capacity) = u32::try_from(cqe) else {
        return fail(libc::EINVAL, ptr::null_mut());
    };
    if capacity == 0 || capacity > MAX_QUEUE {
        return fail(libc::EINVAL, ptr::null_mut());
    }
    // SAFETY: a non-null `channel` is live (the caller's contract) and a `Channel`.
    let events = unsafe { channel.cast::<Channel>().as_ref() }.map(|c| Arc::clone(&c.events));
    // SAFETY: `ibv_cq` is plain old data; all-zero is valid.
    let mut raw: ibv_cq = unsafe { std::mem::zeroed() };
    raw.context = context;
    raw.channel = channel;
    raw.cq_context = cq_context;
    raw.cqe = cqe;
    boxed_at(|element| Cq {
        raw,
        shared: Arc::new(CqShared {
            state: Mutex::default(),
            capacity: capacity as usize,
            tag: cq_context as usize,
            element,
            channel: events,
        }),
    })
    .cast()
}

#[inline(never)]
pub unsafe fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    device().forget(cq as usize);
    // SAFETY: `cq` came from `ibv_create_cq` and is destroyed once (after its queue pairs).
    drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
    0
}

#[inline(never)]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: i32, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live (the caller's contract) and a `Cq`.
    let shared = unsafe { &(*cq.cast::<Cq>()).shared };
    let mut state = shared.state.lock();
    let n = state
        .wcs
        .len()
        .min(usize::try_from(num_entries).unwrap_or(0));
    for (i, entry) in state.wcs.drain(..n).enumerate() {
        // SAFETY: the caller's array holds `num_entries` completions, and `i < n <= num_entries`.
        unsafe { wc.add(i).write(entry) };
    }
    n as c_int
}

#[inline(never)]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, _solicited_only: i32) -> c_int {
    // SAFETY: `cq` is live (the caller's contract) and a `Cq`.
    let shared = unsafe { &(*cq.cast::<Cq>()).shared };
    shared.state.lock().armed = true;
    0
}
