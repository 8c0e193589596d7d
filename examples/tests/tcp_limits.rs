//! The bounds of TCP connections, hit by raw peers that misbehave: peers that stop reading,
//! trickle frames, sit idle or come one too many. Each test names the limit it hits.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::join_all;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use rdma_rpc::body::RawBody;
use rdma_rpc::frame::OutgoingFrame;
use rdma_rpc::prelude::*;
use rdma_rpc::{ConnectionLimits, FrameKind, Header, MetadataMap, ServeOptions, ServerHandle};
use rdma_rpc::{TcpServerConfig, TransportKind};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::{BulkRequest, SleepRequest};
use rpc_examples::Tester;

const SLEEP: u32 = rdma_rpc::method_id("/rpc.testing.Tester/Sleep");
const BULK: u32 = rdma_rpc::method_id("/rpc.testing.Tester/Bulk");
/// `TCP_ESTABLISHED` of the kernel's `tcp_states.h`.
const TCP_ESTABLISHED: u8 = 1;

fn limits(stall: Duration, read: Duration) -> ConnectionLimits {
    ConnectionLimits {
        write_queue: 256 * 1024,
        stall_limit: stall,
        read_timeout: read,
        ..ConnectionLimits::default()
    }
}

fn start(tcp: TcpServerConfig) -> ServerHandle {
    start_with(&Tester::default(), tcp)
}

fn start_with(tester: &Tester, tcp: TcpServerConfig) -> ServerHandle {
    Server::builder()
        .add_service(TesterServer::new(tester.clone()))
        .max_message_size(4 << 20)
        .start_with(
            "tcp://127.0.0.1:0",
            ServeOptions {
                tcp,
                ..Default::default()
            },
        )
        .expect("server starts")
}

fn addr(server: &ServerHandle) -> String {
    let endpoint: rdma_rpc::Endpoint = server.local_url().parse().unwrap();
    assert_eq!(endpoint.kind(), TransportKind::Tcp);
    endpoint.authority()
}

fn sleep_request(d: Duration) -> SleepRequest {
    SleepRequest {
        duration: Some(d.try_into().expect("small duration")),
    }
}

/// One request frame, encoded as a raw peer sends it.
fn request(call_id: u64, method_id: u32, message: &impl Message) -> Vec<u8> {
    let mut header = Header::new(FrameKind::Request, call_id);
    header.method_id = method_id;
    let payload = message.encode_to_vec();
    let body = RawBody(&payload);
    let metadata = MetadataMap::new();
    let frame = OutgoingFrame::new(header, &metadata, &body).unwrap();
    let mut out = vec![0; frame.len()];
    frame.write_to(&mut out);
    out
}

/// Reads until the server closes the connection; returns how long that took, or fails if
/// it stays open past `within`.
fn closed_within(stream: &mut TcpStream, within: Duration) -> Duration {
    let start = Instant::now();
    stream.set_read_timeout(Some(within)).unwrap();
    let mut sink = vec![0; 64 * 1024];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return start.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return start.elapsed(),
            Err(e) => panic!("the server kept the connection open for {within:?}: {e}"),
        }
        assert!(
            start.elapsed() < within,
            "the server kept the connection open"
        );
    }
}

/// The kernel's TCP state of `stream` (`TCP_ESTABLISHED` until the peer closes or resets).
fn tcp_state(stream: &TcpStream) -> u8 {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes into it.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        assert_eq!(rc, 0, "getsockopt(TCP_INFO)");
        info.tcpi_state
    }
}

/// Runs `f` on a thread and fails if it has not returned within `limit` (a test of a
/// transport that blocks would otherwise hang instead of failing).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still running after {limit:?}: blocked"))
}

