//! A channel balanced over every address a host name resolves to, re-resolved while it runs
//! (gRPC's `dns:///` resolver; the pods behind a Kubernetes headless service), on every
//! transport: [`ClientBuilder::balance_dns`].

use std::collections::BTreeSet;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::{Channel, Status};

use crate::balance::Discovery;
use crate::{ClientBuilder, Endpoint, Error};

/// Default time between two resolutions of a [`ClientBuilder::balance_dns`] name.
pub const DEFAULT_DNS_REFRESH: Duration = Duration::from_secs(30);

/// Most addresses of one name a balanced channel calls; an answer with more keeps the
/// lowest (sorted, so every resolution keeps the same ones).
pub const MAX_RESOLVED_ADDRESSES: usize = 64;

/// How often the resolving thread checks, between resolutions, whether its channel is gone.
const CLOSED_CHECK: Duration = Duration::from_millis(500);

/// Resolves a host name to addresses. [`SystemResolver`] asks the system (`getaddrinfo`);
/// tests and service registries may answer themselves.
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `host` with `port`. It may block (it runs on the channel's own
    /// resolving thread).
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The system's resolver (`getaddrinfo`: `/etc/hosts`, DNS).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok((host, port).to_socket_addrs()?.collect())
    }
}

impl ClientBuilder {
    /// A channel balanced over every address the host of `url` resolves to (through the
    /// system's resolver), resolved again every `refresh` ([`DEFAULT_DNS_REFRESH`] is a
    /// sane choice): a server whose address appears is added, one whose address is gone
    /// is removed (it finishes the calls it has). An answer that fails or is empty leaves
    /// the servers as they are. The URL's scheme picks the transport, as for
    /// [`ClientBuilder::connect`]. Until the first answer brings a server, calls wait for
    /// one within their deadline.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), rdma_rpc::Error> {
    /// let channel = rdma_rpc::client()
    ///     .balance_dns("rdma://kv.default.svc.cluster.local:7471", rdma_rpc::DEFAULT_DNS_REFRESH)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A bad URL, or no thread for the balancer or the resolver.
    pub fn balance_dns(self, url: &str, refresh: Duration) -> Result<Channel, Error> {
        self.balance_resolved(url, refresh, SystemResolver)
    }

    /// [`ClientBuilder::balance_dns`] with `resolver` answering instead of the system.
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::balance_dns`].
    pub fn balance_resolved(
        self,
        url: &str,
        refresh: Duration,
        resolver: impl Resolve,
    ) -> Result<Channel, Error> {
        let endpoint: Endpoint = url.parse()?;
        // Room for one answer's changes: the removals and the additions of a whole set.
        let (channel, discovery) = self.balance_channel(2 * MAX_RESOLVED_ADDRESSES + 1)?;
        let name = Name {
            endpoint,
            resolver: Arc::new(resolver),
            refresh,
            discovery,
            servers: BTreeSet::new(),
        };
        std::thread::Builder::new()
            .name("rpc-dns".into())
            .spawn(move || name.run())
            .map_err(Error::Io)?;
        Ok(channel)
    }
}

/// A name being resolved for a balanced channel, and the servers its last answer gave.
struct Name {
    endpoint: Endpoint,
    resolver: Arc<dyn Resolve>,
    refresh: Duration,
    discovery: Discovery<SocketAddr>,
    servers: BTreeSet<SocketAddr>,
}

impl Name {
    /// Resolves every `refresh` until the channel is gone.
    fn run(mut self) {
        loop {
            if self.update().is_err() {
                return;
            }
            let next = Instant::now() + self.refresh;
            while let Some(left) = next.checked_duration_since(Instant::now()) {
                if self.discovery.is_closed() {
                    return;
                }
                std::thread::sleep(left.min(CLOSED_CHECK));
            }
        }
    }

    /// Resolves once and tells the balancer what changed; `Err` once the channel is gone.
    fn update(&mut self) -> Result<(), Status> {
        let host = self.endpoint.host();
        let answer = match self.resolver.resolve(host, self.endpoint.port()) {
            Ok(answer) if !answer.is_empty() => answer,
            Ok(_) => {
                tracing::warn!(host, "name resolved to no address; servers kept");
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(host, error = %e, "name not resolved; servers kept");
                return Ok(());
            }
        };
        let resolved: BTreeSet<SocketAddr> = answer
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .take(MAX_RESOLVED_ADDRESSES)
            .collect();
        let gone: Vec<_> = self.servers.difference(&resolved).copied().collect();
        let new: Vec<_> = resolved.difference(&self.servers).copied().collect();
        let sent = gone
            .into_iter()
            .try_for_each(|addr| {
                self.discovery.remove(addr)?;
                self.servers.remove(&addr);
                Ok::<(), Error>(())
            })
            .and_then(|()| {
                new.into_iter().try_for_each(|addr| {
                    let url = format!("{}://{addr}", self.endpoint.kind().scheme().name);
                    self.discovery.insert(addr, &url)?;
                    self.servers.insert(addr);
                    Ok(())
                })
            });
        match sent {
            Ok(()) => {}
            // The balancer is gone with its channel: so is this thread.
            Err(_) if self.discovery.is_closed() => {
                return Err(Status::unavailable("the balanced channel is closed"));
            }
            // The balancer has not taken the earlier changes yet: the next resolution
            // sends the rest.
            Err(e) => tracing::warn!(host, error = %e, "servers not all updated"),
        }
        Ok(())
    }
}
