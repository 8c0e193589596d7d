//! The state of one streaming call shared by the receive path (which feeds it frames) and
//! the tasks or threads that read and write its messages.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::thread::Thread;

use bytes::Bytes;
use parking_lot::Mutex;

use super::flow::{Inbox, Item, SendWindow, Single, StreamError};
use super::is_message_frame;
use super::{Window, WindowUpdate, INITIAL_WINDOW};
use crate::frame::InboundFrame;
use crate::header::FrameKind;
use crate::transport::{Waiter, Wakes};
use crate::MetadataMap;
use crate::{Code, Status};

/// How the peer ended its side of a stream.
#[derive(Debug, Clone)]
pub(crate) enum StreamEnd {
    /// The client half-closed.
    HalfClose,
    /// The server's trailers: the call's status and trailing metadata.
    Trailers {
        status: Status,
        metadata: MetadataMap,
    },
}

#[derive(Debug)]
struct State {
    inbox: Inbox<StreamEnd>,
    reader: Waiter,
    send: SendWindow,
    writer: Waiter,
    /// The call failed (reset, deadline, connection lost, a broken rule): both directions
    /// end with this status.
    failed: Option<Status>,
    /// The reader is gone: arriving messages are dropped instead of buffered.
    reader_gone: bool,
    /// The code of the server's trailers, once they came.
    trailers: Option<Code>,
}

/// One streaming call's shared state (see the module documentation).
#[derive(Debug)]
pub(crate) struct StreamShared {
    state: Mutex<State>,
    /// `state.failed` is set: read without the lock by a sender between messages.
    has_failed: AtomicBool,
}

/// What the reader takes from a stream.
pub(crate) enum Next {
    Message(Bytes),
    End(StreamEnd),
    Failed(Status),
}

impl StreamShared {
    /// A stream receiving into `window` messages of at most `max_message` bytes.
    pub(crate) fn new(window: Window, max_message: usize) -> Self {
        StreamShared {
            state: Mutex::new(State {
                inbox: Inbox::new(window, max_message),
                reader: Waiter::None,
                send: SendWindow::new(INITIAL_WINDOW),
                writer: Waiter::None,
                failed: None,
                reader_gone: false,
                trailers: None,
            }),
            has_failed: AtomicBool::new(false),
        }
    }

    /// Room beyond the initial window to grant the peer when the stream opens.
    pub(crate) fn initial_update(&self) -> Option<WindowUpdate> {
        self.state.lock().inbox.initial_update()
    }

    /// Feeds a stream frame from the peer; the wakeup of a waiting reader or writer is held
    /// in `wakes`. A frame that breaks the stream's rules fails the stream and is returned
    /// as the error, for the caller to end the call with.
    pub(crate) fn on_frame(&self, frame: InboundFrame, wakes: &mut Wakes) -> Result<(), Status> {
        let header = frame.header;
        if is_message_frame(header.kind) {
            return self.on_messages(std::iter::once(frame), wakes);
        }
        let mut state = self.state.lock();
        if state.failed.is_some() {
            return Ok(());
        }
        let fed = match header.kind {
            FrameKind::HalfClose => state.inbox.on_end(header.seq(), StreamEnd::HalfClose),
            FrameKind::Trailers => {
                // An error's metadata is its status's too (less the details); an error whose
                // metadata cannot be read keeps its code and message.
                let (status, metadata) = match (header.status, frame.decode_metadata()) {
                    (Code::Ok, Ok(metadata)) => (Status::new(Code::Ok, ""), metadata),
                    (Code::Ok, Err(e)) => {
                        return Err(
                            self.fail_locked(state, Status::internal(format!("trailers {e}")))
                        )
                    }
                    (code, Ok(metadata)) => {
                        let status = Status::from_wire(code, &frame.payload, metadata);
                        let metadata = status.metadata().clone();
                        (status, metadata)
                    }
                    (_, Err(_)) => (frame.status(), MetadataMap::new()),
                };
                let code = status.code();
                let fed = state
                    .inbox
                    .on_end(header.seq(), StreamEnd::Trailers { status, metadata });
                if fed.is_ok() {
                    state.trailers = Some(code);
                }
                fed
            }
            FrameKind::WindowUpdate => {
                let updated = WindowUpdate::decode(&frame.payload)
                    .and_then(|update| state.send.on_update(update));
                if updated.is_ok() {
                    wakes.defer(&mut state.writer);
                }
                return updated.map_err(|e| self.fail_locked(state, violation(e)));
            }
            kind => {
                tracing::debug!(?kind, "not a stream frame");
                Ok(())
            }
        };
        match fed {
            Ok(()) => {
                wakes.defer(&mut state.reader);
                Ok(())
            }
            Err(e) => Err(self.fail_locked(state, violation(e))),
        }
    }

    /// Feeds a run of `Message` and `Messages` frames of this stream under one lock (the messages of one
    /// socket read, say); the reader's wakeup is held in `wakes`. The first message that
    /// breaks the stream's rules fails the stream, the rest of the run is dropped, and the
    /// status is returned as [`StreamShared::on_frame`] does.
    pub(crate) fn on_messages(
        &self,
        frames: impl IntoIterator<Item = InboundFrame>,
        wakes: &mut Wakes,
    ) -> Result<(), Status> {
        let mut state = self.state.lock();
        if state.failed.is_some() || state.reader_gone {
            return Ok(());
        }
        let mut fed = false;
        for frame in frames {
            let seq = frame.header.seq();
            let fed_one = match frame.header.kind {
                FrameKind::Messages => state.inbox.on_batch(seq, frame.payload),
                kind => {
                    debug_assert_eq!(kind, FrameKind::Message);
                    state.inbox.on_message(seq, frame.payload)
                }
            };
            if let Err(e) = fed_one {
                return Err(self.fail_locked(state, violation(e)));
            }
            fed = true;
        }
        if fed {
            wakes.defer(&mut state.reader);
        }
        Ok(())
    }

