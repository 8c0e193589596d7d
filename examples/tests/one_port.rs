//! One `tcp://` port, both wires: our frames and gRPC's HTTP/2, told apart by a
//! connection's first byte. Our TCP client, our gRPC client and Python's grpcio (a peer we
//! did not write; the README's test command installs it) call the same server on the same
//! port; the connection limit and the graceful shutdown cover both wires; a peer speaking
//! neither is told so and closed; and a server that authenticates connections, or is told
//! not to, serves only its own frames there.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rdma_rpc::auth::{AuthConfig, SharedSecrets};
use rdma_rpc::prelude::*;
use rdma_rpc::{Code, GrpcServerConfig, ServeOptions, ServerHandle, ServerTls, TcpServerConfig};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::Tester;

/// A `tcp://` server on an ephemeral port with `options`.
fn serve(builder: rdma_rpc::ServerBuilder, options: ServeOptions) -> ServerHandle {
    builder
        .start_with("tcp://127.0.0.1:0", options)
        .expect("the tcp:// server starts")
}

/// `host:port` of a server.
fn authority(server: &ServerHandle) -> &str {
    server.local_url().trim_start_matches("tcp://")
}

/// A client of `server` over `scheme` (`tcp` or `grpc`), on the server's one port.
async fn client(server: &ServerHandle, scheme: &str) -> TesterClient {
    let url = format!("{scheme}://{}", authority(server));
    TesterClient::new(rdma_rpc::connect(&url).await.expect("connects"))
}

fn sleep(time: Duration) -> Request<SleepRequest> {
    Request::new(SleepRequest {
        duration: Some(time.try_into().unwrap()),
    })
}

