//! The completion side of a connection: polling the CQ, feeding the protocol, handing
//! received frames to the upper layer as zero-copy buffers, and the run-to-completion
//! spinning of blocking callers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use rpc_core::frame::InboundFrame;
use rpc_core::stream::Wakes;
use rpc_core::{Drive, Inbound, Status};
use smallvec::SmallVec;

use super::large::{placed_frame, Arrival};
use super::{Arrivals, Conn, State, DELIVERING, DRIVER, RELEASE_BATCH, UPPER_LAYER_LOCKED};
use crate::engine::{Polled, SharedCq};
use crate::protocol::{ProtocolViolation, Received, SendTarget, WorkId};
use crate::verbs::WorkCompletion;

impl Conn {
    /// Polls this connection's completion queue once (shared with other connections, whose
    /// completions go to them) if no other thread is. Returns whether anything completed.
    pub(crate) fn progress(&self) -> bool {
        let attachment = &self.res.attachment;
        attachment.engine.poll(&attachment.cq) == Polled::Some
    }

    /// Whether this connection's queue pair reports to `cq`.
    pub(crate) fn uses_cq(&self, cq: &SharedCq) -> bool {
        std::ptr::eq(Arc::as_ptr(self.cq()), cq)
    }

    /// The CQ the connection's completions arrive on.
    pub(crate) fn cq(&self) -> &Arc<SharedCq> {
        &self.res.attachment.cq
    }

    /// Whether the connection receives from the shared receive queue named `srq_id`.
    pub(crate) fn uses_srq(&self, srq_id: usize) -> bool {
        self.res
            .shared_recv()
            .is_some_and(|commitment| commitment.shared.srq().id() == srq_id)
    }

    /// Processes a run of this connection's completions, in CQ order: feeds them to the
    /// protocol and executes its actions. Returns the frames to hand up (after the caller
    /// dropped the CQ's poll lock, with [`Conn::hand_up`]).
    pub(crate) fn process(&self, completions: &[WorkCompletion]) -> Arrivals {
        // Most batches hold a frame or two: no allocation for them.
        let mut received: Arrivals = SmallVec::new();
        if completions.is_empty() {
            return received;
        }
        let mut state = self.state.lock();
        self.keepalive.active();
        for wc in completions {
            self.on_completion(&mut state, wc, &mut received);
        }
        self.run_actions(&mut state);
        received.extend(
            state
                .large
                .take_arrived()
                .into_iter()
                .map(|(header, buffer)| Arrival::Placed(header, buffer)),
        );
        if !received.is_empty() {
            // Handed up by `hand_up`, which counts it back.
            self.handing_up.fetch_add(1, Ordering::SeqCst);
        }
        received
    }

    /// Hands frames [`Conn::process`] produced to the upper layer, and does what the
    /// protocol left for outside its lock.
    /// Frames go up before a close the same batch brought (a flushed receive after them,
    /// say) runs: they arrived before it.
    pub(crate) fn hand_up(self: &Arc<Self>, received: &mut Arrivals) {
        self.wake_async_writers();
        let _counted = (!received.is_empty()).then(|| HandingUp(self));
        if DELIVERING.get() == self.serial() {
            // A handler on this thread is waiting for send credits: hand these frames to
            // the delivery loop it runs in rather than nesting handlers.
            self.deferred.lock().extend(received.drain(..));
        } else if !received.is_empty() {
            self.deliver(received);
        }
        self.after_state();
    }