/// A client floods a handler that awaits with requests whose replies it never reads. Its
/// replies fill its own output queue, the server stops reading its requests, and after the
/// stall limit it is disconnected; meanwhile another client's calls, which need the same
/// handler runtime, are answered as usual.
#[test]
fn a_client_that_never_reads_is_cut_off_and_delays_no_one() {
    let tester = Tester::default();
    let server = start_with(
        &tester,
        TcpServerConfig {
            limits: limits(Duration::from_secs(2), Duration::from_secs(30)),
            ..Default::default()
        },
    );
    let addr = addr(&server);
    let hostile = TcpStream::connect(&addr).unwrap();
    hostile
        .set_write_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let started = Instant::now();
    let flood = {
        let mut hostile = hostile.try_clone().unwrap();
        std::thread::spawn(move || {
            let bulk = BulkRequest {
                reply_len: 64 * 1024,
                seed: 1,
                payload: Vec::new().into(),
                delay: None,
            };
            let sleep = sleep_request(Duration::from_millis(1));
            let mut sent = 0u64;
            for call in 1..=4000u64 {
                let frame = if call % 2 == 0 {
                    request(call, BULK, &bulk)
                } else {
                    request(call, SLEEP, &sleep)
                };
                // The server stops reading once its replies back up: our write times out.
                if hostile.write_all(&frame).is_err() {
                    break;
                }
                sent = call;
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(300));

    let channel = rdma_rpc::connect_blocking(server.local_url()).unwrap();
    let client = TesterClient::new(channel);
    for i in 0..50 {
        let mut req = sleep_request(Duration::from_millis(1)).into_request();
        req.set_timeout(Duration::from_secs(2));
        client
            .sleep_blocking(req)
            .unwrap_or_else(|status| panic!("call {i} of the polite client: {status}"));
    }
    let sent = flood.join().unwrap();
    assert!(sent > 0, "the flood sent nothing");
    // Reading would make it a polite client; watch its TCP state instead.
    let until = Instant::now() + Duration::from_secs(20);
    while tcp_state(&hostile) == TCP_ESTABLISHED {
        assert!(
            Instant::now() < until,
            "the server kept the flooding client"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let read = tester.stats.sleeps_started.load(Ordering::Relaxed);
    eprintln!(
        "flood of {sent} requests cut off after {:?}; the server started {read} of its 2,000 \
         sleeps",
        started.elapsed()
    );
    assert!(
        read < 1000,
        "the server kept reading requests whose answers could not leave: {read} sleeps ran"
    );
    assert_eq!(
        client
            .sleep_blocking(sleep_request(Duration::from_millis(1)))
            .map(drop),
        Ok(()),
        "the server still serves after cutting off the flood"
    );
}

/// A server that never reads: async calls wait as `Pending` (the executor thread keeps
/// running other tasks), then fail with `UNAVAILABLE` naming the stall once the client
/// gives up on the connection.
#[test]
fn a_server_that_never_reads_never_blocks_the_callers_executor() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("tcp://{}", listener.local_addr().unwrap());
    let silent = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(8));
        drop(socket);
    });
    let (status, ticks) = within(Duration::from_secs(20), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let channel = rdma_rpc::client()
                .tcp_limits(limits(Duration::from_secs(2), Duration::from_secs(30)))
                .connect(&url)
                .await
                .unwrap();
            let client = TesterClient::new(channel);
            let ticks = Arc::new(AtomicU32::new(0));
            let ticker = tokio::spawn({
                let ticks = ticks.clone();
                async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        ticks.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            let started = Instant::now();
            let payload = bytes::Bytes::from(vec![7; 256 * 1024]);
            let calls = (0..64).map(|seed| {
                let client = client.clone();
                let payload = payload.clone();
                async move {
                    client
                        .bulk(BulkRequest {
                            reply_len: 0,
                            seed,
                            payload,
                            delay: None,
                        })
                        .await
                }
            });
            let results = futures::future::join_all(calls).await;
            let elapsed = started.elapsed();
            ticker.abort();
            let status = results
                .into_iter()
                .find_map(Result::err)
                .expect("calls to a server that never reads fail");
            // A ticker that ran all along ticked about every 10 ms.
            let expected = (elapsed.as_millis() / 10) as u32;
            (status, (ticks.load(Ordering::Relaxed), expected))
        })
    });
    silent.join().unwrap();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(
        status.message().contains("stopped reading"),
        "names the stall: {status}"
    );
    let (ticks, expected) = ticks;
    assert!(
        // Not "all that were due": encoding is CPU work on that thread, slow under emulation.
        ticks >= 20 && expected >= 200,
        "the executor thread stalled: {ticks} ticks of 10 ms where {expected} were due"
    );
}

