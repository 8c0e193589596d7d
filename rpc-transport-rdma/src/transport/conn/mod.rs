//! One RDMA connection: verbs resources driven by the sans-IO protocol.
//!
//! Threads meet here: callers send (under the engine lock: reserve a slot, encode the frame
//! straight into it, commit, post), and whoever polls the completion queue (the poller
//! thread, or a blocking caller doing run-to-completion) feeds completions to the protocol
//! and hands received frames to the upper layer *after* dropping the locks, so a handler run
//! inline can send its response at once.
//!
//! This file holds the connection, its send path and teardown; `recv.rs` the completion
//! side (polling, delivery, receive-slot release, run-to-completion spinning).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::{FrameKind, Status};

use crate::protocol::{self, Action, SendError};
use crate::transport::kick::Kick;
use crate::transport::resources::Resources;
use crate::verbs::{CmId, SendFlags, SendOp, SendRequest, Sge, WorkCompletion};

mod large;
mod recv;

use large::{Arrival, LargeState};

/// Completions taken from the CQ per poll.
const POLL_BATCH: usize = 32;
/// Receive slots whose release may wait for a better moment (see `recv.rs`); one more and
/// they are released at once, so the credits held back stay few.
const RELEASE_BATCH: usize = 8;
/// Empty polls between two looks at the clock while spinning.
pub(crate) const CLOCK_EVERY: u32 = 1024;

thread_local! {
    /// This thread is inside the upper layer's code for some connection (delivering frames,
    /// or dropping a received buffer): progress made here must not re-enter it.
    static UPPER_LAYER_LOCKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The connection (its address) whose frames this thread is delivering, running
    /// handlers inline; 0 for none.
    static DELIVERING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The connection (its address) whose CQ this thread last polled as a blocking caller:
    /// it comes back to send or poll. 0 for none.
    static DRIVER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What one look at the completion queue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polled {
    /// Completions were processed.
    Some,
    /// The queue was empty.
    Empty,
    /// Another thread is polling it right now.
    Busy,
}

/// Where a connection's received frames and failures go.
pub(crate) trait FrameSink: Send + Sync {
    /// A frame arrived.
    fn deliver(&self, frame: InboundFrame);
    /// A committed frame was never sent because the connection closed.
    fn dropped(&self, call_id: u64, kind: FrameKind);
    /// A large body (`kind`: request or response) could not be sent: the peer refused a
    /// buffer for it. Its call fails with `status`.
    fn transfer_failed(&self, call_id: u64, kind: FrameKind, status: Status);
    /// The connection is closed; no more frames will come.
    fn closed(&self, status: Status);
}

struct Engine {
    proto: protocol::Connection,
    /// Calls whose queued frames the protocol dropped, reported outside the lock.
    dropped: Vec<(u64, FrameKind)>,
    /// Buffers and windows of large bodies in flight.
    large: LargeState,
}

/// Teardown: `Drop` first revokes open grants (windows are deallocated, so nothing the peer
/// does can reach their buffers), then the fields drop in order: the QP (no work request
/// runs any more), the rings, the cm_id, and last the engine with the source buffers of
/// outgoing WRITEs.
pub(crate) struct Conn {
    // Field order matters for teardown: the verbs objects go before the cm_id they belong to.
    res: Resources,
    id: CmId,
    engine: Mutex<Engine>,
    completions: Mutex<Vec<WorkCompletion>>,
    /// Bumped on every `Writable`; senders waiting for slots watch it.
    writable_epoch: AtomicU64,
    writable_lock: Mutex<()>,
    writable: Condvar,
    write_wakers: Mutex<Vec<Waker>>,
    /// `write_wakers` is not empty.
    has_wakers: AtomicBool,
    /// The protocol dropped frames or closed: `after_engine` has work to do.
    attention: AtomicBool,
    closed: AtomicBool,
    sink: Mutex<Option<Arc<dyn FrameSink>>>,
    /// Blocking callers currently polling the CQ themselves.
    self_polling: AtomicUsize,
    /// Bumped each time a blocking caller's own polling received something.
    self_poll_epoch: AtomicU64,
    /// Batches of completions processed, by anyone.
    completions_seen: AtomicU64,
    /// Wakes the poller out of its caller-driven (unarmed) sleep.
    pub(crate) kick: Kick,
    /// The poller sleeps without arming the CQ because callers drive it.
    pub(crate) poller_unarmed: AtomicBool,
    /// The protocol closed; the poller must run `close` (see `after_engine`).
    close_pending: AtomicBool,
    /// Frames received by a thread that was already delivering (a handler that polled while
    /// waiting for send credits); its outermost delivery loop hands them over, in order.
    deferred: Mutex<Vec<Arrival>>,
    /// Receive slots the upper layer is done with, not yet re-posted (see `recv.rs`).
    released: Mutex<Vec<u32>>,
    /// `released` is not empty.
    has_released: AtomicBool,
    peer: String,
    /// Longest a sender waits for a slot before the peer is declared stuck.
    stall_limit: Duration,
    /// Largest frame one SEND carries (negotiated; larger bodies go by RDMA WRITE).
    max_send_frame: usize,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.engine.get_mut().large.revoke_all();
    }
}

