//! The server side: an event loop that accepts connections and drives all of them.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::auth::Checker;
use rpc_core::server::{shut_down, Dispatcher};

use crate::config::TcpServerConfig;
use crate::sockets::{listen, Connections, OtherProtocol, ServedConnections};
use crate::tls::ALPN_RPC;

mod accept;

use accept::accepted;

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

    /// [`TcpServer::bind`], and serves a connection whose first byte is `other`'s (or, with
    /// TLS, whose handshake agreed on `other`'s protocol) in `other`'s protocol (gRPC's
    /// HTTP/2, say) on the same port, sharing the connection limit and the graceful
    /// shutdown. A server that authenticates connections
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
        let scheme = scheme(config.tls.is_some());
        let (runtime, listener) = listen(scheme, addr, config.io_threads, "rpc-tcp-server")?;
        let auth = dispatcher.config().auth.clone().map(Checker::new);
        let tls = config.tls.as_ref().map(|tls| match &other {
            None => tls.config(ALPN_RPC),
            Some(other) => tls.config_for(&[ALPN_RPC, other.alpn()]),
        });
        let shared = Arc::new(Shared {
            auth,
            other,
            tls,
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

/// The scheme of a server's URLs: `tcps` with TLS.
fn scheme(tls: bool) -> &'static str {
    if tls {
        "tcps"
    } else {
        "tcp"
    }
}
