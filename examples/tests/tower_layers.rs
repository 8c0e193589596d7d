//! Generated clients over tower layers (over TCP): a timeout, a concurrency limit with load
//! shedding, and retries within a budget compose with a channel as they do with tonic's,
//! their errors reaching the caller as statuses; streaming calls pass layers too.

use std::future::Ready;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdma_rpc::prelude::*;
use rdma_rpc::{ServerHandle, StreamCall, StreamShape, UnaryCall};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::{Echo, EchoServer};
use rpc_examples::echo::{EchoReply, EchoRequest};
use rpc_examples::streaming::streamer_client::StreamerClient;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::{Chunk, ProduceRequest};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::{Streamer, Tester};
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::Policy;
use tower::ServiceBuilder;

fn sleep(ms: u64) -> SleepRequest {
    SleepRequest {
        duration: Some(Duration::from_millis(ms).try_into().unwrap()),
    }
}

async fn tester() -> (ServerHandle, Channel) {
    let server = Server::builder()
        .add_service(TesterServer::new(Tester::default()))
        .start("tcp://127.0.0.1:0")
        .unwrap();
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
    (server, channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_ends_a_slow_call_deadline_exceeded() {
    let (server, channel) = tester().await;
    // The layer's budget leaves a quick call room even under emulation (the VM runs this
    // test too), and the slow call sleeps far beyond it.
    let client = TesterClient::new(
        ServiceBuilder::new()
            .timeout(Duration::from_millis(500))
            .service(channel.clone()),
    );
    let started = Instant::now();
    let status = client.sleep(sleep(20_000)).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(status.message().contains("timeout layer"), "{status}");
    assert!(started.elapsed() < Duration::from_secs(10));
    client.sleep(sleep(1)).await.expect("a quick call passes");

    // The blocking form runs the stack on this runtime.
    let blocking = tokio::task::spawn_blocking(move || client.sleep_blocking(sleep(20_000)));
    let status = blocking.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_with_load_shedding_refuses_beyond_the_limit() {
    let (server, channel) = tester().await;
    let client = TesterClient::new(
        ServiceBuilder::new()
            .load_shed()
            .concurrency_limit(2)
            .service(channel),
    );
    let running: Vec<_> = (0..2)
        .map(|_| tokio::spawn(client.sleep(sleep(3_000))))
        .collect();
    // They hold the two permits from their first poll until their answers, 3 s later.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let status = client.sleep(sleep(1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains("load-shed"), "{status}");
    for call in running {
        call.await
            .unwrap()
            .expect("the calls within the limit finish");
    }
    client.sleep(sleep(1)).await.expect("room again");
    server.shutdown(Duration::ZERO).await;
}

/// Fails every other call `UNAVAILABLE`, or every call; counts what it saw.
#[derive(Clone, Default)]
struct Flaky {
    seen: Arc<AtomicUsize>,
    always: bool,
}

impl Echo for Flaky {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst);
        if self.always || n.is_multiple_of(2) {
            return Err(Status::unavailable("flaky"));
        }
        let EchoRequest { payload, seq } = request.into_inner();
        Ok(Response::new(EchoReply { payload, seq }))
    }
}

/// Retries `UNAVAILABLE` while the budget allows (tower's own retry budget).
#[derive(Clone)]
struct RetryUnavailable(Arc<TpsBudget>);

impl<Res> Policy<UnaryCall, Res, Status> for RetryUnavailable {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut UnaryCall, result: &mut Result<Res, Status>) -> Option<Ready<()>> {
        match result {
            Ok(_) => {
                self.0.deposit();
                None
            }
            Err(status) if status.code() == Code::Unavailable && self.0.withdraw() => {
                Some(std::future::ready(()))
            }
            Err(_) => None,
        }
    }

    fn clone_request(&mut self, call: &UnaryCall) -> Option<UnaryCall> {
        Some(call.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_within_a_budget() {
    for always in [false, true] {
        let flaky = Flaky {
            always,
            ..Flaky::default()
        };
        let server = Server::builder()
            .add_service(EchoServer::new(flaky.clone()))
            .start("tcp://127.0.0.1:0")
            .unwrap();
        let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
        // Retries as many calls as succeed, plus a reserve of 10 (10 s × 1/s); a
        // withdrawal ages out of the budget after 10 s, so only a run that slow
        // earns more retries.
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 1.0));
        let started = Instant::now();
        let client = EchoClient::new(
            ServiceBuilder::new()
                .retry(RetryUnavailable(budget))
                .service(channel),
        );
        let mut answered = 0;
        for seq in 0..100 {
            match client
                .echo(EchoRequest {
                    payload: Default::default(),
                    seq,
                })
                .await
            {
                Ok(reply) => {
                    assert_eq!(reply.get_ref().seq, seq);
                    answered += 1;
                }
                Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status}"),
            }
        }
        let seen = flaky.seen.load(Ordering::SeqCst);
        if always {
            assert_eq!(answered, 0);
            // No success deposits anything: only the reserve is retried, all of it
            // at once, and again for every 10 s the calls took.
            let refills = started.elapsed().as_secs() as usize / 10;
            assert!(
                (110..=110 + 10 * refills).contains(&seen),
                "the server saw {seen} calls in {:?}",
                started.elapsed()
            );
        } else {
            assert_eq!(answered, 100, "every failed call was retried once");
            assert_eq!(seen, 200);
        }
        server.shutdown(Duration::ZERO).await;
    }
}

