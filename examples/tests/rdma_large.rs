//! Large messages over real verbs: bodies beyond a ring slot travel by RDMA WRITE into a
//! buffer the receiver grants, or are read by the server from where the client offers them
//! (run in the soft-RoCE VM by `cargo xtask test`).
//!
//! Sizes from a slot through 256 MiB in both directions, requests read by RDMA READ from
//! `read_from` on, 1 GiB once each way, small calls
//! running while a large transfer is on the wire, cancel and deadline mid-transfer, and
//! sizes beyond the configured limits. Ignored by a plain `cargo test` (they need a device);
//! `cargo xtask test` runs them in the soft-RoCE VM with `--include-ignored`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_rpc::prelude::*;
use rdma_rpc::{CallTable, ChannelConfig, LargeBodies, RdmaConfig, ServeOptions, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::BulkRequest;
use rpc_examples::{bulk_pattern, EchoService, Tester};
use rpc_transport_rdma::verbs::test_support::{require_device, test_addr};
use rpc_transport_rdma::RdmaClient;

const MIB: usize = 1 << 20;
/// Message limit of these tests' clients and servers: room for 1 GiB plus framing.
const LIMIT: usize = (1 << 30) + MIB;
const SLOT: usize = 8192;

/// Tests that move hundreds of MiB at once take turns: each pins its bodies on both sides
/// (plus the test's own copies), and two at once come near the VM's memory (6 GiB).
static BIG_BODIES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn big_bodies() -> std::sync::MutexGuard<'static, ()> {
    BIG_BODIES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn device() -> bool {
    // RUST_LOG=rpc_transport_rdma=debug shows the transport's side of a failure.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    require_device().is_some()
}

fn start(rdma: RdmaConfig) -> ServerHandle {
    common::start_rdma(
        Server::builder()
            .max_message_size(LIMIT)
            .add_service(EchoServer::new(EchoService))
            .add_service(TesterServer::new(Tester::default())),
        rdma,
    )
}

fn connect(server: &ServerHandle) -> Channel {
    connect_with(server, RdmaConfig::default())
}

fn connect_with(server: &ServerHandle, rdma: RdmaConfig) -> Channel {
    rdma_rpc::client()
        .max_message_size(LIMIT)
        .rdma_config(rdma)
        .connect_blocking(server.local_url())
        .expect("rdma client connects")
}

/// One bulk call: sends `request_len` bytes of pattern, asks for `reply_len` back, and
/// checks both directions arrived intact.
fn bulk(client: &TesterClient, request_len: usize, reply_len: usize, seed: u64) {
    let payload = bulk_pattern(request_len, seed);
    let reply = client
        .bulk_blocking(BulkRequest {
            reply_len: reply_len as u64,
            seed,
            payload: payload.into(),
            delay: None,
        })
        .unwrap_or_else(|e| panic!("bulk {request_len} -> {reply_len}: {e}"))
        .into_inner();
    assert_eq!(reply.received, request_len as u64);
    assert!(reply.matched, "request of {request_len} bytes corrupted");
    assert_eq!(reply.payload.len(), reply_len);
    assert!(
        reply.payload[..] == bulk_pattern(reply_len, seed)[..],
        "response of {reply_len} bytes corrupted"
    );
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn bodies_from_a_slot_to_256_mib_in_both_directions() {
    if !device() {
        return;
    }
    let _turn = big_bodies();
    let server = start(RdmaConfig::default());
    // Requests read by the server (the default), and written into its grants.
    let read = TesterClient::new(connect(&server));
    let written = TesterClient::new(connect_with(
        &server,
        RdmaConfig::default().large(LargeBodies::default().read_from(u64::MAX)),
    ));
    let sizes = [
        SLOT - 100,
        SLOT - 1,
        SLOT,
        SLOT + 1,
        64 * 1024 + 3,
        MIB,
        16 * MIB + 5,
        256 * MIB,
    ];
    for (i, &size) in sizes.iter().enumerate() {
        // 256 MiB, most of the test's time, goes once: the ways differ only in how a
        // body starts to move, which the smaller sizes cover.
        let ways: &[(&str, &TesterClient)] = if size < 256 * MIB {
            &[("read", &read), ("written", &written)]
        } else {
            &[("read", &read)]
        };
        for &(way, client) in ways {
            let started = Instant::now();
            bulk(client, size, size, i as u64);
            eprintln!(
                "{size} bytes each way, request {way}: ok in {:?}",
                started.elapsed()
            );
        }
    }
    // One direction at a time, and the pool reusing its buffers.
    for client in [&read, &written] {
        bulk(client, 3 * MIB, 10, 77);
        bulk(client, 10, 3 * MIB, 78);
        bulk(client, 3 * MIB, 3 * MIB, 79);
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn repeated_large_responses_go_straight_into_an_advertised_buffer() {
    if !device() {
        return;
    }
    let server = start(RdmaConfig::default());
    let calls = Arc::new(CallTable::new());
    let addr = server.local_url().trim_start_matches("rdma://");
    let transport =
        RdmaClient::connect(addr, calls.clone(), &RdmaConfig::default()).expect("connects");
    let config = ChannelConfig {
        max_message_size: LIMIT,
        ..ChannelConfig::default()
    };
    let client = TesterClient::new(Channel::new(calls, transport.clone(), config));
    let buffers = |transport: &RdmaClient| {
        let stats = transport.stats();
        (
            stats.response_buffers_advertised,
            stats.response_buffers_filled,
        )
    };

    // The first large answer of a method takes the rendezvous and teaches its size.
    bulk(&client, 100, MIB, 1);
    assert_eq!(buffers(&transport), (0, 0));
    // The next request advertises a buffer that size, and the answer goes straight in.
    bulk(&client, 100, MIB, 2);
    assert_eq!(buffers(&transport), (1, 1));
    // A larger answer than advertised takes the rendezvous (the offer is revoked) ...
    bulk(&client, 100, 3 * MIB, 3);
    assert_eq!(buffers(&transport), (2, 1));
    // ... and the next one is expected that large.
    bulk(&client, 64, 3 * MIB, 4);
    assert_eq!(buffers(&transport), (3, 2));
    // A small answer ends the offer and the prediction.
    bulk(&client, 64, 10, 5);
    bulk(&client, 64, 10, 6);
    assert_eq!(buffers(&transport), (4, 2));
    // A large request with an advertised response buffer, both ways at once.
    bulk(&client, 2 * MIB, MIB, 7);
    bulk(&client, 2 * MIB, MIB, 8);
    assert_eq!(buffers(&transport), (5, 3));

    // Every advertised window was revoked once its answer came.
    let deadline = Instant::now() + Duration::from_secs(5);
    while transport.stats().large_grants > 0 {
        assert!(Instant::now() < deadline, "{:?}", transport.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn request_bodies_from_read_from_on_are_read_by_the_server() {
    if !device() {
        return;
    }
    let server = start(RdmaConfig::default());
    let calls = Arc::new(CallTable::new());
    let addr = server.local_url().trim_start_matches("rdma://");
    let rdma = RdmaConfig::default().large(LargeBodies::default().read_from(MIB as u64));
    let transport = RdmaClient::connect(addr, calls.clone(), &rdma).expect("connects");
    let config = ChannelConfig {
        max_message_size: LIMIT,
        ..ChannelConfig::default()
    };
    let client = TesterClient::new(Channel::new(calls, transport.clone(), config));
    let ways = |transport: &RdmaClient| {
        let stats = transport.stats();
        (stats.large_sourced, stats.large_rendezvous)
    };
    // Below `read_from`: the rendezvous.
    bulk(&client, MIB - 100, 0, 1);
    assert_eq!(ways(&transport), (0, 1));
    // From it on, read by the server, in one chunk or many, with a large answer beside.
    bulk(&client, MIB, 0, 2);
    bulk(&client, 3 * MIB + 7, 0, 3);
    bulk(&client, 16 * MIB, 2 * MIB, 4);
    assert_eq!(ways(&transport), (3, 1), "{:?}", transport.stats());
    // Every source window was revoked and its body freed once the server was done.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = transport.stats();
        if stats.large_transfers == 0 && stats.large_grants == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{stats:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Many large requests at once on one connection: as many are offered for reading as its
/// `max_grants` windows allow, and the rest take the rendezvous; every bind and
/// invalidation fits the send queue, and every call succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn many_large_requests_at_once_share_the_windows() {
    if !device() {
        return;
    }
    const CALLS: u64 = 48;
    let server = start(RdmaConfig::default());
    let calls = Arc::new(CallTable::new());
    let addr = server.local_url().trim_start_matches("rdma://");
    let transport =
        RdmaClient::connect(addr, calls.clone(), &RdmaConfig::default()).expect("connects");
    let client = TesterClient::new(Channel::new(
        calls,
        transport.clone(),
        ChannelConfig::default(),
    ));
    let replies = futures::future::join_all((0..CALLS).map(|seed| {
        let client = client.clone();
        async move {
            let len = 64 * 1024 + seed as usize;
            let reply = client
                .bulk(BulkRequest {
                    reply_len: 16,
                    seed,
                    payload: bulk_pattern(len, seed).into(),
                    delay: None,
                })
                .await
                .unwrap_or_else(|e| panic!("call {seed}: {e}"))
                .into_inner();
            assert!(reply.matched && reply.received == len as u64, "call {seed}");
        }
    }));
    replies.await;
    let stats = transport.stats();
    eprintln!(
        "{CALLS} requests of 64 KiB at once: {} read, {} written",
        stats.large_sourced, stats.large_rendezvous
    );
    assert_eq!(stats.large_sourced + stats.large_rendezvous, CALLS);
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn one_gib_each_way() {
    if !device() {
        return;
    }
    let _turn = big_bodies();
    let server = start(RdmaConfig::default());
    let client = TesterClient::new(connect(&server));
    let started = Instant::now();
    bulk(&client, 1 << 30, 0, 1);
    eprintln!("1 GiB request: ok in {:?}", started.elapsed());
    let started = Instant::now();
    bulk(&client, 0, 1 << 30, 2);
    eprintln!("1 GiB response: ok in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn small_calls_keep_flowing_during_a_large_transfer() {
    if !device() {
        return;
    }
    let server = start(RdmaConfig::default());
    let channel = connect(&server);
    let tester = TesterClient::new(channel.clone());
    let echo = EchoClient::new(channel);
    let large = tokio::task::spawn_blocking(move || {
        bulk(&tester, 64 * MIB, 64 * MIB, 5);
        Instant::now()
    });
    // Small calls on the same connection while the large one moves.
    let mut latencies = Vec::new();
    let mut finished_at = Vec::new();
    while !large.is_finished() {
        let started = Instant::now();
        let reply = echo
            .echo(EchoRequest {
                payload: vec![9; 32].into(),
                seq: latencies.len() as u64,
            })
            .await
            .expect("small call during a large transfer")
            .into_inner();
        assert_eq!(reply.payload, vec![9; 32]);
        latencies.push(started.elapsed());
        finished_at.push(Instant::now());
    }
    let large_done = large.await.expect("large call");
    let overtaking = finished_at.iter().filter(|&&t| t < large_done).count();
    latencies.sort_unstable();
    let p50 = latencies
        .get(latencies.len() / 2)
        .copied()
        .unwrap_or_default();
    let max = latencies.last().copied().unwrap_or_default();
    eprintln!(
        "small calls during a 64 MiB echo: {} done before it, p50 {p50:?}, max {max:?}",
        overtaking
    );
    assert!(
        overtaking >= 3,
        "small calls waited for the large transfer ({overtaking} finished before it)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn cancel_and_deadline_in_the_middle_of_a_large_transfer() {
    if !device() {
        return;
    }
    let server = start(RdmaConfig::default());
    let channel = connect(&server);
    let client = TesterClient::new(channel.clone());
    let request = |len: usize, seed: u64| BulkRequest {
        reply_len: len as u64,
        seed,
        payload: bulk_pattern(len, seed).into(),
        delay: None,
    };

    // Deadline: the call ends DEADLINE_EXCEEDED while the body is still being written.
    let mut late = Request::new(request(64 * MIB, 1));
    late.set_timeout(Duration::from_millis(100));
    let err = client.bulk(late).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");

    // Cancel: the future is dropped mid-transfer.
    let dropped = tokio::time::timeout(
        Duration::from_millis(150),
        client.bulk(request(64 * MIB, 2)),
    );
    assert!(
        dropped.await.is_err(),
        "a 64 MiB echo took less than 150 ms"
    );

    // Nothing leaked into later calls: small and large ones still arrive intact.
    for seed in 3..6 {
        let reply = client
            .bulk(request(4 * MIB, seed))
            .await
            .expect("large call after cancellations")
            .into_inner();
        assert!(reply.matched);
        assert!(reply.payload[..] == bulk_pattern(4 * MIB, seed)[..]);
    }
    assert_eq!(channel.in_flight(), 0);
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn sizes_beyond_the_limits_are_refused_with_both_sizes() {
    if !device() {
        return;
    }
    // The server's transport accepts bodies up to 2 MiB; its dispatcher anything.
    let server =
        start(RdmaConfig::default().large(LargeBodies::default().max_message(2 * MIB as u64)));
    let client = TesterClient::new(connect(&server));
    let err = client
        .bulk_blocking(BulkRequest {
            reply_len: 0,
            seed: 1,
            payload: vec![1; 3 * MIB].into(),
            delay: None,
        })
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    let message = err.message();
    assert!(
        message.contains("request of 31457"),
        "names the size: {message}"
    );
    assert!(
        message.contains(&(2 * MIB).to_string()),
        "names the limit: {message}"
    );

    // The dispatcher's limit, which its transport meets before any byte moves: a body may
    // take the message limit plus the metadata limit.
    let small_server = Server::builder()
        .max_message_size(MIB)
        .add_service(TesterServer::new(Tester::default()))
        .start_with(
            &format!("rdma://{}:0", test_addr()),
            ServeOptions::default(),
        )
        .expect("server");
    let client = TesterClient::new(connect(&small_server));
    let err = client
        .bulk_blocking(BulkRequest {
            reply_len: 0,
            seed: 1,
            payload: vec![1; 2 * MIB].into(),
            delay: None,
        })
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    let body_limit = MIB + rdma_rpc::MAX_METADATA_LEN;
    assert!(err.message().contains(&body_limit.to_string()), "{err}");

    // A response beyond the client's own limit... the server refuses nothing, the client
    // still gets every byte or a clear error, never a truncated message.
    let server = start(RdmaConfig::default());
    let client = TesterClient::new(
        rdma_rpc::client()
            .max_message_size(LIMIT)
            .rdma_config(
                RdmaConfig::default().large(LargeBodies::default().max_message(MIB as u64)),
            )
            .connect_blocking(server.local_url())
            .expect("connect"),
    );
    let err = client
        .bulk_blocking(BulkRequest {
            reply_len: 2 * MIB as u64,
            seed: 1,
            payload: Vec::new().into(),
            delay: None,
        })
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains(&MIB.to_string()), "{err}");
}
