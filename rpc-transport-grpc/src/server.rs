//! The server: an event loop that accepts connections and serves each over HTTP/2.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::{Condvar, Mutex};
use rpc_core::auth::Peer;
use rpc_core::server::{shut_down, ConnectionDispatch, Dispatcher, Requests, Served, ServedLink};
use rpc_core::Status;
use rpc_transport_tcp::sockets::{
    answer_http1, listen, Connections, OtherProtocol, ServedConnections, TlsStream,
};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::call::ServerSide;
use crate::config::{
    GrpcServerConfig, HTTP2_CONNECTION_WINDOW, HTTP2_SEND_BUFFER, HTTP2_STREAM_WINDOW,
    MAX_FRAME_SIZE,
};
use crate::conn::{GrpcConn, Phase, Side};
use crate::tls::{agreed_h2, ALPN_H2};

/// How long a connection told to close still sends what it has (its GOAWAY, the last
/// trailers) before it is dropped.
const CLOSE_LINGER: Duration = Duration::from_millis(100);
/// How long a shutdown waits for the connections' tasks to end.
const TASKS_END_WAIT: Duration = Duration::from_secs(1);
/// What every HTTP/2 client sends first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;
/// Pause before looking again at a preface that arrived in part.
const PREFACE_RECHECK: Duration = Duration::from_millis(1);

/// What serving gRPC connections takes, on a port of the server's own or on a `tcp://`
/// server's (as its [`OtherProtocol`]).
struct Shared {
    dispatcher: Arc<Dispatcher>,
    /// What each call needs of the server.
    side: Arc<ServerSide>,
    config: GrpcServerConfig,
    /// `config.tls`'s rustls configuration, HTTP/2 agreed by ALPN.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// The connections' tasks, which a shutdown lets end before it drops their runtime.
    tasks: TaskCount,
}

/// A running gRPC server. Dropping it shuts it down gracefully.
pub struct GrpcServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    connections: Arc<Connections>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for GrpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcServer")
            .field("local_addr", &self.local_addr)
            .field("connections", &self.connections())
            .finish()
    }
}

/// Refuses a dispatcher that authenticates connections: gRPC clients do not speak that
/// handshake.
fn refuse_auth(dispatcher: &Dispatcher) -> io::Result<()> {
    if dispatcher.config().auth.is_none() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        "gRPC cannot authenticate connections (ServerConfig::auth): gRPC clients do not \
         speak that handshake; check credentials in an interceptor instead",
    ))
}

impl Shared {
    fn new(dispatcher: Arc<Dispatcher>, config: GrpcServerConfig) -> Arc<Shared> {
        let side = Arc::new(ServerSide {
            dispatcher: dispatcher.clone(),
            request_read_timeout: config.request_read_timeout,
        });
        Arc::new(Shared {
            side,
            dispatcher,
            tls: config.tls.as_ref().map(|tls| tls.config(ALPN_H2)),
            config,
            tasks: TaskCount::default(),
        })
    }
}

impl GrpcServer {
    /// Binds `addr` (`host:port`, port 0 for any) and serves `dispatcher`'s services on it
    /// as gRPC. A server that authenticates connections (`ServerConfig::auth`) cannot:
    /// gRPC clients do not speak our handshake (authenticate calls with an interceptor).
    pub fn bind(
        addr: &str,
        dispatcher: Arc<Dispatcher>,
        config: GrpcServerConfig,
    ) -> io::Result<GrpcServer> {
        refuse_auth(&dispatcher)?;
        let (runtime, listener) = listen("grpc", addr, config.io_threads, "rpc-grpc-server")?;
        let shared = Shared::new(dispatcher, config);
        let connections: Arc<Connections> = ServedConnections::new();
        let local_addr = listener.local_addr()?;
        let accepting = shared.clone();
        let served = connections.clone();
        runtime.spawn(async move {
            served
                .accept(listener, |stream, peer| {
                    let max = accepting.config.max_connections;
                    if served.len() >= max {
                        tracing::warn!(%peer, max, "connection refused: at the connection limit");
                        return;
                    }
                    start_connection(incoming(stream, &accepting), peer, &accepting, &served);
                })
                .await;
        });
        Ok(GrpcServer {
            shared,
            local_addr,
            connections,
            runtime: Some(runtime),
        })
    }

