//! rdma_cm identifiers (`rdma_cm_id`): address resolution, listen/accept, connect,
//! disconnect — the socket-like way to set up RC queue pairs.

use std::net::SocketAddr;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Duration;

use crate::sys::{
    rdma_accept, rdma_bind_addr, rdma_cm_id, rdma_conn_param, rdma_connect, rdma_create_id,
    rdma_destroy_id, rdma_disconnect, rdma_get_request, rdma_listen, rdma_port_space, rdma_reject,
    rdma_resolve_addr, rdma_resolve_route, rdma_set_option,
};

use super::context::Context;
use super::error::{check, Result, VerbsError};
use super::event_channel::{copy_private_data, EventChannel, PeerConnParam};
use super::locked::LockedRaw;
use super::sockaddr::{to_socket_addr, RawSockAddr};

/// Most private data a connect request carries on RC (the IB CM REQ minus rdma_cm's header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries (the IB CM REP).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data a reject carries (the IB CM REJ).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// For [`ConnParam::responder_resources`] and [`ConnParam::initiator_depth`]: as many RDMA
/// READs in flight as the device (and, accepting, the peer's offer) allows; rdma_cm's
/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH`.
pub const READS_THE_DEVICE_ALLOWS: u8 = 0xFF;

/// Parameters of [`CmId::connect`] and [`CmId::accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParam<'a> {
    /// Sent to the peer (up to [`MAX_CONNECT_PRIVATE_DATA`] / [`MAX_ACCEPT_PRIVATE_DATA`]).
    pub private_data: &'a [u8],
    /// RDMA READ / atomic requests we accept in flight from the peer.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests we issue in flight.
    pub initiator_depth: u8,
    /// Transport retries (0..=7) on a missing acknowledgement before a send fails with
    /// `RetryExceeded`.
    pub retry_count: u8,
    /// RNR retries (0..=7; 7 = forever) for the **peer's** sends when *we* have no receive
    /// posted, before the peer's send fails with `RnrRetryExceeded` (the CM carries the value
    /// to the other side, as `rdma_connect(3)` says). 0 makes a missing receive fail at once,
    /// which is what tests of a credit protocol want; set it on both sides.
    pub rnr_retry_count: u8,
    /// Hardware end-to-end flow control.
    pub flow_control: bool,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam {
            private_data: &[],
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: true,
        }
    }
}

impl ConnParam<'_> {
    fn to_raw(self, verb: &'static str, max_private: usize) -> Result<rdma_conn_param> {
        if self.private_data.len() > max_private {
            return Err(VerbsError::invalid(
                verb,
                format!(
                    "{} bytes of private data, at most {max_private}",
                    self.private_data.len()
                ),
            ));
        }
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(VerbsError::invalid(
                verb,
                "retry_count and rnr_retry_count are 0..=7",
            ));
        }
        Ok(rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: u8::try_from(self.private_data.len()).unwrap_or(u8::MAX),
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: u8::from(self.flow_control),
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }
}

/// The owned `rdma_cm_id`, shared by the [`CmId`] handle and the queue pair created on it (so
/// the id is destroyed only after the QP). The mutex serializes every librdmacm call on the
/// id, including the QP's creation and destruction, which librdmacm does not make safe
/// against each other.
#[derive(Debug)]
pub(crate) struct CmIdInner {
    id: LockedRaw<rdma_cm_id>,
    channel: Option<Arc<EventChannel>>,
}

// SAFETY: all access to the id goes through `locked()`, and librdmacm ids may be used from
// any thread as long as calls on one id do not overlap.
unsafe impl Send for CmIdInner {}
// SAFETY: see `Send`.
unsafe impl Sync for CmIdInner {}

impl CmIdInner {
    /// Runs `f` on the raw id with the id's lock held for the whole call: the pointer is
    /// reached only inside it, so no call on the id can run without the lock or outlive it.
    pub(crate) fn locked<R>(&self, f: impl FnOnce(*mut rdma_cm_id) -> R) -> R {
        self.id.locked(f)
    }
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        // SAFETY: the last reference is gone, so the QP (which holds one) was destroyed
        // first; events on async ids are acknowledged as they are read, so this cannot wait
        // forever; sync ids' pending events are acknowledged by librdmacm itself.
        let ret = unsafe { rdma_destroy_id(self.id.get_mut()) };
        if let Err(e) = check("rdma_destroy_id", ret) {
            tracing::warn!(error = %e, "destroying an rdma_cm id failed");
        }
    }
}