impl Conn {
    pub(crate) fn new(
        res: Resources,
        id: CmId,
        peer_params: &[u8],
        peer: String,
        stall_limit: Duration,
    ) -> Result<Arc<Conn>, Status> {
        let params = protocol::ConnectParams::decode(peer_params).map_err(|e| {
            Status::unavailable(format!("{peer} sent unusable connection parameters: {e}"))
        })?;
        let geometry = protocol::Geometry::negotiate(&res.protocol, &params).map_err(|e| {
            Status::unavailable(format!("cannot agree on ring geometry with {peer}: {e}"))
        })?;
        let max_send_frame = geometry.max_send_frame as usize;
        Ok(Arc::new(Conn {
            max_send_frame,
            res,
            id,
            engine: Mutex::new(Engine {
                proto: protocol::Connection::new(geometry),
                dropped: Vec::new(),
                large: LargeState::default(),
            }),
            completions: Mutex::new(WorkCompletion::array(POLL_BATCH)),
            writable_epoch: AtomicU64::new(0),
            writable_lock: Mutex::new(()),
            writable: Condvar::new(),
            write_wakers: Mutex::new(Vec::new()),
            has_wakers: AtomicBool::new(false),
            attention: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            sink: Mutex::new(None),
            self_polling: AtomicUsize::new(0),
            self_poll_epoch: AtomicU64::new(0),
            completions_seen: AtomicU64::new(0),
            kick: Kick::new()?,
            poller_unarmed: AtomicBool::new(false),
            close_pending: AtomicBool::new(false),
            deferred: Mutex::new(Vec::new()),
            released: Mutex::new(Vec::with_capacity(RELEASE_BATCH)),
            has_released: AtomicBool::new(false),
            peer,
            stall_limit,
        }))
    }

    pub(crate) fn set_sink(&self, sink: Arc<dyn FrameSink>) {
        *self.sink.lock() = Some(sink);
    }

    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    pub(crate) fn resources(&self) -> &Resources {
        &self.res
    }

