//! One HTTP/2 connection carrying gRPC, as our side of it sees it (the server's
//! dispatcher, or a client's channel: the connection's "upper side"): the frames it hands
//! the upper side for each call, and the upper side's frames (it is the connection's
//! [`FrameSender`]), queued per call until HTTP/2 takes them.
//!
//! The connection plays our protocol's peer for the upper side, flow control included: a
//! call's messages that arrived by HTTP/2 go up only while the upper side's stream window
//! has room, and the upper side's messages are returned to its window only as the HTTP/2
//! peer takes them. A call's queue thus holds at most the initial stream window
//! ([`INITIAL_WINDOW`]: 64 messages, 256 KiB, plus one message over), and a client that
//! reads slowly slows its handler, through HTTP/2's own windows. The connection's queues
//! together hold at most `GrpcServerConfig::write_queue` bytes of messages (plus one): past
//! it, the dispatcher's senders wait (`Pending`) until HTTP/2 takes some.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::server::ServedLink;
use rpc_core::stream::batch::Batch;
use rpc_core::stream::{Wakes, WindowUpdate, INITIAL_WINDOW};
use rpc_core::{FrameKind, FrameSender, Header, Inbound, Status};
use rustc_hash::FxHashMap;
use tokio::sync::watch;

use crate::codec::{framed, put_prefix, ReadBudget, PREFIX_LEN};
use crate::config::MAX_FRAME_SIZE;

/// Which side of HTTP/2 a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// It serves requests.
    Server,
    /// It sends them.
    Client,
}

/// How far a connection is from its end, as its task is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Serving,
    /// Send GOAWAY: no new streams, running ones finish.
    Draining,
    /// End the connection now.
    Closed,
}

/// What the upper side sent a call, as HTTP/2 will carry it.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A message after its gRPC prefix.
    Message(Bytes),
    /// Any other frame of the call (headers, a response, trailers, a half-close), and its
    /// payload after a gRPC prefix (a unary message as HTTP/2 carries it).
    Frame(InboundFrame, Bytes),
    /// The call failed on this side (what HTTP/2 brought was bad), or the connection
    /// ended: the status ends it.
    Failed(Status),
}

/// One call of the connection.
#[derive(Debug)]
struct CallState {
    replies: VecDeque<Reply>,
    /// The response side, waiting for `replies`.
    reader: Option<Waker>,
    /// Room the dispatcher's stream window gives the client's messages (it may go below
    /// zero by one message's bytes, as the protocol allows).
    room_messages: i64,
    room_bytes: i64,
    /// The request side, waiting for room or for the call's end.
    writer: Option<Waker>,
    /// Response messages HTTP/2 took and not yet returned to the dispatcher's window.
    consumed: WindowUpdate,
    failed: Option<Status>,
}

impl Reply {
    /// Bytes of messages it counts against the connection's write queue: response
    /// messages, and a unary answer's message (statuses and trailers are small, one per
    /// call, and always go, so a call can always end).
    fn queued_bytes(&self) -> usize {
        match self {
            Reply::Message(framed) => framed.len(),
            Reply::Frame(frame, framed)
                if frame.header.kind == FrameKind::Response
                    && frame.header.status == rpc_core::Code::Ok =>
            {
                framed.len()
            }
            _ => 0,
        }
    }
}

impl CallState {
    fn new() -> Self {
        CallState {
            replies: VecDeque::new(),
            reader: None,
            room_messages: i64::from(INITIAL_WINDOW.messages),
            room_bytes: INITIAL_WINDOW.bytes as i64,
            writer: None,
            consumed: WindowUpdate {
                messages: 0,
                bytes: 0,
            },
            failed: None,
        }
    }

    fn wake_both(&mut self) -> [Option<Waker>; 2] {
        [self.reader.take(), self.writer.take()]
    }
}

