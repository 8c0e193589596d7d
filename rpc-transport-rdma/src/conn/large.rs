//! The driver side of large bodies: encoding into leased registered buffers, posting the
//! WRITEs, binds and invalidations the protocol asks for, and handing placed bodies up as
//! zero-copy `Bytes`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::{Flags, FrameKind, Header, Landing, Status};

use super::grant::{GrantBuffer, GrantLimit, PlacedBody};
use super::{Conn, State};
use crate::app_memory::{Claim, Gathered, InPlace};
use crate::large_pool::LargeBuffer;
use crate::protocol::{Action, BodyStart, LocalBuffer, Received, WorkId};
use crate::verbs::{
    AccessFlags, MemoryWindow, RemoteAddr, SendFlags, SendOp, SendRequest, Sge, VerbsError,
};

mod lend;

/// Kinds whose body may travel by RDMA WRITE.
pub(super) fn is_body_kind(kind: FrameKind) -> bool {
    matches!(
        kind,
        FrameKind::Request | FrameKind::Response | FrameKind::Message
    )
}

/// A buffer the peer may be writing into, and the window that lets it; or, without a window,
/// a buffer this side READs a body into. Field order is drop order: the window goes first,
/// so the buffer is never freed while reachable.
#[derive(Debug)]
struct Granted {
    window: Option<MemoryWindow>,
    buffer: GrantBuffer,
    /// Bytes of it the peer may write (what the grant or advertisement told it), or the
    /// body's length that is read into it.
    len: usize,
    /// When the peer was granted it at its request; `None` for a response buffer we
    /// advertised (its handler may take any time).
    asked: Option<Instant>,
    /// Its invalidation failed (flushed, the queue pair in the error state): the window is
    /// still bound, holding on to the queue pair, and is deallocated instead of reused.
    still_bound: bool,
}

/// Where an outgoing transfer's body lies: its copied bytes, and the runs of application
/// memory sent in place, if any; and, for a body offered for the peer to READ, the window
/// over it. Field order is drop order: the window goes before the memory it reaches.
#[derive(Debug)]
struct Source {
    window: Option<MemoryWindow>,
    staged: LargeBuffer,
    gathered: Option<Gathered>,
    /// The window's invalidation failed (flushed): it is deallocated instead of reused.
    still_bound: bool,
}

/// Large-body resources of one connection, kept under the state lock.
#[derive(Debug, Default)]
pub(super) struct LargeState {
    /// Sources of outgoing transfers, until their WRITEs completed.
    sources: HashMap<u32, Source>,
    grants: HashMap<u32, Granted>,
    /// Bodies that arrived and are no longer remotely writable, to hand up after the lock.
    arrived: Vec<(Header, PlacedBody)>,
    /// Transfers the peer refused, to report after the lock.
    failed: Vec<(u64, FrameKind, Status)>,
}

impl LargeState {
    pub(super) fn has_failures(&self) -> bool {
        !self.failed.is_empty()
    }

    pub(super) fn take_failures(&mut self) -> Vec<(u64, FrameKind, Status)> {
        std::mem::take(&mut self.failed)
    }

