//! Sending frames: the [`FrameSender`] interface every transport implements, over the wire
//! crate's frames.

use std::task::{ready, Context, Poll};

use bytes::BytesMut;

use crate::body::RawBody;
use crate::header::Header;
use crate::Status;
pub use rpc_wire::frame::{FrameTooLarge, InboundFrame, OutgoingFrame, EMPTY};

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
    /// At most [`crate::header::STAGE_LIMIT`] is used: a stage holds one frame. A transport
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

/// Sends the frame that ends a call with `status` (`header`, its kind and code set) through
/// `send`: with `trailers` and the status's metadata and details ([`Status::to_wire`]), or,
/// when that is more than the transport carries in one frame (`RESOURCE_EXHAUSTED`: an
/// RDMA slot, no large-body buffer to be had), without them ([`Status::to_wire_bare`]), so
/// the call still ends. `Pending` as `send` is; each poll starts over.
pub(crate) fn poll_send_status(
    header: Header,
    status: &Status,
    trailers: &crate::MetadataMap,
    mut send: impl FnMut(&mut OutgoingFrame<'_>) -> Poll<Result<(), Status>>,
) -> Poll<Result<(), Status>> {
    let mut send_wire = |wire: &rpc_wire::WireStatus<'_>| {
        let body = RawBody(wire.message.as_bytes());
        let mut frame = OutgoingFrame::new(header, &*wire.metadata, &body)
            .map_err(|e| Status::internal(format!("status frame: {e}")))?;
        send(&mut frame)
    };
    let wire = status.to_wire(trailers);
    match send_wire(&wire) {
        Poll::Ready(Err(e))
            if e.code() == crate::Code::ResourceExhausted && !wire.metadata.is_empty() =>
        {
            send_wire(&status.to_wire_bare(e.message()))
        }
        sent => sent,
    }
}

/// The stage limit of a transport whose frames are at most `max_frame` bytes
/// ([`FrameSender::stage_limit`]).
pub fn one_frame_stage(max_frame: usize) -> usize {
    max_frame.min(crate::header::STAGE_LIMIT)
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