    pub(crate) fn id(&self) -> &CmId {
        &self.id
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Every committed frame has been posted (nothing waits for credits).
    pub(crate) fn sends_drained(&self) -> bool {
        self.engine.lock().proto.stats().send_unposted == 0
    }

    /// Largest frame this connection can send in one slot.
    pub(crate) fn max_frame(&self) -> usize {
        self.max_send_frame
    }

    /// Encodes `frame` into a send slot and posts it (or queues it behind earlier frames
    /// waiting for credits). Blocks while the ring and queue are full.
    pub(crate) fn send(self: &Arc<Self>, frame: &OutgoingFrame<'_>) -> Result<(), Status> {
        let len = frame.len();
        if len > self.max_send_frame && large::is_body_kind(frame.header().kind) {
            return self.send_large(frame);
        }
        let mut blocked_since: Option<Instant> = None;
        loop {
            let epoch = self.writable_epoch.load(Ordering::Acquire);
            {
                let mut engine = self.engine.lock();
                match engine.proto.reserve_send(len) {
                    Ok(reservation) => {
                        // SAFETY: the engine lock is held and the slot was just reserved, so no
                        // posted work request reads it.
                        let slot = unsafe { self.res.send_buffer(reservation.target()) };
                        let written =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                frame.write_to(&mut slot[..len])
                            }));
                        if let Err(panic) = written {
                            // A reservation left behind would block every later send.
                            engine.proto.abort_send(reservation);
                            drop(engine);
                            std::panic::resume_unwind(panic);
                        }
                        let committed = engine.proto.commit_send(reservation, frame.header());
                        self.run_actions(&mut engine);
                        // The frame is on its way: a good moment for slot releases that
                        // waited, under the lock already held. Their credits ride on the
                        // next frame.
                        self.release_deferred(&mut engine);
                        drop(engine);
                        self.after_engine();
                        return committed.map_err(|e| self.send_error(e, len));
                    }
                    Err(SendError::WouldBlock) => {}
                    Err(e) => return Err(self.send_error(e, len)),
                }
            }
            // Out of slots or credits: make progress ourselves if nobody else is, else wait
            // for the protocol to report `Writable`.
            if self.progress() {
                continue;
            }
            let stalled = *blocked_since.get_or_insert_with(Instant::now);
            if stalled.elapsed() >= self.stall_limit {
                let status = Status::unavailable(format!(
                    "{} took no frame for {:?}: the peer stopped consuming",
                    self.peer, self.stall_limit
                ));
                self.close(status.clone());
                return Err(status);
            }
            let mut guard = self.writable_lock.lock();
            if self.writable_epoch.load(Ordering::Acquire) == epoch && !self.is_closed() {
                self.writable.wait_for(&mut guard, Duration::from_millis(1));
            }
        }
    }

    /// Counters and gauges of the protocol state.
    pub(crate) fn stats(&self) -> crate::protocol::Stats {
        self.engine.lock().proto.stats()
    }

    fn send_error(&self, err: SendError, len: usize) -> Status {
        match err {
            SendError::TooLarge { max, .. } => Status::resource_exhausted(format!(
                "frame of {len} bytes exceeds the RDMA slot size of {max} bytes"
            )),
            SendError::DuplicateTransfer { call_id } => Status::already_exists(format!(
                "call {call_id} already has a large body on its way"
            )),
            SendError::Closed => self.closed_status(),
            other => Status::internal(format!("rdma send: {other}")),
        }
    }

    fn closed_status(&self) -> Status {
        Status::unavailable(format!("connection to {} is closed", self.peer))
    }

    /// Back-pressure for async senders: ready when a slot can be reserved.
    pub(crate) fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        if self.is_closed() {
            return Poll::Ready(Err(self.closed_status()));
        }
        let stats = self.engine.lock().proto.stats();
        // An async task will wait for a response: the poller must be watching the CQ.
        if self.poller_unarmed.load(Ordering::Acquire) {
            self.kick.kick();
        }
        if stats.send_free > 0 {
            return Poll::Ready(Ok(()));
        }
        self.write_wakers.lock().push(cx.waker().clone());
        self.has_wakers.store(true, Ordering::Release);
        // Re-check: `Writable` may have fired between the look and the registration.
        if self.engine.lock().proto.stats().send_free > 0 {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }

    /// Executes the protocol's actions in order. Called with the engine lock held: posts are
    /// cheap (no blocking), and their order is part of the no-RNR guarantee.
    fn run_actions(&self, engine: &mut Engine) {
        while let Some(action) = engine.proto.poll_action() {
            let posted = match action {
                Action::PostRecv { slot } => self.res.post_recv(slot),
                Action::PostSend(work) => {
                    // SAFETY: engine lock held; the protocol posts each buffer once until its
                    // completion reclaims it, and this is that post.
                    let buf = unsafe { self.res.send_buffer(work.target) };
                    work.prepare(buf);
                    let res = &self.res;
                    let sge = [Sge::new(buf.as_ptr() as u64, work.len, res.send_mr.lkey())];
                    let mut flags = SendFlags::NONE;
                    if work.signaled {
                        flags |= SendFlags::SIGNALED;
                    }
                    if work.inline && work.len <= res.qp.max_inline_data() {
                        flags |= SendFlags::INLINE;
                    }
                    let request = SendRequest {
                        wr_id: work
                            .work_id()
                            .to_wr_id(crate::transport::resources::CONN_TAG),
                        sges: &sge,
                        op: SendOp::Send,
                        flags,
                    };
                    // SAFETY: the SGE names a buffer of the registered send ring, which lives
                    // as long as the QP; the protocol does not hand this buffer out again
                    // before the send's completion (or a later signaled one) reclaims it.
                    unsafe { res.qp.post_send(&request) }
                }
                Action::Writable => {
                    self.wake_writers();
                    Ok(())
                }
                Action::SendDropped { call_id, kind, .. } => {
                    engine.dropped.push((call_id, kind));
                    Ok(())
                }
                other => self.run_large_action(engine, other),
            };
            if let Err(e) = posted {
                tracing::warn!(peer = %self.peer, %e, "posting a work request failed");
                engine.proto.close();
            }
        }
        if !engine.dropped.is_empty() || engine.large.has_failures() || engine.proto.is_closed() {
            self.attention.store(true, Ordering::Release);
        }
    }

    /// Work that must happen without the engine lock: waking async senders, reporting
    /// dropped frames, tearing down a connection the protocol closed.
    fn wake_writers(&self) {
        self.writable_epoch.fetch_add(1, Ordering::AcqRel);
        // Under the lock, so a sender between its check and its wait cannot miss this.
        let _guard = self.writable_lock.lock();
        self.writable.notify_all();
    }

    fn after_engine(&self) {
        // Plain loads first: these run on every send, completion batch and slot release,
        // and the flags are nearly always clear; a swap would be a locked instruction each.
        if self.has_wakers.load(Ordering::Acquire) && self.has_wakers.swap(false, Ordering::AcqRel)
        {
            let wakers = std::mem::take(&mut *self.write_wakers.lock());
            wakers.into_iter().for_each(Waker::wake);
        }
        if !(self.attention.load(Ordering::Acquire) && self.attention.swap(false, Ordering::AcqRel))
        {
            return;
        }
        if UPPER_LAYER_LOCKED.get() {
            // Called while the upper layer may hold its own locks (a receive buffer dropped
            // inside the call table, say): no callbacks from here; the poller closes.
            self.close_pending.store(true, Ordering::Release);
            self.kick.kick();
            return;
        }
        self.report_dropped_and_close();
    }

    /// Reports frames the protocol dropped and, if it closed the connection, closes it.
    /// Calls back into the upper layer: never from under its locks.
    pub(crate) fn report_dropped_and_close(&self) {
        let (dropped, failed, reason) = {
            let mut engine = self.engine.lock();
            let reason = engine.proto.close_reason().map(|r| format!("{r:?}"));
            let failed = engine.large.take_failures();
            (std::mem::take(&mut engine.dropped), failed, reason)
        };
        if !dropped.is_empty() || !failed.is_empty() {
            if let Some(sink) = self.sink() {
                for (call_id, kind) in dropped {
                    sink.dropped(call_id, kind);
                }
                for (call_id, kind, status) in failed {
                    sink.transfer_failed(call_id, kind, status);
                }
            }
        }
        if let Some(reason) = reason {
            self.close(Status::unavailable(format!(
                "connection to {} failed: {reason}",
                self.peer
            )));
        }
    }

    fn sink(&self) -> Option<Arc<dyn FrameSink>> {
        self.sink.lock().clone()
    }

    fn address(&self) -> usize {
        self as *const Conn as usize
    }

    /// Closes the connection: fails what is queued, disconnects, tells the sink.
    pub(crate) fn close(&self, status: Status) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let mut engine = self.engine.lock();
            engine.proto.close();
            self.run_actions(&mut engine);
        }
        // Tell the peer; fails harmlessly if the peer disconnected first.
        let _ = self.id.disconnect();
        self.wake_writers();
        let wakers = std::mem::take(&mut *self.write_wakers.lock());
        wakers.into_iter().for_each(Waker::wake);
        let sink = self.sink.lock().take();
        let dropped = std::mem::take(&mut self.engine.lock().dropped);
        if let Some(sink) = sink {
            for (call_id, kind) in dropped {
                sink.dropped(call_id, kind);
            }
            sink.closed(status);
        }
    }

    /// Whether a thread that must not call back into the upper layer left the reporting of
    /// dropped frames or a protocol close to the poller (which then calls
    /// [`Conn::report_dropped_and_close`]). Clears the flag.
    pub(crate) fn take_deferred_report(&self) -> bool {
        // Checked on every turn of a spinning poller: a plain load first, not a locked swap.
        self.close_pending.load(Ordering::Acquire)
            && self.close_pending.swap(false, Ordering::AcqRel)
    }
}
