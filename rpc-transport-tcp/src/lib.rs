//! TCP transport for rdma-rpc: the frames of `docs/PROTOCOL.md` back to back on a stream.
//!
//! Both sides run on an event loop (tokio), with no thread per connection:
//!
//! * [`TcpClient`]: a frame is written on the caller's thread when the socket takes it at
//!   once (no hand-off on the latency path), else queued for the client event loop (one
//!   thread per process), which also reads responses and completes calls; a blocking
//!   caller waiting for its answer reads the socket itself while no other thread does
//!   (`TcpConfig::caller_reads`), so it is not woken by the loop either.
//! * [`TcpServer`]: its own event loop (`TcpServerConfig::io_threads`) accepts, reads
//!   requests and writes answers; handlers run on the dispatcher's runtime (or inline, see
//!   `ServerConfig::inline_handlers`).
//! * Every connection's output is a bounded queue ([`ConnectionLimits`]): async senders
//!   wait as `Pending`, no thread ever parks on a socket except a blocking stub's own, and a
//!   peer that stops reading is disconnected after the stall limit.
//! * [`codec`]: frame decoding (sans-IO, sized by the bytes that arrived) and encoding.

mod client;
pub mod codec;
mod config;
mod conn;
mod deadline;
pub mod handshake;
mod metrics;
mod outbox;
mod reader;
mod server;
mod socket;
pub mod sockets;
pub mod tls;

pub use client::TcpClient;
pub use config::{ConnectionLimits, TcpConfig, TcpServerConfig, DEFAULT_KEEPALIVE};
pub use server::TcpServer;
