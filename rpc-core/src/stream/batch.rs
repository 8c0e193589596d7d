//! Several messages of a stream in one [`FrameKind::Messages`] frame: how a sender packs
//! them ([`Staged`]) and how a receiver checks and unpacks them ([`Batch`]).
//!
//! The payload of a `Messages` frame is its messages back to back, each after its length
//! (4 bytes, little-endian); the header's [`Header::seq`] is the first message's place and
//! the others take the places after it. One header then carries many small messages, as
//! gRPC's DATA frames do: a byte-stream transport decodes, routes and wakes once per frame,
//! not once per message. Flow control counts the messages and their bytes (not the length
//! prefixes), exactly as if each had come in a `Message` frame of its own.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::flow::StreamError;
use crate::body::EncodeBody;
use crate::header::{FrameKind, Header};
use crate::Status;
use crate::COMPACT_HEADER_LEN;

pub use crate::header::{LENGTH_PREFIX, MESSAGES_FRAME_LIMIT, STAGE_LIMIT};

/// The payload limit a receiver applies to a frame of `kind`, given its limit for
/// messages: [`MESSAGES_FRAME_LIMIT`] at least for `Messages` frames.
pub fn payload_limit(kind: FrameKind, max_message: usize) -> usize {
    match kind {
        FrameKind::Messages => max_message.max(MESSAGES_FRAME_LIMIT),
        _ => max_message,
    }
}

/// What a frame of `kind` refused at its header for its size is called, and the limit it
/// broke, given the receiver's limit for messages: for the status naming both sizes.
/// `otherwise` names frames that are not stream messages (a request, a response).
pub fn oversized(
    kind: FrameKind,
    max_message: usize,
    otherwise: &'static str,
) -> (&'static str, u64) {
    let what = match kind {
        FrameKind::Message => "stream message",
        FrameKind::Messages => "frame of stream messages",
        _ => otherwise,
    };
    (what, payload_limit(kind, max_message) as u64)
}

/// The messages of one received `Messages` frame not yet read, checked: every length lies
/// within the payload, every message within the receiver's limit, and the lengths cover
/// the payload exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    rest: Bytes,
    count: u32,
    /// Bytes of the messages in `rest`, length prefixes not counted.
    bytes: u64,
}

impl Batch {
    /// Checks `payload` for messages of at most `max_message` bytes; returns the batch and
    /// the bytes of its messages (length prefixes not counted).
    pub fn parse(payload: Bytes, max_message: u64) -> Result<(Batch, u64), StreamError> {
        let (mut count, mut bytes) = (0u32, 0u64);
        let mut rest = &payload[..];
        while !rest.is_empty() {
            let Some((prefix, after)) = rest.split_first_chunk::<LENGTH_PREFIX>() else {
                return Err(StreamError::BadBatch(
                    "its payload ends inside a message length",
                ));
            };
            let len = u64::from(u32::from_le_bytes(*prefix));
            if len > max_message {
                return Err(StreamError::TooLarge {
                    len,
                    limit: max_message,
                });
            }
            if len > after.len() as u64 {
                return Err(StreamError::BadBatch(
                    "a message length runs past the end of the frame",
                ));
            }
            rest = &after[len as usize..];
            count += 1;
            bytes += len;
        }
        if count == 0 {
            return Err(StreamError::BadBatch("it holds no message"));
        }
        Ok((
            Batch {
                rest: payload,
                count,
                bytes,
            },
            bytes,
        ))
    }

    /// Messages not yet read.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes of the messages not yet read.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether every message was read.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Splits off the first `n` messages (all of them if there are fewer), leaving the rest.
    pub fn split_front(&mut self, n: u32) -> Batch {
        let n = n.min(self.count);
        let (mut at, mut bytes) = (0, 0u64);
        for _ in 0..n {
            let len = self.len_at(at);
            at += LENGTH_PREFIX + len;
            bytes += len as u64;
        }
        self.count -= n;
        self.bytes -= bytes;
        Batch {
            rest: self.rest.split_to(at),
            count: n,
            bytes,
        }
    }

    /// Takes the next message, as a view of the frame.
    pub fn pop(&mut self) -> Option<Bytes> {
        let len = self.next_len()?;
        let message = self.rest.slice(LENGTH_PREFIX..LENGTH_PREFIX + len);
        self.rest.advance(LENGTH_PREFIX + len);
        Some(message)
    }

    /// Reads the next message with `read`, straight from the frame (no view of its own);
    /// returns what `read` returned and the message's length. What `read` leaves unread of
    /// the message is skipped.
    pub fn pop_with<R>(
        &mut self,
        read: impl FnOnce(&mut bytes::buf::Take<&mut Bytes>) -> R,
    ) -> Option<(R, usize)> {
        let len = self.next_len()?;
        self.rest.advance(LENGTH_PREFIX);
        let mut message = (&mut self.rest).take(len);
        let read = read(&mut message);
        let unread = message.remaining();
        self.rest.advance(unread);
        Some((read, len))
    }

    /// Length of the next message (checked by [`Batch::parse`]), counting it as read.
    fn next_len(&mut self) -> Option<usize> {
        self.count = self.count.checked_sub(1)?;
        let len = self.len_at(0);
        self.bytes -= len as u64;
        Some(len)
    }

