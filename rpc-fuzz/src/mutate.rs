//! Random inputs: fresh bytes, or a saved input changed in a few places (libFuzzer's
//! simplest mutations: bits flipped, bytes set, inserted, erased, copied, or spliced from
//! another input), so that inputs get past the magic numbers and length checks a fresh
//! random one never passes.

use fastrand::Rng;

use crate::MAX_INPUT;

/// Random bytes, short ones more often than long ones.
pub(crate) fn fresh(rng: &mut Rng) -> Vec<u8> {
    let most = rng.usize(..=MAX_INPUT);
    let len = rng.usize(..=most);
    std::iter::repeat_with(|| rng.u8(..)).take(len).collect()
}

/// `base` changed in one to four places; `other` may be spliced in.
pub(crate) fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut input = base.to_vec();
    for _ in 0..rng.usize(1..=4) {
        let at = rng.usize(..=input.len());
        match rng.u8(..6) {
            0 if at < input.len() => input[at] ^= 1 << rng.u8(..8),
            1 if at < input.len() => input[at] = interesting(rng),
            2 => input.insert(at, interesting(rng)),
            3 => {
                let end = rng.usize(at..=input.len().min(at + 16));
                input.drain(at..end);
            }
            4 => input.truncate(at),
            _ => {
                let from = rng.usize(..=other.len());
                let end = rng.usize(from..=other.len().min(from + 64));
                let piece = other[from..end].to_vec();
                input.splice(at..at, piece);
            }
        }
    }
    input.truncate(MAX_INPUT);
    input
}

/// A byte that often matters: a boundary, or any.
fn interesting(rng: &mut Rng) -> u8 {
    const BOUNDARIES: [u8; 6] = [0, 1, 0x7f, 0x80, 0xfe, 0xff];
    if rng.bool() {
        BOUNDARIES[rng.usize(..BOUNDARIES.len())]
    } else {
        rng.u8(..)
    }
}
