//! gRPC's call model through generated stubs, over TCP and gRPC's HTTP/2 (host) and RDMA
//! (soft-RoCE VM):
//! trailers on unary and streaming responses, statuses with details and metadata, and
//! binary metadata.

mod common;

use futures::StreamExt;
use rdma_rpc::prelude::*;
use rdma_rpc::{MetadataMap, ServerHandle};
use rpc_examples::echo::EchoRequest;
use rpc_examples::streaming::streamer_client::StreamerClient;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::{Chunk, ProduceRequest};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::FailRequest;
use rpc_examples::{Streamer, Tester, FAIL_WITH};

fn builder() -> rdma_rpc::ServerBuilder {
    Server::builder()
        .add_service(TesterServer::new(Tester::default()))
        .add_service(StreamerServer::new(Streamer::default()))
}

fn tcp_server() -> ServerHandle {
    builder().start("tcp://127.0.0.1:0").expect("server starts")
}

fn grpc_server() -> ServerHandle {
    builder()
        .start("grpc://127.0.0.1:0")
        .expect("server starts")
}

fn rdma_server() -> ServerHandle {
    common::start_rdma(builder(), Default::default())
}

fn metadata(entries: &[(&str, &[u8])]) -> MetadataMap {
    let mut map = MetadataMap::new();
    for (key, value) in entries {
        map.insert(key, value).unwrap();
    }
    map
}

fn with_metadata<T>(message: T, entries: &MetadataMap) -> Request<T> {
    let mut request = Request::new(message);
    *request.metadata_mut() = entries.clone();
    request
}

