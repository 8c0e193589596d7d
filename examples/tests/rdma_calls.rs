//! Generated stubs over real verbs (run in the soft-RoCE VM by `cargo xtask test`).
//!
//! Every test needs an RDMA device, so a plain `cargo test` ignores them; `cargo xtask test`
//! runs them in the soft-RoCE VM with `--include-ignored` (and RDMA_RPC_REQUIRE_DEVICE=1, so
//! a missing device fails instead of skipping). Queue pairs use `rnr_retry = 0`, so a
//! receive-not-ready anywhere fails the call that hit it.

mod common;

use common::{connect_rdma as connect, echo_blocking_checked, pattern, sleep_for};

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use rdma_rpc::prelude::*;
use rdma_rpc::{RdmaConfig, Rings, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::{EchoService, Tester};
use rpc_transport_rdma::verbs::test_support::{require_device, test_addr};

fn device() -> bool {
    require_device().is_some()
}

fn start(tester: &Tester, rdma: RdmaConfig) -> ServerHandle {
    common::start_rdma(
        Server::builder()
            .add_service(EchoServer::new(EchoService))
            .add_service(TesterServer::new(tester.clone())),
        rdma,
    )
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn echo_over_rdma_through_generated_stubs() {
    if !device() {
        return;
    }
    let server = start(&Tester::default(), RdmaConfig::default());
    assert!(server.local_url().starts_with("rdma://"));
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
    let client = EchoClient::new(channel.clone());
    let reply = client
        .echo(EchoRequest {
            payload: b"over verbs".to_vec().into(),
            seq: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((reply.seq, &reply.payload[..]), (1, &b"over verbs"[..]));

    let blocking = client.clone();
    let reply = tokio::task::spawn_blocking(move || {
        blocking.echo_blocking(EchoRequest {
            payload: pattern(5000, 9).into(),
            seq: 2,
        })
    })
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    assert_eq!(reply.payload, pattern(5000, 9));

    let tester = TesterClient::new(channel);
    let mut request = Request::new(EchoRequest::default());
    request.metadata_mut().insert("x-trace", "rdma").unwrap();
    let response = tester.echo(request).await.unwrap();
    assert_eq!(response.metadata().get("x-trace"), Some(&b"rdma"[..]));

    // A handler that panics on the server's poller thread answers INTERNAL; the
    // connection lives on.
    let err = tester.panic(()).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    tester.echo(EchoRequest::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn ten_thousand_calls_sixteen_in_flight_with_checksums() {
    if !device() {
        return;
    }
    let server = start(&Tester::default(), RdmaConfig::default());
    let client = EchoClient::new(connect(&server, RdmaConfig::default()));
    let results: Vec<u64> = stream::iter(0..10_000u64)
        .map(|seq| {
            let client = client.clone();
            async move {
                let payload = pattern((seq as usize * 7) % 3000, seq);
                let sum = checksum(&payload);
                let reply = client
                    .echo(EchoRequest {
                        payload: payload.into(),
                        seq,
                    })
                    .await
                    .unwrap();
                let reply = reply.into_inner();
                assert_eq!(reply.seq, seq);
                assert_eq!(checksum(&reply.payload), sum, "payload of call {seq}");
                seq
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(results.len(), 10_000);
    assert_eq!(client.channel().in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn slow_server_exhausts_credits_without_rnr_or_loss() {
    if !device() {
        return;
    }
    // Four slots: 64 concurrent slow calls need far more credits than the rings hold, so
    // callers wait for credits (back-pressure) instead of overrunning the server.
    let small = RdmaConfig::default().rings(Rings::default().slots(4));
    let tester = Tester::default();
    let server = start(&tester, small.clone());
    let client = TesterClient::new(connect(&server, small));
    let started = Instant::now();
    let calls = (0..64).map(|_| {
        let client = client.clone();
        tokio::spawn(async move { client.sleep(sleep_for(Duration::from_millis(20))).await })
    });
    for call in futures::future::join_all(calls).await {
        call.unwrap().expect("slow call succeeds");
    }
    assert_eq!(tester.stats.sleeps_finished.load(Ordering::SeqCst), 64);
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Thousands of calls given up on (1 ms deadlines against 0-3 ms handlers) on four-slot
/// rings, from two runtime threads: their Cancels race the `Writable`s of the sends and
/// completions around them. Every call ends, with its answer or DEADLINE_EXCEEDED, and the
/// connection still serves calls afterwards. (A Cancel sent while a `Writable` was being
/// handled once locked its thread up for good on the queued-controls mutex.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn cancels_racing_back_pressure_never_hang() {
    if !device() {
        return;
    }
    let small = RdmaConfig::default().rings(Rings::default().slots(4));
    let server = start(&Tester::default(), small.clone());
    let client = TesterClient::new(connect(&server, small));
    let run = stream::iter(0..3_000u64)
        .map(|n| {
            let client = client.clone();
            async move {
                let mut request = Request::new(sleep_for(Duration::from_micros(n % 4 * 1000)));
                request.set_timeout(Duration::from_millis(1));
                match client.sleep(request).await {
                    Ok(_) => true,
                    Err(status) => {
                        assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
                        false
                    }
                }
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<bool>>();
    let outcomes = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("every call ends");
    let answered = outcomes.iter().filter(|&&ok| ok).count();
    eprintln!("3000 calls: {answered} answered, the rest past their deadline");
    client
        .sleep(sleep_for(Duration::ZERO))
        .await
        .expect("the connection lives on");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn messages_at_slot_size_and_one_byte_either_side() {
    if !device() {
        return;
    }
    let config = RdmaConfig::default().rings(Rings::default().slot_size(4096));
    let server = start(&Tester::default(), config.clone());
    let client = EchoClient::new(connect(&server, config));
    // Frame = header (compact: no deadline) + EchoRequest{payload: n} encoded as
    // 1 + 2 (varint) + n bytes.
    let payload_for_frame = |frame: usize| frame - rdma_rpc::COMPACT_HEADER_LEN - 3;
    // 4097 no longer fits a slot: that body goes by RDMA WRITE, transparently.
    for frame in [4095, 4096, 4097] {
        let payload = pattern(payload_for_frame(frame), frame as u64);
        let reply = client
            .echo_blocking(EchoRequest {
                payload: payload.clone().into(),
                seq: 0,
            })
            .unwrap_or_else(|e| panic!("frame of {frame} bytes: {e}"))
            .into_inner();
        assert_eq!(reply.payload, payload, "frame of {frame} bytes");
    }
    // The connection is still fine.
    client.echo_blocking(EchoRequest::default()).unwrap();
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn eight_threads_share_one_client() {
    if !device() {
        return;
    }
    let server = start(&Tester::default(), RdmaConfig::default());
    let client = EchoClient::new(connect(&server, RdmaConfig::default()));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                for i in 0..300u64 {
                    let seq = t * 1000 + i;
                    echo_blocking_checked(&client, seq, &pattern(64 + (i as usize % 512), seq));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn thirty_two_concurrent_connections() {
    if !device() {
        return;
    }
    let config = RdmaConfig::default().rings(Rings::default().slots(8));
    let server = start(&Tester::default(), config.clone());
    let clients: Vec<EchoClient> = (0..32)
        .map(|_| EchoClient::new(connect(&server, config.clone())))
        .collect();
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, client)| {
            std::thread::spawn(move || {
                for i in 0..20u64 {
                    let seq = c as u64 * 100 + i;
                    let reply = client
                        .echo_blocking(EchoRequest {
                            payload: pattern(100, seq).into(),
                            seq,
                        })
                        .unwrap()
                        .into_inner();
                    assert_eq!((reply.seq, reply.payload), (seq, pattern(100, seq).into()));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn server_gone_mid_call_is_unavailable_promptly() {
    if !device() {
        return;
    }
    let tester = Tester::default();
    let server = start(&tester, RdmaConfig::default());
    let client = TesterClient::new(connect(&server, RdmaConfig::default()));
    let pending = {
        let client = client.clone();
        tokio::spawn(async move { client.sleep(sleep_for(Duration::from_secs(60))).await })
    };
    let until = Instant::now() + Duration::from_secs(10);
    while tester.stats.sleeps_started.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < until, "the call never reached the server");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.shutdown(Duration::ZERO).await;
    let err = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the pending call ended promptly")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let err = client.now(()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn killed_server_process_fails_pending_calls_with_unavailable() {
    if !device() {
        return;
    }
    let port = 20_000 + (std::process::id() % 10_000) as u16;
    let url = format!("rdma://{}:{port}", test_addr());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_echo-server"))
        .arg(&url)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("echo-server starts");
    let channel = {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match rdma_rpc::connect_blocking(&url) {
                Ok(channel) => break channel,
                Err(e) if Instant::now() < until => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("echo-server never came up: {e}"),
            }
        }
    };
    let client = Arc::new(EchoClient::new(channel));
    client.echo_blocking(EchoRequest::default()).unwrap();
    let worker = {
        let client = client.clone();
        std::thread::spawn(move || loop {
            if let Err(status) = client.echo_blocking(EchoRequest {
                payload: vec![7; 1000].into(),
                seq: 0,
            }) {
                return status;
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    let _ = child.wait();
    let killed_at = Instant::now();
    let status = worker.join().unwrap();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(
        killed_at.elapsed() < Duration::from_secs(30),
        "took {:?}",
        killed_at.elapsed()
    );
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn connecting_where_nobody_listens_fails_fast_and_clearly() {
    if !device() {
        return;
    }
    let url = format!("rdma://{}:1", test_addr());
    let started = Instant::now();
    let err = rdma_rpc::connect_blocking(&url).unwrap_err();
    let status: Status = err.into();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains(&url), "{status}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Both sides start with the smallest window (three receives posted, two data credits); 16
/// calls in flight make each side double the other's window until it covers them. Every
/// call completes, and the client ends up with more credits than it started with. The send
/// ring (two slots at first) stays small while calls go one at a time and grows under 16.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn smallest_windows_grow_under_sixteen_calls_in_flight() {
    if !device() {
        return;
    }
    let rdma = RdmaConfig::default().rings(Rings::default().recv_window(Some(3)));
    let server = start(&Tester::default(), rdma.clone());
    let calls = Arc::new(rdma_rpc::CallTable::new());
    let addr = server.local_url().trim_start_matches("rdma://");
    let transport = rpc_transport_rdma::RdmaClient::connect(addr, calls.clone(), &rdma)
        .expect("rdma client connects");
    assert_eq!(
        transport.stats().send_credits,
        3,
        "the server's initial window"
    );
    let channel = Channel::new(calls, transport.clone(), rdma_rpc::ChannelConfig::default());
    let client = EchoClient::new(channel);
    for seq in 0..200 {
        client.echo(EchoRequest::default()).await.expect("a call");
        assert_eq!(
            transport.stats().send_slots,
            rpc_transport_rdma::DEFAULT_SEND_WINDOW,
            "calls one at a time grew the send ring (call {seq})"
        );
    }
    let done: Vec<u64> = stream::iter(0..2_000u64)
        .map(|seq| {
            let client = client.clone();
            async move {
                let mut request = Request::new(EchoRequest {
                    payload: pattern(64, seq).into(),
                    seq,
                });
                request.set_timeout(Duration::from_secs(20));
                client.echo(request).await.expect("a call").into_inner().seq
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert_eq!(done.len(), 2_000);
    let stats = transport.stats();
    assert!(
        stats.send_credits + stats.pending_credit_return > 3 && stats.recv_window > 3,
        "neither window grew: {stats:?}"
    );
    assert!(stats.recv_window <= RdmaConfig::default().rings.slots);
    assert!(
        stats.send_slots > rpc_transport_rdma::DEFAULT_SEND_WINDOW,
        "sixteen in flight never grew the send ring: {stats:?}"
    );
}