    fn on_completion(&self, state: &mut State, wc: &WorkCompletion, received: &mut Arrivals) {
        let Some((_, work)) = WorkId::from_wr_id(wc.wr_id()) else {
            tracing::error!(wr_id = wc.wr_id(), "completion for an unknown work request");
            state.proto.close();
            return;
        };
        if let Err(err) = wc.status() {
            if !err.is_flush() {
                tracing::warn!(peer = %self.peer, ?work, %err, "work request failed");
            }
            if let (WorkId::Recv(buf), Some(commitment)) = (work, self.res.shared_recv()) {
                commitment.shared.repost(buf);
            }
            if let WorkId::Invalidate(grant) = work {
                state.large.invalidation_failed(grant);
            }
            state.proto.on_completion_error(work, &err.to_string());
            return;
        }
        let outcome = match work {
            WorkId::Send(slot) => state.proto.on_send_complete(SendTarget::Ring(slot)),
            WorkId::Control => state.proto.on_send_complete(SendTarget::Control),
            WorkId::Recv(entry) => {
                let outcome = self
                    .on_recv(state, entry, wc.byte_len())
                    .map(|frame| received.extend(frame.map(|rx| Arrival::Slot(rx, entry))));
                self.grow_window(state);
                outcome
            }
            WorkId::Write(transfer) => state.proto.on_write_complete(transfer),
            WorkId::Bind(grant) => state.proto.on_bind_complete(grant),
            WorkId::Invalidate(grant) => state.proto.on_invalidated(grant),
            WorkId::Probe => {
                self.keepalive.answered();
                state.proto.on_probe_complete();
                Ok(())
            }
        };
        if let Err(violation) = outcome {
            tracing::warn!(peer = %self.peer, %violation, "peer violated the protocol");
        }
    }

    /// A receive into `entry` (a ring slot, or a shared receive queue's buffer) completed.
    fn on_recv(
        &self,
        state: &mut State,
        entry: u32,
        byte_len: u32,
    ) -> Result<Option<Received>, ProtocolViolation> {
        // SAFETY: the receive into `entry` just completed; it is not posted again before the
        // protocol is done with it: a ring slot by the `PostRecv` that follows its release, a
        // shared buffer below (the frame was consumed or refused) or once released.
        let bytes = unsafe { self.res.recv_entry(entry) };
        if let Some(metrics) = crate::metrics::rdma() {
            metrics.received.increment(u64::from(byte_len));
        }
        let Some(commitment) = self.res.shared_recv() else {
            return state.proto.on_recv_complete(entry, byte_len, bytes);
        };
        let outcome = state.proto.on_shared_recv_complete(byte_len, bytes);
        match &outcome {
            Ok(Some(rx)) => state.shared_bufs[rx.slot as usize] = entry,
            // Consumed (or refused): the buffer goes back before any credit the protocol
            // returns for it is posted (the actions run after this batch).
            Ok(None) | Err(_) => commitment.shared.repost(entry),
        }
        outcome
    }

    /// Grows the receive window as far as the protocol wants and the memory allows: all of
    /// it with the connection's own ring (registered, and its receive queue sized for every
    /// slot; the `PostRecv`s come first), what the pool grants with a shared receive queue.
    fn grow_window(&self, state: &mut State) {
        let wanted = state.proto.window_wanted();
        if wanted == 0 {
            return;
        }
        let Some(commitment) = self.res.shared_recv() else {
            state.proto.grow_window(wanted);
            return;
        };
        let granted = commitment.shared.grow(wanted);
        let grown = state.proto.grow_window(granted);
        commitment.shared.give_back(granted - grown);
    }

    /// Hands `received` to the upper layer. Borrowed, and drained in place: a batch is a
    /// few hundred bytes, and every move of it is a copy. A frame the upper layer says ends
    /// the connection closes it once the batch is handed up.
    fn deliver(self: &Arc<Self>, received: &mut Arrivals) {
        let Some(inbound) = self.inbound() else {
            return;
        };
        let outer = DELIVERING.replace(self.serial());
        // A stream's reader wakes once to all of its messages in the batch.
        let mut wakes = Wakes::new();
        let mut ended = None;
        self.deliver_batch(&*inbound, received.drain(..), &mut wakes, &mut ended);
        loop {
            let deferred = std::mem::take(&mut *self.deferred.lock());
            if deferred.is_empty() {
                break;
            }
            self.deliver_batch(&*inbound, deferred, &mut wakes, &mut ended);
        }
        DELIVERING.set(outer);
        wakes.wake_all();
        if let Some(status) = ended {
            self.close(status);
        }
    }

