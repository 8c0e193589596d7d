//! Serving a [`ServerBuilder`] on a URL.

use std::future::Future;
use std::time::Duration;

use rpc_core::{Listener, ServerBuilder};
use rpc_transport_grpc::GrpcServerConfig;
use rpc_transport_rdma::RdmaConfig;
use rpc_transport_tcp::TcpServerConfig;

use crate::endpoint::Endpoint;
use crate::error::Error;

/// Grace period handlers get when a server shuts down without an explicit one.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// Serving methods for [`rpc_core::ServerBuilder`].
///
/// ```no_run
/// use rdma_rpc::prelude::*;
/// # fn demo(echo: impl rdma_rpc::server::Service) -> Result<(), rdma_rpc::Error> {
/// let server = Server::builder().add_service(echo).start("tcp://0.0.0.0:50051")?;
/// println!("listening on {}", server.local_url());
/// server.shutdown_blocking(std::time::Duration::from_secs(1)); // or .shutdown(..).await
/// # Ok(()) }
/// ```
pub trait ServeExt {
    /// Starts serving on `url` in the background and returns a handle.
    fn start(self, url: &str) -> Result<ServerHandle, Error>
    where
        Self: Sized,
    {
        self.start_with(url, ServeOptions::default())
    }

    /// [`ServeExt::start`] with transport settings.
    fn start_with(self, url: &str, options: ServeOptions) -> Result<ServerHandle, Error>;

    /// Serves on `url` until `signal` resolves, then shuts down gracefully.
    fn serve_with_shutdown<F>(
        self,
        url: &str,
        signal: F,
    ) -> impl Future<Output = Result<(), Error>>
    where
        F: Future<Output = ()>;

    /// Serves on `url` until the process ends.
    fn serve(self, url: &str) -> impl Future<Output = Result<(), Error>>
    where
        Self: Sized,
    {
        self.serve_with_shutdown(url, std::future::pending())
    }
}

/// Transport settings of a server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Ring geometry and polling of `rdma://` connections.
    pub rdma: RdmaConfig,
    /// Connection limit, timeouts, queue bounds and event-loop threads of `tcp://`
    /// connections.
    pub tcp: TcpServerConfig,
    /// Connection limit, HTTP/2 header bound, keepalive and event-loop threads of
    /// `grpc://` connections.
    pub grpc: GrpcServerConfig,
    /// Whether a `tcp://` server also serves gRPC on its port, to the connections that
    /// open with HTTP/2's preface (and a `tcps://` server, inside TLS, to those that agree
    /// on HTTP/2 by ALPN), so that a fleet moves between the two wires without a second
    /// port, with `grpc`'s per-connection settings (its certificate is the port's). A
    /// server that authenticates connections (`ServerConfig::auth`) serves only its own
    /// frames there. Default `true`.
    pub grpc_on_tcp: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            rdma: RdmaConfig::default(),
            tcp: TcpServerConfig::default(),
            grpc: GrpcServerConfig::default(),
            grpc_on_tcp: true,
        }
    }
}

impl ServeExt for ServerBuilder {
    fn start_with(self, url: &str, options: ServeOptions) -> Result<ServerHandle, Error> {
        let endpoint: Endpoint = url.parse()?;
        let dispatcher = self.build()?;
        let scheme = endpoint.kind().scheme();
        let listener = (scheme.listen)(&endpoint.authority(), dispatcher, options)?;
        let local_url = format!("{}://{}", scheme.name, listener.local_addr());
        Ok(ServerHandle {
            local_url,
            listener,
        })
    }

    async fn serve_with_shutdown<F>(self, url: &str, signal: F) -> Result<(), Error>
    where
        F: Future<Output = ()>,
    {
        let handle = self.start(url)?;
        tracing::info!(url = handle.local_url(), "serving");
        signal.await;
        handle.shutdown(DEFAULT_GRACE).await;
        Ok(())
    }
}

/// A running server. Dropping it shuts it down gracefully.
#[derive(Debug)]
pub struct ServerHandle {
    local_url: String,
    listener: Box<dyn Listener>,
}

impl ServerHandle {
    /// The URL clients reach the server at (with the real port when started on port 0).
    pub fn local_url(&self) -> &str {
        &self.local_url
    }

    /// Stops accepting connections and new calls (new calls on open connections get
    /// `UNAVAILABLE`), gives running handlers up to `grace` to answer and their answers time
    /// to go out, then closes every connection. On either transport.
    ///
    /// Begins at once; the future resolves when the server is down. The work runs on a
    /// helper thread, so awaiting it never blocks the executor (handlers on the same
    /// runtime keep running and finish); dropping the future lets the shutdown finish in
    /// the background.
    pub fn shutdown(self, grace: Duration) -> impl Future<Output = ()> + Send + 'static {
        let (done, finished) = futures::channel::oneshot::channel::<()>();
        let (hand_over, handed) = std::sync::mpsc::channel::<ServerHandle>();
        let helper = std::thread::Builder::new()
            .name("rpc-shutdown".into())
            .spawn(move || {
                if let Ok(handle) = handed.recv() {
                    handle.shutdown_blocking(grace);
                    let _ = done.send(());
                }
            });
        match helper {
            Ok(_) => {
                // The helper waits on this very channel: the send cannot fail.
                let _ = hand_over.send(self);
            }
            Err(e) => {
                // No thread to spare: shut down here, as asked, rather than not at all.
                tracing::warn!("no thread for the shutdown ({e}): it runs on the caller's");
                self.shutdown_blocking(grace);
            }
        }
        async move {
            // The sender goes away only once the server is down (or the helper died).
            let _ = finished.await;
        }
    }

    /// The blocking form of [`ServerHandle::shutdown`], for synchronous code: the calling
    /// thread waits for the handlers and the close.
    pub fn shutdown_blocking(mut self, grace: Duration) {
        self.listener.shutdown(grace);
    }
}
