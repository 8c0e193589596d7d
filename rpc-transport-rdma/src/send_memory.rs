//! The registered memory of a connection's send ring, which grows with the ring.
//!
//! The ring starts at the send window `w` (see `Connection::send_slots_wanted`) and doubles
//! up to its most slots. Its memory follows in segments that are registered when the ring
//! asks for them and kept while the connection lives: segment 0 holds slots `0..w` and the
//! control buffer, segment `k ≥ 1` holds slots `w·2^(k−1) .. w·2^k`. So an idle connection
//! pins a few slots, not its whole ring, and no byte ever moves when the ring grows.

use std::sync::{Arc, OnceLock};

use crate::protocol::{SendTarget, CONTROL_BUF_LEN};
use crate::verbs::{AccessFlags, MemoryRegion, ProtectionDomain, VerbsError};

pub(crate) struct SendMemory {
    pd: Arc<ProtectionDomain>,
    segments: Box<[OnceLock<MemoryRegion>]>,
    /// Slots of segment 0: the initial ring.
    first: u32,
    /// Most slots.
    max: u32,
    slot_size: usize,
}

impl SendMemory {
    /// Registers segment 0: `first` slots of `slot_size` bytes and the control buffer, for a
    /// ring that may grow to `max` slots.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        first: u32,
        max: u32,
        slot_size: u32,
    ) -> Result<SendMemory, VerbsError> {
        debug_assert!(first >= 1 && first <= max);
        let mut count = 1;
        while first << (count - 1) < max {
            count += 1;
        }
        let memory = SendMemory {
            pd: pd.clone(),
            segments: (0..count).map(|_| OnceLock::new()).collect(),
            first,
            max,
            slot_size: slot_size as usize,
        };
        let len = first as usize * memory.slot_size + CONTROL_BUF_LEN;
        let _ = memory.segments[0].set(MemoryRegion::alloc(pd, len, AccessFlags::NONE)?);
        Ok(memory)
    }

    /// Slots the first `k` segments hold.
    fn slots_below(&self, k: usize) -> u32 {
        match k {
            0 => 0,
            k => (self.first << (k - 1)).min(self.max),
        }
    }

    /// Makes sure slots `0..n` have memory, registering the segments missing. Called under
    /// the connection's state lock, so no two threads register one segment.
    pub(crate) fn back(&self, n: u32) -> Result<(), VerbsError> {
        let n = n.min(self.max);
        for k in 1..self.segments.len() {
            let start = self.slots_below(k);
            if start >= n {
                break;
            }
            if self.segments[k].get().is_none() {
                let end = self.slots_below(k + 1);
                let len = (end - start) as usize * self.slot_size;
                let _ =
                    self.segments[k].set(MemoryRegion::alloc(&self.pd, len, AccessFlags::NONE)?);
            }
        }
        Ok(())
    }

    /// Where `target` lives: its segment and the offset and length in it.
    fn locate(&self, target: SendTarget) -> (&MemoryRegion, usize, usize) {
        let (k, offset, len) = match target {
            SendTarget::Control => (0, self.first as usize * self.slot_size, CONTROL_BUF_LEN),
            SendTarget::Ring(slot) if slot < self.first => {
                (0, slot as usize * self.slot_size, self.slot_size)
            }
            SendTarget::Ring(slot) => {
                let k = (u32::BITS - (slot / self.first).leading_zeros()) as usize;
                let start = self.slots_below(k);
                (
                    (k),
                    (slot - start) as usize * self.slot_size,
                    self.slot_size,
                )
            }
        };
        let mr = self
            .segments
            .get(k)
            .and_then(OnceLock::get)
            .expect("a send slot the ring was given memory for");
        assert!(offset + len <= mr.len(), "send buffer out of range");
        (mr, offset, len)
    }

    /// The bytes of send buffer `target`, and the key to post them with.
    ///
    /// # Safety
    /// The caller holds the connection's engine lock (so nobody else writes send memory) and
    /// the protocol owns no posted work request on `target` (it was just reserved, or it is
    /// being prepared right before its post).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn buffer(&self, target: SendTarget) -> (&mut [u8], u32) {
        let (mr, offset, len) = self.locate(target);
        // SAFETY: in bounds of the live registered segment (checked in `locate`);
        // exclusivity is the caller's contract.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut((mr.addr() as usize + offset) as *mut u8, len)
        };
        (bytes, mr.lkey())
    }
}
