//! A peer that breaks the protocol on real verbs is disconnected, and only that peer: a
//! well-behaved client of the same server keeps working.
//!
//! The hostile peer is raw verbs: it connects with valid ring parameters, then SENDs a
//! forged frame (garbage, a credit grant beyond the ring, a length beyond what arrived).
//! Prints "skipped" without a device (fails instead with RDMA_RPC_REQUIRE_DEVICE=1).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::{
    method_id, CallTable, Channel, ChannelConfig, Code, FrameKind, Header, Request, Server,
};
use rpc_transport_rdma::protocol::ConnectParams;
use rpc_transport_rdma::verbs::{
    test_support, AccessFlags, CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel,
    MemoryRegion, ProtectionDomain, QpCapabilities, QpInitAttr, QueuePair, RecvRequest,
};
use rpc_transport_rdma::{RdmaClient, RdmaConfig, RdmaServer};

const LIMIT: Duration = Duration::from_secs(15);

fn next_event(channel: &Arc<EventChannel>, kind: CmEventKind) {
    let until = Instant::now() + LIMIT;
    loop {
        if let Some(event) = channel.try_get_event().expect("rdma_get_cm_event") {
            assert_eq!(event.kind(), kind, "status {}", event.status());
            return;
        }
        assert!(Instant::now() < until, "no {kind} event within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Connects like an rdma-rpc client, sends `frame` as its first message and returns once the
/// server has disconnected it.
fn hostile_peer_is_disconnected(server: SocketAddr, frame: &[u8]) {
    let channel = EventChannel::new().expect("event channel");
    channel.set_nonblocking(true).expect("non-blocking");
    let id = CmId::new(&channel).expect("cm id");
    id.resolve_addr(None, server, LIMIT).expect("resolve addr");
    next_event(&channel, CmEventKind::AddrResolved);
    id.resolve_route(LIMIT).expect("resolve route");
    next_event(&channel, CmEventKind::RouteResolved);
    let ctx = id.context().expect("device");
    let pd = ProtectionDomain::new(&ctx).expect("pd");
    let cq = CompletionQueue::new(&ctx, 64, None, 0).expect("cq");
    let qp = QueuePair::new(
        &id,
        &pd,
        QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            caps: QpCapabilities {
                max_inline_data: 256,
                ..QpCapabilities::default()
            },
            sq_sig_all: false,
        },
    )
    .expect("qp");
    let recv = MemoryRegion::alloc(&pd, 8 * 4096, AccessFlags::LOCAL_WRITE).expect("mr");
    for slot in 0..8u64 {
        let sge = recv
            .sge(slot as usize * 4096..(slot as usize + 1) * 4096)
            .expect("sge");
        // SAFETY: the slot lies in `recv`, which outlives the QP (dropped after it below) and
        // is never read in this test.
        unsafe {
            qp.post_recv(&RecvRequest {
                wr_id: slot,
                sges: &[sge],
            })
        }
        .expect("post recv");
    }
    let params = ConnectParams::new(8, 4096).encode();
    id.connect(&ConnParam {
        private_data: &params,
        rnr_retry_count: 0,
        ..ConnParam::default()
    })
    .expect("connect");
    next_event(&channel, CmEventKind::Established);
    qp.post_send_inline(
        1,
        frame,
        rpc_transport_rdma::verbs::SendOp::Send,
        rpc_transport_rdma::verbs::SendFlags::SIGNALED,
    )
    .expect("send forged frame");
    next_event(&channel, CmEventKind::Disconnected);
    drop(qp);
    drop(recv);
}

fn call_succeeds_as_unimplemented(channel: &Channel) {
    let err = channel
        .unary_blocking::<(), ()>(method_id("/nobody.Home/Call"), Request::new(()))
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
}

#[test]
fn protocol_violations_disconnect_only_the_offender() {
    if test_support::require_device().is_none() {
        return;
    }
    let dispatcher = Server::builder().build().expect("dispatcher");
    let server = RdmaServer::bind(
        &SocketAddr::new(test_support::test_addr(), 0).to_string(),
        dispatcher,
        RdmaConfig::default(),
    )
    .expect("server");
    let addr = server.local_addr();

    let calls = Arc::new(CallTable::new());
    let client = RdmaClient::connect(&addr.to_string(), calls.clone(), &RdmaConfig::default())
        .expect("well-behaved client connects");
    let channel = Channel::new(calls, client, ChannelConfig::default());
    call_succeeds_as_unimplemented(&channel);

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
}
