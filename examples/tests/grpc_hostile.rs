//! The `grpc://` server against HTTP/2 clients that misbehave (h2's client, driven by
//! hand): a peer that does not speak HTTP/2, requests that are not gRPC, a client that
//! never reads its stream, and a graceful shutdown under a running call.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Request, StatusCode};
use prost::Message;
use rdma_rpc::prelude::*;
use rdma_rpc::{GrpcServerConfig, ServeOptions, ServerHandle};
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::ProduceRequest;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::{Streamer, StreamerStats, Tester};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn serve(streamer: Streamer) -> ServerHandle {
    serve_with(streamer, GrpcServerConfig::default())
}

fn serve_with(streamer: Streamer, grpc: GrpcServerConfig) -> ServerHandle {
    Server::builder()
        .add_service(TesterServer::new(Tester::default()))
        .add_service(StreamerServer::new(streamer))
        .start_with(
            "grpc://127.0.0.1:0",
            ServeOptions {
                grpc,
                ..Default::default()
            },
        )
        .expect("the grpc:// server starts")
}

fn addr(server: &ServerHandle) -> SocketAddr {
    server
        .local_url()
        .trim_start_matches("grpc://")
        .parse()
        .unwrap()
}

/// `message` after gRPC's prefix.
fn framed(message: &impl Message) -> Bytes {
    let encoded = message.encode_to_vec();
    let mut out = BytesMut::new();
    out.put_u8(0);
    out.put_u32(encoded.len() as u32);
    out.put_slice(&encoded);
    out.freeze()
}

async fn connect(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

fn grpc_request(addr: SocketAddr, path: &str) -> Request<()> {
    Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// Sends one gRPC call of `path` with `message`; the response headers, body and trailers.
async fn call(
    client: &mut h2::client::SendRequest<Bytes>,
    request: Request<()>,
    message: Bytes,
) -> (StatusCode, HeaderMap, Bytes, Option<HeaderMap>) {
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(message, true).unwrap();
    let (parts, mut body) = response.await.unwrap().into_parts();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.put_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap();
    (parts.status, parts.headers, data.freeze(), trailers)
}

fn grpc_status(headers: &HeaderMap) -> Option<&str> {
    headers.get("grpc-status").map(|v| v.to_str().unwrap())
}

/// A peer that does not speak HTTP/2 is closed; the server goes on serving others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_speaking_no_http2_is_closed_and_others_go_on() {
    let server = serve(Streamer::default());
    let addr = addr(&server);
    let mut raw = TcpStream::connect(addr).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nnot a preface at all")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server kept a peer that speaks no HTTP/2"
    );
    let mut client = connect(addr).await;
    let (status, headers, body, trailers) = call(
        &mut client,
        grpc_request(addr, "/rpc.testing.Tester/Now"),
        framed(&()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(grpc_status(&trailers.unwrap()), Some("0"), "{headers:?}");
    assert!(body.len() > 5, "a timestamp came back");
}

/// A request that is not gRPC gets HTTP's answer and runs nothing; a gRPC call of a path
/// nobody serves is `UNIMPLEMENTED` in a Trailers-Only response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_are_not_grpc_calls() {
    let server = serve(Streamer::default());
    let addr = addr(&server);
    let mut client = connect(addr).await;
    let json = Request::post(format!("http://{addr}/rpc.testing.Tester/Now"))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (status, ..) = call(&mut client, json, Bytes::from_static(b"{}")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, headers, body, trailers) = call(
        &mut client,
        grpc_request(addr, "/rpc.testing.Tester/Nope"),
        framed(&()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        grpc_status(&headers),
        Some("12"),
        "Trailers-Only: {headers:?}"
    );
    assert!(body.is_empty() && trailers.is_none());
    let message = headers.get("grpc-message").unwrap().to_str().unwrap();
    assert!(message.contains("/rpc.testing.Tester/Nope"), "{message}");
}

/// A client that never reads its stream holds the handler to the windows: HTTP/2's, and
/// the dispatcher's stream window behind it, not the 100,000 messages it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_holds_its_handler() {
    let streamer = Streamer::default();
    let stats: std::sync::Arc<StreamerStats> = streamer.stats.clone();
    let server = serve(streamer);
    let addr = addr(&server);
    let mut client = connect(addr).await;
    let ask = ProduceRequest {
        count: 100_000,
        size: 1024,
        ..Default::default()
    };
    let request = grpc_request(addr, "/rpc.streaming.Streamer/Produce");
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(framed(&ask), true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Produced messages stop growing once the windows are full.
    let mut last = u64::MAX;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = stats.produced.load(Ordering::SeqCst);
        if now == last {
            break;
        }
        assert!(Instant::now() < until, "the handler never stopped: {now}");
        last = now;
    }
    // HTTP/2's window (64 KiB) and the dispatcher's initial window (64 messages), plus
    // what is on its way between them.
    assert!(
        last < 300,
        "{last} messages produced for a client that read none"
    );
    // Dropping the stream (h2 resets it) cancels the handler.
    drop((response, send));
    let until = Instant::now() + Duration::from_secs(10);
    while stats.produce_dropped.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < until, "the stream was not cancelled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A request message that never arrives whole fails its call after the read timeout, and
/// the handler never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_arrives_whole_times_out() {
    let server = serve_with(
        Streamer::default(),
        GrpcServerConfig {
            request_read_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    );
    let addr = addr(&server);
    let mut client = connect(addr).await;
    let request = grpc_request(addr, "/rpc.testing.Tester/Now");
    let (response, mut send) = client.send_request(request, false).unwrap();
    // A prefix announcing 100 bytes, and 10 of them.
    let mut partial = BytesMut::new();
    partial.put_u8(0);
    partial.put_u32(100);
    partial.put_slice(&[0; 10]);
    send.send_data(partial.freeze(), false).unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the server answered")
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "answered after {waited:?}"
    );
    assert_eq!(grpc_status(response.headers()), Some("4"), "{response:?}");
    let message = response.headers()["grpc-message"].to_str().unwrap();
    assert!(message.contains("request_read_timeout"), "{message}");
}

/// The handler runs under what is left of the client's deadline once its request arrived,
/// not the whole of it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_gets_what_is_left_of_the_deadline() {
    let server = serve(Streamer::default());
    let addr = addr(&server);
    let mut client = connect(addr).await;
    let mut request = grpc_request(addr, "/rpc.testing.Tester/Sleep");
    request
        .headers_mut()
        .insert("grpc-timeout", "1000m".parse().unwrap());
    let (response, mut send) = client.send_request(request, false).unwrap();
    // Half the budget goes by before the request arrives; the handler sleeps 700 ms.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sleep = SleepRequest {
        duration: Some(prost_types::Duration {
            seconds: 0,
            nanos: 700_000_000,
        }),
    };
    send.send_data(framed(&sleep), true).unwrap();
    let response = response.await.unwrap();
    let (parts, mut body) = response.into_parts();
    while body.data().await.is_some() {}
    let trailers = body.trailers().await.unwrap();
    let status = grpc_status(trailers.as_ref().unwrap_or(&parts.headers));
    assert_eq!(status, Some("4"), "the handler slept past the deadline");
}

