//! `tcps://`: our frames over TLS (rustls). Calls of every size, from async and blocking
//! callers sharing a connection (a blocking caller reads its answer through TLS itself);
//! certificates checked against the authority and the name; plaintext and TLS refused on
//! each other's ports; URLs and settings that disagree on TLS refused; the handshake
//! bounded; a graceful shutdown that lets running calls answer; gRPC clients (ours, and
//! Python's grpcio) on the same port, by ALPN. The stream suites run over `tcps://` too
//! (`streams.rs`).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::tls::TestPki;
use common::{echo_blocking_checked, echo_checked, pattern, sleep_for};
use futures::future::join_all;
use rdma_rpc::prelude::*;
use rdma_rpc::{Code, ServeOptions, ServerHandle, ServerTls, TcpServerConfig};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::{EchoService, Tester};

/// A `tcps://` server with `pki`'s certificate and `tcp`'s other settings.
fn serve(pki: &TestPki, tcp: TcpServerConfig) -> ServerHandle {
    let builder = Server::builder()
        .max_message_size(8 << 20)
        .add_service(EchoServer::new(EchoService))
        .add_service(TesterServer::new(Tester::default()));
    common::tls::start_tcps(builder, pki, tcp)
}

/// A client trusting `pki`'s authority.
fn trusting(pki: &TestPki) -> rdma_rpc::ClientBuilder {
    common::tls::trusting(pki).max_message_size(8 << 20)
}

/// The server's port.
fn port(server: &ServerHandle) -> &str {
    server.local_url().rsplit(':').next().unwrap()
}

/// Every size from empty to 4 MiB, from blocking threads (which read their answers through
/// TLS themselves) and async tasks on one connection: each call gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_every_size_from_blocking_and_async_callers() {
    let pki = TestPki::new();
    let server = serve(&pki, TcpServerConfig::default());
    assert!(
        server.local_url().starts_with("tcps://"),
        "{}",
        server.local_url()
    );
    let url = format!("tcps://localhost:{}", port(&server));
    let channel = trusting(&pki).connect(&url).await.unwrap();
    let client = EchoClient::new(channel.clone());
    let sizes = [0, 1, 100, 16 << 10, (64 << 10) + 1, 1 << 20, 4 << 20];
    let blocking: Vec<_> = (0..2u64)
        .map(|thread| {
            let client = client.clone();
            std::thread::spawn(move || {
                for (i, size) in sizes.iter().cycle().take(40).enumerate() {
                    let seq = thread << 32 | i as u64;
                    echo_blocking_checked(&client, seq, &pattern(*size, seq));
                }
            })
        })
        .collect();
    let calls = (0..40u64).map(|seq| {
        let client = client.clone();
        async move {
            let size = sizes[seq as usize % sizes.len()];
            echo_checked(&client, 1 << 40 | seq, &pattern(size, seq)).await;
        }
    });
    join_all(calls).await;
    for thread in blocking {
        thread.join().unwrap();
    }
    let tester = TesterClient::new(channel.clone());
    tester
        .sleep(sleep_for(Duration::from_millis(30)))
        .await
        .unwrap();
    assert_eq!(channel.in_flight(), 0);
}

/// The server's certificate must come from an authority the client trusts, and carry the
/// name connected to (or the one the client was told to check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_checked() {
    let (pki, other) = (TestPki::new(), TestPki::new());
    let server = serve(&pki, TcpServerConfig::default());
    let url = format!("tcps://localhost:{}", port(&server));
    let refused = trusting(&other).connect(&url).await.unwrap_err();
    let refused = refused.to_string();
    assert!(refused.contains("TLS handshake"), "{refused}");
    assert!(refused.contains("certificate"), "{refused}");
    let by_address = format!("tcps://127.0.0.1:{}", port(&server));
    for (name, passes) in [("localhost", true), ("elsewhere.example", false)] {
        let connected = trusting(&pki)
            .tls_server_name(name)
            .connect(&by_address)
            .await;
        assert_eq!(connected.is_ok(), passes, "{name}: {:?}", connected.err());
    }
}

/// A plaintext client on a TLS port, and a TLS client on a plaintext one, fail to connect
/// (or their first call fails) with `UNAVAILABLE`, within the handshake's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_and_tls_are_refused_on_each_others_ports() {
    let pki = TestPki::new();
    let secure = serve(&pki, TcpServerConfig::default());
    let plain = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .start("tcp://127.0.0.1:0")
        .unwrap();
    let attempts = [
        (
            rdma_rpc::client(),
            format!("tcp://localhost:{}", port(&secure)),
        ),
        (trusting(&pki), format!("tcps://localhost:{}", port(&plain))),
    ];
    for (builder, url) in attempts {
        let started = Instant::now();
        let status = match builder.connect(&url).await {
            Ok(channel) => EchoClient::new(channel)
                .echo(rpc_examples::echo::EchoRequest::default())
                .await
                .unwrap_err(),
            Err(e) => Status::from(e),
        };
        assert_eq!(status.code(), Code::Unavailable, "{url}: {status}");
        assert!(started.elapsed() < Duration::from_secs(10), "{url}");
    }
}

