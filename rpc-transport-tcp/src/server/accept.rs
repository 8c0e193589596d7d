//! A new connection's way in: the TLS handshake, authentication, or a look at its first
//! byte (another protocol on the port) as the server requires, the connection limit, and
//! then its service.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rpc_core::auth::{Checker, Peer};
use rpc_core::body::RawBody;
use rpc_core::frame::OutgoingFrame;
use rpc_core::server::{ConnectionDispatch, Requests, Served, ServedLink};
use rpc_core::{FrameKind, Header, MetadataMap, Status};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Shared;
use crate::conn::{Conn, ReadPolicy};
use crate::handshake;
use crate::socket::Socket;
use crate::sockets::answer_http1;
use crate::tls::{agreed, ALPN_RPC};

/// The first byte of everything a client of ours sends first: a frame's magic or the
/// authentication preface, both `RR…`.
const FRAME_START: u8 = rpc_core::header::MAGIC.to_le_bytes()[0];

/// A new connection: authenticated first if the server requires it, told apart from
/// another protocol on the port if there is one, then served.
pub(super) fn accepted(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
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
    if let Err(e) = start_connection(Socket::plain(stream), who, &[], None, shared) {
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
    stream: &TcpStream,
    peer: SocketAddr,
    shared: &'a Shared,
) -> Option<Handshaking<'a>> {
    shared.handshaking.fetch_add(1, Ordering::AcqRel);
    let counted = Handshaking(&shared.handshaking);
    if shared.connections.is_draining() {
        return None;
    }
    if let Some(status) = at_limit(peer, shared, 1) {
        if shared.tls.is_none() && !other_speaks_already(stream, shared) {
            refuse(|bytes| stream.try_write(bytes), &status);
        }
        return None;
    }
    Some(counted)
}

/// Whether the first byte a new connection sent already arrived and is the other
/// protocol's on the port (whose peer would read our refusal as garbage: it is closed
/// without one, as a `grpc://` server closes a connection over its limit).
fn other_speaks_already(stream: &TcpStream, shared: &Shared) -> bool {
    let Some(other) = &shared.other else {
        return false;
    };
    let mut first = [std::mem::MaybeUninit::<u8>::uninit()];
    match socket2::SockRef::from(stream).peek(&mut first) {
        // SAFETY: the peek initialized the one byte it returned.
        Ok(1) => other.speaks(unsafe { first[0].assume_init() }),
        _ => false,
    }
}

/// A new connection's TLS handshake (within `handshake_timeout`), then, if it agreed on
/// our frames (ALPN), its authentication inside TLS if the server requires it, and it is
/// served; one that agreed on the other protocol on the port is handed to it.
async fn secure(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let Some(tls) = shared.tls.clone() else {
        return;
    };
    let Some(counted) = handshaking(&stream, peer, &shared) else {
        return;
    };
    // The handshake's records, and whatever protocol follows, go out as they are written.
    let _ = stream.set_nodelay(true);
    let timeout = shared.config.handshake_timeout;
    let accepting = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
    let mut stream = match tokio::time::timeout(timeout, accepting).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return tracing::warn!(%peer, %e, "TLS handshake failed"),
        Err(_) => return tracing::warn!(%peer, ?timeout, "no TLS handshake within the timeout"),
    };
    let alpn = stream.get_ref().1.alpn_protocol();
    // (A server that authenticates has no other protocol: it would skip the handshake.)
    let other = shared.other.as_ref().filter(|_| shared.auth.is_none());
    if let Some(other) = other.filter(|o| alpn == Some(o.alpn())) {
        // Counted until it joined the connections (`serve_tls` adds it before it returns).
        other.serve_tls(stream, peer, &shared.connections);
        return drop(counted);
    }
    if !agreed(alpn, ALPN_RPC) {
        return tracing::warn!(%peer, "the client's TLS agreed on a protocol other than ours");
    }
    let addr = format!("tcps://{peer}");
    let answered = match &shared.auth {
        Some(checker) => authenticated(&mut stream, checker, &addr, timeout).await,
        None => Ok((Peer::anonymous(addr), Vec::new())),
    };
    let (tcp, session) = stream.into_inner();
    admit(Socket::tls(tcp, session), peer, answered, counted, &shared);
}

