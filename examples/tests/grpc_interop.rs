//! Python's grpcio, a gRPC peer we did not write, both ways: its client against our
//! `grpc://` server (the gRPC interop suite's cases, `examples/tests/grpc/interop.py`, and
//! what the server saw of them), and our generated client against its server
//! (`examples/tests/grpc/server.py`). Needs `python3` with `grpcio` and `grpcio-tools` (the
//! README's test command installs them); a machine without them fails here, naming them.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_rpc::prelude::*;
use rdma_rpc::{Code, ServerHandle};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::{BulkRequest, FailRequest, SleepRequest};
use rpc_examples::{Streamer, StreamerStats, Tester, TesterStats};

struct Served {
    server: ServerHandle,
    tester: Arc<TesterStats>,
    streamer: Arc<StreamerStats>,
}

fn serve() -> Served {
    let (builder, tester, streamer) = common::grpcio::interop_services();
    let server = builder
        .start("grpc://127.0.0.1:0")
        .expect("the grpc:// server starts");
    Served {
        server,
        tester,
        streamer,
    }
}

/// Runs the interop script's `cases` against `server`; panics with its output if one fails.
fn run_cases(server: &ServerHandle, cases: &[&str]) {
    let target = server.local_url().trim_start_matches("grpc://");
    common::grpcio::run_cases(target, None, cases);
}

/// Waits for `done` to hold (what a handler's end counts arrives after the client's
/// status).
fn eventually(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn unary_calls_metadata_and_statuses() {
    let served = serve();
    run_cases(
        &served.server,
        &[
            "empty_unary",
            "large_unary",
            "metadata",
            "status_code_and_message",
            "unimplemented",
            "panic",
            "too_large",
            "concurrent",
            "health",
            "reflection",
        ],
    );
}

#[test]
fn every_streaming_shape() {
    let served = serve();
    run_cases(
        &served.server,
        &[
            "server_streaming",
            "server_streaming_error",
            "client_streaming",
            "ping_pong",
            "empty_stream",
            "stream_fails_before_headers",
        ],
    );
    // The stream that failed stopped at its error; every other ran to its end.
    assert_eq!(served.streamer.produce_dropped.load(Ordering::SeqCst), 1);
}

/// A deadline ends the handler, a cancel stops it: the server's handlers are dropped, not
/// left running.
#[test]
fn deadlines_and_cancellation_reach_the_handlers() {
    let served = serve();
    run_cases(&served.server, &["deadline", "cancel"]);
    eventually("both sleeps were dropped", || {
        served.tester.sleeps_dropped.load(Ordering::SeqCst) == 2
    });
    assert_eq!(served.tester.sleeps_finished.load(Ordering::SeqCst), 0);
    eventually("both produce streams were dropped", || {
        served.streamer.produce_dropped.load(Ordering::SeqCst) == 2
    });
}

/// Our generated client against grpcio's server: large messages both ways, a unicode
/// status with details, an unimplemented method, a deadline and a cancel that reach the
/// server's handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_against_grpcio() {
    let peer = common::grpcio::GrpcioServer::start();
    let channel = rdma_rpc::client()
        .max_message_size(16 << 20)
        .connect(peer.url())
        .await
        .unwrap();
    let tester = TesterClient::new(channel);

    let payload = rpc_examples::bulk_pattern(5 << 20, 9);
    let reply = tester
        .bulk(BulkRequest {
            reply_len: 7 << 20,
            seed: 9,
            payload: payload.into(),
            delay: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.matched && reply.received == 5 << 20);
    assert!(reply.payload == rpc_examples::bulk_pattern(7 << 20, 9));

    let message = "\t\ntest with whitespace\r\nand Unicode BMP \u{263a} and non-BMP \u{1f608}\t\n";
    let status = tester
        .fail(FailRequest {
            code: Code::Unknown as u32,
            message: message.into(),
            details: vec![8, 2, 0xff],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unknown);
    assert_eq!(status.message(), message);
    assert_eq!(status.details(), [8, 2, 0xff]);

    // An error after the headers (no message): its status, not a missing message.
    let mut request = Request::new(FailRequest {
        code: Code::NotFound as u32,
        message: "no such row".into(),
        details: Vec::new(),
    });
    request.metadata_mut().insert("headers-first", "1").unwrap();
    let status = tester.fail(request).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status}");
    assert_eq!(status.message(), "no such row");

    let status = tester.panic(()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status}");

    let sleep = || SleepRequest {
        duration: Some(prost_types::Duration {
            seconds: 20,
            nanos: 0,
        }),
    };
    let started = Instant::now();
    let mut request = Request::new(sleep());
    request.set_timeout(Duration::from_millis(300));
    let status = tester.sleep(request).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let cancelled = tokio::time::timeout(Duration::from_millis(300), tester.sleep(sleep())).await;
    assert!(cancelled.is_err(), "the sleep answered early");
    eventually("grpcio saw both sleeps end early", || {
        let now = futures::executor::block_on(tester.now(())).unwrap();
        now.metadata().get("sleeps-cancelled") == Some(&b"2"[..])
    });
}

/// A graceful shutdown of the server (HTTP/2 GOAWAY) lets a running stream finish on our
/// client: the connection's end reaches the channel once its calls ended, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_finishes_its_stream_through_a_goaway() {
    use futures::StreamExt;
    use rpc_examples::streaming::streamer_client::StreamerClient;
    use rpc_examples::streaming::ProduceRequest;

    let served = serve();
    let url = served.server.local_url().to_owned();
    let client = StreamerClient::new(rdma_rpc::connect(&url).await.unwrap());
    let ask = ProduceRequest {
        count: 30,
        size: 10,
        interval: Some(prost_types::Duration {
            seconds: 0,
            nanos: 20_000_000,
        }),
        ..Default::default()
    };
    let mut stream = client.produce(ask).await.unwrap().into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.index, 0);
    let server = served.server;
    let shutdown = std::thread::spawn(move || server.shutdown_blocking(Duration::from_secs(10)));
    let mut read = 1;
    while let Some(chunk) = stream.next().await {
        assert_eq!(
            chunk.unwrap().index,
            read,
            "the stream was cut by the GOAWAY"
        );
        read += 1;
    }
    assert_eq!(read, 30);
    shutdown.join().unwrap();
}

