//! Connect-time authentication on every transport that has it (`tcp://`, `tcps://` inside
//! TLS, `rdma://`): identities reach handlers, bad or missing credentials and replayed
//! hellos are refused with the reason, a client never trusts a server that cannot prove it
//! holds the secret, and a peer an authenticator admits without credentials has its first
//! frame served. The `rdma_` tests need an RDMA device (`cargo xtask test` runs them in the
//! soft-RoCE VM).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::tls::{start_tcps, trusting, TestPki};
use rdma_rpc::auth::{Attempt, AuthConfig, Authenticator, Credentials, SharedSecrets};
use rdma_rpc::prelude::*;
use rdma_rpc::{RdmaConfig, ServeOptions, ServerBuilder, ServerHandle, TcpServerConfig};
use rpc_examples::echo::EchoRequest;
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::Tester;
use rpc_transport_rdma::verbs::test_support::require_device;
use rpc_transport_tcp::handshake::{AUTH_MAGIC, AUTH_VERSION, PREFACE_LEN};

const SECRET: &[u8] = b"correct horse battery staple 42!";

fn builder(auth: bool) -> ServerBuilder {
    let builder = Server::builder().add_service(TesterServer::new(Tester::default()));
    if !auth {
        return builder;
    }
    builder.auth(AuthConfig::new(
        SharedSecrets::new().with_key(7, SECRET, "alice"),
    ))
}

fn tcp_server(auth: bool) -> ServerHandle {
    let options = ServeOptions {
        tcp: TcpServerConfig {
            handshake_timeout: Duration::from_millis(300),
            ..TcpServerConfig::default()
        },
        ..ServeOptions::default()
    };
    builder(auth)
        .start_with("tcp://127.0.0.1:0", options)
        .expect("tcp server starts")
}

fn rdma_server(auth: bool) -> ServerHandle {
    require_device().expect("an RDMA device");
    common::start_rdma(builder(auth), RdmaConfig::default())
}

/// The same over TLS, with the binary's test certificate.
fn tcps_server(auth: bool) -> ServerHandle {
    let tcp = TcpServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..TcpServerConfig::default()
    };
    start_tcps(builder(auth), TestPki::shared(), tcp)
}

fn connect(url: &str, credentials: Option<Credentials>) -> Result<Channel, rdma_rpc::Error> {
    let client = match url.starts_with("tcps://") {
        true => trusting(TestPki::shared()),
        false => rdma_rpc::client(),
    };
    // The first connect of a process over soft-RoCE under emulation can take seconds.
    let mut client = client.connect_timeout(Duration::from_secs(10));
    if let Some(credentials) = credentials {
        client = client.credentials(credentials);
    }
    client.connect_blocking(url)
}

/// The status a connect, or else the first call, failed with.
fn refusal(url: &str, credentials: Option<Credentials>) -> Status {
    let channel = match connect(url, credentials) {
        Ok(channel) => channel,
        Err(rdma_rpc::Error::Connect(status)) => return status,
        Err(e) => panic!("{e}"),
    };
    TesterClient::new(channel)
        .echo_blocking(EchoRequest::default())
        .expect_err("the call of a refused peer")
}

/// An authenticated peer's handler sees its identity and address.
fn identity_reaches_the_handler(url: &str, scheme: &str) {
    let channel = connect(url, Some(Credentials::new(7, SECRET))).expect("connects");
    let reply = TesterClient::new(channel)
        .echo_blocking(EchoRequest::default())
        .expect("an authenticated call");
    let metadata = reply.metadata();
    assert_eq!(metadata.get("peer-identity"), Some(&b"alice"[..]));
    let addr = String::from_utf8_lossy(metadata.get("peer-addr").expect("peer-addr"));
    assert!(addr.starts_with(scheme), "{addr}");
}

/// Wrong secret, unknown key, no credentials: refused, `UNAUTHENTICATED`, with the reason.
fn bad_credentials_are_refused(url: &str) {
    let cases = [
        (
            Some(Credentials::new(7, b"a guess")),
            "bad credentials for key 7",
        ),
        (Some(Credentials::new(9, SECRET)), "unknown key 9"),
        (None, "requires credentials"),
    ];
    for (credentials, reason) in cases {
        let status = refusal(url, credentials);
        eprintln!("refused: {status}");
        assert_eq!(status.code(), Code::Unauthenticated, "{status}");
        assert!(status.message().contains(reason), "{status}");
    }
}

/// A client with credentials does not trust a server that proves nothing.
fn a_server_without_the_secret_is_not_trusted(url: &str) {
    let status = refusal(url, Some(Credentials::new(7, SECRET)));
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    assert!(
        status.message().contains("did not authenticate itself"),
        "{status}"
    );
}

#[test]
fn tcp_identity_reaches_the_handler() {
    let server = tcp_server(true);
    identity_reaches_the_handler(server.local_url(), "tcp://127.0.0.1:");
    // Without authentication a handler still sees the address, and no identity.
    let open = tcp_server(false);
    let reply = TesterClient::new(connect(open.local_url(), None).unwrap())
        .echo_blocking(EchoRequest::default())
        .unwrap();
    assert!(reply.metadata().get("peer-addr").is_some());
    assert_eq!(reply.metadata().get("peer-identity"), None);
}

