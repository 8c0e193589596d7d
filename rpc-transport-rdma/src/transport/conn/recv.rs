//! The completion side of a connection: polling the CQ, feeding the protocol, handing
//! received frames to the upper layer as zero-copy buffers, and the run-to-completion
//! spinning of blocking callers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rpc_core::frame::InboundFrame;
use smallvec::SmallVec;

use super::large::{placed_frame, Arrival};
use super::{
    Conn, Engine, FrameSink, Polled, CLOCK_EVERY, DELIVERING, DRIVER, RELEASE_BATCH,
    UPPER_LAYER_LOCKED,
};
use crate::protocol::{Received, SendTarget, WorkId};
use crate::transport::resources::verbs_status;
use crate::verbs::WorkCompletion;

/// Frames taken from one poll of the completion queue.
type Batch = SmallVec<[Arrival; 4]>;

impl Conn {
    /// Polls the completion queue once (if no other thread is) and delivers what arrived.
    /// Returns whether anything completed.
    pub(crate) fn progress(self: &Arc<Self>) -> bool {
        self.poll_once() == Polled::Some
    }

    /// Polls the completion queue once and delivers what arrived, telling an empty queue
    /// apart from one another thread is polling.
    pub(crate) fn poll_once(self: &Arc<Self>) -> Polled {
        let Some(mut completions) = self.completions.try_lock() else {
            return Polled::Busy;
        };
        let polled = match self.res.cq.poll(&mut completions) {
            Ok(polled) => polled,
            Err(e) => {
                drop(completions);
                self.close(verbs_status("ibv_poll_cq", e));
                return Polled::Empty;
            }
        };
        if polled.is_empty() {
            drop(completions);
            // Nothing arrived: idle time, in which slot releases that waited cost no one.
            if self.has_released.load(Ordering::Acquire) {
                self.release_deferred_now();
            }
            return Polled::Empty;
        }
        self.completions_seen.fetch_add(1, Ordering::AcqRel);
        // Most batches hold a frame or two: no allocation for them.
        let mut received: Batch = SmallVec::new();
        {
            let mut engine = self.engine.lock();
            for wc in polled.iter() {
                self.on_completion(&mut engine, wc, &mut received);
            }
            self.run_actions(&mut engine);
            received.extend(
                engine
                    .large
                    .take_arrived()
                    .into_iter()
                    .map(|(header, buffer)| Arrival::Placed(header, buffer)),
            );
        }
        drop(completions);
        self.after_engine();
        if !received.is_empty() {
            if DELIVERING.get() == self.address() {
                // A handler on this thread is waiting for send credits: hand these frames
                // to the delivery loop it runs in rather than nesting handlers.
                self.deferred.lock().extend(received.drain(..));
            } else {
                self.deliver(&mut received);
            }
        }
        Polled::Some
    }

    fn on_completion(&self, engine: &mut Engine, wc: &WorkCompletion, received: &mut Batch) {
        let Some((_, work)) = WorkId::from_wr_id(wc.wr_id()) else {
            tracing::error!(wr_id = wc.wr_id(), "completion for an unknown work request");
            engine.proto.close();
            return;
        };
        if let Err(err) = wc.status() {
            if !err.is_flush() {
                tracing::warn!(peer = %self.peer, ?work, %err, "work request failed");
            }
            engine.proto.on_completion_error(work);
            return;
        }
        let outcome = match work {
            WorkId::Send(slot) => engine.proto.on_send_complete(SendTarget::Ring(slot)),
            WorkId::Control => engine.proto.on_send_complete(SendTarget::Control),
            WorkId::Recv(slot) => {
                // SAFETY: the receive into `slot` just completed; the slot is not posted again
                // until the protocol's `PostRecv` for it, which comes after `release_recv`.
                let bytes = unsafe { self.res.recv_slot(slot) };
                engine
                    .proto
                    .on_recv_complete(slot, wc.byte_len(), bytes)
                    .map(|frame| received.extend(frame.map(Arrival::Slot)))
            }
            WorkId::Write(transfer) => engine.proto.on_write_complete(transfer),
            WorkId::Bind(grant) => engine.proto.on_bind_complete(grant),
            WorkId::Invalidate(grant) => engine.proto.on_invalidated(grant),
        };
        if let Err(violation) = outcome {
            tracing::warn!(peer = %self.peer, %violation, "peer violated the protocol");
        }
    }

