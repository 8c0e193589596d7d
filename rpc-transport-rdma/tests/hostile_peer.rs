//! A peer that breaks the protocol on real verbs is disconnected, and only that peer: a
//! well-behaved client of the same server keeps working.
//!
//! The hostile peer is raw verbs: it connects with valid ring parameters, then SENDs a
//! forged frame (garbage, a credit grant beyond the ring, a length beyond what arrived, a
//! body "placed" without a grant or beyond it), or RDMA WRITEs with a forged rkey or beyond
//! the window it was granted.
//! Ignored by a plain `cargo test` (it needs a device); `cargo xtask test` runs it in the
//! soft-RoCE VM with `--include-ignored`.

mod common;

use std::time::{Duration, Instant};

use common::hostile::{
    call_succeeds_as_unimplemented, granted, hostile_peer_is_disconnected, next_event, placed,
    route_to, serve, well_behaved_client, HostilePeer, LIMIT, SLOT,
};
use rpc_core::{Code, FrameKind, Header};
use rpc_transport_rdma::protocol::{decode_reject, ConnectParams};
use rpc_transport_rdma::verbs::{
    CmEventKind, CompletionQueue, ConnParam, ProtectionDomain, QpCapabilities, QpInitAttr,
    QueuePair,
};
use rpc_transport_rdma::{Liveness, RdmaConfig, Receives, Rings, SharedRecvConfig};

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn protocol_violations_disconnect_only_the_offender() {
    offenders_are_disconnected(RdmaConfig::default().rings(Rings::default().recv(Receives::Ring)));
}

/// A queue pair on a shared receive queue has no receives to flush when it goes to the
/// error state (a forged rkey): hardware raises an asynchronous event, soft-RoCE raises
/// none, and the keepalive probe that follows fails instead.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn protocol_violations_disconnect_only_the_offender_on_a_shared_receive_queue() {
    offenders_are_disconnected(
        RdmaConfig::default()
            .rings(Rings::default().recv(Receives::Shared(SharedRecvConfig::default())))
            .liveness(Liveness::default().keepalive(Some(Duration::from_millis(300)))),
    );
}

/// A peer whose queue pair vanished without a disconnect (the peer died) answers no probe:
/// the server's probe runs out of its retries (the peer asked for 3, of 67 ms each) and the
/// server frees the connection.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_dead_peer_is_noticed_once_the_probe_runs_out_of_retries() {
    dead_peer_is_disconnected(3, Duration::from_secs(60));
}

/// The same peer asking for 7 retries, which soft-RoCE takes as "forever": the probe stays
/// unanswered, and the keepalive timeout declares the peer dead.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_dead_peer_is_noticed_once_the_probe_times_out() {
    dead_peer_is_disconnected(7, Duration::from_secs(1));
}

fn dead_peer_is_disconnected(peer_retry_count: u8, keepalive_timeout: Duration) {
    let config = RdmaConfig::default().liveness(
        Liveness::default()
            .keepalive(Some(Duration::from_millis(300)))
            .keepalive_timeout(keepalive_timeout)
            // 4.096 µs × 2^14 = 67 ms per retry.
            .ack_timeout(Some(14)),
    );
    let Some(server) = serve(config) else {
        return;
    };
    let peer = HostilePeer::connect_with_retries(server.local_addr(), peer_retry_count);
    let started = Instant::now();
    let (channel, _id) = peer.lose_queue_pair();
    next_event(&channel, CmEventKind::Disconnected);
    eprintln!(
        "dead peer (asked for {peer_retry_count} retries) disconnected by the server after {:?}",
        started.elapsed()
    );
}

