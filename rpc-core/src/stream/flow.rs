//! Flow control and ordering of one direction of a stream, without I/O.
//!
//! The sender holds a [`SendWindow`]; the receiver an [`Inbox`]. Both start from
//! [`INITIAL_WINDOW`](super::INITIAL_WINDOW) and change only by [`WindowUpdate`]s the
//! receiver sends, so they agree without a handshake. Frames may be handed up out of order
//! (a transport that delivers from two threads, a large message whose body arrives after
//! later small ones): the inbox puts them back in order by sequence number, and its window
//! checks count totals, which do not depend on order.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use super::batch::Batch;
use super::{Window, WindowUpdate};

/// A peer broke the stream rules; the stream fails with a status naming the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// Stream messages count from 1; 0 is the call's opening frame.
    #[error("a stream message with sequence number 0")]
    SeqZero,
    /// A message whose sequence number was already received.
    #[error("stream message {seq} arrived twice")]
    Duplicate {
        /// Its sequence number.
        seq: u32,
    },
    /// A message or end after the end of the stream.
    #[error("stream frame {seq} after the end of the stream at {end}")]
    AfterEnd {
        /// Sequence number of the frame.
        seq: u32,
        /// Sequence number of the end.
        end: u32,
    },
    /// A second end (half-close or trailers) with a different place.
    #[error("the stream ended twice (at {first} and {second})")]
    EndedTwice {
        /// The first end's sequence number.
        first: u32,
        /// The second's.
        second: u32,
    },
    /// More messages or bytes than the window the receiver granted.
    #[error(
        "the peer sent beyond the stream window: {messages} messages and {bytes} bytes \
         unreturned, window {window_messages} messages and {window_bytes} bytes"
    )]
    WindowExceeded {
        /// Messages received and not returned, this one included.
        messages: u64,
        /// Bytes received and not returned, this one included.
        bytes: u64,
        /// Messages granted.
        window_messages: u64,
        /// Bytes granted (a message may overshoot by at most the message size limit).
        window_bytes: u64,
    },
    /// A message larger than the receiver accepts.
    #[error("a stream message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        len: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// A message at 2^32 - 1, or a `Messages` frame whose messages run past 2^32 - 2: no
    /// place is left for the end.
    #[error(
        "stream messages from {seq} ({count} of them) run past the last sequence number, \
         2^32 - 2"
    )]
    SeqOverflow {
        /// The first message's sequence number.
        seq: u32,
        /// Messages in the frame.
        count: u32,
    },
    /// A `Messages` frame whose payload is not a series of messages after their lengths.
    #[error("bad Messages frame: {0}")]
    BadBatch(&'static str),
    /// A window update that is malformed or returns more than was sent.
    #[error("bad window update: {0}")]
    BadWindowUpdate(&'static str),
}

/// What the sender may still send: messages and bytes granted and not yet used.
///
/// A message may go while at least one message and one byte of room remain; it may
/// overshoot the byte window (a message larger than the window must be able to go at all),
/// so the receiver buffers at most `window.bytes + max_message_size` bytes.
#[derive(Debug, Clone)]
pub struct SendWindow {
    messages: i64,
    bytes: i64,
}

/// Largest window either count may reach; updates beyond it are refused (no overflow).
/// One update may grant no more either; room a sender took for itself stops there too.
const MAX_ROOM: i64 = 1 << 48;

impl SendWindow {
    /// The window every stream starts with.
    pub fn new(initial: Window) -> Self {
        SendWindow {
            messages: i64::from(initial.messages),
            bytes: initial.bytes as i64,
        }
    }

    /// No room at all.
    pub fn empty() -> Self {
        SendWindow {
            messages: 0,
            bytes: 0,
        }
    }

    /// Whether a message may be sent now.
    pub fn ready(&self) -> bool {
        self.messages > 0 && self.bytes > 0
    }

    /// A message of `len` bytes was sent.
    pub fn on_send(&mut self, len: usize) {
        debug_assert!(self.ready(), "sent beyond the stream window");
        self.messages -= 1;
        self.bytes -= len as i64;
    }

    /// The receiver returned room.
    pub fn on_update(&mut self, update: WindowUpdate) -> Result<(), StreamError> {
        // Checked on the update alone too: the room a sender took for itself
        // ([`SendWindow::take`]) is not in this window any more.
        if update.bytes > MAX_ROOM as u64 {
            return Err(StreamError::BadWindowUpdate(
                "it grants more than 2^48 messages or bytes",
            ));
        }
        let messages = self.messages + i64::from(update.messages);
        let bytes = self.bytes + update.bytes as i64;
        if messages > MAX_ROOM || bytes > MAX_ROOM {
            return Err(StreamError::BadWindowUpdate(
                "it grants more than 2^48 messages or bytes",
            ));
        }
        self.messages = messages;
        self.bytes = bytes;
        Ok(())
    }

    /// Moves all the room out, leaving this window empty: to a sender that spends it
    /// without the stream's lock ([`SendWindow::absorb`]).
    pub fn take(&mut self) -> SendWindow {
        std::mem::replace(self, SendWindow::empty())
    }

    /// Adds the room `other` holds (taken from the stream's window), capped at 2^48 so that
    /// no count overflows however much a peer grants over time.
    pub fn absorb(&mut self, other: SendWindow) {
        self.messages = (self.messages + other.messages).min(MAX_ROOM);
        self.bytes = self.bytes.saturating_add(other.bytes).min(MAX_ROOM);
    }

    /// Room left: messages, bytes (negative after an overshooting message).
    pub fn room(&self) -> (i64, i64) {
        (self.messages, self.bytes)
    }
}

/// The part of the window a reader takes from its inbox at once ([`Inbox::drain_ready`]):
/// an eighth.
pub const READ_SHARE: u32 = 8;

/// One entry of an inbox, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item<E> {
    /// An encoded message.
    Message(Bytes),
    /// Consecutive encoded messages, as one `Messages` frame brought them.
    Messages(Batch),
    /// The end of the stream (a half-close, or trailers).
    End(E),
}

