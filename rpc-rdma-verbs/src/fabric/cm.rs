//! The connection manager: event channels, ids, and the connect / accept / reject /
//! disconnect exchange between two ids of this process.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use rdma_sys::{
    ibv_qp_type, rdma_cm_event_type, rdma_cm_id, rdma_conn_param, rdma_event_channel,
    rdma_port_space,
};

use super::cm_events::{complete, event, private, Channel, EventBox, Events, Pending};
use super::device::device;
use super::notify::Mailbox;
use super::qp::QpShared;
use super::{boxed_at, fail};
use crate::sockaddr::{to_socket_addr, RawSockAddr};

/// rdma_cm's reject reason when nothing listens on the port (IB CM "invalid service ID").
const REJECT_NO_LISTENER: c_int = 8;
/// rdma_cm's reject reason for a reject by the peer's application.
const REJECT_CONSUMER: c_int = 28;

/// An rdma_cm id: the C struct first, so a `*mut rdma_cm_id` is a `*mut Id`.
#[repr(C)]
struct Id {
    raw: rdma_cm_id,
    shared: Arc<IdShared>,
}

#[derive(Debug)]
struct IdShared {
    /// The id's address, as events name it.
    addr: usize,
    /// The event channel the id was made on (its connect requests' ids are made on it too).
    channel: usize,
    /// Its events: its channel's, or its own for a synchronous id.
    events: Events,
    /// A synchronous id: each call waits for the event it causes, as librdmacm's do.
    sync: bool,
    state: Mutex<IdState>,
}

#[derive(Debug, Default)]
struct IdState {
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    listening: bool,
    qp: Option<Arc<QpShared>>,
    /// The other end, from connect until reject or disconnect.
    peer: Weak<IdShared>,
    connected: bool,
    /// The receiver-not-ready retries this id's connect asked of the peer's sends.
    rnr_retry: u8,
}

impl IdShared {
    /// Queues an event about this id.
    fn post(
        &self,
        kind: rdma_cm_event_type::Type,
        status: c_int,
        conn: Option<(&rdma_conn_param, Vec<u8>)>,
    ) {
        self.post_with(kind, status, conn, self.addr, 0);
    }

    fn post_with(
        &self,
        kind: rdma_cm_event_type::Type,
        status: c_int,
        conn: Option<(&rdma_conn_param, Vec<u8>)>,
        id: usize,
        listen_id: usize,
    ) {
        self.events.push(event(kind, status, conn, id, listen_id));
    }
}

fn listeners() -> &'static Mutex<HashMap<u16, Weak<IdShared>>> {
    static LISTENERS: OnceLock<Mutex<HashMap<u16, Weak<IdShared>>>> = OnceLock::new();
    LISTENERS.get_or_init(Default::default)
}

fn ephemeral_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(40000);
    NEXT.fetch_add(1, Ordering::Relaxed).max(1024)
}

/// # Safety
/// `id` is a live fabric id.
unsafe fn shared(id: *mut rdma_cm_id) -> Arc<IdShared> {
    // SAFETY: per the contract.
    Arc::clone(unsafe { &(*id.cast::<Id>()).shared })
}

/// Writes `local`/`remote` into the id's route and binds it to the device.
///
/// # Safety
/// `id` is live and locked by the caller.
unsafe fn set_route(id: *mut rdma_cm_id, local: Option<SocketAddr>, remote: Option<SocketAddr>) {
    // SAFETY: per the contract.
    let raw = unsafe { &mut *id };
    if let Some(local) = local {
        raw.route.addr.src_addr_union.src_storage = RawSockAddr::new(local).into_storage();
        if !local.ip().is_unspecified() {
            raw.verbs = device().context();
            raw.port_num = 1;
        }
    }
    if let Some(remote) = remote {
        raw.route.addr.dst_addr_union.dst_storage = RawSockAddr::new(remote).into_storage();
        raw.verbs = device().context();
        raw.port_num = 1;
    }
}

