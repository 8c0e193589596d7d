//! One RDMA connection: verbs resources driven by the sans-IO protocol.
//!
//! Threads meet here: callers send (under the state lock: reserve a slot, encode the frame
//! straight into it, commit, post), and whoever polls the completion queue (the poller
//! thread, or a blocking caller doing run-to-completion) feeds completions to the protocol
//! and hands received frames to the upper layer *after* dropping the locks, so a handler run
//! inline can send its response at once.
//!
//! This file holds the connection, its send path and teardown; `recv.rs` the completion
//! side (polling, delivery, receive-slot release, run-to-completion spinning).

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rpc_core::{FrameKind, Header, Inbound, Status};
use smallvec::SmallVec;

use crate::config::RdmaConfig;
use crate::engine::Engine;
use crate::protocol::{self, Action, SendError};
use crate::reaper;
use crate::resources::Resources;
use crate::verbs::{CmEventKind, CmId, SendFlags, SendOp, SendRequest, Sge};

mod keepalive;
mod large;
mod recv;
mod send;
mod teardown;

use keepalive::Keepalive;
pub(crate) use large::Arrival;
use large::{GrantLimit, LargeState};
use teardown::Disconnected;

/// Frames taken from one poll of the completion queue.
pub(crate) type Arrivals = SmallVec<[Arrival; 4]>;

/// Receive slots whose release may wait for a better moment (see `recv.rs`); one more and
/// they are released at once, so the credits held back stay few.
const RELEASE_BATCH: usize = 8;

thread_local! {
    /// This thread is inside the upper layer's code for some connection (delivering frames,
    /// or dropping a received buffer): progress made here must not re-enter it.
    static UPPER_LAYER_LOCKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The connection (its serial) whose frames this thread is delivering, running
    /// handlers inline; 0 for none.
    static DELIVERING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The connection (its serial) whose CQ this thread last polled as a blocking caller:
    /// it comes back to send or poll. 0 for none.
    static DRIVER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The next connection's serial; 0 means none, so they start at 1.
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

struct State {
    proto: protocol::Connection,
    /// Calls whose queued frames the protocol dropped, reported outside the lock.
    dropped: Vec<(u64, FrameKind)>,
    /// Buffers and windows of large bodies in flight.
    large: LargeState,
    /// With a shared receive queue: the buffer each held receive slot landed in.
    shared_bufs: Vec<u32>,
    /// The peer disconnected; the connection closes once its completions are drained.
    disconnected: Option<Disconnected>,
}

/// Teardown: `Drop` first revokes open grants (windows are deallocated, so nothing the peer
/// does can reach their buffers), then hands the verbs objects to the reaper thread (their
/// destruction can block in the kernel), which drops them in order: the QP (no work request
/// runs any more), the rings and the engine's attachment, the cm_id, and last the state with
/// the source buffers of outgoing WRITEs.
pub(crate) struct Conn {
    // Dropped by `Drop`, on the reaper thread, in this order.
    res: ManuallyDrop<Resources>,
    id: ManuallyDrop<CmId>,
    state: ManuallyDrop<Mutex<State>>,
    /// This connection, for the engine's lists of work.
    me: Weak<Conn>,
    /// Names this connection in the thread-locals below: unique in the process for its
    /// life (an address is not: a connection dropped and another made may share one).
    serial: u64,
    /// Bumped on every `Writable`; senders waiting for slots watch it.
    writable_epoch: AtomicU64,
    writable_lock: Mutex<()>,
    writable: Condvar,
    write_wakers: Mutex<Vec<Waker>>,
    /// `write_wakers` is not empty.
    has_wakers: AtomicBool,
    /// The protocol reported `Writable`: wake the async senders, flush queued controls.
    writable_fired: AtomicBool,
    /// Since when async senders wait for room, with no `Writable` since.
    stalled_since: Mutex<Option<Instant>>,
    /// Header-only frames (`Cancel`) waiting for room (see [`Conn::send_control`]).
    queued_controls: Mutex<VecDeque<Header>>,
    control_queue_limit: usize,
    /// The protocol dropped frames or closed: `after_state` has work to do.
    attention: AtomicBool,
    closed: AtomicBool,
    inbound: Mutex<Option<Arc<dyn Inbound>>>,
    /// The protocol closed, and the thread that saw it could not call back into the upper
    /// layer: the engine's poller runs the close (see `after_state`).
    close_pending: AtomicBool,
    /// Frames received by a thread that was already delivering (a handler that polled while
    /// waiting for send credits); its outermost delivery loop hands them over, in order.
    deferred: Mutex<Vec<Arrival>>,
    /// Receive slots the upper layer is done with, not yet re-posted (see `recv.rs`), with
    /// the entries they landed in.
    released: Mutex<Vec<(u32, u32)>>,
    /// `released` is not empty.
    has_released: AtomicBool,
    /// Batches of frames taken from the CQ and not yet handed up (by the threads that took
    /// them, after dropping the locks). Atomic, not under the state lock: every delivered
    /// batch counts, and senders contend for that lock.
    handing_up: AtomicU32,
    /// A close waits for those batches: whoever sees the count reach zero with this set runs
    /// it, so frames that arrived before the close reach the upper layer before its news.
    close_deferred: AtomicBool,
    peer: String,
    /// Longest a sender waits for a slot before the peer is declared stuck.
    stall_limit: Duration,
    /// Largest frame one SEND carries (negotiated; larger bodies go by RDMA WRITE).
    max_send_frame: usize,
    keepalive: Keepalive,
    /// How long the peer may hold a buffer granted at its request.
    grant_limit: GrantLimit,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        state.large.revoke_all();
        if let Some(commitment) = self.res.shared_recv() {
            // Given back once the QP is destroyed.
            commitment.set(state.proto.recv_posted());
        }
        // SAFETY: each is taken once, here, and `self` is not used after.
        let (res, id, state) = unsafe {
            (
                ManuallyDrop::take(&mut self.res),
                ManuallyDrop::take(&mut self.id),
                ManuallyDrop::take(&mut self.state),
            )
        };
        reaper::reap(move || {
            drop(res);
            drop(id);
            drop(state);
        });
    }
}