/// A peer that sends part of a frame and then nothing is closed after the read timeout; a
/// silent peer with no call running after the idle timeout; a call that outlasts the idle
/// timeout is not cut off.
#[test]
fn trickling_and_idle_peers_are_closed_busy_ones_are_not() {
    // The two timeouts far apart, so that emulation's delays cannot blur which one closed.
    let server = start(TcpServerConfig {
        idle_timeout: Duration::from_secs(3),
        limits: limits(Duration::from_secs(10), Duration::from_millis(300)),
        ..Default::default()
    });
    let addr = addr(&server);

    let mut trickler = TcpStream::connect(&addr).unwrap();
    let frame = request(1, SLEEP, &sleep_request(Duration::from_millis(1)));
    trickler.write_all(&frame[..frame.len() - 1]).unwrap();
    let took = closed_within(&mut trickler, Duration::from_secs(10));
    assert!(took < Duration::from_secs(2), "read timeout: {took:?}");

    let mut idle = TcpStream::connect(&addr).unwrap();
    let took = closed_within(&mut idle, Duration::from_secs(20));
    assert!(
        took >= Duration::from_millis(2500),
        "idle timeout: {took:?}"
    );

    let client = TesterClient::new(rdma_rpc::connect_blocking(server.local_url()).unwrap());
    client
        .sleep_blocking(sleep_request(Duration::from_millis(3500)))
        .expect("a call running past the idle timeout keeps its connection");
}

/// One connection over the limit is told why and closed: its call fails with
/// `RESOURCE_EXHAUSTED` naming the limit; the connections within it keep working.
#[test]
fn the_connection_over_the_limit_is_refused_with_a_reason() {
    let server = start(TcpServerConfig {
        max_connections: 2,
        ..Default::default()
    });
    let clients: Vec<_> = (0..2)
        .map(|_| TesterClient::new(rdma_rpc::connect_blocking(server.local_url()).unwrap()))
        .collect();
    for client in &clients {
        client
            .sleep_blocking(sleep_request(Duration::ZERO))
            .unwrap();
    }
    let third = TesterClient::new(rdma_rpc::connect_blocking(server.local_url()).unwrap());
    let status = within(Duration::from_secs(10), move || {
        third
            .sleep_blocking(sleep_request(Duration::ZERO))
            .expect_err("over the limit")
    });
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(
        status.message().contains("limit of 2 connections"),
        "{status}"
    );
    for client in &clients {
        client
            .sleep_blocking(sleep_request(Duration::ZERO))
            .unwrap();
    }
}

/// A peer streaming frames that straddle its reads, each arriving well within the read
/// timeout, for longer than the read timeout, is not mistaken for a trickling one: the
/// timeout runs per frame, from its first byte.
#[test]
fn a_steady_stream_of_straddling_frames_outlives_the_read_timeout() {
    let server = start(TcpServerConfig {
        limits: limits(Duration::from_secs(10), Duration::from_millis(300)),
        ..Default::default()
    });
    let mut peer = TcpStream::connect(addr(&server)).unwrap();
    peer.set_nodelay(true).unwrap();
    let bulk = BulkRequest {
        reply_len: 0,
        seed: 3,
        payload: rpc_examples::bulk_pattern(5000, 3).into(),
        delay: None,
    };
    let wire: Vec<u8> = (1..=60u64)
        .flat_map(|call| request(call, BULK, &bulk))
        .collect();
    // 3,000 bytes every 10 ms: a frame takes about 20 ms, and no read ends on a frame's
    // boundary for the whole 600 ms.
    for chunk in wire.chunks(3000) {
        peer.write_all(chunk).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        tcp_state(&peer),
        TCP_ESTABLISHED,
        "the server reset a connection that never paused"
    );
    // Every request was answered (60 small responses).
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answers = Vec::new();
    let mut buf = [0u8; 4096];
    while count_frames(&answers) < 60 {
        let n = peer.read(&mut buf).expect("answers");
        assert!(n > 0, "closed after {} answers", count_frames(&answers));
        answers.extend_from_slice(&buf[..n]);
    }
}

