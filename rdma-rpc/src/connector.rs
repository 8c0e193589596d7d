//! Opening the connections of a channel made from a URL.

use std::sync::Arc;

use rpc_core::{CallTable, Connection, Connector, Status};

use crate::{ClientBuilder, Endpoint, Error};

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
        let calls = Arc::new(CallTable::new());
        let scheme = self.endpoint.kind().scheme();
        let transport =
            (scheme.connect)(&self.endpoint.authority(), calls.clone(), &self.settings)?;
        Ok(Connection::new(calls, transport))
    }

    fn target(&self) -> &str {
        &self.url
    }
}