impl Conn {
    pub(crate) fn new(
        res: Resources,
        id: CmId,
        peer_params: &[u8],
        peer: String,
        config: &RdmaConfig,
    ) -> Result<Arc<Conn>, Status> {
        let stall_limit = config.stall_limit;
        let control_queue_limit = config.control_queue as usize;
        let params = protocol::ConnectParams::decode(peer_params).map_err(|e| {
            Status::unavailable(format!("{peer} sent unusable connection parameters: {e}"))
        })?;
        let geometry = protocol::Geometry::negotiate(&res.protocol, &params).map_err(|e| {
            Status::unavailable(format!("cannot agree on ring geometry with {peer}: {e}"))
        })?;
        let max_send_frame = geometry.max_send_frame as usize;
        let shared_bufs = match res.shared_recv() {
            Some(_) => vec![0; geometry.recv_slots as usize],
            None => Vec::new(),
        };
        Ok(Arc::new_cyclic(|me| Conn {
            max_send_frame,
            res: ManuallyDrop::new(res),
            id: ManuallyDrop::new(id),
            state: ManuallyDrop::new(Mutex::new(State {
                proto: protocol::Connection::new(geometry),
                dropped: Vec::new(),
                large: LargeState::default(),
                shared_bufs,
                disconnected: None,
            })),
            handing_up: AtomicU32::new(0),
            close_deferred: AtomicBool::new(false),
            me: me.clone(),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            writable_epoch: AtomicU64::new(0),
            writable_lock: Mutex::new(()),
            writable: Condvar::new(),
            write_wakers: Mutex::new(Vec::new()),
            has_wakers: AtomicBool::new(false),
            writable_fired: AtomicBool::new(false),
            stalled_since: Mutex::new(None),
            queued_controls: Mutex::new(VecDeque::new()),
            control_queue_limit,
            attention: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            inbound: Mutex::new(None),
            close_pending: AtomicBool::new(false),
            deferred: Mutex::new(Vec::new()),
            released: Mutex::new(Vec::with_capacity(RELEASE_BATCH)),
            has_released: AtomicBool::new(false),
            peer,
            stall_limit,
            keepalive: Keepalive::new(config.keepalive, config.keepalive_timeout),
            grant_limit: GrantLimit {
                timeout: config.large_grant_timeout,
                min_rate: config.large_grant_min_rate,
            },
        }))
    }

    /// Starts processing the connection's completions: registers it with the engine
    /// (handing it what arrived already) and, with `watch_cm` (clients, which own their
    /// rdma_cm channel; a server's listener watches its connections), lets the engine's
    /// poller watch its rdma_cm channel. Call once its inbound side is set.
    pub(crate) fn start(self: &Arc<Self>, watch_cm: bool) -> Result<(), Status> {
        Engine::register(&self.res.attachment, self)?;
        if let Some(channel) = self.id.channel().filter(|_| watch_cm) {
            self.res.attachment.watch_cm(channel.fd())?;
        }
        Ok(())
    }

