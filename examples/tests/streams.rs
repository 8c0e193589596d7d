//! Streaming calls through generated stubs, over TCP (host) and RDMA (soft-RoCE VM): every
//! kind of stream, trailers, flow control, cancellation and deadlines.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdma_rpc::prelude::*;
use rdma_rpc::ServerHandle;
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::streaming::streamer_client::StreamerClient;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::{Chunk, ProduceRequest};
use rpc_examples::{bulk_pattern, EchoService, Streamer, FAIL_WITH, STOP_AFTER};

/// What a test waits for something that must happen (a server reads, a call ends) before it
/// fails: generous, since under emulation (soft-RoCE in a TCG VM) everything is slow and
/// a machine may be several times slower than another.
const LIVENESS: Duration = Duration::from_secs(60);

fn builder(streamer: &Streamer) -> rdma_rpc::ServerBuilder {
    Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(StreamerServer::new(streamer.clone()))
        .max_message_size(4 << 20)
}

fn tcp_server(streamer: &Streamer) -> ServerHandle {
    builder(streamer)
        .start("tcp://127.0.0.1:0")
        .expect("server starts")
}

fn rdma_server(streamer: &Streamer) -> ServerHandle {
    common::start_rdma(builder(streamer), Default::default())
}

async fn connect(url: &str) -> Channel {
    let client = match url.starts_with("tcps://") {
        true => common::tls::trusting(common::tls::TestPki::shared()),
        false => rdma_rpc::client(),
    };
    let client = client.max_message_size(4 << 20);
    client.connect(url).await.expect("connects")
}

fn produce(count: u64, size: u64) -> ProduceRequest {
    ProduceRequest {
        count,
        size,
        ..Default::default()
    }
}

fn chunk(index: u64, size: usize) -> Chunk {
    Chunk {
        index,
        payload: bulk_pattern(size, 0).into(),
    }
}

/// Reads `stream` to its end, checking that each chunk has the next index and passes
/// `check`; returns how many came.
async fn read_in_order(stream: &mut Streaming<Chunk>, check: impl Fn(&Chunk)) -> u64 {
    let mut next = 0;
    while let Some(chunk) = stream.message().await.unwrap() {
        assert_eq!(chunk.index, next);
        check(&chunk);
        next += 1;
    }
    next
}

/// Waits for a server-side counter, which moves on a handler thread.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let until = Instant::now() + LIVENESS;
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Server streaming: every message in order, then the end; an error mid-stream arrives
/// after the messages before it; the blocking iterator sees the same.
async fn server_streams(url: &str) {
    let client = StreamerClient::new(connect(url).await);
    let mut stream = client
        .produce(produce(1000, 100))
        .await
        .unwrap()
        .into_inner();
    let read = read_in_order(&mut stream, |chunk| assert_eq!(chunk.payload.len(), 100));
    assert_eq!(read.await, 1000);
    assert!(stream.trailers().is_some(), "ended by trailers");
    assert!(stream.next().await.is_none(), "stays ended");

    let failing = ProduceRequest {
        fail_code: Code::NotFound as u32,
        fail_after: 5,
        ..produce(100, 10)
    };
    let items: Vec<_> = client
        .produce(failing)
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(items.len(), 6, "5 messages, then the status");
    assert!(items[..5].iter().all(Result::is_ok));
    let status = items[5].as_ref().unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "failed after 5 chunks");

    let blocking = client.clone();
    let counted = tokio::task::spawn_blocking(move || {
        let stream = blocking.produce_blocking(produce(300, 1000)).unwrap();
        stream
            .into_inner()
            .enumerate()
            .all(|(i, chunk)| chunk.unwrap().index == i as u64)
    })
    .await
    .unwrap();
    assert!(counted);
}

