//! RC over rdma_cm between a listener thread and a client thread in one process, on the
//! device address from RDMA_RPC_TEST_ADDR (the soft-RoCE VM's veth0):
//!
//! * `sync_pingpong_and_rdma_write`: synchronous rdma_cm; a few hundred SEND/RECV round trips
//!   with payload checks (inline and from a registered buffer), then RDMA WRITE, SEND with
//!   immediate and RDMA WRITE with immediate into the rkey the listener sent in its accept
//!   private data. The listener sleeps on a completion channel; the client busy-polls.
//! * `async_connect_exchange_disconnect`: the same over event channels.
//! * `rnr_retry_zero_fails_fast`: a SEND to a peer with no receive posted fails at once with
//!   `RnrRetryExceeded` when `rnr_retry_count` is 0.
//!
//! Every connection uses `rnr_retry_count = 0`, so any missing receive would fail the test.
//! Prints "skipped" without a device (fails instead with RDMA_RPC_REQUIRE_DEVICE=1).

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::{conn_param, poll_one, spawn, wait_one};
use rpc_transport_rdma::verbs::{
    test_support, AccessFlags, CmEventKind, CmId, CompletionChannel, CompletionQueue, EventChannel,
    MemoryRegion, ProtectionDomain, QpCapabilities, QpInitAttr, QueuePair, RecvRequest, RemoteAddr,
    SendFlags, SendOp, SendRequest, VerbsError, WcError, WcOpcode,
};

/// Bytes per message slot.
const MSG: usize = 256;
/// Receives kept posted per side.
const SLOTS: usize = 8;
const ROUNDS: u32 = 300;
/// Size of the listener's remote-writable region.
const WRITE_REGION: usize = 64 * 1024;
const WRITE_LEN: usize = 40_000;
const WRITE_IMM_LEN: usize = 4096;
const IMM_AFTER_WRITE: u32 = 0x00C0_FFEE;
const IMM_WITH_WRITE: u32 = 0xBEEF;
const HELLO: &[u8] = b"pingpong/1";
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// One side of a connection. Fields drop in order: the QP goes before the memory it used.
struct Endpoint {
    qp: QueuePair,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    /// Listener: the region the client writes into. Client: the source of those writes.
    write_mr: MemoryRegion,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    channel: Arc<CompletionChannel>,
    id: CmId,
}

