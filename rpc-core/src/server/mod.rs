//! The server side: services, routing by method id, dispatch onto a handler runtime.
//!
//! ```no_run
//! # fn demo(echo: impl rpc_core::server::Service) -> Result<(), rpc_core::Error> {
//! let dispatcher = rpc_core::Server::builder()
//!     .max_message_size(16 << 20)
//!     .add_service(echo)
//!     .build()?;
//! // A transport then serves `dispatcher` on a URL (see the `rdma-rpc` crate).
//! # Ok(()) }
//! ```

mod answer;
mod calls;
mod config;
mod dispatch;
mod in_flight;
mod intercepted;
mod layer;
mod requests;
mod reuse;
mod router;
mod service;
mod shutdown;
mod sink;
mod stream_reply;
mod streams;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use crate::MethodKind;
pub use dispatch::{
    ConnectionDispatch, Dispatcher, ReplySink, ServerConfig, DEFAULT_MAX_CALLS,
    DEFAULT_MAX_CALLS_PER_CONNECTION,
};
pub use intercepted::InterceptedService;
pub use layer::CallStack;
pub use requests::{OnClosed, Requests};
pub use reuse::{HandlerFuture, ReplyBody};
pub use service::{
    client_streaming, server_streaming, streaming, unary, MethodDescriptor, NamedService,
    ServerCall, ServerReply, Service,
};
pub use shutdown::{shut_down, Served, ServedLink, FLUSH_AT_LEAST};

use crate::error::Error;
use layer::{Layers, Wrap};
use router::Router;

/// Entry point of the server API.
#[derive(Debug)]
pub struct Server;

impl Server {
    /// A builder with default settings and no services.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }
}

/// Collects services and settings; [`ServerBuilder::build`] checks them.
#[derive(Default)]
pub struct ServerBuilder {
    services: Vec<Arc<dyn Service>>,
    layers: Vec<Wrap>,
    config: ServerConfig,
    runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field(
                "services",
                &self.services.iter().map(|s| s.name()).collect::<Vec<_>>(),
            )
            .field("layers", &self.layers.len())
            .field("config", &self.config)
            .finish()
    }
}

impl ServerBuilder {
    /// Hosts `service` (a generated `FooServer`).
    pub fn add_service(mut self, service: impl Service) -> Self {
        self.services.push(Arc::new(service));
        self
    }

    /// Wraps every call the server runs, unary and streaming, in `layer` (tonic's
    /// `Server::builder().layer(...)`): tower's timeout, concurrency limit and load shed,
    /// or any layer over a [`CallStack`]. Layers added first are outermost, as in
    /// `tower::ServiceBuilder`. A layer's error ends the call with the status
    /// [`status_from_error`](crate::error::status_from_error) gives it (`DEADLINE_EXCEEDED`
    /// for a timeout, `UNAVAILABLE` for a load shed). A call waiting in a layer (for a
    /// concurrency limit's permit, say) counts against the server's call limits and runs
    /// under its deadline like a handler.
    ///
    /// ```no_run
    /// # fn demo(echo: impl rpc_core::server::Service) -> Result<(), rpc_core::Error> {
    /// use std::time::Duration;
    /// let dispatcher = rpc_core::Server::builder()
    ///     .layer(
    ///         tower::ServiceBuilder::new()
    ///             .load_shed()
    ///             .concurrency_limit(64)
    ///             .timeout(Duration::from_secs(2))
    ///             .into_inner(),
    ///     )
    ///     .add_service(echo)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: tower::Layer<CallStack> + Send + 'static,
        L::Service:
            tower::Service<ServerCall, Response = ServerReply> + Clone + Send + Sync + 'static,
        <L::Service as tower::Service<ServerCall>>::Error: Into<tower::BoxError>,
        <L::Service as tower::Service<ServerCall>>::Future: Send + 'static,
    {
        self.layers.push(Box::new(move |inner| {
            CallStack::new(tower::ServiceExt::map_err(layer.layer(inner), Into::into))
        }));
        self
    }