/// Client streaming and bidirectional streaming: everything the client sends arrives, in
/// order; the bidirectional echo comes back in order.
async fn client_and_bidi_streams(url: &str) {
    let client = StreamerClient::new(connect(url).await);
    let chunks = futures::stream::iter((0..500).map(|i| chunk(i, 64)));
    let summary = client.consume(chunks).await.unwrap().into_inner();
    assert_eq!(
        (summary.chunks, summary.bytes, summary.in_order),
        (500, 500 * 64, true)
    );

    let blocking = client.clone();
    let summary = tokio::task::spawn_blocking(move || {
        blocking.consume_blocking((0..300).map(|i| chunk(i, 1000)))
    })
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    assert_eq!((summary.chunks, summary.in_order), (300, true));

    let requests = futures::stream::iter((0..400).map(|i| chunk(i, 200)));
    let mut echoes = client.chat(requests).await.unwrap().into_inner();
    assert_eq!(read_in_order(&mut echoes, |_| {}).await, 400);
}

/// Messages too large for an RDMA slot go by RDMA WRITE, each with its own rendezvous,
/// mixed with small ones that overtake them on the wire: all arrive whole and in order, in
/// every kind of stream.
async fn large_messages_stream(url: &str) {
    const SIZES: [usize; 5] = [100, 300_000, 10, 1 << 20, 5000];
    let client = StreamerClient::new(connect(url).await);
    let mut stream = client
        .produce(produce(12, 1 << 20))
        .await
        .unwrap()
        .into_inner();
    let whole = |chunk: &Chunk| assert!(chunk.payload == bulk_pattern(1 << 20, 0));
    assert_eq!(read_in_order(&mut stream, whole).await, 12);

    let sizes = move |i: u64| SIZES[i as usize % SIZES.len()];
    let chunks = futures::stream::iter((0..20).map(move |i| chunk(i, sizes(i))));
    let summary = client.consume(chunks).await.unwrap().into_inner();
    let total: usize = (0..20).map(sizes).sum();
    assert_eq!(
        (summary.chunks, summary.bytes, summary.in_order),
        (20, total as u64, true)
    );

    let requests = futures::stream::iter((0..20).map(move |i| chunk(i, sizes(i))));
    let mut echoes = client.chat(requests).await.unwrap().into_inner();
    let whole = |chunk: &Chunk| {
        let len = sizes(chunk.index);
        assert!(
            chunk.payload == bulk_pattern(len, 0),
            "echo {} corrupted",
            chunk.index
        );
    };
    assert_eq!(read_in_order(&mut echoes, whole).await, 20);
}