    pub(super) fn take_arrived(&mut self) -> impl Iterator<Item = (Header, PlacedBody)> + '_ {
        self.arrived.drain(..)
    }

    /// Whether bodies wait to be handed up ([`LargeState::take_arrived`]).
    pub(super) fn has_arrived(&self) -> bool {
        !self.arrived.is_empty()
    }

    /// The invalidation of `grant`'s window failed.
    pub(super) fn invalidation_failed(&mut self, grant: u32) {
        if let Some(g) = self.grants.get_mut(&grant) {
            g.still_bound = true;
        }
    }

    /// The body read into `grant` is in and waits for its notice: from now on the peer
    /// holds the buffer, timed as a grant it asked for.
    pub(super) fn read_awaits_notice(&mut self, grant: u32) {
        if let Some(g) = self.grants.get_mut(&grant) {
            g.asked.get_or_insert_with(Instant::now);
        }
    }

    /// The invalidation of the window over `transfer`'s offered body failed.
    pub(super) fn source_invalidation_failed(&mut self, transfer: u32) {
        if let Some(source) = self.sources.get_mut(&transfer) {
            source.still_bound = true;
        }
    }

    /// Revokes every open grant (deallocating its window) and frees its buffer: the first
    /// step of tearing a connection down, before its queue pair is destroyed. Buffers READs
    /// land in stay until the queue pair is gone (a READ may still be writing them).
    pub(super) fn revoke_all(&mut self) {
        self.grants.retain(|_, g| g.window.is_none());
    }

    /// Revokes the grants of application memory (their windows deallocated first), which
    /// go back to their landings: the connection closed. One a READ lands in stays until
    /// the queue pair is gone.
    pub(super) fn release_landings(&mut self) {
        self.grants
            .retain(|_, g| !matches!(g.buffer, GrantBuffer::App(_)) || g.window.is_none());
    }

    /// The oldest grant the peer asked for (or body read for it) and has held longer than
    /// `limit` allows: that grant, its age and allowance.
    fn overdue(&self, now: Instant, limit: GrantLimit) -> Option<(&Granted, Duration, Duration)> {
        self.grants
            .values()
            .filter_map(|g| {
                let age = now.saturating_duration_since(g.asked?);
                let allowed = limit.allowance(g.len);
                (age > allowed).then_some((g, age, allowed))
            })
            .max_by_key(|&(_, age, _)| age)
    }
}

/// Something to hand to the upper layer.
#[derive(Debug)]
pub(super) enum Arrival {
    /// A frame in a receive slot, and the entry it landed in (the ring slot, or a shared
    /// receive queue's buffer).
    Slot(Received, u32),
    /// A body placed by RDMA WRITE, announced by the header.
    Placed(Header, PlacedBody),
}

impl Conn {
    /// Sends a request, response or stream message whose frame exceeds a slot: encodes the
    /// body straight into a leased registered buffer (metadata, then payload), leaving out
    /// the runs of application memory ([`RegisteredBuffer`]) its WRITEs gather in place, and
    /// starts the rendezvous. Returns at once; the WRITEs go out when the peer grants a
    /// buffer.
    ///
    /// [`RegisteredBuffer`]: crate::RegisteredBuffer
    pub(super) fn send_large(self: &Arc<Self>, frame: &OutgoingFrame<'_>) -> Result<(), Status> {
        let header = *frame.header();
        let metadata_len = header.metadata_len as usize;
        let total = header.message_len() as usize;
        let pd = &self.res.attachment.engine.pd;
        let max_pieces = (self.res.qp.caps().max_send_sge.saturating_sub(1) / 2) as usize;
        // A first pass finds the runs sent in place, and so how many bytes are copied; with
        // nothing listed there are none to find.
        let mut sizing = InPlace::new(pd, metadata_len as u64, max_pieces);
        let copied = match crate::app_memory::any_listed() && max_pieces > 0 {
            true => metadata_len + frame.payload().encode_gathered(None, &mut sizing),
            false => total,
        };
        let mut buffer = self.res.large.lease(copied).map_err(|e| {
            Status::resource_exhausted(format!("cannot send a body of {total} bytes: {e}"))
        })?;
        let gathered = {
            // SAFETY: just leased: no window is bound on it and no work request names it.
            let body = unsafe { buffer.body_mut() };
            let (metadata, payload) = body.split_at_mut(metadata_len);
            frame.metadata().encode_into(metadata);
            if sizing.is_empty() {
                frame.payload().encode_into(payload);
                None
            } else {
                let written = frame
                    .payload()
                    .encode_gathered(Some(payload), &mut sizing.replay());
                let gathered = sizing.finish();
                let whole = (copied as u64).checked_add(gathered.in_place());
                if written != payload.len() || whole != Some(total as u64) {
                    return Err(Status::internal(format!(
                        "a body of {total} bytes encoded as {} copied and {} in place, then \
                         {written} copied: its encoding changed while it was sent",
                        copied,
                        gathered.in_place()
                    )));
                }
                Some(gathered)
            }
        };
        let in_place = gathered.as_ref().map_or(0, Gathered::in_place);
        let local = LocalBuffer {
            addr: buffer.addr(),
            lkey: buffer.lkey(),
        };
        if let Some(metrics) = crate::metrics::rdma() {
            metrics.sent_by_write.increment(total as u64);
        }
        // A request body in one piece is offered for the peer to READ, from its size on.
        let window = match header.kind == FrameKind::Request
            && gathered.is_none()
            && total as u64 >= self.limits.read_from
        {
            true => self.res.large.window().ok(),
            false => None,
        };
        let mut state = self.state.lock();
        let started = match &window {
            Some(window) => state.proto.start_source(&header, local, window.next_rkey()),
            None => state
                .proto
                .start_large(&header, local)
                .map(BodyStart::Written),
        };
        // The window goes with the body only if it was offered.
        let (window, unused) = match started {
            Ok(BodyStart::Offered(_)) => (window, None),
            _ => (None, window),
        };
        if let Some(window) = unused {
            self.res.large.put_window(window);
        }
        if let Ok(started) = started {
            let source = Source {
                window,
                staged: buffer,
                gathered,
                still_bound: false,
            };
            state.large.sources.insert(started.transfer(), source);
        }
        self.run_actions(&mut state);
        self.unlock(state);
        if started.is_ok() {
            crate::app_memory::count_large_body(copied as u64, in_place);
        }
        started.map(|_| ()).map_err(|e| self.send_error(e, total))
    }

