//! rdma-rpc: protobuf RPC over RDMA, with the same stubs over TCP.
//!
//! Generated stubs (see `rpc-codegen`) take a [`Channel`]; this crate makes one from a URL
//! and serves a [`Server`] on a URL. The URL's scheme picks the transport: `tcp://host:port`
//! runs anywhere, `rdma://host:port` uses RC queue pairs.
//!
//! ```no_run
//! use rdma_rpc::prelude::*;
//! # async fn demo() -> Result<(), rdma_rpc::Error> {
//! let channel = rdma_rpc::connect("tcp://127.0.0.1:50051").await?;
//! // let client = echo_client::EchoClient::new(channel);
//! # let _ = channel; Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod balance;
mod connector;
mod dns;
mod endpoint;
mod error;
mod schemes;
mod serve;

use std::sync::Arc;
use std::time::Duration;

use connector::UrlConnector;

pub use balance::Discovery;
pub use dns::{Resolve, SystemResolver, DEFAULT_DNS_REFRESH, MAX_RESOLVED_ADDRESSES};
pub use endpoint::{Endpoint, TransportKind};
pub use error::Error;
pub use rpc_core::*;
pub use rpc_transport_grpc::{ClientTls, GrpcClientConfig, GrpcServerConfig, ServerTls, TlsError};
/// gRPC over HTTP/2 (`grpc://`): its settings and the windows HTTP/2 adds to ours.
pub mod grpc {
    pub use rpc_transport_grpc::*;
}
pub use rpc_transport_rdma::verbs::{fork_init, fork_status, ForkStatus};
pub use rpc_transport_rdma::{
    large_body_bytes, process_limits, process_usage, set_process_limits, LargeBodies,
    LargeBodyBytes, Liveness, Nic, PollMode, Polling, ProcessLimits, ProcessUsage, RdmaConfig,
    Receives, RegisteredBuffer, Rings, SharedRecvConfig, DEFAULT_KEEPALIVE, DEFAULT_SHARED_WINDOW,
};
pub use rpc_transport_tcp::{ConnectionLimits, TcpServerConfig};
pub use serve::{ServeExt, ServeOptions, ServerHandle};

/// The standard `grpc.health.v1.Health` service and its reporter ([`rpc_health`]).
pub use rpc_health as health;
pub use rpc_reflection as reflection;

/// What most applications import.
pub mod prelude {
    pub use crate::ServeExt;
    pub use rpc_core::{
        Channel, Code, IntoRequest, IntoStreamingRequest, Request, Response, Server, Status,
        Streaming,
    };
}

/// Connection settings; [`ClientBuilder::connect`] opens a [`Channel`].
///
/// ```no_run
/// # async fn demo() -> Result<(), rdma_rpc::Error> {
/// let channel = rdma_rpc::client()
///     .max_message_size(64 << 20)
///     .timeout(std::time::Duration::from_secs(2))
///     .connect("tcp://127.0.0.1:50051")
///     .await?;
/// # let _ = channel; Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClientBuilder {
    channel: ChannelConfig,
    connect_timeout: Option<Duration>,
    rdma: RdmaConfig,
    tcp: ConnectionLimits,
    /// `TcpConfig::caller_reads`; `None`: its default.
    tcp_caller_reads: Option<Duration>,
    credentials: Option<auth::Credentials>,
    reconnect: ReconnectConfig,
    grpc: GrpcClientConfig,
    tls: Option<ClientTls>,
    tls_server_name: Option<String>,
}

/// A [`ClientBuilder`] with default settings.
pub fn client() -> ClientBuilder {
    ClientBuilder::default()
}

/// Connects to `url` with default settings; the channel heals (see [`Channel::healing`]).
pub async fn connect(url: &str) -> Result<Channel, Error> {
    client().connect(url).await
}

/// Blocking form of [`connect`].
pub fn connect_blocking(url: &str) -> Result<Channel, Error> {
    client().connect_blocking(url)
}

