//! The server side: an event loop that accepts connections and drives all of them.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rpc_core::auth::{Checker, Peer};
use rpc_core::body::RawBody;
use rpc_core::frame::OutgoingFrame;
use rpc_core::server::{shut_down, ConnectionDispatch, Dispatcher, Requests, Served, ServedLink};
use rpc_core::{FrameKind, Header, MetadataMap, Status};
use tokio::io::AsyncWriteExt;

use crate::config::TcpServerConfig;
use crate::conn::{Conn, ReadPolicy};
use crate::handshake;
use crate::socket::Socket;
use crate::sockets::{answer_http1, listen, Connections, OtherProtocol, ServedConnections};
use crate::tls::{agreed, ALPN_RPC};

/// The first byte of everything a client of ours sends first: a frame's magic or the
/// authentication preface, both `RR…`.
const FRAME_START: u8 = rpc_core::header::MAGIC.to_le_bytes()[0];

/// How long a shutdown waits for the tasks of connections served in another protocol.
const OTHER_TASKS_END_WAIT: Duration = Duration::from_secs(1);

struct Shared {
    dispatcher: Arc<Dispatcher>,
    config: TcpServerConfig,
    local_addr: SocketAddr,
    connections: Arc<Connections>,
    /// Authenticates new connections, if the server requires it.
    auth: Option<Checker>,
    /// What else the port speaks, told apart by a connection's first byte.
    other: Option<Arc<dyn OtherProtocol>>,
    /// `config.tls`'s rustls configuration (our frames agreed by ALPN): every connection
    /// is TLS.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Connections accepted and authenticating (they count against `max_connections`).
    handshaking: AtomicUsize,
}

/// A running TCP server. Dropping it shuts it down gracefully.
pub struct TcpServer {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for TcpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpServer")
            .field("local_addr", &self.shared.local_addr)
            .field("connections", &self.connections())
            .finish()
    }
}

impl TcpServer {
    /// Binds `addr` (`host:port`, port 0 for any) and serves `dispatcher` on it.
    pub fn bind(
        addr: &str,
        dispatcher: Arc<Dispatcher>,
        config: TcpServerConfig,
    ) -> io::Result<TcpServer> {
        TcpServer::start(addr, dispatcher, config, None)
    }

    /// [`TcpServer::bind`], and serves a connection whose first byte is `other`'s in
    /// `other`'s protocol (gRPC's HTTP/2, say) on the same port, sharing the connection
    /// limit and the graceful shutdown. A server that authenticates connections
    /// (`ServerConfig::auth`) cannot: the other protocol would let a peer past the
    /// handshake.
    pub fn bind_sharing(
        addr: &str,
        dispatcher: Arc<Dispatcher>,
        config: TcpServerConfig,
        other: Arc<dyn OtherProtocol>,
    ) -> io::Result<TcpServer> {
        if dispatcher.config().auth.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a tcp:// server that authenticates connections (ServerConfig::auth) serves \
                 only its own frames: another protocol on its port would skip the handshake",
            ));
        }
        TcpServer::start(addr, dispatcher, config, Some(other))
    }

    fn start(
        addr: &str,
        dispatcher: Arc<Dispatcher>,
        config: TcpServerConfig,
        other: Option<Arc<dyn OtherProtocol>>,
    ) -> io::Result<TcpServer> {
        if config.tls.is_some() && dispatcher.config().auth.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "tcps:// does not authenticate connections (ServerConfig::auth)",
            ));
        }
        let scheme = scheme(config.tls.is_some());
        let (runtime, listener) = listen(scheme, addr, config.io_threads, "rpc-tcp-server")?;
        let auth = dispatcher.config().auth.clone().map(Checker::new);
        let shared = Arc::new(Shared {
            auth,
            other,
            tls: config.tls.as_ref().map(|tls| tls.config(ALPN_RPC)),
            handshaking: AtomicUsize::new(0),
            dispatcher,
            config,
            local_addr: listener.local_addr()?,
            connections: ServedConnections::new(),
        });
        let accepting = shared.clone();
        runtime.spawn(async move {
            let connections = accepting.connections.clone();
            connections
                .accept(listener, |stream, peer| accepted(stream, peer, &accepting))
                .await;
        });
        Ok(TcpServer {
            shared,
            runtime: Some(runtime),
        })
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Connections being served.
    pub fn connections(&self) -> usize {
        self.shared.connections.len()
    }

    /// Stops accepting, refuses new requests with `UNAVAILABLE`, lets running handlers
    /// answer for up to `grace`, then closes every connection once its answers are written
    /// (within what is left of `grace`). Blocks until done.
    pub fn shutdown(&mut self, grace: Duration) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let started = Instant::now();
        let served = self.shared.connections.drain();
        shut_down(&self.shared.dispatcher, &served, started, grace);
        if let Some(other) = &self.shared.other {
            if !other.wait_ended(OTHER_TASKS_END_WAIT) {
                tracing::warn!("connections did not end within {OTHER_TASKS_END_WAIT:?}");
            }
        }
        runtime.shutdown_background();
    }
}