    /// Serves `dispatcher`'s services as gRPC on a `tcp://` server's port, to the
    /// connections that open with HTTP/2's preface (or, with `config.tls`, a TLS handshake
    /// of gRPC's own), and on a `tcps://` server's to those whose TLS agreed on HTTP/2:
    /// give what this returns to `TcpServer::bind_sharing`. The TCP server's connection
    /// limit, event loop and shutdown apply; so do `config`'s per-connection bounds and
    /// timeouts.
    pub fn on_tcp_port(
        dispatcher: Arc<Dispatcher>,
        config: GrpcServerConfig,
    ) -> io::Result<Arc<dyn OtherProtocol>> {
        refuse_auth(&dispatcher)?;
        Ok(Shared::new(dispatcher, config))
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections being served.
    pub fn connections(&self) -> usize {
        self.connections.len()
    }

    /// Stops accepting and sends every connection HTTP/2's GOAWAY, refuses new calls with
    /// `UNAVAILABLE`, lets running handlers answer for up to `grace`, then closes every
    /// connection once HTTP/2 wrote its answers (within what is left of `grace`). Blocks
    /// until done.
    pub fn shutdown(&mut self, grace: Duration) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let started = Instant::now();
        let served = self.connections.drain();
        shut_down(&self.shared.dispatcher, &served, started, grace);
        if !self.shared.tasks.wait_idle(TASKS_END_WAIT) {
            tracing::warn!("gRPC connections did not end within {TASKS_END_WAIT:?}");
        }
        runtime.shutdown_background();
    }
}

/// How the facade holds a server, whatever its transport.
impl rpc_core::Listener for GrpcServer {
    fn local_addr(&self) -> SocketAddr {
        GrpcServer::local_addr(self)
    }

    fn shutdown(&mut self, grace: Duration) {
        GrpcServer::shutdown(self, grace);
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(5));
    }
}

/// The connections of the other protocol on a `tcp://` port: gRPC's.
impl OtherProtocol for Shared {
    fn name(&self) -> &'static str {
        "gRPC (HTTP/2)"
    }

    fn speaks(&self, first: u8) -> bool {
        match self.config.tls {
            None => first == PREFACE[0],
            Some(_) => first == TLS_HANDSHAKE,
        }
    }

    fn serve(&self, stream: TcpStream, peer: SocketAddr, connections: &Arc<Connections>) {
        start_connection(incoming(stream, self), peer, self, connections);
    }

    fn alpn(&self) -> &'static [u8] {
        ALPN_H2
    }

    fn serve_tls(&self, stream: TlsStream, peer: SocketAddr, connections: &Arc<Connections>) {
        start_connection(Incoming::Secured(Box::new(stream)), peer, self, connections);
    }

    fn wait_ended(&self, timeout: Duration) -> bool {
        self.tasks.wait_idle(timeout)
    }
}

/// A connection as accepted, and what it still needs before HTTP/2.
enum Incoming {
    /// Plaintext: HTTP/2's preface is checked.
    Plain(TcpStream),
    /// The server's TLS handshake is to be done.
    Tls(TcpStream, Arc<rustls::ServerConfig>),
    /// TLS done (by a `tcps://` server, which agreed on HTTP/2 by ALPN).
    Secured(Box<TlsStream>),
}

