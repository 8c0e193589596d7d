//! The sending side of a stream: messages in order, within the window the peer granted.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures::Stream;

use super::batch::{Staged, LENGTH_PREFIX};
use super::flow::SendWindow;
use super::{Link, StreamShared};
use crate::body::{EmptyBody, EncodeBody};
use crate::frame::{poll_send_status, OutgoingFrame};
use crate::header::{FrameKind, Header};
use crate::MetadataMap;
use crate::{Code, Status};

/// Messages one direction of a stream may carry: sequence numbers are 32 bits and 0 and
/// the end take one each. A sender past it fails with `RESOURCE_EXHAUSTED`.
pub const MAX_STREAM_MESSAGES: u32 = u32::MAX - 1;

/// Largest message a sender encodes into its own buffer (after its length); larger ones go
/// in `Message` frames of their own, encoded straight into the transport's buffer (one
/// copy, not two).
const MAX_STAGED_MESSAGE: usize = 2 * 1024 - LENGTH_PREFIX;

/// Messages [`Outgoing::poll_send_all`] sends in one poll before it lets the other tasks
/// of its thread run.
pub const MESSAGES_PER_POLL: usize = 256;

/// Sends one direction of a stream.
#[derive(Debug)]
pub(crate) struct Outgoing {
    shared: Arc<StreamShared>,
    link: Link,
    call_id: u64,
    next_seq: u32,
    max_message: usize,
    /// Room taken from the stream's window and not yet used: messages go without the
    /// stream's lock while it lasts (the lock is taken again when it runs out, and a failed
    /// stream is seen through a flag before each message).
    room: SendWindow,
    /// Small messages encoded and not yet handed to the transport (transports with a
    /// [`FrameSender::stage_limit`](crate::frame::FrameSender::stage_limit) only).
    staged: Option<Staged>,
}

impl Outgoing {
    pub(crate) fn new(
        shared: Arc<StreamShared>,
        link: Link,
        call_id: u64,
        max_message: usize,
    ) -> Self {
        let staged = link.stage_limit().map(Staged::new);
        Outgoing {
            shared,
            link,
            call_id,
            next_seq: 1,
            max_message,
            room: SendWindow::empty(),
            staged,
        }
    }

    /// The length of `message`, the next of the stream, or why it cannot go at all.
    #[inline(always)]
    fn check(&self, message: &dyn EncodeBody) -> Result<usize, Status> {
        if self.next_seq > MAX_STREAM_MESSAGES {
            return Err(Status::resource_exhausted(format!(
                "a stream carries at most {MAX_STREAM_MESSAGES} messages"
            )));
        }
        let len = message.encoded_len();
        if len > self.max_message {
            return Err(Status::message_too_large(
                "stream message",
                len as u64,
                self.max_message as u64,
            ));
        }
        Ok(len)
    }

