//! gRPC over HTTP/2 for rdma-rpc, as `grpc://host:port`: a server's services answered to
//! any gRPC client (grpcio, grpc-go, tonic, grpcurl), and our generated clients calling any
//! gRPC server.
//!
//! HTTP/2 is hyper's. Each HTTP/2 request becomes a call of our protocol, handed to the
//! server's dispatcher like a call that arrived over `tcp://` or `rdma://`, so routing,
//! limits, deadlines, cancellation, interceptors, tower layers, observation and graceful
//! shutdown are the same code on every transport. How gRPC's headers, statuses, deadlines
//! and metadata map onto ours is in `docs/PROTOCOL.md` ("gRPC over HTTP/2").

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod body;
mod call;
mod client;
mod codec;
mod config;
mod conn;
mod exchange;
#[doc(hidden)]
pub mod fuzzing;
mod headers;
mod pump;
mod server;
mod tls;

pub use client::{GrpcClient, GrpcClientConfig};
pub use config::{
    GrpcServerConfig, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_LIST_SIZE, DEFAULT_READ_BUDGET,
    HTTP2_CONNECTION_WINDOW, HTTP2_SEND_BUFFER, HTTP2_STREAM_WINDOW,
};
pub use server::GrpcServer;
pub use tls::{ClientTls, ServerTls, TlsError};
