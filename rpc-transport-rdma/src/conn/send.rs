//! The send path of a connection: blocking sends for blocking callers, `poll_send` for async
//! code (`Pending` without room, woken on the protocol's `Writable`), header-only control
//! frames that never block, and the stall watch of waiting async senders.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rpc_core::frame::OutgoingFrame;
use rpc_core::{Header, Status};

use super::State;
use super::{large, Conn};
use crate::metrics;
use crate::protocol::SendError;

/// Senders waiting for room, part of the connection's [`State`].
#[derive(Default)]
pub(super) struct Writers {
    /// Bumped on every `Writable`: a blocked sender waits for it to move.
    epoch: u64,
    /// A `Writable` not yet acted on (see [`Conn::upcalls`]).
    pub(super) writable: bool,
    /// Async senders to wake on the next `Writable`.
    pub(super) wakers: Vec<Waker>,
    /// Since when async senders wait for room, with no `Writable` since.
    pub(super) stalled_since: Option<Instant>,
    /// Header-only frames (`Cancel`) waiting for room (see [`Conn::send_control`]).
    pub(super) controls: VecDeque<Header>,
}

impl Writers {
    /// The protocol reported room for more frames.
    pub(super) fn on_writable(&mut self) {
        self.writable = true;
        self.epoch = self.epoch.wrapping_add(1);
    }
}

impl Conn {
    /// Encodes `frame` into a send slot and posts it (or queues it behind earlier frames
    /// waiting for credits). Blocks while the ring and queue are full: for blocking callers
    /// only; async code uses [`Conn::poll_send`].
    pub(crate) fn send(self: &Arc<Self>, frame: &OutgoingFrame<'_>) -> Result<(), Status> {
        let len = frame.len();
        if len > self.limits.max_send_frame && large::is_body_kind(frame.header().kind) {
            return self.send_large(frame);
        }
        let mut blocked_since: Option<Instant> = None;
        loop {
            let mut state = self.state.lock();
            let epoch = state.writers.epoch;
            let posted = self.post_frame(&mut state, frame);
            self.unlock(state);
            match posted {
                Err(SendError::WouldBlock) => {}
                done => return done.map_err(|e| self.send_error(e, len)),
            }
            // Out of slots or credits: make progress ourselves if nobody else is, else wait
            // for the protocol to report `Writable`.
            if self.progress() {
                continue;
            }
            let stalled = *blocked_since.get_or_insert_with(|| {
                count_stall();
                Instant::now()
            });
            if stalled.elapsed() >= self.limits.stall_limit {
                let status = self.stall_status();
                self.close(status.clone());
                return Err(status);
            }
            let mut state = self.state.lock();
            if state.writers.epoch == epoch && !self.is_closed() {
                self.writable.wait_for(&mut state, Duration::from_millis(1));
            }
        }
    }