    /// Advertises a response buffer of at least `len` bytes with the request `frame`: leases
    /// a pool buffer, binds a window over it (posted before the request) and puts its
    /// descriptor in the header. False, and the request unchanged, when no buffer can be
    /// had now (budget, grant limit): the response then takes the rendezvous if large.
    pub(crate) fn advertise_response_buffer(
        &self,
        frame: &mut OutgoingFrame<'_>,
        len: u64,
    ) -> bool {
        let Ok(len) = usize::try_from(len) else {
            return false;
        };
        match self.res.large.lease(len) {
            Ok(buffer) => self.advertise(frame, GrantBuffer::Pool(buffer)),
            Err(_) => false,
        }
    }

    /// Advertises the application's buffer `landing` offers for the response of the
    /// request `frame`, as [`Conn::advertise_response_buffer`] does a leased one. False,
    /// and the landing unchanged, when it holds no registered buffer this connection's
    /// device knows, or one still viewed (an earlier response), or no window can be had.
    pub(crate) fn advertise_landing(
        &self,
        frame: &mut OutgoingFrame<'_>,
        landing: &Landing,
    ) -> bool {
        match Claim::take(landing, &self.res.attachment.engine.pd, 1, None) {
            Some(landing) => self.advertise(frame, GrantBuffer::App(landing)),
            None => false,
        }
    }

    fn advertise(&self, frame: &mut OutgoingFrame<'_>, buffer: GrantBuffer) -> bool {
        let Ok(window) = self.res.large.window() else {
            return false;
        };
        let rkey = window.next_rkey();
        let header = frame.header_mut();
        let mut state = self.state.lock();
        let advertised =
            state
                .proto
                .advertise(header.call_id, buffer.addr(), rkey, buffer.len() as u64);
        let Some(descriptor) = advertised else {
            drop(state);
            self.res.large.put_window(window);
            return false;
        };
        state.large.grants.insert(
            descriptor.generation,
            Granted {
                window: Some(window),
                buffer,
                // At most the buffer's length (the protocol caps it).
                len: descriptor.len as usize,
                asked: None,
                still_bound: false,
            },
        );
        header.flags = header.flags.with(Flags::RESPONSE_BUFFER);
        header.remote = descriptor;
        self.run_actions(&mut state);
        self.unlock(state);
        true
    }

    /// The request `frame`, which advertised a response buffer, was not sent: the offer is
    /// withdrawn, and taken out of the frame's header.
    pub(crate) fn withdraw_response_buffer(&self, frame: &mut OutgoingFrame<'_>) {
        let header = frame.header_mut();
        header.flags = header.flags.without(Flags::RESPONSE_BUFFER);
        header.remote = Default::default();
        let call_id = header.call_id;
        let mut state = self.state.lock();
        state.proto.withdraw_advertisement(call_id);
        self.run_actions(&mut state);
        self.unlock(state);
    }

