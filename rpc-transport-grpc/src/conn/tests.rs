//! The connection's bounds, without HTTP/2.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Wake;

use rpc_core::body::RawBody;
use rpc_core::frame::EMPTY;

use super::*;

#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn conn(write_queue: usize) -> Arc<GrpcConn> {
    GrpcConn::new(
        "grpc://test".into(),
        Side::Server,
        1024,
        1 << 20,
        write_queue,
    )
}

fn poll_send(conn: &GrpcConn, cx: &mut Context<'_>, header: Header) -> Poll<Result<(), Status>> {
    let payload = [7u8; 300];
    let body = RawBody(&payload);
    let mut frame = OutgoingFrame::new(header, &EMPTY, &body).unwrap();
    conn.poll_send(cx, &mut frame)
}

/// Messages queue up to the write queue's bound (plus the one that crosses it), then
/// the sender waits; a status still goes; taking a message wakes the sender.
#[test]
fn senders_wait_at_the_write_queue_bound() {
    let conn = conn(1000);
    let id = conn.open_call().unwrap();
    let woken = Arc::new(Count::default());
    let waker = Waker::from(woken.clone());
    let mut cx = Context::from_waker(&waker);
    let mut sent = 0;
    while poll_send(
        &conn,
        &mut cx,
        Header::stream(FrameKind::Message, id, sent + 1),
    )
    .is_ready()
    {
        sent += 1;
        assert!(sent < 10, "no bound");
    }
    // 305 bytes framed each: the fourth crosses 1,000.
    assert_eq!(sent, 4);
    let mut trailers = Header::stream(FrameKind::Trailers, id, sent + 1);
    trailers.status = rpc_core::Code::Ok;
    assert!(
        poll_send(&conn, &mut cx, trailers).is_ready(),
        "a status waits"
    );
    assert_eq!(woken.0.load(Ordering::SeqCst), 0);
    let Poll::Ready(Reply::Message(first)) = conn.poll_reply(id, &mut cx) else {
        panic!("no message queued");
    };
    assert_eq!(first.len(), PREFIX_LEN + 300);
    assert_eq!(
        woken.0.load(Ordering::SeqCst),
        1,
        "the sender was not woken"
    );
    // Ending the call gives back what its queue held.
    conn.end_call(id, false);
    assert_eq!(conn.state.lock().queued, 0);
}
