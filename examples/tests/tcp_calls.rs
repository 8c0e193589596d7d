//! Generated stubs against a real server over TCP: the behaviours every transport must have.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdma_rpc::prelude::*;
use rdma_rpc::ServerHandle;
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::{EchoReply, EchoRequest};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::FailRequest;
use rpc_examples::{EchoService, Tester};

mod common;

use common::{echo_blocking_checked, echo_checked, pattern, sleep_for};

fn start(tester: &Tester) -> ServerHandle {
    Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(TesterServer::new(tester.clone()))
        .max_message_size(1 << 20)
        .start("tcp://127.0.0.1:0")
        .expect("server starts")
}

/// Waits for a server-side counter, which moves on a handler thread.
fn eventually(what: &str, check: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_through_generated_stubs_async_and_blocking() {
    let server = start(&Tester::default());
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
    let client = EchoClient::new(channel.clone());
    let reply = client
        .echo(EchoRequest {
            payload: b"hi".to_vec().into(),
            seq: 7,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        reply,
        EchoReply {
            payload: b"hi".to_vec().into(),
            seq: 7
        }
    );

    let blocking = tokio::task::spawn_blocking(move || {
        client.echo_blocking(EchoRequest {
            payload: pattern(300_000, 3).into(),
            seq: 8,
        })
    })
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    assert_eq!(
        (blocking.seq, blocking.payload),
        (8, pattern(300_000, 3).into())
    );

    // Metadata travels both ways, and well-known types work as messages.
    let tester = TesterClient::new(channel);
    let mut request = Request::new(EchoRequest::default());
    request.metadata_mut().insert("x-trace", "abc").unwrap();
    let response = tester.echo(request).await.unwrap();
    assert_eq!(response.metadata().get("x-trace"), Some(&b"abc"[..]));
    let now = tester.now(()).await.unwrap().into_inner();
    assert!(now.seconds > 1_600_000_000, "server clock: {now:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_calls_on_one_connection() {
    let server = start(&Tester::default());
    let client = EchoClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let calls = (0..1000u64).map(|seq| {
        let client = client.clone();
        async move { echo_checked(&client, seq, &pattern((seq as usize * 37) % 4000, seq)).await }
    });
    // Spawned, so the calls really overlap across the runtime's threads.
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    for result in join_all(handles).await {
        result.unwrap();
    }
    assert_eq!(client.channel().in_flight(), 0);
}

/// Blocking callers read their answers from the socket themselves, one at a time, while
/// the event loop reads for everyone else: with four blocking threads and async calls
/// sharing one connection, every call gets its own answer, none waits for another's, and
/// blocking calls slower than the caller's read (a handler that sleeps) are answered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_async_callers_share_a_connection_and_each_gets_its_answer() {
    share_a_connection(rdma_rpc::client()).await;
}

/// The same with the event loop reading every answer (`tcp_caller_reads(ZERO)`): blocking
/// callers park and are woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_callers_are_woken_when_the_event_loop_reads_every_answer() {
    share_a_connection(rdma_rpc::client().tcp_caller_reads(Duration::ZERO)).await;
}

async fn share_a_connection(builder: rdma_rpc::ClientBuilder) {
    let server = start(&Tester::default());
    let channel = builder.connect(server.local_url()).await.unwrap();
    let client = EchoClient::new(channel.clone());
    let blocking: Vec<_> = (0..4u64)
        .map(|thread| {
            let client = client.clone();
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let seq = thread << 32 | i;
                    echo_blocking_checked(&client, seq, &pattern((i as usize * 13) % 3000, seq));
                }
            })
        })
        .collect();
    let sleeper = {
        let tester = TesterClient::new(channel.clone());
        std::thread::spawn(move || {
            for _ in 0..3 {
                tester
                    .sleep_blocking(sleep_for(Duration::from_millis(60)))
                    .expect("a call slower than a caller's read is answered");
            }
        })
    };
    let calls = (0..400u64).map(|seq| {
        let client = client.clone();
        tokio::spawn(
            async move { echo_checked(&client, seq, &pattern(seq as usize % 500, seq)).await },
        )
    });
    for result in join_all(calls).await {
        result.unwrap();
    }
    tokio::task::spawn_blocking(move || {
        for thread in blocking {
            thread.join().expect("blocking caller");
        }
        sleeper.join().expect("sleeping caller");
    })
    .await
    .unwrap();
    assert_eq!(channel.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_expiry_is_deadline_exceeded_and_stops_the_handler() {
    let tester = Tester::default();
    let server = start(&tester);
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let mut request = Request::new(sleep_for(Duration::from_secs(30)));
    request.set_timeout(Duration::from_millis(100));
    let started = Instant::now();
    let err = client.sleep(request).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    eventually("server stopped the sleeping handler", || {
        tester.stats.sleeps_dropped.load(Ordering::SeqCst) == 1
    });

    // The blocking form times out too.
    let blocking_client = client.clone();
    let err = tokio::task::spawn_blocking(move || {
        let mut request = Request::new(sleep_for(Duration::from_secs(30)));
        request.set_timeout(Duration::from_millis(100));
        blocking_client.sleep_blocking(request)
    })
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    // A short sleep within its deadline still succeeds.
    let mut request = Request::new(sleep_for(Duration::from_millis(10)));
    request.set_timeout(Duration::from_secs(5));
    client.sleep(request).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_method_is_unimplemented() {
    // A server with only the echo service, called through the tester's stubs.
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .start("tcp://127.0.0.1:0")
        .unwrap();
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let err = client.now(()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    assert!(err.message().contains("unknown method"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_resource_exhausted_naming_both_sizes() {
    let server = start(&Tester::default());
    // The client's own limit stops the request before it is sent.
    let small = rdma_rpc::client()
        .max_message_size(1000)
        .connect(server.local_url())
        .await
        .unwrap();
    let request = EchoRequest {
        payload: vec![1; 2000].into(),
        seq: 1,
    };
    let err = EchoClient::new(small)
        .echo(request.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("2005") && err.message().contains("1000"),
        "{err}"
    );

    // The server's limit (1 MiB) refuses a larger request from a more generous client,
    // and the connection stays usable.
    let big = EchoClient::new(
        rdma_rpc::client()
            .max_message_size(4 << 20)
            .connect(server.local_url())
            .await
            .unwrap(),
    );
    let err = big
        .echo(EchoRequest {
            payload: vec![2; 2 << 20].into(),
            seq: 2,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains(&(1u64 << 20).to_string()), "{err}");
    let ok = big.echo(request).await.unwrap().into_inner();
    assert_eq!(ok.payload.len(), 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_reach_the_client_as_their_status() {
    let server = start(&Tester::default());
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    for code in [Code::NotFound, Code::PermissionDenied, Code::Internal] {
        let err = client
            .fail(FailRequest {
                code: code as u32,
                message: format!("no luck: {code}"),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), code);
        assert_eq!(err.message(), format!("no luck: {code}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_answers_internal_and_the_server_lives_on() {
    let server = start(&Tester::default());
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    for _ in 0..3 {
        let err = client.panic(()).await.unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{err}");
        assert!(err.message().contains("panicked"), "{err}");
    }
    let blocking = client.clone();
    let err = tokio::task::spawn_blocking(move || blocking.panic_blocking(()))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    client.echo(EchoRequest::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_dropped_mid_call_leaves_the_server_healthy() {
    let tester = Tester::default();
    let server = start(&tester);
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
    let client = TesterClient::new(channel.clone());

    // Dropping the call future cancels the call at the server.
    let call = client.sleep(sleep_for(Duration::from_secs(30)));
    assert!(tokio::time::timeout(Duration::from_millis(100), call)
        .await
        .is_err());
    eventually("cancel reached the server", || {
        tester.stats.sleeps_dropped.load(Ordering::SeqCst) == 1
    });
    assert_eq!(channel.in_flight(), 0);

    // Dropping a whole connection mid-call does too.
    let doomed = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let pending =
        tokio::spawn(async move { doomed.sleep(sleep_for(Duration::from_secs(30))).await });
    eventually("second sleep started", || {
        tester.stats.sleeps_started.load(Ordering::SeqCst) == 2
    });
    pending.abort();
    eventually("server noticed the closed connection", || {
        tester.stats.sleeps_dropped.load(Ordering::SeqCst) == 2
    });

    // The server still serves, on the old connection and on new ones.
    let reply = client.echo(EchoRequest::default()).await.unwrap();
    assert_eq!(reply.into_inner().seq, 0);
    let fresh = EchoClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    fresh.echo(EchoRequest::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_peers_fail_fast_and_clearly() {
    let err = rdma_rpc::connect("tcp//nowhere").await.unwrap_err();
    assert!(
        err.to_string().contains("invalid URL 'tcp//nowhere'"),
        "{err}"
    );
    let err = rdma_rpc::connect("udp://127.0.0.1:1").await.unwrap_err();
    assert!(
        err.to_string().contains("unsupported scheme 'udp'"),
        "{err}"
    );

    // A port nobody listens on: refused at once, not a hang.
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let err = rdma_rpc::connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    let status: Status = err.into();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains(&port.to_string()), "{status}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_running_calls_and_dead_server_fails_the_rest() {
    let tester = Tester::default();
    let server = start(&tester);
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let finishing = {
        let client = client.clone();
        tokio::spawn(async move { client.sleep(sleep_for(Duration::from_millis(300))).await })
    };
    eventually("sleep started", || {
        tester.stats.sleeps_started.load(Ordering::SeqCst) == 1
    });
    server.shutdown(Duration::from_secs(5)).await;
    finishing
        .await
        .unwrap()
        .expect("the running call finished during shutdown");

    // The server is gone: calls fail with Unavailable at once.
    let err = client.echo(EchoRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    // A server that dies with calls pending fails them with Unavailable too.
    let server = start(&tester);
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let pending = {
        let client = client.clone();
        tokio::spawn(async move { client.sleep(sleep_for(Duration::from_secs(30))).await })
    };
    eventually("long sleep started", || {
        tester.stats.sleeps_started.load(Ordering::SeqCst) == 2
    });
    server.shutdown(Duration::ZERO).await;
    let err = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("pending call ended promptly")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}
