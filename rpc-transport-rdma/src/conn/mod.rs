//! One RDMA connection: verbs resources driven by the sans-IO protocol.
//!
//! **One owner.** Everything about a connection that changes (the protocol, its large
//! bodies, the senders waiting for room, the frames being handed up and the slots waiting
//! to be re-posted, its liveness, how far it is closed) lives in [`State`], under one
//! lock. Whoever holds the lock may post work requests (posts never block, and their order
//! is part of the no-RNR guarantee) but calls nobody: what others must hear (wakers,
//! received frames, dropped calls, the close) is collected as [`Upcalls`] and run once the
//! lock is dropped, so a handler run inline can send its response at once.
//!
//! Threads meet here: callers send (`send.rs`); whoever polls the completion queue (the
//! engine's poller, or a caller doing run-to-completion) processes completions and hands
//! frames up (`recv.rs`); the poller ticks liveness (`keepalive.rs`); teardown
//! (`teardown.rs`) drains before it disconnects; `large.rs` moves bodies by RDMA WRITE.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};
use rpc_core::{FrameKind, Inbound, Status};

use crate::config::RdmaConfig;
use crate::engine::Engine;
use crate::protocol::{self, Action, SendError};
use crate::reaper;
use crate::resources::Resources;
use crate::verbs::{CmEventKind, CmId, SendFlags, SendOp, SendRequest, Sge};

mod copies;
mod grant;
mod keepalive;
mod large;
mod recv;
mod send;
mod slots;
mod teardown;

use grant::GrantLimit;
use keepalive::Keepalive;
use large::LargeState;
pub(crate) use recv::Processed;
use recv::{HandUps, UPPER_LAYER_LOCKED};
use send::Writers;
use teardown::{Closing, Disconnected};

/// The next connection's serial; 0 means none, so they start at 1.
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A connection's changing state: its one owner is this lock.
struct State {
    proto: protocol::Connection,
    /// Buffers and windows of large bodies in flight.
    large: LargeState,
    /// With a shared receive queue: the buffer each held receive slot landed in.
    shared_bufs: Vec<u32>,
    /// The upper layer's inbound side; the close takes it, and tells it last.
    inbound: Option<Arc<dyn Inbound>>,
    /// Where large request bodies may land (a server's, [`Inbound::landings`]), copied
    /// from the inbound side when it is set: nobody is called under the lock to find them.
    landings: Arc<[rpc_core::Landing]>,
    /// Where the large request bodies of given methods land first
    /// ([`Inbound::method_landings`]), by method id.
    method_landings: Arc<[(u32, rpc_core::Landing)]>,
    /// Calls whose queued frames the protocol dropped, to report outside the lock.
    dropped: Vec<(u64, FrameKind)>,
    /// Senders waiting for room, and the control frames queued for it.
    writers: Writers,
    /// Frames on their way up, and the receive slots coming back.
    hand_ups: HandUps,
    keepalive: Keepalive,
    /// The peer disconnected; the connection closes once its completions are drained.
    disconnected: Option<Disconnected>,
    closing: Closing,
}

/// What never changes after the handshake.
struct Limits {
    /// Largest frame one SEND carries (negotiated; larger bodies go by RDMA WRITE).
    max_send_frame: usize,
    /// Longest a sender waits for a slot before the peer is declared stuck.
    stall_limit: Duration,
    /// Most control frames queued for room (see [`Conn::send_control`]).
    control_queue: usize,
    /// How long the peer may hold a buffer granted at its request.
    grant: GrantLimit,
    /// Frames of at most this many bytes are handed up as copies ([`Rings::copy_below`]).
    ///
    /// [`Rings::copy_below`]: crate::Rings::copy_below
    copy_below: u32,
    /// Request bodies of at least this many bytes are offered for the peer to READ
    /// ([`LargeBodies::read_from`]).
    ///
    /// [`LargeBodies::read_from`]: crate::LargeBodies::read_from
    read_from: u64,
}

