//! The per-connection state machine: ties the rings and the credits together, feeds on
//! completions and caller requests, and emits [`Action`]s.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use rpc_wire::{Flags, FrameKind, Header, COMPACT_HEADER_LEN};

use super::action::{Action, SendTarget, SendWork, WorkId};
use super::credits::Credits;
use super::error::{ProtocolViolation, SendError};
use super::geometry::{Geometry, CONTROL_BUF_LEN};
use super::large::Large;
use super::recv_ring::RecvRing;
use super::send_ring::{Pending, SendRing};

mod disconnect;
mod large;
mod probe;
mod recv;

/// A frame that leaves the peer with at most this many usable credits (posted slots whose
/// credit is not waiting to be returned) asks for a larger window.
pub const GROW_AT: u32 = 2;

/// Distinguishes reservations of different connections.
static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// A send slot handed to the caller by [`Connection::reserve_send`]. Write the encoded
/// header and body into the slot's memory (`Geometry::send_offset(reservation.target())`,
/// at most [`SendReservation::capacity`] bytes), then [`Connection::commit_send`] it, or
/// give it back with [`Connection::abort_send`].
#[derive(Debug)]
#[must_use = "a reservation holds a send slot until committed or aborted"]
pub struct SendReservation {
    connection: u64,
    seq: u64,
    slot: u32,
    capacity: u32,
}

impl SendReservation {
    /// Send-ring slot to write into.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot as a send target.
    pub fn target(&self) -> SendTarget {
        SendTarget::Ring(self.slot)
    }

    /// Largest frame (header included) that may be written.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }
}

/// Why a connection closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// [`Connection::close`] was called.
    Local,
    /// A work request completed with an error status, which the driver named (the
    /// work completion's status: a flush, retries exceeded, a remote access error, ...).
    CompletionError {
        /// The work request.
        work: WorkId,
        /// Its completion status, in words.
        status: String,
    },
    /// The peer or the completion stream broke the protocol.
    Violation(ProtocolViolation),
    /// The peer disconnected; what arrived before was processed.
    PeerDisconnected,
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::Local => f.write_str("closed locally"),
            CloseReason::CompletionError {
                work: WorkId::Probe,
                status,
            } => write!(
                f,
                "keepalive probe failed ({status}): the queue pair is in the error state, or \
                 the peer stopped answering"
            ),
            CloseReason::CompletionError { work, status } => {
                write!(f, "work request {work:?} failed: {status}")
            }
            CloseReason::Violation(violation) => write!(f, "protocol violation: {violation}"),
            CloseReason::PeerDisconnected => f.write_str("the peer disconnected"),
        }
    }
}

/// A snapshot of a connection's counters and gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Credits held for the peer's receive ring (reserved one included).
    pub send_credits: u32,
    /// Re-posted receive slots whose credit has not been sent yet.
    pub pending_credit_return: u32,
    /// Receive slots held by the upper layer.
    pub recv_held: u32,
    /// Receive slots in the window (posted or held).
    pub recv_window: u32,
    /// Free send slots.
    pub send_free: u32,
    /// Send ring slots now (it starts at the send window and grows when found full).
    pub send_slots: u32,
    /// Reserved or committed frames not yet posted.
    pub send_unposted: u32,
    /// Posted send slots not yet reclaimed.
    pub send_unreclaimed: u32,
    /// A credit-only frame is outstanding in the control buffer.
    pub control_busy: bool,
    /// Frames posted (credit-only included).
    pub frames_sent: u64,
    /// Frames received (credit-only included).
    pub frames_received: u64,
    /// Credit-only frames posted.
    pub credit_only_sent: u64,
    /// Credit-only frames received.
    pub credit_only_received: u64,
    /// Sends posted signaled.
    pub signaled_sends: u64,
    /// [`SendError::WouldBlock`] results.
    pub would_block: u64,
    /// Large transfers under way (this side writing).
    pub large_transfers: u32,
    /// What counts against `max_grants`: grants open or asked for (the peer writing, or this
    /// side reading into them), advertised response buffers, and bodies offered.
    pub large_grants: u32,
    /// Bodies this side sent by rendezvous (`LargeRequest`, `LargeGrant`, WRITEs).
    pub large_rendezvous: u64,
    /// Responses this side wrote straight into the buffer their request advertised.
    pub large_into_advertised: u64,
    /// Request bodies this side offered for the peer to READ (`LargeSource`).
    pub large_sourced: u64,
    /// Bodies this side read from the peer's memory.
    pub large_read: u64,
    /// Response buffers this side advertised with its requests.
    pub response_buffers_advertised: u64,
    /// Responses the peer placed straight into a buffer this side advertised.
    pub response_buffers_filled: u64,
    /// Buffer requests of the peer refused because `large.max_queued` were waiting.
    pub large_queue_refusals: u64,
}

