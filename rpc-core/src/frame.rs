//! Frames as transports see them: a header, encoded metadata and a payload.

use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};

use crate::body::{EmptyBody, EncodeBody, RawBody};
use crate::header::Header;
use crate::metadata::MetadataMap;
use crate::status::Status;

/// A frame about to be written by a transport into its own memory.
///
/// The header's `metadata_len` and `payload_len` already match the bodies; the transport
/// sets transport-owned fields (such as `credits`) with [`OutgoingFrame::header_mut`] before
/// writing, then calls [`OutgoingFrame::write_to`] on a slice of exactly [`OutgoingFrame::len`] bytes.
pub struct OutgoingFrame<'a> {
    header: Header,
    metadata: &'a dyn EncodeBody,
    payload: &'a dyn EncodeBody,
}

impl std::fmt::Debug for OutgoingFrame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutgoingFrame")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Error building a frame whose parts do not fit the 32-bit length fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} of {len} bytes does not fit a frame")]
pub struct FrameTooLarge {
    /// Which part.
    pub what: &'static str,
    /// Its size.
    pub len: usize,
}

static EMPTY: EmptyBody = EmptyBody;

impl<'a> OutgoingFrame<'a> {
    /// A frame carrying `metadata` and `payload` after `header`; lengths are filled in.
    #[inline]
    pub fn new(
        mut header: Header,
        metadata: &'a dyn EncodeBody,
        payload: &'a dyn EncodeBody,
    ) -> Result<Self, FrameTooLarge> {
        let metadata_len = metadata.encoded_len();
        let payload_len = payload.encoded_len();
        header.metadata_len = u32::try_from(metadata_len).map_err(|_| FrameTooLarge {
            what: "metadata",
            len: metadata_len,
        })?;
        header.payload_len = u32::try_from(payload_len).map_err(|_| FrameTooLarge {
            what: "payload",
            len: payload_len,
        })?;
        Ok(OutgoingFrame {
            header,
            metadata,
            payload,
        })
    }

    /// A frame with no body (cancel, credit-only, ...).
    pub fn control(header: Header) -> OutgoingFrame<'static> {
        OutgoingFrame {
            header: Header {
                metadata_len: 0,
                payload_len: 0,
                ..header
            },
            metadata: &EMPTY,
            payload: &EMPTY,
        }
    }

    /// The header as it will be written.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Mutable header, for transport-owned fields such as `credits`.
    pub fn header_mut(&mut self) -> &mut Header {
        &mut self.header
    }

    /// The payload alone, for transports that place it elsewhere (RDMA WRITE).
    pub fn payload(&self) -> &'a dyn EncodeBody {
        self.payload
    }

    /// The metadata alone.
    pub fn metadata(&self) -> &'a dyn EncodeBody {
        self.metadata
    }

    /// Total bytes: header, metadata and payload.
    pub fn len(&self) -> usize {
        self.header.encoded_len()
            + self.header.metadata_len as usize
            + self.header.payload_len as usize
    }

    /// Always false: a frame holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the whole frame, encoded, to `out` (byte-stream transports: the message
    /// encodes itself into the buffer the socket write reads from).
    pub fn encode_to(&self, out: &mut BytesMut) {
        let start = out.len();
        out.resize(start + self.len(), 0);
        self.write_to(&mut out[start..]);
    }

    /// Writes the whole frame into `dst`, which must be exactly [`OutgoingFrame::len`] bytes.
    pub fn write_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len(), "frame buffer has the wrong size");
        let header_len = self.header.encode(dst);
        let rest = &mut dst[header_len..];
        let (meta, payload) = rest.split_at_mut(self.header.metadata_len as usize);
        self.metadata.encode_into(meta);
        self.payload.encode_into(payload);
    }
}

/// A frame received from a peer. Its buffers may be views into transport memory (a ring
/// slot kept alive by the `Bytes` owner) and are released when dropped.
#[derive(Debug, Clone)]
pub struct InboundFrame {
    /// The validated header.
    pub header: Header,
    /// Encoded metadata ([`MetadataMap::decode_from`]).
    pub metadata: Bytes,
    /// The payload (an encoded message, the messages of a `Messages` frame after their
    /// lengths, or a status message for error responses).
    pub payload: Bytes,
}

