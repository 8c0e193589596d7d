//! One HTTP/2 connection served as gRPC, as the dispatcher sees it: the frames it hands
//! the dispatcher for each call, and the dispatcher's answers (it is the connection's
//! [`ReplySink`](rpc_core::server::ReplySink)), queued per call until HTTP/2 takes them.
//!
//! The connection plays our protocol's client for the dispatcher, flow control included:
//! a call's request messages go only while the dispatcher's stream window has room, and
//! its response messages are returned to the dispatcher's window only as the HTTP/2 peer
//! takes them. A call's queue thus holds at most the initial stream window
//! ([`INITIAL_WINDOW`]: 64 messages, 256 KiB, plus one message over), and a client that
//! reads slowly slows its handler, through HTTP/2's own windows.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::server::{Dispatcher, Requests, ServedLink};
use rpc_core::stream::batch::Batch;
use rpc_core::stream::{Wakes, WindowUpdate, INITIAL_WINDOW};
use rpc_core::{FrameKind, FrameSender, Header, Inbound, Status};
use tokio::sync::watch;

use crate::codec::{framed, put_prefix, PREFIX_LEN};

/// How far a connection is from its end, as its task is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Serving,
    /// Send GOAWAY: no new streams, running ones finish.
    Draining,
    /// End the connection now.
    Closed,
}

/// What the dispatcher sent a call, as HTTP/2 will carry it.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A response message after its gRPC prefix.
    Message(Bytes),
    /// Any other frame of the call (headers, a response, trailers), and its payload after
    /// a gRPC prefix (a unary response's message as HTTP/2 carries it).
    Frame(InboundFrame, Bytes),
    /// The call failed on this side (the client's request was bad), or the connection
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
    calls: HashMap<u64, CallState>,
    next_id: u64,
    closed: Option<Status>,
}

/// One served HTTP/2 connection.
pub(crate) struct GrpcConn {
    pub(crate) dispatcher: Arc<Dispatcher>,
    /// `grpc://addr` of the client, for messages.
    pub(crate) peer: String,
    state: Mutex<State>,
    /// The dispatcher's side, set once the connection's dispatch exists (it needs this
    /// connection as its sink first).
    requests: OnceLock<Arc<Requests>>,
    phase: watch::Sender<Phase>,
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
    pub(crate) fn new(dispatcher: Arc<Dispatcher>, peer: String) -> Arc<GrpcConn> {
        Arc::new(GrpcConn {
            dispatcher,
            peer,
            state: Mutex::new(State::default()),
            requests: OnceLock::new(),
            phase: watch::Sender::new(Phase::Serving),
        })
    }

    pub(crate) fn set_requests(&self, requests: Arc<Requests>) {
        let _ = self.requests.set(requests);
    }

