//! Request payloads and the check every reply must pass.
//!
//! A payload of `size` bytes is a fixed pattern whose first (up to) eight bytes carry the
//! call's sequence number, so a reply routed to the wrong call fails the check even when
//! the `seq` field happens to match. The check compares `seq`, the length, and a
//! Fletcher-style checksum over 64-bit words whose expected value for any sequence number
//! is derived in O(1) from the pattern's.

use bytes::{Bytes, BytesMut};

use crate::error::BenchError;

/// Bytes of the payload that carry the sequence number.
const STAMP_LEN: usize = 8;

/// Fletcher-style sums over little-endian 64-bit words (the last one zero-padded):
/// `a = Σ wᵢ`, `b = Σ (n - i)·wᵢ`, all wrapping. Both are linear in each word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksum {
    /// Sum of the words.
    pub a: u64,
    /// Sum of the running sums (position-weighted).
    pub b: u64,
}

/// The checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> Checksum {
    let (mut a, mut b) = (0u64, 0u64);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
        a = a.wrapping_add(word);
        b = b.wrapping_add(a);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        a = a.wrapping_add(u64::from_le_bytes(last));
        b = b.wrapping_add(a);
    }
    Checksum { a, b }
}

/// Payloads of one size and the expected checksum of each call's reply.
#[derive(Debug, Clone)]
pub struct Payloads {
    template: Vec<u8>,
    /// Checksum of the template (stamp bytes zero).
    base: Checksum,
    /// Number of 64-bit words (the weight of word 0 in `b`).
    words: u64,
    /// Which bits of `seq` fit the stamp.
    stamp_mask: u64,
}

impl Payloads {
    /// Payloads of `size` bytes.
    pub fn new(size: usize) -> Self {
        let mut template: Vec<u8> = (0..size)
            .map(|i| (i as u64).wrapping_mul(131).wrapping_add(7) as u8)
            .collect();
        let stamp = size.min(STAMP_LEN);
        template[..stamp].fill(0);
        let stamp_mask = if stamp == STAMP_LEN {
            u64::MAX
        } else {
            (1u64 << (8 * stamp)) - 1
        };
        Payloads {
            base: checksum(&template),
            words: size.div_ceil(8) as u64,
            template,
            stamp_mask,
        }
    }

    /// Payload size in bytes.
    pub fn size(&self) -> usize {
        self.template.len()
    }

    /// A fresh payload for call `seq`.
    pub fn request(&self, seq: u64) -> Vec<u8> {
        let mut payload = self.template.clone();
        Self::stamp(&mut payload, seq);
        payload
    }

    /// The payload for call `seq`, written into `buf`'s memory: once the previous call's
    /// payload is dropped, `buf` gets that memory back, so a loop of calls one at a time
    /// allocates nothing for its requests (and counting allocations counts the framework's).
    pub fn request_in(&self, buf: &mut BytesMut, seq: u64) -> Bytes {
        buf.clear();
        buf.reserve(self.template.len());
        buf.extend_from_slice(&self.template);
        Self::stamp(buf, seq);
        buf.split().freeze()
    }

    /// The payload for call `seq`, written into `buffer` (application memory registered
    /// with the devices: a large request goes from it uncopied) once the previous call's
    /// send let go of it.
    pub fn request_registered(
        &self,
        buffer: &mut rdma_rpc::RegisteredBuffer,
        seq: u64,
    ) -> Result<Bytes, BenchError> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // The transfer lets go of it when its WRITEs complete, which may be just after the
        // answer to its call came.
        while buffer.get_mut().is_none() {
            if std::time::Instant::now() > until {
                return Err(BenchError::failed(
                    "reusing the payload buffer",
                    "a finished call's send still holds it after 10 s",
                ));
            }
            std::thread::yield_now();
        }
        let bytes = buffer.get_mut().expect("nothing holds it");
        let len = self.template.len();
        bytes[..len].copy_from_slice(&self.template);
        Self::stamp(&mut bytes[..len], seq);
        Ok(buffer.slice(..len))
    }

    /// Reuses `payload` (a verified reply of this size) for call `seq`: only the stamp
    /// changes, which saves an allocation and a copy per call.
    pub fn restamp(&self, payload: &mut [u8], seq: u64) {
        debug_assert_eq!(payload.len(), self.template.len());
        Self::stamp(payload, seq);
    }

    fn stamp(payload: &mut [u8], seq: u64) {
        let n = payload.len().min(STAMP_LEN);
        payload[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    }

    /// The checksum the payload of call `seq` has.
    pub fn expected(&self, seq: u64) -> Checksum {
        let s = seq & self.stamp_mask;
        Checksum {
            a: self.base.a.wrapping_add(s),
            b: self.base.b.wrapping_add(self.words.wrapping_mul(s)),
        }
    }

    /// Checks the reply to call `seq`: its `seq` field, payload length and checksum.
    pub fn verify(&self, seq: u64, reply_seq: u64, reply: &[u8]) -> Result<(), BenchError> {
        let mismatch = |what: String| Err(BenchError::Mismatch { seq, what });
        if reply_seq != seq {
            return mismatch(format!("reply carries seq {reply_seq}"));
        }
        if reply.len() != self.template.len() {
            return mismatch(format!(
                "payload of {} bytes, expected {}",
                reply.len(),
                self.template.len()
            ));
        }
        let got = checksum(reply);
        let want = self.expected(seq);
        if got != want {
            return mismatch(format!("payload checksum {got:?}, expected {want:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_matches_the_real_checksum_for_every_size() {
        for size in [0, 1, 3, 7, 8, 9, 15, 16, 64, 100, 4096] {
            let p = Payloads::new(size);
            for seq in [0, 1, 255, 256, 70_000, u64::MAX] {
                let payload = p.request(seq);
                assert_eq!(payload.len(), size);
                assert_eq!(checksum(&payload), p.expected(seq), "size {size} seq {seq}");
                p.verify(seq, seq, &payload).unwrap();
            }
        }
    }

    #[test]
    fn detects_wrong_seq_length_and_corruption() {
        let p = Payloads::new(64);
        let good = p.request(5);
        assert!(p.verify(5, 6, &good).is_err());
        assert!(p.verify(6, 6, &good).is_err(), "stamp of another call");
        assert!(p.verify(5, 5, &good[..63]).is_err());
        let mut bad = good.clone();
        bad[40] ^= 1;
        assert!(p.verify(5, 5, &bad).is_err());
        let mut swapped = good;
        swapped.swap(8, 16);
        swapped.swap(9, 17);
        assert!(p.verify(5, 5, &swapped).is_err(), "reordered words");
    }

    #[test]
    fn restamp_reuses_a_reply() {
        let p = Payloads::new(32);
        let mut payload = p.request(1);
        p.restamp(&mut payload, 2);
        assert_eq!(payload, p.request(2));
    }
}