fn with_port(addr: SocketAddr) -> SocketAddr {
    if addr.port() == 0 {
        SocketAddr::new(addr.ip(), ephemeral_port())
    } else {
        addr
    }
}

/// The id's queue pair is `qp` (called by `rdma_create_qp`).
pub(super) fn attach_qp(id: *mut rdma_cm_id, qp: &Arc<QpShared>) {
    // SAFETY: `rdma_create_qp`'s caller holds a live id.
    unsafe { shared(id) }.state.lock().qp = Some(Arc::clone(qp));
}

/// The id's queue pair is gone (called by `rdma_destroy_qp`).
pub(super) fn detach_qp(id: *mut rdma_cm_id) {
    // SAFETY: `rdma_destroy_qp`'s caller holds a live id.
    unsafe { shared(id) }.state.lock().qp = None;
}

#[inline(never)]
pub unsafe fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space::Type,
) -> c_int {
    let (events, sync) = if channel.is_null() {
        match Mailbox::new() {
            Ok(events) => (Arc::new(events), true),
            Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE), -1),
        }
    } else {
        // SAFETY: `channel` is live (the caller's contract) and a `Channel`.
        let channel = unsafe { &*channel.cast::<Channel>() };
        (Arc::clone(&channel.events), false)
    };
    // SAFETY: the caller passes a valid out-pointer.
    unsafe { *id = new_id(channel, context, ps, events, sync) };
    0
}

fn new_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space::Type,
    events: Events,
    sync: bool,
) -> *mut rdma_cm_id {
    // SAFETY: `rdma_cm_id` is plain old data; all-zero is valid.
    let mut raw: rdma_cm_id = unsafe { std::mem::zeroed() };
    raw.channel = channel;
    raw.context = context;
    raw.ps = ps;
    raw.qp_type = ibv_qp_type::IBV_QPT_RC;
    boxed_at(|addr| Id {
        raw,
        shared: Arc::new(IdShared {
            addr,
            channel: channel as usize,
            events,
            sync,
            state: Mutex::default(),
        }),
    })
    .cast()
}

#[inline(never)]
pub unsafe fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: `id` came from `rdma_create_id` (or a connect request) and is destroyed once,
    // after its queue pair.
    let id = unsafe { Box::from_raw(id.cast::<Id>()) };
    if !id.raw.event.is_null() {
        // SAFETY: a synchronous id's last event is ours to free (`complete`).
        drop(unsafe { Box::from_raw(id.raw.event.cast::<EventBox>()) });
    }
    let port = {
        let state = id.shared.state.lock();
        state
            .listening
            .then(|| state.local.map(|a| a.port()))
            .flatten()
    };
    if let Some(port) = port {
        let mut listeners = listeners().lock();
        if listeners
            .get(&port)
            .is_some_and(|l| l.as_ptr() == Arc::as_ptr(&id.shared))
        {
            listeners.remove(&port);
        }
    }
    hang_up(&id.shared);
    0
}

/// Ends whatever exchange `id` is in: a connection is torn down on both sides; a request
/// not yet accepted is rejected.
fn hang_up(id: &Arc<IdShared>) {
    let (peer, connected, qp) = {
        let mut state = id.state.lock();
        let peer = std::mem::take(&mut state.peer).upgrade();
        (peer, std::mem::take(&mut state.connected), state.qp.clone())
    };
    let Some(peer) = peer else { return };
    let peer_qp = {
        let mut state = peer.state.lock();
        state.peer = Weak::new();
        state.connected = false;
        state.qp.clone()
    };
    if connected {
        for qp in qp.iter().chain(&peer_qp) {
            qp.fail();
        }
        peer.post(rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED, 0, None);
        id.post(rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED, 0, None);
    } else {
        peer.post(
            rdma_cm_event_type::RDMA_CM_EVENT_REJECTED,
            REJECT_CONSUMER,
            None,
        );
    }
}