    /// The length of the message whose prefix starts at `at` (a place [`Batch::parse`]
    /// checked).
    fn len_at(&self, at: usize) -> usize {
        let prefix = &self.rest[at..at + LENGTH_PREFIX];
        u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize
    }
}

/// A stream sender's own buffer for a transport that takes encoded frames
/// ([`crate::frame::FrameSender::stage_limit`]): one `Messages` frame, which takes
/// consecutive small messages until the next would carry it past its limit, and goes when
/// it is handed over.
#[derive(Debug)]
pub(crate) struct Staged {
    buf: BytesMut,
    /// Bytes the frame may take, header included; at most [`STAGE_LIMIT`].
    limit: usize,
}

impl Staged {
    /// An empty stage of at most `limit` bytes (no more than [`STAGE_LIMIT`]).
    pub(crate) fn new(limit: usize) -> Self {
        Staged {
            buf: BytesMut::new(),
            limit: limit.min(STAGE_LIMIT),
        }
    }

    /// Whether nothing waits to be handed over.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes a message of `len` bytes adds to the stage (its header too when it is the
    /// first).
    fn growth(&self, len: usize) -> usize {
        let header = if self.buf.is_empty() {
            COMPACT_HEADER_LEN
        } else {
            0
        };
        header + LENGTH_PREFIX + len
    }

    /// Whether a message of `len` bytes fits an empty stage: larger ones go in frames of
    /// their own.
    pub(crate) fn takes(&self, len: usize) -> bool {
        COMPACT_HEADER_LEN + LENGTH_PREFIX + len <= self.limit
    }

    /// Whether a message of `len` bytes needs the stage handed over first.
    pub(crate) fn is_full_for(&self, len: usize) -> bool {
        self.buf.len() + self.growth(len) > self.limit
    }

    /// Adds `message` (`len` bytes, [`Staged::takes`] and not [`Staged::is_full_for`]),
    /// the stream's message `seq` of call `call_id`: it opens the frame when it is the
    /// first.
    pub(crate) fn push(&mut self, call_id: u64, seq: u32, message: &dyn EncodeBody, len: usize) {
        debug_assert!(!self.is_full_for(len), "the stage is full");
        if self.buf.is_empty() {
            let header = Header::stream(FrameKind::Messages, call_id, seq);
            self.buf.resize(COMPACT_HEADER_LEN, 0);
            header.encode(&mut self.buf);
        }
        self.buf.put_u32_le(len as u32);
        let start = self.buf.len();
        self.buf.resize(start + len, 0);
        message.encode_into(&mut self.buf[start..]);
        // Within MESSAGES_FRAME_LIMIT: the stage is at most STAGE_LIMIT.
        let payload = self.buf.len() - COMPACT_HEADER_LEN;
        Header::set_encoded_payload_len(&mut self.buf, payload as u32);
    }

    /// Hands the frame to `link`; `Pending` (nothing taken) while it has no room.
    pub(crate) fn poll_hand_over(
        &mut self,
        cx: &mut std::task::Context<'_>,
        link: &super::Link,
    ) -> std::task::Poll<Result<(), Status>> {
        if self.buf.is_empty() {
            return std::task::Poll::Ready(Ok(()));
        }
        link.poll_send_encoded(cx, &mut self.buf)
    }
}

/// The payload of a `Messages` frame holding `messages` (tests).
#[cfg(test)]
pub(crate) fn encode_batch<M: AsRef<[u8]>>(messages: &[M]) -> Bytes {
    let mut out = BytesMut::new();
    for m in messages {
        out.put_u32_le(m.as_ref().len() as u32);
        out.put_slice(m.as_ref());
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(messages: &[&[u8]]) -> Bytes {
        encode_batch(messages)
    }

    #[test]
    fn messages_come_out_as_they_went_in() {
        let (mut batch, bytes) =
            Batch::parse(payload(&[b"one", b"", b"three"]), 100).expect("a good batch");
        assert_eq!((batch.count(), bytes), (3, 8));
        assert_eq!(batch.pop().as_deref(), Some(&b"one"[..]));
        let read = batch.pop_with(|m| m.copy_to_bytes(m.remaining()));
        assert_eq!(read, Some((Bytes::new(), 0)));
        // What the reader leaves unread is skipped.
        let read = batch.pop_with(|m| m.get_u8());
        assert_eq!(read, Some((b't', 5)));
        assert!(batch.is_empty());
        assert_eq!(batch.pop(), None);
    }

    #[test]
    fn bad_batches_are_named() {
        let bad = |p: Bytes, max| Batch::parse(p, max).unwrap_err();
        assert_eq!(
            bad(Bytes::new(), 10),
            StreamError::BadBatch("it holds no message")
        );
        assert_eq!(
            bad(Bytes::from_static(&[1, 0, 0]), 10),
            StreamError::BadBatch("its payload ends inside a message length")
        );
        let mut cut = payload(&[b"abc"]).to_vec();
        cut.pop();
        assert_eq!(
            bad(cut.into(), 10),
            StreamError::BadBatch("a message length runs past the end of the frame")
        );
        assert_eq!(
            bad(payload(&[b"ok", b"too long"]), 4),
            StreamError::TooLarge { len: 8, limit: 4 }
        );
        let mut trailing = payload(&[b"ok"]).to_vec();
        trailing.push(0);
        assert_eq!(
            bad(trailing.into(), 10),
            StreamError::BadBatch("its payload ends inside a message length")
        );
    }
}
