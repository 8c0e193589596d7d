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
use rpc_core::server::{shut_down, ConnectionDispatch, Dispatcher, Requests, Served};
use rpc_core::{FrameKind, Header, MetadataMap, Status};
use tokio::io::AsyncWriteExt;

use crate::config::TcpServerConfig;
use crate::conn::{Conn, ReadPolicy};
use crate::handshake;
use crate::sockets::{listen, ServedConnections};

struct Shared {
    dispatcher: Arc<Dispatcher>,
    config: TcpServerConfig,
    local_addr: SocketAddr,
    connections: Arc<ServedConnections<Conn>>,
    /// Authenticates new connections, if the server requires it.
    auth: Option<Checker>,
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
        let (runtime, listener) = listen("tcp", addr, config.io_threads, "rpc-tcp-server")?;
        let auth = dispatcher.config().auth.clone().map(Checker::new);
        let shared = Arc::new(Shared {
            auth,
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

/// A new connection: authenticated first if the server requires it, then served.
fn accepted(stream: tokio::net::TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    if shared.auth.is_some() {
        tokio::spawn(authenticate(stream, peer, shared.clone()));
        return;
    }
    let who = Peer::anonymous(format!("tcp://{peer}"));
    if let Err(e) = start_connection(stream, who, shared) {
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

/// Authenticates a new connection (see [`handshake`]), then serves it; a peer refused is
/// told why and closed.
async fn authenticate(mut stream: tokio::net::TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let Some(checker) = shared.auth.as_ref() else {
        return;
    };
    shared.handshaking.fetch_add(1, Ordering::AcqRel);
    let counted = Handshaking(&shared.handshaking);
    if shared.connections.is_draining() {
        // Accepted just before the shutdown: closed before anything is built for it.
        return;
    }
    if at_limit(&stream, peer, &shared, 1) {
        return;
    }
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
            if let Err(e) = start_connection(stream, who, &shared) {
                tracing::warn!(%peer, %e, "could not start a connection");
            }
        }
        Err(status) => {
            tracing::warn!(%peer, %status, "connection refused");
            refuse(&stream, &status);
        }
    }
}

/// Refuses the connection if the server is at its limit (`pending` of the handshaking ones
/// are this one).
fn at_limit(
    stream: &tokio::net::TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    pending: usize,
) -> bool {
    let max = shared.config.max_connections;
    let handshaking = shared
        .handshaking
        .load(Ordering::Acquire)
        .saturating_sub(pending);
    if shared.connections.len() + handshaking < max {
        return false;
    }
    refuse(
        stream,
        &Status::resource_exhausted(format!("the server is at its limit of {max} connections")),
    );
    tracing::warn!(%peer, max, "connection refused: at the connection limit");
    true
}

fn start_connection(
    stream: tokio::net::TcpStream,
    who: Peer,
    shared: &Arc<Shared>,
) -> io::Result<()> {
    let peer = stream.peer_addr()?;
    if at_limit(&stream, peer, shared, 0) {
        return Ok(());
    }
    let policy = ReadPolicy {
        max_payload: shared.dispatcher.config().max_message_size,
        idle_timeout: Some(shared.config.idle_timeout),
        pause_when_full: true,
        caller_reads: false,
    };
    let conn = Conn::new(stream, who.addr.clone(), &shared.config.limits, policy)?;
    let dispatch = ConnectionDispatch::new(shared.dispatcher.clone(), conn.clone(), who);
    let served = Served {
        link: conn.clone(),
        dispatch: dispatch.clone(),
    };
    let Some(forget) = shared.connections.add(served) else {
        // Done its handshake while a shutdown began.
        refuse(
            &conn.stream,
            &Status::unavailable("the server is shutting down"),
        );
        return Ok(());
    };
    let requests = Requests::new(dispatch).on_closed_then(forget);
    conn.start(&tokio::runtime::Handle::current(), Arc::new(requests));
    Ok(())
}

/// Tells a connection over the limit why it is refused (a status for call id 0, best
/// effort: a fresh socket takes a small frame), then drops it.
fn refuse(stream: &tokio::net::TcpStream, status: &Status) {
    let mut header = Header::new(FrameKind::Response, 0);
    header.status = status.code();
    let body = RawBody(status.message().as_bytes());
    let metadata = MetadataMap::new();
    if let Ok(frame) = OutgoingFrame::new(header, &metadata, &body) {
        let mut out = BytesMut::new();
        frame.encode_to(&mut out);
        let _ = stream.try_write(&out);
    }
}
