//! The dispatcher's bounds and ordering, with a sink that records answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use super::{ConnectionDispatch, Dispatcher, MethodDescriptor, ReplySink, Server, ServerCall};
use super::{HandlerFuture, ServerReply, Service};
use crate::frame::{InboundFrame, OutgoingFrame};
use crate::header::{FrameKind, Header};
use crate::stream::Wakes;
use crate::{Code, Status};

static HANG: [MethodDescriptor; 1] = [MethodDescriptor::new("/test.Hang/Hang")];

/// A method that never answers, counting its runs as each begins (its first poll).
#[derive(Default)]
struct Hang {
    runs: Arc<AtomicUsize>,
}

impl Service for Hang {
    fn name(&self) -> &'static str {
        "test.Hang"
    }

    fn methods(&self) -> &'static [MethodDescriptor] {
        &HANG
    }

    fn call(&self, _: u32, _: ServerCall) -> HandlerFuture {
        let runs = self.runs.clone();
        HandlerFuture::new(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            futures::future::pending().await
        })
    }
}

/// Records the status of every answer.
#[derive(Default)]
struct Answers(Mutex<Vec<(u64, Code)>>);

impl ReplySink for Answers {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let h = frame.header();
        self.0.lock().push((h.call_id, h.status));
        Ok(())
    }
}

fn server(per_connection: usize, all: usize) -> (Arc<Dispatcher>, Arc<AtomicUsize>) {
    let hang = Hang::default();
    let runs = hang.runs.clone();
    let dispatcher = Server::builder()
        .max_calls_per_connection(per_connection)
        .max_calls(all)
        .worker_threads(1)
        .add_service(hang)
        .build()
        .expect("server");
    (dispatcher, runs)
}

fn connection(dispatcher: &Arc<Dispatcher>) -> (Arc<ConnectionDispatch>, Arc<Answers>) {
    let answers = Arc::new(Answers::default());
    (dispatch_to(dispatcher, answers.clone()), answers)
}

/// A connection whose answers go to `sink`.
fn dispatch_to(dispatcher: &Arc<Dispatcher>, sink: Arc<dyn ReplySink>) -> Arc<ConnectionDispatch> {
    ConnectionDispatch::new(
        dispatcher.clone(),
        sink,
        crate::auth::Peer::anonymous("test://peer"),
    )
}

fn frame(kind: FrameKind, call_id: u64) -> InboundFrame {
    let mut header = Header::new(kind, call_id);
    header.method_id = HANG[0].id;
    InboundFrame {
        header,
        metadata: Bytes::new(),
        payload: Bytes::new(),
    }
}

fn request(conn: &Arc<ConnectionDispatch>, call_id: u64) {
    conn.on_frame(frame(FrameKind::Request, call_id), &mut Wakes::new());
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn requests_beyond_the_per_connection_limit_are_refused() {
    let (dispatcher, runs) = server(2, 100);
    let (conn, answers) = connection(&dispatcher);
    for call_id in 1..=3 {
        request(&conn, call_id);
    }
    assert_eq!(*answers.0.lock(), [(3, Code::ResourceExhausted)]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Another connection is not affected.
    let (other, other_answers) = connection(&dispatcher);
    request(&other, 1);
    assert!(other_answers.0.lock().is_empty());
    // A cancelled call makes room.
    conn.on_frame(frame(FrameKind::Cancel, 1), &mut Wakes::new());
    wait_for("the cancelled call ends", || dispatcher.in_flight() == 2);
    request(&conn, 4);
    assert_eq!(answers.0.lock().len(), 1, "call 4 runs");
    conn.close();
    other.close();
}

#[test]
fn requests_beyond_the_server_limit_are_refused() {
    let (dispatcher, runs) = server(100, 3);
    let (a, a_answers) = connection(&dispatcher);
    let (b, b_answers) = connection(&dispatcher);
    request(&a, 1);
    request(&a, 2);
    request(&b, 1);
    request(&b, 2);
    assert!(a_answers.0.lock().is_empty());
    assert_eq!(*b_answers.0.lock(), [(2, Code::ResourceExhausted)]);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    a.close();
    b.close();
}

#[test]
fn a_cancel_that_overtakes_its_request_cancels_it() {
    let (dispatcher, runs) = server(100, 100);
    let (conn, answers) = connection(&dispatcher);
    conn.on_frame(frame(FrameKind::Cancel, 9), &mut Wakes::new());
    request(&conn, 9);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(conn.calls_running(), 0);
    assert!(answers.0.lock().is_empty(), "the client forgot the call");
    request(&conn, 10);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "later calls run");
    conn.close();
}

static QUICK: [MethodDescriptor; 1] = [MethodDescriptor::new("/test.Quick/Quick")];

/// A method that answers at once.
struct Quick;

impl Service for Quick {
    fn name(&self) -> &'static str {
        "test.Quick"
    }

    fn methods(&self) -> &'static [MethodDescriptor] {
        &QUICK
    }

    fn call(&self, _: u32, _: ServerCall) -> HandlerFuture {
        HandlerFuture::new(async { Ok(ServerReply::new(crate::MetadataMap::new(), ())) })
    }
}