/// How the facade holds a server, whatever its transport.
impl rpc_core::Listener for TcpServer {
    fn local_addr(&self) -> SocketAddr {
        TcpServer::local_addr(self)
    }

    fn shutdown(&mut self, grace: Duration) {
        TcpServer::shutdown(self, grace);
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(5));
    }
}

/// A new connection: authenticated first if the server requires it, told apart from
/// another protocol on the port if there is one, then served.
fn accepted(stream: tokio::net::TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    if shared.tls.is_some() {
        tokio::spawn(secure(stream, peer, shared.clone()));
        return;
    }
    if shared.auth.is_some() {
        tokio::spawn(authenticate(stream, peer, shared.clone()));
        return;
    }
    if shared.other.is_some() {
        tokio::spawn(sniff(stream, peer, shared.clone()));
        return;
    }
    let who = Peer::anonymous(format!("tcp://{peer}"));
    if let Err(e) = start_connection(Socket::plain(stream), who, shared) {
        tracing::warn!(%peer, %e, "could not start a connection");
    }
}

/// Counts a connection that is authenticating while it lives.
struct Handshaking<'a>(&'a AtomicUsize);

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts a new connection as handshaking, unless it is to be closed at once: accepted
/// just before a shutdown, or over the connection limit (told so in plaintext, where the
/// server speaks it).
fn handshaking<'a>(
    stream: &tokio::net::TcpStream,
    peer: SocketAddr,
    shared: &'a Shared,
) -> Option<Handshaking<'a>> {
    shared.handshaking.fetch_add(1, Ordering::AcqRel);
    let counted = Handshaking(&shared.handshaking);
    if shared.connections.is_draining() {
        return None;
    }
    if let Some(status) = at_limit(peer, shared, 1) {
        if shared.tls.is_none() {
            refuse(|bytes| stream.try_write(bytes), &status);
        }
        return None;
    }
    Some(counted)
}

/// A new connection's TLS handshake (within `handshake_timeout`, our frames agreed by
/// ALPN), then it is served.
async fn secure(stream: tokio::net::TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let Some(tls) = shared.tls.clone() else {
        return;
    };
    let Some(counted) = handshaking(&stream, peer, &shared) else {
        return;
    };
    let timeout = shared.config.handshake_timeout;
    let accepting = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
    let (tcp, session) = match tokio::time::timeout(timeout, accepting).await {
        Ok(Ok(stream)) => stream.into_inner(),
        Ok(Err(e)) => return tracing::warn!(%peer, %e, "TLS handshake failed"),
        Err(_) => return tracing::warn!(%peer, ?timeout, "no TLS handshake within the timeout"),
    };
    if !agreed(session.alpn_protocol(), ALPN_RPC) {
        return tracing::warn!(%peer, "the client's TLS agreed on a protocol other than ours");
    }
    drop(counted);
    let who = Peer::anonymous(format!("tcps://{peer}"));
    if let Err(e) = start_connection(Socket::tls(tcp, session), who, &shared) {
        tracing::warn!(%peer, %e, "could not start a connection");
    }
}

/// Waits for a new connection's first byte (as long as an idle connection is kept), and
/// serves it in the protocol that byte says.
async fn sniff(stream: tokio::net::TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let Some(other) = shared.other.as_ref() else {
        return;
    };
    let Some(counted) = handshaking(&stream, peer, &shared) else {
        return;
    };
    let mut first = [0u8; 1];
    let idle = shared.config.idle_timeout;
    let first = match tokio::time::timeout(idle, stream.peek(&mut first)).await {
        Ok(Ok(1)) => first[0],
        Ok(Ok(_)) => return,
        Ok(Err(e)) => return tracing::debug!(%peer, %e, "a new connection failed"),
        Err(_) => return tracing::debug!(%peer, ?idle, "a new connection sent nothing"),
    };
    drop(counted);
    if other.speaks(first) {
        return other.serve(stream, peer, &shared.connections);
    }
    if first != FRAME_START {
        let why = format!(
            "tcp://{peer} speaks neither rdma-rpc nor {} (its first byte is 0x{first:02x})",
            other.name()
        );
        tracing::warn!("connection refused: {why}");
        return answer_http1(&stream, first, &why);
    }
    let who = Peer::anonymous(format!("tcp://{peer}"));
    if let Err(e) = start_connection(Socket::plain(stream), who, &shared) {
        tracing::warn!(%peer, %e, "could not start a connection");
    }
}