/// An rdma_cm id, always for reliable connections (`RDMA_PS_TCP`).
///
/// Two modes:
/// * **synchronous** ([`CmId::new_sync`]): `resolve_addr`, `resolve_route`, `connect`,
///   `accept` and `disconnect` block until done, and a listener takes connections with
///   [`CmId::get_request`]. Simple, one thread per blocking call.
/// * **asynchronous** ([`CmId::new`] on an [`EventChannel`]): those calls return at once and
///   their outcome arrives as a [`super::CmEvent`] on the channel, whose fd can be polled.
///
/// Drop destroys the id (after any QP created on it). Disconnect first for an orderly close.
#[derive(Debug)]
pub struct CmId {
    inner: Arc<CmIdInner>,
}

/// A connection request taken by [`CmId::get_request`].
#[derive(Debug)]
pub struct ConnectRequest {
    /// The new id: create the QP on it, then [`CmId::accept`] (or [`CmId::reject`]).
    pub id: CmId,
    /// The peer's private data (zero-padded to [`MAX_CONNECT_PRIVATE_DATA`] by the CM).
    pub private_data: Vec<u8>,
    /// The peer's proposed parameters.
    pub peer: PeerConnParam,
}

impl CmId {
    /// An asynchronous id reporting on `channel`.
    pub fn new(channel: &Arc<EventChannel>) -> Result<CmId> {
        Self::create(Some(channel))
    }

    /// A synchronous id (librdmacm gives it a private channel and waits for its events).
    pub fn new_sync() -> Result<CmId> {
        Self::create(None)
    }

