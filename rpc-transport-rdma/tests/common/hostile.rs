//! A raw-verbs peer that connects like an rdma-rpc client and then misbehaves, and the
//! server it misbehaves against (`hostile_peer.rs`, `hostile_memory.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::{
    method_id, CallTable, Channel, ChannelConfig, Code, Flags, FrameKind, Header, Request, Server,
};
use rpc_transport_rdma::protocol::ConnectParams;
use rpc_transport_rdma::verbs::{
    test_support, AccessFlags, CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel,
    MemoryRegion, ProtectionDomain, QpCapabilities, QpInitAttr, QueuePair, RecvRequest, RemoteAddr,
    SendFlags, SendOp, SendRequest, WcOpcode, WorkCompletion,
};
use rpc_transport_rdma::{RdmaClient, RdmaConfig, RdmaServer};

pub const LIMIT: Duration = Duration::from_secs(15);

pub fn next_event(channel: &Arc<EventChannel>, kind: CmEventKind) {
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
pub fn route_to(server: SocketAddr) -> (Arc<EventChannel>, CmId) {
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
pub struct HostilePeer {
    pub channel: Arc<EventChannel>,
    // Field order is teardown order: the QP goes before the memory it names.
    pub qp: QueuePair,
    pub cq: Arc<CompletionQueue>,
    pub recv: MemoryRegion,
    pub source: MemoryRegion,
    pub id: CmId,
}

pub const SLOT: usize = 4096;

impl HostilePeer {
    pub fn connect(server: SocketAddr) -> HostilePeer {
        HostilePeer::connect_with_retries(server, 6)
    }

    /// Connects asking for `retry_count` transport retries (which the server's queue pair
    /// takes too).
    pub fn connect_with_retries(server: SocketAddr, retry_count: u8) -> HostilePeer {
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

    pub fn send(&self, frame: &[u8]) {
        self.qp
            .post_send_inline(1, frame, SendOp::Send, SendFlags::SIGNALED)
            .expect("send forged frame");
    }

    /// The next frame the server sends about a call (credit returns are passed over).
    pub fn receive(&self) -> Header {
        loop {
            let frame = self.receive_any();
            if frame.kind != FrameKind::CreditOnly {
                return frame;
            }
        }
    }

    /// The next frame the server sends.
    pub fn receive_any(&self) -> Header {
        let until = Instant::now() + LIMIT;
        // One at a time: the frames after the one returned stay in the queue.
        let mut wcs = WorkCompletion::array(1);
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
    pub fn write(&self, addr: u64, rkey: u32, len: usize) {
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
    pub fn lose_queue_pair(self) -> (Arc<EventChannel>, CmId) {
        drop(self.qp);
        (self.channel, self.id)
    }

    pub fn expect_disconnected(self) {
        next_event(&self.channel, CmEventKind::Disconnected);
    }
}

/// Connects, sends `frame` as the first message, and returns once the server has
/// disconnected the peer.
pub fn hostile_peer_is_disconnected(server: SocketAddr, frame: &[u8]) {
    let peer = HostilePeer::connect(server);
    peer.send(frame);
    peer.expect_disconnected();
}

/// Asks the server for a buffer for `call_id`'s body of `len` bytes; returns the answer.
pub fn ask_buffer(peer: &HostilePeer, call_id: u64, len: u64) -> Header {
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
pub fn granted(peer: &HostilePeer, len: u64) -> Header {
    let grant = ask_buffer(peer, 7, len);
    assert_eq!(
        (grant.kind, grant.status, grant.remote.len),
        (FrameKind::LargeGrant, Code::Ok, len)
    );
    grant
}

pub fn placed(call_id: u64, payload_len: u32) -> Header {
    let mut h = Header::new(FrameKind::Request, call_id);
    h.flags = Flags::LARGE_PAYLOAD;
    h.payload_len = payload_len;
    h.method_id = method_id("/nobody.Home/Call");
    h
}

pub fn call_succeeds_as_unimplemented(channel: &Channel) {
    let err = channel
        .unary_blocking::<(), ()>(method_id("/nobody.Home/Call"), Request::new(()))
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
}

/// A server with no services and `config`, once tracing is set up; `None` without a device.
pub fn serve(config: RdmaConfig) -> Option<RdmaServer> {
    serve_with(Server::builder(), config)
}

/// As [`serve`], the server built by `builder` (its landings, say).
pub fn serve_with(builder: rpc_core::ServerBuilder, config: RdmaConfig) -> Option<RdmaServer> {
    init_tracing();
    test_support::require_device()?;
    let dispatcher = builder.build().expect("dispatcher");
    let addr = SocketAddr::new(test_support::test_addr(), 0).to_string();
    Some(RdmaServer::bind(&addr, dispatcher, config).expect("server"))
}

/// RUST_LOG=rpc_transport_rdma=debug shows the server's side.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Bytes of memory the process has pinned (registered).
pub fn vm_pin() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmPin");
    kib * 1024
}

/// A client of the server at `addr` that follows the protocol, once its first call got an
/// answer: the connection the hostile peers' must leave untouched.
pub fn well_behaved_client(addr: SocketAddr) -> Channel {
    let calls = Arc::new(CallTable::new());
    let client = RdmaClient::connect(&addr.to_string(), calls.clone(), &RdmaConfig::default())
        .expect("well-behaved client connects");
    let channel = Channel::new(calls, client, ChannelConfig::default());
    call_succeeds_as_unimplemented(&channel);
    channel
}
