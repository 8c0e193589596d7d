//! The stream rules without I/O: ordering, windows, hostile frames, and a property test
//! of a sender and a receiver over a fabric that reorders everything in flight.

use bytes::Bytes;
use proptest::prelude::*;

use super::batch::encode_batch;
use super::flow::{Inbox, Item, SendWindow, StreamError};
use super::{Window, WindowUpdate, INITIAL_WINDOW};

fn msg(n: usize) -> Bytes {
    Bytes::from(vec![n as u8; n])
}

fn inbox() -> Inbox<&'static str> {
    Inbox::new(INITIAL_WINDOW, 1024)
}

#[test]
fn frames_are_put_back_in_order() {
    let mut inbox = inbox();
    inbox.on_end(4, "end").unwrap();
    inbox.on_message(3, msg(3)).unwrap();
    inbox.on_message(1, msg(1)).unwrap();
    assert_eq!(inbox.pop(), Some(Item::Message(msg(1))));
    assert_eq!(inbox.pop(), None, "2 has not arrived");
    inbox.on_message(2, msg(2)).unwrap();
    assert_eq!(inbox.pop(), Some(Item::Message(msg(2))));
    assert_eq!(inbox.pop(), Some(Item::Message(msg(3))));
    assert!(!inbox.finished());
    assert_eq!(inbox.pop(), Some(Item::End("end")));
    assert!(inbox.finished());
}

#[test]
fn hostile_frames_are_refused_by_name() {
    let mut inbox = inbox();
    assert_eq!(inbox.on_message(0, msg(1)), Err(StreamError::SeqZero));
    inbox.on_message(1, msg(1)).unwrap();
    assert_eq!(
        inbox.on_message(1, msg(1)),
        Err(StreamError::Duplicate { seq: 1 })
    );
    inbox.on_message(3, msg(1)).unwrap();
    assert_eq!(
        inbox.on_message(3, msg(1)),
        Err(StreamError::Duplicate { seq: 3 })
    );
    // An end before a message already received, then data after the end.
    assert!(matches!(
        inbox.on_end(3, "end"),
        Err(StreamError::AfterEnd { .. })
    ));
    inbox.on_end(5, "end").unwrap();
    assert_eq!(
        inbox.on_message(6, msg(1)),
        Err(StreamError::AfterEnd { seq: 6, end: 5 })
    );
    assert_eq!(
        inbox.on_end(7, "again"),
        Err(StreamError::EndedTwice {
            first: 5,
            second: 7
        })
    );
    assert_eq!(
        inbox.on_message(2, msg(2000)),
        Err(StreamError::TooLarge {
            len: 2000,
            limit: 1024
        })
    );
}

/// A `Messages` frame's payload of `n` messages numbered from `first` (`msg(first)`, ...).
fn batch(first: usize, n: usize) -> Bytes {
    let messages: Vec<Bytes> = (first..first + n).map(msg).collect();
    encode_batch(&messages)
}

#[test]
fn batches_take_their_places_in_any_order_and_come_out_one_by_one() {
    let mut inbox = inbox();
    inbox.on_end(9, "end").unwrap();
    inbox.on_batch(6, batch(6, 3)).unwrap();
    inbox.on_message(5, msg(5)).unwrap();
    inbox.on_batch(1, batch(1, 2)).unwrap();
    for n in 1..=2 {
        assert_eq!(inbox.pop(), Some(Item::Message(msg(n))));
    }
    assert_eq!(inbox.pop(), None, "3 and 4 have not arrived");
    inbox.on_batch(3, batch(3, 2)).unwrap();
    for n in 3..=8 {
        assert_eq!(inbox.pop(), Some(Item::Message(msg(n))));
    }
    assert_eq!(inbox.pop(), Some(Item::End("end")));
    assert!(inbox.finished());
    // Counted per message: 8 messages of 1 + 2 + ... + 8 bytes.
    assert_eq!(inbox.take_update().map(|u| (u.messages, u.bytes)), None);
    assert_eq!(inbox.buffered(), (0, 0));
}