    /// Ends the stream with `status` in both directions (a no-op once it failed).
    pub(crate) fn fail(&self, status: Status) {
        self.fail_locked(self.state.lock(), status);
    }

    /// [`StreamShared::fail`] under the lock; returns `status` for the caller to end the
    /// call with.
    fn fail_locked(&self, mut state: parking_lot::MutexGuard<'_, State>, status: Status) -> Status {
        if state.failed.is_none() {
            state.failed = Some(status.clone());
            self.has_failed.store(true, Ordering::Release);
        }
        state.reader.wake();
        state.writer.wake();
        status
    }

    /// How the call ended, as far as this stream knows: the status it failed with, or its
    /// trailers' code once they came.
    pub(crate) fn outcome(&self) -> Option<Code> {
        let state = self.state.lock();
        state.failed.as_ref().map(Status::code).or(state.trailers)
    }

    /// Whether the stream failed or the peer's end was taken: nothing more comes.
    pub(crate) fn is_over(&self) -> bool {
        let state = self.state.lock();
        state.failed.is_some() || state.inbox.finished()
    }

    /// Moves a batch of items for the reader into `into` (messages in order, then the end
    /// or the failure; [`Inbox::drain_ready`]), after counting the `taken` messages and
    /// bytes it used of earlier batches; `Pending` with `cx` registered when there is none.
    /// Also the room to return now, if enough was used. A reader taking batches locks the
    /// stream once per batch, not once per message, so the receive path rarely finds the
    /// lock taken.
    pub(crate) fn poll_batch(
        &self,
        cx: &Context<'_>,
        taken: (u64, u64),
        into: &mut VecDeque<Item<StreamEnd>>,
    ) -> (Poll<Option<Status>>, Option<WindowUpdate>) {
        let mut state = self.state.lock();
        state.inbox.consumed(taken.0, taken.1);
        state.inbox.drain_ready(into);
        let next = if !into.is_empty() {
            Poll::Ready(None)
        } else if let Some(status) = &state.failed {
            Poll::Ready(Some(status.clone()))
        } else {
            state.reader.set_task(cx);
            Poll::Pending
        };
        (next, state.inbox.take_update())
    }

    /// The next item for a blocked reader thread, or `None` with `thread` registered to be
    /// unparked when one may be there; and the room to return, as [`Self::poll_next`].
    pub(crate) fn next_or_park_on(&self, thread: &Thread) -> (Option<Next>, Option<WindowUpdate>) {
        let mut state = self.state.lock();
        let next = take(&mut state);
        if next.is_none() && !state.reader.is_thread() {
            state.reader = Waiter::Thread(thread.clone());
        }
        (next, state.inbox.take_update())
    }

    /// The reader went away: messages that arrive from now on are dropped.
    pub(crate) fn reader_gone(&self) {
        let mut state = self.state.lock();
        state.reader_gone = true;
        state.reader = Waiter::None;
        // Frees what is buffered (views into transport memory among it).
        state.inbox.clear();
    }

    /// Moves the room the peer granted into `room`, the sender's own window, which it
    /// spends without this lock. `Ready(Ok)` when `room` then lets a message go, `Err` once
    /// the stream failed, `Pending` with `cx` registered (woken by the next window update)
    /// otherwise.
    pub(crate) fn poll_claim(
        &self,
        cx: &Context<'_>,
        room: &mut SendWindow,
    ) -> Poll<Result<(), Status>> {
        let mut state = self.state.lock();
        match claim(&mut state, room) {
            Some(ready) => Poll::Ready(ready),
            None => {
                state.writer.set_task(cx);
                Poll::Pending
            }
        }
    }

    /// Like [`StreamShared::poll_claim`] for a blocked writer thread: `None` with `thread`
    /// registered.
    pub(crate) fn claim_or_park_on(
        &self,
        thread: &Thread,
        room: &mut SendWindow,
    ) -> Option<Result<(), Status>> {
        let mut state = self.state.lock();
        let ready = claim(&mut state, room);
        if ready.is_none() {
            state.writer = Waiter::Thread(thread.clone());
        }
        ready
    }

    /// Whether the stream failed; no lock taken (a sender checks it before each message).
    pub(crate) fn has_failed(&self) -> bool {
        self.has_failed.load(Ordering::Acquire)
    }

    /// The status the stream failed with, if it did.
    pub(crate) fn failed(&self) -> Option<Status> {
        self.state.lock().failed.clone()
    }
}

/// Moves the stream's room into `room`: whether a message may go (`None`: not yet).
fn claim(state: &mut State, room: &mut SendWindow) -> Option<Result<(), Status>> {
    if let Some(status) = &state.failed {
        return Some(Err(status.clone()));
    }
    room.absorb(state.send.take());
    room.ready().then_some(Ok(()))
}

fn take(state: &mut State) -> Option<Next> {
    if let Some(single) = state.inbox.pop_single() {
        return Some(match single {
            Single::Read(payload) | Single::Message(payload) => Next::Message(payload),
            Single::End(end) => Next::End(end),
        });
    }
    state.failed.clone().map(Next::Failed)
}

/// The status a stream fails with when the peer broke its rules.
fn violation(e: StreamError) -> Status {
    Status::new(Code::Internal, format!("stream protocol violation: {e}"))
}