impl<E> Item<E> {
    /// Sequence numbers the item takes.
    fn span(&self) -> u32 {
        match self {
            Item::Messages(batch) => batch.count(),
            Item::Message(_) | Item::End(_) => 1,
        }
    }

    /// Bytes of the messages the item holds.
    fn bytes(&self) -> u64 {
        match self {
            Item::Message(payload) => payload.len() as u64,
            Item::Messages(batch) => batch.bytes(),
            Item::End(_) => 0,
        }
    }
}

/// One item taken from a queue of [`Item`]s: a message read out of the front `Messages`
/// frame, or the front message or end.
pub(crate) enum Single<E, R> {
    /// What the reader made of a message of a `Messages` frame.
    Read(R),
    Message(Bytes),
    End(E),
}

/// Takes the next single item of `queue`. A message of the front `Messages` frame is read
/// in place with `read` (the frame is not moved per message) and the frame goes once
/// empty.
pub(crate) fn take_single<E, R>(
    queue: &mut VecDeque<Item<E>>,
    read: impl FnOnce(&mut Batch) -> Option<R>,
) -> Option<Single<E, R>> {
    if let Item::Messages(batch) = queue.front_mut()? {
        let read = read(batch);
        if batch.is_empty() {
            queue.pop_front();
        }
        return read.map(Single::Read);
    }
    Some(match queue.pop_front()? {
        Item::Message(message) => Single::Message(message),
        Item::End(end) => Single::End(end),
        Item::Messages(_) => unreachable!("the front item is not a Messages frame"),
    })
}

/// The receiving side of one direction of a stream: puts frames in order, holds them until
/// the consumer takes them, and decides when to return room to the sender.
#[derive(Debug)]
pub struct Inbox<E> {
    /// Granted to the sender so far (initial window plus growth).
    window: Window,
    max_message: u64,
    /// Next sequence number to hand to the consumer; it passes 2^32 - 1 once an end there
    /// is placed.
    next: u64,
    /// Sequence number of the end, once known.
    end: Option<u32>,
    /// Arrived ahead of `next`.
    ahead: BTreeMap<u32, Item<E>>,
    /// In order, not yet taken.
    ready: VecDeque<Item<E>>,
    /// Received and not yet returned (buffered or consumed).
    unreturned: (u64, u64),
    /// Consumed and not yet returned.
    consumed: (u64, u64),
}

impl<E> Inbox<E> {
    /// An inbox granting `window` (at least [`super::INITIAL_WINDOW`]: room beyond it goes to
    /// the sender by [`Inbox::initial_update`]) for messages of at most `max_message` bytes.
    pub fn new(window: Window, max_message: usize) -> Self {
        Inbox {
            window: window.at_least(super::INITIAL_WINDOW),
            max_message: max_message as u64,
            next: 1,
            end: None,
            ahead: BTreeMap::new(),
            ready: VecDeque::new(),
            unreturned: (0, 0),
            consumed: (0, 0),
        }
    }