/// Serves a connection accepted within the connection limit.
fn start_connection(
    incoming: Incoming,
    peer: SocketAddr,
    shared: &Shared,
    connections: &Arc<Connections>,
) {
    let scheme = match &incoming {
        Incoming::Plain(stream) => {
            let _ = stream.set_nodelay(true);
            "grpc"
        }
        Incoming::Tls(stream, _) => {
            let _ = stream.set_nodelay(true);
            "grpcs"
        }
        Incoming::Secured(_) => "grpcs",
    };
    let addr = format!("{scheme}://{peer}");
    let conn = GrpcConn::new(
        addr.clone(),
        Side::Server,
        shared.dispatcher.config().max_message_size,
        shared.config.read_budget,
        shared.config.write_queue,
    );
    let dispatch = ConnectionDispatch::new(
        shared.dispatcher.clone(),
        conn.clone(),
        Peer::anonymous(addr),
    );
    let served = Served {
        link: conn.clone() as Arc<dyn ServedLink>,
        dispatch: dispatch.clone(),
    };
    let Some(forget) = connections.add(served) else {
        return;
    };
    conn.set_upper(Arc::new(Requests::new(dispatch).on_closed_then(forget)));
    // Subscribed before the task starts: a shutdown that comes first is not missed.
    let phase = conn.phase();
    let config = shared.config.clone();
    let server = shared.side.clone();
    let serving = serve_connection(incoming, conn, server, phase, config);
    tokio::spawn(shared.tasks.track(serving));
}

/// The connection as accepted (plaintext, or TLS as the server's configuration says).
fn incoming(stream: TcpStream, shared: &Shared) -> Incoming {
    match &shared.tls {
        None => Incoming::Plain(stream),
        Some(tls) => Incoming::Tls(stream, tls.clone()),
    }
}

/// Serves one connection over HTTP/2 until it ends or the server closes it.
async fn serve_connection(
    incoming: Incoming,
    conn: Arc<GrpcConn>,
    server: Arc<ServerSide>,
    mut phase: watch::Receiver<Phase>,
    config: GrpcServerConfig,
) {
    let ended = match incoming {
        Incoming::Plain(stream) => match preface(&stream, config.handshake_timeout).await {
            Ok(()) => serve_http2(stream, &conn, server, &mut phase, &config).await,
            Err(why) => Err(why),
        },
        Incoming::Tls(stream, tls) => {
            match tls_handshake(stream, tls, config.handshake_timeout).await {
                Ok(stream) => serve_http2(stream, &conn, server, &mut phase, &config).await,
                Err(why) => Err(why),
            }
        }
        Incoming::Secured(stream) => serve_http2(*stream, &conn, server, &mut phase, &config).await,
    };
    let status = match ended {
        Ok(()) => Status::unavailable(format!("{} closed the connection", conn.peer)),
        Err(why) => {
            tracing::debug!(peer = %conn.peer, %why, "gRPC connection ended");
            Status::unavailable(format!("{}: {why}", conn.peer))
        }
    };
    conn.on_closed(status);
}