#[inline(never)]
pub unsafe fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: `addr` is valid for the call (the caller's contract).
    let Some(addr) = (unsafe { to_socket_addr(addr.cast()) }) else {
        return fail(libc::EAFNOSUPPORT, -1);
    };
    let addr = with_port(addr);
    // SAFETY: `id` is live and locked by the caller.
    unsafe {
        shared(id).state.lock().local = Some(addr);
        set_route(id, Some(addr), None);
    }
    0
}

#[inline(never)]
pub unsafe fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    // SAFETY: `id` is live (the caller's contract).
    let shared = unsafe { shared(id) };
    let mut state = shared.state.lock();
    let Some(local) = state.local else {
        return fail(libc::EINVAL, -1);
    };
    let mut listeners = listeners().lock();
    if listeners
        .get(&local.port())
        .is_some_and(|l| l.strong_count() > 0)
    {
        return fail(libc::EADDRINUSE, -1);
    }
    listeners.insert(local.port(), Arc::downgrade(&shared));
    state.listening = true;
    0
}

#[inline(never)]
pub unsafe fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: the addresses are valid for the call or null (the caller's contract).
    let (src, dst) = unsafe { (to_socket_addr(src.cast()), to_socket_addr(dst.cast())) };
    let Some(dst) = dst else {
        return fail(libc::EAFNOSUPPORT, -1);
    };
    let local = with_port(src.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)));
    // SAFETY: `id` is live and locked by the caller.
    let shared = unsafe { shared(id) };
    {
        let mut state = shared.state.lock();
        state.local = Some(local);
        state.remote = Some(dst);
    }
    // SAFETY: as above.
    unsafe { set_route(id, Some(local), Some(dst)) };
    shared.post(rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED, 0, None);
    // SAFETY: as above.
    unsafe {
        complete(
            id,
            &shared.events,
            shared.sync,
            rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
        )
    }
}

#[inline(never)]
pub unsafe fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: `id` is live (the caller's contract).
    let shared = unsafe { shared(id) };
    if shared.state.lock().remote.is_none() {
        return fail(libc::EINVAL, -1);
    }
    shared.post(rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED, 0, None);
    // SAFETY: `id` is live and locked by the caller.
    unsafe {
        complete(
            id,
            &shared.events,
            shared.sync,
            rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
        )
    }
}

#[inline(never)]
pub unsafe fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    // SAFETY: `listen` is live (the caller's contract).
    let listener = unsafe { shared(listen) };
    if !listener.sync {
        return fail(libc::EINVAL, -1);
    }
    loop {
        let event = match listener.events.take() {
            Ok(Pending(event)) => event,
            Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EIO), -1),
        };
        if event.raw.event != rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            continue;
        }
        let child = event.raw.id;
        // SAFETY: the request's id is new and now the caller's; it keeps the event (with
        // the request's private data) as librdmacm does; the out-pointer is valid.
        unsafe {
            (*child).event = Box::into_raw(event).cast();
            *id = child;
        }
        return 0;
    }
}