/// A client-streaming method called through a `Method` that does not say so is answered
/// by a gRPC server in the stream shape: the call fails, naming the fix, instead of
/// returning a default message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_streaming_method_not_declared_so_fails_clearly() {
    use rpc_examples::streaming::{Chunk, ConsumeSummary};

    static UNDECLARED: rdma_rpc::Method = rdma_rpc::Method::new("/rpc.streaming.Streamer/Consume");
    let served = serve();
    let channel = rdma_rpc::connect(served.server.local_url()).await.unwrap();
    let chunks = futures::stream::iter(vec![Chunk::default()]);
    let answer = channel
        .client_streaming::<_, Chunk, ConsumeSummary>(&UNDECLARED, Request::new(chunks))
        .await;
    let status = answer.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(
        status.message().contains("MethodKind::ClientStreaming"),
        "{status}"
    );
}

/// `grpcs://`: our server with a certificate of a test authority; grpcio and our client
/// trusting that authority call it, and both refuse it when they trust another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_our_authority_and_refused_with_another() {
    use rdma_rpc::{ClientTls, GrpcClientConfig, GrpcServerConfig, ServeOptions, ServerTls};
    use rpc_examples::streaming::streamer_server::StreamerServer;
    use rpc_examples::testing::tester_server::TesterServer;

    let pki = common::tls::TestPki::new();
    let other = common::tls::TestPki::new();
    let grpc = GrpcServerConfig {
        tls: Some(ServerTls::from_pem_files(pki.cert(), pki.key()).unwrap()),
        ..Default::default()
    };
    let server = Server::builder()
        .add_service(TesterServer::new(Tester::default()))
        .add_service(StreamerServer::new(Streamer::default()))
        .start_with(
            "grpcs://127.0.0.1:0",
            ServeOptions {
                grpc,
                ..Default::default()
            },
        )
        .unwrap();
    let port = server.local_url().rsplit(':').next().unwrap().to_owned();
    let target = format!("localhost:{port}");
    let cases = ["empty_unary", "metadata", "server_streaming", "ping_pong"];
    let (ca, other_ca) = (pki.ca(), other.ca());
    tokio::task::spawn_blocking(move || {
        common::grpcio::run_cases(&target, Some(&ca), &cases);
        common::grpcio::run_cases(&target, Some(&other_ca), &["refused"]);
    })
    .await
    .unwrap();

    let trusting = |ca| GrpcClientConfig {
        tls: Some(ClientTls::trusting_pem_file(ca).unwrap()),
        ..Default::default()
    };
    let url = format!("grpcs://localhost:{port}");
    let channel = rdma_rpc::client()
        .grpc_config(trusting(pki.ca()))
        .connect(&url)
        .await
        .unwrap();
    let now = TesterClient::new(channel).now(()).await.unwrap();
    assert!(now.get_ref().seconds > 0);
    let refused = rdma_rpc::client()
        .grpc_config(trusting(other.ca()))
        .connect(&url)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("TLS handshake"), "{refused}");
    // Plaintext to a TLS port, and TLS without authorities, are refused too.
    let plain = rdma_rpc::client()
        .connect_timeout(Duration::from_secs(2))
        .connect(&format!("grpc://localhost:{port}"))
        .await;
    let status = match plain {
        Ok(channel) => TesterClient::new(channel).now(()).await.unwrap_err(),
        Err(e) => rdma_rpc::Status::from(e),
    };
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    // The name checked may be given apart from the URL (a balanced channel's URLs hold
    // addresses): the certificate's name passes, another does not.
    let by_address = format!("grpcs://127.0.0.1:{port}");
    for (name, passes) in [("localhost", true), ("elsewhere.example", false)] {
        let config = GrpcClientConfig {
            tls_server_name: Some(name.to_owned()),
            ..trusting(pki.ca())
        };
        let connected = rdma_rpc::client()
            .grpc_config(config)
            .connect(&by_address)
            .await;
        assert_eq!(connected.is_ok(), passes, "{name}: {:?}", connected.err());
    }
    let unset = rdma_rpc::client().connect(&url).await.unwrap_err();
    assert!(
        unset.to_string().contains("authorities to trust"),
        "{unset}"
    );
}