/// Authenticates a new connection (see [`handshake`]), then serves it; a peer refused is
/// told why and closed.
async fn authenticate(mut stream: tokio::net::TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let Some(checker) = shared.auth.as_ref() else {
        return;
    };
    let Some(counted) = handshaking(&stream, peer, &shared) else {
        return;
    };
    let addr = format!("tcp://{peer}");
    let timeout = shared.config.handshake_timeout;
    let answered = match handshake::server(&mut stream, checker, &addr, timeout).await {
        Ok((who, answer)) => {
            let write = tokio::time::timeout(timeout, stream.write_all(&answer)).await;
            match write {
                Ok(Ok(())) => Ok(who),
                Ok(Err(e)) => Err(Status::unavailable(format!("{addr}: {e}"))),
                Err(_) => Err(Status::unavailable(format!("{addr} does not read"))),
            }
        }
        Err(status) => Err(status),
    };
    drop(counted);
    match answered {
        Ok(who) => {
            if let Err(e) = start_connection(Socket::plain(stream), who, &shared) {
                tracing::warn!(%peer, %e, "could not start a connection");
            }
        }
        Err(status) => {
            tracing::warn!(%peer, %status, "connection refused");
            refuse(|bytes| stream.try_write(bytes), &status);
        }
    }
}

/// Why the connection is refused if the server is at its limit (`pending` of the
/// handshaking ones are this one).
fn at_limit(peer: SocketAddr, shared: &Shared, pending: usize) -> Option<Status> {
    let max = shared.config.max_connections;
    let handshaking = shared
        .handshaking
        .load(Ordering::Acquire)
        .saturating_sub(pending);
    if shared.connections.len() + handshaking < max {
        return None;
    }
    tracing::warn!(%peer, max, "connection refused: at the connection limit");
    Some(Status::resource_exhausted(format!(
        "the server is at its limit of {max} connections"
    )))
}

fn start_connection(socket: Socket, who: Peer, shared: &Arc<Shared>) -> io::Result<()> {
    let peer = socket.tcp.peer_addr()?;
    if let Some(status) = at_limit(peer, shared, 0) {
        refuse(|bytes| socket.try_write(bytes), &status);
        return Ok(());
    }
    let policy = ReadPolicy {
        max_payload: shared.dispatcher.config().max_message_size,
        idle_timeout: Some(shared.config.idle_timeout),
        pause_when_full: true,
        caller_reads: false,
    };
    let conn = Conn::new(socket, who.addr.clone(), &shared.config.limits, policy)?;
    let dispatch = ConnectionDispatch::new(shared.dispatcher.clone(), conn.clone(), who);
    let served = Served {
        link: conn.clone() as Arc<dyn ServedLink>,
        dispatch: dispatch.clone(),
    };
    let Some(forget) = shared.connections.add(served) else {
        // Done its handshake while a shutdown began.
        let status = Status::unavailable("the server is shutting down");
        refuse(|bytes| conn.socket.try_write(bytes), &status);
        return Ok(());
    };
    let requests = Requests::new(dispatch).on_closed_then(forget);
    conn.start(&tokio::runtime::Handle::current(), Arc::new(requests));
    Ok(())
}

/// Tells a connection over the limit why it is refused (a status for call id 0, best
/// effort with `write`: a fresh socket takes a small frame), then drops it.
fn refuse(write: impl FnOnce(&[u8]) -> io::Result<usize>, status: &Status) {
    let mut header = Header::new(FrameKind::Response, 0);
    header.status = status.code();
    let body = RawBody(status.message().as_bytes());
    let metadata = MetadataMap::new();
    if let Ok(frame) = OutgoingFrame::new(header, &metadata, &body) {
        let mut out = BytesMut::new();
        frame.encode_to(&mut out);
        let _ = write(&out);
    }
}

/// The scheme of a server's URLs: `tcps` with TLS.
fn scheme(tls: bool) -> &'static str {
    if tls {
        "tcps"
    } else {
        "tcp"
    }
}