    /// Hands `received` to the sink. Borrowed, and drained in place: a batch is a few
    /// hundred bytes, and every move of it is a copy.
    fn deliver(self: &Arc<Self>, received: &mut Batch) {
        let Some(sink) = self.sink() else {
            return;
        };
        let outer = DELIVERING.replace(self.address());
        self.deliver_batch(&*sink, received.drain(..));
        loop {
            let deferred = std::mem::take(&mut *self.deferred.lock());
            if deferred.is_empty() {
                break;
            }
            self.deliver_batch(&*sink, deferred);
        }
        DELIVERING.set(outer);
    }

    fn deliver_batch(
        self: &Arc<Self>,
        sink: &dyn FrameSink,
        received: impl IntoIterator<Item = Arrival>,
    ) {
        for arrival in received {
            let rx = match arrival {
                Arrival::Slot(rx) => rx,
                Arrival::Placed(header, buffer) => {
                    sink.deliver(placed_frame(header, buffer));
                    continue;
                }
            };
            let frame_bytes = self.frame_bytes(&rx);
            // Most frames carry no metadata: an empty view needs no reference to the slot.
            let metadata = if rx.header.metadata_len == 0 {
                Bytes::new()
            } else {
                frame_bytes.slice(rx.metadata_range())
            };
            sink.deliver(InboundFrame {
                header: rx.header,
                metadata,
                payload: frame_bytes.slice(rx.payload_range()),
            });
            // Held until the upper layer is done with the frame: a server whose handler ran
            // inline has sent its response by now, so the slot's release (re-post, credit
            // bookkeeping) happens after the response left, not before.
            drop(frame_bytes);
        }
    }