/// A stream whose reader stalls stops its sender at the window without holding up other
/// calls on the connection; dropping the stream cancels it at the server promptly.
async fn slow_reader_holds_back_only_its_stream(url: &str) {
    let streamer = Streamer::default();
    let server = start_for(url, &streamer);
    let channel = connect(server.local_url()).await;
    let client = StreamerClient::new(channel.clone());
    let mut stream = client
        .produce(produce(100_000, 1000))
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let produced = streamer.stats.produced.load(Ordering::SeqCst);
    // The default window's bytes bind first here (2 MiB, 16,384 messages): chunks of 1,005
    // encoded bytes go while room is left, the last one overshooting.
    let mut window = rdma_rpc::stream::DEFAULT_STREAM_WINDOW.bytes;
    if url.starts_with("grpc://") {
        // HTTP/2's stream window, the server's send buffer and its queue of answers (the
        // initial stream window) hold more on the way.
        use rdma_rpc::grpc::{HTTP2_SEND_BUFFER, HTTP2_STREAM_WINDOW};
        let queued = rdma_rpc::stream::INITIAL_WINDOW.bytes;
        window += u64::from(HTTP2_STREAM_WINDOW) + HTTP2_SEND_BUFFER as u64 + queued;
    }
    let bound = window.div_ceil(1005) + 1;
    assert!(
        produced <= bound,
        "the server ran {produced} messages ahead of {bound}"
    );

    // Every unary call still completes: one held up behind the stalled stream would wait
    // for ever and fail at its (generous) deadline instead.
    let echo = EchoClient::new(channel.clone());
    for seq in 0..50 {
        let mut request = Request::new(EchoRequest {
            payload: vec![1; 100].into(),
            seq,
        });
        request.set_timeout(Duration::from_secs(10));
        echo.echo(request)
            .await
            .expect("a unary call beside a stalled stream");
    }

    drop(stream);
    eventually("the server stops producing", || {
        streamer.stats.produce_dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    drop(server);
}

/// The deadline covers the whole stream, not just its start.
async fn deadline_covers_the_stream(url: &str) {
    let streamer = Streamer::default();
    let server = start_for(url, &streamer);
    let client = StreamerClient::new(connect(server.local_url()).await);
    // The first call of a process on soft-RoCE can take longer than the whole budget below
    // (the engine's first registrations); the budget is for the stream, so warm up first.
    let mut warm_up = client.produce(produce(1, 10)).await.unwrap().into_inner();
    assert_eq!(read_in_order(&mut warm_up, |_| {}).await, 1);
    let slow = ProduceRequest {
        interval: Some(Duration::from_millis(20).try_into().unwrap()),
        ..produce(1000, 10)
    };
    let mut request = Request::new(slow);
    request.set_timeout(Duration::from_secs(2));
    let started = Instant::now();
    let items: Vec<_> = client
        .produce(request)
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    let elapsed = started.elapsed();
    let last = items.last().unwrap().as_ref().unwrap_err();
    assert_eq!(last.code(), Code::DeadlineExceeded, "{last}");
    // Items came before the deadline ended the stream (about 100 in 2 s; a VM that stalls
    // delivers fewer), and the stream did not run its course (1,000 items, 20 s).
    assert!(
        items.len() >= 2 && items.len() < 500,
        "{} items",
        items.len()
    );
    assert!(elapsed < Duration::from_secs(15), "{elapsed:?}");
    eventually("the server's handler is stopped", || {
        streamer.stats.produce_dropped.load(Ordering::SeqCst) == 1
    })
    .await;
}

/// A client-streaming server that answers before the client's stream ends reads no more of
/// it: an endless async stream and an endless blocking iterator both end with the answer,
/// and the connection serves the next call.
async fn server_answers_early(url: &str) {
    let channel = connect(url).await;
    let client = StreamerClient::new(channel.clone());
    let stop_after = |n: u64| {
        let endless = futures::stream::iter((0..).map(|i| chunk(i, 100)));
        let mut request = Request::new(endless);
        request
            .metadata_mut()
            .insert(STOP_AFTER, n.to_string())
            .unwrap();
        request.set_timeout(LIVENESS);
        request
    };
    let summary = client.consume(stop_after(10)).await.unwrap().into_inner();
    assert_eq!((summary.chunks, summary.in_order), (10, true));

    let blocking = client.clone();
    let summary = tokio::task::spawn_blocking(move || {
        let endless = (0..).map(|i| chunk(i, 100));
        let mut request = Request::new(endless);
        request.metadata_mut().insert(STOP_AFTER, "1000").unwrap();
        request.set_timeout(LIVENESS);
        blocking.consume_blocking::<std::iter::Map<_, _>>(request)
    })
    .await
    .unwrap()
    .expect("the answer, not an error from the stream it cut short")
    .into_inner();
    assert_eq!((summary.chunks, summary.in_order), (1000, true));

    eventually("no call left in flight", || channel.in_flight() == 0).await;
    let chunks = futures::stream::iter((0..5).map(|i| chunk(i, 10)));
    let summary = client.consume(chunks).await.unwrap().into_inner();
    assert_eq!(summary.chunks, 5);
}

/// Panics anywhere in this process so far whose message says a future was polled after it
/// completed (the panic of an `async` block resumed after its end), counted by a panic hook
/// installed on the first call.
fn futures_resumed_after_completion() -> usize {
    use std::sync::atomic::AtomicUsize;
    static RESUMED: AtomicUsize = AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = common::panic_message(info);
            if message.is_some_and(|message| message.contains("resumed after completion")) {
                RESUMED.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
    RESUMED.load(Ordering::SeqCst)
}

/// Client and bidirectional streams whose requests are all sent before the response's
/// headers arrive (the gRPC interop suite's one-message bidi and `status_code_and_message`
/// cases): the requests' sender is not polled again once it finished, neither by a task on
/// the tokio runtime nor, without one, by the response stream in the application's poll.
async fn requests_all_sent_before_the_headers(url: &str) {
    const ROUNDS: usize = 3;
    let resumed = futures_resumed_after_completion();
    let client = StreamerClient::new(connect(url).await);
    fn one() -> futures::stream::Iter<std::option::IntoIter<Chunk>> {
        futures::stream::iter(Some(chunk(0, 10)))
    }
    fn failing() -> Request<futures::stream::Iter<std::option::IntoIter<Chunk>>> {
        let mut request = Request::new(one());
        let code = (Code::InvalidArgument as u16).to_string();
        request.metadata_mut().insert(FAIL_WITH, code).unwrap();
        request
    }

    // On the tokio runtime. A few rounds suffice: one message always leaves before the
    // headers can come back.
    for _ in 0..ROUNDS {
        let mut echoes = client.chat(one()).await.unwrap().into_inner();
        assert_eq!(read_in_order(&mut echoes, |_| {}).await, 1);
        let status = client.chat(failing()).await.expect_err("the asked status");
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, "asked to fail")
        );
        let summary = client.consume(one()).await.unwrap().into_inner();
        assert_eq!(summary.chunks, 1);
    }

    // Without a runtime: the response stream polls what is left of the sender.
    let plain = client.clone();
    std::thread::spawn(move || {
        futures::executor::block_on(async {
            for _ in 0..ROUNDS {
                let mut echoes = plain.chat(one()).await.unwrap().into_inner();
                assert_eq!(read_in_order(&mut echoes, |_| {}).await, 1);
                let status = plain.chat(failing()).await.expect_err("the asked status");
                assert_eq!(status.code(), Code::InvalidArgument);
            }
        })
    })
    .join()
    .expect("the calls without a runtime do not panic");

    // A spawned sender that panicked did so on a worker thread: give it the time to.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        futures_resumed_after_completion(),
        resumed,
        "a future was polled after it completed"
    );
}

