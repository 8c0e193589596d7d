//! Streaming calls: server, client and bidirectional streams over any transport.
//!
//! A streaming call opens with a `Request` carrying [`Flags::STREAM`](crate::Flags) and the
//! call's metadata. Each side then sends its messages as [`FrameKind::Message`] frames,
//! or several to a [`FrameKind::Messages`] frame ([`batch`]), numbered from 1
//! ([`Header::seq`]); the client ends its side with
//! [`FrameKind::HalfClose`], the server answers with the headers (`Response` with
//! `STREAM`, or a plain `Response` for client streaming) and ends the call with
//! [`FrameKind::Trailers`] (status and trailing metadata). Either side's window
//! ([`Window`]) bounds what the other may send before room comes back in
//! [`FrameKind::WindowUpdate`] frames. `docs/PROTOCOL.md` ("Streams") has the rules.
//!
//! * [`flow`]: ordering and flow control, without I/O (unit- and property-tested).
//! * [`Streaming`]: the typed stream of messages handlers and clients read.

pub mod batch;
pub mod flow;
mod link;
mod send;
#[cfg(test)]
mod send_tests;
mod shared;
mod streaming;
#[cfg(test)]
mod tests;

pub use crate::transport::Wakes;
pub use batch::{MESSAGES_FRAME_LIMIT, STAGE_LIMIT};
pub(crate) use link::Link;
pub use send::{MessageStream, MAX_STREAM_MESSAGES, MESSAGES_PER_POLL};
pub(crate) use send::{Outgoing, TypedMessages};
pub(crate) use shared::StreamShared;
pub(crate) use streaming::Pump;
pub use streaming::{BlockingStreaming, Streaming};

use crate::body::RawBody;
use crate::frame::OutgoingFrame;
use crate::header::{FrameKind, Header};
use crate::MetadataMap;

/// A stream's flow-control window: what a sender may have sent and not yet had returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Messages.
    pub messages: u32,
    /// Bytes of encoded messages. One message may overshoot it (a message larger than the
    /// window must be able to go), so a receiver buffers at most `bytes` plus its message
    /// size limit per stream.
    pub bytes: u64,
}

impl Window {
    /// The larger of each count.
    #[must_use]
    pub fn at_least(self, other: Window) -> Window {
        Window {
            messages: self.messages.max(other.messages),
            bytes: self.bytes.max(other.bytes),
        }
    }
}

/// The window every stream starts with in both directions, before any update: part of the
/// protocol, so both ends agree on it without a handshake. A receiver configured with a
/// larger window grants the difference in a [`WindowUpdate`] when the stream opens; a
/// smaller one cannot be configured.
pub const INITIAL_WINDOW: Window = Window {
    messages: 64,
    bytes: 256 * 1024,
};

/// The window a receiver grants unless configured otherwise
/// (`ChannelConfig::stream_window`, `ServerConfig::stream_window`): 16,384 messages and
/// 2 MiB, hyper's default HTTP/2 stream window. The bytes bind for messages of 128 bytes
/// or more, and hold two 1 MiB messages, so that a stream of large messages has the next
/// transfer under way while one is read (with room for one, each transfer would wait for
/// the last message to be read). The count bounds what tiny messages cost the receiver beyond their bytes (each
/// buffered message holds a buffer view), without throttling them: a stream of 32-byte
/// messages keeps thousands in flight, as HTTP/2's byte-only windows do.
pub const DEFAULT_STREAM_WINDOW: Window = Window {
    messages: 16_384,
    bytes: 2 * 1024 * 1024,
};

/// Room returned to a stream's sender: the payload of a [`FrameKind::WindowUpdate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowUpdate {
    /// Messages.
    pub messages: u32,
    /// Bytes.
    pub bytes: u64,
}

impl WindowUpdate {
    /// Encoded length: `messages` (u32) then `bytes` (u64), little-endian.
    pub const LEN: usize = 12;

    /// Whether it returns nothing (never sent).
    pub fn is_empty(&self) -> bool {
        self.messages == 0 && self.bytes == 0
    }

    /// The wire form.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(&self.messages.to_le_bytes());
        out[4..].copy_from_slice(&self.bytes.to_le_bytes());
        out
    }

    /// Reads the payload of a window update.
    pub fn decode(payload: &[u8]) -> Result<WindowUpdate, flow::StreamError> {
        let bytes: &[u8; Self::LEN] = payload
            .try_into()
            .map_err(|_| flow::StreamError::BadWindowUpdate("its payload is not 12 bytes"))?;
        let update = WindowUpdate {
            messages: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            bytes: u64::from_le_bytes([
                bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9], bytes[10], bytes[11],
            ]),
        };
        if update.is_empty() {
            return Err(flow::StreamError::BadWindowUpdate("it returns nothing"));
        }
        Ok(update)
    }
}

/// Whether `kind` is one of the frames that travel inside a streaming call after it opened.
pub fn is_stream_frame(kind: FrameKind) -> bool {
    matches!(
        kind,
        FrameKind::Message
            | FrameKind::Messages
            | FrameKind::HalfClose
            | FrameKind::Trailers
            | FrameKind::WindowUpdate
    )
}

/// Whether `kind` carries stream messages: a `Message`, or a `Messages` frame of several.
pub fn is_message_frame(kind: FrameKind) -> bool {
    matches!(kind, FrameKind::Message | FrameKind::Messages)
}

impl WindowUpdate {
    /// Runs `send` on the frame that returns this room to the sender of stream `call_id`.
    pub(crate) fn with_frame<R>(
        &self,
        call_id: u64,
        send: impl FnOnce(&mut OutgoingFrame<'_>) -> R,
    ) -> R {
        let payload = self.encode();
        let body = RawBody(&payload);
        let empty = MetadataMap::new();
        let header = Header::new(FrameKind::WindowUpdate, call_id);
        // 12 bytes of payload and no metadata: within every length field.
        let mut frame = OutgoingFrame::new(header, &empty, &body).expect("a window update fits");
        send(&mut frame)
    }
}
