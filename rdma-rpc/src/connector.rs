//! Opening the connections of a channel made from a URL.

use std::sync::Arc;

use rpc_core::{CallTable, ClientTransport, Connection, Connector, Status};

use crate::{ClientBuilder, Endpoint, Error, TransportKind};

/// Connects to one URL with a builder's settings, as often as its channel needs.
#[derive(Debug)]
pub(crate) struct UrlConnector {
    url: String,
    endpoint: Endpoint,
    settings: ClientBuilder,
}

impl UrlConnector {
    /// Checks `url`; connects nowhere yet.
    pub(crate) fn new(url: &str, settings: ClientBuilder) -> Result<UrlConnector, Error> {
        Ok(UrlConnector {
            url: url.to_owned(),
            endpoint: url.parse()?,
            settings,
        })
    }
}

impl Connector for UrlConnector {
    fn connect(&self) -> Result<Connection, Status> {
        let settings = &self.settings;
        let calls = Arc::new(CallTable::new());
        let transport: Arc<dyn ClientTransport> = match self.endpoint.kind() {
            TransportKind::Tcp => {
                let mut config = rpc_transport_tcp::TcpConfig {
                    max_message_size: settings.channel.max_message_size,
                    limits: settings.tcp.clone(),
                    credentials: settings.credentials.clone(),
                    ..Default::default()
                };
                if let Some(t) = settings.connect_timeout {
                    config.connect_timeout = t;
                }
                rpc_transport_tcp::TcpClient::connect(
                    &self.endpoint.authority(),
                    calls.clone(),
                    &config,
                )?
            }
            TransportKind::Rdma => {
                let mut config = settings.rdma.clone();
                if settings.credentials.is_some() {
                    config.credentials = settings.credentials.clone();
                }
                config.limit_bodies(settings.channel.max_message_size);
                if let Some(t) = settings.connect_timeout {
                    config.connect_timeout = t;
                }
                rpc_transport_rdma::RdmaClient::connect(
                    &self.endpoint.authority(),
                    calls.clone(),
                    &config,
                )?
            }
        };
        Ok(Connection::new(calls, transport))
    }

    fn target(&self) -> &str {
        &self.url
    }
}
