//! A peer that breaks the protocol on real verbs is disconnected, and only that peer: a
//! well-behaved client of the same server keeps working.
//!
//! The hostile peer is raw verbs: it connects with valid ring parameters, then SENDs a
//! forged frame (garbage, a credit grant beyond the ring, a length beyond what arrived, a
//! body "placed" without a grant or beyond it), or RDMA WRITEs with a forged rkey or beyond
//! the window it was granted.
//! Ignored by a plain `cargo test` (it needs a device); `cargo xtask test` runs it in the
//! soft-RoCE VM with `--include-ignored`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::{
    method_id, CallTable, Channel, ChannelConfig, Code, Flags, FrameKind, Header, Request, Server,
};
use rpc_transport_rdma::protocol::{decode_reject, ConnectParams};
use rpc_transport_rdma::verbs::{
    test_support, AccessFlags, CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel,
    MemoryRegion, ProtectionDomain, QpCapabilities, QpInitAttr, QueuePair, RecvRequest, RemoteAddr,
    SendFlags, SendOp, SendRequest, WcOpcode, WorkCompletion,
};
use rpc_transport_rdma::{
    LargeBodies, Liveness, RdmaClient, RdmaConfig, RdmaServer, Receives, Rings, SharedRecvConfig,
};

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

/// An rdma_cm id with its route to `server` resolved, on a non-blocking channel.
fn route_to(server: SocketAddr) -> (Arc<EventChannel>, CmId) {
    let channel = EventChannel::new().expect("event channel");
    channel.set_nonblocking(true).expect("non-blocking");
    let id = CmId::new(&channel).expect("cm id");
    id.resolve_addr(None, server, LIMIT).expect("resolve addr");
    next_event(&channel, CmEventKind::AddrResolved);
    id.resolve_route(LIMIT).expect("resolve route");
    next_event(&channel, CmEventKind::RouteResolved);
    (channel, id)
}

/// A raw-verbs peer that connects like an rdma-rpc client and then misbehaves.
struct HostilePeer {
    channel: Arc<EventChannel>,
    // Field order is teardown order: the QP goes before the memory it names.
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    recv: MemoryRegion,
    source: MemoryRegion,
    id: CmId,
}

const SLOT: usize = 4096;

impl HostilePeer {
    fn connect(server: SocketAddr) -> HostilePeer {
        HostilePeer::connect_with_retries(server, 6)
    }

