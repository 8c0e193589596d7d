//! The send path of a connection: blocking sends for blocking callers, `poll_send` for async
//! code (`Pending` without room, woken on the protocol's `Writable`), header-only control
//! frames that never block, and the stall watch of waiting async senders.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rpc_core::frame::OutgoingFrame;
use rpc_core::Status;

use super::State;
use super::{large, Conn};
use crate::metrics;
use crate::protocol::SendError;

impl Conn {
    /// Encodes `frame` into a send slot and posts it (or queues it behind earlier frames
    /// waiting for credits). Blocks while the ring and queue are full: for blocking callers
    /// only; async code uses [`Conn::poll_send`].
    pub(crate) fn send(self: &Arc<Self>, frame: &OutgoingFrame<'_>) -> Result<(), Status> {
        let len = frame.len();
        if len > self.max_send_frame && large::is_body_kind(frame.header().kind) {
            return self.send_large(frame);
        }
        let mut blocked_since: Option<Instant> = None;
        loop {
            let epoch = self.writable_epoch.load(Ordering::Acquire);
            match self.try_send(frame) {
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
            if stalled.elapsed() >= self.stall_limit {
                let status = self.stall_status();
                self.close(status.clone());
                return Err(status);
            }
            let mut guard = self.writable_lock.lock();
            if self.writable_epoch.load(Ordering::Acquire) == epoch && !self.is_closed() {
                self.writable.wait_for(&mut guard, Duration::from_millis(1));
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
        if len > self.max_send_frame && large::is_body_kind(frame.header().kind) {
            return Poll::Ready(self.send_large(frame));
        }
        match self.try_send(frame) {
            Err(SendError::WouldBlock) => {}
            done => return Poll::Ready(done.map_err(|e| self.send_error(e, len))),
        }
        {
            let mut wakers = self.write_wakers.lock();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                // A task that starts waiting (not one polled again while it waits).
                count_stall();
                wakers.push(cx.waker().clone());
            }
        }
        self.has_wakers.store(true, Ordering::Release);
        self.watch_stall();
        let attachment = &self.res.attachment;
        attachment.engine.wait_for_room(&attachment.cq, cx);
        // Again: `Writable` may have come between the attempt and the registration.
        match self.try_send(frame) {
            Err(SendError::WouldBlock) => Poll::Pending,
            done => Poll::Ready(done.map_err(|e| self.send_error(e, len))),
        }
    }

    /// Sends a header-only frame (a client's `Cancel`) without blocking: with no room now it
    /// waits in a queue of at most `control_queue_limit` frames, sent on the next
    /// `Writable`; past the bound it is dropped (the peer then answers a call nobody waits
    /// for, and the answer is ignored).
    pub(crate) fn send_control(&self, frame: &OutgoingFrame<'_>) -> Result<(), Status> {
        let header = *frame.header();
        let outcome = {
            let mut queued = self.queued_controls.lock();
            // Behind frames queued earlier, never ahead of them.
            let posted = if queued.is_empty() {
                self.post_frame(frame)
            } else {
                Err(SendError::WouldBlock)
            };
            match posted {
                Err(SendError::WouldBlock) if queued.len() < self.control_queue_limit => {
                    queued.push_back(header);
                    Ok(())
                }
                Err(SendError::WouldBlock) => {
                    tracing::debug!(peer = %self.peer, call_id = header.call_id, "control queue full; frame dropped");
                    Err(Status::resource_exhausted(format!(
                        "{} queued control frames wait for credits already",
                        self.control_queue_limit
                    )))
                }
                done => done.map_err(|e| self.send_error(e, frame.len())),
            }
        };
        // Outside the queue's lock: this may flush the queue.
        self.after_state();
        outcome
    }

    /// Sends what `send_control` queued, in order, while there is room. Called from
    /// `after_state`, so it posts without running `after_state` itself.
    pub(super) fn flush_controls(&self) {
        let mut queued = self.queued_controls.lock();
        while let Some(header) = queued.front() {
            match self.post_frame(&OutgoingFrame::control(*header)) {
                Err(SendError::WouldBlock) => return,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, %e, "queued control frame not sent");
                    queued.clear();
                    return;
                }
                Ok(()) => {
                    queued.pop_front();
                }
            }
        }
    }

    /// An async sender waits for room: from now on, unless a `Writable` comes within
    /// `stall_limit`, the engine's poller closes the connection (a peer that keeps every
    /// receive slot, or hands back no credit, is stuck or hostile).
    fn watch_stall(&self) {
        let mut since = self.stalled_since.lock();
        if since.is_none() {
            *since = Some(Instant::now());
            drop(since);
            self.res.attachment.engine.watch_stall(&self.me);
        }
    }

    /// For the engine's poller: closes the connection if async senders have waited for
    /// room longer than `stall_limit`. Returns whether it still needs watching.
    pub(crate) fn check_stall(&self) -> bool {
        let Some(since) = *self.stalled_since.lock() else {
            return false;
        };
        if since.elapsed() < self.stall_limit {
            return !self.is_closed();
        }
        self.close(self.stall_status());
        false
    }

    /// Why a connection whose peer stopped taking frames is closed.
    fn stall_status(&self) -> Status {
        Status::unavailable(format!(
            "{} took no frame for {:?}: the peer stopped consuming",
            self.peer, self.stall_limit
        ))
    }

    /// One attempt to encode `frame` into a send slot and post it (or queue it behind
    /// earlier frames waiting for credits). `WouldBlock` when the ring and queue are full.
    pub(super) fn try_send(&self, frame: &OutgoingFrame<'_>) -> Result<(), SendError> {
        let posted = self.post_frame(frame);
        self.after_state();
        posted
    }

    /// [`Conn::try_send`] without the work left for after the state lock; the caller runs
    /// [`Conn::after_state`] once it holds no other lock of this connection.
    fn post_frame(&self, frame: &OutgoingFrame<'_>) -> Result<(), SendError> {
        let len = frame.len();
        let mut state = self.state.lock();
        let reservation = match state.proto.reserve_send(len) {
            Ok(reservation) => reservation,
            Err(err) => {
                // A full ring asks for more slots: their memory now, the ring grows once it
                // drains.
                self.back_send_slots(&mut state);
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
            drop(state);
            std::panic::resume_unwind(panic);
        }
        let committed = state.proto.commit_send(reservation, frame.header());
        if committed.is_ok() {
            if let Some(metrics) = metrics::rdma() {
                metrics.sent_by_send.increment(len as u64);
            }
        }
        self.run_actions(&mut state);
        // The frame is on its way: a good moment for slot releases that waited, under the
        // lock already held. Their credits ride on the next frame.
        self.release_deferred(&mut state);
        committed
    }

    /// Registers memory for the send slots the protocol wants, if any, and tells it.
    pub(super) fn back_send_slots(&self, state: &mut State) {
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
