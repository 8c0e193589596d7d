//! The send ring: slot allocation, in-order posting, selective signaling and reclaim.
//!
//! Slots are handed out in sequence order and posted strictly in that order (a committed
//! slot waits for earlier reservations), so a signaled completion proves every earlier slot
//! done: RC completes a send queue in order. Sequence numbers are `u64`s that never wrap in
//! practice; slot index = `seq % slots`.
//!
//! ```text
//!   reclaimed        next_post              head
//!       |  posted ...    |  reserved/committed  |   free ...
//! ```
//!
//! Signaling: a post is signaled every `interval` posts (at most the ring's slots while it
//! is below its most), and whenever it leaves no free slot.
//! A full ring therefore always has a signaled send outstanding or a slot still to be posted
//! (which will be signaled), so reclaim can never stall.
//!
//! Growth: the ring may start smaller than its most slots (`max`). A reservation that finds
//! it full asks for twice the slots ([`SendRing::wanted`]); once the driver has memory for
//! them ([`SendRing::back`]) the ring grows the next time it is empty (every slot reclaimed,
//! so the device reads none), and counts slots from 0 again: `index = (seq − base) % slots`.
//! A full ring always drains (see above), so a wanted growth always happens.

use std::collections::VecDeque;

use rpc_wire::{FrameKind, Header};

use super::error::ProtocolViolation;

/// A committed frame waiting to be posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Frame length.
    pub(crate) len: u32,
    /// Frame kind.
    pub(crate) kind: FrameKind,
    /// Call id.
    pub(crate) call_id: u64,
    /// The whole frame, when the protocol generated it (header-only).
    pub(crate) frame: Option<Header>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not in use.
    Free,
    /// Handed to the caller, being written.
    Reserved,
    /// Written and committed, waiting for its turn and a credit.
    Committed(Pending),
    /// Reservation given back while a later one was outstanding: a hole, never posted.
    Aborted,
    /// Posted (or a skipped hole), waiting for a signaled completion to reclaim it.
    Posted,
}

/// Send-ring bookkeeping; every operation is O(1) (reclaim amortized).
#[derive(Debug)]
pub(crate) struct SendRing {
    slots: Vec<Slot>,
    /// The sequence number of slot 0 since the last growth.
    base: u64,
    /// Slots the driver has memory for (the ring grows to them when empty).
    backed: u32,
    /// Most slots the ring may grow to.
    max: u32,
    /// A reservation found the ring full: more slots are wanted.
    full: bool,
    /// Everything before this sequence number is free.
    reclaimed: u64,
    /// Next sequence number to post.
    next_post: u64,
    /// Next sequence number to reserve.
    head: u64,
    /// Outstanding signaled sends, oldest first.
    signaled: VecDeque<u64>,
    since_signal: u32,
    interval: u32,
    max_queued: u32,
}

impl SendRing {
    /// A ring of `slots` that may grow to `max`.
    pub(crate) fn new(slots: u32, max: u32, interval: u32, max_queued: u32) -> Self {
        debug_assert!(slots >= 1 && slots <= max);
        SendRing {
            slots: vec![Slot::Free; slots as usize],
            base: 0,
            backed: slots,
            max,
            full: false,
            reclaimed: 0,
            next_post: 0,
            head: 0,
            signaled: VecDeque::with_capacity(max as usize),
            since_signal: 0,
            interval,
            max_queued,
        }
    }

    fn count(&self) -> u64 {
        self.slots.len() as u64
    }

    fn index(&self, seq: u64) -> usize {
        ((seq - self.base) % self.count()) as usize
    }

