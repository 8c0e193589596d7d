//! TLS for `grpcs://`: the TCP transport's (rustls), with HTTP/2 agreed by ALPN.

pub use rpc_transport_tcp::tls::{server_name, ClientTls, ServerTls, TlsError};

/// HTTP/2, the one protocol gRPC speaks over TLS.
pub(crate) const ALPN_H2: &[u8] = b"h2";

/// Whether the TLS session agreed on HTTP/2 (gRPC requires it; a peer that agreed on no
/// protocol is taken to speak HTTP/2).
pub(crate) fn agreed_h2(alpn: Option<&[u8]>) -> bool {
    rpc_transport_tcp::tls::agreed(alpn, ALPN_H2)
}