/// The sans-IO state machine of one RDMA connection. See the module documentation for the
/// driver loop.
#[derive(Debug)]
pub struct Connection {
    id: u64,
    geometry: Geometry,
    credits: Credits,
    send: SendRing,
    recv: RecvRing,
    /// Slots the receive window should grow by (see [`Connection::window_wanted`]).
    window_wanted: u32,
    large: Large,
    control_busy: bool,
    /// A keepalive probe is posted and not complete.
    probing: bool,
    /// The peer disconnected: draining (see `disconnect.rs`).
    draining: bool,
    /// Send-queue work requests handed to the driver (sends, writes, binds, invalidations).
    sq_posts: u64,
    /// `sq_posts` when the probe in flight was posted.
    probe_fence: u64,
    /// `sq_posts` as of the last probe that completed: all of those are complete too.
    fenced: u64,
    want_writable: bool,
    actions: VecDeque<Action>,
    closed: Option<CloseReason>,
    stats: Stats,
}

impl Connection {
    /// A connection with the negotiated geometry, established from the protocol's point of
    /// view: every receive slot of [`super::Config::initial_recv_posts`] must already be
    /// posted (before `rdma_connect`/`rdma_accept`), since the peer's initial credits count
    /// them.
    pub fn new(geometry: Geometry) -> Self {
        let capacity = geometry.recv_slots as usize + 2 * geometry.send_slots as usize + 2;
        Connection {
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
            geometry,
            credits: Credits::new(
                geometry.peer_recv_window,
                geometry.peer_recv_slots,
                geometry.recv_slots,
                geometry.credit_return_threshold,
            ),
            send: SendRing::new(
                geometry.send_window,
                geometry.send_slots,
                geometry.signal_interval,
                geometry.max_queued,
            ),
            recv: RecvRing::new(
                geometry.recv_slots,
                geometry.recv_window,
                geometry.recv_slot_size,
            ),
            window_wanted: 0,
            large: Large::new(geometry.large),
            control_busy: false,
            probing: false,
            draining: false,
            sq_posts: 0,
            probe_fence: 0,
            fenced: 0,
            want_writable: false,
            actions: VecDeque::with_capacity(capacity),
            closed: None,
            stats: Stats::default(),
        }
    }