    fn deliver_batch(
        self: &Arc<Self>,
        inbound: &dyn Inbound,
        received: impl IntoIterator<Item = Arrival>,
        wakes: &mut Wakes,
        ended: &mut Option<Status>,
    ) {
        let mut hand_up = |frame: InboundFrame, wakes: &mut Wakes| {
            if let Err(status) = inbound.on_frame(frame, wakes) {
                ended.get_or_insert(status);
            }
        };
        for arrival in received {
            let (rx, entry) = match arrival {
                Arrival::Slot(rx, entry) => (rx, entry),
                Arrival::Placed(header, buffer) => {
                    hand_up(placed_frame(header, buffer), wakes);
                    continue;
                }
            };
            let frame_bytes = self.frame_bytes(&rx, entry);
            // Most frames carry no metadata: an empty view needs no reference to the slot.
            let metadata = if rx.header.metadata_len == 0 {
                Bytes::new()
            } else {
                frame_bytes.slice(rx.metadata_range())
            };
            let frame = InboundFrame {
                header: rx.header,
                metadata,
                payload: frame_bytes.slice(rx.payload_range()),
            };
            hand_up(frame, wakes);
            // Held until the upper layer is done with the frame: a server whose handler ran
            // inline has sent its response by now, so the slot's release (re-post, credit
            // bookkeeping) happens after the response left, not before.
            drop(frame_bytes);
        }
    }

    /// The bytes of a received frame for the upper layer: a zero-copy view that keeps the
    /// slot while the protocol lends it, else a copy, and the slot goes back at once.
    fn frame_bytes(self: &Arc<Self>, rx: &Received, entry: u32) -> Bytes {
        let owner = RecvSlot {
            conn: Arc::clone(self),
            slot: rx.slot,
            entry,
            len: rx.len as usize,
        };
        if rx.lend {
            Bytes::from_owner(owner)
        } else {
            // Dropping the owner releases the slot, after the copy.
            Bytes::copy_from_slice(owner.as_ref())
        }
    }

    /// The upper layer dropped the last view of a received frame.
    ///
    /// Re-posting its slot (state lock, protocol, RECV) costs microseconds under emulation.
    /// A thread that drives this connection's CQ (a poller delivering frames, a blocking
    /// caller decoding its response) leaves it for a moment off the critical path: its
    /// next send once the frame is posted, or its next poll that finds the CQ empty. The
    /// caller thus gets its response first and re-posts once its next request left.
    /// Holding slots back only delays their credits (re-posting is what grants them, so no
    /// RNR is possible); at most [`RELEASE_BATCH`] wait, and a poller that looks after a
    /// quiet spell releases them too. Other threads (async handlers, frames kept by the
    /// application) release at once: nothing says they will come back.
    fn release_recv(&self, slot: u32, entry: u32) {
        let serial = self.serial();
        if DELIVERING.get() != serial && DRIVER.get() != serial {
            let outer = UPPER_LAYER_LOCKED.replace(true);
            {
                let mut state = self.state.lock();
                self.release_one(&mut state, slot, entry);
                self.run_actions(&mut state);
            }
            // Buffers are dropped wherever the upper layer drops them, possibly under its
            // locks: no callbacks from here.
            self.after_state();
            UPPER_LAYER_LOCKED.set(outer);
            return;
        }
        let due = {
            let mut released = self.released.lock();
            released.push((slot, entry));
            released.len() >= RELEASE_BATCH
        };
        if !self.has_released.swap(true, Ordering::AcqRel) {
            // The next empty poll of the engine releases them, if nothing else did before.
            self.res.attachment.engine.call_attention(&self.me);
        }
        if due {
            // Buffers are dropped wherever the upper layer drops them, possibly under its
            // locks: no callbacks from here.
            let outer = UPPER_LAYER_LOCKED.replace(true);
            self.release_deferred_now();
            UPPER_LAYER_LOCKED.set(outer);
        }
    }