#[inline(never)]
pub unsafe fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    // SAFETY: `id` is live and `param` valid for the call (the caller's contract).
    let (client, param) = unsafe { (shared(id), &*param) };
    let (local, remote) = {
        let state = client.state.lock();
        (state.local, state.remote)
    };
    let (Some(local), Some(remote)) = (local, remote) else {
        return fail(libc::EINVAL, -1);
    };
    let listener = listeners()
        .lock()
        .get(&remote.port())
        .and_then(Weak::upgrade);
    let Some(listener) = listener else {
        client.post(
            rdma_cm_event_type::RDMA_CM_EVENT_REJECTED,
            REJECT_NO_LISTENER,
            None,
        );
        // SAFETY: `id` is live and locked by the caller.
        return unsafe {
            complete(
                id,
                &client.events,
                client.sync,
                rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
            )
        };
    };
    let channel = listener.channel as *mut rdma_event_channel;
    // A synchronous listener's requests are synchronous ids, with events of their own.
    let events = if listener.sync {
        match Mailbox::new() {
            Ok(events) => Arc::new(events),
            Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE), -1),
        }
    } else {
        Arc::clone(&listener.events)
    };
    let child = new_id(
        channel,
        ptr::null_mut(),
        rdma_port_space::RDMA_PS_TCP,
        events,
        listener.sync,
    );
    // SAFETY: `child` is new and ours until the event hands it out.
    let child_shared = unsafe {
        set_route(child, Some(remote), Some(local));
        shared(child)
    };
    {
        let mut state = child_shared.state.lock();
        state.local = Some(remote);
        state.remote = Some(local);
        state.peer = Arc::downgrade(&client);
    }
    {
        let mut state = client.state.lock();
        state.peer = Arc::downgrade(&child_shared);
        state.rnr_retry = param.rnr_retry_count;
    }
    // SAFETY: per the contract.
    let data = unsafe { private(param) };
    listener.post_with(
        rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
        0,
        Some((param, data)),
        child as usize,
        listener.addr,
    );
    // SAFETY: `id` is live and locked by the caller.
    unsafe {
        complete(
            id,
            &client.events,
            client.sync,
            rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
        )
    }
}

#[inline(never)]
pub unsafe fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    // SAFETY: `id` is live and `param` valid for the call (the caller's contract).
    let (server, param) = unsafe { (shared(id), &*param) };
    let Some(client) = server.state.lock().peer.upgrade() else {
        return fail(libc::ECONNRESET, -1);
    };
    let (Some(server_qp), Some(client_qp)) = (
        server.state.lock().qp.clone(),
        client.state.lock().qp.clone(),
    ) else {
        return fail(libc::EINVAL, -1);
    };
    // Each side's parameter says how often the other's sends retry a receiver not ready.
    server_qp.set_rnr_retry(client.state.lock().rnr_retry);
    client_qp.set_rnr_retry(param.rnr_retry_count);
    QpShared::connect(&server_qp, &client_qp);
    server.state.lock().connected = true;
    client.state.lock().connected = true;
    // SAFETY: per the contract.
    let data = unsafe { private(param) };
    // The server's own event first: once the client hears of the connection it may use it
    // and hang up, and a synchronous accept must find its ESTABLISHED before that
    // DISCONNECTED.
    server.post(rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED, 0, None);
    client.post(
        rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
        0,
        Some((param, data)),
    );
    // SAFETY: `id` is live and locked by the caller.
    unsafe {
        complete(
            id,
            &server.events,
            server.sync,
            rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
        )
    }
}

#[inline(never)]
pub unsafe fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int {
    // SAFETY: `id` is live (the caller's contract).
    let server = unsafe { shared(id) };
    let Some(client) = std::mem::take(&mut server.state.lock().peer).upgrade() else {
        return fail(libc::EINVAL, -1);
    };
    client.state.lock().peer = Weak::new();
    // SAFETY: `rdma_conn_param` is plain old data; all-zero is valid.
    let mut param: rdma_conn_param = unsafe { std::mem::zeroed() };
    param.private_data = private_data;
    param.private_data_len = len;
    // SAFETY: the caller's private data is valid for `len` bytes.
    let data = unsafe { private(&param) };
    client.post(
        rdma_cm_event_type::RDMA_CM_EVENT_REJECTED,
        REJECT_CONSUMER,
        Some((&param, data)),
    );
    0
}

#[inline(never)]
pub unsafe fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: `id` is live (the caller's contract).
    let shared = unsafe { shared(id) };
    let (connected, qp) = {
        let state = shared.state.lock();
        (state.connected, state.qp.clone())
    };
    if connected {
        hang_up(&shared);
    } else if let Some(qp) = qp {
        // The peer hung up first: as with rdma_cm, the local queue pair still goes to the
        // error state.
        qp.fail();
    }
    0
}

#[inline(never)]
pub unsafe fn rdma_set_option(
    _id: *mut rdma_cm_id,
    _level: c_int,
    _optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    0
}
