//! The server side: an rdma_cm listener thread that accepts connections and hands them to
//! the shared completion engine, whose pollers serve many connections each.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rpc_core::auth::{Checker, Peer, HELLO_LEN, PROOF_LEN};
use rpc_core::frame::OutgoingFrame;
use rpc_core::server::{shut_down, ConnectionDispatch, Dispatcher, ReplySink, Requests, Served};
use rpc_core::Status;

use crate::budget::ConnectionSlot;
use crate::client::resolve;
use crate::config::RdmaConfig;
use crate::conn::Conn;
use crate::engine::Role;
use crate::events::wait_readable;
use crate::kick::Kick;
use crate::protocol::{encode_reject, ConnectParams, Geometry};
use crate::resources::{verbs_status, Resources};
use crate::verbs::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, READS_THE_DEVICE_ALLOWS};

const LISTEN_BACKLOG: u32 = 128;
/// Longest the listener sleeps without an event.
const IDLE_WAKE: Duration = Duration::from_secs(60);

struct Shared {
    dispatcher: Arc<Dispatcher>,
    config: RdmaConfig,
    channel: Arc<EventChannel>,
    stop: AtomicBool,
    /// Wakes the listener for `stop`: it sleeps on its channel, not on a timer.
    wake: Kick,
    connections: Mutex<Vec<Served<Conn>>>,
    /// Authenticates connect requests, if the server requires it.
    auth: Option<Checker>,
}

/// A running RDMA server. Dropping it shuts it down gracefully.
pub struct RdmaServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    listener: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RdmaServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaServer")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl RdmaServer {
    /// Listens on `addr` (`ip:port` of an RDMA device's address; port 0 for any) and serves
    /// `dispatcher`.
    pub fn bind(
        addr: &str,
        dispatcher: Arc<Dispatcher>,
        config: RdmaConfig,
    ) -> Result<RdmaServer, Status> {
        let what = format!("cannot listen on rdma://{addr}");
        let nic_status =
            |status: Status| Status::new(status.code(), format!("{what}: {}", status.message()));
        let mut local = resolve(addr)?;
        // A listener on every address of a named device listens on the device's address.
        if local.ip().is_unspecified() {
            if let Some(ip) = config.nic.local_address(&local).map_err(nic_status)? {
                local.set_ip(ip);
            }
        }
        let channel = EventChannel::new().map_err(|e| verbs_status(&what, e))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| verbs_status(&what, e))?;
        let id = CmId::new(&channel).map_err(|e| verbs_status(&what, e))?;
        id.bind_addr(local).map_err(|e| verbs_status(&what, e))?;
        config.nic.check(&id).map_err(nic_status)?;
        id.listen(LISTEN_BACKLOG)
            .map_err(|e| verbs_status(&what, e))?;
        let local_addr = id.local_addr().unwrap_or(local);
        let mut config = config;
        config.limit_bodies(dispatcher.config().max_message_size);
        let auth = dispatcher.config().auth.clone().map(Checker::new);
        let shared = Arc::new(Shared {
            auth,
            dispatcher,
            config,
            channel,
            stop: AtomicBool::new(false),
            wake: Kick::new()?,
            connections: Mutex::new(Vec::new()),
        });
        let listener = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("rpc-rdma-listen".into())
                .spawn(move || listen_loop(&id, &shared))
                .map_err(|e| Status::internal(format!("cannot start the listener: {e}")))?
        };
        Ok(RdmaServer {
            shared,
            local_addr,
            listener: Some(listener),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets running handlers answer for up to `grace`, then disconnects
    /// every client.
    pub fn shutdown(&mut self, grace: Duration) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        let started = Instant::now();
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.kick();
        let _ = listener.join();
        // A queue pair cannot stop receiving alone: new requests are answered UNAVAILABLE.
        let served = std::mem::take(&mut *self.shared.connections.lock());
        shut_down(&self.shared.dispatcher, &served, started, grace);
    }
}

/// How the facade holds a server, whatever its transport.
impl rpc_core::Listener for RdmaServer {
    fn local_addr(&self) -> SocketAddr {
        RdmaServer::local_addr(self)
    }

    fn shutdown(&mut self, grace: Duration) {
        RdmaServer::shutdown(self, grace);
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(5));
    }
}

fn listen_loop(listener: &CmId, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        // An idle server costs nothing here: the listener wakes for an rdma_cm event or
        // its stop, and otherwise only once a minute.
        wait_readable([shared.channel.fd(), shared.wake.fd()], IDLE_WAKE);
        loop {
            match shared.channel.try_get_event() {
                Ok(Some(event)) => on_event(listener, event, shared),
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(%e, "rdma_cm event channel failed; listener stops");
                    return;
                }
            }
        }
        shared.connections.lock().retain(|s| !s.link.is_closed());
    }
}