/// Polls `opening` once, on a thread of its own: the poll must return (a stream that is
/// always ready must not keep it), and the call must not be over yet.
async fn poll_once<F>(opening: F) -> std::pin::Pin<Box<F>>
where
    F: std::future::Future + Send + 'static,
{
    let runtime = tokio::runtime::Handle::current();
    let (polled, outcome) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _runtime = runtime.enter();
        let mut opening = Box::pin(opening);
        let waker = futures::task::noop_waker();
        let pending = opening
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
            .is_pending();
        let _ = polled.send((pending, opening));
    });
    let (pending, opening) = tokio::time::timeout(LIVENESS, outcome)
        .await
        .expect("one poll of the opening returns")
        .unwrap();
    assert!(pending, "the call is not over");
    opening
}

/// A counter that has stopped moving (sampled 100 ms apart).
async fn settled(counter: &std::sync::atomic::AtomicU64) -> u64 {
    let mut last = counter.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = counter.load(Ordering::SeqCst);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Dropping the future that opens a stream, before it resolves, cancels the call: the
/// server stops producing or reading, nothing stays in flight, the channel serves on.
async fn dropped_opening_cancels(url: &str) {
    let streamer = Streamer::default();
    let server = start_for(url, &streamer);
    let channel = connect(server.local_url()).await;
    let client = StreamerClient::new(channel.clone());

    let endless = futures::stream::iter((0..).map(|i| chunk(i, 100)));
    let opening = poll_once(client.consume(endless)).await;
    // Polled on from here as any task's future is (an RDMA call left unpolled would hold its
    // completion queue's drive lease), and dropped once the server reads.
    let opening = tokio::spawn(opening);
    eventually("the server reads", || {
        streamer.stats.consumed.load(Ordering::SeqCst) > 0
    })
    .await;
    opening.abort();
    assert!(opening.await.unwrap_err().is_cancelled());
    let read = settled(&streamer.stats.consumed).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        streamer.stats.consumed.load(Ordering::SeqCst),
        read,
        "still reading"
    );

    drop(poll_once(client.produce(produce(u64::MAX, 100))).await);
    let produced = settled(&streamer.stats.produced).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        streamer.stats.produced.load(Ordering::SeqCst),
        produced,
        "still producing"
    );

    eventually("no call left in flight", || channel.in_flight() == 0).await;
    let mut stream = client.produce(produce(3, 10)).await.unwrap().into_inner();
    assert_eq!(read_in_order(&mut stream, |_| {}).await, 3);
    drop(server);
}

