//! What every transport over TCP shares, whatever it speaks there (our frames here, gRPC's
//! HTTP/2 in `rpc-transport-grpc`): a server's event loop and listener, its accept loop, the
//! set of connections it serves and the start of its graceful shutdown; a client's connect.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rpc_core::server::{OnClosed, Served, ServedLink};
use tokio::net::{TcpListener, TcpStream};

/// Pause after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// How long a shutdown waits for the accept loop to close the listener (it takes a task
/// switch; a runtime with every thread stuck in a handler is the only way to miss it).
const LISTENER_CLOSE_WAIT: Duration = Duration::from_secs(1);

/// A server's event loop (`threads` named `thread_name`) and the listener bound on `addr`
/// for it; `scheme` names the URL in errors (`cannot listen on tcp://…`).
pub fn listen(
    scheme: &str,
    addr: &str,
    threads: usize,
    thread_name: &str,
) -> io::Result<(tokio::runtime::Runtime, TcpListener)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(thread_name)
        .enable_io()
        .enable_time()
        .build()?;
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        io::Error::new(e.kind(), format!("cannot listen on {scheme}://{addr}: {e}"))
    })?;
    listener.set_nonblocking(true)?;
    let listener = {
        let _entered = runtime.enter();
        TcpListener::from_std(listener)?
    };
    Ok((runtime, listener))
}

/// A server's connection whose TLS handshake is done.
pub type TlsStream = tokio_rustls::server::TlsStream<TcpStream>;

/// The connections a server serves, whatever they speak.
pub type Connections = ServedConnections<dyn ServedLink>;

/// A protocol a TCP server speaks on its port besides its own frames, told apart by the
/// first byte a connection sends (our frames begin `R`, HTTP/2's preface `P`), or over TLS
/// by the protocol agreed by ALPN.
pub trait OtherProtocol: Send + Sync {
    /// Its name in messages (`gRPC (HTTP/2)`).
    fn name(&self) -> &'static str;

    /// Whether a connection whose first byte is `first` speaks it.
    fn speaks(&self, first: u8) -> bool;

    /// Serves such a connection on the server's event loop; it is in `connections` while
    /// served, so that the server's shutdown drains and closes it with the others.
    fn serve(&self, stream: TcpStream, peer: SocketAddr, connections: &Arc<Connections>);

    /// The protocol's name in TLS's ALPN (`h2`), for a server whose connections all open
    /// with TLS: there the protocol the client agreed on tells the two apart.
    fn alpn(&self) -> &'static [u8];

    /// Serves a connection whose TLS handshake agreed on [`OtherProtocol::alpn`], as
    /// [`OtherProtocol::serve`] does.
    fn serve_tls(&self, stream: TlsStream, peer: SocketAddr, connections: &Arc<Connections>);

    /// Once a shutdown closed the connections: waits at most `timeout` for their tasks to
    /// end (what they still send leaves before the event loop stops); whether they did.
    fn wait_ended(&self, timeout: Duration) -> bool;
}

/// The connections a server serves, and whether it still takes new ones.
pub struct ServedConnections<L: ?Sized> {
    draining: AtomicBool,
    next_id: AtomicU64,
    served: Mutex<HashMap<u64, Served<L>>>,
    /// Tells the accept loop to close the listener (the start of a shutdown).
    stop_accepting: tokio::sync::Notify,
    /// Whether the accept loop closed the listener, and who waits for it.
    listener_closed: (Mutex<bool>, Condvar),
}

impl<L: ?Sized> std::fmt::Debug for ServedConnections<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedConnections")
            .field("served", &self.served.lock().len())
            .field("draining", &self.draining.load(Ordering::Relaxed))
            .finish()
    }
}

