//! A shared receive queue on real verbs: one listener accepts two clients whose QPs share
//! one SRQ and one receive CQ (the device address from RDMA_RPC_TEST_ADDR, the soft-RoCE
//! VM's veth0).
//!
//! * `two_qps_share_one_receive_queue`: each client sends its messages; they land in the
//!   SRQ's buffers in arrival order, whichever client sent them, and each completion names
//!   its QP (`qp_num`), by which the listener tells the senders apart. Exactly as many
//!   buffers are posted as messages may be outstanding, with `rnr_retry_count = 0`, so an
//!   uncounted receive fails the test with an RNR. The SRQ's limit is armed at its four
//!   buffers, so the first message raises `IBV_EVENT_SRQ_LIMIT_REACHED`, read from the
//!   device context's asynchronous events.
//!
//! Prints "skipped" without a device (fails instead with RDMA_RPC_REQUIRE_DEVICE=1).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{conn_param, poll_one, spawn};
use rpc_transport_rdma::verbs::{
    test_support, AccessFlags, AsyncEvent, AsyncEventKind, CmId, CompletionQueue, Context,
    EventSubject, MemoryRegion, ProtectionDomain, QpCapabilities, QpInitAttr, QueuePair,
    RecvRequest, SendFlags, SendOp, SharedReceiveQueue, WcOpcode,
};

/// Bytes per SRQ buffer.
const MSG: usize = 64;
/// SRQ buffers: each client may have two messages outstanding.
const BUFFERS: usize = 4;
const CLIENTS: usize = 2;
const ROUNDS: u32 = 100;
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

fn caps() -> QpCapabilities {
    QpCapabilities {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: MSG as u32,
    }
}

/// `[client][round]`, then a pattern of both.
fn message(client: u8, round: u32) -> Vec<u8> {
    let mut msg = vec![client; 8 + (round as usize % (MSG - 8))];
    msg[1..5].copy_from_slice(&round.to_le_bytes());
    for (i, b) in msg.iter_mut().enumerate().skip(8) {
        *b = (round as u8).wrapping_add(i as u8) ^ client;
    }
    msg
}