    /// Slots the ring has now.
    pub(crate) fn slots(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Slots the ring should have memory for, if more than it has memory for: twice what it
    /// has (up to its most) once a reservation found it full. 0: none wanted.
    pub(crate) fn wanted(&self) -> u32 {
        let wanted = (self.slots() * 2).min(self.max);
        if self.full && wanted > self.backed {
            wanted
        } else {
            0
        }
    }

    /// The driver has memory for `n` slots (at most the ring's most): the ring grows to them
    /// when it is next empty.
    pub(crate) fn back(&mut self, n: u32) {
        self.backed = self.backed.max(n.min(self.max));
        self.grow_if_empty();
    }

    fn grow_if_empty(&mut self) {
        if self.backed > self.slots() && self.reclaimed == self.head {
            self.slots.resize(self.backed as usize, Slot::Free);
            self.base = self.head;
            self.full = false;
        }
    }

    /// Slot index of a sequence number.
    pub(crate) fn slot_of(&self, seq: u64) -> u32 {
        self.index(seq) as u32
    }

    /// Slots neither reserved, queued, nor awaiting reclaim.
    pub(crate) fn free(&self) -> u32 {
        (self.count() - (self.head - self.reclaimed)) as u32
    }

    /// Reserved or committed slots not yet posted.
    pub(crate) fn unposted(&self) -> u32 {
        (self.head - self.next_post) as u32
    }

    /// Posted slots not yet reclaimed.
    pub(crate) fn unreclaimed(&self) -> u32 {
        (self.next_post - self.reclaimed) as u32
    }

    /// Whether [`Self::reserve`] would succeed.
    pub(crate) fn can_reserve(&self) -> bool {
        self.free() > 0 && self.unposted() < self.max_queued
    }

    /// Hands out the next slot: `(slot, seq)`.
    pub(crate) fn reserve(&mut self) -> Option<(u32, u64)> {
        if !self.can_reserve() {
            if self.free() == 0 && self.slots() < self.max {
                self.full = true;
            }
            return None;
        }
        let seq = self.head;
        let i = self.index(seq);
        self.slots[i] = Slot::Reserved;
        self.head += 1;
        Some((i as u32, seq))
    }

    /// Whether `seq` is an outstanding (uncommitted) reservation.
    pub(crate) fn is_reserved(&self, seq: u64) -> bool {
        (self.next_post..self.head).contains(&seq) && self.slots[self.index(seq)] == Slot::Reserved
    }

    /// Marks a reservation written; false if `seq` is not an outstanding reservation.
    pub(crate) fn commit(&mut self, seq: u64, pending: Pending) -> bool {
        if !self.is_reserved(seq) {
            return false;
        }
        let i = self.index(seq);
        self.slots[i] = Slot::Committed(pending);
        true
    }

    /// Gives a reservation back; false if `seq` is not an outstanding reservation.
    pub(crate) fn abort(&mut self, seq: u64) -> bool {
        if !self.is_reserved(seq) {
            return false;
        }
        let i = self.index(seq);
        self.slots[i] = Slot::Aborted;
        // Trailing holes are simply un-reserved, so the last reserved slot is never a hole.
        while self.head > self.next_post {
            let last = self.index(self.head - 1);
            if self.slots[last] != Slot::Aborted {
                break;
            }
            self.slots[last] = Slot::Free;
            self.head -= 1;
        }
        true
    }

    /// The next frame to post, if it is committed (skipping holes).
    pub(crate) fn next_committed(&mut self) -> Option<Pending> {
        while self.next_post < self.head {
            let i = self.index(self.next_post);
            match self.slots[i] {
                Slot::Aborted => {
                    self.slots[i] = Slot::Posted;
                    self.next_post += 1;
                }
                Slot::Committed(p) => return Some(p),
                _ => return None,
            }
        }
        None
    }

    /// Posts the frame [`Self::next_committed`] returned: `(slot, signaled)`.
    pub(crate) fn mark_posted(&mut self) -> (u32, bool) {
        let seq = self.next_post;
        let i = self.index(seq);
        debug_assert!(matches!(self.slots[i], Slot::Committed(_)));
        self.slots[i] = Slot::Posted;
        self.next_post += 1;
        self.since_signal += 1;
        // A ring smaller than its most signals at least once per lap, so the post that
        // fills it is signaled. A connection that sends one frame at a time and sees each
        // send complete before it sends the next (the peer acknowledges a frame before it
        // can answer it) reclaims as it goes and never finds its ring full: only
        // concurrency grows it. Each completion costs a poll and a pass through the
        // protocol (about 1,000 instructions), so the fewer the better.
        let interval = if self.slots() < self.max {
            self.interval.min(self.slots())
        } else {
            self.interval
        };
        let signaled = self.since_signal >= interval || self.free() == 0;
        if signaled {
            self.since_signal = 0;
            self.signaled.push_back(seq);
        }
        (i as u32, signaled)
    }

    /// A signaled send completed: reclaims it and every earlier slot.
    pub(crate) fn on_completion(&mut self, slot: u32) -> Result<(), ProtocolViolation> {
        let expected = self.signaled.front().map(|&seq| self.slot_of(seq));
        let Some(seq) = self
            .signaled
            .front()
            .copied()
            .filter(|_| expected == Some(slot))
        else {
            return Err(ProtocolViolation::UnexpectedSendCompletion { slot, expected });
        };
        self.signaled.pop_front();
        for s in self.reclaimed..=seq {
            let i = self.index(s);
            self.slots[i] = Slot::Free;
        }
        self.reclaimed = seq + 1;
        self.grow_if_empty();
        Ok(())
    }

    /// Empties the unposted part of the ring (connection closing), reporting each committed
    /// frame that will now never be sent.
    pub(crate) fn drop_unposted(&mut self, mut dropped: impl FnMut(u32, Pending)) {
        for seq in self.next_post..self.head {
            let i = self.index(seq);
            if let Slot::Committed(p) = self.slots[i] {
                dropped(i as u32, p);
            }
            self.slots[i] = Slot::Free;
        }
        self.head = self.next_post;
    }

    /// Panics if the bookkeeping is inconsistent (tests only).
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        assert!(self.reclaimed <= self.next_post && self.next_post <= self.head);
        assert!(self.head - self.reclaimed <= self.count());
        assert!(self.base <= self.reclaimed);
        assert!(self.slots() <= self.backed && self.backed <= self.max);
        assert!(self.unposted() <= self.max_queued);
        for seq in self.reclaimed..self.head {
            let state = self.slots[self.index(seq)];
            if seq < self.next_post {
                assert_eq!(state, Slot::Posted, "seq {seq}");
            } else {
                assert!(matches!(
                    state,
                    Slot::Reserved | Slot::Committed(_) | Slot::Aborted
                ));
            }
        }
        if self.head > self.next_post {
            assert_ne!(
                self.slots[self.index(self.head - 1)],
                Slot::Aborted,
                "trailing hole"
            );
        }
        let in_posted = |s: &u64| (self.reclaimed..self.next_post).contains(s);
        assert!(self.signaled.iter().all(in_posted));
        assert!(self
            .signaled
            .iter()
            .zip(self.signaled.iter().skip(1))
            .all(|(a, b)| a < b));
        if self.free() == 0 && self.unposted() == 0 {
            assert!(
                !self.signaled.is_empty(),
                "full ring with nothing signaled: reclaim stalls"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Pending = Pending {
        len: 64,
        kind: FrameKind::Request,
        call_id: 1,
        frame: None,
    };

    fn post_one(r: &mut SendRing) -> (u32, bool) {
        let (_, seq) = r.reserve().unwrap();
        assert!(r.commit(seq, P));
        assert_eq!(r.next_committed(), Some(P));
        let out = r.mark_posted();
        r.assert_invariants();
        out
    }

    #[test]
    fn signals_every_nth_and_when_full() {
        let mut r = SendRing::new(8, 8, 3, 8);
        let signaled: Vec<bool> = (0..8).map(|_| post_one(&mut r).1).collect();
        // Every third, plus the eighth because it fills the ring.
        assert_eq!(
            signaled,
            [false, false, true, false, false, true, false, true]
        );
        assert!(r.reserve().is_none());
        assert!(r.on_completion(2).is_ok());
        assert_eq!(r.free(), 3);
        assert!(r.on_completion(5).is_ok());
        assert!(r.on_completion(7).is_ok());
        assert_eq!((r.free(), r.unreclaimed()), (8, 0));
        r.assert_invariants();
    }

    #[test]
    fn posts_into_a_full_ring_are_signaled_regardless_of_interval() {
        let mut r = SendRing::new(3, 3, 3, 3);
        assert!(!post_one(&mut r).1);
        assert!(
            r.on_completion(0).is_err(),
            "unsignaled send never completes"
        );
        let (_, a) = r.reserve().unwrap();
        let (_, b) = r.reserve().unwrap();
        assert_eq!(r.free(), 0);
        assert!(r.commit(a, P) && r.commit(b, P));
        r.next_committed();
        assert_eq!(r.mark_posted(), (1, true));
        r.next_committed();
        assert_eq!(r.mark_posted(), (2, true));
        r.assert_invariants();
        assert!(r.on_completion(1).is_ok());
        assert_eq!(r.free(), 2);
    }

    #[test]
    fn a_small_ring_signals_once_a_lap_and_one_frame_at_a_time_never_fills_it() {
        let mut r = SendRing::new(2, 64, 16, 64);
        let mut signaled = 0;
        for _ in 0..100 {
            let (slot, signal) = post_one(&mut r);
            if signal {
                signaled += 1;
                // Completes before the next frame is reserved.
                r.on_completion(slot).unwrap();
            }
        }
        assert_eq!(signaled, 50, "every second post of a 2-slot ring");
        assert_eq!(r.wanted(), 0, "never found full: no growth wanted");
        let mut r = SendRing::new(4, 64, 16, 64);
        let signals: Vec<bool> = (0..4).map(|_| post_one(&mut r).1).collect();
        assert_eq!(
            signals,
            [false, false, false, true],
            "a 4-slot ring: once a lap"
        );
        assert!(r.reserve().is_none());
        assert_eq!(r.wanted(), 8, "found full: twice the slots wanted");
    }

    #[test]
    fn completions_must_match_the_oldest_signaled_send() {
        let mut r = SendRing::new(4, 4, 1, 4);
        post_one(&mut r);
        post_one(&mut r);
        assert_eq!(
            r.on_completion(1),
            Err(ProtocolViolation::UnexpectedSendCompletion {
                slot: 1,
                expected: Some(0)
            })
        );
        assert!(r.on_completion(0).is_ok());
        assert!(r.on_completion(1).is_ok());
        assert!(r.on_completion(2).is_err());
    }

    #[test]
    fn posts_in_reservation_order_and_skips_holes() {
        let mut r = SendRing::new(4, 4, 4, 4);
        let (_, a) = r.reserve().unwrap();
        let (_, b) = r.reserve().unwrap();
        let (_, c) = r.reserve().unwrap();
        assert!(r.commit(c, P));
        assert_eq!(r.next_committed(), None, "c waits for a and b");
        assert!(r.abort(a));
        assert_eq!(r.next_committed(), None, "b still reserved");
        assert!(r.commit(b, P));
        assert_eq!(r.next_committed(), Some(P));
        assert_eq!(r.mark_posted().0, 1);
        assert_eq!(r.next_committed(), Some(P));
        assert_eq!(r.mark_posted().0, 2);
        r.assert_invariants();
        assert!(!r.commit(b, P), "double commit rejected");
        assert!(!r.abort(99));
    }

    #[test]
    fn aborting_the_last_reservations_rolls_back() {
        let mut r = SendRing::new(3, 3, 3, 3);
        let (_, a) = r.reserve().unwrap();
        let (_, b) = r.reserve().unwrap();
        let (_, c) = r.reserve().unwrap();
        assert!(r.abort(b));
        assert_eq!(r.free(), 0);
        assert!(r.abort(c));
        assert_eq!(r.free(), 2, "c and the hole b rolled back");
        assert!(r.abort(a));
        assert_eq!(r.free(), 3);
        r.assert_invariants();
    }

    #[test]
    fn queue_bound_limits_unposted_frames() {
        let mut r = SendRing::new(8, 8, 1, 2);
        r.reserve().unwrap();
        r.reserve().unwrap();
        assert!(!r.can_reserve());
        assert_eq!(r.free(), 6);
    }

    #[test]
    fn a_full_ring_grows_once_backed_and_drained_and_starts_at_slot_zero() {
        let mut r = SendRing::new(2, 5, 2, 5);
        assert_eq!(
            r.wanted(),
            0,
            "nothing wanted before the ring is found full"
        );
        let (a, _) = r.reserve().unwrap();
        let (b, _) = r.reserve().unwrap();
        assert_eq!((a, b), (0, 1));
        assert!(r.reserve().is_none());
        assert_eq!(r.wanted(), 4, "twice the slots");
        r.back(4);
        assert_eq!(r.wanted(), 0, "backed");
        assert_eq!(r.slots(), 2, "no growth while slots are in use");
        r.commit(0, P);
        r.commit(1, P);
        assert_eq!(r.next_committed(), Some(P));
        assert_eq!(r.mark_posted(), (0, true), "a full ring signals");
        assert_eq!(r.next_committed(), Some(P));
        assert_eq!(r.mark_posted(), (1, true));
        r.assert_invariants();
        r.on_completion(0).unwrap();
        assert_eq!(r.slots(), 2, "slot 1 is still in use");
        r.on_completion(1).unwrap();
        assert_eq!((r.slots(), r.free()), (4, 4), "grown once drained");
        r.assert_invariants();
        let (c, seq) = r.reserve().unwrap();
        assert_eq!((c, seq), (0, 2), "slots count from 0 again");
        for _ in 0..3 {
            r.reserve().unwrap();
        }
        assert!(r.reserve().is_none());
        assert_eq!(r.wanted(), 5, "capped at the most slots");
        r.back(9);
        r.assert_invariants();
    }
}
