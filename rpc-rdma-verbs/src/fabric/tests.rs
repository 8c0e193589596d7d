//! The provider's model at the limits a device enforces, through the crate's safe types:
//!
//! * a SEND with no receive posted waits for one when the connection retries a receiver not
//!   ready for ever, and later SENDs of its queue pair wait behind it;
//! * an RDMA WRITE past the bytes its rkey grants fails with a remote access error and
//!   breaks both queue pairs (the receiver's posted receives are flushed);
//! * a completion queue holds its capacity: one completion more is lost and raises
//!   `IBV_EVENT_CQ_ERR`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::{
    AccessFlags, AsyncEventKind, CmId, CompletionQueue, ConnParam, EventSubject, MemoryRegion,
    ProtectionDomain, QpCapabilities, QpInitAttr, QueuePair, RecvRequest, SendFlags, SendOp,
    SendRequest, WcError, WcOpcode, WorkCompletion,
};

const MSG: usize = 64;
const REGION: usize = 4096;
const TIMEOUT: Duration = Duration::from_secs(5);

/// One end: a QP whose sends and receives complete on one CQ, and a region its peer may
/// write. Fields drop in order: the QP before its memory and id.
struct End {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    mr: MemoryRegion,
    id: CmId,
}

impl End {
    fn new(id: CmId, cq_entries: u32) -> End {
        let ctx = id.context().expect("cm_id context");
        let pd = ProtectionDomain::new(&ctx).expect("ibv_alloc_pd");
        let cq = CompletionQueue::new(&ctx, cq_entries, None, 1).expect("CQ");
        let qp = QueuePair::new(
            &id,
            &pd,
            QpInitAttr {
                send_cq: Arc::clone(&cq),
                recv_cq: Arc::clone(&cq),
                caps: QpCapabilities::default(),
                sq_sig_all: false,
                srq: None,
            },
        )
        .expect("QP");
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = MemoryRegion::alloc(&pd, REGION, access).expect("MR");
        End { qp, cq, mr, id }
    }

    fn post_recv(&self, slot: usize) {
        let sge = self.mr.sge(slot * MSG..(slot + 1) * MSG).expect("SGE");
        let wr = RecvRequest {
            wr_id: slot as u64,
            sges: &[sge],
        };
        // SAFETY: the slot lies in `mr`, which outlives the QP (field order), and is read
        // only after its completion.
        unsafe { self.qp.post_recv(&wr) }.expect("ibv_post_recv");
    }

    fn send(&self, wr_id: u64, data: &[u8]) {
        self.qp
            .post_send_inline(wr_id, data, SendOp::Send, SendFlags::SIGNALED)
            .expect("ibv_post_send");
    }

    fn poll_none(&self) {
        let mut wcs = WorkCompletion::array(1);
        assert!(
            self.cq.poll(&mut wcs).expect("poll").is_empty(),
            "a completion came"
        );
    }

    /// The next completion, which must have succeeded.
    fn next_ok(&self, what: &str) -> WorkCompletion {
        let wc = self.next();
        if let Err(e) = wc.result() {
            panic!("{what}: {e}");
        }
        wc
    }

    /// The next completion, failed or not.
    fn next(&self) -> WorkCompletion {
        let mut wcs = WorkCompletion::array(1);
        for _ in 0..10_000 {
            if !self.cq.poll(&mut wcs).expect("poll").is_empty() {
                return wcs.pop().expect("one");
            }
            std::thread::yield_now();
        }
        panic!("no completion");
    }
}