/// Teardown: `Drop` first revokes open grants (windows are deallocated, so nothing the peer
/// does can reach their buffers), then hands the verbs objects to the reaper thread (their
/// destruction can block in the kernel), which drops them in order: the QP (no work request
/// runs any more), the rings and the engine's attachment, the cm_id, and last the state with
/// the source buffers of outgoing WRITEs and READs (and their windows) and the buffers
/// READs land in.
pub(crate) struct Conn {
    // Dropped by `Drop`, on the reaper thread, in this order.
    res: ManuallyDrop<Resources>,
    id: ManuallyDrop<CmId>,
    state: ManuallyDrop<Mutex<State>>,
    /// Blocking senders wait here, on the state lock, for a `Writable`.
    writable: Condvar,
    /// `Closing::Closed`, readable without the lock by the loops that spin on the CQ.
    closed: AtomicBool,
    /// This connection, for the engine's lists of work.
    me: Weak<Conn>,
    /// Names this connection in the thread-locals of `recv.rs`: unique in the process for
    /// its life (an address is not: a connection dropped and another made may share one).
    serial: u64,
    peer: String,
    limits: Limits,
}

/// What a holder of the state lock leaves for after it (see the module documentation).
#[must_use]
#[derive(Default)]
pub(crate) struct Upcalls {
    /// The protocol reported `Writable`: blocked senders are notified, these woken.
    writable: bool,
    wakers: Vec<std::task::Waker>,
    /// Dropped frames, failed transfers or the protocol's close are to be reported.
    report: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        state.large.revoke_all();
        if let Some(commitment) = self.res.shared_recv() {
            // Given back once the QP is destroyed.
            commitment.set(state.proto.recv_posted());
        }
        // The upper layer's side goes here, not on the reaper thread.
        drop(state.inbound.take());
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
        let params = protocol::ConnectParams::decode(peer_params).map_err(|e| {
            Status::unavailable(format!("{peer} sent unusable connection parameters: {e}"))
        })?;
        let geometry = protocol::Geometry::negotiate(&res.protocol, &params).map_err(|e| {
            Status::unavailable(format!("cannot agree on ring geometry with {peer}: {e}"))
        })?;
        let limits = Limits {
            max_send_frame: geometry.max_send_frame as usize,
            stall_limit: config.liveness.stall_limit,
            control_queue: config.liveness.control_queue as usize,
            grant: GrantLimit {
                timeout: config.large.grant_timeout,
                min_rate: config.large.grant_min_rate,
            },
            copy_below: config.rings.copy_below,
            read_from: config.large.read_from,
        };
        let shared_bufs = match res.shared_recv() {
            Some(_) => vec![0; geometry.recv_slots as usize],
            None => Vec::new(),
        };
        Ok(Arc::new_cyclic(|me| Conn {
            res: ManuallyDrop::new(res),
            id: ManuallyDrop::new(id),
            state: ManuallyDrop::new(Mutex::new(State {
                proto: protocol::Connection::new(geometry),
                large: LargeState::default(),
                shared_bufs,
                inbound: None,
                landings: Arc::new([]),
                method_landings: Arc::new([]),
                dropped: Vec::new(),
                writers: Writers::default(),
                hand_ups: HandUps::default(),
                keepalive: Keepalive::new(
                    config.liveness.keepalive,
                    config.liveness.keepalive_timeout,
                ),
                disconnected: None,
                closing: Closing::Open,
            })),
            writable: Condvar::new(),
            closed: AtomicBool::new(false),
            me: me.clone(),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            peer,
            limits,
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
        let landings = inbound.landings().into();
        let method_landings: Arc<[_]> = inbound.method_landings().into();
        let mut state = self.state.lock();
        if !method_landings.is_empty() {
            // Where a body lands depends on its method: its request comes first.
            state.proto.read_after_notice();
        }
        state.landings = landings;
        state.method_landings = method_landings;
        state.inbound = Some(inbound);
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
        self.limits.max_send_frame
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
                    state.writers.on_writable();
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
    }

    /// Collects what the lock's holder leaves for after it: sends the queued controls a
    /// `Writable` made room for, takes the wakers, says whether there is news to report.
    fn upcalls(&self, state: &mut State) -> Upcalls {
        let mut upcalls = Upcalls::default();
        if !state.writers.writable && state.dropped.is_empty() && !state.large.has_failures() {
            // The usual case: only a close may be news.
            upcalls.report = state.closing == Closing::Open && state.proto.is_closed();
            return upcalls;
        }
        // A loop: flushing controls may bring another `Writable`.
        while std::mem::take(&mut state.writers.writable) {
            state.writers.stalled_since = None;
            self.flush_controls(state);
            upcalls.writable = true;
        }
        if upcalls.writable {
            upcalls.wakers = std::mem::take(&mut state.writers.wakers);
        }
        // Waiting for hand-ups, the report waits too; once closed, nobody is left to tell.
        upcalls.report = state.closing == Closing::Open
            && (!state.dropped.is_empty() || state.large.has_failures() || state.proto.is_closed());
        upcalls
    }

    /// Drops the state lock, then runs what its holder left.
    fn unlock(&self, mut state: MutexGuard<'_, State>) {
        let mut upcalls = self.upcalls(&mut state);
        drop(state);
        self.wake_writers(&mut upcalls);
        if upcalls.report {
            self.report_soon();
        }
    }

    /// Notifies the blocked senders and wakes the async ones, if a `Writable` came.
    fn wake_writers(&self, upcalls: &mut Upcalls) {
        if upcalls.writable {
            self.writable.notify_all();
            upcalls.wakers.drain(..).for_each(std::task::Waker::wake);
        }
    }

    /// Reports dropped frames, failed transfers and the protocol's close now, or, on a
    /// thread inside the upper layer's code (which may hold its own locks: a receive buffer
    /// dropped inside the call table, say), has the engine's poller do it.
    fn report_soon(&self) {
        if UPPER_LAYER_LOCKED.get() {
            let engine = &self.res.attachment.engine;
            engine.call_attention(&self.me);
            engine.wake_poller();
            return;
        }
        self.report_dropped_and_close();
    }

    /// Reports frames the protocol dropped and, if it closed the connection, closes it.
    /// Calls back into the upper layer: never from under its locks.
    fn report_dropped_and_close(&self) {
        let (dropped, failed, close, inbound) = {
            let mut state = self.state.lock();
            if state.proto.is_closed() && state.hand_ups.batches > 0 {
                // Frames taken before the close are still on their way up: the last of
                // them to arrive closes (see `HandUps`).
                if state.closing == Closing::Open {
                    state.closing = Closing::AfterHandUps;
                }
                return;
            }
            let close = state.proto.close_reason().map(|reason| {
                match &state.disconnected {
                    // Drained after the peer's disconnect: that is why it closed.
                    Some(disconnected) => disconnected.status.clone(),
                    None => {
                        Status::unavailable(format!("connection to {} failed: {reason}", self.peer))
                    }
                }
            });
            (
                std::mem::take(&mut state.dropped),
                state.large.take_failures(),
                close,
                state.inbound.clone(),
            )
        };
        if let Some(inbound) = inbound {
            for (call_id, kind) in dropped {
                inbound.on_dropped(call_id, kind);
            }
            for (call_id, kind, status) in failed {
                inbound.on_transfer_failed(call_id, kind, status);
            }
        }
        if let Some(status) = close {
            self.close(status);
        }
    }

    /// Closes the connection: fails what is queued, disconnects, tells the upper layer.
    pub(crate) fn close(&self, status: Status) {
        let (inbound, dropped, wakers) = {
            let mut state = self.state.lock();
            if state.closing == Closing::Closed {
                return;
            }
            state.closing = Closing::Closed;
            self.closed.store(true, Ordering::Release);
            state.proto.close();
            self.run_actions(&mut state);
            // Landings are the application's, shared by connections: they go back now,
            // not when the last reference to this connection goes.
            state.large.release_landings();
            state.writers.controls.clear();
            (
                state.inbound.take(),
                std::mem::take(&mut state.dropped),
                std::mem::take(&mut state.writers.wakers),
            )
        };
        // Tell the peer; fails harmlessly if the peer disconnected first.
        let _ = self.id.disconnect();
        self.writable.notify_all();
        wakers.into_iter().for_each(std::task::Waker::wake);
        if let Some(inbound) = inbound {
            for (call_id, kind) in dropped {
                inbound.on_dropped(call_id, kind);
            }
            inbound.on_closed(status);
        }
    }

    /// The engine's poller does what was left to it: a report a thread inside the upper
    /// layer could not make.
    pub(crate) fn attend(&self) {
        self.unlock(self.state.lock());
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