impl ClientBuilder {
    /// Largest encoded request sent and response accepted (default 4 MiB).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.channel.max_message_size = bytes;
        self
    }

    /// What a server may send on one stream before it is read (default
    /// [`rpc_core::stream::DEFAULT_STREAM_WINDOW`]; never less than
    /// [`rpc_core::stream::INITIAL_WINDOW`]).
    pub fn stream_window(mut self, window: rpc_core::stream::Window) -> Self {
        self.channel.stream_window = window;
        self
    }

    /// Time budget of calls that set none themselves.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.channel.default_timeout = Some(timeout);
        self
    }

    /// How long establishing the connection may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// HTTP/2 settings of `grpc://` and `grpcs://` connections, and the authorities a
    /// `grpcs://` connection trusts (its message size limit and connect timeout are this
    /// builder's own).
    pub fn grpc_config(mut self, config: GrpcClientConfig) -> Self {
        self.grpc = config;
        self
    }

    /// The authorities a `tcps://` or `grpcs://` connection trusts: the server's
    /// certificate must be signed by one (for `grpcs://`, `GrpcClientConfig::tls` wins if
    /// set). A URL says whether traffic is encrypted: a TLS scheme without authorities, or
    /// a plaintext one with them, is refused.
    pub fn tls(mut self, authorities: ClientTls) -> Self {
        self.tls = Some(authorities);
        self
    }

    /// The name the server's certificate must carry, if not the URL's host (a balanced
    /// channel's URLs hold resolved addresses: give it the certificate's name).
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = Some(name.into());
        self
    }

    /// Ring geometry and polling of `rdma://` connections.
    pub fn rdma_config(mut self, config: RdmaConfig) -> Self {
        self.rdma = config;
        self
    }

    /// Authenticates with `credentials` when connecting, on either transport; the server
    /// must prove it holds the same secret (see [`auth`]).
    pub fn credentials(mut self, credentials: auth::Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Output queue bound, stall limit and read timeout of `tcp://` connections.
    pub fn tcp_limits(mut self, limits: ConnectionLimits) -> Self {
        self.tcp = limits;
        self
    }

    /// Longest a blocking call over `tcp://` reads the socket for its answer itself before
    /// it parks and the event loop reads and wakes it (default 20 ms; `Duration::ZERO`: the
    /// event loop reads every answer).
    pub fn tcp_caller_reads(mut self, wait: Duration) -> Self {
        self.tcp_caller_reads = Some(wait);
        self
    }

    /// How the channel replaces a connection that died, and what calls do meanwhile
    /// (default [`ReconnectConfig::default`]: backoff from 100 ms to 10 s with ±20% jitter,
    /// calls fail fast while attempts fail).
    pub fn reconnect(mut self, config: ReconnectConfig) -> Self {
        self.reconnect = config;
        self
    }

    /// Calls made while the server is unreachable wait for a connection (until their
    /// deadline) instead of failing at once ([`ReconnectConfig::wait_for_ready`]).
    pub fn wait_for_ready(mut self, wait: bool) -> Self {
        self.reconnect.wait_for_ready = wait;
        self
    }

    /// Connects without blocking the calling task: the handshake runs on a helper thread,
    /// so this works on any executor. Fails if this first connection fails; after that the
    /// channel heals (see [`Channel::healing`]).
    pub async fn connect(self, url: &str) -> Result<Channel, Error> {
        let url = url.to_owned();
        let (tx, rx) = futures::channel::oneshot::channel();
        std::thread::Builder::new()
            .name("rpc-connect".into())
            .spawn(move || {
                let _ = tx.send(self.connect_blocking(&url));
            })?;
        rx.await
            .unwrap_or_else(|_| Err(Error::Connect(Status::internal("connect thread died"))))
    }

    /// Connects on the calling thread; see [`ClientBuilder::connect`].
    pub fn connect_blocking(self, url: &str) -> Result<Channel, Error> {
        let connector = Arc::new(UrlConnector::new(url, self.clone())?);
        let first = connector.connect()?;
        Ok(Channel::healing(
            connector,
            Some(first),
            self.reconnect,
            self.channel,
        ))
    }

    /// A channel that connects at its first call (only the URL is checked now), then heals.
    pub fn connect_lazy(self, url: &str) -> Result<Channel, Error> {
        let connector = Arc::new(UrlConnector::new(url, self.clone())?);
        Ok(Channel::healing(
            connector,
            None,
            self.reconnect,
            self.channel,
        ))
    }
}
