//! TLS (rustls with the `ring` provider, TLS 1.2 and 1.3) for `tcps://` and `grpcs://`: a
//! server's certificate, and the authorities a client trusts. Each transport agrees on its
//! protocol by ALPN (ours [`ALPN_RPC`], gRPC's `h2`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// What goes wrong setting TLS up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// PEM that holds no certificate, or no key, or cannot be parsed.
    #[error("{what}: {why}")]
    Pem {
        /// What was being read (`certificate chain`, `private key`, `trusted authorities`).
        what: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// rustls refused the configuration (a key that does not match its certificate, say).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Our frames (docs/PROTOCOL.md, version 3), as `tcps://` agrees on them by ALPN.
pub const ALPN_RPC: &[u8] = b"rdma-rpc/3";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn certificates(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            why: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            why: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// A server's TLS: its certificate chain and private key.
#[derive(Clone)]
pub struct ServerTls(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    /// From PEM: the certificate chain (leaf first) and its private key.
    pub fn from_pem(chain: &[u8], key: &[u8]) -> Result<ServerTls, TlsError> {
        let chain = certificates(chain, "certificate chain")?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem {
            what: "private key",
            why: e.to_string(),
        })?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        Ok(ServerTls(Arc::new(config)))
    }

    /// The rustls configuration for a server of `protocol` (agreed by ALPN).
    pub fn config(&self, protocol: &[u8]) -> Arc<rustls::ServerConfig> {
        self.config_for(&[protocol])
    }

    /// The rustls configuration for a server of several protocols, the first preferred
    /// (agreed by ALPN: the first of them the client offers).
    pub fn config_for(&self, protocols: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let mut config = (*self.0).clone();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// From PEM files: the certificate chain and the private key.
    pub fn from_pem_files(
        chain: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<ServerTls, TlsError> {
        ServerTls::from_pem(&read(chain.as_ref())?, &read(key.as_ref())?)
    }
}

/// A client's TLS: the authorities whose certificates it trusts.
#[derive(Clone)]
pub struct ClientTls(Arc<rustls::ClientConfig>);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    /// Trusting the certificates of the PEM `authorities` (a CA bundle).
    pub fn trusting_pem(authorities: &[u8]) -> Result<ClientTls, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(authorities, "trusted authorities")? {
            roots.add(cert)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClientTls(Arc::new(config)))
    }

    /// The rustls configuration for a client of `protocol` (agreed by ALPN).
    pub fn config(&self, protocol: &[u8]) -> Arc<rustls::ClientConfig> {
        let mut config = (*self.0).clone();
        config.alpn_protocols = vec![protocol.to_vec()];
        Arc::new(config)
    }

    /// Trusting the certificates of a PEM file (a CA bundle).
    pub fn trusting_pem_file(authorities: impl AsRef<Path>) -> Result<ClientTls, TlsError> {
        ClientTls::trusting_pem(&read(authorities.as_ref())?)
    }
}

/// The name a client checks the server's certificate against: the authority's host (a
/// DNS name or an IP address).
pub fn server_name(authority: &str) -> Result<ServerName<'static>, String> {
    let host = match authority.rsplit_once(':') {
        Some((host, _port)) => host,
        None => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|e| format!("{host:?} is not a server name: {e}"))
}

/// Whether the TLS session agreed on `protocol` (as ALPN reported it: a peer that agreed on
/// none is taken to speak the one protocol the port serves).
pub fn agreed(alpn: Option<&[u8]>, protocol: &[u8]) -> bool {
    alpn.is_none_or(|agreed| agreed == protocol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_authorities() {
        assert!(server_name("localhost:50051").is_ok());
        assert!(server_name("127.0.0.1:50051").is_ok());
        assert!(server_name("[::1]:50051").is_ok());
        assert!(server_name("bad name:1").is_err());
    }

    #[test]
    fn pem_without_what_it_needs_is_refused_by_name() {
        let err = ServerTls::from_pem(b"", b"").unwrap_err();
        assert!(err.to_string().contains("certificate chain"), "{err}");
        let err = ClientTls::trusting_pem(b"not pem").unwrap_err();
        assert!(err.to_string().contains("trusted authorities"), "{err}");
        let err =
            ServerTls::from_pem_files("/nonexistent/cert.pem", "/nonexistent/key.pem").unwrap_err();
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }
}
