//! The server side: an event loop that accepts connections and drives all of them.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use parking_lot::Mutex;
use rpc_core::auth::{Checker, Peer};
use rpc_core::body::RawBody;
use rpc_core::frame::OutgoingFrame;
use rpc_core::server::{shut_down, ConnectionDispatch, Dispatcher, Requests, Served};
use rpc_core::{FrameKind, Header, MetadataMap, Status};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::config::TcpServerConfig;
use crate::conn::{Conn, ReadPolicy};
use crate::handshake;

/// Pause after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// How long a shutdown waits for the accept loop to close the listener (it takes a task
/// switch; a runtime with every thread stuck in a handler is the only way to miss it).
const LISTENER_CLOSE_WAIT: Duration = Duration::from_secs(1);

struct Shared {
    dispatcher: Arc<Dispatcher>,
    config: TcpServerConfig,
    local_addr: SocketAddr,
    draining: AtomicBool,
    next_conn: AtomicU64,
    connections: Mutex<HashMap<u64, Served<Conn>>>,
    /// Authenticates new connections, if the server requires it.
    auth: Option<Checker>,
    /// Connections accepted and authenticating (they count against `max_connections`).
    handshaking: AtomicUsize,
    /// Tells the accept loop to close the listener (the start of a shutdown).
    stop_accepting: tokio::sync::Notify,
}

/// A running TCP server. Dropping it shuts it down gracefully.
pub struct TcpServer {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    /// Told when the accept loop has closed the listener.
    listener_closed: std::sync::mpsc::Receiver<()>,
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
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads.max(1))
            .thread_name("rpc-tcp-server")
            .enable_io()
            .enable_time()
            .build()?;
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on tcp://{addr}: {e}")))?;
        listener.set_nonblocking(true)?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let auth = dispatcher.config().auth.clone().map(Checker::new);
        let shared = Arc::new(Shared {
            auth,
            handshaking: AtomicUsize::new(0),
            dispatcher,
            config,
            local_addr: listener.local_addr()?,
            draining: AtomicBool::new(false),
            next_conn: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
            stop_accepting: tokio::sync::Notify::new(),
        });
        let (closed, listener_closed) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(accept_loop(listener, shared.clone(), closed));
        Ok(TcpServer {
            shared,
            runtime: Some(runtime),
            listener_closed,
        })
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Connections being served.
    pub fn connections(&self) -> usize {
        self.shared.connections.lock().len()
    }

    /// Stops accepting, refuses new requests with `UNAVAILABLE`, lets running handlers
    /// answer for up to `grace`, then closes every connection once its answers are written
    /// (within what is left of `grace`). Blocks until done.
    pub fn shutdown(&mut self, grace: Duration) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let started = Instant::now();
        self.shared.draining.store(true, Ordering::SeqCst);
        // New connections are refused from now on, not accepted and then reset: a client
        // that reconnects meanwhile learns at once that nobody listens here.
        self.shared.stop_accepting.notify_one();
        if self
            .listener_closed
            .recv_timeout(LISTENER_CLOSE_WAIT)
            .is_err()
        {
            tracing::warn!("the listener did not close within {LISTENER_CLOSE_WAIT:?}");
        }
        let served: Vec<_> = self.shared.connections.lock().values().cloned().collect();
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

/// Accepts connections until the shutdown says stop, then closes the listener and says so
/// on `closed`.
async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    closed: std::sync::mpsc::SyncSender<()>,
) {
    accept_until_stopped(listener, &shared).await;
    let _ = closed.try_send(());
}

async fn accept_until_stopped(listener: TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shared.stop_accepting.notified() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                if shared.draining.load(Ordering::SeqCst) {
                    return;
                }
                if shared.auth.is_some() {
                    tokio::spawn(authenticate(stream, peer, shared.clone()));
                    continue;
                }
                let who = Peer::anonymous(format!("tcp://{peer}"));
                if let Err(e) = start_connection(stream, who, shared) {
                    tracing::warn!(%peer, %e, "could not start a connection");
                }
            }
            Err(e) => {
                tracing::warn!(%e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
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
    if shared.draining.load(Ordering::SeqCst) {
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
    if shared.connections.lock().len() + handshaking < max {
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
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    {
        let mut connections = shared.connections.lock();
        // A shutdown sets `draining` before it takes its list of the connections under this
        // lock: a connection joins the list in time, or is refused here (one that finished
        // its handshake while the shutdown ran).
        if shared.draining.load(Ordering::SeqCst) {
            drop(connections);
            refuse(
                &conn.stream,
                &Status::unavailable("the server is shutting down"),
            );
            return Ok(());
        }
        connections.insert(
            id,
            Served {
                link: conn.clone(),
                dispatch: dispatch.clone(),
            },
        );
    }
    let gone = shared.clone();
    let requests = Requests::new(dispatch).on_closed_then(Box::new(move || {
        gone.connections.lock().remove(&id);
    }));
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