/// A peer that withholds credits: no room until `open`, and the blocking send must never
/// be used for replies.
#[derive(Default)]
struct NoRoom {
    open: std::sync::atomic::AtomicBool,
    wakers: Mutex<Vec<std::task::Waker>>,
    answered: AtomicUsize,
}

impl ReplySink for NoRoom {
    fn send(&self, _: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        panic!("a reply parked a thread on the blocking send");
    }

    fn poll_send(
        &self,
        cx: &mut std::task::Context<'_>,
        _: &mut OutgoingFrame<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        // Checked and registered under the lock the opening takes: a reply that found no
        // room is among the wakers the opening wakes.
        let mut wakers = self.wakers.lock();
        if self.open.load(Ordering::SeqCst) {
            self.answered.fetch_add(1, Ordering::SeqCst);
            return std::task::Poll::Ready(Ok(()));
        }
        wakers.push(cx.waker().clone());
        std::task::Poll::Pending
    }
}

/// Replies to a peer that gives no credits wait as tasks, not on a thread: the one worker
/// and the receiving thread stay free, and the replies go once room comes.
#[test]
fn replies_waiting_for_credits_park_no_thread() {
    let dispatcher = Server::builder()
        .worker_threads(1)
        .add_service(Quick)
        .build()
        .expect("server");
    let sink = Arc::new(NoRoom::default());
    let conn = dispatch_to(&dispatcher, sink.clone());
    let started = Instant::now();
    for call_id in 1..=100 {
        let mut header = Header::new(FrameKind::Request, call_id);
        header.method_id = QUICK[0].id;
        let frame = InboundFrame {
            header,
            metadata: Bytes::new(),
            payload: Bytes::new(),
        };
        conn.on_frame(frame, &mut Wakes::new());
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "receiving 100 requests took {:?}",
        started.elapsed()
    );
    wait_for("100 answers wait for room", || {
        dispatcher.in_flight() == 100
    });
    assert_eq!(sink.answered.load(Ordering::SeqCst), 0);
    let wakers = {
        let mut wakers = sink.wakers.lock();
        sink.open.store(true, Ordering::SeqCst);
        std::mem::take(&mut *wakers)
    };
    wakers.into_iter().for_each(std::task::Waker::wake);
    wait_for("every answer went", || {
        sink.answered.load(Ordering::SeqCst) == 100
    });
    wait_for("nothing in flight", || dispatcher.in_flight() == 0);
    conn.close();
}

static COUNT: [MethodDescriptor; 1] = [MethodDescriptor::new("/test.Count/Count")];

/// A client-streaming method that records how many messages its stream had.
#[derive(Default)]
struct Count(Arc<Mutex<Vec<usize>>>);

impl Service for Count {
    fn name(&self) -> &'static str {
        "test.Count"
    }

    fn methods(&self) -> &'static [MethodDescriptor] {
        &COUNT
    }

    fn call(&self, _: u32, call: ServerCall) -> HandlerFuture {
        let counts = self.0.clone();
        HandlerFuture::new(async move {
            let mut messages = call.into_streaming::<()>()?.into_inner();
            let mut n = 0;
            while messages.message().await?.is_some() {
                n += 1;
            }
            counts.lock().push(n);
            Ok(ServerReply::new(crate::MetadataMap::new(), ()))
        })
    }
}

fn stream_frame(kind: FrameKind, call_id: u64, seq: u32) -> InboundFrame {
    let mut frame = frame(kind, call_id);
    frame.header.method_id = seq;
    if kind == FrameKind::Request {
        frame.header.method_id = COUNT[0].id;
        frame.header.flags = crate::header::Flags::STREAM;
    }
    frame
}

fn counting_server() -> (Arc<ConnectionDispatch>, Arc<Mutex<Vec<usize>>>) {
    let count = Count::default();
    let counts = count.0.clone();
    let dispatcher = Server::builder()
        .max_calls_per_connection(2)
        .worker_threads(1)
        .add_service(count)
        .build()
        .expect("server");
    (connection(&dispatcher).0, counts)
}

/// A transport that hands frames up from two threads may deliver a stream's messages and
/// half-close before its request: they are held and read once the request opens the stream.
#[test]
fn stream_frames_that_overtake_their_request_are_read_after_it() {
    let (conn, counts) = counting_server();
    let wakes = &mut Wakes::new();
    conn.on_frame(stream_frame(FrameKind::Message, 1, 2), wakes);
    conn.on_stream_messages(1, [stream_frame(FrameKind::Message, 1, 1)], wakes);
    conn.on_frame(stream_frame(FrameKind::HalfClose, 1, 3), wakes);
    conn.on_frame(stream_frame(FrameKind::Request, 1, 0), wakes);
    wait_for("the stream of 2 messages ended", || {
        !counts.lock().is_empty()
    });
    assert_eq!(*counts.lock(), [2]);
    assert_eq!(conn.streams.lock().early_held().messages, 0);
    conn.close();
}