/// Posts SRQ buffer `buf` of `mr`.
/// The device's next asynchronous event; fails the test after a while without one.
fn next_async_event(ctx: &Context) -> AsyncEvent {
    ctx.set_async_nonblocking(true)
        .expect("non-blocking async fd");
    for _ in 0..1000 {
        if let Some(event) = ctx.try_get_async_event().expect("ibv_get_async_event") {
            return event;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no asynchronous event within 10 s");
}

fn post(srq: &SharedReceiveQueue, mr: &MemoryRegion, buf: usize) {
    let sge = mr.sge(buf * MSG..(buf + 1) * MSG).expect("SRQ SGE");
    let wr = RecvRequest {
        wr_id: buf as u64,
        sges: &[sge],
    };
    // SAFETY: the buffer lies in `mr`, which outlives the SRQ and its QPs (dropped last in
    // the listener), and is read only after this receive's completion was polled.
    unsafe { srq.post_recv_list(&[wr]) }.expect("ibv_post_srq_recv");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn two_qps_share_one_receive_queue() {
    if test_support::require_device().is_none() {
        return;
    }
    let listener = CmId::new_sync().expect("rdma_create_id");
    listener
        .bind_addr(SocketAddr::new(test_support::test_addr(), 0))
        .expect("rdma_bind_addr on RDMA_RPC_TEST_ADDR");
    listener.listen(4).expect("rdma_listen");
    let server_addr = listener.local_addr().expect("bound address");

    let server = spawn("listener", move || {
        let mut ids = Vec::new();
        let mut qps = Vec::new();
        let mut client_of = HashMap::new();
        let mut shared = None;
        for _ in 0..CLIENTS {
            let request = listener.get_request().expect("rdma_get_request");
            // Clients connect in any order; each names itself in its private data.
            let client = request.private_data[0];
            let (pd, srq, cq, _mr) = shared.get_or_insert_with(|| {
                let ctx = request.id.context().expect("cm_id context");
                let attr = ctx.query_device().expect("ibv_query_device");
                assert!(attr.max_srq > 0 && attr.max_srq_wr as usize >= BUFFERS);
                let pd = ProtectionDomain::new(&ctx).expect("ibv_alloc_pd");
                let srq = SharedReceiveQueue::new(&pd, BUFFERS as u32, 1).expect("SRQ");
                assert!(srq.max_wr() as usize >= BUFFERS);
                let cq = CompletionQueue::new(&ctx, 64, None, 1).expect("CQ");
                let mr = MemoryRegion::alloc(&pd, BUFFERS * MSG, AccessFlags::LOCAL_WRITE)
                    .expect("SRQ memory");
                for buf in 0..BUFFERS {
                    post(&srq, &mr, buf);
                }
                srq.arm_limit(BUFFERS as u32)
                    .expect("ibv_modify_srq(IBV_SRQ_LIMIT)");
                (pd, srq, cq, mr)
            });
            let qp = QueuePair::new(
                &request.id,
                pd,
                QpInitAttr {
                    send_cq: Arc::clone(cq),
                    recv_cq: Arc::clone(cq),
                    caps: caps(),
                    sq_sig_all: false,
                    srq: Some(Arc::clone(srq)),
                },
            )
            .expect("QP on the SRQ");
            assert!(Arc::ptr_eq(qp.srq().expect("the SRQ"), srq));
            request.id.accept(&conn_param(&[])).expect("rdma_accept");
            client_of.insert(qp.qp_num(), client);
            qps.resize_with(qps.len().max(usize::from(client) + 1), || None);
            qps[usize::from(client)] = Some(qp);
            ids.push(request.id);
        }
        let (_pd, srq, cq, mr) = shared.expect("two clients");
        let qps: Vec<QueuePair> = qps.into_iter().map(|qp| qp.expect("each client")).collect();
        let mut next = [0u32; CLIENTS];
        for _ in 0..CLIENTS as u32 * ROUNDS {
            let wc = poll_one(&cq, "a message in the SRQ");
            assert_eq!(wc.opcode(), WcOpcode::Recv);
            let client = client_of[&wc.qp_num()];
            let round = next[client as usize];
            let expected = message(client, round);
            let buf = wc.wr_id() as usize;
            assert_eq!(
                // SAFETY: this buffer's receive completed; it is re-posted after the check.
                unsafe { &mr.slice_unchecked()[buf * MSG..buf * MSG + wc.byte_len() as usize] },
                &expected[..],
                "client {client} round {round}"
            );
            next[client as usize] += 1;
            post(&srq, &mr, buf);
            // The credit back: one byte, inline, from the QP that received.
            qps[client as usize]
                .post_send_inline(0, &[1], SendOp::Send, SendFlags::NONE)
                .expect("credit");
        }
        assert_eq!(next, [ROUNDS; CLIENTS]);
        let ctx = ids[0].context().expect("cm_id context");
        let event = next_async_event(&ctx);
        assert_eq!(
            (event.kind, event.subject),
            (AsyncEventKind::SrqLimitReached, EventSubject::Srq(srq.id())),
            "{event}"
        );
        for id in &ids {
            id.disconnect().ok();
        }
        // The QPs go before the SRQ, its memory and the ids (drop order of the locals).
        drop(qps);
        drop((srq, mr, ids));
    });

    let clients: Vec<_> = (0..CLIENTS as u8)
        .map(|client| {
            spawn("client", move || {
                let id = CmId::new_sync().expect("rdma_create_id");
                id.resolve_addr(None, server_addr, RESOLVE_TIMEOUT)
                    .expect("rdma_resolve_addr");
                id.resolve_route(RESOLVE_TIMEOUT)
                    .expect("rdma_resolve_route");
                let ctx = id.context().expect("cm_id context");
                let pd = ProtectionDomain::new(&ctx).expect("ibv_alloc_pd");
                let send_cq = CompletionQueue::new(&ctx, 64, None, 2).expect("send CQ");
                let cq = CompletionQueue::new(&ctx, 64, None, 3).expect("receive CQ");
                let qp = QueuePair::new(
                    &id,
                    &pd,
                    QpInitAttr {
                        send_cq: Arc::clone(&send_cq),
                        recv_cq: Arc::clone(&cq),
                        caps: caps(),
                        sq_sig_all: false,
                        srq: None,
                    },
                )
                .expect("client QP");
                let credits_mr = MemoryRegion::alloc(&pd, 8 * MSG, AccessFlags::LOCAL_WRITE)
                    .expect("credit buffers");
                for slot in 0..8 {
                    let sge = credits_mr.sge(slot * MSG..(slot + 1) * MSG).expect("SGE");
                    let wr = RecvRequest {
                        wr_id: slot as u64,
                        sges: &[sge],
                    };
                    // SAFETY: `credits_mr` outlives the QP (dropped after it below).
                    unsafe { qp.post_recv(&wr) }.expect("ibv_post_recv");
                }
                id.connect(&conn_param(&[client])).expect("rdma_connect");
                // Two credits each: the SRQ's four buffers cover both clients exactly.
                let mut credits = BUFFERS / CLIENTS;
                for round in 0..ROUNDS {
                    while credits == 0 {
                        let wc = poll_one(&cq, "a credit");
                        assert_eq!(wc.opcode(), WcOpcode::Recv);
                        let sge = credits_mr
                            .sge(wc.wr_id() as usize * MSG..(wc.wr_id() as usize + 1) * MSG)
                            .expect("SGE");
                        let wr = RecvRequest {
                            wr_id: wc.wr_id(),
                            sges: &[sge],
                        };
                        // SAFETY: as above.
                        unsafe { qp.post_recv(&wr) }.expect("ibv_post_recv");
                        credits += 1;
                    }
                    qp.post_send_inline(
                        u64::from(round),
                        &message(client, round),
                        SendOp::Send,
                        SendFlags::SIGNALED,
                    )
                    .expect("message");
                    let wc = poll_one(&send_cq, "send completion");
                    assert_eq!(wc.opcode(), WcOpcode::Send);
                    credits -= 1;
                }
                id.disconnect().ok();
                drop(qp);
                drop(credits_mr);
            })
        })
        .collect();
    for client in clients {
        client.join().expect("client");
    }
    server.join().expect("listener");
}