/// Waits for a new connection's first byte (as long as an idle connection is kept), and
/// serves it in the protocol that byte says.
async fn sniff(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
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
    if other.speaks(first) {
        // Counted until it joined the connections (`serve` adds it before it returns).
        other.serve(stream, peer, &shared.connections);
        return drop(counted);
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
    if let Err(e) = start_connection(Socket::plain(stream), who, &[], Some(counted), &shared) {
        tracing::warn!(%peer, %e, "could not start a connection");
    }
}

/// Authenticates a new connection (see [`handshake`]), then serves it; a peer refused is
/// told why and closed.
async fn authenticate(mut stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let Some(checker) = shared.auth.as_ref() else {
        return;
    };
    let Some(counted) = handshaking(&stream, peer, &shared) else {
        return;
    };
    let addr = format!("tcp://{peer}");
    let timeout = shared.config.handshake_timeout;
    let answered = authenticated(&mut stream, checker, &addr, timeout).await;
    admit(Socket::plain(stream), peer, answered, counted, &shared);
}

/// Authenticates the peer at `addr` on `stream` (the socket, or TLS on it) within
/// `timeout`: who it is, and the bytes of its first frame read meanwhile; or why it is
/// refused.
async fn authenticated<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    checker: &Checker,
    addr: &str,
    timeout: Duration,
) -> Result<(Peer, Vec<u8>), Status> {
    let admitted = handshake::server(stream, checker, addr, timeout).await?;
    let Some(answer) = admitted.answer else {
        return Ok((admitted.who, admitted.first));
    };
    let write = async {
        stream.write_all(&answer).await?;
        stream.flush().await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok((admitted.who, admitted.first)),
        Ok(Err(e)) => Err(Status::unavailable(format!("{addr}: {e}"))),
        Err(_) => Err(Status::unavailable(format!("{addr} does not read"))),
    }
}

/// Serves a connection that passed its handshakes (`answered`: who it is and the start of
/// its first frame), or refuses it, telling it why.
fn admit(
    socket: Socket,
    peer: SocketAddr,
    answered: Result<(Peer, Vec<u8>), Status>,
    counted: Handshaking<'_>,
    shared: &Arc<Shared>,
) {
    match answered {
        Ok((who, first)) => {
            if let Err(e) = start_connection(socket, who, &first, Some(counted), shared) {
                tracing::warn!(%peer, %e, "could not start a connection");
            }
        }
        Err(status) => {
            tracing::warn!(%peer, %status, "connection refused");
            refuse(|bytes| socket.try_write(bytes), &status);
            socket.shutdown_write();
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

/// Serves a connection: `who` is the peer, `first` the start of its first frame, read
/// during a handshake.
fn start_connection(
    socket: Socket,
    who: Peer,
    first: &[u8],
    counted: Option<Handshaking<'_>>,
    shared: &Arc<Shared>,
) -> io::Result<()> {
    let peer = socket.tcp.peer_addr()?;
    // A connection counted while it handshook holds its place under the limit until it
    // joins the connections (below); one that did not handshake is checked now.
    if counted.is_none() {
        if let Some(status) = at_limit(peer, shared, 0) {
            refuse(|bytes| socket.try_write(bytes), &status);
            return Ok(());
        }
    }
    let policy = ReadPolicy {
        max_payload: shared.dispatcher.config().max_message_size,
        idle_timeout: Some(shared.config.idle_timeout),
        pause_when_full: true,
        caller_reads: false,
    };
    let conn = Conn::new(socket, who.addr.clone(), &shared.config.limits, policy)?;
    conn.prime(first);
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
    drop(counted);
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
