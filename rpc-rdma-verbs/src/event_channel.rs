//! rdma_cm event channel (`rdma_event_channel`) and the events read from it.

use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::sys::{
    rdma_ack_cm_event, rdma_cm_event, rdma_cm_event_type, rdma_create_event_channel,
    rdma_destroy_event_channel, rdma_event_channel, rdma_get_cm_event,
};

use super::cm_id::CmId;
use super::comp_channel::set_nonblocking;
use super::error::{check, Result, VerbsError};

/// A channel rdma_cm reports connection events on, for ids made with [`CmId::new`]. Ids
/// hold an `Arc` to their channel, so it is destroyed after them.
#[derive(Debug)]
pub struct EventChannel {
    raw: NonNull<rdma_event_channel>,
}

// SAFETY: the channel is a kernel fd plus an immutable struct; librdmacm's event calls are
// thread-safe.
unsafe impl Send for EventChannel {}
// SAFETY: see `Send`.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// Creates an event channel.
    pub fn new() -> Result<Arc<EventChannel>> {
        // SAFETY: no preconditions.
        let raw = unsafe { rdma_create_event_channel() };
        let raw =
            NonNull::new(raw).ok_or_else(|| VerbsError::last_os("rdma_create_event_channel"))?;
        Ok(Arc::new(EventChannel { raw }))
    }

    /// The file descriptor, readable when an event is pending.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive; `fd` is immutable.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Makes [`EventChannel::get_event`] fail with `EAGAIN` instead of blocking.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.fd(), nonblocking)
    }

    /// Reads the next event (blocking unless the channel is non-blocking). The event is
    /// copied out and acknowledged before returning, so holding a [`CmEvent`] never keeps an
    /// id from being destroyed.
    pub fn get_event(self: &Arc<Self>) -> Result<CmEvent> {
        let mut event: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is alive and `event` is a valid out-pointer.
        check("rdma_get_cm_event", unsafe {
            rdma_get_cm_event(self.raw.as_ptr(), &mut event)
        })?;
        let event = NonNull::new(event).ok_or_else(|| VerbsError::last_os("rdma_get_cm_event"))?;
        // SAFETY: `event` is a valid event until acknowledged below; `self` is the channel
        // the event's ids report on.
        let copied = unsafe { CmEvent::copy_from(event, self) };
        // SAFETY: acknowledged exactly once, after everything we need was copied out.
        let ack = unsafe { rdma_ack_cm_event(event.as_ptr()) };
        if let Err(e) = check("rdma_ack_cm_event", ack) {
            // Only fails for a NULL event. Do not drop `copied`: destroying a new id from a
            // connect request waits for its events to be acknowledged.
            tracing::warn!(error = %e, "acknowledging an rdma_cm event failed");
        }
        Ok(copied)
    }

    /// [`EventChannel::get_event`] for a non-blocking channel: `None` when nothing is pending.
    pub fn try_get_event(self: &Arc<Self>) -> Result<Option<CmEvent>> {
        match self.get_event() {
            Ok(event) => Ok(Some(event)),
            Err(e) if e.is_would_block() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads the next event and insists that it is `expected` with status 0.
    pub fn expect_event(self: &Arc<Self>, expected: CmEventKind) -> Result<CmEvent> {
        let event = self.get_event()?;
        if event.kind == expected && event.status == 0 {
            Ok(event)
        } else {
            Err(VerbsError::UnexpectedCmEvent {
                expected: expected.name(),
                got: event.kind.to_string(),
                status: event.status,
            })
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut rdma_event_channel {
        self.raw.as_ptr()
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel holds an Arc to it, so none is left.
        unsafe { rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

/// The type of an rdma_cm event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    pub(crate) fn from_raw(raw: rdma_cm_event_type::Type) -> CmEventKind {
        use rdma_cm_event_type::*;
        match raw {
            RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            RDMA_CM_EVENT_MULTICAST_JOIN => CmEventKind::MulticastJoin,
            RDMA_CM_EVENT_MULTICAST_ERROR => CmEventKind::MulticastError,
            RDMA_CM_EVENT_ADDR_CHANGE => CmEventKind::AddrChange,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }

    /// The librdmacm name, e.g. `RDMA_CM_EVENT_ESTABLISHED`.
    pub fn name(self) -> &'static str {
        match self {
            CmEventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            CmEventKind::Other(_) => "unknown rdma_cm event",
        }
    }
}

impl fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmEventKind::Other(n) => write!(f, "rdma_cm event {n}"),
            kind => f.write_str(kind.name()),
        }
    }
}

/// Connection parameters the peer proposed (in a connect request) or answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerConnParam {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
}