/// Whole frames at the front of `wire`.
fn count_frames(wire: &[u8]) -> usize {
    let mut at = 0;
    let mut frames = 0;
    while let Ok(len) = Header::wire_len(&wire[at..]) {
        let Some(header) = wire.get(at..at + len).and_then(|h| Header::decode(h).ok()) else {
            break;
        };
        let total = len + header.metadata_len as usize + header.payload_len as usize;
        if wire.len() < at + total {
            break;
        }
        at += total;
        frames += 1;
    }
    frames
}

/// A blocking call stuck behind a full output queue (the server never reads) fails at its
/// own deadline, long before the stall limit.
#[test]
fn a_blocking_call_behind_a_full_queue_keeps_its_deadline() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("tcp://{}", listener.local_addr().unwrap());
    let silent = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(6));
        drop(socket);
    });
    let (status, took) = within(Duration::from_secs(5), move || {
        let channel = rdma_rpc::client()
            .tcp_limits(limits(Duration::from_secs(60), Duration::from_secs(60)))
            .connect_blocking(&url)
            .unwrap();
        let client = TesterClient::new(channel);
        // Calls with no deadline fill the socket's buffers and the output queue first.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let payload = bytes::Bytes::from(vec![7; 1 << 20]);
        let fill = |seed| BulkRequest {
            reply_len: 0,
            seed,
            payload: payload.clone(),
            delay: None,
        };
        let fillers: Vec<_> = (0..16)
            .map(|seed| {
                rt.spawn({
                    let client = client.clone();
                    let request = fill(seed);
                    async move { client.bulk(request).await.map(drop) }
                })
            })
            .collect();
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
        let mut request = fill(99).into_request();
        request.set_timeout(Duration::from_millis(500));
        let started = Instant::now();
        let status = client.bulk_blocking(request).expect_err("nobody answers");
        let took = started.elapsed();
        drop(fillers);
        (status, took)
    });
    silent.join().unwrap();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(took < Duration::from_secs(4), "{took:?}");
}

/// Shutting a server down under load: every call it accepted is answered, calls arriving
/// during the drain are refused with `UNAVAILABLE`, none is lost or hangs.
#[test]
fn graceful_shutdown_under_load_answers_every_accepted_call() {
    let tester = Tester::default();
    let server = start_with(&tester, TcpServerConfig::default());
    let url = server.local_url().to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let results = rt.block_on(async move {
        let client = TesterClient::new(rdma_rpc::connect(&url).await.unwrap());
        let calls: Vec<_> = (0..64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    // Staggered, so that some arrive during the drain.
                    tokio::time::sleep(Duration::from_millis(i * 5)).await;
                    client
                        .sleep(sleep_request(Duration::from_millis(200)))
                        .await
                        .map(drop)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        server.shutdown(Duration::from_secs(5)).await;
        join_all(calls).await
    });
    let started = tester.stats.sleeps_started.load(Ordering::Relaxed);
    let finished = tester.stats.sleeps_finished.load(Ordering::Relaxed);
    let mut answered = 0;
    for result in results {
        match result.unwrap() {
            Ok(()) => answered += 1,
            // Refused during the drain, or sent after the connection closed.
            Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status}"),
        }
    }
    assert!(started > 0 && started < 64, "{started} of 64 calls started");
    assert_eq!(finished, started, "every started call ran to its end");
    assert_eq!(answered, started, "every accepted call was answered");
}
