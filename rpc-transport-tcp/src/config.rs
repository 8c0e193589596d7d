//! Settings of TCP connections, clients and servers.

use std::time::Duration;

use crate::tls::{ClientTls, ServerTls};

/// Bounds every TCP connection applies, on either side.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Bytes of encoded frames a connection queues for its socket. A frame is accepted while
    /// the queue holds less than this (a lone frame may be larger); past it, async senders
    /// wait as `Pending`, blocking ones park, and a server stops reading the connection's
    /// requests until its peer takes some replies.
    pub write_queue: usize,
    /// Longest the socket may refuse every byte of a non-empty queue: a peer that stops
    /// reading that long is disconnected and its calls fail with `UNAVAILABLE`.
    pub stall_limit: Duration,
    /// Longest a frame may take to arrive once its first byte has: a peer that trickles a
    /// frame is disconnected.
    pub read_timeout: Duration,
    /// Idle time after which the kernel probes the peer (TCP keepalive); `None`: never. A
    /// peer whose host died or lost its network answers no probe, and the connection is
    /// closed after `keepalive_timeout` more, its calls failing with `UNAVAILABLE`.
    pub keepalive: Option<Duration>,
    /// Longest the peer may leave probes, or data we sent, unacknowledged before it is
    /// declared dead (`TCP_USER_TIMEOUT`, and keepalive probes every third of it).
    pub keepalive_timeout: Duration,
}

pub use rpc_core::transport::DEFAULT_KEEPALIVE;
use rpc_core::transport::{DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_STALL_LIMIT};
/// Keepalive probes sent before the peer is declared dead.
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            write_queue: 1 << 20,
            stall_limit: DEFAULT_STALL_LIMIT,
            read_timeout: Duration::from_secs(30),
            keepalive: Some(DEFAULT_KEEPALIVE),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
        }
    }
}

/// TCP client settings.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// How long to wait for the TCP handshake with each resolved address; then as long
    /// again for the TLS handshake (`tls`), and as long for authentication (`credentials`).
    pub connect_timeout: Duration,
    /// Largest payload accepted from the peer.
    pub max_message_size: usize,
    /// Queue, stall and read bounds of the connection.
    pub limits: ConnectionLimits,
    /// What to authenticate with (`rpc_core::auth`); the server must prove it holds the
    /// same secret. `None`: connect without credentials.
    pub credentials: Option<rpc_core::auth::Credentials>,
    /// Longest a blocking caller waits in the socket for its answer, reading it itself
    /// while no other thread reads the connection, before it parks and the event loop
    /// reads the answer and wakes it (a thread hand-off more). Longer than a call takes:
    /// blocking calls pay no hand-off; a call's deadline ends the wait sooner.
    /// `Duration::ZERO`: the event loop reads every answer. Default 20 ms.
    pub caller_reads: Duration,
    /// Connect over TLS (`tcps://`), trusting these authorities; `None`: plaintext.
    pub tls: Option<ClientTls>,
    /// The name the server's certificate must carry, if not the host connected to (a
    /// balanced channel's URLs hold resolved addresses: give it the certificate's name).
    pub tls_server_name: Option<String>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            credentials: None,
            connect_timeout: Duration::from_secs(5),
            max_message_size: rpc_core::client::DEFAULT_MAX_MESSAGE_SIZE,
            limits: ConnectionLimits::default(),
            caller_reads: Duration::from_millis(20),
            tls: None,
            tls_server_name: None,
        }
    }
}

/// TCP server settings (the message size limit is the dispatcher's).
#[derive(Debug, Clone)]
pub struct TcpServerConfig {
    /// Connections served at once (those handshaking count). One more is accepted, told
    /// `RESOURCE_EXHAUSTED` naming the limit (a status frame for call id 0) and closed; over
    /// TLS it is closed before its handshake, and on a port shared with gRPC one whose
    /// HTTP/2 preface already arrived is closed without a word, as a `grpc://` server does.
    pub max_connections: usize,
    /// A connection with no call running, nothing queued and nothing received for this long
    /// is closed.
    pub idle_timeout: Duration,
    /// Threads of the event loop that owns the server's sockets (handlers run on the
    /// dispatcher's runtime, or inline on these threads, see `ServerConfig::inline_handlers`).
    pub io_threads: usize,
    /// Queue, stall and read bounds of each connection.
    pub limits: ConnectionLimits,
    /// Longest a new connection may take for its TLS handshake (`tls`), and to send its
    /// credentials (with `ServerConfig::auth`; it is refused `UNAUTHENTICATED` after).
    pub handshake_timeout: Duration,
    /// Serve over TLS (`tcps://`) with this certificate; `None`: plaintext (`tcp://`).
    pub tls: Option<ServerTls>,
}

impl Default for TcpServerConfig {
    fn default() -> Self {
        TcpServerConfig {
            handshake_timeout: Duration::from_secs(5),
            max_connections: 10_000,
            idle_timeout: Duration::from_secs(3600),
            io_threads: 1,
            limits: ConnectionLimits::default(),
            tls: None,
        }
    }
}