#[test]
fn hostile_batches_are_refused_by_name() {
    let mut inbox = inbox();
    inbox.on_batch(3, batch(3, 3)).unwrap();
    // Overlapping what arrived, from below, from above, or inside.
    for (first, n, seq) in [(1, 3, 3), (5, 2, 5), (4, 1, 4), (2, 6, 3)] {
        assert_eq!(
            inbox.on_batch(first, batch(1, n)),
            Err(StreamError::Duplicate { seq }),
            "{n} from {first}"
        );
    }
    inbox.on_batch(1, batch(1, 2)).unwrap();
    assert_eq!(
        inbox.on_batch(4, batch(1, 1)),
        Err(StreamError::Duplicate { seq: 4 })
    );
    // An end inside a batch that arrived, then a batch across the end.
    assert!(matches!(
        inbox.on_end(4, "end"),
        Err(StreamError::AfterEnd { .. })
    ));
    inbox.on_end(8, "end").unwrap();
    assert_eq!(
        inbox.on_batch(6, batch(1, 3)),
        Err(StreamError::AfterEnd { seq: 8, end: 8 })
    );
    assert_eq!(inbox.on_batch(0, batch(1, 1)), Err(StreamError::SeqZero));
    let mut inbox = Inbox::<()>::new(INITIAL_WINDOW, 1024);
    assert_eq!(
        inbox.on_batch(u32::MAX - 1, batch(1, 2)),
        Err(StreamError::SeqOverflow {
            seq: u32::MAX - 1,
            count: 2
        })
    );
    assert_eq!(
        inbox.on_batch(1, encode_batch(&[msg(1), msg(2000)])),
        Err(StreamError::TooLarge {
            len: 2000,
            limit: 1024
        })
    );
    assert_eq!(
        inbox.on_batch(1, Bytes::new()),
        Err(StreamError::BadBatch("it holds no message"))
    );
    // Nothing of a refused batch was taken.
    assert_eq!(inbox.buffered(), (0, 0));
    assert_eq!(inbox.pop(), None);
}

#[test]
fn a_batch_counts_every_message_against_the_window() {
    let mut inbox = inbox();
    let all = INITIAL_WINDOW.messages as usize;
    inbox.on_batch(1, batch(1, all - 1)).unwrap();
    let over = inbox.on_batch(all as u32, batch(1, 2));
    assert!(
        matches!(over, Err(StreamError::WindowExceeded { messages, .. }) if messages == all as u64 + 1),
        "{over:?}"
    );
    inbox.on_batch(all as u32, batch(1, 1)).unwrap();
    // Bytes: the messages, not their length prefixes.
    let bytes: u64 = (1..all as u64).sum::<u64>() + 1;
    assert_eq!(inbox.buffered(), (all as u64, bytes));
}

/// A reader takes an eighth of the window at a time, cutting a `Messages` frame if it
/// must: room goes back while it reads the rest, even when one frame holds the whole
/// window.
#[test]
fn a_reader_takes_a_frame_of_many_messages_a_share_at_a_time() {
    let mut inbox = inbox();
    let all = INITIAL_WINDOW.messages;
    let share = all / super::flow::READ_SHARE;
    inbox.on_batch(1, batch(1, all as usize)).unwrap();
    let mut read = 0;
    let mut returned = 0;
    let mut first_return = None;
    while read < all {
        let mut drained = std::collections::VecDeque::new();
        inbox.drain_ready(&mut drained);
        let [Item::Messages(mut part)] = <[_; 1]>::try_from(Vec::from(drained)).unwrap() else {
            panic!("one part of the frame");
        };
        assert_eq!(part.count(), share);
        let bytes = part.bytes();
        for n in read + 1..=read + share {
            assert_eq!(part.pop(), Some(msg(n as usize)));
        }
        read += share;
        inbox.consumed(u64::from(share), bytes);
        if let Some(update) = inbox.take_update() {
            returned += update.messages;
            first_return.get_or_insert(read);
        }
    }
    assert_eq!(first_return, Some(all / 2), "room comes back mid-frame");
    assert_eq!(returned, all);
}

/// A stream may end at the last sequence number, 2^32 - 1: it finishes, and a message
/// arriving again after it is still a duplicate (the next place does not wrap to 0).
#[test]
fn a_stream_ending_at_the_last_sequence_number_finishes() {
    let last = u32::MAX;
    let mut inbox = inbox().starting_at(last - 2);
    inbox.on_message(last - 2, msg(1)).unwrap();
    inbox.on_batch(last - 1, batch(2, 1)).unwrap();
    inbox.on_end(last, "end").unwrap();
    assert_eq!(inbox.pop(), Some(Item::Message(msg(1))));
    assert_eq!(inbox.pop(), Some(Item::Message(msg(2))));
    assert_eq!(inbox.pop(), Some(Item::End("end")));
    assert!(inbox.finished());
    assert_eq!(
        inbox.on_message(last - 1, msg(1)),
        Err(StreamError::Duplicate { seq: last - 1 })
    );
    assert_eq!(inbox.take_update(), None, "nothing returned after the end");
}

