//! Settings of a gRPC server.

use std::time::Duration;

use rpc_core::transport::{DEFAULT_KEEPALIVE, DEFAULT_KEEPALIVE_TIMEOUT};

/// Largest header block a client may send, in HTTP/2's measure (names, values and 32
/// bytes per entry): room for our 16 KiB of metadata and HTTP's own headers.
pub const DEFAULT_MAX_HEADER_LIST_SIZE: u32 = 32 * 1024;
/// Connections a server serves at once unless configured.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

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
}

impl Default for GrpcServerConfig {
    fn default() -> Self {
        GrpcServerConfig {
            io_threads: 1,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_header_list_size: DEFAULT_MAX_HEADER_LIST_SIZE,
            keepalive: Some(DEFAULT_KEEPALIVE),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
        }
    }
}