#[derive(Debug, Default)]
struct State {
    /// By call id (numbered by this side or the upper side: never by the peer).
    calls: FxHashMap<u64, CallState>,
    next_id: u64,
    closed: Option<Status>,
    /// The peer said GOAWAY: no new call opens.
    going_away: bool,
    /// Since when no call runs (`None` while one does).
    idle_since: Option<std::time::Instant>,
    /// Bytes of [`Reply::queued_bytes`] in every call's queue.
    queued: usize,
    /// The dispatcher's senders waiting for the queue to go below its bound (one per call
    /// at most: a call's sender waits for one frame at a time).
    senders: Vec<Waker>,
}

impl State {
    /// Takes `bytes` out of the queue's count; the senders to wake if it went below `bound`.
    fn dequeued(&mut self, bytes: usize, bound: usize) -> Vec<Waker> {
        let was_full = self.queued >= bound;
        self.queued -= bytes;
        if was_full && self.queued < bound {
            std::mem::take(&mut self.senders)
        } else {
            Vec::new()
        }
    }
}

/// One HTTP/2 connection's calls.
pub(crate) struct GrpcConn {
    /// `grpc://addr` of the peer, for messages.
    pub(crate) peer: String,
    state: Mutex<State>,
    /// Bytes of messages the calls' queues hold before the upper side's senders wait.
    write_queue: usize,
    /// What the connection's message readers hold.
    pub(crate) read_budget: ReadBudget,
    /// The upper side, set once it exists (it needs this connection as its sender first),
    /// and let go when the connection ends (it holds this connection).
    upper: Mutex<Option<Arc<dyn Inbound>>>,
    phase: watch::Sender<Phase>,
    /// Told when a call ends, for [`GrpcConn::drained`].
    call_ended: tokio::sync::Notify,
}

impl std::fmt::Debug for GrpcConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcConn")
            .field("peer", &self.peer)
            .field("calls", &self.state.lock().calls.len())
            .finish_non_exhaustive()
    }
}

impl GrpcConn {
    /// The calls of a connection with `peer`; its readers hold at most `read_budget` bytes
    /// (at least a message of `max_message` bytes and a frame: a lone message always fits)
    /// and its queues `write_queue`. `side` says which.
    pub(crate) fn new(
        peer: String,
        side: Side,
        max_message: usize,
        read_budget: usize,
        write_queue: usize,
    ) -> Arc<GrpcConn> {
        let min_budget = max_message + PREFIX_LEN + MAX_FRAME_SIZE;
        let (what, knob) = match side {
            Side::Server => ("request", "GrpcServerConfig::read_budget"),
            Side::Client => ("response", "GrpcClientConfig::read_budget"),
        };
        Arc::new(GrpcConn {
            read_budget: ReadBudget::new(read_budget.max(min_budget), what, knob),
            peer,
            state: Mutex::new(State {
                idle_since: Some(std::time::Instant::now()),
                ..State::default()
            }),
            write_queue,
            upper: Mutex::new(None),
            phase: watch::Sender::new(Phase::Serving),
            call_ended: tokio::sync::Notify::new(),
        })
    }

    pub(crate) fn set_upper(&self, upper: Arc<dyn Inbound>) {
        *self.upper.lock() = Some(upper);
    }

