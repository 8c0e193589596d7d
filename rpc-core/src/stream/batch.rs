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
use crate::status::Status;
use crate::COMPACT_HEADER_LEN;

/// Largest payload of a [`FrameKind::Messages`] frame a sender builds. A receiver takes a
/// `Messages` frame of up to this many bytes whatever its own message size limit (each
/// message in it is checked against that limit); a larger one is refused as an oversized
/// message would be.
pub const MESSAGES_FRAME_LIMIT: usize = 16 * 1024;

/// Bytes before each message in a `Messages` payload: its length.
pub const LENGTH_PREFIX: usize = 4;

/// The payload limit a receiver applies to a frame of `kind`, given its limit for
/// messages: [`MESSAGES_FRAME_LIMIT`] at least for `Messages` frames.
pub fn payload_limit(kind: FrameKind, max_message: usize) -> usize {
    match kind {
        FrameKind::Messages => max_message.max(MESSAGES_FRAME_LIMIT),
        _ => max_message,
    }
}

/// The messages of one received `Messages` frame not yet read, checked: every length lies
/// within the payload, every message within the receiver's limit, and the lengths cover
/// the payload exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    rest: Bytes,
    count: u32,
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
            },
            bytes,
        ))
    }

    /// Messages not yet read.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether every message was read.
    pub fn is_empty(&self) -> bool {
        self.count == 0
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
        let prefix = self.rest.first_chunk::<LENGTH_PREFIX>()?;
        Some(u32::from_le_bytes(*prefix) as usize)
    }
}

/// A stream sender's own buffer of encoded frames, for a transport that takes them
/// ([`crate::frame::FrameSender::stage_limit`]): consecutive small messages share one
/// `Messages` frame, which grows with each until [`MESSAGES_FRAME_LIMIT`] and goes with the
/// rest when the buffer is handed over.
#[derive(Debug)]
pub(crate) struct Staged {
    buf: BytesMut,
    /// Bytes the buffer may hold.
    limit: usize,
    /// Where the open `Messages` frame's header starts in `buf`, and its payload so far.
    open: Option<(usize, usize)>,
}

impl Staged {
    /// An empty stage of at most `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        Staged {
            buf: BytesMut::new(),
            limit,
            open: None,
        }
    }

    /// Whether nothing waits to be handed over.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Whether a message of `len` bytes fits the stage at all (in a frame of its own).
    pub(crate) fn takes(&self, len: usize) -> bool {
        COMPACT_HEADER_LEN + LENGTH_PREFIX + len <= self.limit
    }

    /// Whether a message of `len` bytes would take the buffer beyond its limit.
    pub(crate) fn would_exceed(&self, len: usize) -> bool {
        self.buf.len() + COMPACT_HEADER_LEN + LENGTH_PREFIX + len > self.limit
    }

    /// Encodes `message` (`len` bytes), the stream's message `seq` of call `call_id`: into
    /// the open `Messages` frame, or a new one when there is none or it is full.
    pub(crate) fn push(&mut self, call_id: u64, seq: u32, message: &dyn EncodeBody, len: usize) {
        let (at, payload) = match self.open {
            Some((at, payload)) if payload + LENGTH_PREFIX + len <= MESSAGES_FRAME_LIMIT => {
                (at, payload)
            }
            _ => {
                let at = self.buf.len();
                let header = Header::stream(FrameKind::Messages, call_id, seq);
                self.buf.resize(at + header.encoded_len(), 0);
                header.encode(&mut self.buf[at..]);
                (at, 0)
            }
        };
        self.buf.put_u32_le(len as u32);
        let start = self.buf.len();
        self.buf.resize(start + len, 0);
        message.encode_into(&mut self.buf[start..]);
        let payload = payload + LENGTH_PREFIX + len;
        debug_assert!(payload <= MESSAGES_FRAME_LIMIT, "staged messages are small");
        Header::set_encoded_payload_len(&mut self.buf[at..], payload as u32);
        self.open = Some((at, payload));
    }

    /// Hands everything to `link`; `Pending` (nothing taken) while it has no room.
    pub(crate) fn poll_hand_over(
        &mut self,
        cx: &mut std::task::Context<'_>,
        link: &super::Link,
    ) -> std::task::Poll<Result<(), Status>> {
        if self.buf.is_empty() {
            return std::task::Poll::Ready(Ok(()));
        }
        let handed = link.poll_send_encoded(cx, &mut self.buf);
        if self.buf.is_empty() {
            self.open = None;
        }
        handed
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