/// A unary response's trailers arrive apart from its headers, on small and large responses
/// and on blocking calls; binary metadata crosses both ways byte for byte.
async fn unary_trailers_and_binary_metadata(url: &str) {
    let tester = TesterClient::new(rdma_rpc::connect(url).await.unwrap());
    let binary: Vec<u8> = (0..=255).collect();
    let asked = metadata(&[
        ("trailer-rows", b"12"),
        ("trailer-sum-bin", &[0, 0xff, b'\n']),
    ]);
    let mut sent = asked.clone();
    sent.insert("x-raw-bin", &binary).unwrap();
    for size in [16, 200_000] {
        let echo = EchoRequest {
            payload: vec![7; size].into(),
            seq: 1,
        };
        let response = tester.echo(with_metadata(echo, &sent)).await.unwrap();
        assert_eq!(response.trailers(), &asked, "{size} B");
        assert_eq!(response.metadata().get("x-raw-bin"), Some(&binary[..]));
        assert_eq!(response.get_ref().payload.len(), size);
    }
    let plain = tester.echo(EchoRequest::default()).await.unwrap();
    assert!(plain.trailers().is_empty());

    let blocking = tester.clone();
    let request = with_metadata(EchoRequest::default(), &sent);
    let response = tokio::task::spawn_blocking(move || blocking.echo_blocking(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.trailers(), &asked, "blocking");
}

/// A handler's status reaches the caller with its code, its unicode message, its details
/// and its metadata; details beyond the metadata limit are left out, and the message says
/// so.
async fn statuses_carry_details_and_metadata(url: &str) {
    let tester = TesterClient::new(rdma_rpc::connect(url).await.unwrap());
    let details: Vec<u8> = (0..=255).rev().collect();
    let sent = metadata(&[("x-retry-after-ms", b"250"), ("x-why-bin", &[0xff, 0])]);
    let fail = FailRequest {
        code: Code::FailedPrecondition as u32,
        message: "r\u{e9}sum\u{e9} locked \u{2713}".into(),
        details: details.clone(),
    };
    let status = tester.fail(with_metadata(fail, &sent)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(status.message(), "r\u{e9}sum\u{e9} locked \u{2713}");
    assert_eq!(status.details(), &details[..]);
    assert_eq!(status.metadata(), &sent);

    let oversized = FailRequest {
        code: Code::Aborted as u32,
        message: "conflict".into(),
        details: vec![1; rdma_rpc::MAX_METADATA_LEN],
    };
    let status = tester.fail(oversized).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    assert!(status.details().is_empty());
    assert!(
        status
            .message()
            .starts_with("conflict [trailing metadata and details left out"),
        "{status}"
    );
    // The connection carries on.
    tester.echo(EchoRequest::default()).await.unwrap();
}

/// Streaming calls end with the trailers their handler set, whether the stream ends OK or
/// with an error (whose status carries its details and the trailers as its metadata);
/// a client-streaming call's response holds them as a unary one's does.
async fn streams_end_with_trailers(url: &str) {
    let client = StreamerClient::new(rdma_rpc::connect(url).await.unwrap());
    let asked = metadata(&[("trailer-count", b"3"), ("trailer-tag-bin", &[1, 2, 0])]);
    let produce = ProduceRequest {
        count: 3,
        size: 10,
        ..Default::default()
    };
    let mut stream = client
        .produce(with_metadata(produce, &asked))
        .await
        .unwrap()
        .into_inner();
    let mut read = 0;
    while let Some(chunk) = stream.next().await {
        chunk.unwrap();
        read += 1;
    }
    assert_eq!(read, 3);
    assert_eq!(stream.trailers(), Some(&asked));

    let failing = ProduceRequest {
        fail_code: Code::DataLoss as u32,
        fail_after: 2,
        ..produce
    };
    let mut stream = client
        .produce(with_metadata(failing, &asked))
        .await
        .unwrap()
        .into_inner();
    let items: Vec<_> = stream.by_ref().collect().await;
    assert_eq!(items.len(), 3, "2 messages, then the status");
    let status = items[2].as_ref().unwrap_err();
    assert_eq!(status.code(), Code::DataLoss);
    assert_eq!(status.details(), 2u64.to_le_bytes());
    assert_eq!(status.metadata(), &asked);
    assert_eq!(stream.trailers(), Some(&asked));

    let chunks = futures::stream::iter((0..4).map(|index| Chunk {
        index,
        payload: vec![0; 8].into(),
    }));
    let summary = client.consume(with_metadata(chunks, &asked)).await.unwrap();
    assert_eq!(summary.get_ref().chunks, 4);
    assert_eq!(summary.trailers(), &asked);

    let mut refused = asked.clone();
    refused.insert(FAIL_WITH, "7").unwrap();
    let none = futures::stream::iter(Vec::<Chunk>::new());
    let status = client
        .chat(with_metadata(none, &refused))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(status.metadata(), &asked);
}

/// Streaming requests and headers with more than a ring slot of metadata come whole;
/// trailers larger than the transport carries in one frame (an RDMA ring slot, 8 KiB by
/// default) are left out and the stream still ends, an error's message saying so; TCP
/// carries them whole.
async fn trailers_beyond_a_frame(url: &str, carried: bool) {
    let client = StreamerClient::new(rdma_rpc::connect(url).await.unwrap());
    let big = metadata(&[("trailer-big-bin", &[7; 10 * 1024])]);
    let produce = ProduceRequest {
        count: 2,
        size: 8,
        ..Default::default()
    };
    // Headers of more than a slot come whole on every transport (by RDMA WRITE on RDMA).
    let headers = metadata(&[("header-big-bin", &[8; 10 * 1024])]);
    let response = client
        .produce(with_metadata(produce, &headers))
        .await
        .unwrap();
    assert_eq!(response.metadata(), &headers);
    assert_eq!(response.into_inner().count().await, 2);

    let mut stream = client
        .produce(with_metadata(produce, &big))
        .await
        .unwrap()
        .into_inner();
    let items: Vec<_> = stream.by_ref().collect().await;
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(Result::is_ok));
    let expected = if carried {
        big.clone()
    } else {
        MetadataMap::new()
    };
    assert_eq!(stream.trailers(), Some(&expected));

    let failing = ProduceRequest {
        fail_code: Code::DataLoss as u32,
        fail_after: 1,
        ..produce
    };
    let items: Vec<_> = client
        .produce(with_metadata(failing, &big))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    let status = items.last().unwrap().as_ref().unwrap_err();
    assert_eq!(status.code(), Code::DataLoss);
    if carried {
        assert_eq!(status.metadata(), &big);
        assert_eq!(status.details(), 1u64.to_le_bytes());
    } else {
        assert!(status.metadata().is_empty() && status.details().is_empty());
        assert!(
            status
                .message()
                .starts_with("failed after 1 chunks [trailing metadata and details left out"),
            "{status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_trailers_beyond_a_frame() {
    let server = tcp_server();
    trailers_beyond_a_frame(server.local_url(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_trailers_beyond_a_frame() {
    let server = rdma_server();
    trailers_beyond_a_frame(server.local_url(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_unary_trailers_and_binary_metadata() {
    let server = tcp_server();
    unary_trailers_and_binary_metadata(server.local_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_statuses_carry_details_and_metadata() {
    let server = tcp_server();
    statuses_carry_details_and_metadata(server.local_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_streams_end_with_trailers() {
    let server = tcp_server();
    streams_end_with_trailers(server.local_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_unary_trailers_and_binary_metadata() {
    let server = rdma_server();
    unary_trailers_and_binary_metadata(server.local_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_statuses_carry_details_and_metadata() {
    let server = rdma_server();
    statuses_carry_details_and_metadata(server.local_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_streams_end_with_trailers() {
    let server = rdma_server();
    streams_end_with_trailers(server.local_url()).await;
}

/// Our client and server speaking gRPC over HTTP/2: every part of the call model crosses
/// as gRPC's headers and trailers (`-bin` in base64, details as
/// `grpc-status-details-bin`), trailers of 10 KiB included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_carries_the_whole_call_model() {
    let server = grpc_server();
    let url = server.local_url();
    unary_trailers_and_binary_metadata(url).await;
    statuses_carry_details_and_metadata(url).await;
    streams_end_with_trailers(url).await;
    trailers_beyond_a_frame(url, true).await;
}

/// The call model against a gRPC server we did not write (Python's grpcio serving the same
/// Tester and Streamer): trailers, binary metadata, statuses with details and metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_server_carries_the_call_model() {
    let peer = common::grpcio::GrpcioServer::start();
    unary_trailers_and_binary_metadata(peer.url()).await;
    streams_end_with_trailers(peer.url()).await;
}