    /// Executes an action of the large-body path. State lock held.
    pub(super) fn run_large_action(
        &self,
        state: &mut State,
        action: Action,
    ) -> Result<(), VerbsError> {
        match action {
            Action::PostWrite(w) => {
                let source = state.large.sources.get(&w.transfer);
                let sges = match source {
                    Some(Source {
                        staged,
                        gathered: Some(gathered),
                        ..
                    }) => gathered.sges(
                        w.local_addr - staged.addr(),
                        w.len,
                        (staged.addr(), staged.lkey()),
                    ),
                    _ => smallvec::smallvec![Sge::new(w.local_addr, w.len, w.lkey)],
                };
                let request = SendRequest {
                    wr_id: self.res.wr_id(WorkId::Write(w.transfer)),
                    sges: &sges,
                    op: SendOp::RdmaWrite(RemoteAddr {
                        addr: w.remote_addr,
                        rkey: w.rkey,
                    }),
                    flags: SendFlags::SIGNALED,
                };
                debug_assert!(source.is_some());
                // SAFETY: the gather list lies in the transfer's leased buffer and in the
                // application's registered buffers it holds (`Gathered`), all of which stay
                // in `sources` (registered, unwritten: `RegisteredBuffer::get_mut` refuses
                // while they are held) until the protocol's TransferDone, which comes only
                // after this WRITE's completion.
                unsafe { self.res.qp.post_send(&request) }
            }
            Action::TransferDone { transfer } => {
                self.drop_source(state, transfer);
                Ok(())
            }
            Action::PostRead(r) => {
                let sges = [Sge::new(r.local_addr, r.len, r.lkey)];
                let request = SendRequest {
                    wr_id: self.res.wr_id(WorkId::Read(r.grant)),
                    sges: &sges,
                    op: SendOp::RdmaRead(RemoteAddr {
                        addr: r.remote_addr,
                        rkey: r.rkey,
                    }),
                    flags: SendFlags::SIGNALED,
                };
                debug_assert!(state.large.grants.contains_key(&r.grant));
                // SAFETY: the destination lies in the grant's buffer (`read_into` was given
                // its address, lkey and length), which stays in `grants`, unread, until
                // DeliverLarge or ReleaseGrant, which the protocol sends only after this
                // READ's completion; on teardown it outlives the queue pair (`revoke_all`).
                unsafe { self.res.qp.post_send(&request) }
            }
            Action::BindSource { transfer, len } => {
                let Some(Source {
                    window: Some(window),
                    staged,
                    ..
                }) = state.large.sources.get_mut(&transfer)
                else {
                    return Ok(());
                };
                let wr_id = self.res.wr_id(WorkId::BindSource(transfer));
                let range = 0..(len as usize).min(staged.len());
                // SAFETY: the body stays in `sources`, unwritten, until TransferDone or
                // TransferFailed, which the protocol sends only after the window's
                // invalidation completed; on teardown the window is deallocated first
                // (`Source`'s field order), and the memory outlives the queue pair.
                unsafe {
                    self.res.qp.post_bind_window(
                        wr_id,
                        window,
                        staged.region(),
                        range,
                        AccessFlags::REMOTE_READ,
                        SendFlags::SIGNALED,
                    )
                }
                .map(|_| ())
            }
            Action::InvalidateSource { transfer, rkey } => {
                let wr_id = self.res.wr_id(WorkId::InvalidateSource(transfer));
                self.res
                    .qp
                    .post_local_invalidate(wr_id, rkey, SendFlags::SIGNALED)
            }
            Action::ReadNeeded { body, len } => {
                self.lend_for_read(state, body, len);
                Ok(())
            }
            Action::TransferFailed {
                transfer,
                call_id,
                kind,
                status,
                len,
                limit,
            } => {
                self.drop_source(state, transfer);
                let what = match kind {
                    FrameKind::Request => "request",
                    FrameKind::Message => "stream message",
                    _ => "response",
                };
                let limit = match limit {
                    0 => String::new(),
                    limit => format!(" (its limit is {limit} bytes)"),
                };
                let status = Status::new(
                    status,
                    format!(
                        "{} refused to accept a {what} of {len} bytes{limit}",
                        self.peer
                    ),
                );
                state.large.failed.push((call_id, kind, status));
                Ok(())
            }
            Action::GrantNeeded { body, len } => {
                self.lend_buffer(state, body, len);
                Ok(())
            }
            Action::BindWindow { grant } => {
                let Some(Granted {
                    window: Some(window),
                    buffer,
                    len,
                    ..
                }) = state.large.grants.get_mut(&grant)
                else {
                    return Ok(());
                };
                let wr_id = self.res.wr_id(WorkId::Bind(grant));
                // SAFETY: the buffer stays in `grants` until the window's invalidation has
                // completed (DeliverLarge/ReleaseGrant come after it) or the connection is
                // torn down (`Conn`'s Drop deallocates every window before the buffers go);
                // its bytes are read only after that.
                unsafe { buffer.bind(&self.res.qp, wr_id, window, *len) }
                    // The bind hands out `window.next_rkey()`, the rkey the grant announced.
                    .map(|_| ())
            }
            Action::Invalidate { grant, rkey } => {
                let wr_id = self.res.wr_id(WorkId::Invalidate(grant));
                self.res
                    .qp
                    .post_local_invalidate(wr_id, rkey, SendFlags::SIGNALED)
            }
            Action::DeliverLarge { grant, header } => {
                if let Some(g) = state.large.grants.remove(&grant) {
                    self.recycle_window(g.window, g.still_bound);
                    // SAFETY: the protocol delivers a body once the peer's WRITEs are done
                    // (its notice came after them on the same queue pair) and the window's
                    // invalidation completed; a window whose invalidation failed was just
                    // dropped by `recycle_window`, which deallocates it. A body read has no
                    // window, and its last READ completed.
                    let body = unsafe { g.buffer.arrived(header.message_len() as usize) };
                    state.large.arrived.push((header, body));
                }
                Ok(())
            }
            Action::ReleaseGrant { grant } => {
                if let Some(g) = state.large.grants.remove(&grant) {
                    self.recycle_window(g.window, g.still_bound);
                }
                Ok(())
            }
            Action::PostRecv { .. }
            | Action::PostSend(_)
            | Action::Writable
            | Action::PostProbe
            | Action::SendDropped { .. } => {
                unreachable!("ring actions are executed by run_actions")
            }
        }
    }