    /// Re-posts the slots whose release waited.
    pub(super) fn release_deferred_now(&self) {
        {
            let mut state = self.state.lock();
            self.release_deferred(&mut state);
        }
        self.after_state();
    }

    /// Re-posts the slots whose release waited, under the state lock (taken before the
    /// list's, never the other way round).
    pub(super) fn release_deferred(&self, state: &mut State) {
        if !(self.has_released.load(Ordering::Acquire)
            && self.has_released.swap(false, Ordering::AcqRel))
        {
            return;
        }
        let slots: SmallVec<[(u32, u32); RELEASE_BATCH]> = self.released.lock().drain(..).collect();
        for (slot, entry) in slots {
            self.release_one(state, slot, entry);
        }
        self.run_actions(state);
    }

    /// The upper layer is done with `slot`, received into `entry`: a ring slot is re-posted
    /// by the protocol's `PostRecv`; a shared buffer is re-posted here, before the
    /// protocol commits the slot again (or gives it back, when the pool is short).
    fn release_one(&self, state: &mut State, slot: u32, entry: u32) {
        let released = match self.res.shared_recv() {
            None => state.proto.release_recv(slot).map(drop),
            Some(commitment) => {
                let shared = &commitment.shared;
                shared.repost(entry);
                state
                    .proto
                    .release_shared(slot, shared.shrinking())
                    .map(|given| shared.give_back(u32::from(given)))
            }
        };
        if let Err(violation) = released {
            tracing::error!(%violation, "releasing a receive slot");
        }
    }

    /// Spins on the CQ for up to `budget` (`None`: until something arrives) on the caller's
    /// thread: the run-to-completion path of blocking calls (see [`Engine::spin`]).
    ///
    /// [`Engine::spin`]: crate::engine::Engine::spin
    /// One look at the CQ for an async call waiting for its response (see the engine's
    /// drive lease).
    pub(crate) fn drive(&self, cx: &mut Context<'_>, driving: &mut bool) -> Drive {
        DRIVER.set(self.serial());
        let attachment = &self.res.attachment;
        attachment.engine.drive(&attachment.cq, cx, driving)
    }

    /// Gives back the drive lease of an async call that ended holding it.
    pub(crate) fn stop_driving(&self) {
        let attachment = &self.res.attachment;
        attachment.engine.release(&attachment.cq);
    }

    pub(crate) fn spin_progress(&self, budget: Option<Duration>) -> bool {
        DRIVER.set(self.serial());
        let attachment = &self.res.attachment;
        attachment
            .engine
            .spin(&attachment.cq, budget, || self.is_closed())
    }
}

/// A batch [`Conn::process`] counted as being handed up; the last one runs a close that
/// waited for it (even if a handler panics on the way).
struct HandingUp<'a>(&'a Arc<Conn>);

impl Drop for HandingUp<'_> {
    fn drop(&mut self) {
        let last = self.0.handing_up.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && self.0.close_deferred.swap(false, Ordering::SeqCst) {
            self.0.report_dropped_and_close();
        }
    }
}

/// Keeps a receive slot out of the ring while the upper layer reads the frame in it; the
/// `Bytes` views of metadata and payload share it and release the slot when the last drops.
struct RecvSlot {
    conn: Arc<Conn>,
    slot: u32,
    /// Where it landed: the ring slot, or the shared receive queue's buffer.
    entry: u32,
    len: usize,
}

impl AsRef<[u8]> for RecvSlot {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the entry stays un-posted until this owner's drop releases it.
        let bytes = unsafe { self.conn.res.recv_entry(self.entry) };
        &bytes[..self.len]
    }
}

impl Drop for RecvSlot {
    fn drop(&mut self) {
        self.conn.release_recv(self.slot, self.entry);
    }
}
