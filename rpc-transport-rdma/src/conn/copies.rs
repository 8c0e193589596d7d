//! Small frames handed up as copies ([`Rings::copy_below`](crate::Rings::copy_below)): a
//! copy of a few dozen bytes costs less than lending the receive slot (an owner allocated
//! per frame, the slot held for as long as the application keeps the message).

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};

/// Copies are cut from chunks of this many bytes: they cost no allocation until a chunk is
/// used up, a chunk is reused once every copy cut from it was dropped, and an application
/// keeping one small message keeps at most one chunk with it.
const CHUNK: usize = 8 * 1024;

thread_local! {
    /// The chunk this thread's copies are cut from: frames are handed up by the thread
    /// that polled them, with no lock to take.
    static CHUNK_OF_THREAD: RefCell<Chunk> = RefCell::new(Chunk::default());
}

/// Where copies are cut from.
#[derive(Default)]
struct Chunk(BytesMut);

impl Chunk {
    fn copy(&mut self, bytes: &[u8]) -> Bytes {
        if self.0.capacity() < bytes.len() {
            // Reclaims the chunk if nothing cut from it is alive, else takes a new one.
            self.0.reserve(CHUNK.max(bytes.len()));
        }
        self.0.extend_from_slice(bytes);
        self.0.split().freeze()
    }
}

/// `bytes`, copied into this thread's chunk.
pub(super) fn copy(bytes: &[u8]) -> Bytes {
    CHUNK_OF_THREAD.with(|chunk| chunk.borrow_mut().copy(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_reuse_their_chunk_once_the_earlier_ones_are_dropped() {
        let mut chunk = Chunk::default();
        let first = chunk.copy(b"first frame");
        assert_eq!(&first[..], b"first frame");
        let start = first.as_ptr();
        let second = chunk.copy(&[7; 100]);
        assert_eq!(second.len(), 100);
        // Cut from the same chunk, after the first.
        assert_eq!(second.as_ptr(), start.wrapping_add(first.len()));
        drop((first, second));
        let mut cut = 0;
        while cut + 1000 <= CHUNK {
            drop(chunk.copy(&[1; 1000]));
            cut += 1000;
        }
        let again = chunk.copy(&[2; 1000]);
        assert_eq!(again.as_ptr(), start, "the chunk was reused, not replaced");
    }

    #[test]
    fn a_kept_copy_keeps_its_chunk_and_the_next_copies_go_to_a_new_one() {
        let mut chunk = Chunk::default();
        let kept = chunk.copy(b"kept");
        let mut cut = 0;
        while cut + 1000 <= CHUNK {
            drop(chunk.copy(&[1; 1000]));
            cut += 1000;
        }
        let next = chunk.copy(&[2; 1000]);
        assert_ne!(next.as_ptr(), kept.as_ptr());
        assert_eq!(&kept[..], b"kept");
        assert!(next.iter().all(|&b| b == 2));
    }

    #[test]
    fn a_frame_larger_than_a_chunk_is_copied_whole() {
        let mut chunk = Chunk::default();
        let kept = chunk.copy(b"kept");
        let big = chunk.copy(&[3; 3 * CHUNK]);
        assert_eq!(big.len(), 3 * CHUNK);
        assert!(big.iter().all(|&b| b == 3));
        assert_eq!(&kept[..], b"kept");
    }
}