    /// The update that grows the sender's window from the initial one to this inbox's, if
    /// it is larger: sent when the stream opens.
    pub fn initial_update(&self) -> Option<WindowUpdate> {
        let initial = super::INITIAL_WINDOW;
        let update = WindowUpdate {
            messages: self.window.messages - initial.messages,
            bytes: self.window.bytes - initial.bytes,
        };
        (!update.is_empty()).then_some(update)
    }

    /// A message arrived.
    pub fn on_message(&mut self, seq: u32, payload: Bytes) -> Result<(), StreamError> {
        let len = payload.len() as u64;
        if len > self.max_message {
            return Err(StreamError::TooLarge {
                len,
                limit: self.max_message,
            });
        }
        self.accept(seq, len, Item::Message(payload))
    }

    /// A `Messages` frame arrived: `payload` holds its messages, the first at `seq`.
    pub fn on_batch(&mut self, seq: u32, payload: Bytes) -> Result<(), StreamError> {
        let (batch, bytes) = Batch::parse(payload, self.max_message)?;
        self.accept(seq, bytes, Item::Messages(batch))
    }

    /// Places `item`, messages of `bytes` bytes from `seq` on, if the stream's rules and
    /// window allow it.
    fn accept(&mut self, seq: u32, bytes: u64, item: Item<E>) -> Result<(), StreamError> {
        let count = item.span();
        self.check_place(seq, count)?;
        let messages = self.unreturned.0 + u64::from(count);
        let bytes = self.unreturned.1 + bytes;
        let window = self.window;
        if messages > u64::from(window.messages) || bytes > window.bytes + self.max_message {
            return Err(StreamError::WindowExceeded {
                messages,
                bytes,
                window_messages: u64::from(window.messages),
                window_bytes: window.bytes,
            });
        }
        self.unreturned = (messages, bytes);
        self.place(seq, item);
        Ok(())
    }

    /// The end arrived: after message `seq - 1`.
    pub fn on_end(&mut self, seq: u32, end: E) -> Result<(), StreamError> {
        if let Some(first) = self.end {
            return Err(StreamError::EndedTwice { first, second: seq });
        }
        // Nothing already received may lie at or beyond the end.
        let beyond = self.last_ahead();
        if u64::from(seq) < self.next || beyond.is_some_and(|last| last >= seq) {
            // `next` is past u32 only after an end was placed, which returned above.
            let last_placed = u32::try_from(self.next - 1).unwrap_or(u32::MAX);
            return Err(StreamError::AfterEnd {
                seq: beyond.unwrap_or(last_placed).max(seq),
                end: seq,
            });
        }
        self.end = Some(seq);
        self.place(seq, Item::End(end));
        Ok(())
    }

    /// The last sequence number taken by what arrived ahead of its turn.
    fn last_ahead(&self) -> Option<u32> {
        let (&first, item) = self.ahead.iter().next_back()?;
        Some(first + (item.span() - 1))
    }

    /// Whether `count` messages from `seq` on may be placed: none of their places is taken
    /// or lies at or beyond the end.
    fn check_place(&self, seq: u32, count: u32) -> Result<(), StreamError> {
        if seq == 0 {
            return Err(StreamError::SeqZero);
        }
        let Some(last) = seq.checked_add(count - 1).filter(|&last| last < u32::MAX) else {
            return Err(StreamError::SeqOverflow { seq, count });
        };
        if let Some(end) = self.end {
            if last >= end {
                return Err(StreamError::AfterEnd {
                    seq: seq.max(end),
                    end,
                });
            }
        }
        if u64::from(seq) < self.next {
            return Err(StreamError::Duplicate { seq });
        }
        // The item placed ahead nearest below `last` is the only one that may overlap.
        if let Some((&first, item)) = self.ahead.range(..=last).next_back() {
            if first + (item.span() - 1) >= seq {
                return Err(StreamError::Duplicate {
                    seq: first.max(seq),
                });
            }
        }
        Ok(())
    }

    fn place(&mut self, seq: u32, item: Item<E>) {
        if u64::from(seq) != self.next {
            self.ahead.insert(seq, item);
            return;
        }
        self.next += u64::from(item.span());
        self.ready.push_back(item);
        while let Some(item) = u32::try_from(self.next)
            .ok()
            .and_then(|next| self.ahead.remove(&next))
        {
            self.next += u64::from(item.span());
            self.ready.push_back(item);
        }
    }