    fn create(channel: Option<&Arc<EventChannel>>) -> Result<CmId> {
        let mut raw: *mut rdma_cm_id = ptr::null_mut();
        let channel_ptr = channel.map_or(ptr::null_mut(), |c| c.as_ptr());
        // SAFETY: `raw` is a valid out-pointer; the channel (if any) is alive and will be kept
        // alive by the id's Arc.
        let ret = unsafe {
            rdma_create_id(
                channel_ptr,
                &mut raw,
                ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        check("rdma_create_id", ret)?;
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last_os("rdma_create_id"))?;
        // SAFETY: `raw` was just created and is owned by nobody else.
        Ok(unsafe { CmId::from_raw(raw, channel.cloned()) })
    }

    /// Takes ownership of a raw id.
    ///
    /// # Safety
    /// `raw` must be a live id nobody else destroys; `channel` must be the channel it reports
    /// on (`None` for synchronous ids, whose private channel librdmacm owns).
    pub(crate) unsafe fn from_raw(
        raw: NonNull<rdma_cm_id>,
        channel: Option<Arc<EventChannel>>,
    ) -> CmId {
        CmId {
            inner: Arc::new(CmIdInner {
                id: LockedRaw::new(raw),
                channel,
            }),
        }
    }

    pub(crate) fn inner(&self) -> &Arc<CmIdInner> {
        &self.inner
    }

    pub(crate) fn raw_addr(&self) -> usize {
        self.inner.id.addr()
    }

    /// Whether this is a synchronous id.
    pub fn is_sync(&self) -> bool {
        self.inner.channel.is_none()
    }

    /// The event channel of an asynchronous id.
    pub fn channel(&self) -> Option<&Arc<EventChannel>> {
        self.inner.channel.as_ref()
    }

    /// Binds to a local address (port 0 picks a free port; see [`CmId::local_addr`]). Binding
    /// to an RDMA device's address also binds the id to that device.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut sa = RawSockAddr::new(addr);
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked; `sa` is a valid socket address for the call.
            check("rdma_bind_addr", unsafe {
                rdma_bind_addr(raw, sa.as_mut_ptr())
            })
        })
    }

    /// Resolves `dst` (and binds to a device). Sync: blocks until done. Async: expect
    /// `AddrResolved` (or `AddrError`).
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src = src.map(RawSockAddr::new);
        let mut dst = RawSockAddr::new(dst);
        let ms = timeout_ms(timeout);
        self.inner.locked(|raw| {
            let src_ptr = src
                .as_mut()
                .map_or(ptr::null_mut(), RawSockAddr::as_mut_ptr);
            // SAFETY: the id is alive and locked; the addresses are valid for the call.
            check("rdma_resolve_addr", unsafe {
                rdma_resolve_addr(raw, src_ptr, dst.as_mut_ptr(), ms)
            })
        })
    }

    /// Resolves the route to the resolved address. Sync: blocks. Async: expect
    /// `RouteResolved` (or `RouteError`).
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let ms = timeout_ms(timeout);
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked.
            check("rdma_resolve_route", unsafe { rdma_resolve_route(raw, ms) })
        })
    }

    /// Listens for connection requests (bind first).
    pub fn listen(&self, backlog: u32) -> Result<()> {
        let backlog = c_int::try_from(backlog).unwrap_or(c_int::MAX);
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked.
            check("rdma_listen", unsafe { rdma_listen(raw, backlog) })
        })
    }

    /// Synchronous listeners only: waits for the next connection request. Other calls on
    /// this listener (e.g. `local_addr`) wait meanwhile: calls on one id are serialized.
    pub fn get_request(&self) -> Result<ConnectRequest> {
        if !self.is_sync() {
            return Err(VerbsError::invalid(
                "rdma_get_request",
                "only for synchronous ids; async listeners get ConnectRequest events",
            ));
        }
        let mut new_id: *mut rdma_cm_id = ptr::null_mut();
        let ret = self.inner.locked(|raw| {
            // SAFETY: the id is alive, locked and synchronous; `new_id` is a valid out-pointer.
            unsafe { rdma_get_request(raw, &mut new_id) }
        });
        check("rdma_get_request", ret)?;
        let new_id = NonNull::new(new_id).ok_or_else(|| VerbsError::last_os("rdma_get_request"))?;
        // SAFETY: librdmacm hands the new (synchronous) id to us; its connect-request event
        // stays attached to it (`id->event`) until accept/reject/destroy acknowledge it.
        let (private_data, peer) = unsafe {
            let event = (*new_id.as_ptr()).event;
            if event.is_null() {
                (Vec::new(), PeerConnParam::default())
            } else {
                let conn = &(*event).param.conn;
                (
                    copy_private_data(conn.private_data, conn.private_data_len),
                    PeerConnParam {
                        responder_resources: conn.responder_resources,
                        initiator_depth: conn.initiator_depth,
                        retry_count: conn.retry_count,
                        rnr_retry_count: conn.rnr_retry_count,
                    },
                )
            }
        };
        Ok(ConnectRequest {
            // SAFETY: we own the new id; synchronous ids have librdmacm-owned channels.
            id: unsafe { CmId::from_raw(new_id, None) },
            private_data,
            peer,
        })
    }

    /// Connects (after `resolve_route` and creating the QP). Sync: blocks until established
    /// and returns the private data the peer accepted with (zero-padded by the CM). Async:
    /// returns an empty Vec at once; expect `Established` (or `Rejected`, `Unreachable`,
    /// `ConnectError`).
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<Vec<u8>> {
        let mut raw_param = param.to_raw("rdma_connect", MAX_CONNECT_PRIVATE_DATA)?;
        self.inner.locked(|raw| {
            Self::require_qp(raw, "rdma_connect")?;
            // SAFETY: the id is alive and locked; `raw_param` and the private data it points to
            // outlive the call (librdmacm copies them).
            check("rdma_connect", unsafe { rdma_connect(raw, &mut raw_param) })?;
            if self.is_sync() {
                // SAFETY: after a synchronous connect, `id->event` is the ESTABLISHED event (or
                // NULL), owned by librdmacm until the next call on the id, which the lock excludes.
                return Ok(unsafe { Self::pending_event_private_data(raw) });
            }
            Ok(Vec::new())
        })
    }

    /// Accepts a connection request on this (new) id, after creating its QP. Sync: blocks
    /// until established. Async: expect `Established`.
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut raw_param = param.to_raw("rdma_accept", MAX_ACCEPT_PRIVATE_DATA)?;
        self.inner.locked(|raw| {
            Self::require_qp(raw, "rdma_accept")?;
            // SAFETY: the id is alive and locked; `raw_param` outlives the call.
            check("rdma_accept", unsafe { rdma_accept(raw, &mut raw_param) })
        })
    }

    /// Rejects a connection request on this (new) id.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > MAX_REJECT_PRIVATE_DATA {
            return Err(VerbsError::invalid("rdma_reject", "private data too long"));
        }
        let len = u8::try_from(private_data.len()).unwrap_or(u8::MAX);
        let data = if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked; the data outlives the call.
            check("rdma_reject", unsafe { rdma_reject(raw, data, len) })
        })
    }

    /// Sets the local ACK timeout of the id's queue pair (`RDMA_OPTION_ID_ACK_TIMEOUT`):
    /// 4.096 µs × 2^`exponent` (0–31) before an unacknowledged packet is sent again, so a
    /// silent peer is declared dead after about `retry_count + 1` times that. Call before
    /// `connect` or `accept`; without it rdma_cm derives the timeout from the route's
    /// packet lifetime.
    pub fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        /// `RDMA_OPTION_ID` and `RDMA_OPTION_ID_ACK_TIMEOUT` of `<rdma/rdma_cma.h>`, which
        /// rdma-sys does not bind.
        const RDMA_OPTION_ID: c_int = 0;
        const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
        if exponent > 31 {
            return Err(VerbsError::invalid(
                "rdma_set_option(ACK_TIMEOUT)",
                "the exponent is 5 bits (0-31)",
            ));
        }
        let mut value = exponent;
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked; `value` is the `uint8_t` the option takes and
            // outlives the call.
            check("rdma_set_option(ACK_TIMEOUT)", unsafe {
                rdma_set_option(
                    raw,
                    RDMA_OPTION_ID,
                    RDMA_OPTION_ID_ACK_TIMEOUT,
                    (&mut value as *mut u8).cast(),
                    1,
                )
            })
        })
    }

    /// Disconnects: moves the QP to the error state (outstanding work requests complete as
    /// flushed) and tells the peer. Sync: waits for the `Disconnected` event. Fails with
    /// `EINVAL` if the connection is already gone (e.g. the peer disconnected first).
    pub fn disconnect(&self) -> Result<()> {
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked.
            check("rdma_disconnect", unsafe { rdma_disconnect(raw) })
        })
    }

    /// The device the id is bound to (after `bind_addr` to a device address, `resolve_addr`,
    /// or for ids from connect requests). The context is owned by librdmacm.
    pub fn context(&self) -> Result<Arc<Context>> {
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked.
            let verbs = unsafe { (*raw).verbs };
            let verbs = NonNull::new(verbs).ok_or_else(|| {
                VerbsError::invalid(
                    "CmId::context",
                    "the id is not bound to a device yet (resolve the address first)",
                )
            })?;
            // SAFETY: `verbs` is a context librdmacm opened for this id and keeps open.
            Ok(unsafe { Context::from_rdma_cm(verbs) })
        })
    }

    /// The port of the device the id uses.
    pub fn port_num(&self) -> u8 {
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked.
            unsafe { (*raw).port_num }
        })
    }

    /// The local address (after bind or resolve).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.locked(|raw| {
            // SAFETY: the id is alive and locked; the union is sized for any address family.
            unsafe {
                to_socket_addr(
                    &(*raw).route.addr.src_addr_union.src_storage as *const _
                        as *const libc::sockaddr,
                )
            }
        })
    }

    /// The peer's address (after resolve, or on an accepted id).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.locked(|raw| {
            // SAFETY: as for `local_addr`.
            unsafe {
                to_socket_addr(
                    &(*raw).route.addr.dst_addr_union.dst_storage as *const _
                        as *const libc::sockaddr,
                )
            }
        })
    }

    /// Called inside [`CmIdInner::locked`] with the pointer it gave.
    fn require_qp(raw: *mut rdma_cm_id, verb: &'static str) -> Result<()> {
        // SAFETY: the caller holds the id's lock (it runs inside `locked`).
        if unsafe { (*raw).qp }.is_null() {
            return Err(VerbsError::invalid(
                verb,
                "create the QueuePair on this id first",
            ));
        }
        Ok(())
    }

    /// # Safety
    /// The caller holds the id's lock.
    unsafe fn pending_event_private_data(raw: *mut rdma_cm_id) -> Vec<u8> {
        // SAFETY: the caller holds the lock; the event, if any, is live.
        unsafe {
            let event = (*raw).event;
            if event.is_null() {
                return Vec::new();
            }
            let conn = &(*event).param.conn;
            copy_private_data(conn.private_data, conn.private_data_len)
        }
    }
}

fn timeout_ms(timeout: Duration) -> c_int {
    c_int::try_from(timeout.as_millis())
        .unwrap_or(c_int::MAX)
        .max(1)
}