    /// The bytes of a received frame for the upper layer: a zero-copy view that keeps the
    /// slot while the protocol lends it, else a copy, and the slot goes back at once.
    fn frame_bytes(self: &Arc<Self>, rx: &Received) -> Bytes {
        let owner = RecvSlot {
            conn: Arc::clone(self),
            slot: rx.slot,
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
    /// Re-posting its slot (engine lock, protocol, RECV) costs microseconds under emulation.
    /// A thread that drives this connection's CQ (a poller delivering frames, a blocking
    /// caller decoding its response) leaves it for a moment off the critical path: its
    /// next send once the frame is posted, or its next poll that finds the CQ empty. The
    /// caller thus gets its response first and re-posts once its next request left.
    /// Holding slots back only delays their credits (re-posting is what grants them, so no
    /// RNR is possible); at most [`RELEASE_BATCH`] wait, and a poller that looks after a
    /// quiet spell releases them too. Other threads (async handlers, frames kept by the
    /// application) release at once: nothing says they will come back.
    fn release_recv(&self, slot: u32) {
        let address = self.address();
        if DELIVERING.get() != address && DRIVER.get() != address {
            let outer = UPPER_LAYER_LOCKED.replace(true);
            {
                let mut engine = self.engine.lock();
                if let Err(violation) = engine.proto.release_recv(slot) {
                    tracing::error!(%violation, "releasing a receive slot");
                }
                self.run_actions(&mut engine);
            }
            // Buffers are dropped wherever the upper layer drops them, possibly under its
            // locks: no callbacks from here.
            self.after_engine();
            UPPER_LAYER_LOCKED.set(outer);
            return;
        }
        let due = {
            let mut released = self.released.lock();
            released.push(slot);
            released.len() >= RELEASE_BATCH
        };
        self.has_released.store(true, Ordering::Release);
        if due {
            // Buffers are dropped wherever the upper layer drops them, possibly under its
            // locks: no callbacks from here.
            let outer = UPPER_LAYER_LOCKED.replace(true);
            self.release_deferred_now();
            UPPER_LAYER_LOCKED.set(outer);
        }
    }

    /// Re-posts the slots whose release waited.
    fn release_deferred_now(&self) {
        {
            let mut engine = self.engine.lock();
            self.release_deferred(&mut engine);
        }
        self.after_engine();
    }

    /// Re-posts the slots whose release waited, under the engine lock (taken before the
    /// list's, never the other way round).
    pub(super) fn release_deferred(&self, engine: &mut Engine) {
        if !(self.has_released.load(Ordering::Acquire)
            && self.has_released.swap(false, Ordering::AcqRel))
        {
            return;
        }
        let slots: SmallVec<[u32; RELEASE_BATCH]> = self.released.lock().drain(..).collect();
        for slot in slots {
            if let Err(violation) = engine.proto.release_recv(slot) {
                tracing::error!(%violation, "releasing a receive slot");
            }
        }
        self.run_actions(engine);
    }

    /// Spins on the CQ for up to `budget` (`None`: until something arrives) on the caller's
    /// thread: the run-to-completion path of blocking calls. True once anything was
    /// received, by this thread or another. Reads no clock unless the wait is long.
    pub(crate) fn spin_progress(self: &Arc<Self>, budget: Option<Duration>) -> bool {
        /// Keeps the count right even if a handler panics inside `progress`.
        struct Polling<'a>(&'a AtomicUsize);
        impl Drop for Polling<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.self_polling.fetch_add(1, Ordering::AcqRel);
        let polling = Polling(&self.self_polling);
        DRIVER.set(self.address());
        let seen = self.completions_seen.load(Ordering::Acquire);
        let mut started: Option<Instant> = None;
        let mut spins: u32 = 0;
        let progressed = loop {
            if self.progress() || self.completions_seen.load(Ordering::Acquire) != seen {
                break true;
            }
            spins = spins.wrapping_add(1);
            // Clock reads are not free everywhere (an emulated HPET costs microseconds):
            // look at the time only now and then, and only once the wait is not short.
            if spins.is_multiple_of(CLOCK_EVERY) {
                if self.is_closed() {
                    break false;
                }
                if let Some(budget) = budget {
                    if started.get_or_insert_with(Instant::now).elapsed() >= budget {
                        break false;
                    }
                }
            }
            std::hint::spin_loop();
        };
        if progressed {
            self.self_poll_epoch.fetch_add(1, Ordering::AcqRel);
        }
        drop(polling);
        if !progressed {
            // The caller is about to park: the poller must take over the CQ.
            self.kick.kick();
        }
        progressed
    }

    /// Whether blocking callers drive the CQ: one is polling now, or one received something
    /// since the poller's last look (`last_seen`, updated here).
    ///
    /// After a kick ([`Conn::callers_handed_over`]) only a caller polling again counts: the
    /// caller that kicked is parked, and its earlier activity must not send the poller back
    /// to sleep while nobody watches the CQ.
    pub(crate) fn callers_drive(&self, last_seen: &mut u64) -> bool {
        let epoch = self.self_poll_epoch.load(Ordering::Acquire);
        let recent = epoch != *last_seen;
        *last_seen = epoch;
        recent || self.self_polling.load(Ordering::Acquire) > 0
    }

    /// A kick arrived: a caller is parking, or an async call waits. What blocking callers
    /// did so far is history; the poller drives the CQ until one polls again.
    pub(crate) fn callers_handed_over(&self, last_seen: &mut u64) {
        *last_seen = self.self_poll_epoch.load(Ordering::Acquire);
    }
}

/// Keeps a receive slot out of the ring while the upper layer reads the frame in it; the
/// `Bytes` views of metadata and payload share it and release the slot when the last drops.
struct RecvSlot {
    conn: Arc<Conn>,
    slot: u32,
    len: usize,
}

impl AsRef<[u8]> for RecvSlot {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the slot stays un-posted until this owner's drop releases it.
        let bytes = unsafe { self.conn.res.recv_slot(self.slot) };
        &bytes[..self.len]
    }
}

impl Drop for RecvSlot {
    fn drop(&mut self) {
        self.conn.release_recv(self.slot);
    }
}