    /// What the connection's task watches.
    pub(crate) fn phase(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// A new call, numbered here (a server's); `UNAVAILABLE` once the connection ended.
    pub(crate) fn open_call(&self) -> Result<u64, Status> {
        let mut state = self.state.lock();
        state.next_id += 1;
        let id = state.next_id;
        drop(state);
        self.open_call_as(id).map(|()| id)
    }

    /// A new call numbered `id` by the upper side (a client's channel).
    pub(crate) fn open_call_as(&self, id: u64) -> Result<(), Status> {
        let mut state = self.state.lock();
        if let Some(status) = &state.closed {
            return Err(status.clone());
        }
        if state.going_away {
            return Err(Status::unavailable(format!(
                "{} is going away (HTTP/2 GOAWAY): it takes no new call",
                self.peer
            )));
        }
        state.calls.insert(id, CallState::new());
        state.idle_since = None;
        Ok(())
    }

    /// Since when no call runs, if none does.
    pub(crate) fn idle_since(&self) -> Option<std::time::Instant> {
        self.state.lock().idle_since
    }

    /// Hands `frame` to the upper side (never under this connection's lock: a handler run
    /// inline answers through [`FrameSender::send`] before this returns).
    pub(crate) fn deliver(&self, frame: InboundFrame) {
        let Some(upper) = self.upper.lock().clone() else {
            return;
        };
        let mut wakes = Wakes::new();
        if let Err(status) = upper.on_frame(frame, &mut wakes) {
            tracing::debug!(%status, "the upper side refused a frame");
        }
    }

    /// The next thing the dispatcher sent call `id`; a response message taken counts as
    /// consumed, and what was consumed goes back to the dispatcher's window once it is
    /// half the initial window (in messages or bytes), as the protocol's receivers return
    /// room.
    pub(crate) fn poll_reply(&self, id: u64, cx: &mut Context<'_>) -> Poll<Reply> {
        let (reply, update, senders) = {
            let mut state = self.state.lock();
            let closed = state.closed.clone();
            let Some(call) = state.calls.get_mut(&id) else {
                return Poll::Ready(Reply::Failed(
                    closed.unwrap_or_else(|| Status::internal("the call ended on the server")),
                ));
            };
            if let Some(status) = call.failed.take() {
                return Poll::Ready(Reply::Failed(status));
            }
            let Some(reply) = call.replies.pop_front() else {
                call.reader = Some(cx.waker().clone());
                return Poll::Pending;
            };
            let mut update = None;
            let bytes = reply.queued_bytes();
            if let Reply::Message(message) = &reply {
                let consumed = &mut call.consumed;
                consumed.messages += 1;
                consumed.bytes += (message.len() - PREFIX_LEN) as u64;
                if consumed.messages >= INITIAL_WINDOW.messages / 2
                    || consumed.bytes >= INITIAL_WINDOW.bytes / 2
                {
                    update = Some(std::mem::replace(
                        consumed,
                        WindowUpdate {
                            messages: 0,
                            bytes: 0,
                        },
                    ));
                }
            }
            let senders = state.dequeued(bytes, self.write_queue);
            (reply, update, senders)
        };
        senders.into_iter().for_each(Waker::wake);
        if let Some(update) = update {
            let payload = Bytes::copy_from_slice(&update.encode());
            self.deliver(stream_frame(FrameKind::WindowUpdate, id, 0, payload));
        }
        Poll::Ready(reply)
    }

    /// Whether call `id`'s request side may send a message now: `Ready(false)` once the call
    /// is over, `Pending` while the dispatcher's window has no room. `cx` is woken by
    /// either change.
    pub(crate) fn poll_room(&self, id: u64, cx: &mut Context<'_>) -> Poll<bool> {
        let mut state = self.state.lock();
        let Some(call) = state.calls.get_mut(&id) else {
            return Poll::Ready(false);
        };
        match &mut call.writer {
            Some(w) if w.will_wake(cx.waker()) => {}
            writer => *writer = Some(cx.waker().clone()),
        }
        if call.failed.is_some() {
            return Poll::Ready(false);
        }
        if call.room_messages > 0 && call.room_bytes > 0 {
            Poll::Ready(true)
        } else {
            Poll::Pending
        }
    }

    /// Call `id`'s request side sent a message of `len` bytes.
    pub(crate) fn take_room(&self, id: u64, len: usize) {
        if let Some(call) = self.state.lock().calls.get_mut(&id) {
            call.room_messages -= 1;
            call.room_bytes -= len as i64;
        }
    }

    /// Fails call `id` with `status` on this side; its response ends with it.
    pub(crate) fn fail_call(&self, id: u64, status: Status) {
        let wake = {
            let mut state = self.state.lock();
            let Some(call) = state.calls.get_mut(&id) else {
                return;
            };
            call.failed = Some(status);
            call.wake_both()
        };
        wake.into_iter().flatten().for_each(Waker::wake);
    }

    /// Forgets call `id` (its response ended); with `cancel`, tells the dispatcher to stop
    /// it (the client went away, or the call failed on this side).
    pub(crate) fn end_call(&self, id: u64, cancel: bool) {
        let (mut call, senders) = {
            let mut state = self.state.lock();
            let Some(call) = state.calls.remove(&id) else {
                return;
            };
            let bytes = call.replies.iter().map(Reply::queued_bytes).sum();
            let senders = state.dequeued(bytes, self.write_queue);
            if state.calls.is_empty() {
                state.idle_since = Some(std::time::Instant::now());
            }
            (call, senders)
        };
        senders.into_iter().for_each(Waker::wake);
        call.wake_both().into_iter().flatten().for_each(Waker::wake);
        self.call_ended.notify_waiters();
        if cancel {
            self.deliver(stream_frame(FrameKind::Cancel, id, 0, Bytes::new()));
        }
    }

    /// The peer said GOAWAY: new calls are refused, running ones go on.
    pub(crate) fn peer_goes_away(&self) {
        self.state.lock().going_away = true;
    }

    /// Waits until no call runs.
    pub(crate) async fn drained(&self) {
        loop {
            let ended = self.call_ended.notified();
            if self.state.lock().calls.is_empty() {
                return;
            }
            ended.await;
        }
    }

    /// Fails every call with `status` and refuses new ones; the connection is over.
    pub(crate) fn close_calls(&self, status: &Status) {
        let wakes: Vec<Waker> = {
            let mut state = self.state.lock();
            if state.closed.is_none() {
                state.closed = Some(status.clone());
            }
            let mut wakes: Vec<Waker> = std::mem::take(&mut state.senders);
            for call in state.calls.values_mut() {
                call.failed.get_or_insert_with(|| status.clone());
                wakes.extend(call.wake_both().into_iter().flatten());
            }
            wakes
        };
        wakes.into_iter().for_each(Waker::wake);
    }

    /// The connection ended: every call fails with `status`, and the upper side hears of
    /// it (a dispatcher stops its handlers, a channel fails its calls).
    pub(crate) fn on_closed(&self, status: Status) {
        self.close_calls(&status);
        let upper = self.upper.lock().take();
        if let Some(upper) = upper {
            upper.on_closed(status);
        }
    }

    /// Whether the connection's queues are at their bound; if so `cx` is woken once they
    /// are not.
    fn poll_queue_room(&self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        let mut state = self.state.lock();
        if let Some(status) = &state.closed {
            return Poll::Ready(Err(status.clone()));
        }
        if state.queued < self.write_queue {
            return Poll::Ready(Ok(()));
        }
        if !state.senders.iter().any(|w| w.will_wake(cx.waker())) {
            state.senders.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Queues `replies` for call `id`, if the call is still on.
    fn queue(&self, id: u64, replies: impl IntoIterator<Item = Reply>) -> Result<(), Status> {
        let reader = {
            let mut state = self.state.lock();
            if let Some(status) = &state.closed {
                return Err(status.clone());
            }
            let State { calls, queued, .. } = &mut *state;
            let Some(call) = calls.get_mut(&id) else {
                // Ended or cancelled here: what comes after is of no use.
                return Ok(());
            };
            for reply in replies {
                *queued += reply.queued_bytes();
                call.replies.push_back(reply);
            }
            call.reader.take()
        };
        if let Some(reader) = reader {
            reader.wake();
        }
        Ok(())
    }

    fn add_room(&self, id: u64, update: &WindowUpdate) {
        let writer = {
            let mut state = self.state.lock();
            let Some(call) = state.calls.get_mut(&id) else {
                return;
            };
            call.room_messages = call
                .room_messages
                .saturating_add(i64::from(update.messages));
            call.room_bytes = call
                .room_bytes
                .saturating_add(i64::try_from(update.bytes).unwrap_or(i64::MAX));
            call.writer.take()
        };
        if let Some(writer) = writer {
            writer.wake();
        }
    }
}

/// A frame of `kind` for call `id` with sequence number `seq` and `payload`, as the
/// upper side receives it.
pub(crate) fn stream_frame(kind: FrameKind, id: u64, seq: u32, payload: Bytes) -> InboundFrame {
    inbound_frame(
        Header::stream(kind, id, seq),
        &rpc_core::frame::EMPTY,
        payload,
    )
}

/// `header`, `metadata` (encoded here) and `payload` as the upper side receives a frame,
/// the header's lengths set to match.
pub(crate) fn inbound_frame(
    mut header: Header,
    metadata: &dyn rpc_core::body::EncodeBody,
    payload: Bytes,
) -> InboundFrame {
    let mut encoded = vec![0u8; metadata.encoded_len()];
    metadata.encode_into(&mut encoded);
    header.metadata_len = encoded.len() as u32;
    header.payload_len = payload.len() as u32;
    InboundFrame {
        header,
        metadata: encoded.into(),
        payload,
    }
}

/// The dispatcher's answers, queued per call (see the module's documentation for the
/// bounds).
impl FrameSender for GrpcConn {
    /// Waits while the connection's queues are at their bound, for a frame that counts
    /// against it.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        let header = frame.header();
        let counted = matches!(header.kind, FrameKind::Message | FrameKind::Messages)
            || (header.kind == FrameKind::Response && header.status == rpc_core::Code::Ok);
        if counted {
            std::task::ready!(self.poll_queue_room(cx))?;
        }
        Poll::Ready(self.send(frame))
    }

    /// Queues the frame whatever the bound (the server's own answers go through
    /// [`FrameSender::poll_send`]).
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let (inbound, framed_payload) = take_frame(frame);
        let header = inbound.header;
        let id = header.call_id;
        let payload = inbound.payload.clone();
        match header.kind {
            FrameKind::WindowUpdate => match WindowUpdate::decode(&payload) {
                Ok(update) => self.add_room(id, &update),
                Err(e) => tracing::warn!(%e, "the dispatcher sent a bad window update"),
            },
            FrameKind::Message => self.queue(id, [Reply::Message(framed_payload)])?,
            FrameKind::Messages => {
                let (mut batch, _) = Batch::parse(payload, u64::MAX)
                    .map_err(|e| Status::internal(format!("a batch of messages: {e}")))?;
                let messages = std::iter::from_fn(|| batch.pop())
                    .map(|message| Reply::Message(framed(&message)));
                self.queue(id, messages)?;
            }
            _ => self.queue(id, [Reply::Frame(inbound, framed_payload)])?,
        }
        Ok(())
    }
}

/// `frame` as it would arrive, and its payload after a gRPC prefix. The metadata, a gap for
/// the prefix, then the payload are written into one buffer: a message is framed for HTTP/2
/// where it is encoded.
pub(crate) fn take_frame(frame: &OutgoingFrame<'_>) -> (InboundFrame, Bytes) {
    let header = *frame.header();
    let metadata_len = header.metadata_len as usize;
    let payload_len = header.payload_len as usize;
    let mut buf = BytesMut::zeroed(metadata_len + PREFIX_LEN + payload_len);
    frame.metadata().encode_into(&mut buf[..metadata_len]);
    frame
        .payload()
        .encode_into(&mut buf[metadata_len + PREFIX_LEN..]);
    put_prefix(
        &mut buf[metadata_len..metadata_len + PREFIX_LEN],
        payload_len,
    );
    let mut metadata = buf.freeze();
    let framed = metadata.split_off(metadata_len);
    let inbound = InboundFrame {
        header,
        metadata,
        payload: framed.slice(PREFIX_LEN..),
    };
    (inbound, framed)
}

impl ServedLink for GrpcConn {
    /// The connection ended: after the shutdown's GOAWAY, HTTP/2 ends it once every
    /// stream's answer was written.
    fn flushed(&self) -> bool {
        self.state.lock().closed.is_some()
    }

    fn close(&self, status: Status) {
        self.close_calls(&status);
        self.phase.send_replace(Phase::Closed);
    }

    /// Tells the connection's task to send GOAWAY.
    fn drain(&self) {
        self.phase.send_if_modified(|phase| {
            let serving = *phase == Phase::Serving;
            if serving {
                *phase = Phase::Draining;
            }
            serving
        });
    }
}

#[cfg(test)]
mod tests;
