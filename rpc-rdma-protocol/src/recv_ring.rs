//! The receive ring: which slots have a RECV posted, which the upper layer holds, and the
//! validation of every received frame before anything in it is trusted.
//!
//! Slots may be released in any order (a handler may keep one while it decodes); the ring
//! only tracks per-slot state, it does not assume the RECV queue order.

use rpc_core::Header;

use super::error::ProtocolViolation;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A RECV is posted (or about to be: the PostRecv action is queued).
    Posted,
    /// Delivered to the upper layer, not yet released.
    Held,
}

/// Receive-ring bookkeeping; every operation is O(1).
#[derive(Debug)]
pub(crate) struct RecvRing {
    slots: Box<[Slot]>,
    slot_size: u32,
    held: u32,
}

impl RecvRing {
    /// A ring whose every slot is posted (the connection emits the initial posts).
    pub(crate) fn new(slots: u32, slot_size: u32) -> Self {
        RecvRing {
            slots: vec![Slot::Posted; slots as usize].into_boxed_slice(),
            slot_size,
            held: 0,
        }
    }

    /// Slots held by the upper layer.
    pub(crate) fn held(&self) -> u32 {
        self.held
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
        self.slots[slot as usize] = Slot::Held;
        self.held += 1;
        Ok(header)
    }

    /// The upper layer is done with `slot`; it goes back to the posted state (the caller
    /// emits the RECV).
    pub(crate) fn release(&mut self, slot: u32) -> Result<(), ProtocolViolation> {
        match self.slots.get_mut(slot as usize) {
            Some(state @ Slot::Held) => {
                *state = Slot::Posted;
                self.held -= 1;
                Ok(())
            }
            _ => Err(ProtocolViolation::RecvSlotNotHeld { slot }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_core::{FrameKind, HeaderError};

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
        let mut r = RecvRing::new(4, 256);
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
        let mut r = RecvRing::new(4, 256);
        let buf = frame(192);
        assert_eq!(r.accept(3, 256, &buf).map(|h| h.payload_len), Ok(192));
        assert_eq!(r.held(), 1);
        assert_eq!(
            r.accept(3, 256, &buf),
            Err(ProtocolViolation::RecvSlotNotPosted { slot: 3 })
        );
        assert_eq!(r.release(3), Ok(()));
        assert_eq!(
            r.release(3),
            Err(ProtocolViolation::RecvSlotNotHeld { slot: 3 })
        );
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn rejects_lengths_that_disagree() {
        let mut r = RecvRing::new(4, 256);
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
