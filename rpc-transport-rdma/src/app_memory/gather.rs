//! Encoding a large body around the runs of it a connection's device can reach where they
//! lie ([`InPlace`]), and the gather lists of its WRITEs ([`Gathered`]).

use std::sync::Arc;

use rpc_core::body::Gather;
use smallvec::SmallVec;

use super::reachable::{self, Held};
use crate::verbs::{ProtectionDomain, Sge};

/// Runs of fewer bytes are copied: a copy of them costs less than a gather entry.
pub(crate) const IN_PLACE_MIN: usize = 16 * 1024;

/// A run of a body's bytes sent from where it lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    /// Where it goes in the body.
    at: u64,
    addr: u64,
    len: u32,
    lkey: u32,
}

/// Where a body's bytes lie: runs of application memory (held until the body is written),
/// and between them the copied bytes, back to back in the transfer's own buffer.
#[derive(Debug)]
pub(crate) struct Gathered {
    /// In body order.
    pieces: Vec<Piece>,
    _holds: Vec<Held>,
}

impl Gathered {
    /// Bytes sent from application memory.
    pub(crate) fn in_place(&self) -> u64 {
        self.pieces.iter().map(|p| u64::from(p.len)).sum()
    }

    /// The gather list of `len` bytes at `offset` of the body, whose copied bytes are at
    /// `staged` (address, local key): at most `2 × pieces + 1` entries.
    pub(crate) fn sges(&self, offset: u64, len: u32, staged: (u64, u32)) -> SmallVec<[Sge; 4]> {
        let (staged_addr, staged_lkey) = staged;
        let end = offset + u64::from(len);
        let mut out = SmallVec::new();
        let mut pos = offset;
        // Bytes of application memory before `pos`: the copied bytes are where `pos` is,
        // less these.
        let mut skipped = 0u64;
        for p in &self.pieces {
            let p_end = p.at + u64::from(p.len);
            if p_end <= pos {
                skipped += u64::from(p.len);
                continue;
            }
            if p.at >= end {
                break;
            }
            if pos < p.at {
                out.push(Sge::new(
                    staged_addr + (pos - skipped),
                    (p.at - pos) as u32,
                    staged_lkey,
                ));
                pos = p.at;
            }
            let stop = p_end.min(end);
            out.push(Sge::new(p.addr + (pos - p.at), (stop - pos) as u32, p.lkey));
            pos = stop;
            skipped += u64::from(p.len);
            if pos == end {
                return out;
            }
        }
        if pos < end {
            out.push(Sge::new(
                staged_addr + (pos - skipped),
                (end - pos) as u32,
                staged_lkey,
            ));
        }
        out
    }
}

/// Decides, as a body is encoded, which of its runs go from application memory: those in a
/// [`RegisteredBuffer`] registered with the connection's device, at most `max_pieces` of
/// them (a WRITE gathers at most `2 × max_pieces + 1` entries).
pub(crate) struct InPlace<'a> {
    pd: &'a Arc<ProtectionDomain>,
    /// Where the payload starts in the body.
    base: u64,
    max_pieces: usize,
    pieces: Vec<Piece>,
    /// The buffers the pieces lie in, held until the pieces are written.
    holds: Vec<Held>,
}

impl<'a> InPlace<'a> {
    pub(crate) fn new(pd: &'a Arc<ProtectionDomain>, base: u64, max_pieces: usize) -> Self {
        InPlace {
            pd,
            base,
            max_pieces,
            pieces: Vec::new(),
            holds: Vec::new(),
        }
    }

    /// Whether no run was taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// A gather that takes exactly the runs this one took, for the pass that writes: the
    /// registrations may change between the passes (a device set up meanwhile), the layout
    /// must not.
    pub(crate) fn replay(&self) -> Replay<'_> {
        Replay {
            pieces: &self.pieces,
            base: self.base,
            next: 0,
        }
    }

    /// The runs taken, and the buffers they lie in.
    pub(crate) fn finish(self) -> Gathered {
        Gathered {
            pieces: self.pieces,
            _holds: self.holds,
        }
    }
}