impl<L: ?Sized + Send + Sync + 'static> ServedConnections<L> {
    /// None yet, new ones taken.
    pub fn new() -> Arc<Self> {
        Arc::new(ServedConnections {
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            served: Mutex::new(HashMap::new()),
            stop_accepting: tokio::sync::Notify::new(),
            listener_closed: (Mutex::new(false), Condvar::new()),
        })
    }

    /// Connections being served.
    pub fn len(&self) -> usize {
        self.served.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a shutdown began: new connections are refused.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Serves `served` from now on, unless a shutdown began (`None`: drop it). What it
    /// returns forgets the connection; run it once the connection ended.
    pub fn add(self: &Arc<Self>, served: Served<L>) -> Option<OnClosed> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut all = self.served.lock();
            // A shutdown sets `draining` before it takes its list of the connections under
            // this lock: a connection joins the list in time, or is refused here.
            if self.is_draining() {
                return None;
            }
            all.insert(id, served);
        }
        let this = self.clone();
        Some(Box::new(move || {
            this.served.lock().remove(&id);
        }))
    }

    /// Starts a shutdown: new connections are refused from now on (the listener closes
    /// rather than accepting and resetting them: a client that reconnects meanwhile learns
    /// at once that nobody listens here). Waits for the accept loop to close the listener,
    /// then returns the connections served.
    pub fn drain(&self) -> Vec<Served<L>> {
        self.draining.store(true, Ordering::SeqCst);
        self.stop_accepting.notify_one();
        let (closed, changed) = &self.listener_closed;
        let mut closed = closed.lock();
        if !*closed
            && changed
                .wait_while_for(&mut closed, |closed| !*closed, LISTENER_CLOSE_WAIT)
                .timed_out()
        {
            tracing::warn!("the listener did not close within {LISTENER_CLOSE_WAIT:?}");
        }
        drop(closed);
        self.served.lock().values().cloned().collect()
    }

    /// Accepts connections on `listener` and hands each to `accepted` until a shutdown
    /// begins, then closes the listener.
    pub async fn accept(
        &self,
        listener: TcpListener,
        mut accepted: impl FnMut(TcpStream, SocketAddr),
    ) {
        loop {
            let next = tokio::select! {
                next = listener.accept() => next,
                () = self.stop_accepting.notified() => break,
            };
            match next {
                Ok(_) if self.is_draining() => break,
                Ok((stream, peer)) => accepted(stream, peer),
                Err(e) => {
                    tracing::warn!(%e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
        drop(listener);
        let (closed, changed) = &self.listener_closed;
        *closed.lock() = true;
        changed.notify_all();
    }
}

/// Most bytes of a refused peer's request discarded so that its connection closes
/// without a reset (which could discard the answer before the peer reads it).
const REFUSED_DISCARD: usize = 64 << 10;

/// Tells a peer whose first byte (`first`) is not of a protocol served here why it is
/// refused, in HTTP/1.1 when it seems to speak that (`curl` shows the reason); best effort,
/// without waiting (a fresh socket takes a short answer). The caller drops the connection.
pub fn answer_http1(stream: &TcpStream, first: u8, why: &str) {
    if !first.is_ascii_uppercase() {
        return;
    }
    let mut discard = vec![0u8; REFUSED_DISCARD];
    let _ = stream.try_read(&mut discard);
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{why}\n",
        why.len() + 1
    );
    let _ = stream.try_write(answer.as_bytes());
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
}

/// A process-wide client event loop: one thread named `thread_name`, started in `cell` with
/// the first connection that needs it.
pub fn client_event_loop(
    cell: &'static std::sync::OnceLock<Result<tokio::runtime::Runtime, String>>,
    thread_name: &str,
) -> Result<&'static tokio::runtime::Runtime, rpc_core::Status> {
    cell.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(thread_name)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| {
        rpc_core::Status::internal(format!("cannot start the {thread_name} event loop: {e}"))
    })
}

/// Connects to the first address `addr` (`host:port`) resolves to that answers within
/// `timeout` (each address gets the whole of it).
pub fn connect_any(addr: &str, timeout: Duration) -> io::Result<std::net::TcpStream> {
    let mut last = None;
    for resolved in addr.to_socket_addrs()? {
        match std::net::TcpStream::connect_timeout(&resolved, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the host name resolved to no address",
        )
    }))
}
