//! A stream's sender over a byte-stream transport: messages it stages, and when they go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::channel::mpsc;
use futures::task::noop_waker_ref;
use parking_lot::Mutex;

use super::batch::Batch;
use super::{Link, Outgoing, StreamShared, TypedMessages, Wakes, WindowUpdate, MESSAGES_PER_POLL};
use crate::frame::{FrameSender, InboundFrame, OutgoingFrame};
use crate::header::{FrameKind, Header};
use crate::MetadataMap;
use crate::Status;

/// What reached the transport, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// Frames handed over encoded, in one go: their kinds, sequence numbers and messages.
    Encoded(Vec<(FrameKind, u32, u32)>),
    /// One frame sent by itself.
    Frame(FrameKind, u32),
    Flush,
}

/// A byte-stream transport that records what it is given; `full` refuses encoded frames.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
    full: AtomicBool,
}

impl Recorder {
    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock())
    }
}

impl FrameSender for Recorder {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let header = frame.header();
        let event = Event::Frame(header.kind, header.seq());
        self.events.lock().push(event);
        Ok(())
    }

    fn flush(&self) {
        self.events.lock().push(Event::Flush);
    }

    fn stage_limit(&self) -> Option<usize> {
        Some(super::STAGE_LIMIT)
    }

    fn poll_send_encoded(
        &self,
        _: &mut Context<'_>,
        encoded: &mut BytesMut,
    ) -> Poll<Result<(), Status>> {
        if self.full.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
        let mut frames = Vec::new();
        while !encoded.is_empty() {
            let header = Header::decode(&encoded[..Header::wire_len(encoded).unwrap()]).unwrap();
            encoded.advance(header.encoded_len());
            let payload = encoded.split_to(header.payload_len as usize).freeze();
            let messages = match header.kind {
                FrameKind::Messages => Batch::parse(payload, u64::MAX).unwrap().0.count(),
                _ => 1,
            };
            frames.push((header.kind, header.seq(), messages));
        }
        self.events.lock().push(Event::Encoded(frames));
        Poll::Ready(Ok(()))
    }
}

/// A sender of call 7 whose peer granted `grant` beyond the initial window.
fn sender(grant: WindowUpdate) -> (Outgoing, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let shared = Arc::new(StreamShared::new(super::INITIAL_WINDOW, 1 << 20));
    let update = InboundFrame {
        header: Header::stream(FrameKind::WindowUpdate, 7, 0),
        metadata: Bytes::new(),
        payload: Bytes::copy_from_slice(&grant.encode()),
    };
    if !grant.is_empty() {
        shared.on_frame(update, &mut Wakes::new()).unwrap();
    }
    let out = Outgoing::new(shared, Link::server(recorder.clone()), 7, 1 << 20);
    (out, recorder)
}

/// No room beyond the initial window.
const NO_GRANT: WindowUpdate = WindowUpdate {
    messages: 0,
    bytes: 0,
};

/// One `Messages` frame of `n` messages from `first` on.
fn batch(first: u32, n: u32) -> Vec<(FrameKind, u32, u32)> {
    vec![(FrameKind::Messages, first, n)]
}

/// The sequence numbers of the messages handed over encoded in `events`, in order.
fn encoded_seqs(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .flat_map(|event| match event {
            Event::Encoded(frames) => frames
                .iter()
                .flat_map(|&(_, first, n)| first..first + n)
                .collect(),
            _ => vec![],
        })
        .collect()
}