#[test]
fn a_sender_beyond_the_window_is_refused() {
    let mut inbox = inbox();
    for seq in 1..=INITIAL_WINDOW.messages {
        inbox.on_message(seq, msg(1)).unwrap();
    }
    let over = inbox.on_message(INITIAL_WINDOW.messages + 1, msg(1));
    assert!(
        matches!(over, Err(StreamError::WindowExceeded { .. })),
        "{over:?}"
    );

    // Bytes: the window plus one message's overshoot, no more.
    let mut inbox = Inbox::<()>::new(INITIAL_WINDOW, 200 * 1024);
    inbox.on_message(1, msg(200 * 1024)).unwrap();
    inbox.on_message(2, msg(200 * 1024)).unwrap();
    let over = inbox.on_message(3, msg(200 * 1024));
    assert!(
        matches!(over, Err(StreamError::WindowExceeded { .. })),
        "{over:?}"
    );
}

#[test]
fn room_comes_back_at_half_the_window_and_a_big_window_is_granted_at_open() {
    let mut inbox = inbox();
    assert_eq!(inbox.initial_update(), None);
    let half = INITIAL_WINDOW.messages / 2;
    for seq in 1..=half {
        inbox.on_message(seq, msg(1)).unwrap();
    }
    for _ in 1..half {
        inbox.pop().unwrap();
        assert_eq!(inbox.take_update(), None);
    }
    inbox.pop().unwrap();
    assert_eq!(
        inbox.take_update(),
        Some(WindowUpdate {
            messages: half,
            bytes: u64::from(half)
        })
    );
    let big = Window {
        messages: 1000,
        bytes: 1 << 20,
    };
    let grown = Inbox::<()>::new(big, 1024).initial_update().unwrap();
    assert_eq!(grown.messages, 1000 - INITIAL_WINDOW.messages);
    assert_eq!(grown.bytes, (1 << 20) - INITIAL_WINDOW.bytes);
    // Smaller than the initial window: the protocol's initial window stands.
    let small = Window {
        messages: 1,
        bytes: 1,
    };
    assert_eq!(Inbox::<()>::new(small, 1024).window(), INITIAL_WINDOW);
}

#[test]
fn a_batch_taken_at_once_holds_its_room_until_it_is_used() {
    let mut inbox = inbox();
    let half = u64::from(INITIAL_WINDOW.messages / 2);
    for seq in 1..=half as u32 + 4 {
        inbox.on_message(seq, msg(2)).unwrap();
    }
    let mut batch = std::collections::VecDeque::new();
    let share = u64::from(INITIAL_WINDOW.messages / super::flow::READ_SHARE);
    inbox.drain_ready(&mut batch);
    assert_eq!(batch.len() as u64, share, "an eighth of the window");
    while batch.len() as u64 != half + 4 {
        inbox.drain_ready(&mut batch);
    }
    assert!(batch.iter().all(|item| *item == Item::Message(msg(2))));
    // Taken, not used: still buffered, nothing returned.
    assert_eq!(inbox.take_update(), None);
    assert_eq!(inbox.buffered(), (half + 4, 2 * (half + 4)));
    inbox.consumed(half - 1, 2 * (half - 1));
    assert_eq!(inbox.take_update(), None, "below half the window");
    inbox.consumed(1, 2);
    assert_eq!(
        inbox.take_update(),
        Some(WindowUpdate {
            messages: half as u32,
            bytes: 2 * half
        })
    );
    assert_eq!(inbox.buffered(), (4, 8));
}