/// A connected pair (server, client) with synchronous rdma_cm ids, each end's
/// `rnr_retry_count` and completion queue size as given.
fn pair(rnr_retry_count: u8, server_cq: u32, client_cq: u32) -> (End, End) {
    let param = ConnParam {
        rnr_retry_count,
        ..ConnParam::default()
    };
    let listener = CmId::new_sync().expect("rdma_create_id");
    listener
        .bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
        .expect("rdma_bind_addr");
    listener.listen(1).expect("rdma_listen");
    let addr = listener.local_addr().expect("bound address");
    let server = std::thread::spawn(move || {
        let request = listener.get_request().expect("rdma_get_request");
        let end = End::new(request.id, server_cq);
        end.id.accept(&param).expect("rdma_accept");
        end
    });
    let id = CmId::new_sync().expect("rdma_create_id");
    id.resolve_addr(None, addr, TIMEOUT).expect("resolve_addr");
    id.resolve_route(TIMEOUT).expect("resolve_route");
    let client = End::new(id, client_cq);
    client.id.connect(&param).expect("rdma_connect");
    (server.join().expect("listener thread"), client)
}

#[test]
fn sends_wait_in_order_for_receives_when_retries_are_unbounded() {
    let (server, client) = pair(7, 16, 16);
    client.send(1, b"first");
    client.send(2, b"second");
    client.poll_none();
    server.poll_none();

    server.post_recv(0);
    let wc = server.next_ok("the first message");
    assert_eq!(
        (wc.opcode(), wc.wr_id(), wc.byte_len()),
        (WcOpcode::Recv, 0, 5)
    );
    assert_eq!(client.next_ok("the first send").wr_id(), 1);
    client.poll_none();
    server.poll_none();

    server.post_recv(1);
    assert_eq!(server.next_ok("the second message").byte_len(), 6);
    assert_eq!(client.next_ok("the second send").wr_id(), 2);
    // SAFETY: both receives completed; nothing writes the region any more.
    let bytes = unsafe { &server.mr.slice_unchecked()[..MSG + 6] };
    assert_eq!(
        (&bytes[..5], &bytes[MSG..]),
        (&b"first"[..], &b"second"[..])
    );
}

#[test]
fn a_send_with_no_receive_fails_at_once_when_retries_are_bounded() {
    let (_server, client) = pair(0, 16, 16);
    client.send(1, b"nobody listens");
    assert_eq!(client.next().status(), Err(WcError::RnrRetryExceeded));
}

#[test]
fn a_write_past_its_grant_fails_and_breaks_both_queue_pairs() {
    let (server, client) = pair(7, 16, 16);
    server.post_recv(0);
    let mut remote = server.mr.remote_addr();
    remote.addr += (REGION - 16) as u64;
    let sge = client.mr.sge(0..32).expect("SGE");
    let wr = SendRequest {
        wr_id: 9,
        sges: &[sge],
        op: SendOp::RdmaWrite(remote),
        flags: SendFlags::SIGNALED,
    };
    // SAFETY: the source lies in the client's region, which outlives the QP.
    unsafe { client.qp.post_send(&wr) }.expect("ibv_post_send");
    let wc = client.next();
    assert_eq!((wc.wr_id(), wc.status()), (9, Err(WcError::RemoteAccess)));
    let flushed = server.next();
    assert_eq!(
        (flushed.wr_id(), flushed.status()),
        (0, Err(WcError::WorkRequestFlushed))
    );
}

#[test]
fn a_completion_past_the_queue_capacity_is_lost_and_raises_cq_err() {
    let (server, client) = pair(7, 16, 2);
    for slot in 0..3 {
        server.post_recv(slot);
    }
    for n in 0..3 {
        client.send(n, b"x");
    }
    let ctx = client.id.context().expect("context");
    ctx.set_async_nonblocking(true).expect("non-blocking");
    let event = ctx
        .try_get_async_event()
        .expect("ibv_get_async_event")
        .expect("an event");
    assert_eq!(event.kind, AsyncEventKind::CqErr);
    assert_eq!(event.subject, EventSubject::Cq(client.cq.id()));
    assert_eq!(client.next().wr_id(), 0);
    assert_eq!(client.next().wr_id(), 1);
    client.poll_none();
}
