//! The sending side of a stream: messages in order, within the window the peer granted.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::Stream;

use super::{Link, StreamShared};
use crate::body::{EmptyBody, EncodeBody, RawBody};
use crate::frame::OutgoingFrame;
use crate::header::{FrameKind, Header};
use crate::metadata::MetadataMap;
use crate::status::{Code, Status};

/// Messages one direction of a stream may carry: sequence numbers are 32 bits and 0 and
/// the end take one each. A sender past it fails with `RESOURCE_EXHAUSTED`.
pub const MAX_STREAM_MESSAGES: u32 = u32::MAX - 1;

/// Sends one direction of a stream.
#[derive(Debug)]
pub(crate) struct Outgoing {
    shared: Arc<StreamShared>,
    link: Link,
    call_id: u64,
    next_seq: u32,
    max_message: usize,
    /// The last send found room for another message: the next need not ask the window.
    /// (Room only grows between sends, and a failure is seen by the next send that asks.)
    room_known: bool,
}

impl Outgoing {
    pub(crate) fn new(
        shared: Arc<StreamShared>,
        link: Link,
        call_id: u64,
        max_message: usize,
    ) -> Self {
        Outgoing {
            shared,
            link,
            call_id,
            next_seq: 1,
            max_message,
            room_known: false,
        }
    }

    /// Why `message` cannot go at all, if it cannot.
    fn check(&self, message: &dyn EncodeBody) -> Result<(), Status> {
        let len = message.encoded_len();
        if len > self.max_message {
            return Err(Status::message_too_large(
                "stream message",
                len as u64,
                self.max_message as u64,
            ));
        }
        if self.next_seq > MAX_STREAM_MESSAGES {
            return Err(Status::resource_exhausted(format!(
                "a stream carries at most {MAX_STREAM_MESSAGES} messages"
            )));
        }
        Ok(())
    }

    /// Sends `message` once the window and the link have room; `Pending` until then (the
    /// message is not sent, the next poll starts over). The message may wait in the link
    /// for the ones after it: whoever stops sending calls [`Outgoing::flush`] (waiting for
    /// the window here does).
    pub(crate) fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        message: &dyn EncodeBody,
    ) -> Poll<Result<(), Status>> {
        self.check(message)?;
        if self.poll_ready(cx)?.is_pending() {
            self.link.flush();
            return Poll::Pending;
        }
        let header = Header::stream(FrameKind::Message, self.call_id, self.next_seq);
        let empty = MetadataMap::new();
        let mut frame = OutgoingFrame::new(header, &empty, message)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        ready!(self.link.poll_send_more(cx, &mut frame))?;
        self.sent(message.encoded_len());
        Poll::Ready(Ok(()))
    }

    /// Sends `message`, blocking the thread while there is no room (blocking APIs).
    pub(crate) fn send_blocking(&mut self, message: &dyn EncodeBody) -> Result<(), Status> {
        self.check(message)?;
        let me = std::thread::current();
        loop {
            match self.shared.send_ready_or_park_on(&me) {
                Some(ready) => break ready?,
                None if self.link.poll_progress() => {}
                None => std::thread::park(),
            }
        }
        let header = Header::stream(FrameKind::Message, self.call_id, self.next_seq);
        let empty = MetadataMap::new();
        let mut frame = OutgoingFrame::new(header, &empty, message)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        self.link.send(&mut frame)?;
        self.sent(message.encoded_len());
        Ok(())
    }

    /// Whether the window lets a message go now; `Pending` with `cx` registered if not.
    pub(crate) fn poll_ready(&mut self, cx: &Context<'_>) -> Poll<Result<(), Status>> {
        if self.room_known {
            return Poll::Ready(Ok(()));
        }
        let ready = self.shared.poll_send_ready(cx);
        self.room_known = matches!(ready, Poll::Ready(Ok(())));
        ready
    }

    /// Sends the messages [`Outgoing::poll_send`] left waiting in the link.
    pub(crate) fn flush(&self) {
        self.link.flush();
    }

    fn sent(&mut self, len: usize) {
        self.room_known = self.shared.on_sent(len);
        self.next_seq += 1;
    }

    /// The client's half-close, after the last message.
    pub(crate) fn half_close(&self) -> Header {
        Header::stream(FrameKind::HalfClose, self.call_id, self.next_seq)
    }

    /// Sends the server's trailers: `status` and `metadata` after the last message.
    pub(crate) fn poll_trailers(
        &self,
        cx: &mut Context<'_>,
        status: &Status,
        metadata: &MetadataMap,
    ) -> Poll<Result<(), Status>> {
        let mut header = Header::stream(FrameKind::Trailers, self.call_id, self.next_seq);
        header.status = status.code();
        let message = crate::server::status_message(status);
        let body = RawBody(message.as_bytes());
        let metadata = if metadata.checked_encoded_len().is_ok() {
            metadata
        } else {
            &MetadataMap::new()
        };
        let mut frame = OutgoingFrame::new(header, metadata, &body)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        self.link.poll_send(cx, &mut frame)
    }

    /// Sends a header-only frame (the half-close) when the link has room.
    pub(crate) fn poll_control(
        &self,
        cx: &mut Context<'_>,
        header: Header,
    ) -> Poll<Result<(), Status>> {
        let mut frame = OutgoingFrame::control(header);
        self.link.poll_send(cx, &mut frame)
    }

    /// Sends a header-only frame, blocking while there is no room.
    pub(crate) fn send_control_blocking(&self, header: Header) -> Result<(), Status> {
        let mut frame = OutgoingFrame::control(header);
        self.link.send(&mut frame)
    }

    /// The call the stream belongs to.
    pub(crate) fn call_id(&self) -> u64 {
        self.call_id
    }

    /// The stream's shared state.
    pub(crate) fn shared(&self) -> &Arc<StreamShared> {
        &self.shared
    }
}

/// A handler's stream of response messages, type-erased: the dispatcher polls a message
/// into place and lets the transport encode it straight from there.
pub trait MessageStream: Send {
    /// Polls the next message into [`MessageStream::current`]: `Some(Ok(()))` when one is
    /// there, `Some(Err)` when the handler failed, `None` at the end.
    fn poll_next_message(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<(), Status>>>;

    /// The message the last successful poll produced.
    fn current(&self) -> &dyn EncodeBody;
}

/// [`MessageStream`] over a typed stream of results.
pub(crate) struct TypedMessages<S, M> {
    stream: Pin<Box<S>>,
    current: Option<M>,
}

impl<S, M> TypedMessages<S, M> {
    pub(crate) fn new(stream: S) -> Self {
        TypedMessages {
            stream: Box::pin(stream),
            current: None,
        }
    }
}

impl<S, M> MessageStream for TypedMessages<S, M>
where
    S: Stream<Item = Result<M, Status>> + Send + 'static,
    M: prost::Message + Send + Sync + 'static,
{
    fn poll_next_message(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<(), Status>>> {
        Poll::Ready(match ready!(self.stream.as_mut().poll_next(cx)) {
            Some(Ok(message)) => {
                self.current = Some(message);
                Some(Ok(()))
            }
            Some(Err(status)) if status.code() == Code::Ok => Some(Err(Status::unknown(
                "the handler's stream yielded an error with status OK",
            ))),
            Some(Err(status)) => Some(Err(status)),
            None => None,
        })
    }

    fn current(&self) -> &dyn EncodeBody {
        match &self.current {
            Some(message) => message,
            None => &EmptyBody,
        }
    }
}