    pub(crate) fn set_inbound(&self, inbound: Arc<dyn Inbound>) {
        *self.inbound.lock() = Some(inbound);
    }

    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    pub(crate) fn id(&self) -> &CmId {
        &self.id
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Largest frame this connection can send in one slot.
    pub(crate) fn max_frame(&self) -> usize {
        self.max_send_frame
    }

    /// Counters and gauges of the protocol state.
    pub(crate) fn stats(&self) -> crate::protocol::Stats {
        self.state.lock().proto.stats()
    }

    fn send_error(&self, err: SendError, len: usize) -> Status {
        match err {
            SendError::TooLarge { max, .. } => Status::resource_exhausted(format!(
                "frame of {len} bytes exceeds the RDMA slot size of {max} bytes"
            )),
            SendError::DuplicateTransfer { body } => {
                Status::already_exists(format!("{body} already has a large body on its way"))
            }
            SendError::Closed => self.closed_status(),
            other => Status::internal(format!("rdma send: {other}")),
        }
    }

    fn closed_status(&self) -> Status {
        Status::unavailable(format!("connection to {} is closed", self.peer))
    }

    /// Executes the protocol's actions in order. Called with the state lock held: posts are
    /// cheap (no blocking), and their order is part of the no-RNR guarantee.
    fn run_actions(&self, state: &mut State) {
        while let Some(action) = state.proto.poll_action() {
            let posted = match action {
                Action::PostRecv { slot } => self.res.post_recv(slot),
                Action::PostSend(work) => {
                    // SAFETY: state lock held; the protocol posts each buffer once until its
                    // completion reclaims it, and this is that post.
                    let (buf, lkey) = unsafe { self.res.send.buffer(work.target) };
                    work.prepare(buf);
                    let res = &self.res;
                    let sge = [Sge::new(buf.as_ptr() as u64, work.len, lkey)];
                    let mut flags = SendFlags::NONE;
                    if work.signaled {
                        flags |= SendFlags::SIGNALED;
                    }
                    if work.inline && work.len <= res.qp.max_inline_data() {
                        flags |= SendFlags::INLINE;
                    }
                    let request = SendRequest {
                        wr_id: self.res.wr_id(work.work_id()),
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
                    state.dropped.push((call_id, kind));
                    Ok(())
                }
                Action::PostProbe => {
                    self.post_probe(state);
                    Ok(())
                }
                other => self.run_large_action(state, other),
            };
            if let Err(e) = posted {
                tracing::warn!(peer = %self.peer, %e, "posting a work request failed");
                state.proto.close();
            }
        }
        if !state.dropped.is_empty() || state.large.has_failures() || state.proto.is_closed() {
            self.attention.store(true, Ordering::Release);
        }
    }

    fn wake_writers(&self) {
        self.writable_fired.store(true, Ordering::Release);
        self.writable_epoch.fetch_add(1, Ordering::AcqRel);
        // Under the lock, so a sender between its check and its wait cannot miss this.
        let _guard = self.writable_lock.lock();
        self.writable.notify_all();
    }

    /// Work that must happen without the state lock: waking async senders, reporting
    /// dropped frames, tearing down a connection the protocol closed.
    fn after_state(&self) {
        self.wake_async_writers();
        if !(self.attention.load(Ordering::Acquire) && self.attention.swap(false, Ordering::AcqRel))
        {
            return;
        }
        if UPPER_LAYER_LOCKED.get() {
            // Called while the upper layer may hold its own locks (a receive buffer dropped
            // inside the call table, say): no callbacks from here; the poller closes.
            self.close_pending.store(true, Ordering::Release);
            let engine = &self.res.attachment.engine;
            engine.call_attention(&self.me);
            engine.wake_poller();
            return;
        }
        self.report_dropped_and_close();
    }

    /// After a `Writable`: flushes queued controls and wakes the async senders.
    fn wake_async_writers(&self) {
        // Plain loads first: these run on every send, completion batch and slot release,
        // and the flags are nearly always clear; a swap would be a locked instruction each.
        // A loop: another `Writable` may come while this one is handled.
        while self.writable_fired.load(Ordering::Acquire)
            && self.writable_fired.swap(false, Ordering::AcqRel)
        {
            *self.stalled_since.lock() = None;
            self.flush_controls();
            if self.has_wakers.load(Ordering::Acquire)
                && self.has_wakers.swap(false, Ordering::AcqRel)
            {
                let wakers = std::mem::take(&mut *self.write_wakers.lock());
                wakers.into_iter().for_each(Waker::wake);
            }
        }
    }

    /// Reports frames the protocol dropped and, if it closed the connection, closes it.
    /// Calls back into the upper layer: never from under its locks.
    pub(crate) fn report_dropped_and_close(&self) {
        if self.close_waits_for_hand_ups() {
            return;
        }
        let (dropped, failed, reason, disconnected) = {
            let mut state = self.state.lock();
            let reason = state.proto.close_reason().map(ToString::to_string);
            let failed = state.large.take_failures();
            let disconnected = state.disconnected.as_ref().map(|d| d.status.clone());
            (
                std::mem::take(&mut state.dropped),
                failed,
                reason,
                disconnected,
            )
        };
        if !dropped.is_empty() || !failed.is_empty() {
            if let Some(inbound) = self.inbound() {
                for (call_id, kind) in dropped {
                    inbound.on_dropped(call_id, kind);
                }
                for (call_id, kind, status) in failed {
                    inbound.on_transfer_failed(call_id, kind, status);
                }
            }
        }
        match (reason, disconnected) {
            // Drained after the peer's disconnect: that is why it closed.
            (Some(_), Some(status)) => self.close(status),
            (Some(reason), None) => self.close(Status::unavailable(format!(
                "connection to {} failed: {reason}",
                self.peer
            ))),
            (None, _) => {}
        }
    }

    /// The protocol closed while other threads still hand up frames taken before: the close
    /// is left to the last of them (see `HandingUp`). True if it was.
    fn close_waits_for_hand_ups(&self) -> bool {
        if self.handing_up.load(Ordering::SeqCst) == 0 || !self.state.lock().proto.is_closed() {
            return false;
        }
        self.close_deferred.store(true, Ordering::SeqCst);
        // The last hand-up may have finished between the load and the store, seeing nothing
        // deferred: then the close is ours after all (unless it took it meanwhile).
        !(self.handing_up.load(Ordering::SeqCst) == 0
            && self.close_deferred.swap(false, Ordering::SeqCst))
    }

    fn inbound(&self) -> Option<Arc<dyn Inbound>> {
        self.inbound.lock().clone()
    }

    /// This connection's [`Conn::serial`], for the thread-locals.
    fn serial(&self) -> u64 {
        self.serial
    }

    /// Closes the connection: fails what is queued, disconnects, tells the upper layer.
    pub(crate) fn close(&self, status: Status) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let mut state = self.state.lock();
            state.proto.close();
            self.run_actions(&mut state);
        }
        // Tell the peer; fails harmlessly if the peer disconnected first.
        let _ = self.id.disconnect();
        self.wake_writers();
        let wakers = std::mem::take(&mut *self.write_wakers.lock());
        wakers.into_iter().for_each(Waker::wake);
        let inbound = self.inbound.lock().take();
        let dropped = std::mem::take(&mut self.state.lock().dropped);
        if let Some(inbound) = inbound {
            for (call_id, kind) in dropped {
                inbound.on_dropped(call_id, kind);
            }
            inbound.on_closed(status);
        }
    }

    /// The engine's poller does what was left to it: a close a thread inside the upper
    /// layer could not run, slot releases that waited for a quiet moment.
    pub(crate) fn attend(&self) {
        if self.close_pending.load(Ordering::Acquire)
            && self.close_pending.swap(false, Ordering::AcqRel)
        {
            self.report_dropped_and_close();
        }
        if self.has_released.load(Ordering::Acquire) {
            self.release_deferred_now();
        }
    }

    /// Reads the connection's rdma_cm events (clients): a disconnect closes it once what
    /// arrived before is processed.
    pub(crate) fn check_cm(&self) {
        let Some(cm) = self.id.channel() else { return };
        while let Ok(Some(event)) = cm.try_get_event() {
            self.on_cm_event(event.kind());
        }
    }

    /// An rdma_cm event about this connected id (a server's listener reads them for its
    /// connections).
    pub(crate) fn on_cm_event(&self, kind: CmEventKind) {
        let status = || Status::unavailable(format!("{} disconnected ({kind})", self.peer));
        match kind {
            CmEventKind::Established => {}
            CmEventKind::Disconnected => self.peer_disconnected(status()),
            // Anything else (device gone, time-wait over, unreachable, ...) ends it now.
            _ => self.close(status()),
        }
    }
}