    /// Connects asking for `retry_count` transport retries (which the server's queue pair
    /// takes too).
    fn connect_with_retries(server: SocketAddr, retry_count: u8) -> HostilePeer {
        let (channel, id) = route_to(server);
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
                srq: None,
            },
        )
        .expect("qp");
        let recv = MemoryRegion::alloc(&pd, 8 * SLOT, AccessFlags::LOCAL_WRITE).expect("mr");
        let source = MemoryRegion::alloc(&pd, 1 << 20, AccessFlags::NONE).expect("mr");
        for slot in 0..8u64 {
            let sge = recv
                .sge(slot as usize * SLOT..(slot as usize + 1) * SLOT)
                .expect("sge");
            // SAFETY: the slot lies in `recv`, which outlives the QP (dropped after it), and
            // is read only after its completion.
            unsafe {
                qp.post_recv(&RecvRequest {
                    wr_id: slot,
                    sges: &[sge],
                })
            }
            .expect("post recv");
        }
        let params = ConnectParams::new(8, SLOT as u32).encode();
        id.connect(&ConnParam {
            private_data: &params,
            rnr_retry_count: 0,
            retry_count,
            ..ConnParam::default()
        })
        .expect("connect");
        next_event(&channel, CmEventKind::Established);
        HostilePeer {
            channel,
            qp,
            cq,
            recv,
            source,
            id,
        }
    }

    fn send(&self, frame: &[u8]) {
        self.qp
            .post_send_inline(1, frame, SendOp::Send, SendFlags::SIGNALED)
            .expect("send forged frame");
    }

    /// The next frame the server sends about a call (credit returns are passed over).
    fn receive(&self) -> Header {
        loop {
            let frame = self.receive_any();
            if frame.kind != FrameKind::CreditOnly {
                return frame;
            }
        }
    }

    /// The next frame the server sends.
    fn receive_any(&self) -> Header {
        let until = Instant::now() + LIMIT;
        let mut wcs = WorkCompletion::array(8);
        loop {
            for wc in self.cq.poll(&mut wcs).expect("poll").iter() {
                if wc.opcode() == WcOpcode::Recv {
                    wc.result().expect("receive");
                    let at = wc.wr_id() as usize * SLOT;
                    // SAFETY: this slot's receive completed and it is not posted again.
                    let slot = unsafe { &self.recv.slice_unchecked()[at..at + SLOT] };
                    return Header::decode(slot).expect("server frames decode");
                }
            }
            assert!(Instant::now() < until, "no frame from the server");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// RDMA WRITEs `len` bytes to `addr` with `rkey`.
    fn write(&self, addr: u64, rkey: u32, len: usize) {
        let sge = self.source.sge(0..len).expect("sge");
        // SAFETY: the source lies in `source`, which outlives the QP and is never written.
        unsafe {
            self.qp.post_send(&SendRequest {
                wr_id: 2,
                sges: &[sge],
                op: SendOp::RdmaWrite(RemoteAddr { addr, rkey }),
                flags: SendFlags::SIGNALED,
            })
        }
        .expect("post write");
    }

    /// Destroys the queue pair but keeps the rdma_cm id connected: a peer that died without
    /// a word (its host lost power, say). Returns what still waits for the disconnect.
    fn lose_queue_pair(self) -> (Arc<EventChannel>, CmId) {
        drop(self.qp);
        (self.channel, self.id)
    }

    fn expect_disconnected(self) {
        next_event(&self.channel, CmEventKind::Disconnected);
    }
}

/// Connects, sends `frame` as the first message, and returns once the server has
/// disconnected the peer.
fn hostile_peer_is_disconnected(server: SocketAddr, frame: &[u8]) {
    let peer = HostilePeer::connect(server);
    peer.send(frame);
    peer.expect_disconnected();
}

/// Asks the server for a buffer for `call_id`'s body of `len` bytes; returns the answer.
fn ask_buffer(peer: &HostilePeer, call_id: u64, len: u64) -> Header {
    let mut ask = Header::new(FrameKind::LargeRequest, call_id);
    ask.remote.len = len;
    peer.send(&ask.to_bytes());
    let answer = peer.receive();
    assert_eq!(
        (answer.kind, answer.call_id),
        (FrameKind::LargeGrant, call_id)
    );
    answer
}

/// Asks the server for a buffer for call 7's body of `len` bytes; returns the grant.
fn granted(peer: &HostilePeer, len: u64) -> Header {
    let grant = ask_buffer(peer, 7, len);
    assert_eq!(
        (grant.kind, grant.status, grant.remote.len),
        (FrameKind::LargeGrant, Code::Ok, len)
    );
    grant
}

fn placed(call_id: u64, payload_len: u32) -> Header {
    let mut h = Header::new(FrameKind::Request, call_id);
    h.flags = Flags::LARGE_PAYLOAD;
    h.payload_len = payload_len;
    h.method_id = method_id("/nobody.Home/Call");
    h
}

fn call_succeeds_as_unimplemented(channel: &Channel) {
    let err = channel
        .unary_blocking::<(), ()>(method_id("/nobody.Home/Call"), Request::new(()))
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
}

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

/// A server with no services and `config`, once tracing is set up; `None` without a device.
fn serve(config: RdmaConfig) -> Option<RdmaServer> {
    init_tracing();
    test_support::require_device()?;
    let dispatcher = Server::builder().build().expect("dispatcher");
    let addr = SocketAddr::new(test_support::test_addr(), 0).to_string();
    Some(RdmaServer::bind(&addr, dispatcher, config).expect("server"))
}

/// RUST_LOG=rpc_transport_rdma=debug shows the server's side.
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Every kind of offence against a server configured with `server_config`.
fn offenders_are_disconnected(server_config: RdmaConfig) {
    let Some(server) = serve(server_config) else {
        return;
    };
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

/// Offers call 7's request body of `len` bytes at `addr` (`rkey`) for the server to READ,
/// and sends its notice right behind, as a client does.
fn offer(peer: &HostilePeer, addr: u64, rkey: u32, len: u64) {
    let mut source = Header::new(FrameKind::LargeSource, 7);
    source.remote = rpc_core::RemoteBuffer {
        addr,
        rkey,
        generation: 1,
        len,
    };
    peer.send(&source.to_bytes());
    peer.send(&placed(7, len as u32).to_bytes());
}

/// Request bodies offered for reading: the server reads an honest one and answers; a
/// forged rkey, a range past the region, a region deregistered before the READ, and a
/// peer that vanishes mid-READ end only the offender's connection, and leave nothing
/// registered behind.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn offered_bodies_the_server_cannot_read_end_only_the_offender() {
    init_tracing();
    let Some(server) = serve(RdmaConfig::default()) else {
        return;
    };
    let addr = server.local_addr();
    let calls = Arc::new(CallTable::new());
    let client = RdmaClient::connect(&addr.to_string(), calls.clone(), &RdmaConfig::default())
        .expect("well-behaved client connects");
    let channel = Channel::new(calls, client, ChannelConfig::default());
    call_succeeds_as_unimplemented(&channel);
    let readable = |peer: &HostilePeer, len: usize| {
        let pd = peer.qp.pd();
        MemoryRegion::alloc(pd, len, AccessFlags::REMOTE_READ).expect("readable region")
    };

    // Honest: read, answered, then the call's status.
    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    offer(&peer, body.addr(), body.rkey(), 100_000);
    let done = peer.receive();
    assert_eq!(
        (done.kind, done.call_id, done.status),
        (FrameKind::LargeSourceDone, 7, Code::Ok)
    );
    let answer = peer.receive();
    assert_eq!(
        (answer.kind, answer.call_id, answer.status),
        (FrameKind::Response, 7, Code::Unimplemented)
    );
    drop(peer);
    drop(body);
    eprintln!("an honest offer: read, answered");

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    offer(&peer, body.addr(), body.rkey() ^ 0x5a5a_0000, 100_000);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("an offer with a forged rkey: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    offer(&peer, body.addr() + (1 << 20), body.rkey(), 100_000);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("an offer past its region: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    let (gone_addr, gone_rkey) = (body.addr(), body.rkey());
    drop(body);
    offer(&peer, gone_addr, gone_rkey, 100_000);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("an offer of a region deregistered first: offender disconnected, other client fine");

    // Vanishes while the server reads the largest body it takes: its queue pair is
    // destroyed at once, and then its connection.
    let len = rpc_core::client::DEFAULT_MAX_MESSAGE_SIZE;
    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, len);
    let before = vm_pin();
    offer(&peer, body.addr(), body.rkey(), len as u64);
    // The server leased a buffer as large: it is reading.
    let deadline = Instant::now() + LIMIT;
    while vm_pin().saturating_sub(before) < len as u64 {
        assert!(
            Instant::now() < deadline,
            "the server never leased a buffer to read into"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (channel_left, id) = peer.lose_queue_pair();
    drop(body);
    drop(id);
    drop(channel_left);
    call_succeeds_as_unimplemented(&channel);
    // The peer's body and the server's lease are both gone.
    let deadline = Instant::now() + LIMIT;
    loop {
        let now = vm_pin();
        if now + len as u64 <= before {
            eprintln!(
                "a peer gone mid-READ: other client fine, VmPin {} KiB below the offer's start",
                (before - now) / 1024
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "VmPin {now} bytes, {before} before the offer of {len}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bytes of memory the process has pinned (registered).
fn vm_pin() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmPin");
    kib * 1024
}

/// A peer asks for buffers of 1 GiB from a server whose messages are limited to 4 MiB: both
/// are refused, naming the limit, and nothing is registered. Then it asks for a buffer it
/// never writes: the server closes the connection once the grant timeout passes.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_peer_cannot_make_the_server_register_memory_it_does_not_fill() {
    let limit =
        rpc_core::client::DEFAULT_MAX_MESSAGE_SIZE as u64 + rpc_core::MAX_METADATA_LEN as u64;
    let grant_timeout = Duration::from_secs(1);
    let config = RdmaConfig::default().large(LargeBodies::default().grant_timeout(grant_timeout));
    let Some(server) = serve(config) else {
        return;
    };
    let peer = HostilePeer::connect(server.local_addr());
    let pinned = vm_pin();
    for call_id in [7, 8] {
        let answer = ask_buffer(&peer, call_id, 1 << 30);
        assert_eq!(
            (answer.status, answer.remote.len, answer.remote.rkey),
            (Code::ResourceExhausted, limit, 0),
            "a 1 GiB buffer is refused, naming the server's limit"
        );
    }
    let grown = vm_pin().saturating_sub(pinned);
    eprintln!(
        "two 1 GiB buffer requests refused (limit {limit} bytes); VmPin grew by {grown} bytes"
    );
    assert!(grown < 1 << 20, "VmPin grew by {grown} bytes");

    let grant = ask_buffer(&peer, 9, 1 << 20);
    assert_eq!(grant.status, Code::Ok);
    let started = Instant::now();
    peer.expect_disconnected();
    let held = started.elapsed();
    eprintln!("a grant of 1 MiB never written: disconnected after {held:?}");
    assert!(held >= grant_timeout, "disconnected after {held:?}");
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