impl Gather for InPlace<'_> {
    fn min_len(&self) -> usize {
        IN_PLACE_MIN
    }

    fn offer(&mut self, at: usize, bytes: &[u8]) -> bool {
        if self.pieces.len() >= self.max_pieces {
            return false;
        }
        let Ok(len) = u32::try_from(bytes.len()) else {
            return false;
        };
        let addr = bytes.as_ptr() as usize;
        let Some((_, memory)) = reachable::find(addr, bytes.len()) else {
            return false;
        };
        let Some(lkey) = memory.lkey(self.pd) else {
            return false;
        };
        self.pieces.push(Piece {
            at: self.base + at as u64,
            addr: addr as u64,
            len,
            lkey,
        });
        self.holds.push(Held::new(memory));
        true
    }
}

/// Takes the runs an [`InPlace`] pass took, in order, and nothing else.
pub(crate) struct Replay<'p> {
    pieces: &'p [Piece],
    base: u64,
    next: usize,
}

impl Gather for Replay<'_> {
    fn min_len(&self) -> usize {
        IN_PLACE_MIN
    }

    fn offer(&mut self, at: usize, bytes: &[u8]) -> bool {
        let Some(piece) = self.pieces.get(self.next) else {
            return false;
        };
        let same = piece.at == self.base + at as u64
            && piece.addr == bytes.as_ptr() as u64
            && piece.len as usize == bytes.len();
        self.next += usize::from(same);
        same
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writing pass takes what the sizing pass took, in order, whatever else is
    /// offered: a run that became reachable in between (a device set up meanwhile) is
    /// written, since the leased buffer was sized without it.
    #[test]
    fn the_writing_pass_replays_the_sizing_pass() {
        let bytes = vec![0u8; 64 * 1024];
        let (a, b) = (&bytes[..20_000], &bytes[30_000..60_000]);
        let taken = [Piece {
            at: 110,
            addr: b.as_ptr() as u64,
            len: b.len() as u32,
            lkey: 1,
        }];
        let mut replay = Replay {
            pieces: &taken,
            base: 10,
            next: 0,
        };
        assert!(!replay.offer(0, a), "not taken by the sizing pass");
        assert!(!replay.offer(99, b), "taken, but at another offset");
        assert!(replay.offer(100, b));
        assert!(!replay.offer(100, b), "taken once");
    }

    /// A body of 100 bytes: copied 0..10, application memory 10..40 (at 1000), copied
    /// 40..50, application memory 50..90 (at 2000), copied 90..100 (staged at 500).
    #[test]
    fn a_chunk_gathers_its_runs_and_the_copied_bytes_between_them() {
        let piece = |at, addr, len, lkey| Piece {
            at,
            addr,
            len,
            lkey,
        };
        let gathered = Gathered {
            pieces: vec![piece(10, 1000, 30, 7), piece(50, 2000, 40, 8)],
            _holds: Vec::new(),
        };
        assert_eq!(gathered.in_place(), 70);
        let list = |offset, len| -> Vec<(u64, u32, u32)> {
            gathered
                .sges(offset, len, (500, 1))
                .iter()
                .map(|s| (s.addr(), s.length(), s.lkey()))
                .collect()
        };
        assert_eq!(
            list(0, 100),
            [
                (500, 10, 1),
                (1000, 30, 7),
                (510, 10, 1),
                (2000, 40, 8),
                (520, 10, 1)
            ]
        );
        // Chunks that start and end inside runs.
        assert_eq!(list(0, 25), [(500, 10, 1), (1000, 15, 7)]);
        assert_eq!(list(25, 30), [(1015, 15, 7), (510, 10, 1), (2000, 5, 8)]);
        assert_eq!(list(55, 45), [(2005, 35, 8), (520, 10, 1)]);
        assert_eq!(list(92, 8), [(522, 8, 1)]);
        assert_eq!(list(12, 3), [(1002, 3, 7)]);
    }
}