fn on_event(listener: &CmId, mut event: CmEvent, shared: &Arc<Shared>) {
    match event.kind() {
        CmEventKind::ConnectRequest if event.is_for(listener) => {
            let Some(id) = event.take_request() else {
                return;
            };
            let peer = id
                .peer_addr()
                .map_or_else(|| "rdma://?".to_owned(), |a| format!("rdma://{a}"));
            if let Err(status) = accept(id, event.private_data(), peer.clone(), shared) {
                tracing::warn!(%peer, %status, "refused a connection");
            }
        }
        kind => {
            // About a connection: a disconnect ends it once what arrived before is
            // processed; anything else (rejected, unreachable, device gone, ...) at once.
            let conn = shared
                .connections
                .lock()
                .iter()
                .find(|s| event.is_for(s.link.id()))
                .map(|s| s.link.clone());
            if let Some(conn) = conn {
                conn.on_cm_event(kind);
            }
        }
    }
}

/// Rejects a connect request with `status`'s message as the reason the client will see.
fn reject(id: CmId, status: Status) -> Result<(), Status> {
    let reason = encode_reject(status.code(), status.message());
    if let Err(e) = id.reject(&reason) {
        // Dropping the id rejects it without a reason.
        tracing::debug!(%e, "rdma_reject failed");
    }
    Err(status)
}

/// A connect request the server admitted.
struct Admitted {
    slot: ConnectionSlot,
    peer: Peer,
    /// The answer to the client's hello.
    proof: Option<[u8; PROOF_LEN]>,
}

/// Checks a connect request before anything is built for it: a place among the process's
/// connections, parameters this server can agree to, and the peer's credentials.
fn admit(private_data: &[u8], peer: &str, shared: &Shared) -> Result<Admitted, Status> {
    let config = &shared.config;
    let slot = ConnectionSlot::take(peer)?;
    let params = ConnectParams::decode(private_data).map_err(|e| {
        Status::invalid_argument(format!("{peer} sent unusable connection parameters: {e}"))
    })?;
    let ours = config.protocol(
        config.rings.max_inline,
        config.shared_recv(Role::Server).is_some(),
    );
    Geometry::negotiate(&ours, &params).map_err(|e| {
        Status::invalid_argument(format!("cannot agree on ring geometry with {peer}: {e}"))
    })?;
    let hello = ConnectParams::auth_data(private_data, HELLO_LEN)
        .map_err(|e| Status::invalid_argument(format!("{peer} sent unusable credentials: {e}")))?;
    let (peer, proof) = match &shared.auth {
        Some(checker) => checker.check(peer, hello)?,
        None => (Peer::anonymous(peer), None),
    };
    Ok(Admitted { slot, peer, proof })
}

fn accept(id: CmId, private_data: &[u8], peer: String, shared: &Shared) -> Result<(), Status> {
    let config = &shared.config;
    let Admitted {
        slot,
        peer: who,
        proof,
    } = match admit(private_data, &peer, shared) {
        Ok(admitted) => admitted,
        Err(status) => return reject(id, status),
    };
    let res = match Resources::create(&id, config, Role::Server, slot) {
        Ok(res) => res,
        Err(status) => return reject(id, status),
    };
    let ours = res.protocol.connect_params();
    let params = match proof {
        Some(proof) => ours.encode_with_auth(&proof),
        None => ours.encode().to_vec(),
    };
    let conn = Conn::new(res, id, private_data, peer, config)?;
    let dispatch = ConnectionDispatch::new(
        shared.dispatcher.clone(),
        Arc::new(RdmaReplySink(conn.clone())),
        who,
    );
    conn.set_inbound(Arc::new(Requests::new(dispatch.clone())));
    let started = conn
        .id()
        .accept(&ConnParam {
            private_data: &params,
            // Request bodies offered by the client are READ (as many in flight as the
            // client's offer and the device allow; the write window bounds how many).
            initiator_depth: READS_THE_DEVICE_ALLOWS,
            retry_count: config.liveness.retry_count,
            rnr_retry_count: config.liveness.rnr_retry,
            ..ConnParam::default()
        })
        .map_err(|e| verbs_status("rdma_accept", e))
        .and_then(|()| conn.start(false));
    if let Err(status) = started {
        // Breaks the connection <-> dispatch cycle and releases the verbs resources.
        conn.close(status.clone());
        return Err(status);
    }
    shared.connections.lock().push(Served {
        link: conn,
        dispatch,
    });
    Ok(())
}

struct RdmaReplySink(Arc<Conn>);

impl ReplySink for RdmaReplySink {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.0.send(frame)
    }

    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.0.poll_send(cx, frame)
    }

    fn stage_limit(&self) -> Option<usize> {
        Some(rpc_core::frame::one_frame_stage(self.0.max_frame()))
    }
}
