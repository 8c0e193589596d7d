//! The receive ring: which slots are backed by a posted RECV, which the upper layer holds,
//! which are not backed at all (outside the window), and the validation of every received
//! frame before anything in it is trusted.
//!
//! Slots may be released in any order (a handler may keep one while it decodes); the ring
//! only tracks per-slot state, it does not assume the RECV queue order. With a shared
//! receive queue a slot is a credit rather than memory: the completion names the buffer,
//! not the slot, and [`RecvRing::accept_any`] picks any posted one.

use rpc_wire::Header;

use super::error::ProtocolViolation;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A RECV is posted (or about to be: the PostRecv action is queued), or with a shared
    /// receive queue, the pool has committed a posted buffer to it.
    Posted,
    /// Delivered to the upper layer, not yet released.
    Held,
    /// Outside the window: no RECV, no credit.
    Unbacked,
}

/// Receive-ring bookkeeping; every operation is O(1).
#[derive(Debug)]
pub(crate) struct RecvRing {
    slots: Box<[Slot]>,
    /// Posted slots, in any order, and unbacked slots: each slot's index in its stack is
    /// in `pos`.
    posted: Vec<u32>,
    unbacked: Vec<u32>,
    pos: Box<[u32]>,
    slot_size: u32,
    held: u32,
}

impl RecvRing {
    /// A ring whose first `window` slots are posted (the connection or the pool emits the
    /// initial posts) and the rest unbacked.
    pub(crate) fn new(slots: u32, window: u32, slot_size: u32) -> Self {
        debug_assert!(window <= slots);
        RecvRing {
            slots: (0..slots)
                .map(|s| {
                    if s < window {
                        Slot::Posted
                    } else {
                        Slot::Unbacked
                    }
                })
                .collect(),
            posted: (0..window).rev().collect(),
            unbacked: (window..slots).rev().collect(),
            pos: (0..slots)
                .map(|s| {
                    if s < window {
                        window - 1 - s
                    } else {
                        slots - 1 - s
                    }
                })
                .collect(),
            slot_size,
            held: 0,
        }
    }

    /// Slots held by the upper layer.
    pub(crate) fn held(&self) -> u32 {
        self.held
    }

    /// Slots backed by a posted receive.
    pub(crate) fn posted(&self) -> u32 {
        self.posted.len() as u32
    }

    /// Slots in the window: posted or held.
    pub(crate) fn backed(&self) -> u32 {
        self.posted() + self.held
    }

    fn take(&mut self, slot: u32, state: Slot) {
        let stack = match state {
            Slot::Posted => &mut self.posted,
            Slot::Unbacked => &mut self.unbacked,
            Slot::Held => return,
        };
        let at = self.pos[slot as usize] as usize;
        debug_assert_eq!(stack[at], slot);
        stack.swap_remove(at);
        if let Some(&moved) = stack.get(at) {
            self.pos[moved as usize] = at as u32;
        }
    }

    fn put(&mut self, slot: u32, state: Slot) {
        let stack = match state {
            Slot::Posted => &mut self.posted,
            Slot::Unbacked => &mut self.unbacked,
            Slot::Held => {
                self.held += 1;
                self.slots[slot as usize] = state;
                return;
            }
        };
        self.pos[slot as usize] = stack.len() as u32;
        stack.push(slot);
        self.slots[slot as usize] = state;
    }

    fn set(&mut self, slot: u32, state: Slot) {
        let old = self.slots[slot as usize];
        if old == Slot::Held {
            self.held -= 1;
        }
        self.take(slot, old);
        self.put(slot, state);
    }

    /// Validates a receive completion for `slot` carrying `byte_len` bytes, `buf` being the
    /// slot's memory, and takes the slot out of the ring. Nothing of the frame is trusted
    /// before this returns `Ok`.
    pub(crate) fn accept(
        &mut self,
        slot: u32,
        byte_len: u32,
        buf: &[u8],
    ) -> Result<Header, ProtocolViolation> {
        let slots = self.slots.len() as u32;
        let state = self
            .slots
            .get(slot as usize)
            .ok_or(ProtocolViolation::RecvSlotOutOfRange { slot, slots })?;
        if *state != Slot::Posted {
            return Err(ProtocolViolation::RecvSlotNotPosted { slot });
        }
        let header = self.validate(slot, byte_len, buf)?;
        self.set(slot, Slot::Held);
        Ok(header)
    }

    /// As [`Self::accept`] for a frame that arrived in a shared receive queue's buffer
    /// `buf`: any posted slot takes it. With none posted the peer sent without a credit.
    pub(crate) fn accept_any(
        &mut self,
        byte_len: u32,
        buf: &[u8],
    ) -> Result<(u32, Header), ProtocolViolation> {
        let &slot = self
            .posted
            .last()
            .ok_or(ProtocolViolation::RecvWithoutCredit)?;
        self.accept(slot, byte_len, buf).map(|h| (slot, h))
    }

