//! The transports a URL can name. Each maps its scheme to a connector (a client's side of
//! one connection) and a listener (a server); channels and servers reach a transport only
//! through this table, so a new transport is a crate implementing core's transport
//! interface, one more entry in [`SCHEMES`] and one more [`TransportKind`].

use std::sync::Arc;

use rpc_core::server::Dispatcher;
use rpc_core::{CallTable, ClientTransport, Listener, Status};
use rpc_transport_grpc::{GrpcClient, GrpcClientConfig, GrpcServer, GrpcServerConfig};
use rpc_transport_rdma::{RdmaClient, RdmaServer};
use rpc_transport_tcp::{TcpClient, TcpConfig, TcpServer};

use crate::{ClientBuilder, Error, ServeOptions, TransportKind};

/// Opens one connection to an authority (`host:port`) with a builder's settings; what
/// arrives goes to the call table.
type Connect = fn(&str, Arc<CallTable>, &ClientBuilder) -> Result<Arc<dyn ClientTransport>, Status>;

/// Serves a dispatcher on an authority.
type Listen = fn(&str, Arc<Dispatcher>, ServeOptions) -> Result<Box<dyn Listener>, Error>;

/// One transport, as URLs name it.
pub(crate) struct Scheme {
    /// Which transport (also its index in [`SCHEMES`]).
    pub(crate) kind: TransportKind,
    /// The URL scheme, `tcp` in `tcp://host:port`.
    pub(crate) name: &'static str,
    pub(crate) connect: Connect,
    pub(crate) listen: Listen,
}

/// Every transport, in the order of [`TransportKind`].
pub(crate) static SCHEMES: [Scheme; 4] = [
    Scheme {
        kind: TransportKind::Tcp,
        name: "tcp",
        connect: connect_tcp,
        listen: listen_tcp,
    },
    Scheme {
        kind: TransportKind::Rdma,
        name: "rdma",
        connect: connect_rdma,
        listen: |authority, dispatcher, options| {
            Ok(Box::new(RdmaServer::bind(
                authority,
                dispatcher,
                options.rdma,
            )?))
        },
    },
    Scheme {
        kind: TransportKind::Grpc,
        name: "grpc",
        connect: |authority, calls, settings| connect_grpc(authority, calls, settings, false),
        listen: |authority, dispatcher, options| listen_grpc(authority, dispatcher, options, false),
    },
    Scheme {
        kind: TransportKind::GrpcTls,
        name: "grpcs",
        connect: |authority, calls, settings| connect_grpc(authority, calls, settings, true),
        listen: |authority, dispatcher, options| listen_grpc(authority, dispatcher, options, true),
    },
];

/// Serves our frames on `authority`, and gRPC in plaintext on the same port unless told
/// not to or the server authenticates connections.
fn listen_tcp(
    authority: &str,
    dispatcher: Arc<Dispatcher>,
    options: ServeOptions,
) -> Result<Box<dyn Listener>, Error> {
    if !options.grpc_on_tcp || dispatcher.config().auth.is_some() {
        return Ok(Box::new(TcpServer::bind(
            authority,
            dispatcher,
            options.tcp,
        )?));
    }
    let grpc = GrpcServerConfig {
        tls: None,
        ..options.grpc
    };
    let grpc = GrpcServer::on_tcp_port(dispatcher.clone(), grpc)?;
    Ok(Box::new(TcpServer::bind_sharing(
        authority,
        dispatcher,
        options.tcp,
        grpc,
    )?))
}

/// Serves gRPC on `authority`: over TLS with `tls` (`grpcs://`, which needs a certificate),
/// else plaintext (`grpc://`, which refuses one: a URL says whether traffic is encrypted).
fn listen_grpc(
    authority: &str,
    dispatcher: Arc<Dispatcher>,
    options: ServeOptions,
    tls: bool,
) -> Result<Box<dyn Listener>, Error> {
    let invalid = |reason: &str| Error::InvalidUrl {
        url: format!("{}://{authority}", if tls { "grpcs" } else { "grpc" }),
        reason: reason.to_owned(),
    };
    match (tls, options.grpc.tls.is_some()) {
        (true, false) => Err(invalid(
            "grpcs:// needs a certificate: ServeOptions::grpc.tls (ServerTls::from_pem_files)",
        )),
        (false, true) => Err(invalid(
            "grpc:// is plaintext, but a certificate is set: serve on grpcs://",
        )),
        _ => Ok(Box::new(GrpcServer::bind(
            authority,
            dispatcher,
            options.grpc,
        )?)),
    }
}

/// The transport named `name`, if any.
pub(crate) fn named(name: &str) -> Option<&'static Scheme> {
    SCHEMES.iter().find(|scheme| scheme.name == name)
}

/// The schemes a URL may use, for messages: `tcp://host:port or rdma://host:port`.
pub(crate) fn supported() -> String {
    let urls: Vec<String> = SCHEMES
        .iter()
        .map(|scheme| format!("{}://host:port", scheme.name))
        .collect();
    urls.join(" or ")
}

impl TransportKind {
    pub(crate) fn scheme(self) -> &'static Scheme {
        &SCHEMES[self as usize]
    }

    /// The URL scheme that names it: `tcp`, `rdma`, `grpc`.
    pub fn name(self) -> &'static str {
        self.scheme().name
    }
}

fn connect_tcp(
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
    if let Some(wait) = settings.tcp_caller_reads {
        config.caller_reads = wait;
    }
    Ok(TcpClient::connect(authority, calls, &config)?)
}

fn connect_grpc(
    authority: &str,
    calls: Arc<CallTable>,
    settings: &ClientBuilder,
    tls: bool,
) -> Result<Arc<dyn ClientTransport>, Status> {
    let url = format!("{}://{authority}", if tls { "grpcs" } else { "grpc" });
    if settings.credentials.is_some() {
        return Err(Status::unauthenticated(format!(
            "{url}: gRPC servers do not speak our connection handshake; send credentials \
             as metadata (an interceptor) instead"
        )));
    }
    match (tls, settings.grpc.tls.is_some()) {
        (true, false) => {
            return Err(Status::invalid_argument(format!(
                "{url} needs the authorities to trust: ClientBuilder::grpc_config with \
                 GrpcClientConfig::tls (ClientTls::trusting_pem_file)"
            )))
        }
        (false, true) => {
            return Err(Status::invalid_argument(format!(
                "{url} is plaintext, but authorities to trust are set: connect to grpcs://"
            )))
        }
        _ => {}
    }
    let mut config = GrpcClientConfig {
        max_message_size: settings.channel.max_message_size,
        ..settings.grpc.clone()
    };
    if let Some(t) = settings.connect_timeout {
        config.connect_timeout = t;
    }
    Ok(GrpcClient::connect(authority, calls, &config)?)
}

fn connect_rdma(
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
        config.liveness.connect_timeout = t;
    }
    Ok(RdmaClient::connect(authority, calls, &config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_its_index_in_the_table_and_every_name_is_unique() {
        for (index, scheme) in SCHEMES.iter().enumerate() {
            assert_eq!(scheme.kind as usize, index, "{}", scheme.name);
            assert_eq!(scheme.kind.scheme().name, scheme.name);
            let same_name = SCHEMES.iter().filter(|s| s.name == scheme.name);
            assert_eq!(same_name.count(), 1, "{}", scheme.name);
        }
        assert_eq!(
            supported(),
            "tcp://host:port or rdma://host:port or grpc://host:port or grpcs://host:port"
        );
    }
}
