//! A test certificate authority and a server certificate it signed, for `localhost` and
//! `127.0.0.1`, as PEM files in a temporary directory.

use std::path::PathBuf;

use rdma_rpc::TcpServerConfig;
use rdma_rpc::{ClientTls, ServeExt, ServeOptions, ServerBuilder, ServerHandle, ServerTls};

/// PEM files: an authority, and a certificate and key it signed for the test server.
pub struct TestPki {
    dir: tempfile::TempDir,
}

impl TestPki {
    /// A new authority and server certificate.
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "rdma-rpc test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        TestPki { dir }
    }

    /// One for the whole test binary.
    pub fn shared() -> &'static TestPki {
        static PKI: std::sync::OnceLock<TestPki> = std::sync::OnceLock::new();
        PKI.get_or_init(TestPki::new)
    }

    /// The authority's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server's certificate.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server's private key.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

/// Serves `builder` on `tcps://127.0.0.1:0` with `pki`'s certificate and `tcp`'s other
/// settings.
pub fn start_tcps(builder: ServerBuilder, pki: &TestPki, tcp: TcpServerConfig) -> ServerHandle {
    let tcp = TcpServerConfig {
        tls: Some(ServerTls::from_pem_files(pki.cert(), pki.key()).unwrap()),
        ..tcp
    };
    let options = ServeOptions {
        tcp,
        ..ServeOptions::default()
    };
    builder
        .start_with("tcps://127.0.0.1:0", options)
        .expect("the tcps:// server starts")
}

/// A client trusting `pki`'s authority.
pub fn trusting(pki: &TestPki) -> rdma_rpc::ClientBuilder {
    rdma_rpc::client().tls(ClientTls::trusting_pem_file(pki.ca()).unwrap())
}