/// Room moved to a sender's own window is the same room: the sender may send exactly what
/// the stream's window allowed, an overshooting message included; and however much a peer
/// grants over time, the counts stop at 2^48 instead of overflowing.
#[test]
fn room_taken_by_the_sender_is_spent_as_the_window_would_be() {
    let mut window = SendWindow::new(Window {
        messages: 2,
        bytes: 100,
    });
    let mut own = SendWindow::empty();
    own.absorb(window.take());
    assert_eq!(window.room(), (0, 0));
    assert!(own.ready());
    own.on_send(150);
    assert_eq!(own.room(), (1, -50));
    assert!(!own.ready(), "the overshoot is paid back first");
    let update = WindowUpdate {
        messages: 1,
        bytes: 100,
    };
    window.on_update(update).unwrap();
    own.absorb(window.take());
    assert_eq!(own.room(), (2, 50));
    // An update past 2^48 is refused even when the window itself is empty (its room
    // taken by the sender).
    let mut emptied = SendWindow::empty();
    let past = WindowUpdate {
        messages: 1,
        bytes: u64::MAX,
    };
    assert!(matches!(
        emptied.on_update(past),
        Err(StreamError::BadWindowUpdate(_))
    ));
    let huge = WindowUpdate {
        messages: u32::MAX,
        bytes: 1 << 48,
    };
    // 2^16 grants of 2^32 messages reach the cap.
    for _ in 0..=(1 << 16) {
        let mut granted = SendWindow::empty();
        granted.on_update(huge).unwrap();
        own.absorb(granted.take());
    }
    assert_eq!(own.room(), (1 << 48, 1 << 48));
}

#[test]
fn window_updates_decode_strictly() {
    let update = WindowUpdate {
        messages: 7,
        bytes: 1 << 40,
    };
    assert_eq!(WindowUpdate::decode(&update.encode()), Ok(update));
    assert!(WindowUpdate::decode(&[0; 11]).is_err());
    assert!(WindowUpdate::decode(&[0; 12]).is_err(), "returns nothing");
    let mut window = SendWindow::new(INITIAL_WINDOW);
    let huge = WindowUpdate {
        messages: u32::MAX,
        bytes: u64::MAX,
    };
    assert!(window.on_update(huge).is_err(), "beyond 2^48");
}

#[test]
fn a_message_larger_than_the_byte_window_still_goes_when_room_is_back() {
    let mut window = SendWindow::new(INITIAL_WINDOW);
    assert!(window.ready());
    window.on_send(INITIAL_WINDOW.bytes as usize * 3);
    assert!(!window.ready(), "overshot");
    window
        .on_update(WindowUpdate {
            messages: 1,
            bytes: INITIAL_WINDOW.bytes * 3,
        })
        .unwrap();
    assert!(window.ready());
}

/// A frame in flight on the fabric.
#[derive(Debug, Clone)]
enum Wire {
    Message(u32, Bytes),
    /// A `Messages` frame: its first message's place and its payload.
    Batch(u32, Bytes),
    End(u32),
    Update(WindowUpdate),
}

/// One step the fabric may take.
#[derive(Debug, Clone)]
enum Step {
    /// The sender sends its next message or end, if its window allows.
    Send,
    /// The sender sends up to this many messages in one `Messages` frame, as its window
    /// allows.
    SendBatch(u8),
    /// Delivers the frame in flight at this index (mod the number in flight).
    Deliver(usize),
    /// The consumer takes this many items.
    Consume(u8),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            3 => Just(Step::Send),
            2 => (1u8..20).prop_map(Step::SendBatch),
            4 => any::<usize>().prop_map(Step::Deliver),
            2 => (1u8..8).prop_map(Step::Consume),
        ],
        0..600,
    )
}

/// A sender and a receiver of one stream direction with everything in flight between them.
struct Fabric {
    sizes: Vec<usize>,
    max: usize,
    window: Window,
    inbox: Inbox<()>,
    sender: SendWindow,
    wire: Vec<Wire>,
    /// Messages sent so far; == sizes.len(): the end is next.
    sent: usize,
    ended: bool,
    got: Vec<Bytes>,
    finished: bool,
}