    /// The `Message` frame carrying `message` as the next of the stream.
    fn frame<'m>(&self, message: &'m dyn EncodeBody) -> Result<OutgoingFrame<'m>, Status> {
        let header = Header::stream(FrameKind::Message, self.call_id, self.next_seq);
        OutgoingFrame::new(header, &EmptyBody, message)
            .map_err(|e| Status::resource_exhausted(e.to_string()))
    }

    /// Sends `message` (`len` bytes, checked), the next of the stream, once the window let
    /// it go: staged, or to the link after what was staged.
    fn poll_put(
        &mut self,
        cx: &mut Context<'_>,
        message: &dyn EncodeBody,
        len: usize,
    ) -> Poll<Result<(), Status>> {
        match &mut self.staged {
            Some(staged) if len <= MAX_STAGED_MESSAGE && staged.takes(len) => {
                if staged.is_full_for(len) {
                    ready!(staged.poll_hand_over(cx, &self.link))?;
                }
                staged.push(self.call_id, self.next_seq, message, len);
            }
            _ => {
                let mut frame = self.frame(message)?;
                // After the messages staged before it.
                ready!(self.poll_hand_over(cx))?;
                ready!(self.link.poll_send_more(cx, &mut frame))?;
            }
        }
        self.sent(len);
        Poll::Ready(Ok(()))
    }

    /// Hands the staged messages to the transport, if there are any.
    fn poll_hand_over(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        match &mut self.staged {
            Some(staged) => staged.poll_hand_over(cx, &self.link),
            None => Poll::Ready(Ok(())),
        }
    }

    /// Sends every message of `messages` as it comes, within the window; `Ready(Ok)` at
    /// its end, `Err` when it or the call failed. `polled`: a message was polled from
    /// `messages` and not sent yet (kept by the caller across polls, false at first). Room
    /// comes first, so no message is taken that could not go; messages sent back to back
    /// leave together, and whenever this waits (window, next message, transport), what it
    /// sent goes. Returns `Pending` (after waking `cx`) every [`MESSAGES_PER_POLL`]
    /// messages, so that other tasks of the thread run.
    pub(crate) fn poll_send_all(
        &mut self,
        cx: &mut Context<'_>,
        messages: &mut dyn MessageStream,
        polled: &mut bool,
    ) -> Poll<Result<(), Status>> {
        for _ in 0..MESSAGES_PER_POLL {
            let ready = self.poll_ready(cx);
            ready!(self.flush_while(cx, ready))??;
            if !*polled {
                let next = messages.poll_next_message(cx);
                match ready!(self.flush_while(cx, next))? {
                    None => return Poll::Ready(Ok(())),
                    Some(next) => next?,
                }
                *polled = true;
            }
            // The room was checked above, before the message was taken.
            let message = messages.current();
            let len = self.check(message)?;
            ready!(self.poll_put(cx, message, len))?;
            *polled = false;
        }
        // A turn given to the thread's other tasks is not a wait: what was sent stays
        // corked, to leave with what follows (the sender is polled again at once).
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Sends `message`, blocking the thread while there is no room (blocking APIs).
    pub(crate) fn send_blocking(&mut self, message: &dyn EncodeBody) -> Result<(), Status> {
        self.check_nothing_staged()?;
        let len = self.check(message)?;
        let mut frame = self.frame(message)?;
        let me = std::thread::current();
        loop {
            if self.room.ready() && !self.shared.has_failed() {
                break;
            }
            match self.shared.claim_or_park_on(&me, &mut self.room) {
                Some(ready) => break ready?,
                None if self.link.poll_progress() => {}
                None => std::thread::park(),
            }
        }
        self.link.send(&mut frame)?;
        self.sent(len);
        Ok(())
    }

    /// Whether the window lets a message go now; `Pending` with `cx` registered if not.
    pub(crate) fn poll_ready(&mut self, cx: &Context<'_>) -> Poll<Result<(), Status>> {
        if self.room.ready() && !self.shared.has_failed() {
            return Poll::Ready(Ok(()));
        }
        self.shared.poll_claim(cx, &mut self.room)
    }

    /// Sends the messages [`Outgoing::poll_send_all`] left waiting, staged or in the link;
    /// `Pending` while the transport has no room for the staged ones.
    pub(crate) fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        ready!(self.poll_hand_over(cx))?;
        self.link.flush();
        Poll::Ready(Ok(()))
    }

    /// What a sender waiting on something else (its next message, its window) polled:
    /// while that is pending, the messages it staged go, rather than wait with it. `Err`
    /// if they cannot.
    pub(crate) fn flush_while<T>(
        &mut self,
        cx: &mut Context<'_>,
        waiting: Poll<T>,
    ) -> Poll<Result<T, Status>> {
        match waiting {
            Poll::Ready(value) => Poll::Ready(Ok(value)),
            Poll::Pending => {
                ready!(self.poll_flush(cx))?;
                Poll::Pending
            }
        }
    }

    /// A blocking send never follows async ones: staged messages would go after it.
    fn check_nothing_staged(&self) -> Result<(), Status> {
        match &self.staged {
            Some(staged) if !staged.is_empty() => Err(Status::internal(
                "a blocking stream send after async sends that were not flushed",
            )),
            _ => Ok(()),
        }
    }

    fn sent(&mut self, len: usize) {
        self.room.on_send(len);
        self.next_seq += 1;
    }

    /// The client's half-close, after the last message.
    pub(crate) fn half_close(&self) -> Header {
        Header::stream(FrameKind::HalfClose, self.call_id, self.next_seq)
    }

    /// Sends the server's trailers after the last message: `status`, with `trailers` and
    /// the status's own metadata and details ([`Status::to_wire`]). Metadata more than the
    /// link carries in a frame (an RDMA slot) is left out ([`Status::to_wire_bare`]), so
    /// the call still ends.
    pub(crate) fn poll_trailers(
        &mut self,
        cx: &mut Context<'_>,
        status: &Status,
        trailers: &MetadataMap,
    ) -> Poll<Result<(), Status>> {
        let mut header = Header::stream(FrameKind::Trailers, self.call_id, self.next_seq);
        header.status = status.code();
        ready!(self.poll_hand_over(cx))?;
        let link = &self.link;
        poll_send_status(header, status, trailers, |frame| link.poll_send(cx, frame))
    }

    /// Sends a header-only frame (the half-close) when the link has room.
    pub(crate) fn poll_control(
        &mut self,
        cx: &mut Context<'_>,
        header: Header,
    ) -> Poll<Result<(), Status>> {
        let mut frame = OutgoingFrame::control(header);
        ready!(self.poll_hand_over(cx))?;
        self.link.poll_send(cx, &mut frame)
    }

    /// Sends a header-only frame, blocking while there is no room.
    pub(crate) fn send_control_blocking(&self, header: Header) -> Result<(), Status> {
        self.check_nothing_staged()?;
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
    M: EncodeBody + 'static,
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