    /// Whether the end was placed in order: every message before it arrived.
    fn end_placed(&self) -> bool {
        self.end.is_some_and(|end| self.next > u64::from(end))
    }

    /// The same inbox with its next place at `next` (tests of the last sequence numbers).
    #[cfg(test)]
    pub(crate) fn starting_at(mut self, next: u32) -> Self {
        self.next = u64::from(next);
        self
    }

    /// Moves items in stream order into `into`, up to [`READ_SHARE`] of the window in
    /// messages or bytes (at least one item; a `Messages` frame is split at the message
    /// count), without counting them as consumed: a consumer that takes a batch at once
    /// reports what it used with [`Inbox::consumed`], and until then they count as
    /// buffered. A batch stays a small part of the window, so room goes back to the sender
    /// while the consumer reads the rest.
    pub fn drain_ready(&mut self, into: &mut VecDeque<Item<E>>) {
        let max_messages = (self.window.messages / READ_SHARE).max(1);
        let max_bytes = (self.window.bytes / u64::from(READ_SHARE)).max(1);
        let (mut messages, mut bytes) = (0u32, 0u64);
        while messages < max_messages && bytes < max_bytes {
            let Some(mut item) = self.ready.pop_front() else {
                break;
            };
            if let Item::Messages(batch) = &mut item {
                let head = batch.split_front(max_messages - messages);
                if !batch.is_empty() {
                    self.ready.push_front(item);
                }
                item = Item::Messages(head);
            }
            messages += item.span();
            bytes += item.bytes();
            into.push_back(item);
        }
    }

    /// The consumer used `messages` messages of `bytes` bytes taken by
    /// [`Inbox::drain_ready`].
    pub fn consumed(&mut self, messages: u64, bytes: u64) {
        self.consumed.0 += messages;
        self.consumed.1 += bytes;
        debug_assert!(self.consumed.0 <= self.unreturned.0 && self.consumed.1 <= self.unreturned.1);
    }

    /// The next item in stream order, if it arrived: a single message or the end, never
    /// [`Item::Messages`] (the messages of a `Messages` frame come one by one). Taking a message counts it as
    /// consumed.
    pub fn pop(&mut self) -> Option<Item<E>> {
        Some(match self.pop_single()? {
            Single::Read(message) | Single::Message(message) => Item::Message(message),
            Single::End(end) => Item::End(end),
        })
    }

    /// [`Inbox::pop`], as a [`Single`] item.
    pub(crate) fn pop_single(&mut self) -> Option<Single<E, Bytes>> {
        let single = take_single(&mut self.ready, Batch::pop)?;
        if let Single::Read(message) | Single::Message(message) = &single {
            self.consumed.0 += 1;
            self.consumed.1 += message.len() as u64;
        }
        Some(single)
    }

    /// Drops everything buffered (the reader went away), counting it as consumed.
    pub fn clear(&mut self) {
        while self.pop().is_some() {}
    }

    /// The room to return to the sender now, if enough was consumed: half the window in
    /// messages or bytes, so updates stay few while the sender never runs dry before its
    /// room comes back. Returned room counts as given back from here on.
    pub fn take_update(&mut self) -> Option<WindowUpdate> {
        let (messages, bytes) = self.consumed;
        let due = messages * 2 >= u64::from(self.window.messages)
            || bytes * 2 >= self.window.bytes
            // An overshooting message must be returned whole at once, or the sender may
            // stay without byte room.
            || self.unreturned.1 > self.window.bytes;
        if messages == 0 || !due || self.end_placed() {
            return None;
        }
        self.consumed = (0, 0);
        self.unreturned.0 -= messages;
        self.unreturned.1 -= bytes;
        Some(WindowUpdate {
            messages: messages as u32,
            bytes,
        })
    }

    /// Whether the end was taken: nothing more will come.
    pub fn finished(&self) -> bool {
        self.end_placed() && self.ready.is_empty()
    }

    /// Messages and bytes held (buffered, not yet taken).
    pub fn buffered(&self) -> (u64, u64) {
        (
            self.unreturned.0 - self.consumed.0,
            self.unreturned.1 - self.consumed.1,
        )
    }

    /// The window granted to the sender.
    pub fn window(&self) -> Window {
        self.window
    }
}