    /// What the connection's task watches.
    pub(crate) fn phase(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Tells the connection's task to send GOAWAY.
    pub(crate) fn go_away(&self) {
        self.phase.send_if_modified(|phase| {
            let serving = *phase == Phase::Serving;
            if serving {
                *phase = Phase::Draining;
            }
            serving
        });
    }

    /// A new call; `UNAVAILABLE` once the connection ended.
    pub(crate) fn open_call(&self) -> Result<u64, Status> {
        let mut state = self.state.lock();
        if let Some(status) = &state.closed {
            return Err(status.clone());
        }
        state.next_id += 1;
        let id = state.next_id;
        state.calls.insert(id, CallState::new());
        Ok(id)
    }

    /// Hands `frame` to the dispatcher (never under this connection's lock: a handler run
    /// inline answers through [`FrameSender::send`] before this returns).
    pub(crate) fn deliver(&self, frame: InboundFrame) {
        let Some(requests) = self.requests.get() else {
            return;
        };
        let mut wakes = Wakes::new();
        if let Err(status) = requests.on_frame(frame, &mut wakes) {
            tracing::debug!(%status, "the dispatcher refused a frame");
        }
    }

    /// The next thing the dispatcher sent call `id`; a response message taken counts as
    /// consumed, and what was consumed goes back to the dispatcher's window once it is
    /// half the initial window or nothing more waits.
    pub(crate) fn poll_reply(&self, id: u64, cx: &mut Context<'_>) -> Poll<Reply> {
        let (reply, update) = {
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
            if let Reply::Message(message) = &reply {
                let consumed = &mut call.consumed;
                consumed.messages += 1;
                consumed.bytes += (message.len() - PREFIX_LEN) as u64;
                if consumed.messages >= INITIAL_WINDOW.messages / 2
                    || consumed.bytes >= INITIAL_WINDOW.bytes / 2
                    || call.replies.is_empty()
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
            (reply, update)
        };
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
        let call = self.state.lock().calls.remove(&id);
        let Some(mut call) = call else {
            return;
        };
        call.wake_both().into_iter().flatten().for_each(Waker::wake);
        if cancel {
            self.deliver(stream_frame(FrameKind::Cancel, id, 0, Bytes::new()));
        }
    }

    /// Fails every call with `status` and refuses new ones; the connection is over.
    pub(crate) fn close_calls(&self, status: &Status) {
        let wakes: Vec<Waker> = {
            let mut state = self.state.lock();
            if state.closed.is_none() {
                state.closed = Some(status.clone());
            }
            state
                .calls
                .values_mut()
                .flat_map(|call| {
                    call.failed.get_or_insert_with(|| status.clone());
                    call.wake_both()
                })
                .flatten()
                .collect()
        };
        wakes.into_iter().for_each(Waker::wake);
    }

    /// The connection ended: every call fails with `status`, and the dispatcher stops its
    /// handlers.
    pub(crate) fn on_closed(&self, status: Status) {
        self.close_calls(&status);
        if let Some(requests) = self.requests.get() {
            requests.on_closed(status);
        }
    }

    /// Queues `reply` for call `id`, if the call is still on.
    fn queue(&self, id: u64, replies: impl IntoIterator<Item = Reply>) -> Result<(), Status> {
        let reader = {
            let mut state = self.state.lock();
            if let Some(status) = &state.closed {
                return Err(status.clone());
            }
            let Some(call) = state.calls.get_mut(&id) else {
                // Ended or cancelled here: what comes after is of no use.
                return Ok(());
            };
            call.replies.extend(replies);
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
/// dispatcher receives it.
pub(crate) fn stream_frame(kind: FrameKind, id: u64, seq: u32, payload: Bytes) -> InboundFrame {
    let mut header = Header::stream(kind, id, seq);
    header.payload_len = payload.len() as u32;
    InboundFrame {
        header,
        metadata: Bytes::new(),
        payload,
    }
}

/// The dispatcher's answers: queued per call, never waiting (a call's queue is bounded by
/// the stream window this side returns, see the module's documentation).
impl FrameSender for GrpcConn {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let header = *frame.header();
        let id = header.call_id;
        let metadata_len = header.metadata_len as usize;
        let payload_len = header.payload_len as usize;
        // The metadata, a gap for the gRPC prefix, then the payload: a message is framed
        // for HTTP/2 where it is written.
        let mut buf = BytesMut::zeroed(metadata_len + PREFIX_LEN + payload_len);
        frame.metadata().encode_into(&mut buf[..metadata_len]);
        frame
            .payload()
            .encode_into(&mut buf[metadata_len + PREFIX_LEN..]);
        put_prefix(
            &mut buf[metadata_len..metadata_len + PREFIX_LEN],
            payload_len,
        );
        let mut buf = buf.freeze();
        let framed_payload = buf.split_off(metadata_len);
        let payload = framed_payload.slice(PREFIX_LEN..);
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
            _ => {
                let inbound = InboundFrame {
                    header,
                    metadata: buf,
                    payload,
                };
                self.queue(id, [Reply::Frame(inbound, framed_payload)])?;
            }
        }
        Ok(())
    }
}

impl ServedLink for GrpcConn {
    /// Every call's response was taken by HTTP/2.
    fn flushed(&self) -> bool {
        let state = self.state.lock();
        state.closed.is_some() || state.calls.is_empty()
    }

    fn close(&self, status: Status) {
        self.close_calls(&status);
        self.phase.send_replace(Phase::Closed);
    }
}
