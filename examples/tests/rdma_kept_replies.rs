//! What an application keeps of what it receives over real verbs (run in the soft-RoCE VM
//! by `cargo xtask test`): kept replies never starve a connection of receives, and small
//! ones, handed up as copies, hold no receive slot at all.

mod common;

use common::pattern;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use rdma_rpc::prelude::*;
use rdma_rpc::{RdmaConfig, Receives, Rings, ServerHandle, SharedRecvConfig};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::EchoService;
use rpc_transport_rdma::verbs::test_support::require_device;
use rpc_transport_rdma::RdmaClient;

fn device() -> bool {
    require_device().is_some()
}

fn start(rdma: RdmaConfig) -> ServerHandle {
    common::start_rdma(
        Server::builder().add_service(EchoServer::new(EchoService)),
        rdma,
    )
}

/// A client on its own transport, whose receive slots the test can count.
fn connect(server: &ServerHandle, rdma: &RdmaConfig) -> (EchoClient, Arc<RdmaClient>) {
    let calls = Arc::new(rdma_rpc::CallTable::new());
    let addr = server.local_url().trim_start_matches("rdma://");
    let transport = RdmaClient::connect(addr, calls.clone(), rdma).expect("rdma client connects");
    let channel = Channel::new(calls, transport.clone(), rdma_rpc::ChannelConfig::default());
    (EchoClient::new(channel), transport)
}

/// An application that keeps every reply it receives (zero-copy views of receive slots)
/// while keeping 16 calls in flight: past the lend limit replies arrive as copies, so the
/// ring never runs out of receives. Before the lend limit the 64th reply stalled the
/// connection for good (held slots were never re-posted, so no credit came back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn kept_replies_never_stall_a_receive_ring() {
    if !device() {
        return;
    }
    keep_every_reply(RdmaConfig::default(), RdmaConfig::default().rings.slots / 4).await;
}

/// The same with both sides on shared receive queues: a kept reply keeps its SRQ buffer
/// only within the lend limit (a quarter of the initial window); the others are copied and
/// their buffers re-posted, so the queue never runs dry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn kept_replies_never_drain_a_shared_receive_queue() {
    if !device() {
        return;
    }
    let rdma = RdmaConfig::default()
        .rings(Rings::default().recv(Receives::Shared(SharedRecvConfig::default())));
    keep_every_reply(rdma, rdma_rpc::DEFAULT_SHARED_WINDOW / 4).await;
}

/// 4,000 calls at 16 in flight whose replies the application keeps; at most `limit` of
/// them may hold a receive slot.
async fn keep_every_reply(rdma: RdmaConfig, limit: u32) {
    let server = start(rdma.clone());
    let (client, transport) = connect(&server, &rdma);
    let started = Instant::now();
    let kept: Vec<_> = stream::iter(0..4_000u64)
        .map(|seq| {
            let client = client.clone();
            async move {
                let mut request = Request::new(EchoRequest {
                    payload: pattern(64 + (seq as usize * 13) % 2000, seq).into(),
                    seq,
                });
                request.set_timeout(Duration::from_secs(20));
                client
                    .echo(request)
                    .await
                    .expect("a call while replies are kept")
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    eprintln!("4000 calls, every reply kept: {:?}", started.elapsed());
    // Slots of copied replies are released in batches by the thread that delivered them
    // (at the latest on the poller's next keepalive tick, 250 ms), so a few may still count
    // as held for a moment; the kept ones never are released.
    let until = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let stats = transport.stats();
        if stats.recv_held <= limit || Instant::now() > until {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(stats.recv_held <= limit, "{stats:?}");
    // Every kept reply is intact: lent slots were not re-posted under it, copies are whole.
    for reply in &kept {
        let reply = reply.get_ref();
        let len = 64 + (reply.seq as usize * 13) % 2000;
        assert_eq!(
            reply.payload,
            pattern(len, reply.seq),
            "reply {}",
            reply.seq
        );
    }
    drop(kept);
    // Letting go gives every slot back.
    let deadline = Instant::now() + Duration::from_secs(5);
    while transport.stats().recv_held > 0 {
        assert!(Instant::now() < deadline, "{:?}", transport.stats());
        client.echo(EchoRequest::default()).await.unwrap();
    }
}

/// Small replies are handed up as copies (`Rings::copy_below`), their slots released once
/// handed up: an application keeping every one of them holds no slot. With copying off,
/// the same replies are lent: the kept ones hold as many slots as the lend limit allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn kept_small_replies_hold_no_receive_slot() {
    if !device() {
        return;
    }
    let lent = RdmaConfig::default().rings(Rings::default().copy_below(0));
    let limit = lent.rings.slots / 4;
    for (rdma, held) in [(RdmaConfig::default(), 0), (lent, limit)] {
        let copy_below = rdma.rings.copy_below;
        let server = start(rdma.clone());
        let (client, transport) = connect(&server, &rdma);
        let mut kept = Vec::new();
        // Not a multiple of the release batch (8): the last slots wait for the tick.
        for seq in 0..201u64 {
            let request = EchoRequest {
                payload: pattern(32, seq).into(),
                seq,
            };
            kept.push(client.echo(request).await.expect("a small call"));
        }
        // Released slots go back in batches (at the latest on the poller's next keepalive
        // tick, 250 ms): give them a moment.
        let until = Instant::now() + Duration::from_secs(20);
        while transport.stats().recv_held != held && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            transport.stats().recv_held,
            held,
            "copy_below {copy_below}: {:?}",
            transport.stats()
        );
        for reply in &kept {
            let reply = reply.get_ref();
            assert_eq!(reply.payload, pattern(32, reply.seq), "reply {}", reply.seq);
        }
    }
}