    /// Sends `frame` from an async task: `Pending` while the ring and queue are full, and
    /// `cx` is woken on the protocol's next `Writable` (or the close). Never blocks.
    pub(crate) fn poll_send(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        frame: &OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        let len = frame.len();
        if len > self.limits.max_send_frame && large::is_body_kind(frame.header().kind) {
            return Poll::Ready(self.send_large(frame));
        }
        let mut state = self.state.lock();
        match self.post_frame(&mut state, frame) {
            Err(SendError::WouldBlock) => {}
            done => {
                self.unlock(state);
                return Poll::Ready(done.map_err(|e| self.send_error(e, len)));
            }
        }
        // Registered under the lock the attempt was made under: no `Writable` can come
        // between them unseen.
        let writers = &mut state.writers;
        if !writers.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            // A task that starts waiting (not one polled again while it waits).
            count_stall();
            writers.wakers.push(cx.waker().clone());
        }
        let watch = writers.stalled_since.is_none();
        if watch {
            writers.stalled_since = Some(Instant::now());
        }
        self.unlock(state);
        let attachment = &self.res.attachment;
        if watch {
            attachment.engine.watch_stall(&self.me);
        }
        attachment.engine.wait_for_room(&attachment.cq, cx);
        Poll::Pending
    }

    /// Whether `frame` can go without waiting: a large body always starts at once; another
    /// frame needs a free send slot now.
    pub(crate) fn can_send_now(&self, frame: &OutgoingFrame<'_>) -> bool {
        (frame.len() > self.limits.max_send_frame && large::is_body_kind(frame.header().kind))
            || self.state.lock().proto.can_reserve_send()
    }

    /// Sends a header-only frame (a client's `Cancel`) without blocking: with no room now it
    /// waits in a queue of at most `control_queue` frames, sent on the next `Writable`; past
    /// the bound it is dropped (the peer then answers a call nobody waits for, and the
    /// answer is ignored).
    pub(crate) fn send_control(&self, frame: &OutgoingFrame<'_>) -> Result<(), Status> {
        let header = *frame.header();
        let mut state = self.state.lock();
        // Behind frames queued earlier, never ahead of them.
        let posted = if state.writers.controls.is_empty() {
            self.post_frame(&mut state, frame)
        } else {
            Err(SendError::WouldBlock)
        };
        let limit = self.limits.control_queue;
        let outcome = match posted {
            Err(SendError::WouldBlock) if state.writers.controls.len() < limit => {
                state.writers.controls.push_back(header);
                Ok(())
            }
            Err(SendError::WouldBlock) => {
                tracing::debug!(peer = %self.peer, call_id = header.call_id, "control queue full; frame dropped");
                Err(Status::resource_exhausted(format!(
                    "{limit} queued control frames wait for credits already"
                )))
            }
            done => done.map_err(|e| self.send_error(e, frame.len())),
        };
        self.unlock(state);
        outcome
    }

    /// Sends what `send_control` queued, in order, while there is room.
    pub(super) fn flush_controls(&self, state: &mut State) {
        while let Some(&header) = state.writers.controls.front() {
            match self.post_frame(state, &OutgoingFrame::control(header)) {
                Err(SendError::WouldBlock) => return,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, %e, "queued control frame not sent");
                    state.writers.controls.clear();
                    return;
                }
                Ok(()) => {
                    state.writers.controls.pop_front();
                }
            }
        }
    }

    /// For the engine's poller: closes the connection if async senders have waited for
    /// room longer than `stall_limit` (a peer that keeps every receive slot, or hands back
    /// no credit, is stuck or hostile). Returns whether it still needs watching.
    pub(crate) fn check_stall(&self) -> bool {
        let Some(since) = self.state.lock().writers.stalled_since else {
            return false;
        };
        if since.elapsed() < self.limits.stall_limit {
            return !self.is_closed();
        }
        self.close(self.stall_status());
        false
    }

    /// Why a connection whose peer stopped taking frames is closed.
    fn stall_status(&self) -> Status {
        Status::unavailable(format!(
            "{} took no frame for {:?}: the peer stopped consuming",
            self.peer, self.limits.stall_limit
        ))
    }

    /// One attempt to encode `frame` into a send slot and post it (or queue it behind
    /// earlier frames waiting for credits). `WouldBlock` when the ring and queue are full.
    fn post_frame(&self, state: &mut State, frame: &OutgoingFrame<'_>) -> Result<(), SendError> {
        let len = frame.len();
        let reservation = match state.proto.reserve_send(len) {
            Ok(reservation) => reservation,
            Err(err) => {
                // A full ring asks for more slots: their memory now, the ring grows once it
                // drains.
                self.back_send_slots(state);
                return Err(err);
            }
        };
        // SAFETY: the state lock is held and the slot was just reserved, so no posted work
        // request reads it.
        let (slot, _) = unsafe { self.res.send.buffer(reservation.target()) };
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            frame.write_to(&mut slot[..len])
        }));
        if let Err(panic) = written {
            // A reservation left behind would block every later send.
            state.proto.abort_send(reservation);
            std::panic::resume_unwind(panic);
        }
        let committed = state.proto.commit_send(reservation, frame.header());
        if committed.is_ok() {
            if let Some(metrics) = metrics::rdma() {
                metrics.sent_by_send.increment(len as u64);
            }
        }
        self.run_actions(state);
        committed
    }

    /// Registers memory for the send slots the protocol wants, if any, and tells it.
    fn back_send_slots(&self, state: &mut State) {
        let wanted = state.proto.send_slots_wanted();
        if wanted == 0 {
            return;
        }
        match self.res.send.back(wanted) {
            Ok(()) => state.proto.back_send_slots(wanted),
            // The ring keeps the slots it has: slower, not broken.
            Err(e) => tracing::warn!(peer = %self.peer, %e, wanted, "growing the send ring"),
        }
    }
}

/// A send starts waiting for credits or a send slot.
fn count_stall() {
    if let Some(metrics) = metrics::rdma() {
        metrics.credit_stalls.increment(1);
    }
}