/// An rdma_cm event, copied out of librdmacm and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    kind: CmEventKind,
    status: i32,
    id: usize,
    listen_id: usize,
    private_data: Vec<u8>,
    peer: Option<PeerConnParam>,
    request: Option<CmId>,
}

impl CmEvent {
    /// # Safety
    /// `event` must be a live, unacknowledged event read from `channel`.
    unsafe fn copy_from(event: NonNull<rdma_cm_event>, channel: &Arc<EventChannel>) -> CmEvent {
        // SAFETY: the caller guarantees the event is live.
        let ev = unsafe { event.as_ref() };
        let kind = CmEventKind::from_raw(ev.event);
        let carries_conn = matches!(
            kind,
            CmEventKind::ConnectRequest
                | CmEventKind::ConnectResponse
                | CmEventKind::Established
                | CmEventKind::Rejected
        );
        let (private_data, peer) = if carries_conn {
            // SAFETY: for connection events on RC (TCP port space) ids, `param.conn` is the
            // active union member; librdmacm zeroes the event before filling it.
            let conn = unsafe { &ev.param.conn };
            // SAFETY: `private_data` points to `private_data_len` bytes owned by the event,
            // valid until the ack; copied here.
            let data = unsafe { copy_private_data(conn.private_data, conn.private_data_len) };
            let peer = PeerConnParam {
                responder_resources: conn.responder_resources,
                initiator_depth: conn.initiator_depth,
                retry_count: conn.retry_count,
                rnr_retry_count: conn.rnr_retry_count,
            };
            (data, Some(peer))
        } else {
            (Vec::new(), None)
        };
        let request = match (kind, NonNull::new(ev.id)) {
            (CmEventKind::ConnectRequest, Some(id)) => {
                // SAFETY: for a connect request `id` is a new cm_id librdmacm created on this
                // channel and hands to us; we become its owner (destroyed with the CmId).
                Some(unsafe { CmId::from_raw(id, Some(Arc::clone(channel))) })
            }
            _ => None,
        };
        CmEvent {
            kind,
            status: ev.status,
            id: ev.id as usize,
            listen_id: ev.listen_id as usize,
            private_data,
            peer,
            request,
        }
    }

    /// The event type.
    pub fn kind(&self) -> CmEventKind {
        self.kind
    }

    /// 0 on success; a negative errno, or for `Rejected` the CM reject reason.
    pub fn status(&self) -> i32 {
        self.status
    }

    /// Private data from the peer (connect request, established, rejected). The CM pads it
    /// with zeros to the message's full size (e.g. 56 bytes for a request, 196 for an
    /// accept), so carry your own length in it.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's connection parameters, for connection events.
    pub fn peer_param(&self) -> Option<PeerConnParam> {
        self.peer
    }

    /// Whether the event concerns `id` (for a connect request: `id` is the listener).
    pub fn is_for(&self, id: &CmId) -> bool {
        let raw = id.raw_addr();
        self.id == raw || (self.kind == CmEventKind::ConnectRequest && self.listen_id == raw)
    }

    /// For a connect request: the new id to create a QP on and accept (or reject). Dropping
    /// it unaccepted destroys it, which rejects the request.
    pub fn take_request(&mut self) -> Option<CmId> {
        self.request.take()
    }
}

/// Copies rdma_cm private data.
///
/// # Safety
/// `data` must be NULL or point to `len` readable bytes.
pub(crate) unsafe fn copy_private_data(data: *const std::os::raw::c_void, len: u8) -> Vec<u8> {
    if data.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
}