fn poll<T>(f: impl FnOnce(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
    f(&mut Context::from_waker(noop_waker_ref()))
}

/// Messages sent back to back are encoded into the sender's buffer, in one `Messages`
/// frame, and handed over when the sender waits for its next message; the trailers follow
/// the last.
#[test]
fn staged_messages_leave_when_the_sender_waits_and_before_the_trailers() {
    let (mut out, recorder) = sender(NO_GRANT);
    let (tx, rx) = mpsc::unbounded::<Result<(), Status>>();
    let mut stream = TypedMessages::new(rx);
    let mut polled = false;
    for _ in 0..3 {
        tx.unbounded_send(Ok(())).unwrap();
    }
    let sent = poll(|cx| out.poll_send_all(cx, &mut stream, &mut polled));
    assert!(sent.is_pending());
    assert_eq!(recorder.take(), [Event::Encoded(batch(1, 3)), Event::Flush]);

    tx.unbounded_send(Ok(())).unwrap();
    tx.unbounded_send(Ok(())).unwrap();
    drop(tx);
    let sent = poll(|cx| out.poll_send_all(cx, &mut stream, &mut polled));
    assert!(matches!(sent, Poll::Ready(Ok(()))));
    assert_eq!(
        recorder.take(),
        [],
        "the end of the messages hands nothing over yet"
    );
    let ok = Status::new(crate::Code::Ok, "");
    let trailers = poll(|cx| out.poll_trailers(cx, &ok, &MetadataMap::new()));
    assert!(matches!(trailers, Poll::Ready(Ok(()))));
    assert_eq!(
        recorder.take(),
        [
            Event::Encoded(batch(4, 2)),
            Event::Frame(FrameKind::Trailers, 6),
        ]
    );
}

/// A sender whose messages never run out lets its thread's other tasks run every
/// `MESSAGES_PER_POLL` messages without flushing (a turn is not a wait: what it staged
/// leaves once its buffer is full); a transport without room holds the sender back without
/// losing or repeating a message.
#[test]
fn a_sender_yields_its_thread_and_waits_for_the_transport() {
    let (mut out, recorder) = sender(WindowUpdate {
        messages: 100_000,
        bytes: 0,
    });
    let mut stream = TypedMessages::new(futures::stream::repeat_with(|| Ok::<(), Status>(())));
    let mut polled = false;
    let mut send_all = || poll(|cx| out.poll_send_all(cx, &mut stream, &mut polled));
    assert!(send_all().is_pending());
    assert_eq!(
        recorder.take(),
        [],
        "a turn given to other tasks flushes nothing"
    );

    let mut polls = 1;
    let mut events = Vec::new();
    while events.is_empty() {
        assert!(send_all().is_pending());
        polls += 1;
        events = recorder.take();
    }
    let seqs = encoded_seqs(&events);
    assert!(!events.contains(&Event::Flush), "{events:?}");
    assert_eq!(seqs, (1..=seqs.len() as u32).collect::<Vec<_>>());
    assert!(seqs.len() <= polls * MESSAGES_PER_POLL && seqs.len() > MESSAGES_PER_POLL);

    recorder.full.store(true, Ordering::SeqCst);
    for _ in 0..2 * polls {
        assert!(send_all().is_pending());
    }
    let stuck = recorder.take();
    assert!(
        stuck.iter().all(|e| !matches!(e, Event::Encoded(_))),
        "{stuck:?}"
    );
    recorder.full.store(false, Ordering::SeqCst);
    assert!(send_all().is_pending());
    let next = encoded_seqs(&recorder.take());
    assert_eq!(
        next.first().copied(),
        Some(seqs.len() as u32 + 1),
        "nothing lost or repeated"
    );
}

/// A sender whose window ran out hands over what it staged before it waits: the receiver
/// can only return room for messages it got.
#[test]
fn a_sender_out_of_window_hands_over_what_it_staged() {
    let (mut out, recorder) = sender(NO_GRANT);
    let mut stream = TypedMessages::new(futures::stream::repeat_with(|| Ok::<(), Status>(())));
    let mut polled = false;
    assert!(poll(|cx| out.poll_send_all(cx, &mut stream, &mut polled)).is_pending());
    assert_eq!(
        recorder.take(),
        [
            Event::Encoded(batch(1, super::INITIAL_WINDOW.messages)),
            Event::Flush
        ]
    );
}

/// A message too large to stage goes in a `Message` frame of its own, after the messages
/// staged before it.
#[test]
fn a_large_message_goes_by_itself_after_the_staged_ones() {
    let (mut out, recorder) = sender(NO_GRANT);
    let (tx, rx) = mpsc::unbounded::<Result<Bytes, Status>>();
    let mut stream = TypedMessages::new(rx);
    let mut polled = false;
    for len in [10, 20, 4 * 1024, 30] {
        tx.unbounded_send(Ok(Bytes::from(vec![1u8; len]))).unwrap();
    }
    let sent = poll(|cx| out.poll_send_all(cx, &mut stream, &mut polled));
    assert!(sent.is_pending());
    assert_eq!(
        recorder.take(),
        [
            Event::Encoded(batch(1, 2)),
            Event::Frame(FrameKind::Message, 3),
            Event::Encoded(batch(4, 1)),
            Event::Flush
        ]
    );
}

/// A transport that places each frame in a slot of its own (RDMA): it stages one frame at a
/// time and takes it through `poll_send` (the default `poll_send_encoded`).
struct Slots {
    max_frame: usize,
    /// Frames sent: kind, first sequence number, messages, length.
    frames: Mutex<Vec<(FrameKind, u32, u32, usize)>>,
}

impl FrameSender for Slots {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        assert!(frame.len() <= self.max_frame, "a frame larger than a slot");
        let header = *frame.header();
        let mut wire = vec![0; frame.len()];
        frame.write_to(&mut wire);
        let payload = Bytes::from(wire).slice(header.encoded_len()..);
        let messages = match header.kind {
            FrameKind::Messages => Batch::parse(payload, u64::MAX).unwrap().0.count(),
            _ => 1,
        };
        let sent = (header.kind, header.seq(), messages, frame.len());
        self.frames.lock().push(sent);
        Ok(())
    }

    fn stage_limit(&self) -> Option<usize> {
        Some(crate::frame::one_frame_stage(self.max_frame))
    }
}

/// Over slots, small messages go many to a slot-sized `Messages` frame; a message too large
/// for the stage goes in a `Message` frame of its own; nothing is lost or reordered.
#[test]
fn over_slots_a_stage_is_one_frame_that_fits_a_slot() {
    let slots = Arc::new(Slots {
        max_frame: 1024,
        frames: Mutex::default(),
    });
    let shared = Arc::new(StreamShared::new(super::INITIAL_WINDOW, 1 << 20));
    let mut out = Outgoing::new(shared, Link::server(slots.clone()), 7, 1 << 20);
    // 987 bytes encode to 990: too large for the stage (988 after a header and a length),
    // not for a slot.
    let sizes = [40usize; 50].into_iter().chain([987, 40]);
    let (tx, rx) = mpsc::unbounded::<Result<Bytes, Status>>();
    for len in sizes {
        tx.unbounded_send(Ok(Bytes::from(vec![1u8; len]))).unwrap();
    }
    let mut stream = TypedMessages::new(rx);
    let mut polled = false;
    assert!(poll(|cx| out.poll_send_all(cx, &mut stream, &mut polled)).is_pending());
    let frames = slots.frames.lock().clone();
    let mut next = 1;
    for &(kind, seq, messages, len) in &frames {
        assert_eq!(seq, next, "{frames:?}");
        assert!(len <= 1024);
        next += messages;
        if kind == FrameKind::Message {
            assert_eq!(seq, 51, "only the large one alone: {frames:?}");
        }
    }
    assert_eq!(next, 53, "every message sent once: {frames:?}");
    assert!(frames.len() <= 5, "many to a frame: {frames:?}");
}