/// What the server answers to `bytes` sent on a fresh connection, up to its close.
fn answer_to(server: &ServerHandle, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(authority(server)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    // A reset instead of a close ends the read as well.
    let _ = stream.read_to_end(&mut answer);
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_clients_and_grpcio_call_one_port() {
    let (builder, _, _) = common::grpcio::interop_services();
    let server = serve(builder, ServeOptions::default());
    let ours = client(&server, "tcp").await;
    let grpc = client(&server, "grpc").await;
    for client in [&ours, &grpc] {
        assert!(client.now(()).await.unwrap().get_ref().seconds > 0);
    }
    let target = authority(&server).to_owned();
    tokio::task::spawn_blocking(move || {
        let cases = [
            "empty_unary",
            "large_unary",
            "metadata",
            "status_code_and_message",
            "server_streaming",
            "client_streaming",
            "ping_pong",
            "health",
            "reflection",
        ];
        common::grpcio::run_cases(&target, None, &cases);
    })
    .await
    .unwrap();
    // The connections of either wire were not disturbed by the other's.
    for client in [&ours, &grpc] {
        assert!(client.now(()).await.unwrap().get_ref().seconds > 0);
    }
}

#[test]
fn a_peer_speaking_neither_wire_is_told_and_closed() {
    let server = serve(
        Server::builder().add_service(TesterServer::new(Tester::default())),
        ServeOptions::default(),
    );
    // HTTP/1.1 (what curl sends) is answered in HTTP/1.1, naming what the port speaks.
    let answer = answer_to(&server, b"GET / HTTP/1.1\r\nhost: test\r\n\r\n");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("speaks neither rdma-rpc nor gRPC (HTTP/2)"),
        "{answer}"
    );
    // An HTTP/1.1 method that starts as HTTP/2's preface does is told gRPC needs HTTP/2.
    let answer = answer_to(&server, b"POST / HTTP/1.1\r\nhost: test\r\n\r\n");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("does not speak HTTP/2"), "{answer}");
    // Bytes of no protocol at all: closed without an answer.
    assert_eq!(answer_to(&server, &[0u8; 16]), b"");
    // None of them is served; the port still serves both wires.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        for scheme in ["tcp", "grpc"] {
            assert!(client(&server, scheme).await.now(()).await.is_ok());
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_not_served_when_turned_off_or_connections_authenticate() {
    let tester = || Server::builder().add_service(TesterServer::new(Tester::default()));
    let off = ServeOptions {
        grpc_on_tcp: false,
        ..ServeOptions::default()
    };
    let secrets = SharedSecrets::new().with_key(7, b"correct horse battery staple 42!", "alice");
    let servers = [
        serve(tester(), off),
        serve(
            tester().auth(AuthConfig::new(secrets)),
            ServeOptions::default(),
        ),
    ];
    for server in &servers {
        let status = client(server, "grpc").await.now(()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status}");
    }
    // Our own frames are still served on the first.
    assert!(client(&servers[0], "tcp").await.now(()).await.is_ok());
}

/// A certificate for gRPC does not go with gRPC on a `tcp://` or `tcps://` server's port,
/// which serves it with the port's own TLS (none, or the `tcps://` certificate): refused,
/// naming why, rather than serving other than asked.
#[test]
fn a_grpc_certificate_on_a_shared_port_is_refused() {
    let pki = common::tls::TestPki::new();
    let certificate = || Some(ServerTls::from_pem_files(pki.cert(), pki.key()).unwrap());
    let tester = || Server::builder().add_service(TesterServer::new(Tester::default()));
    for url in ["tcp://127.0.0.1:0", "tcps://127.0.0.1:0"] {
        let tcp = TcpServerConfig {
            tls: certificate().filter(|_| url.starts_with("tcps")),
            ..TcpServerConfig::default()
        };
        let grpc = GrpcServerConfig {
            tls: certificate(),
            ..GrpcServerConfig::default()
        };
        let options = ServeOptions {
            tcp,
            grpc,
            ..ServeOptions::default()
        };
        let err = tester().start_with(url, options).unwrap_err();
        assert!(err.to_string().contains("grpc_on_tcp"), "{url}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_counts_both_wires() {
    let options = ServeOptions {
        tcp: TcpServerConfig {
            max_connections: 1,
            ..TcpServerConfig::default()
        },
        ..ServeOptions::default()
    };
    let server = serve(
        Server::builder().add_service(TesterServer::new(Tester::default())),
        options,
    );
    // One wire's connection holds the one slot; the other's is refused, and served once the
    // first closed: it then holds the slot against the first wire.
    let mut held = client(&server, "grpc").await;
    held.now(()).await.unwrap();
    for (first, second) in [("grpc", "tcp"), ("tcp", "grpc")] {
        let status = client(&server, second).await.now(()).await.unwrap_err();
        assert!(
            matches!(status.code(), Code::ResourceExhausted | Code::Unavailable),
            "{second} past a {first} connection at the limit: {status}"
        );
        drop(held);
        // The slot frees once the server saw the close.
        let until = Instant::now() + Duration::from_secs(10);
        held = loop {
            let next = client(&server, second).await;
            if next.now(()).await.is_ok() {
                break next;
            }
            assert!(
                Instant::now() < until,
                "the slot of a closed {first} connection"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_calls_of_both_wires_answer_and_refuses_new_ones() {
    let server = serve(
        Server::builder().add_service(TesterServer::new(Tester::default())),
        ServeOptions::default(),
    );
    let (ours, grpc) = (client(&server, "tcp").await, client(&server, "grpc").await);
    let running: Vec<_> = [ours.clone(), grpc.clone()]
        .into_iter()
        .map(|client| {
            tokio::spawn(async move { client.sleep(sleep(Duration::from_millis(300))).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let shutdown = tokio::spawn(server.shutdown(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    for client in [&ours, &grpc] {
        let status = client.now(()).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status}");
    }
    for call in running {
        call.await
            .unwrap()
            .expect("a call running at the shutdown answers");
    }
    shutdown.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the shutdown took {:?}",
        started.elapsed()
    );
}
