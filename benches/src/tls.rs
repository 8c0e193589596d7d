//! A throwaway certificate for the `tcps://` runs: an authority made for the run, and a
//! server certificate it signed for `localhost` and `127.0.0.1`.

use rdma_rpc::{ClientTls, ServerTls};

use crate::error::BenchError;

/// The server's side and the client's side of one run's certificate.
#[derive(Debug, Clone)]
pub struct RunCertificate {
    /// The server's certificate and key.
    pub server: ServerTls,
    /// The authority the client trusts.
    pub client: ClientTls,
}

impl RunCertificate {
    /// A new authority and server certificate.
    pub fn new() -> Result<RunCertificate, BenchError> {
        let failed = |e: &dyn std::fmt::Display| BenchError::failed("making a certificate", e);
        let ca_key = rcgen::KeyPair::generate().map_err(|e| failed(&e))?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| failed(&e))?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).map_err(|e| failed(&e))?;
        let key = rcgen::KeyPair::generate().map_err(|e| failed(&e))?;
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let cert = rcgen::CertificateParams::new(names)
            .and_then(|params| params.signed_by(&key, &ca, &ca_key))
            .map_err(|e| failed(&e))?;
        let server = ServerTls::from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes())
            .map_err(|e| failed(&e))?;
        let client = ClientTls::trusting_pem(ca.pem().as_bytes()).map_err(|e| failed(&e))?;
        Ok(RunCertificate { server, client })
    }
}
