//! TCP transport for rdma-rpc: the frames of `docs/PROTOCOL.md` back to back on a stream.
//!
//! * [`TcpClient`]: writes on the caller's thread, one reader thread per connection.
//! * [`TcpServer`]: an accept thread, one reader thread per connection; handlers run on the
//!   dispatcher's runtime (or inline, see `ServerConfig::inline_handlers`).
//! * [`codec`]: frame reading and writing over any byte stream.

mod client;
pub mod codec;
mod server;

pub use client::{TcpClient, TcpConfig};
pub use server::TcpServer;