/// Frames held for a request that is cancelled, or refused, are dropped with it.
#[test]
fn frames_held_for_a_cancelled_or_refused_request_are_dropped() {
    let (conn, counts) = counting_server();
    let wakes = &mut Wakes::new();
    conn.on_frame(stream_frame(FrameKind::Message, 1, 1), wakes);
    conn.on_frame(stream_frame(FrameKind::Cancel, 1, 0), wakes);
    assert_eq!(conn.streams.lock().early_held().messages, 0, "cancelled");
    // Two calls fill the connection's limit of 2; the third is refused.
    conn.on_frame(stream_frame(FrameKind::Request, 2, 0), wakes);
    conn.on_frame(stream_frame(FrameKind::Request, 3, 0), wakes);
    conn.on_frame(stream_frame(FrameKind::Message, 4, 1), wakes);
    conn.on_frame(stream_frame(FrameKind::Request, 4, 0), wakes);
    assert_eq!(conn.streams.lock().early_held().messages, 0, "refused");
    for call_id in [2, 3] {
        conn.on_frame(stream_frame(FrameKind::HalfClose, call_id, 1), wakes);
    }
    // A transport wakes the readers its frames were for once its turn ends: a handler
    // already waiting for its stream's end is woken here.
    wakes.wake_all();
    wait_for("both calls ended", || counts.lock().len() == 2);
    assert_eq!(*counts.lock(), [0, 0]);
    conn.close();
}

/// A link that has flushed `FLUSH_TAKES` after it was first asked to (a TCP client that
/// closes its side a moment after the server's), recording whether it had when closed.
struct SlowFlush {
    asked: Mutex<Option<Instant>>,
    closed_flushed: Mutex<Option<bool>>,
}

const FLUSH_TAKES: Duration = Duration::from_millis(60);

impl super::ServedLink for SlowFlush {
    fn flushed(&self) -> bool {
        let asked = *self.asked.lock().get_or_insert_with(Instant::now);
        asked.elapsed() >= FLUSH_TAKES
    }

    fn close(&self, _: Status) {
        let flushed = self.flushed();
        self.closed_flushed.lock().get_or_insert(flushed);
    }
}

/// A graceful shutdown lets every connection flush at once, not one after the other: ten
/// connections that each take 60 ms all flush within a 300 ms grace (one after the other,
/// the last ones were closed with their answers still queued).
#[test]
fn shutdown_flushes_every_connection_at_once() {
    let (dispatcher, _) = server(4, 16);
    let served: Vec<super::Served<SlowFlush>> = (0..10)
        .map(|_| super::Served {
            link: Arc::new(SlowFlush {
                asked: Mutex::new(None),
                closed_flushed: Mutex::new(None),
            }),
            dispatch: connection(&dispatcher).0,
        })
        .collect();
    let started = Instant::now();
    super::shut_down(&dispatcher, &served, started, Duration::from_millis(300));
    let closed_flushed: Vec<_> = served
        .iter()
        .map(|s| *s.link.closed_flushed.lock())
        .collect();
    assert_eq!(
        closed_flushed,
        vec![Some(true); 10],
        "closed after flushing"
    );
    assert!(started.elapsed() < Duration::from_millis(300));
}

/// A handler that waits counts as in flight from its first poll until it answers, with no
/// gap between its inline poll and its task: a shutdown that saw it start and then found
/// nothing in flight closed its connection with the call still running.
#[test]
fn a_waiting_handler_counts_as_in_flight_throughout() {
    const CALLS: u64 = 20_000;
    let (dispatcher, runs) = server(usize::MAX, usize::MAX);
    let (conn, answers) = connection(&dispatcher);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Every handler waits forever: none that began may be missing from the count.
    let watcher = {
        let (dispatcher, runs, done) = (dispatcher.clone(), runs.clone(), done.clone());
        std::thread::spawn(move || {
            let mut gaps = 0u64;
            while !done.load(Ordering::SeqCst) {
                let began = runs.load(Ordering::SeqCst);
                if dispatcher.in_flight() < began {
                    gaps += 1;
                }
            }
            gaps
        })
    };
    for call_id in 1..=CALLS {
        request(&conn, call_id);
    }
    done.store(true, Ordering::SeqCst);
    let gaps = watcher.join().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), CALLS as usize);
    assert!(answers.0.lock().is_empty());
    assert_eq!(
        gaps, 0,
        "times a started handler was not counted as in flight"
    );
    conn.close();
}

#[test]
fn a_request_with_a_value_its_key_may_not_carry_is_refused_without_running() {
    let (dispatcher, runs) = server(4, 4);
    let (conn, answers) = connection(&dispatcher);
    // One entry, `x-text` → [0]: bytes under a key that does not end in `-bin`.
    let entry = [&[0x0a, 6][..], b"x-text", &[0x12, 1, 0]].concat();
    let metadata = [&[0x0a, entry.len() as u8][..], &entry].concat();
    let mut bad = frame(FrameKind::Request, 1);
    bad.header.metadata_len = metadata.len() as u32;
    bad.metadata = Bytes::from(metadata);
    conn.on_frame(bad, &mut Wakes::new());
    wait_for("the refusal", || !answers.0.lock().is_empty());
    assert_eq!(*answers.0.lock(), [(1, Code::InvalidArgument)]);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    conn.close();
}
