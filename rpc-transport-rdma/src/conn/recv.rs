//! The completion side of a connection: polling the CQ, feeding the protocol, handing
//! received frames to the upper layer as zero-copy buffers, and the run-to-completion
//! spinning of blocking callers.

use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::MutexGuard;
use rpc_core::frame::InboundFrame;
use rpc_core::stream::Wakes;
use rpc_core::{Drive, Inbound, Status};
use smallvec::SmallVec;

use super::copies;
use super::large::{placed_frame, Arrival};
use super::slots::{HeldSlot, RecvSlot};
use super::teardown::Closing;
use super::{Conn, State, Upcalls};
use crate::engine::{Polled, SharedCq};
use crate::protocol::{ProtocolViolation, Received, SendTarget, WorkId};
use crate::verbs::WorkCompletion;

/// Most receive slots whose release may wait to be re-posted together (see
/// [`Conn::release_recv`]), so the credits held back stay few.
const RELEASE_BATCH: u32 = 8;

thread_local! {
    /// This thread is inside the upper layer's code for some connection (delivering frames,
    /// or dropping a received buffer): progress made here must not re-enter it.
    pub(super) static UPPER_LAYER_LOCKED: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
    /// The connection (its serial) whose frames this thread is delivering, running
    /// handlers inline; 0 for none.
    static DELIVERING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The connection (its serial) whose CQ this thread last polled as a blocking caller:
    /// it comes back to send or poll. 0 for none.
    static DRIVER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Frames on their way to the upper layer and receive slots on their way back, part of the
/// connection's [`State`].
#[derive(Default)]
pub(super) struct HandUps {
    /// Batches of frames taken from the CQ and not yet handed up (by the threads that took
    /// them, after dropping the locks). A close the protocol decides meanwhile waits for
    /// them ([`Closing::AfterHandUps`]): the last one runs it, so frames that arrived before
    /// the close reach the upper layer before its news.
    pub(super) batches: u32,
    /// Frames received by a thread that was already delivering (a handler that polled while
    /// waiting for send credits); its outermost delivery loop hands them over, in order.
    deferred: Vec<Arrival>,
    /// The list the last batch was handed up in, emptied: the next batch is gathered in it,
    /// so a steady stream of batches allocates nothing. Its capacity is the largest batch
    /// handed up yet (a CQ poll's completions and the bodies they finished).
    spare: Vec<Arrival>,
    /// Receive slots the upper layer is done with, not yet re-posted, with the entries
    /// they landed in.
    released: SmallVec<[(u32, u32); RELEASE_BATCH as usize]>,
}

/// What processing a run of one connection's completions leaves for after the locks:
/// frames to hand up, and the [`Upcalls`]. [`Processed::hand_up`] runs it; one dropped
/// instead (a panic in an earlier hand-up of the same poll unwinds past it) gives back
/// what it holds: its slots, its place among the batches being handed up, its wake-ups.
#[must_use]
pub(crate) struct Processed {
    conn: Arc<Conn>,
    /// Not empty: the batch is counted in `HandUps::batches` until they are handed up.
    arrivals: Vec<Arrival>,
    /// Where the frames go (none once closed).
    inbound: Option<Arc<dyn Inbound>>,
    upcalls: Upcalls,
}

impl Processed {
    /// Hands the frames to the upper layer, and runs the upcalls. Frames go up before a
    /// close the same batch brought (a flushed receive after them, say) is reported: they
    /// arrived before it.
    pub(crate) fn hand_up(mut self) {
        // Taken out, so that the drop at the end (or during a panic) has nothing to give back.
        let mut arrivals = std::mem::take(&mut self.arrivals);
        let inbound = self.inbound.take();
        let mut upcalls = std::mem::take(&mut self.upcalls);
        let conn = &self.conn;
        conn.wake_writers(&mut upcalls);
        if !arrivals.is_empty() {
            let counted = Counted { conn, done: false };
            match inbound {
                // A handler on this thread is waiting for send credits: hand these frames
                // to the delivery loop it runs in rather than nesting handlers.
                _ if DELIVERING.get() == conn.serial => {
                    let mut state = conn.state.lock();
                    state.hand_ups.deferred.append(&mut arrivals);
                    counted.finish(state, arrivals);
                }
                Some(inbound) => conn.deliver(&*inbound, arrivals, counted),
                None => conn.give_back(arrivals, counted),
            }
        }
        if upcalls.report {
            conn.report_soon();
        }
    }
}

impl Drop for Processed {
    fn drop(&mut self) {
        if self.arrivals.is_empty() && !self.upcalls.writable {
            return;
        }
        let outer = UPPER_LAYER_LOCKED.replace(true);
        self.conn.wake_writers(&mut self.upcalls);
        if !self.arrivals.is_empty() {
            let counted = Counted {
                conn: &self.conn,
                done: false,
            };
            self.conn
                .give_back(std::mem::take(&mut self.arrivals), counted);
        }
        UPPER_LAYER_LOCKED.set(outer);
    }
}

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
    /// dropped the CQ's poll lock, with [`Processed::hand_up`]).
    pub(crate) fn process(self: Arc<Self>, completions: &[WorkCompletion]) -> Processed {
        let mut state = self.state.lock();
        state.keepalive.active();
        let mut arrivals = std::mem::take(&mut state.hand_ups.spare);
        for wc in completions {
            self.on_completion(&mut state, wc, &mut arrivals);
        }
        self.run_actions(&mut state);
        if state.large.has_arrived() {
            let placed = state.large.take_arrived();
            arrivals.extend(placed.map(|(header, buffer)| Arrival::Placed(header, buffer)));
        }
        let inbound = if arrivals.is_empty() {
            // Kept for the next batch that brings frames.
            state.hand_ups.spare = std::mem::take(&mut arrivals);
            None
        } else {
            // Counted back once handed up.
            state.hand_ups.batches += 1;
            state.inbound.clone()
        };
        let upcalls = self.upcalls(&mut state);
        drop(state);
        Processed {
            conn: self,
            arrivals,
            inbound,
            upcalls,
        }
    }

    /// Frames that will not be handed up (the connection closed, or a panic unwinds past
    /// them): their receive slots go back, their batch is counted back.
    fn give_back(&self, mut arrivals: Vec<Arrival>, counted: Counted<'_>) {
        let mut state = self.state.lock();
        for arrival in arrivals.drain(..) {
            if let Arrival::Slot(rx, entry) = arrival {
                self.release_one(&mut state, rx.slot, entry);
            }
        }
        self.run_actions(&mut state);
        counted.finish(state, arrivals);
    }

    fn on_completion(&self, state: &mut State, wc: &WorkCompletion, received: &mut Vec<Arrival>) {
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
            match work {
                WorkId::Invalidate(grant) => state.large.invalidation_failed(grant),
                WorkId::InvalidateSource(transfer) => {
                    state.large.source_invalidation_failed(transfer);
                }
                _ => {}
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
            WorkId::Read(grant) => {
                let outcome = state.proto.on_read_complete(grant);
                if state.proto.read_awaits_notice(grant) {
                    state.large.read_awaits_notice(grant);
                }
                outcome
            }
            // The offer behind it is what the peer acts on; a failed bind closes.
            WorkId::BindSource(_) => Ok(()),
            WorkId::InvalidateSource(transfer) => state.proto.on_source_invalidated(transfer),
            WorkId::Probe => {
                state.keepalive.answered();
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

    /// Hands `arrivals` to the upper layer, then what other polls of this connection's CQ
    /// on this thread deferred meanwhile. A frame the upper layer says ends the connection
    /// closes it once everything is handed up.
    fn deliver(
        self: &Arc<Self>,
        inbound: &dyn Inbound,
        mut arrivals: Vec<Arrival>,
        counted: Counted<'_>,
    ) {
        let delivering = Delivering::start(self.serial);
        // A stream's reader wakes once to all of its messages in the batch.
        let mut wakes = Wakes::new();
        let mut ended = None;
        let mut held = self.deliver_batch(inbound, arrivals.drain(..), &mut wakes, &mut ended);
        let state = loop {
            let mut state = self.state.lock();
            // The last frame's slot goes back under the lock that ends the batch.
            if let Some(slot) = held.take() {
                slot.release_in(&mut state);
            }
            if state.hand_ups.deferred.is_empty() {
                break state;
            }
            let deferred = std::mem::take(&mut state.hand_ups.deferred);
            self.unlock(state);
            held = self.deliver_batch(inbound, deferred, &mut wakes, &mut ended);
        };
        drop(delivering);
        counted.finish(state, arrivals);
        wakes.wake_all();
        if let Some(status) = ended {
            self.close(status);
        }
    }

    /// Hands `received` up in order. Each copied frame's slot is released once its hand-up
    /// ends, but the last one's is returned, for the caller to release under the lock it
    /// takes next.
    fn deliver_batch<'a>(
        self: &'a Arc<Self>,
        inbound: &dyn Inbound,
        received: impl IntoIterator<Item = Arrival>,
        wakes: &mut Wakes,
        ended: &mut Option<Status>,
    ) -> Option<HeldSlot<'a>> {
        let mut hand_up = |frame: InboundFrame, wakes: &mut Wakes| {
            // Closed from another thread meanwhile: the upper layer heard its last.
            if self.is_closed() {
                return;
            }
            if let Err(status) = inbound.on_frame(frame, wakes) {
                ended.get_or_insert(status);
            }
        };
        let mut received = received.into_iter().peekable();
        while let Some(arrival) = received.next() {
            let (rx, entry) = match arrival {
                Arrival::Slot(rx, entry) => (rx, entry),
                Arrival::Placed(header, buffer) => {
                    hand_up(placed_frame(header, buffer), wakes);
                    continue;
                }
            };
            let (frame_bytes, slot) = self.frame_bytes(&rx, entry);
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
            // bookkeeping) happens after the response left, not before. A copy's slot goes
            // back here too, whatever the application keeps.
            drop(frame_bytes);
            if received.peek().is_none() {
                return slot;
            }
            drop(slot);
        }
        None
    }

    /// The bytes of a received frame for the upper layer, and the slot to release once it
    /// is handed up. Past the lend limit: a copy, and the slot goes back at once (gathered,
    /// see [`Conn::release_recv`]). Within it, a small frame (`copy_below`) is copied and
    /// its slot released after the hand-up; a larger one is a zero-copy view that keeps the
    /// slot while the application keeps it.
    fn frame_bytes<'a>(
        self: &'a Arc<Self>,
        rx: &Received,
        entry: u32,
    ) -> (Bytes, Option<HeldSlot<'a>>) {
        let len = rx.len as usize;
        if rx.lend && rx.len > self.limits.copy_below {
            let owner = RecvSlot {
                conn: Arc::clone(self),
                slot: rx.slot,
                entry,
                len,
            };
            return (Bytes::from_owner(owner), None);
        }
        let held = HeldSlot::new(self, rx.slot, entry, len);
        let copy = copies::copy(held.bytes());
        // Past the lend limit the slot goes back now, after the copy.
        (copy, rx.lend.then_some(held))
    }

    /// The upper layer dropped the last view of a received frame.
    ///
    /// Re-posting its slot (state lock, protocol, RECV) costs hundreds of instructions and a
    /// call into the device. A thread that delivers this connection's frames (its poller)
    /// or has polled its CQ as a caller (`DRIVER`) gathers released slots and re-posts them
    /// together once [`Conn::release_batch`] wait. Gathering only delays credits
    /// (re-posting is what grants them, so no RNR is possible): the protocol's batch
    /// leaves the peer a credit for the frame whose release completes it, and on a
    /// connection that goes quiet the poller's keepalive tick (every 250 ms) re-posts what
    /// waits. Other threads release at once.
    pub(super) fn release_recv(&self, slot: u32, entry: u32) {
        // Buffers are dropped wherever the upper layer drops them, possibly under its locks:
        // no callbacks from here.
        let outer = UPPER_LAYER_LOCKED.replace(true);
        let mut state = self.state.lock();
        self.release_locked(&mut state, slot, entry);
        self.unlock(state);
        UPPER_LAYER_LOCKED.set(outer);
    }

    /// [`Conn::release_recv`] by a holder of the state lock.
    pub(super) fn release_locked(&self, state: &mut State, slot: u32, entry: u32) {
        if DELIVERING.get() != self.serial && DRIVER.get() != self.serial {
            self.release_one(state, slot, entry);
            self.run_actions(state);
        } else {
            state.hand_ups.released.push((slot, entry));
            if state.hand_ups.released.len() >= self.release_batch(state) {
                self.release_deferred(state);
            }
        }
    }

    /// How many released slots are re-posted together: as many as the protocol allows
    /// (see its `release_batch`), at most [`RELEASE_BATCH`].
    fn release_batch(&self, state: &State) -> usize {
        state.proto.release_batch().min(RELEASE_BATCH) as usize
    }

    /// Re-posts the slots whose release waited.
    pub(super) fn release_deferred(&self, state: &mut State) {
        if state.hand_ups.released.is_empty() {
            return;
        }
        for (slot, entry) in std::mem::take(&mut state.hand_ups.released) {
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
        DRIVER.set(self.serial);
        let attachment = &self.res.attachment;
        attachment.engine.drive(&attachment.cq, cx, driving)
    }

    /// Gives back the drive lease of an async call that ended holding it.
    pub(crate) fn stop_driving(&self) {
        let attachment = &self.res.attachment;
        attachment.engine.release(&attachment.cq);
    }

    pub(crate) fn spin_progress(&self, budget: Option<Duration>) -> bool {
        DRIVER.set(self.serial);
        let attachment = &self.res.attachment;
        attachment
            .engine
            .spin(&attachment.cq, budget, || self.is_closed())
    }
}

/// This thread delivers a connection's frames (see `DELIVERING`) until dropped, even if a
/// handler panics.
struct Delivering(u64);

impl Delivering {
    fn start(serial: u64) -> Delivering {
        Delivering(DELIVERING.replace(serial))
    }
}

impl Drop for Delivering {
    fn drop(&mut self) {
        DELIVERING.set(self.0);
    }
}

/// A batch [`Conn::process`] counted as being handed up: counted back once handed up (even
/// if a handler panics on the way); the last one lets a close that waited for it run.
struct Counted<'a> {
    conn: &'a Conn,
    done: bool,
}

impl Counted<'_> {
    /// Counts the batch back; `list`, emptied, is kept for the next batch.
    fn finish(mut self, mut state: MutexGuard<'_, State>, list: Vec<Arrival>) {
        debug_assert!(list.is_empty());
        if list.capacity() > state.hand_ups.spare.capacity() {
            state.hand_ups.spare = list;
        }
        self.done = true;
        self.conn.handed_up(state);
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.conn.handed_up(self.conn.state.lock());
        }
    }
}

impl Conn {
    fn handed_up(&self, mut state: MutexGuard<'_, State>) {
        state.hand_ups.batches -= 1;
        if state.hand_ups.batches == 0 && state.closing == Closing::AfterHandUps {
            // Reported by `unlock`, now that nothing that came before is on its way.
            state.closing = Closing::Open;
        }
        self.unlock(state);
    }
}