fn start_for(url: &str, streamer: &Streamer) -> ServerHandle {
    if url.starts_with("rdma://") {
        rdma_server(streamer)
    } else if url.starts_with("tcps://") {
        let pki = common::tls::TestPki::shared();
        common::tls::start_tcps(builder(streamer), pki, Default::default())
    } else if url.starts_with("grpc://") {
        builder(streamer)
            .start("grpc://127.0.0.1:0")
            .expect("server starts")
    } else {
        tcp_server(streamer)
    }
}

/// Runs each suite over every transport, as `suite::tcp`, `suite::tcps` (the same over
/// TLS), `suite::grpc` (our client and server speaking gRPC over HTTP/2) and `suite::rdma`
/// (soft-RoCE, in the VM). A suite
/// takes the scheme (`tcp://`), and starts its server with [`start_for`].
macro_rules! on_every_transport {
    ($($suite:ident),* $(,)?) => {$(
        mod $suite {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tcp() {
                super::$suite("tcp://").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn grpc() {
                super::$suite("grpc://").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tcps() {
                super::$suite("tcps://").await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
            async fn rdma() {
                super::$suite("rdma://").await;
            }
        }
    )*};
}

/// A suite given the server's URL, started for the scheme.
async fn served<F: std::future::Future<Output = ()>>(
    scheme: &str,
    suite: impl FnOnce(String) -> F,
) {
    let server = start_for(scheme, &Streamer::default());
    suite(server.local_url().to_owned()).await;
    drop(server);
}

async fn on_server_streams(scheme: &str) {
    served(scheme, |url| async move { server_streams(&url).await }).await;
}

async fn on_client_and_bidi_streams(scheme: &str) {
    served(
        scheme,
        |url| async move { client_and_bidi_streams(&url).await },
    )
    .await;
}

async fn on_requests_all_sent_before_the_headers(scheme: &str) {
    served(scheme, |url| async move {
        requests_all_sent_before_the_headers(&url).await
    })
    .await;
}

async fn on_large_messages_stream(scheme: &str) {
    served(
        scheme,
        |url| async move { large_messages_stream(&url).await },
    )
    .await;
}

async fn on_server_answers_early(scheme: &str) {
    served(
        scheme,
        |url| async move { server_answers_early(&url).await },
    )
    .await;
}

on_every_transport!(
    on_server_streams,
    on_client_and_bidi_streams,
    on_requests_all_sent_before_the_headers,
    on_large_messages_stream,
    on_server_answers_early,
    slow_reader_holds_back_only_its_stream,
    deadline_covers_the_stream,
    dropped_opening_cancels,
);

/// Our generated clients against a gRPC server we did not write (Python's grpcio serving
/// the same Streamer): every shape, large messages, blocking forms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_server_streams_every_shape() {
    let peer = common::grpcio::GrpcioServer::start();
    server_streams(peer.url()).await;
    client_and_bidi_streams(peer.url()).await;
    large_messages_stream(peer.url()).await;
}
