//! The transports a URL can name. Each maps its scheme to a connector (a client's side of
//! one connection) and a listener (a server); channels and servers reach a transport only
//! through this table, so a new transport is a crate implementing core's transport
//! interface, one more entry in [`SCHEMES`] and one more [`TransportKind`].

use std::sync::Arc;

use rpc_core::server::Dispatcher;
use rpc_core::{CallTable, ClientTransport, Listener, Status};
use rpc_transport_grpc::{GrpcClient, GrpcClientConfig, GrpcServer};
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
pub(crate) static SCHEMES: [Scheme; 5] = [
    Scheme {
        kind: TransportKind::Tcp,
        name: "tcp",
        connect: |authority, calls, settings| connect_tcp(authority, calls, settings, false),
        listen: |authority, dispatcher, options| listen_tcp(authority, dispatcher, options, false),
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
    Scheme {
        kind: TransportKind::TcpTls,
        name: "tcps",
        connect: |authority, calls, settings| connect_tcp(authority, calls, settings, true),
        listen: |authority, dispatcher, options| listen_tcp(authority, dispatcher, options, true),
    },
];

/// The URL's scheme: `secure` (`tcps`, `grpcs`) or `plain` (`tcp`, `grpc`).
fn scheme_of(tls: bool, plain: &'static str, secure: &'static str) -> &'static str {
    if tls {
        secure
    } else {
        plain
    }
}

/// Whether a server's certificate matches its URL: a URL says whether traffic is
/// encrypted, so `tcps://` or `grpcs://` needs one and `tcp://` or `grpc://` refuses one
/// (`setting` names where it is set).
fn certificate_matches(url: String, tls: bool, has: bool, setting: &str) -> Result<(), Error> {
    let reason = match (tls, has) {
        (true, false) => {
            format!("{url} needs a certificate: {setting} (ServerTls::from_pem_files)")
        }
        (false, true) => format!("{url} is plaintext, but a certificate is set ({setting})"),
        _ => return Ok(()),
    };
    Err(Error::InvalidUrl { url, reason })
}

/// Whether a client's authorities match the URL, as [`certificate_matches`] for servers.
fn authorities_match(url: &str, tls: bool, has: bool) -> Result<(), Status> {
    match (tls, has) {
        (true, false) => Err(Status::invalid_argument(format!(
            "{url} needs the authorities to trust: ClientBuilder::tls \
             (ClientTls::trusting_pem_file)"
        ))),
        (false, true) => Err(Status::invalid_argument(format!(
            "{url} is plaintext, but authorities to trust are set: use the scheme with TLS"
        ))),
        _ => Ok(()),
    }
}

/// Serves our frames on `authority` (over TLS with `tls`: `tcps://`), and gRPC on the same
/// port (in plaintext on `tcp://`, agreed by ALPN inside TLS on `tcps://`) unless told not
/// to or the server authenticates connections.
fn listen_tcp(
    authority: &str,
    dispatcher: Arc<Dispatcher>,
    options: ServeOptions,
    tls: bool,
) -> Result<Box<dyn Listener>, Error> {
    let scheme = scheme_of(tls, "tcp", "tcps");
    let url = format!("{scheme}://{authority}");
    let has = options.tcp.tls.is_some();
    certificate_matches(url.clone(), tls, has, "ServeOptions::tcp.tls")?;
    if !options.grpc_on_tcp || dispatcher.config().auth.is_some() {
        return Ok(Box::new(TcpServer::bind(
            authority,
            dispatcher,
            options.tcp,
        )?));
    }
    if options.grpc.tls.is_some() {
        let reason = format!(
            "a {scheme}:// server serves gRPC on its port with its own TLS (none on tcp://, \
             ServeOptions::tcp.tls on tcps://), but a certificate is set for gRPC \
             (ServeOptions::grpc.tls): serve grpcs:// on a port of its own, or set \
             ServeOptions::grpc_on_tcp to false"
        );
        return Err(Error::InvalidUrl { url, reason });
    }
    let grpc = GrpcServer::on_tcp_port(dispatcher.clone(), options.grpc)?;
    Ok(Box::new(TcpServer::bind_sharing(
        authority,
        dispatcher,
        options.tcp,
        grpc,
    )?))
}

/// Serves gRPC on `authority`: over TLS with `tls` (`grpcs://`), else plaintext.
fn listen_grpc(
    authority: &str,
    dispatcher: Arc<Dispatcher>,
    options: ServeOptions,
    tls: bool,
) -> Result<Box<dyn Listener>, Error> {
    let url = format!("{}://{authority}", scheme_of(tls, "grpc", "grpcs"));
    let has = options.grpc.tls.is_some();
    certificate_matches(url, tls, has, "ServeOptions::grpc.tls")?;
    Ok(Box::new(GrpcServer::bind(
        authority,
        dispatcher,
        options.grpc,
    )?))
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

    /// The URL scheme that names it: `tcp`, `rdma`, `grpc`, `grpcs`, `tcps`.
    pub fn name(self) -> &'static str {
        self.scheme().name
    }
}

fn connect_tcp(
    authority: &str,
    calls: Arc<CallTable>,
    settings: &ClientBuilder,
    tls: bool,
) -> Result<Arc<dyn ClientTransport>, Status> {
    let url = format!("{}://{authority}", scheme_of(tls, "tcp", "tcps"));
    authorities_match(&url, tls, settings.tls.is_some())?;
    let mut config = TcpConfig {
        max_message_size: settings.channel.max_message_size,
        limits: settings.tcp.clone(),
        credentials: settings.credentials.clone(),
        tls: settings.tls.clone(),
        tls_server_name: settings.tls_server_name.clone(),
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
    let url = format!("{}://{authority}", scheme_of(tls, "grpc", "grpcs"));
    if settings.credentials.is_some() {
        return Err(Status::unauthenticated(format!(
            "{url}: gRPC servers do not speak our connection handshake; send credentials \
             as metadata (an interceptor) instead"
        )));
    }
    // gRPC's own settings first, then the builder's.
    let mut config = GrpcClientConfig {
        max_message_size: settings.channel.max_message_size,
        ..settings.grpc.clone()
    };
    if config.tls.is_none() {
        config.tls = settings.tls.clone();
    }
    if config.tls_server_name.is_none() {
        config.tls_server_name = settings.tls_server_name.clone();
    }
    authorities_match(&url, tls, config.tls.is_some())?;
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
            "tcp://host:port or rdma://host:port or grpc://host:port or grpcs://host:port or \
             tcps://host:port"
        );
    }
}