    fn validate(&self, slot: u32, byte_len: u32, buf: &[u8]) -> Result<Header, ProtocolViolation> {
        if byte_len > self.slot_size {
            return Err(ProtocolViolation::CompletionExceedsSlot {
                slot,
                byte_len,
                slot_size: self.slot_size,
            });
        }
        let frame = buf
            .get(..byte_len as usize)
            .ok_or(ProtocolViolation::RecvBufferTooShort {
                slot,
                len: buf.len(),
                byte_len,
            })?;
        let header = Header::decode(frame)
            .map_err(|source| ProtocolViolation::BadHeader { slot, source })?;
        let declared = header.encoded_len() as u64 + header.body_len();
        if declared > u64::from(self.slot_size) {
            return Err(ProtocolViolation::FrameExceedsSlot {
                slot,
                declared,
                slot_size: self.slot_size,
            });
        }
        if declared != u64::from(byte_len) {
            return Err(ProtocolViolation::LengthMismatch {
                slot,
                declared,
                byte_len,
            });
        }
        Ok(header)
    }

    /// The upper layer is done with `slot`; it goes back to the posted state (the caller
    /// emits the RECV), or out of the window if `retire`.
    pub(crate) fn release(&mut self, slot: u32, retire: bool) -> Result<(), ProtocolViolation> {
        match self.slots.get(slot as usize) {
            Some(Slot::Held) => {
                self.set(slot, if retire { Slot::Unbacked } else { Slot::Posted });
                Ok(())
            }
            _ => Err(ProtocolViolation::RecvSlotNotHeld { slot }),
        }
    }

    /// Brings one unbacked slot into the window (the caller emits its RECV and returns its
    /// credit); `None` if every slot is backed.
    pub(crate) fn extend(&mut self) -> Option<u32> {
        let &slot = self.unbacked.last()?;
        self.set(slot, Slot::Posted);
        Some(slot)
    }

    /// Panics if the stacks disagree with the slot states (tests only).
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        let count = |state| self.slots.iter().filter(|&&s| s == state).count();
        assert_eq!(count(Slot::Posted), self.posted.len());
        assert_eq!(count(Slot::Unbacked), self.unbacked.len());
        assert_eq!(count(Slot::Held), self.held as usize);
        for (stack, state) in [
            (&self.posted, Slot::Posted),
            (&self.unbacked, Slot::Unbacked),
        ] {
            for (i, &slot) in stack.iter().enumerate() {
                assert_eq!(self.slots[slot as usize], state);
                assert_eq!(self.pos[slot as usize] as usize, i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_wire::{FrameKind, HeaderError};

    /// A frame in the full header form (it carries a deadline): 64 bytes of header.
    fn frame(payload_len: u32) -> Vec<u8> {
        let mut h = Header::new(FrameKind::Request, 1);
        h.payload_len = payload_len;
        h.timeout_us = 1;
        let mut buf = vec![0u8; 256];
        h.encode(&mut buf);
        buf
    }

    #[test]
    fn compact_headers_count_32_bytes() {
        let mut r = RecvRing::new(4, 4, 256);
        let mut h = Header::new(FrameKind::Response, 1);
        h.payload_len = 224;
        let mut buf = vec![0u8; 256];
        assert_eq!(h.encode(&mut buf), 32);
        assert_eq!(r.accept(0, 256, &buf), Ok(h));
        assert_eq!(
            r.accept(1, 255, &buf),
            Err(ProtocolViolation::LengthMismatch {
                slot: 1,
                declared: 256,
                byte_len: 255
            })
        );
    }

    #[test]
    fn accepts_exact_frames_and_tracks_holding() {
        let mut r = RecvRing::new(4, 4, 256);
        let buf = frame(192);
        assert_eq!(r.accept(3, 256, &buf).map(|h| h.payload_len), Ok(192));
        assert_eq!(r.held(), 1);
        assert_eq!(
            r.accept(3, 256, &buf),
            Err(ProtocolViolation::RecvSlotNotPosted { slot: 3 })
        );
        assert_eq!(r.release(3, false), Ok(()));
        assert_eq!(
            r.release(3, false),
            Err(ProtocolViolation::RecvSlotNotHeld { slot: 3 })
        );
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn rejects_lengths_that_disagree() {
        let mut r = RecvRing::new(4, 4, 256);
        assert_eq!(
            r.accept(0, 257, &[0u8; 300]),
            Err(ProtocolViolation::CompletionExceedsSlot {
                slot: 0,
                byte_len: 257,
                slot_size: 256
            })
        );
        assert_eq!(
            r.accept(0, 200, &frame(192)),
            Err(ProtocolViolation::LengthMismatch {
                slot: 0,
                declared: 256,
                byte_len: 200
            })
        );
        assert_eq!(
            r.accept(0, 200, &frame(193)),
            Err(ProtocolViolation::FrameExceedsSlot {
                slot: 0,
                declared: 257,
                slot_size: 256
            })
        );
        assert_eq!(
            r.accept(0, 200, &frame(u32::MAX)),
            Err(ProtocolViolation::FrameExceedsSlot {
                slot: 0,
                declared: 64 + u64::from(u32::MAX),
                slot_size: 256
            })
        );
        assert_eq!(
            r.accept(0, 100, &[0u8; 50]),
            Err(ProtocolViolation::RecvBufferTooShort {
                slot: 0,
                len: 50,
                byte_len: 100
            })
        );
        assert_eq!(
            r.accept(0, 10, &frame(0)),
            Err(ProtocolViolation::BadHeader {
                slot: 0,
                source: HeaderError::Truncated { len: 10, need: 32 }
            })
        );
        assert_eq!(
            r.accept(4, 64, &frame(0)),
            Err(ProtocolViolation::RecvSlotOutOfRange { slot: 4, slots: 4 })
        );
        assert_eq!(r.held(), 0, "nothing rejected was taken out of the ring");
    }
}
