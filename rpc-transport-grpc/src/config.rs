//! Settings of a gRPC server.

use std::time::Duration;

use rpc_core::transport::{DEFAULT_KEEPALIVE, DEFAULT_KEEPALIVE_TIMEOUT};

/// Largest header block a client may send, in HTTP/2's measure (names, values and 32
/// bytes per entry): room for our 16 KiB of metadata and HTTP's own headers.
pub const DEFAULT_MAX_HEADER_LIST_SIZE: u32 = 32 * 1024;
/// Connections a server serves at once unless configured.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// HTTP/2's window of each stream, both sides (`SETTINGS_INITIAL_WINDOW_SIZE`): how far a
/// peer may send a stream's bytes ahead of their reader, beyond our own stream windows.
pub const HTTP2_STREAM_WINDOW: u32 = 1 << 20;
/// HTTP/2's window of a whole connection, both sides: sixteen streams' worth, so that a few
/// streams whose readers stall leave room for the connection's other calls.
pub const HTTP2_CONNECTION_WINDOW: u32 = 16 << 20;
/// Bytes hyper buffers per stream for sending (its default is 400 KiB): messages wait in
/// the calls' queues instead, under the `write_queue` bound.
pub const HTTP2_SEND_BUFFER: usize = 64 * 1024;

/// Largest HTTP/2 frame payload the server accepts (HTTP/2's minimum and default
/// `SETTINGS_MAX_FRAME_SIZE`): a request body arrives in chunks of at most this.
pub(crate) const MAX_FRAME_SIZE: usize = 16 * 1024;
/// Bytes of request messages a connection holds while they arrive, unless configured.
pub const DEFAULT_READ_BUDGET: usize = 64 << 20;

/// gRPC server settings. Calls per connection, message sizes and the rest of what every
/// transport shares are the server's own (`ServerConfig`); these are HTTP/2's.
#[derive(Debug, Clone)]
pub struct GrpcServerConfig {
    /// Threads of the event loop that drives the connections (and runs handlers that
    /// finish without waiting).
    pub io_threads: usize,
    /// Connections served at once; one accepted past it is closed at once.
    pub max_connections: usize,
    /// Largest header block of a request (HTTP/2's `SETTINGS_MAX_HEADER_LIST_SIZE`); a
    /// larger one is refused by HTTP/2 before it reaches a handler.
    pub max_header_list_size: u32,
    /// Idle time after which the server pings the client (HTTP/2 PING); `None`: never.
    pub keepalive: Option<Duration>,
    /// Longest a ping may go unanswered before the connection is closed and its calls
    /// cancelled.
    pub keepalive_timeout: Duration,
    /// Longest a new plaintext connection may take to send HTTP/2's preface; one that does
    /// not (or sends something else) is closed. Over TLS it bounds the TLS handshake, and a
    /// client silent after it is closed after `idle_timeout`.
    pub handshake_timeout: Duration,
    /// A connection with no call for this long is closed gracefully (GOAWAY; a client
    /// reconnects when it next calls).
    pub idle_timeout: Duration,
    /// Longest the request message of a unary or server-streaming call may take to
    /// arrive whole (its `grpc-timeout` ends the wait sooner); past it the call fails
    /// with `DEADLINE_EXCEEDED` and its handler never runs.
    pub request_read_timeout: Duration,
    /// Bytes of request messages a connection holds while they arrive (a message is held
    /// until it is whole, then handed to its call). A chunk that would take the
    /// connection past it fails its call with `RESOURCE_EXHAUSTED`; at least the server's
    /// `max_message_size` (and a chunk) is allowed, so a lone message always fits.
    pub read_budget: usize,
    /// Bytes of response messages a connection's calls queue for HTTP/2 (which takes them
    /// as its windows allow); past it, the server's senders wait. Statuses and trailers
    /// always go.
    pub write_queue: usize,
    /// The certificate `grpcs://` serves with (required there; `grpc://` is plaintext).
    /// The TLS handshake must end within `handshake_timeout`, and agree on HTTP/2.
    pub tls: Option<crate::ServerTls>,
}

impl Default for GrpcServerConfig {
    fn default() -> Self {
        GrpcServerConfig {
            io_threads: 1,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_header_list_size: DEFAULT_MAX_HEADER_LIST_SIZE,
            keepalive: Some(DEFAULT_KEEPALIVE),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(3600),
            request_read_timeout: Duration::from_secs(30),
            read_budget: DEFAULT_READ_BUDGET,
            write_queue: 1 << 20,
            tls: None,
        }
    }
}