impl InboundFrame {
    /// Decodes the metadata.
    pub fn decode_metadata(&self) -> Result<MetadataMap, crate::Error> {
        MetadataMap::decode_from(&self.metadata)
    }
}

/// Sending frames on one connection: what a client's transport
/// ([`crate::ClientTransport`]) and a server's reply sink ([`crate::server::ReplySink`])
/// share, and all a stream needs of either.
pub trait FrameSender: Send + Sync + 'static {
    /// Writes `frame` into the transport's own memory and sends it, blocking the thread
    /// while there is no room (blocking APIs only). The transport may set transport-owned
    /// header fields (credits) first.
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status>;

    /// Sends `frame` from an async task: a transport with no room for it now (credits,
    /// slots, its queue bound) returns `Pending` and wakes `cx` once it may have room,
    /// instead of blocking the thread (back-pressure). A `Pending` attempt leaves nothing
    /// behind; the next poll starts over. The default calls [`FrameSender::send`].
    fn poll_send(
        &self,
        _cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        Poll::Ready(self.send(frame))
    }

    /// Like [`FrameSender::poll_send`], but the frame may wait in the transport, with
    /// others sent the same way, until [`FrameSender::flush`]: a stream's messages sent
    /// back to back leave together. The default sends at once.
    fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.poll_send(cx, frame)
    }

    /// Sends what [`FrameSender::poll_send_more`] left waiting. Never blocks.
    fn flush(&self) {}

    /// Bytes of small stream messages (and their `Messages` frame's header) a sender may
    /// encode into a buffer of its own ([`crate::stream::batch`]) before it hands them over
    /// with [`FrameSender::poll_send_encoded`], instead of sending each in a frame of its
    /// own; `None` (the default): every message goes by [`FrameSender::poll_send_more`].
    /// At most [`crate::stream::STAGE_LIMIT`] is used: a stage holds one frame. A transport
    /// that places each frame in memory of its own (an RDMA slot) gives
    /// [`one_frame_stage`] of its largest frame.
    fn stage_limit(&self) -> Option<usize> {
        None
    }

    /// Takes all of `encoded`, the one frame a sender staged, leaving it empty; it may wait
    /// as [`FrameSender::poll_send_more`]'s frames do, until [`FrameSender::flush`].
    /// `Pending` (nothing taken, `cx` woken later) while the transport has no room. Only
    /// called when [`FrameSender::stage_limit`] is set. The default sends the frame through
    /// [`FrameSender::poll_send`].
    fn poll_send_encoded(
        &self,
        cx: &mut Context<'_>,
        encoded: &mut BytesMut,
    ) -> Poll<Result<(), Status>> {
        let sent = {
            let (header, payload) = match staged_frame(encoded) {
                Ok(frame) => frame,
                Err(status) => {
                    encoded.clear();
                    return Poll::Ready(Err(status));
                }
            };
            let body = RawBody(payload);
            let mut frame = match OutgoingFrame::new(header, &EMPTY, &body) {
                Ok(frame) => frame,
                Err(e) => return Poll::Ready(Err(Status::internal(e.to_string()))),
            };
            ready!(self.poll_send(cx, &mut frame))
        };
        encoded.clear();
        Poll::Ready(sent)
    }
}

/// The stage limit of a transport whose frames are at most `max_frame` bytes
/// ([`FrameSender::stage_limit`]).
pub fn one_frame_stage(max_frame: usize) -> usize {
    max_frame.min(crate::stream::STAGE_LIMIT)
}

/// The header and payload of the one frame a sender's stage holds.
fn staged_frame(encoded: &[u8]) -> Result<(Header, &[u8]), Status> {
    let bad = |what: &str| Status::internal(format!("a stream sender's stage {what}"));
    let header_len = Header::wire_len(encoded).map_err(|e| bad(&e.to_string()))?;
    let header = encoded
        .get(..header_len)
        .ok_or_else(|| bad("ends inside a header"))
        .and_then(|h| Header::decode(h).map_err(|e| bad(&e.to_string())))?;
    if header.metadata_len != 0 || encoded.len() != header_len + header.payload_len as usize {
        return Err(bad("does not hold exactly one frame without metadata"));
    }
    Ok((header, &encoded[header_len..]))
}