/// A URL says whether traffic is encrypted: settings that disagree with it are refused,
/// naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_and_tls_settings_that_disagree_are_refused() {
    let pki = TestPki::new();
    let certificate = TcpServerConfig {
        tls: Some(ServerTls::from_pem_files(pki.cert(), pki.key()).unwrap()),
        ..TcpServerConfig::default()
    };
    let with = |tcp| ServeOptions {
        tcp,
        ..ServeOptions::default()
    };
    let echo = || Server::builder().add_service(EchoServer::new(EchoService));
    let err = echo()
        .start_with("tcps://127.0.0.1:0", with(TcpServerConfig::default()))
        .unwrap_err();
    assert!(err.to_string().contains("needs a certificate"), "{err}");
    let err = echo()
        .start_with("tcp://127.0.0.1:0", with(certificate))
        .unwrap_err();
    assert!(err.to_string().contains("is plaintext"), "{err}");
    let err = rdma_rpc::client()
        .connect("tcps://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ClientBuilder::tls"), "{err}");
    let err = trusting(&pki)
        .connect("tcp://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is plaintext"), "{err}");
}

/// A connection that does not finish its TLS handshake within `handshake_timeout` is
/// closed; it holds no slot meanwhile that another client needs.
#[test]
fn a_stalled_handshake_is_closed_at_its_bound() {
    let pki = TestPki::new();
    let server = serve(
        &pki,
        TcpServerConfig {
            handshake_timeout: Duration::from_millis(300),
            ..TcpServerConfig::default()
        },
    );
    let mut stalled = TcpStream::connect(format!("127.0.0.1:{}", port(&server))).unwrap();
    // Half a TLS record header, then nothing.
    stalled.write_all(&[0x16, 0x03]).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stalled, &mut rest);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "closed after {waited:?}"
    );
}

/// A graceful shutdown lets a running call answer over TLS, refuses new ones, and ends
/// promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_running_calls_answer() {
    let pki = TestPki::new();
    let server = serve(&pki, TcpServerConfig::default());
    let url = format!("tcps://localhost:{}", port(&server));
    let tester = TesterClient::new(trusting(&pki).connect(&url).await.unwrap());
    let running = {
        let tester = tester.clone();
        tokio::spawn(async move { tester.sleep(sleep_for(Duration::from_millis(300))).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let shutdown = tokio::spawn(server.shutdown(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = tester.now(()).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    running.await.unwrap().expect("the running call answers");
    shutdown.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// A `tcps://` port serves gRPC too, to the clients whose TLS agrees on HTTP/2 (ours over
/// `grpcs://`, and grpcio's interop cases), beside our own frames; turned off, a gRPC
/// client's handshake is refused (no protocol in common).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tls_shares_a_tcps_port() {
    let pki = TestPki::new();
    let (builder, _, _) = common::grpcio::interop_services();
    let server = common::tls::start_tcps(builder, &pki, TcpServerConfig::default());
    let shared = port(&server).to_owned();
    for scheme in ["tcps", "grpcs"] {
        let url = format!("{scheme}://localhost:{shared}");
        let tester = TesterClient::new(trusting(&pki).connect(&url).await.unwrap());
        assert!(tester.now(()).await.unwrap().get_ref().seconds > 0, "{url}");
    }
    let (target, ca) = (format!("localhost:{shared}"), pki.ca());
    tokio::task::spawn_blocking(move || {
        let cases = [
            "empty_unary",
            "metadata",
            "server_streaming",
            "ping_pong",
            "health",
        ];
        common::grpcio::run_cases(&target, Some(&ca), &cases);
    })
    .await
    .unwrap();

    let off = ServeOptions {
        tcp: TcpServerConfig {
            tls: Some(ServerTls::from_pem_files(pki.cert(), pki.key()).unwrap()),
            ..TcpServerConfig::default()
        },
        grpc_on_tcp: false,
        ..ServeOptions::default()
    };
    let ours_only = Server::builder()
        .add_service(TesterServer::new(Tester::default()))
        .start_with("tcps://127.0.0.1:0", off)
        .unwrap();
    let url = format!("grpcs://localhost:{}", port(&ours_only));
    let refused = trusting(&pki).connect(&url).await.unwrap_err();
    assert!(refused.to_string().contains("TLS"), "{refused}");
}