impl Endpoint {
    /// Creates PD, CQs, QP and memory on `id`'s device and posts all receive slots.
    fn new(id: CmId, post_receives: bool) -> Endpoint {
        let ctx = id.context().expect("cm_id context");
        let pd = ProtectionDomain::new(&ctx).expect("ibv_alloc_pd");
        let channel = CompletionChannel::new(&ctx).expect("ibv_create_comp_channel");
        let send_cq = CompletionQueue::new(&ctx, 32, None, 1).expect("send CQ");
        let recv_cq = CompletionQueue::new(&ctx, 32, Some(&channel), 2).expect("recv CQ");
        let caps = QpCapabilities {
            max_send_wr: 16,
            max_recv_wr: 2 * SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let qp = QueuePair::new(
            &id,
            &pd,
            QpInitAttr {
                send_cq: Arc::clone(&send_cq),
                recv_cq: Arc::clone(&recv_cq),
                caps,
                sq_sig_all: false,
                srq: None,
            },
        )
        .expect("rdma_create_qp");
        assert!(qp.caps().max_recv_wr >= 2 * SLOTS as u32);
        let recv_mr =
            MemoryRegion::alloc(&pd, SLOTS * MSG, AccessFlags::LOCAL_WRITE).expect("recv MR");
        let send_mr = MemoryRegion::alloc(&pd, MSG, AccessFlags::NONE).expect("send MR");
        let write_mr = MemoryRegion::alloc(
            &pd,
            WRITE_REGION,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("write MR");
        let ep = Endpoint {
            qp,
            recv_mr,
            send_mr,
            write_mr,
            send_cq,
            recv_cq,
            channel,
            id,
        };
        if post_receives {
            for slot in 0..SLOTS {
                ep.post_recv(slot);
            }
        }
        ep
    }

    fn post_recv(&self, slot: usize) {
        let sge = self
            .recv_mr
            .sge(slot * MSG..(slot + 1) * MSG)
            .expect("recv SGE");
        let wr = RecvRequest {
            wr_id: slot as u64,
            sges: &[sge],
        };
        // SAFETY: the slot lies in `recv_mr`, which outlives the QP (field order) and is read
        // only after this receive's completion has been polled.
        unsafe { self.qp.post_recv(&wr) }.expect("ibv_post_recv");
    }

    /// The payload of a completed receive into `slot`.
    fn slot(&self, slot: usize, len: usize) -> &[u8] {
        // SAFETY: the receive into `slot` completed, and the callers re-post the slot only
        // once they are done with the slice.
        unsafe { &self.recv_mr.slice_unchecked()[slot * MSG..slot * MSG + len] }
    }

    /// SENDs `msg` from the registered send buffer and waits for the send completion.
    fn send_registered(&mut self, wr_id: u64, msg: &[u8]) {
        let send = self
            .send_mr
            .as_mut_slice()
            .expect("the device only reads it");
        send[..msg.len()].copy_from_slice(msg);
        let sge = self.send_mr.sge(0..msg.len()).expect("send SGE");
        let wr = SendRequest {
            wr_id,
            sges: &[sge],
            op: SendOp::Send,
            flags: SendFlags::SIGNALED,
        };
        // SAFETY: `send_mr` outlives the QP and is not written again before the completion
        // below has been polled.
        unsafe { self.qp.post_send(&wr) }.expect("ibv_post_send");
        let wc = poll_one(&self.send_cq, "send completion");
        assert_eq!((wc.wr_id(), wc.opcode()), (wr_id, WcOpcode::Send));
    }

    /// SENDs `msg` inline (no registration needed) and waits for the send completion.
    fn send_inline(&self, wr_id: u64, msg: &[u8], op: SendOp) {
        self.qp
            .post_send_inline(wr_id, msg, op, SendFlags::SIGNALED)
            .expect("inline send");
        let wc = poll_one(&self.send_cq, "inline send completion");
        assert_eq!(wc.wr_id(), wr_id);
    }
}

/// Message `seq`: `[seq u32][len u32][pattern]`, 8..MSG bytes long; `salt` tells the
/// direction apart.
fn message(seq: u32, salt: u8) -> Vec<u8> {
    let len = 8 + (seq as usize * 37) % (MSG - 8);
    let mut msg = vec![0u8; len];
    msg[..4].copy_from_slice(&seq.to_le_bytes());
    msg[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    for (i, b) in msg.iter_mut().enumerate().skip(8) {
        *b = (seq as u8).wrapping_mul(31).wrapping_add(i as u8) ^ salt;
    }
    msg
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn encode_remote(remote: RemoteAddr, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&remote.addr.to_le_bytes());
    out.extend_from_slice(&remote.rkey.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out
}

fn decode_remote(data: &[u8]) -> (RemoteAddr, usize) {
    assert!(
        data.len() >= 16,
        "accept private data too short: {} bytes",
        data.len()
    );
    let addr = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let rkey = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
    let len = u32::from_le_bytes(data[12..16].try_into().expect("4 bytes")) as usize;
    (RemoteAddr { addr, rkey }, len)
}

/// Binds a synchronous listener on the test address with a free port.
fn sync_listener() -> (CmId, SocketAddr) {
    let listener = CmId::new_sync().expect("rdma_create_id");
    listener
        .bind_addr(SocketAddr::new(test_support::test_addr(), 0))
        .expect("rdma_bind_addr on RDMA_RPC_TEST_ADDR");
    listener.listen(4).expect("rdma_listen");
    let addr = listener.local_addr().expect("bound address");
    assert_ne!(addr.port(), 0);
    (listener, addr)
}

fn sync_client_id(server: SocketAddr) -> CmId {
    let id = CmId::new_sync().expect("rdma_create_id");
    id.resolve_addr(None, server, RESOLVE_TIMEOUT)
        .expect("rdma_resolve_addr");
    id.resolve_route(RESOLVE_TIMEOUT)
        .expect("rdma_resolve_route");
    id
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn sync_pingpong_and_rdma_write() {
    if test_support::require_device().is_none() {
        return;
    }
    let (listener, server_addr) = sync_listener();
    // The listener's word, out of band, that its last SEND completed. A receiver that tears
    // its QP down as soon as its receive completed may do so before its responder sent the
    // ACK (soft-RoCE posts the completion first), leaving the sender to retry for as long as
    // its retry budget lasts; so the last receiver waits for the sender to be done.
    let (sent_last, last_sent) = std::sync::mpsc::channel::<()>();

    let server = spawn("listener", move || {
        let request = listener.get_request().expect("rdma_get_request");
        assert!(
            request.private_data.starts_with(HELLO),
            "{:?}",
            request.private_data
        );
        let mut ep = Endpoint::new(request.id, true);
        let grant = encode_remote(ep.write_mr.remote_addr(), WRITE_REGION);
        ep.id.accept(&conn_param(&grant)).expect("rdma_accept");
        assert_eq!(ep.id.local_addr().map(|a| a.ip()), Some(server_addr.ip()));

        for seq in 0..ROUNDS {
            let wc = wait_one(&ep.recv_cq, &ep.channel, "ping");
            let slot = wc.wr_id() as usize;
            let expected = message(seq, 0);
            assert_eq!(wc.opcode(), WcOpcode::Recv);
            assert_eq!(wc.byte_len() as usize, expected.len(), "ping {seq} length");
            assert_eq!(
                ep.slot(slot, expected.len()),
                &expected[..],
                "ping {seq} payload"
            );
            ep.post_recv(slot);
            ep.send_registered(u64::from(seq), &message(seq, 0xFF));
        }

        // RDMA WRITE, then a zero-length SEND with immediate: the write is in place once the
        // SEND's receive completes (RC ordering).
        let wc = wait_one(&ep.recv_cq, &ep.channel, "send with imm");
        assert_eq!(wc.opcode(), WcOpcode::Recv);
        assert_eq!((wc.imm_data(), wc.byte_len()), (Some(IMM_AFTER_WRITE), 0));
        // SAFETY: the peer's WRITE completed before its SEND with immediate, which
        // arrived; it writes this range no more.
        let written = unsafe { &ep.write_mr.slice_unchecked()[..WRITE_LEN] };
        assert_eq!(written, &pattern(WRITE_LEN, 1)[..]);
        ep.post_recv(wc.wr_id() as usize);

        let wc = wait_one(&ep.recv_cq, &ep.channel, "write with imm");
        assert_eq!(wc.opcode(), WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc.imm_data(), Some(IMM_WITH_WRITE));
        assert_eq!(wc.byte_len() as usize, WRITE_IMM_LEN);
        // SAFETY: the WRITE with immediate completed (its receive arrived): done writing.
        let written = unsafe { &ep.write_mr.slice_unchecked()[WRITE_LEN..][..WRITE_IMM_LEN] };
        assert_eq!(written, &pattern(WRITE_IMM_LEN, 2)[..]);
        ep.post_recv(wc.wr_id() as usize);

        ep.send_inline(u64::MAX, b"done", SendOp::Send);
        sent_last.send(()).expect("the client waits for it");
        // Returns once the client's disconnect (or ours) completes.
        if let Err(e) = ep.id.disconnect() {
            eprintln!("listener: disconnect after the peer's: {e}");
        }
    });

    let client = spawn("client", move || {
        let id = sync_client_id(server_addr);
        let mut ep = Endpoint::new(id, true);
        let accepted = ep.id.connect(&conn_param(HELLO)).expect("rdma_connect");
        let (remote, remote_len) = decode_remote(&accepted);
        assert_eq!(remote_len, WRITE_REGION);
        assert_eq!(ep.id.peer_addr(), Some(server_addr));
        let max_inline = ep.qp.max_inline_data() as usize;
        eprintln!("QP {} caps {:?}", ep.qp.qp_num(), ep.qp.caps());

        for seq in 0..ROUNDS {
            let ping = message(seq, 0);
            if seq % 2 == 0 && ping.len() <= max_inline {
                ep.send_inline(u64::from(seq), &ping, SendOp::Send);
            } else {
                ep.send_registered(u64::from(seq), &ping);
            }
            let wc = poll_one(&ep.recv_cq, "pong");
            let slot = wc.wr_id() as usize;
            let expected = message(seq, 0xFF);
            assert_eq!(wc.byte_len() as usize, expected.len(), "pong {seq} length");
            assert_eq!(
                ep.slot(slot, expected.len()),
                &expected[..],
                "pong {seq} payload"
            );
            ep.post_recv(slot);
        }

        // RDMA WRITE of WRITE_LEN bytes into the listener's region, then SEND with immediate.
        // SAFETY: this side's region is written by nobody else (the peer writes its own).
        let source = unsafe { ep.write_mr.slice_mut_unchecked() };
        source[..WRITE_LEN].copy_from_slice(&pattern(WRITE_LEN, 1));
        let sge = ep.write_mr.sge(0..WRITE_LEN).expect("write SGE");
        let wr = SendRequest {
            wr_id: 1_000_001,
            sges: &[sge],
            op: SendOp::RdmaWrite(remote),
            flags: SendFlags::SIGNALED,
        };
        // SAFETY: `write_mr` outlives the QP and is not written until the completion is polled.
        unsafe { ep.qp.post_send(&wr) }.expect("RDMA WRITE");
        let wc = poll_one(&ep.send_cq, "RDMA WRITE");
        assert_eq!(wc.opcode(), WcOpcode::RdmaWrite);
        ep.send_inline(1_000_002, &[], SendOp::SendWithImm(IMM_AFTER_WRITE));

        // RDMA WRITE with immediate of the next WRITE_IMM_LEN bytes.
        // SAFETY: as above.
        let source = unsafe { ep.write_mr.slice_mut_unchecked() };
        source[..WRITE_IMM_LEN].copy_from_slice(&pattern(WRITE_IMM_LEN, 2));
        let sge = ep.write_mr.sge(0..WRITE_IMM_LEN).expect("write SGE");
        let wr = SendRequest {
            wr_id: 1_000_003,
            sges: &[sge],
            op: SendOp::RdmaWriteWithImm(remote.offset(WRITE_LEN as u64), IMM_WITH_WRITE),
            flags: SendFlags::SIGNALED,
        };
        // SAFETY: as above.
        unsafe { ep.qp.post_send(&wr) }.expect("RDMA WRITE with immediate");
        let wc = poll_one(&ep.send_cq, "RDMA WRITE with immediate");
        assert_eq!(wc.opcode(), WcOpcode::RdmaWrite);

        let wc = poll_one(&ep.recv_cq, "done");
        assert_eq!(ep.slot(wc.wr_id() as usize, 4), b"done");
        last_sent
            .recv_timeout(common::WAIT_LIMIT)
            .expect("the listener's last SEND completes");
        ep.id.disconnect().expect("rdma_disconnect");
    });

    client.join().expect("client thread");
    server.join().expect("listener thread");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn async_connect_exchange_disconnect() {
    if test_support::require_device().is_none() {
        return;
    }
    let server_events = EventChannel::new().expect("rdma_create_event_channel");
    let listener = CmId::new(&server_events).expect("rdma_create_id");
    listener
        .bind_addr(SocketAddr::new(test_support::test_addr(), 0))
        .expect("rdma_bind_addr");
    listener.listen(4).expect("rdma_listen");
    let server_addr = listener.local_addr().expect("bound address");
    let (ready_tx, ready_rx) = mpsc::channel::<()>();

    let server = spawn("async listener", move || {
        let mut event = server_events
            .expect_event(CmEventKind::ConnectRequest)
            .expect("connect request");
        assert!(event.is_for(&listener));
        assert!(event.private_data().starts_with(HELLO));
        assert_eq!(event.peer_param().map(|p| p.rnr_retry_count), Some(0));
        let id = event.take_request().expect("the request's new id");
        assert!(!id.is_sync());
        let ep = Endpoint::new(id, true);
        ep.id.accept(&conn_param(b"welcome")).expect("rdma_accept");
        let established = server_events
            .expect_event(CmEventKind::Established)
            .expect("established");
        assert!(established.is_for(&ep.id));
        ready_tx.send(()).expect("signal the client");

        let wc = wait_one(&ep.recv_cq, &ep.channel, "async ping");
        assert_eq!(ep.slot(wc.wr_id() as usize, 5), b"hello");
        ep.send_inline(7, b"world", SendOp::SendWithImm(42));

        let event = server_events.get_event().expect("disconnected");
        assert_eq!(event.kind(), CmEventKind::Disconnected);
        assert!(event.is_for(&ep.id));
        drop(ep);
        drop(listener);
    });

    let client_events = EventChannel::new().expect("rdma_create_event_channel");
    let id = CmId::new(&client_events).expect("rdma_create_id");
    id.resolve_addr(None, server_addr, RESOLVE_TIMEOUT)
        .expect("rdma_resolve_addr");
    // Exercise the non-blocking path for the first event.
    client_events.set_nonblocking(true).expect("O_NONBLOCK");
    let start = std::time::Instant::now();
    let event = loop {
        if let Some(event) = client_events.try_get_event().expect("rdma_get_cm_event") {
            break event;
        }
        assert!(
            start.elapsed() < common::WAIT_LIMIT,
            "no address resolution event"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        (event.kind(), event.status()),
        (CmEventKind::AddrResolved, 0)
    );
    client_events
        .set_nonblocking(false)
        .expect("blocking again");
    id.resolve_route(RESOLVE_TIMEOUT)
        .expect("rdma_resolve_route");
    client_events
        .expect_event(CmEventKind::RouteResolved)
        .expect("route resolved");
    let ep = Endpoint::new(id, true);
    assert!(ep
        .id
        .connect(&conn_param(HELLO))
        .expect("rdma_connect")
        .is_empty());
    let established = client_events
        .expect_event(CmEventKind::Established)
        .expect("established");
    assert!(established.private_data().starts_with(b"welcome"));
    ready_rx.recv().expect("listener ready");

    ep.send_inline(1, b"hello", SendOp::Send);
    let wc = poll_one(&ep.recv_cq, "async pong");
    assert_eq!(wc.imm_data(), Some(42));
    assert_eq!(ep.slot(wc.wr_id() as usize, 5), b"world");

    ep.id.disconnect().expect("rdma_disconnect");
    let event = client_events.get_event().expect("disconnected");
    assert_eq!(event.kind(), CmEventKind::Disconnected);
    server.join().expect("async listener thread");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn rnr_retry_zero_fails_fast() {
    if test_support::require_device().is_none() {
        return;
    }
    let (listener, server_addr) = sync_listener();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let server = spawn("listener without receives", move || {
        let request = listener.get_request().expect("rdma_get_request");
        // No receives posted: every incoming SEND meets "receiver not ready".
        let ep = Endpoint::new(request.id, false);
        ep.id.accept(&conn_param(&[])).expect("rdma_accept");
        done_rx
            .recv_timeout(common::WAIT_LIMIT)
            .expect("client finished");
        let _ = ep.id.disconnect();
    });

    let id = sync_client_id(server_addr);
    let ep = Endpoint::new(id, true);
    ep.id.connect(&conn_param(HELLO)).expect("rdma_connect");
    ep.qp
        .post_send_inline(9, b"nobody listens", SendOp::Send, SendFlags::SIGNALED)
        .expect("post");
    let mut wcs = rpc_transport_rdma::verbs::WorkCompletion::array(1);
    let start = std::time::Instant::now();
    while ep.send_cq.poll(&mut wcs).expect("poll").is_empty() {
        assert!(
            start.elapsed() < common::WAIT_LIMIT,
            "no completion for the SEND"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!(wcs[0].wr_id(), 9);
    assert_eq!(wcs[0].status(), Err(WcError::RnrRetryExceeded));
    match wcs[0].result() {
        Err(VerbsError::WorkCompletion {
            wr_id: 9, error, ..
        }) => assert_eq!(error, WcError::RnrRetryExceeded),
        other => panic!("expected a work-completion error, got {other:?}"),
    }
    let _ = done_tx.send(());
    let _ = ep.id.disconnect();
    server.join().expect("listener thread");
}