/// A graceful shutdown lets a running call answer and tells the client with GOAWAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_lets_a_running_call_answer() {
    let server = serve(Streamer::default());
    let addr = addr(&server);
    let client = connect(addr).await;
    let sleep = SleepRequest {
        duration: Some(prost_types::Duration {
            seconds: 0,
            nanos: 300_000_000,
        }),
    };
    let running = tokio::spawn({
        let mut client = client.clone();
        async move {
            call(
                &mut client,
                grpc_request(addr, "/rpc.testing.Tester/Sleep"),
                framed(&sleep),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let shutdown = tokio::task::spawn_blocking(move || {
        server.shutdown_blocking(Duration::from_secs(5));
    });
    let (status, headers, _, trailers) = running.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        grpc_status(trailers.as_ref().unwrap_or(&headers)),
        Some("0"),
        "the running call answered"
    );
    shutdown.await.unwrap();
    // After GOAWAY, a new call is refused by HTTP/2 itself (or finds the server gone).
    let refused = match client.ready().await {
        Err(_) => true,
        Ok(mut ready) => {
            match ready.send_request(grpc_request(addr, "/rpc.testing.Tester/Now"), true) {
                Err(_) => true,
                Ok((response, _)) => response.await.is_err(),
            }
        }
    };
    assert!(refused, "a call after the shutdown was taken");
}

/// A connection with no call for `idle_timeout` is closed (GOAWAY); one whose call runs
/// longer than that is not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_busy_ones_are_not() {
    let server = serve_with(
        Streamer::default(),
        GrpcServerConfig {
            idle_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    );
    let addr = addr(&server);
    let open = |addr| async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        (client, tokio::spawn(connection))
    };
    // A call of 600 ms, twice the idle time, answers; then the connection idles and ends.
    let (mut client, connection) = open(addr).await;
    let sleep = SleepRequest {
        duration: Some(prost_types::Duration {
            seconds: 0,
            nanos: 600_000_000,
        }),
    };
    let started = Instant::now();
    let (status, headers, _, trailers) = call(
        &mut client,
        grpc_request(addr, "/rpc.testing.Tester/Sleep"),
        framed(&sleep),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        grpc_status(trailers.as_ref().unwrap_or(&headers)),
        Some("0")
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(ended.is_ok(), "the idle connection was kept");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(850),
        "closed after {waited:?}"
    );
    // One that never calls is closed too.
    let (_client, connection) = open(addr).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(ended.is_ok(), "a connection that never called was kept");
}