    /// The negotiated geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Whether the connection is closed.
    #[inline]
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Why the connection closed, if it did.
    #[inline]
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }

    /// The next action for the driver, in order. The driver executes each before it takes
    /// the next, and before it posts a probe: the probe's place in the send queue is what
    /// [`Connection::is_drained`] relies on.
    #[inline]
    pub fn poll_action(&mut self) -> Option<Action> {
        let action = self.actions.pop_front()?;
        if matches!(
            action,
            Action::PostSend(_)
                | Action::PostWrite(_)
                | Action::BindWindow { .. }
                | Action::Invalidate { .. }
        ) {
            self.sq_posts += 1;
        }
        Some(action)
    }

    /// Counters and gauges.
    pub fn stats(&self) -> Stats {
        let large = self.large.counts();
        Stats {
            large_transfers: large.transfers,
            large_grants: large.grants,
            large_rendezvous: large.rendezvous,
            large_into_advertised: large.into_advertised,
            large_sourced: large.sourced,
            large_read: large.read,
            response_buffers_advertised: large.advertised,
            response_buffers_filled: large.advertised_filled,
            large_queue_refusals: large.queue_refusals,
            send_credits: self.credits.available(),
            pending_credit_return: self.credits.returnable(),
            recv_held: self.recv.held(),
            recv_window: self.recv.backed(),
            send_free: self.send.free(),
            send_slots: self.send.slots(),
            send_unposted: self.send.unposted(),
            send_unreclaimed: self.send.unreclaimed(),
            control_busy: self.control_busy,
            ..self.stats
        }
    }

    /// Whether [`Connection::reserve_send`] would find a slot now: a sender that prepares
    /// something before its frame (a response buffer to advertise) asks first.
    #[inline]
    pub fn can_reserve_send(&self) -> bool {
        self.closed.is_none() && self.send.can_reserve()
    }

    /// Reserves a send slot for a frame of `len` bytes (header included).
    ///
    /// [`SendError::WouldBlock`] when the ring is full or the queue bound is reached; an
    /// [`Action::Writable`] follows once a reservation can succeed.
    pub fn reserve_send(&mut self, len: usize) -> Result<SendReservation, SendError> {
        if self.closed.is_some() {
            return Err(SendError::Closed);
        }
        if len < COMPACT_HEADER_LEN {
            return Err(SendError::TooShort { len });
        }
        let max = self.geometry.max_send_frame;
        if len as u64 > u64::from(max) {
            return Err(SendError::TooLarge {
                len: len as u64,
                max,
            });
        }
        match self.send.reserve() {
            Some((slot, seq)) => Ok(SendReservation {
                connection: self.id,
                seq,
                slot,
                capacity: max,
            }),
            None => {
                self.want_writable = true;
                self.stats.would_block += 1;
                Err(SendError::WouldBlock)
            }
        }
    }

    /// Commits a reserved slot into which `header` and its body have been written. The frame
    /// is posted at once if it is next in line and a credit is available, otherwise it waits
    /// in the ring. The `credits` field of the written header is overwritten at post time
    /// ([`SendWork::prepare`]). On error the reservation is released.
    pub fn commit_send(
        &mut self,
        reservation: SendReservation,
        header: &Header,
    ) -> Result<(), SendError> {
        if self.closed.is_some() {
            return Err(SendError::Closed);
        }
        let seq = reservation.seq;
        if reservation.connection != self.id || !self.send.is_reserved(seq) {
            return Err(SendError::UnknownReservation {
                slot: reservation.slot,
            });
        }
        let checked = Self::check_frame(header, reservation.capacity)
            .and_then(|()| self.check_advertisement(header));
        if let Err(err) = checked {
            self.abort_send(reservation);
            return Err(err);
        }
        let pending = Pending {
            len: (header.encoded_len() as u64 + header.body_len()) as u32,
            kind: header.kind,
            call_id: header.call_id,
            frame: None,
        };
        let committed = self.send.commit(seq, pending);
        debug_assert!(committed);
        match header.kind {
            FrameKind::Cancel => self.large.abort(header.call_id, &mut self.actions),
            FrameKind::Response => self.large.on_answered(header.call_id),
            _ => {}
        }
        self.flush();
        Ok(())
    }

    fn check_frame(header: &Header, capacity: u32) -> Result<(), SendError> {
        let protocol_owned = header.kind == FrameKind::CreditOnly
            || header.kind.is_rendezvous()
            || header.flags.contains(Flags::LARGE_PAYLOAD);
        if protocol_owned {
            return Err(SendError::ReservedKind(header.kind));
        }
        // The field rules alone: the types rule out everything else the peer's decoder checks.
        header.validate().map_err(SendError::InvalidHeader)?;
        let len = header.encoded_len() as u64 + header.body_len();
        if len > u64::from(capacity) {
            return Err(SendError::TooLarge { len, max: capacity });
        }
        Ok(())
    }

    /// Gives a reservation back without sending anything.
    pub fn abort_send(&mut self, reservation: SendReservation) {
        if self.closed.is_some() || reservation.connection != self.id {
            return;
        }
        if self.send.abort(reservation.seq) {
            self.flush();
        }
    }

    /// Send slots to have memory for, when more than the driver backs: twice the ring's (up
    /// to `send_slots`) once a reservation found it full; 0 otherwise. The driver registers
    /// what is missing and calls [`Self::back_send_slots`].
    #[inline]
    pub fn send_slots_wanted(&self) -> u32 {
        self.send.wanted()
    }

    /// The driver has memory for `n` send slots (at most `send_slots`): the ring grows to
    /// them as soon as no slot is in use, and async senders waiting for room are told.
    pub fn back_send_slots(&mut self, n: u32) {
        if self.closed.is_none() {
            self.send.back(n);
            self.flush();
        }
    }

    /// A send completed successfully (only signaled sends complete). Reclaims its slot and
    /// every earlier one, or frees the control buffer.
    pub fn on_send_complete(&mut self, target: SendTarget) -> Result<(), ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(());
        }
        match target {
            SendTarget::Ring(slot) => {
                if let Err(violation) = self.send.on_completion(slot) {
                    return Err(self.fail(violation));
                }
            }
            SendTarget::Control if self.control_busy => self.control_busy = false,
            SendTarget::Control => {
                return Err(self.fail(ProtocolViolation::UnexpectedControlCompletion))
            }
        }
        self.flush();
        Ok(())
    }

    /// A work request completed with an error status (including flushes after the QP went to
    /// the error state), named by `status` for the close reason. Closes the connection; frames
    /// not yet posted are dropped. The first reason stays: the flushes that follow a real
    /// error do not hide it.
    pub fn on_completion_error(&mut self, work: WorkId, status: &str) {
        if self.draining && !self.is_closed() {
            self.on_drain_error(work);
            return;
        }
        self.close_with(CloseReason::CompletionError {
            work,
            status: status.to_owned(),
        });
    }

    /// Closes the connection locally; frames not yet posted are dropped.
    pub fn close(&mut self) {
        self.close_with(CloseReason::Local);
    }

    fn fail(&mut self, violation: ProtocolViolation) -> ProtocolViolation {
        tracing::warn!(%violation, "rdma protocol violation; closing connection");
        self.close_with(CloseReason::Violation(violation.clone()));
        violation
    }

    fn close_with(&mut self, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        tracing::debug!(?reason, "rdma connection closed");
        self.closed = Some(reason);
        // Actions not yet executed: SENDs never reach the wire, RECVs and wake-ups are moot;
        // a body whose window is gone is still handed up (it arrived: what a drain after the
        // peer's disconnect is for), and a buffer whose window is gone still given back.
        self.actions.retain_mut(|action| match *action {
            Action::PostSend(SendWork {
                target: SendTarget::Ring(slot),
                kind,
                call_id,
                ..
            }) => {
                *action = Action::SendDropped {
                    slot,
                    kind,
                    call_id,
                };
                true
            }
            Action::SendDropped { .. }
            | Action::DeliverLarge { .. }
            | Action::ReleaseGrant { .. } => true,
            _ => false,
        });
        let actions = &mut self.actions;
        self.send.drop_unposted(|slot, p| {
            actions.push_back(Action::SendDropped {
                slot,
                kind: p.kind,
                call_id: p.call_id,
            });
        });
        // A sender waiting for capacity retries and learns of the close (EPOLLOUT|EPOLLERR).
        if std::mem::take(&mut self.want_writable) {
            self.actions.push_back(Action::Writable);
        }
    }

    /// Posts every frame that can go now, then returns credits explicitly if they are due and
    /// no frame carried them, then wakes a blocked sender.
    fn flush(&mut self) {
        loop {
            if self.large.has_sends() {
                self.flush_large();
            }
            // Posting makes room in the ring for header-only frames that found none
            // (`max_queued`): they go now, as no later event may come to post them.
            if !self.post_committed() || !self.large.has_frames() {
                break;
            }
        }
        let max_inline = self.geometry.max_inline;
        if !self.control_busy && self.credits.return_due() && self.credits.can_send_control() {
            self.credits.consume();
            self.control_busy = true;
            self.stats.credit_only_sent += 1;
            let credits = self.credits.take_returnable();
            tracing::trace!(credits, "returning credits in a credit-only frame");
            self.push_send(SendWork {
                target: SendTarget::Control,
                len: CONTROL_BUF_LEN as u32,
                credits,
                signaled: true,
                inline: CONTROL_BUF_LEN as u32 <= max_inline,
                kind: FrameKind::CreditOnly,
                call_id: 0,
                frame: None,
            });
        }
        if self.want_writable && self.send.can_reserve() {
            self.want_writable = false;
            self.actions.push_back(Action::Writable);
        }
    }

    /// Posts committed frames in order while credits allow; whether it posted any.
    fn post_committed(&mut self) -> bool {
        let max_inline = self.geometry.max_inline;
        let mut posted = false;
        while self.credits.can_send_data() {
            let Some(pending) = self.send.next_committed() else {
                break;
            };
            self.credits.consume();
            let (slot, signaled) = self.send.mark_posted();
            let credits = self.credits.take_returnable();
            self.push_send(SendWork {
                target: SendTarget::Ring(slot),
                len: pending.len,
                credits,
                signaled,
                inline: pending.len <= max_inline,
                kind: pending.kind,
                call_id: pending.call_id,
                frame: pending.frame,
            });
            posted = true;
        }
        posted
    }

    fn push_send(&mut self, work: SendWork) {
        self.stats.frames_sent += 1;
        self.stats.signaled_sends += u64::from(work.signaled);
        self.actions.push_back(Action::PostSend(work));
    }

    /// Nothing of the large-body path is under way or remembered (tests only).
    #[cfg(test)]
    pub(crate) fn large_idle(&self) -> bool {
        self.large.is_idle()
    }

    /// Panics if the bookkeeping is inconsistent (tests only).
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        self.send.assert_invariants();
        self.recv.assert_invariants();
        assert!(self.credits.available() <= self.geometry.peer_recv_slots);
        assert!(self.credits.returnable() <= self.recv.posted());
        assert!(self.recv.backed() >= self.geometry.recv_window);
        if self.closed.is_none() && self.large.is_idle() {
            let cap = self.geometry.recv_slots as usize + 2 * self.geometry.send_slots as usize + 2;
            assert!(
                self.actions.len() <= cap,
                "action queue outgrew its pre-sized capacity"
            );
        }
    }
}