/// Waits for the client's HTTP/2 preface, at most `timeout`, without taking it (hyper
/// reads it).
async fn preface(stream: &TcpStream, timeout: Duration) -> Result<(), String> {
    let mut seen = [0u8; PREFACE.len()];
    let wait = async {
        loop {
            let n = stream.peek(&mut seen).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the client closed the connection before its preface".to_owned());
            }
            if seen[..n] != PREFACE[..n] {
                let why = "the client does not speak HTTP/2 (no HTTP/2 preface), which gRPC needs";
                answer_http1(stream, seen[0], why);
                return Err(why.to_owned());
            }
            if n == PREFACE.len() {
                return Ok(());
            }
            // Part of it: the rest follows (peeking again at once would find the same).
            tokio::time::sleep(PREFACE_RECHECK).await;
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .unwrap_or_else(|_| Err(format!("no HTTP/2 preface within {timeout:?}")))
}

/// The server's side of the TLS handshake, at most `timeout`; it must agree on HTTP/2.
async fn tls_handshake(
    stream: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    timeout: Duration,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, String> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let stream = tokio::time::timeout(timeout, acceptor.accept(stream))
        .await
        .map_err(|_| format!("no TLS handshake within {timeout:?}"))?
        .map_err(|e| format!("TLS handshake: {e}"))?;
    if !agreed_h2(stream.get_ref().1.alpn_protocol()) {
        return Err("the client's TLS agreed on a protocol other than HTTP/2".to_owned());
    }
    Ok(stream)
}

async fn serve_http2<S>(
    stream: S,
    conn: &Arc<GrpcConn>,
    server: Arc<ServerSide>,
    phase: &mut watch::Receiver<Phase>,
    config: &GrpcServerConfig,
) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        // A response's headers are its metadata: nothing of hyper's own.
        .auto_date_header(false)
        .max_concurrent_streams(
            u32::try_from(server.dispatcher.config().max_calls_per_connection).unwrap_or(u32::MAX),
        )
        .max_header_list_size(config.max_header_list_size)
        .max_frame_size(MAX_FRAME_SIZE as u32)
        .max_send_buf_size(HTTP2_SEND_BUFFER)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .keep_alive_interval(config.keepalive)
        .keep_alive_timeout(config.keepalive_timeout);
    let calls = conn.clone();
    let service = hyper::service::service_fn(move |request| {
        crate::call::serve(calls.clone(), server.clone(), request)
    });
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    // The idle timer runs beside the connection, not in the select below: that select is
    // polled on every wake of the connection (several per call), a timer there would be
    // polled as often.
    let idle = tokio::spawn(drain_when_idle(conn.clone(), config.idle_timeout));
    let _idle = AbortOnDrop(idle);
    let mut now = *phase.borrow_and_update();
    loop {
        if now != Phase::Serving {
            connection.as_mut().graceful_shutdown();
        }
        if now == Phase::Closed {
            return match tokio::time::timeout(CLOSE_LINGER, connection.as_mut()).await {
                Ok(ended) => ended.map_err(|e| e.to_string()),
                Err(_) => Err("closed by the server's shutdown".to_owned()),
            };
        }
        tokio::select! {
            biased;
            ended = connection.as_mut() => return ended.map_err(|e| e.to_string()),
            changed = phase.changed() => {
                now = if changed.is_ok() { *phase.borrow_and_update() } else { Phase::Closed };
            }
        }
    }
}

/// Drains `conn` (GOAWAY; a running call is not cut) once it has had no call for
/// `idle_timeout`; looks again whenever the time it would have been idle for that long
/// comes while a call runs, or came in between.
async fn drain_when_idle(conn: Arc<GrpcConn>, idle_timeout: Duration) {
    loop {
        let Some(until) = conn
            .idle_since()
            .unwrap_or_else(Instant::now)
            .checked_add(idle_timeout)
        else {
            return;
        };
        tokio::time::sleep_until(until.into()).await;
        if conn
            .idle_since()
            .is_some_and(|since| since.elapsed() >= idle_timeout)
        {
            tracing::debug!(peer = %conn.peer, "closing an idle connection");
            return conn.drain();
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The server's tasks still running (the accept loop, each connection's), so that a
/// shutdown lets them end before it drops their runtime.
#[derive(Debug, Clone, Default)]
struct TaskCount(Arc<(Mutex<usize>, Condvar)>);

/// Counts its task until dropped, however the task ends.
struct Tracked(TaskCount);

impl Drop for Tracked {
    fn drop(&mut self) {
        let (count, ended) = &*(self.0).0;
        *count.lock() -= 1;
        ended.notify_all();
    }
}

impl TaskCount {
    /// `task`, counted from now until it ends or is dropped.
    fn track<F: std::future::Future>(
        &self,
        task: F,
    ) -> impl std::future::Future<Output = F::Output> {
        *self.0 .0.lock() += 1;
        let tracked = Tracked(self.clone());
        async move {
            let _tracked = tracked;
            task.await
        }
    }

    /// Waits until no task runs, at most `timeout`; whether none does.
    fn wait_idle(&self, timeout: Duration) -> bool {
        let (count, ended) = &*self.0;
        let until = Instant::now() + timeout;
        let mut count = count.lock();
        while *count > 0 {
            if ended.wait_until(&mut count, until).timed_out() {
                return *count == 0;
            }
        }
        true
    }
}