    /// Largest encoded request accepted and response sent (default 4 MiB).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.config.max_message_size = bytes;
        self
    }

    /// What a client may send on one stream before its handler reads it (default
    /// [`crate::stream::DEFAULT_STREAM_WINDOW`]; never less than
    /// [`crate::stream::INITIAL_WINDOW`]).
    pub fn stream_window(mut self, window: crate::stream::Window) -> Self {
        self.config.stream_window = window;
        self
    }

    /// Stream frames one connection may hold for calls whose request has not arrived yet
    /// (default [`crate::stream::INITIAL_WINDOW`]: 64 messages, 256 KiB of payload); past
    /// it the frames of the call that began holding first are dropped (see
    /// [`ServerConfig::early_stream_frames`]).
    pub fn early_stream_frames(mut self, limit: crate::stream::Window) -> Self {
        self.config.early_stream_frames = limit;
        self
    }

    /// Whether handlers are first polled on the receiving thread (default true).
    pub fn inline_handlers(mut self, inline: bool) -> Self {
        self.config.inline_handlers = inline;
        self
    }

    /// Offers `landings` for large request bodies ([`ServerConfig::request_landings`]):
    /// over `rdma://` a body lands in the first free landing large enough for it (a
    /// registered buffer nothing views any more), and the handler's `bytes` fields are
    /// views of it; the buffer goes back to its landing once they are dropped. Other
    /// transports leave the landings alone.
    pub fn land_requests_in(mut self, landings: impl IntoIterator<Item = crate::Landing>) -> Self {
        self.config.request_landings.extend(landings);
        self
    }

    /// Offers `landings` for the large request bodies of the method at `path`
    /// (`/package.Service/Method`) alone ([`ServerConfig::method_landings`]): over
    /// `rdma://` its body lands in the first of them free and large enough, before any
    /// landing of [`ServerBuilder::land_requests_in`] is tried, so each handler's bodies
    /// arrive where it wants them. Other transports leave the landings alone.
    pub fn land_method_requests_in(
        mut self,
        path: &str,
        landings: impl IntoIterator<Item = crate::Landing>,
    ) -> Self {
        let method = crate::method_id(path);
        self.config
            .method_landings
            .extend(landings.into_iter().map(|landing| (method, landing)));
        self
    }

    /// Worker threads of the server's own runtime, when none is given or current.
    pub fn worker_threads(mut self, threads: usize) -> Self {
        self.config.worker_threads = threads;
        self
    }

    /// Calls one connection may have in progress; requests beyond are answered
    /// `RESOURCE_EXHAUSTED` (default [`DEFAULT_MAX_CALLS_PER_CONNECTION`]).
    pub fn max_calls_per_connection(mut self, calls: usize) -> Self {
        self.config.max_calls_per_connection = calls;
        self
    }

    /// Who may connect: peers are authenticated when they connect, before the server
    /// builds anything for them, and handlers see who they are ([`crate::Request::peer`]).
    pub fn auth(mut self, auth: crate::auth::AuthConfig) -> Self {
        self.config.auth = Some(auth);
        self
    }

    /// Calls all connections may have in progress; requests beyond are answered
    /// `RESOURCE_EXHAUSTED` (default [`DEFAULT_MAX_CALLS`]).
    pub fn max_calls(mut self, calls: usize) -> Self {
        self.config.max_calls = calls;
        self
    }

    /// Runs handlers on `runtime` instead of the current or an owned one.
    pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The settings so far.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Checks the services (no duplicate method ids) and creates the dispatcher.
    pub fn build(self) -> Result<Arc<Dispatcher>, Error> {
        let mut router = Router::default();
        for service in self.services {
            router.add(service)?;
        }
        tracing::debug!(methods = ?router.paths().collect::<Vec<_>>(), "server routes");
        let router = Arc::new(router);
        let layers = Layers::new(router.clone(), self.layers);
        Ok(Arc::new(Dispatcher::new(
            router,
            layers,
            self.config,
            self.runtime,
        )?))
    }
}