#[test]
fn tcp_bad_credentials_are_refused() {
    bad_credentials_are_refused(tcp_server(true).local_url());
}

#[test]
fn tcp_a_server_without_the_secret_is_not_trusted() {
    a_server_without_the_secret_is_not_trusted(tcp_server(false).local_url());
}

#[test]
fn tcps_identity_reaches_the_handler() {
    identity_reaches_the_handler(tcps_server(true).local_url(), "tcps://127.0.0.1:");
}

#[test]
fn tcps_bad_credentials_are_refused() {
    bad_credentials_are_refused(tcps_server(true).local_url());
}

#[test]
fn tcps_a_server_without_the_secret_is_not_trusted() {
    a_server_without_the_secret_is_not_trusted(tcps_server(false).local_url());
}

/// A `tcps://` server that authenticates connections does not offer gRPC by ALPN: a
/// `grpcs://` client, which cannot authenticate, is refused by the TLS handshake, where on a
/// server without authentication it is served (`tcp_tls.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcps_grpc_clients_cannot_pass_a_server_that_authenticates() {
    let server = tcps_server(true);
    let url = server.local_url().replace("tcps://", "grpcs://");
    let refused = trusting(TestPki::shared())
        .connect(&url)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("TLS handshake"), "{refused}");
}

/// Admits peers without credentials (as `anonymous`), and those with key 7's.
struct AnonymousToo(SharedSecrets);

impl Authenticator for AnonymousToo {
    fn authenticate(&self, attempt: &Attempt<'_>) -> Result<String, Status> {
        match attempt.key_id() {
            None => Ok("anonymous".to_owned()),
            Some(_) => self.0.authenticate(attempt),
        }
    }
}

/// A server that reads a preface for credentials but admits peers without: the frames such
/// a peer sends straight away (read while looking for a preface) are served, over plain
/// TCP and inside TLS, and a peer with credentials is still checked.
#[test]
fn a_peer_admitted_without_credentials_has_its_first_frames_served() {
    let auth = || {
        let secrets = SharedSecrets::new().with_key(7, SECRET, "alice");
        AuthConfig::new(AnonymousToo(secrets))
    };
    let tcp = builder(false)
        .auth(auth())
        .start("tcp://127.0.0.1:0")
        .unwrap();
    let tcps = start_tcps(
        builder(false).auth(auth()),
        TestPki::shared(),
        TcpServerConfig::default(),
    );
    for url in [tcp.local_url(), tcps.local_url()] {
        let client = TesterClient::new(connect(url, None).expect("connects"));
        for seq in 0..3 {
            let reply = client
                .echo_blocking(EchoRequest {
                    seq,
                    ..EchoRequest::default()
                })
                .unwrap_or_else(|s| panic!("{url}: {s}"));
            assert_eq!(reply.get_ref().seq, seq);
            assert_eq!(
                reply.metadata().get("peer-identity"),
                Some(&b"anonymous"[..])
            );
        }
        identity_reaches_the_handler(url, &url[..url.find("//").unwrap() + 2]);
    }
}

fn raw_preface(stream: &mut TcpStream, hello: &[u8]) -> Vec<u8> {
    let mut preface = vec![0u8; PREFACE_LEN];
    preface[..4].copy_from_slice(&AUTH_MAGIC);
    preface[4] = AUTH_VERSION;
    preface[8..].copy_from_slice(hello);
    stream.write_all(&preface).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut answer = vec![0u8; 256];
    let n = stream.read(&mut answer).unwrap();
    answer.truncate(n);
    answer
}

/// A hello seen once is refused when it comes again (a recorded handshake replayed), and a
/// peer that sends nothing is refused after the handshake timeout.
#[test]
fn tcp_replayed_and_silent_peers_are_refused() {
    let server = tcp_server(true);
    let addr = server.local_url().trim_start_matches("tcp://").to_owned();
    let hello = Credentials::new(7, SECRET).hello();
    let first = raw_preface(&mut TcpStream::connect(&addr).unwrap(), &hello);
    assert!(first.starts_with(&AUTH_MAGIC), "accepted: {first:?}");
    let again = raw_preface(&mut TcpStream::connect(&addr).unwrap(), &hello);
    let text = String::from_utf8_lossy(&again);
    assert!(text.contains("credentials replayed"), "{text}");

    let mut silent = TcpStream::connect(&addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = Vec::new();
    let started = std::time::Instant::now();
    silent.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("sent no credentials within"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn rdma_identity_reaches_the_handler() {
    let server = rdma_server(true);
    identity_reaches_the_handler(server.local_url(), "rdma://");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn rdma_bad_credentials_are_refused() {
    bad_credentials_are_refused(rdma_server(true).local_url());
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn rdma_a_server_without_the_secret_is_not_trusted() {
    a_server_without_the_secret_is_not_trusted(rdma_server(false).local_url());
}
