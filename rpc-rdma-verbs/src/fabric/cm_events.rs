//! rdma_cm's events: the channel they queue on, the event structs `rdma_get_cm_event` hands
//! out, and a synchronous id's wait for the event its call causes.

use std::os::raw::c_int;
use std::ptr;
use std::sync::Arc;

use rdma_sys::{
    rdma_cm_event, rdma_cm_event_type, rdma_cm_id, rdma_conn_param, rdma_event_channel,
};

use super::fail;
use super::notify::Mailbox;

/// An event as `rdma_get_cm_event` hands it out, with the private data it points into.
#[repr(C)]
pub(super) struct EventBox {
    pub(super) raw: rdma_cm_event,
    private: Vec<u8>,
}

/// A queued event; the pointers in it are compared by the consumer, or (a connect
/// request's new id) handed to it to own.
pub(super) struct Pending(pub(super) Box<EventBox>);

// SAFETY: the raw pointers are ids' addresses; the box is moved, not shared.
unsafe impl Send for Pending {}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("event", &self.0.raw.event)
            .finish()
    }
}

pub(super) type Events = Arc<Mailbox<Pending>>;

#[repr(C)]
pub(super) struct Channel {
    raw: rdma_event_channel,
    pub(super) events: Events,
}

/// An event of `kind` about id `id` (a listener's, `listen_id`), with a connection's
/// parameters and private data if it carries them.
pub(super) fn event(
    kind: rdma_cm_event_type::Type,
    status: c_int,
    conn: Option<(&rdma_conn_param, Vec<u8>)>,
    id: usize,
    listen_id: usize,
) -> Pending {
    // SAFETY: `rdma_cm_event` is plain old data; all-zero is valid.
    let mut raw: rdma_cm_event = unsafe { std::mem::zeroed() };
    raw.id = id as *mut rdma_cm_id;
    raw.listen_id = listen_id as *mut rdma_cm_id;
    raw.event = kind;
    raw.status = status;
    let mut event = Box::new(EventBox {
        raw,
        private: Vec::new(),
    });
    if let Some((param, private)) = conn {
        event.private = private;
        let mut param = *param;
        param.private_data = if event.private.is_empty() {
            ptr::null()
        } else {
            event.private.as_ptr().cast()
        };
        param.private_data_len = event.private.len() as u8;
        event.raw.param.conn = param;
    }
    Pending(event)
}

#[inline(never)]
pub unsafe fn rdma_create_event_channel() -> *mut rdma_event_channel {
    match Mailbox::new() {
        Ok(events) => {
            let events = Arc::new(events);
            let raw = rdma_event_channel { fd: events.fd() };
            Box::into_raw(Box::new(Channel { raw, events })).cast()
        }
        Err(e) => fail(e.raw_os_error().unwrap_or(libc::EMFILE), ptr::null_mut()),
    }
}

#[inline(never)]
pub unsafe fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    // SAFETY: `channel` came from `rdma_create_event_channel` and is destroyed once.
    drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
}

#[inline(never)]
pub unsafe fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    // SAFETY: `channel` is live (the caller's contract) and a `Channel`.
    let channel = unsafe { &*channel.cast::<Channel>() };
    match channel.events.take() {
        Ok(Pending(boxed)) => {
            // SAFETY: the caller passes a valid out-pointer.
            unsafe { *event = Box::into_raw(boxed).cast() };
            0
        }
        Err(e) => fail(e.raw_os_error().unwrap_or(libc::EIO), -1),
    }
}

#[inline(never)]
pub unsafe fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    // SAFETY: `event` came from `rdma_get_cm_event` and is acknowledged once.
    drop(unsafe { Box::from_raw(event.cast::<EventBox>()) });
    0
}

/// For a synchronous id, waits for the event its call causes, as librdmacm does, and keeps
/// it in `id.event` (freeing the one before): 0 if it is `expected` and succeeded, else
/// `ECONNREFUSED` for a reject and `EIO` for anything else. Nothing for an asynchronous id.
///
/// # Safety
/// `id` is live and locked by the caller, and `events` are its events.
pub(super) unsafe fn complete(
    id: *mut rdma_cm_id,
    events: &Mailbox<Pending>,
    sync: bool,
    expected: rdma_cm_event_type::Type,
) -> c_int {
    if !sync {
        return 0;
    }
    let event = match events.take() {
        Ok(Pending(event)) => event,
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EIO), -1),
    };
    let (kind, status) = (event.raw.event, event.raw.status);
    // SAFETY: per the contract; the previous event, if any, was kept by this function.
    unsafe {
        let old = std::mem::replace(&mut (*id).event, Box::into_raw(event).cast());
        if !old.is_null() {
            drop(Box::from_raw(old.cast::<EventBox>()));
        }
    }
    if kind == expected && status == 0 {
        0
    } else if kind == rdma_cm_event_type::RDMA_CM_EVENT_REJECTED {
        fail(libc::ECONNREFUSED, -1)
    } else {
        fail(libc::EIO, -1)
    }
}

/// The private data a connection parameter carries.
///
/// # Safety
/// `param` is valid, and its private data pointer valid for its length.
pub(super) unsafe fn private(param: &rdma_conn_param) -> Vec<u8> {
    if param.private_data.is_null() || param.private_data_len == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract.
    unsafe {
        std::slice::from_raw_parts(
            param.private_data.cast::<u8>(),
            param.private_data_len.into(),
        )
    }
    .to_vec()
}