async fn streamer() -> (ServerHandle, Channel, Streamer) {
    let streamer = Streamer::default();
    let server = Server::builder()
        .add_service(StreamerServer::new(streamer.clone()))
        .start("tcp://127.0.0.1:0")
        .unwrap();
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
    (server, channel, streamer)
}

fn chunks(count: u64) -> impl futures::Stream<Item = Chunk> + Send + 'static {
    futures::stream::iter((0..count).map(|index| Chunk {
        index,
        payload: rpc_examples::bulk_pattern(16, 0).into(),
    }))
}

/// Every shape of streaming call goes through the client's layers, which see its method
/// and shape; the calls work as over the channel itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_calls_pass_the_layers() {
    let (server, channel, _) = streamer().await;
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let client = StreamerClient::new(
        ServiceBuilder::new()
            .map_request(move |call: StreamCall| {
                recorded.lock().push((call.method().path(), call.shape()));
                call
            })
            .service(channel),
    );
    let produce = ProduceRequest {
        count: 5,
        size: 8,
        ..Default::default()
    };
    let mut produced = client.produce(produce).await.unwrap().into_inner();
    let mut read = 0;
    while let Some(chunk) = produced.message().await.unwrap() {
        assert_eq!(chunk.index, read);
        read += 1;
    }
    assert_eq!(read, 5);
    let summary = client.consume(chunks(7)).await.unwrap().into_inner();
    assert_eq!((summary.chunks, summary.in_order), (7, true));
    let echoed: Vec<_> = client
        .chat(chunks(3))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(echoed.len(), 3);
    assert!(echoed.iter().all(Result::is_ok));
    let failing = ProduceRequest {
        fail_code: Code::Aborted as u32,
        fail_after: 1,
        ..produce
    };
    let items: Vec<_> = client
        .produce(failing)
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(
        items.last().unwrap().as_ref().unwrap_err().code(),
        Code::Aborted
    );

    let path = |method: &str| format!("/rpc.streaming.Streamer/{method}");
    let expected = [
        (path("Produce"), StreamShape::Server),
        (path("Consume"), StreamShape::Client),
        (path("Chat"), StreamShape::Bidirectional),
        (path("Produce"), StreamShape::Server),
    ];
    let seen: Vec<_> = seen
        .lock()
        .iter()
        .map(|(p, s)| (p.to_string(), *s))
        .collect();
    assert_eq!(seen, expected);
    server.shutdown(Duration::ZERO).await;
}

/// A timeout layer ends a client-streaming call whose answer does not come in time (its
/// request stream never ends) `DEADLINE_EXCEEDED`, and the server's handler stops reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_ends_a_stream_that_takes_too_long() {
    let (server, channel, streamer) = streamer().await;
    let client = StreamerClient::new(
        ServiceBuilder::new()
            .timeout(Duration::from_millis(300))
            .service(channel),
    );
    let endless = chunks(2).chain(futures::stream::pending());
    let started = Instant::now();
    let status = client.consume(endless).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(status.message().contains("timeout layer"), "{status}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The server read what came, and the call is over there too: a shutdown finds no
    // handler to wait for.
    let until = Instant::now() + Duration::from_secs(10);
    while streamer.stats.consumed.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < until,
            "the server never read the two chunks"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let shutting = Instant::now();
    server.shutdown(Duration::from_secs(20)).await;
    assert!(
        shutting.elapsed() < Duration::from_secs(10),
        "the handler still ran"
    );
}