impl Fabric {
    fn new(sizes: Vec<usize>, window: Window, max: usize) -> Self {
        let inbox = Inbox::new(window, max);
        let wire = inbox
            .initial_update()
            .map(Wire::Update)
            .into_iter()
            .collect();
        Fabric {
            sizes,
            max,
            window,
            inbox,
            sender: SendWindow::new(INITIAL_WINDOW),
            wire,
            sent: 0,
            ended: false,
            got: Vec::new(),
            finished: false,
        }
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let fail = |e: StreamError| TestCaseError::fail(e.to_string());
        match step {
            Step::Send if self.sent < self.sizes.len() && self.sender.ready() => {
                let payload = Bytes::from(vec![self.sent as u8; self.sizes[self.sent]]);
                self.sender.on_send(payload.len());
                self.sent += 1;
                self.wire.push(Wire::Message(self.sent as u32, payload));
            }
            Step::Send if self.sent == self.sizes.len() && !self.ended => {
                self.ended = true;
                self.wire.push(Wire::End(self.sent as u32 + 1));
            }
            Step::Send => {}
            Step::SendBatch(n) => {
                let first = self.sent as u32 + 1;
                let mut messages = Vec::new();
                while messages.len() < usize::from(*n)
                    && self.sent < self.sizes.len()
                    && self.sender.ready()
                {
                    let payload = Bytes::from(vec![self.sent as u8; self.sizes[self.sent]]);
                    self.sender.on_send(payload.len());
                    self.sent += 1;
                    messages.push(payload);
                }
                if !messages.is_empty() {
                    self.wire.push(Wire::Batch(first, encode_batch(&messages)));
                }
            }
            Step::Deliver(at) if !self.wire.is_empty() => {
                let at = at % self.wire.len();
                match self.wire.swap_remove(at) {
                    Wire::Message(seq, payload) => {
                        self.inbox.on_message(seq, payload).map_err(fail)?
                    }
                    Wire::Batch(seq, payload) => self.inbox.on_batch(seq, payload).map_err(fail)?,
                    Wire::End(seq) => self.inbox.on_end(seq, ()).map_err(fail)?,
                    Wire::Update(update) => self.sender.on_update(update).map_err(fail)?,
                }
                let (_, bytes) = self.inbox.buffered();
                prop_assert!(bytes <= self.window.bytes + self.max as u64);
            }
            Step::Deliver(_) => {}
            Step::Consume(n) => {
                for _ in 0..*n {
                    match self.inbox.pop() {
                        Some(Item::Message(payload)) => self.got.push(payload),
                        Some(Item::End(())) => self.finished = true,
                        Some(Item::Messages(_)) => {
                            prop_assert!(false, "pop handed out a whole batch")
                        }
                        None => break,
                    }
                    if let Some(update) = self.inbox.take_update() {
                        self.wire.push(Wire::Update(update));
                    }
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any interleaving and any reordering of frames in flight: every message arrives once,
    /// in order, no rule is broken, the receiver never holds more than the window allows,
    /// and once the steps run out the stream always finishes (no deadlock).
    #[test]
    fn streams_survive_reordering_and_finish(
        sizes in prop::collection::vec(0usize..40_000, 0..200),
        steps in steps(),
        window_messages in 64u32..300,
        window_bytes in (256u64 * 1024)..(2 << 20),
    ) {
        let window = Window { messages: window_messages, bytes: window_bytes };
        let mut fabric = Fabric::new(sizes.clone(), window, 40_000);
        for step in &steps {
            fabric.step(step)?;
        }
        // Then a fair schedule: the stream must finish.
        let mut rounds = 0;
        while !fabric.finished {
            rounds += 1;
            prop_assert!(
                rounds < 100_000,
                "deadlock: {} of {} messages sent, {} in flight",
                fabric.sent, sizes.len(), fabric.wire.len()
            );
            fabric.step(&Step::Send)?;
            fabric.step(&Step::Deliver(rounds))?;
            fabric.step(&Step::Consume(1))?;
        }
        prop_assert_eq!(fabric.got.len(), sizes.len());
        for (i, payload) in fabric.got.iter().enumerate() {
            prop_assert_eq!(payload.len(), sizes[i]);
            prop_assert!(payload.iter().all(|&b| b == i as u8));
        }
    }
}

/// Error trailers whose metadata cannot be read still end the stream with their code and
/// message; OK trailers like that fail it.
#[test]
fn error_trailers_with_unreadable_metadata_keep_their_status() {
    use super::StreamShared;
    use crate::frame::InboundFrame;
    use crate::header::{FrameKind, Header};
    use crate::transport::Wakes;
    use crate::Code;

    let trailers = |status: Code| {
        let mut header = Header::stream(FrameKind::Trailers, 7, 1);
        header.status = status;
        InboundFrame {
            header,
            metadata: Bytes::from_static(&[0xff, 0xff, 0xff]),
            payload: Bytes::from_static(b"no such row"),
        }
    };
    let failed = StreamShared::new(INITIAL_WINDOW, 1 << 20);
    let _ = failed.on_frame(trailers(Code::NotFound), &mut Wakes::new());
    assert_eq!(failed.outcome(), Some(Code::NotFound));
    let ok = StreamShared::new(INITIAL_WINDOW, 1 << 20);
    assert!(ok.on_frame(trailers(Code::Ok), &mut Wakes::new()).is_err());
    assert_eq!(ok.outcome(), Some(Code::Internal));
}
