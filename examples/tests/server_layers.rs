//! Tower layers around a server's calls (`Server::builder().layer(...)`, as tonic's), over
//! TCP (host) and RDMA (soft-RoCE VM): a timeout, a concurrency limit with load shedding,
//! and layers of the application's own that see every call, unary and streaming, in the
//! order they were added.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use rdma_rpc::prelude::*;
use rdma_rpc::server::ServerCall;
use rdma_rpc::ServerHandle;
use rpc_examples::echo::EchoRequest;
use rpc_examples::streaming::streamer_client::StreamerClient;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::{Chunk, ProduceRequest};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::{Streamer, Tester};
use tower::ServiceBuilder;

/// What a test waits for a server-side counter before it fails: generous, for emulation.
const LIVENESS: Duration = Duration::from_secs(60);

fn sleep(ms: u64) -> SleepRequest {
    SleepRequest {
        duration: Some(Duration::from_millis(ms).try_into().unwrap()),
    }
}

fn start(url: &str, builder: rdma_rpc::ServerBuilder) -> ServerHandle {
    if url == "rdma" {
        common::start_rdma(builder, Default::default())
    } else {
        builder.start("tcp://127.0.0.1:0").expect("server starts")
    }
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let until = Instant::now() + LIVENESS;
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A timeout layer ends a slow handler `DEADLINE_EXCEEDED` and drops it; a quick call
/// passes.
async fn a_timeout_layer_ends_slow_handlers(transport: &str) {
    let tester = Tester::default();
    let server = start(
        transport,
        Server::builder()
            .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(
                300,
            )))
            .add_service(TesterServer::new(tester.clone())),
    );
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let status = client.sleep(sleep(20_000)).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(status.message().contains("timeout layer"), "{status}");
    eventually("the handler dropped", || {
        tester.stats.sleeps_dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    client.sleep(sleep(1)).await.expect("a quick call passes");
}

/// A concurrency limit behind a load shed: a call beyond the limit is refused
/// `UNAVAILABLE` at once, and passes once the call holding the permit ended (cancelled
/// here: the holder sleeps far longer than the refused call can take, however slow the
/// machine).
async fn a_concurrency_limit_sheds_calls_beyond_it(transport: &str) {
    let tester = Tester::default();
    let server = start(
        transport,
        Server::builder()
            .layer(
                ServiceBuilder::new()
                    .load_shed()
                    .concurrency_limit(1)
                    .into_inner(),
            )
            .add_service(TesterServer::new(tester.clone())),
    );
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let holder = tokio::spawn(client.sleep(sleep(600_000)));
    eventually("the first call runs", || {
        tester.stats.sleeps_started.load(Ordering::SeqCst) == 1
    })
    .await;
    let status = client.echo(EchoRequest::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains("load-shed"), "{status}");
    holder.abort();
    eventually("the holder's handler ended", || {
        tester.stats.sleeps_dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    client
        .echo(EchoRequest::default())
        .await
        .expect("room again");
}

/// Layers of the application's own see every call, streaming ones too, outermost first;
/// a layer may refuse a call with a status of its own.
async fn every_call_passes_the_layers_in_order(transport: &str) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = |layer: &'static str| {
        let seen = seen.clone();
        tower::util::MapRequestLayer::new(move |call: ServerCall| {
            let path = call
                .method()
                .expect("a server's call names its method")
                .path;
            seen.lock().push((layer, path));
            call
        })
    };
    let gate = tower::layer::layer_fn(|inner: rdma_rpc::server::CallStack| {
        tower::service_fn(move |call: ServerCall| {
            let mut inner = inner.clone();
            async move {
                if call.metadata.get("x-deny").is_some() {
                    let status = Status::permission_denied("denied by the gate layer");
                    return Err(tower::BoxError::from(status));
                }
                let ready = tower::ServiceExt::ready(&mut inner).await?;
                tower::Service::call(ready, call).await
            }
        })
    });
    let server = start(
        transport,
        Server::builder()
            .layer(record("outer"))
            .layer(gate)
            .layer(record("inner"))
            .add_service(TesterServer::new(Tester::default()))
            .add_service(StreamerServer::new(Streamer::default())),
    );
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
    let tester = TesterClient::new(channel.clone());
    let streamer = StreamerClient::new(channel);

    tester.echo(EchoRequest::default()).await.unwrap();
    let produce = ProduceRequest {
        count: 2,
        size: 8,
        ..Default::default()
    };
    let produced = streamer.produce(produce).await.unwrap().into_inner();
    assert_eq!(produced.count().await, 2);
    let chunks = futures::stream::iter((0..3).map(|index| Chunk {
        index,
        payload: vec![0; 8].into(),
    }));
    assert_eq!(streamer.consume(chunks).await.unwrap().get_ref().chunks, 3);
    let mut denied = Request::new(EchoRequest::default());
    denied.metadata_mut().insert("x-deny", "1").unwrap();
    let status = tester.echo(denied).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert_eq!(status.message(), "denied by the gate layer");

    let echo = "/rpc.testing.Tester/Echo";
    let expected = [
        ("outer", echo),
        ("inner", echo),
        ("outer", "/rpc.streaming.Streamer/Produce"),
        ("inner", "/rpc.streaming.Streamer/Produce"),
        ("outer", "/rpc.streaming.Streamer/Consume"),
        ("inner", "/rpc.streaming.Streamer/Consume"),
        // The gate refused the last call before the inner layer saw it.
        ("outer", echo),
    ];
    assert_eq!(*seen.lock(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_a_timeout_layer_ends_slow_handlers() {
    a_timeout_layer_ends_slow_handlers("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_a_concurrency_limit_sheds_calls_beyond_it() {
    a_concurrency_limit_sheds_calls_beyond_it("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_every_call_passes_the_layers_in_order() {
    every_call_passes_the_layers_in_order("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_a_timeout_layer_ends_slow_handlers() {
    a_timeout_layer_ends_slow_handlers("rdma").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_a_concurrency_limit_sheds_calls_beyond_it() {
    a_concurrency_limit_sheds_calls_beyond_it("rdma").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_every_call_passes_the_layers_in_order() {
    every_call_passes_the_layers_in_order("rdma").await;
}
