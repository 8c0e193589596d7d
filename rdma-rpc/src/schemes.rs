//! The transports a URL can name. Each maps its scheme to a connector (a client's side of
//! one connection) and a listener (a server); channels and servers reach a transport only
//! through this table, so a new transport is a crate implementing core's transport
//! interface and one more entry in [`SCHEMES`].

use std::sync::Arc;

use rpc_core::server::Dispatcher;
use rpc_core::{CallTable, ClientTransport, Listener, Status};
use rpc_transport_rdma::{RdmaClient, RdmaServer};
use rpc_transport_tcp::{TcpClient, TcpConfig, TcpServer};

use crate::{ClientBuilder, Error, ServeOptions, TransportKind};

/// One transport, as URLs name it.
pub(crate) trait Scheme: Sync {
    /// Which transport (also its index in [`SCHEMES`]).
    fn kind(&self) -> TransportKind;

    /// The URL scheme, `tcp` in `tcp://host:port`.
    fn name(&self) -> &'static str;

    /// Opens one connection to `authority` with a builder's settings; what arrives goes to
    /// `calls`.
    fn connect(
        &self,
        authority: &str,
        calls: Arc<CallTable>,
        settings: &ClientBuilder,
    ) -> Result<Arc<dyn ClientTransport>, Status>;

    /// Serves `dispatcher` on `authority`.
    fn listen(
        &self,
        authority: &str,
        dispatcher: Arc<Dispatcher>,
        options: ServeOptions,
    ) -> Result<Box<dyn Listener>, Error>;
}

/// Every transport, in the order of [`TransportKind`].
pub(crate) static SCHEMES: [&dyn Scheme; 2] = [&Tcp, &Rdma];

/// The transport named `name`, if any.
pub(crate) fn named(name: &str) -> Option<&'static dyn Scheme> {
    SCHEMES.iter().copied().find(|scheme| scheme.name() == name)
}

/// The schemes a URL may use, for messages: `tcp://host:port or rdma://host:port`.
pub(crate) fn supported() -> String {
    let urls: Vec<String> = SCHEMES
        .iter()
        .map(|scheme| format!("{}://host:port", scheme.name()))
        .collect();
    urls.join(" or ")
}

impl TransportKind {
    pub(crate) fn scheme(self) -> &'static dyn Scheme {
        SCHEMES[self as usize]
    }
}

/// `tcp://`.
struct Tcp;

impl Scheme for Tcp {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn connect(
        &self,
        authority: &str,
        calls: Arc<CallTable>,
        settings: &ClientBuilder,
    ) -> Result<Arc<dyn ClientTransport>, Status> {
        let mut config = TcpConfig {
            max_message_size: settings.channel.max_message_size,
            limits: settings.tcp.clone(),
            credentials: settings.credentials.clone(),
            ..Default::default()
        };
        if let Some(t) = settings.connect_timeout {
            config.connect_timeout = t;
        }
        Ok(TcpClient::connect(authority, calls, &config)?)
    }

    fn listen(
        &self,
        authority: &str,
        dispatcher: Arc<Dispatcher>,
        options: ServeOptions,
    ) -> Result<Box<dyn Listener>, Error> {
        Ok(Box::new(TcpServer::bind(
            authority,
            dispatcher,
            options.tcp,
        )?))
    }
}

/// `rdma://`.
struct Rdma;

impl Scheme for Rdma {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn name(&self) -> &'static str {
        "rdma"
    }

    fn connect(
        &self,
        authority: &str,
        calls: Arc<CallTable>,
        settings: &ClientBuilder,
    ) -> Result<Arc<dyn ClientTransport>, Status> {
        let mut config = settings.rdma.clone();
        if settings.credentials.is_some() {
            config.credentials = settings.credentials.clone();
        }
        config.limit_bodies(settings.channel.max_message_size);
        if let Some(t) = settings.connect_timeout {
            config.connect_timeout = t;
        }
        Ok(RdmaClient::connect(authority, calls, &config)?)
    }

    fn listen(
        &self,
        authority: &str,
        dispatcher: Arc<Dispatcher>,
        options: ServeOptions,
    ) -> Result<Box<dyn Listener>, Error> {
        Ok(Box::new(RdmaServer::bind(
            authority,
            dispatcher,
            options.rdma,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_its_index_in_the_table_and_every_name_is_unique() {
        for (index, scheme) in SCHEMES.iter().enumerate() {
            assert_eq!(scheme.kind() as usize, index, "{}", scheme.name());
            assert_eq!(scheme.kind().scheme().name(), scheme.name());
            let same_name = SCHEMES.iter().filter(|s| s.name() == scheme.name());
            assert_eq!(same_name.count(), 1, "{}", scheme.name());
        }
        assert_eq!(supported(), "tcp://host:port or rdma://host:port");
    }
}