/// Every kind of offence against a server configured with `server_config`.
fn offenders_are_disconnected(server_config: RdmaConfig) {
    let Some(server) = serve(server_config) else {
        return;
    };
    let addr = server.local_addr();

    let channel = well_behaved_client(addr);

    let garbage = vec![0xAB; 100];
    let mut overflow = Header::new(FrameKind::Request, 1);
    overflow.credits = 1_000_000;
    let mut too_long = Header::new(FrameKind::Request, 2);
    too_long.payload_len = 1_000_000;
    for (what, frame) in [
        ("garbage header", garbage),
        ("credit overflow", overflow.to_bytes().to_vec()),
        ("length beyond the frame", too_long.to_bytes().to_vec()),
    ] {
        hostile_peer_is_disconnected(addr, &frame);
        // The other connection is untouched.
        call_succeeds_as_unimplemented(&channel);
        eprintln!("{what}: offender disconnected, other client fine");
    }

    let mut no_grant = placed(3, 100_000);
    no_grant.credits = 0;
    hostile_peer_is_disconnected(addr, &no_grant.to_bytes());
    call_succeeds_as_unimplemented(&channel);
    eprintln!("body placed without a grant: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    granted(&peer, 100_000);
    peer.send(&placed(7, 100_001).to_bytes());
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("body beyond its grant: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    let grant = granted(&peer, 100_000);
    // A forged rkey: the responder refuses the WRITE and the connection dies.
    peer.write(grant.remote.addr, grant.remote.rkey ^ 0x5a5a_0000, 4096);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("WRITE with a forged rkey: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    let grant = granted(&peer, 100_000);
    // The right rkey, but far past the end of the grant. (Hardware checks a window's own
    // bounds; rxe checks those of the region under it, which every grant has to itself.)
    peer.write(grant.remote.addr + 1024 * 1024, grant.remote.rkey, 4096);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("WRITE beyond its grant: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    let grant = granted(&peer, 100_000);
    // A complete, honest large request: written, announced, answered.
    peer.write(grant.remote.addr, grant.remote.rkey, 100_000);
    peer.send(&placed(7, 100_000).to_bytes());
    let answer = peer.receive();
    assert_eq!(
        (answer.kind, answer.call_id, answer.status),
        (FrameKind::Response, 7, Code::Unimplemented)
    );
    // After delivery the window is revoked: a late WRITE to it is refused.
    peer.write(grant.remote.addr, grant.remote.rkey, 4096);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("late WRITE after the body was delivered: refused, other client fine");
}

/// Connect parameters the server cannot use are rejected with a reason the client reads,
/// before the server builds anything for the connection.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn bad_connect_parameters_are_rejected_with_a_reason() {
    let Some(server) = serve(RdmaConfig::default()) else {
        return;
    };
    let mut bad_version = ConnectParams::new(8, SLOT as u32);
    bad_version.min_version = 200;
    bad_version.max_version = 200;
    for (what, params, expected) in [
        ("garbage", vec![0x5a; 40], "unusable connection parameters"),
        (
            "no common version",
            bad_version.encode().to_vec(),
            "cannot agree on ring geometry",
        ),
    ] {
        let (channel, id) = route_to(server.local_addr());
        let ctx = id.context().expect("device");
        let pd = ProtectionDomain::new(&ctx).expect("pd");
        let cq = CompletionQueue::new(&ctx, 8, None, 0).expect("cq");
        let _qp = QueuePair::new(
            &id,
            &pd,
            QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq,
                caps: QpCapabilities::default(),
                sq_sig_all: false,
                srq: None,
            },
        )
        .expect("qp");
        id.connect(&ConnParam {
            private_data: &params,
            ..ConnParam::default()
        })
        .expect("connect");
        let until = Instant::now() + LIMIT;
        let event = loop {
            if let Some(event) = channel.try_get_event().expect("rdma_get_cm_event") {
                break event;
            }
            assert!(Instant::now() < until, "no answer to the connect request");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(event.kind(), CmEventKind::Rejected);
        let (code, reason) =
            decode_reject(event.private_data()).expect("the reject names a reason");
        eprintln!("{what}: rejected ({code:?}): {reason}");
        assert_eq!(code, Code::InvalidArgument);
        assert!(reason.contains(expected), "{reason}");
    }
}