    /// A window whose grant ended goes back to the pool, unless it is still bound (its
    /// invalidation was flushed): deallocated then, which also lets go of the queue pair.
    fn recycle_window(&self, window: Option<MemoryWindow>, still_bound: bool) {
        if let Some(window) = window.filter(|_| !still_bound) {
            self.res.large.put_window(window);
        }
    }

    /// An outgoing transfer is over: its memory goes, and its window (invalidated) back to
    /// the pool.
    fn drop_source(&self, state: &mut State, transfer: u32) {
        if let Some(mut source) = state.large.sources.remove(&transfer) {
            self.recycle_window(source.window.take(), source.still_bound);
        }
    }
}

/// Hands a placed body up: metadata and payload are views of the leased buffer, which goes
/// back to the pool when the last view drops. The header keeps what the frame is (a
/// stream's opening or headers: `STREAM`); how its body came, and the descriptor that
/// said where, stay here.
pub(super) fn placed_frame(header: Header, body: PlacedBody) -> InboundFrame {
    let metadata_len = header.metadata_len as usize;
    let total = header.message_len() as usize;
    let body = match body {
        PlacedBody::Pool(buffer) => crate::app_memory::placed_view(buffer),
        PlacedBody::App(view) => {
            crate::app_memory::count_landed(view.len() as u64);
            view
        }
    };
    let stream = header.flags.contains(rpc_core::Flags::STREAM);
    InboundFrame {
        metadata: body.slice(..metadata_len),
        payload: body.slice(metadata_len..total),
        header: rpc_core::Header {
            flags: if stream {
                rpc_core::Flags::STREAM
            } else {
                rpc_core::Flags::NONE
            },
            ..header
        },
    }
}
