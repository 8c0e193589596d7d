//! The receive side of the connection's API: completions of RECVs (a ring of its own or a
//! shared receive queue), releases by the upper layer, and the receive window.

use rpc_wire::{Flags, FrameKind, Header};

use super::{Connection, GROW_AT};
use crate::action::{Action, Received};
use crate::credits::RESERVED_CREDITS;
use crate::error::ProtocolViolation;

impl Connection {
    /// A RECV completed successfully with `byte_len` bytes in `slot`; `slot_bytes` is the
    /// slot's memory (at least `byte_len` bytes). Returns the frame for the upper layer, or
    /// `None` when the protocol consumed it (credit-only frame; its slot is re-posted).
    pub fn on_recv_complete(
        &mut self,
        slot: u32,
        byte_len: u32,
        slot_bytes: &[u8],
    ) -> Result<Option<Received>, ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(None);
        }
        match self.recv.accept(slot, byte_len, slot_bytes) {
            Ok(header) => self.on_frame(slot, byte_len, header),
            Err(violation) => Err(self.fail(violation)),
        }
    }

    /// A RECV of the shared receive queue completed for this connection with `byte_len`
    /// bytes in `buf` (the pool's buffer, at least `byte_len` bytes). Like
    /// [`Self::on_recv_complete`], except that the connection picks the slot (the credit)
    /// the frame used: [`Received::slot`] names it, and the driver remembers which buffer
    /// backs it until [`Self::release_shared`]. A frame the peer had no credit for is
    /// [`ProtocolViolation::RecvWithoutCredit`]; its buffer goes straight back to the queue.
    pub fn on_shared_recv_complete(
        &mut self,
        byte_len: u32,
        buf: &[u8],
    ) -> Result<Option<Received>, ProtocolViolation> {
        debug_assert!(self.geometry.shared_recv);
        if self.closed.is_some() {
            return Ok(None);
        }
        match self.recv.accept_any(byte_len, buf) {
            Ok((slot, header)) => self.on_frame(slot, byte_len, header),
            Err(violation) => Err(self.fail(violation)),
        }
    }

    fn on_frame(
        &mut self,
        slot: u32,
        byte_len: u32,
        header: Header,
    ) -> Result<Option<Received>, ProtocolViolation> {
        let credit_only = header.kind == FrameKind::CreditOnly;
        if credit_only && header.credits == 0 {
            return Err(self.fail(ProtocolViolation::EmptyCreditOnly));
        }
        if let Err(violation) = self.credits.grant(header.credits) {
            return Err(self.fail(violation));
        }
        self.stats.frames_received += 1;
        if credit_only {
            self.stats.credit_only_received += 1;
        }
        // A body whose offer we refused: its notice (and any response buffer it advertises)
        // goes no further.
        let refused =
            header.flags.contains(Flags::LARGE_PAYLOAD) && self.large.take_refused(&header);
        let offered = match header.kind {
            _ if refused => Ok(()),
            FrameKind::Request if header.flags.contains(Flags::RESPONSE_BUFFER) => {
                self.large.on_offer(&header)
            }
            // An answer in a slot ends the buffer we advertised for it.
            FrameKind::Response if !header.flags.contains(Flags::LARGE_PAYLOAD) => {
                self.large
                    .end_advertisement(header.call_id, &mut self.actions);
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(violation) = offered {
            return Err(self.fail(violation));
        }
        let consumed = match header.kind {
            _ if refused => Ok(true),
            FrameKind::CreditOnly => Ok(true),
            FrameKind::LargeSource => self
                .large
                .on_source(&header, &mut self.actions)
                .map(|()| true),
            FrameKind::LargeSourceDone => self
                .large
                .on_source_done(&header, &mut self.actions)
                .map(|()| true),
            FrameKind::LargeRequest => self
                .large
                .on_buffer_request(&header, &mut self.actions)
                .map(|()| true),
            FrameKind::LargeGrant => self
                .large
                .on_grant(&header, &mut self.actions)
                .map(|()| true),
            _ if header.flags.contains(Flags::LARGE_PAYLOAD) => self
                .large
                .on_placed(&header, &mut self.actions)
                .map(|()| true),
            FrameKind::Cancel => {
                self.large.on_peer_cancel(header.call_id, &mut self.actions);
                Ok(false)
            }
            _ => Ok(false),
        };
        match consumed {
            Err(violation) => return Err(self.fail(violation)),
            Ok(true) => {
                let released = self.recv.release(slot, false);
                debug_assert!(released.is_ok());
                self.repost(slot);
                self.want_window();
                self.flush();
                return Ok(None);
            }
            Ok(false) => {}
        }
        self.want_window();
        self.flush();
        Ok(Some(Received {
            slot,
            header,
            len: byte_len,
            // `held` counts this frame's slot already.
            lend: self.recv.held() <= self.geometry.lend_limit,
        }))
    }

    /// The upper layer is done with a received slot: it is re-posted and its credit becomes
    /// returnable. Slots may be released in any order. After close this is a no-op.
    pub fn release_recv(&mut self, slot: u32) -> Result<(), ProtocolViolation> {
        self.release(slot, false).map(drop)
    }

    /// [`Self::release_recv`] for a slot backed by a shared receive queue, whose buffer the
    /// driver has just re-posted. With `shrink` (the pool is short of buffers) a slot above
    /// the initial window leaves the window instead of returning its credit. Returns
    /// whether the buffer's commitment goes back to the pool ([`crate::SharedPool::give_back`]):
    /// the slot left the window, or the connection is closed.
    pub fn release_shared(&mut self, slot: u32, shrink: bool) -> Result<bool, ProtocolViolation> {
        let retire = shrink && self.recv.backed() > self.geometry.recv_window;
        self.release(slot, retire)
    }

    fn release(&mut self, slot: u32, retire: bool) -> Result<bool, ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(true);
        }
        if let Err(violation) = self.recv.release(slot, retire) {
            return Err(self.fail(violation));
        }
        if retire {
            self.window_changed();
        } else {
            self.repost(slot);
        }
        self.flush();
        Ok(retire)
    }

    /// How many slots the receive window should grow by: set when a frame arrives and
    /// leaves the peer with at most [`GROW_AT`] credits it could use (the window limits
    /// it), to double the window up to the ring. The driver grows it with
    /// [`Self::grow_window`] as far as it can back the slots (a shared receive queue's pool
    /// may grant fewer, or none).
    #[inline]
    pub fn window_wanted(&self) -> u32 {
        if self.closed.is_some() {
            0
        } else {
            self.window_wanted
        }
    }

    /// Grows the receive window by up to `n` slots, the driver having posted (or, with a
    /// shared receive queue, committed) a receive for each: their credits become
    /// returnable. Returns how many slots joined (fewer if the ring is full or the
    /// connection closed).
    pub fn grow_window(&mut self, n: u32) -> u32 {
        if self.closed.is_some() {
            return 0;
        }
        let mut grown = 0;
        while grown < n {
            let Some(slot) = self.recv.extend() else {
                break;
            };
            self.repost(slot);
            grown += 1;
        }
        self.window_wanted = 0;
        if grown > 0 {
            self.window_changed();
            self.flush();
        }
        grown
    }

    /// How many released receive slots the driver may gather before it hands them back
    /// with [`Self::release_recv`] (one call each, together): at most an eighth of the
    /// window, and few enough that the peer never runs out of data credits while the rest
    /// wait. With everything else held at its limit (the upper layer keeping
    /// [`crate::Config::lend_limit`] slots, one short of the credit-return threshold
    /// returnable, the reserved credit), `batch − 1` gathered slots still leave the peer a
    /// credit for the frame whose release completes the batch. 1 (release each at once)
    /// for small windows and with a shared receive queue, whose buffers serve every
    /// connection.
    pub fn release_batch(&self) -> u32 {
        if self.geometry.shared_recv {
            return 1;
        }
        let window = self.recv.backed();
        // The threshold follows the window (see `window_changed`).
        let held_elsewhere = self.geometry.lend_limit + self.credits.threshold() + RESERVED_CREDITS;
        (window / 8)
            .min((window + 1).saturating_sub(held_elsewhere))
            .max(1)
    }

    /// Receive slots currently posted (credits with the peer, in flight or returnable). With
    /// a shared receive queue, what the pool gets back ([`crate::SharedPool::give_back`])
    /// once the QP can receive no more (moved to the error state or destroyed).
    #[inline]
    pub fn recv_posted(&self) -> u32 {
        self.recv.posted()
    }

    fn want_window(&mut self) {
        let backed = self.recv.backed();
        let peer_side = self.recv.posted().saturating_sub(self.credits.returnable());
        if peer_side <= GROW_AT && backed < self.geometry.recv_slots {
            self.window_wanted = backed.min(self.geometry.recv_slots - backed);
        }
    }

    /// The window grew or shrank: the credit-return threshold follows it.
    fn window_changed(&mut self) {
        let threshold = self.geometry.credit_threshold_for(self.recv.backed());
        self.credits.set_threshold(threshold);
    }

    fn repost(&mut self, slot: u32) {
        if !self.geometry.shared_recv {
            self.actions.push_back(Action::PostRecv { slot });
        }
        self.credits.on_reposted();
    }
}
