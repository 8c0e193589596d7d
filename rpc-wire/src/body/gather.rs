//! Encoding a message around the bytes a transport can send from where they lie: a
//! protobuf `bytes` field held as [`bytes::Bytes`] in memory the transport can reach (an
//! application's registered buffer) is offered to a [`Gather`], and if taken it is left
//! out of the encoding instead of being copied into the transport's memory.
//!
//! The one `unsafe` here is the [`BufMut`] contract prost writes through.

#![allow(unsafe_code)]

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut};

/// A transport's say over the runs of bytes a message holds in one piece.
pub trait Gather {
    /// Runs shorter than this are written, never offered.
    fn min_len(&self) -> usize;

    /// Whether `bytes`, at offset `at` of the encoding, goes to the wire from where it lies
    /// (and is therefore not written). Runs are offered in order; a transport that takes one
    /// must keep it readable, unchanged, until it is sent (it holds the memory's owner).
    fn offer(&mut self, at: usize, bytes: &[u8]) -> bool;
}

/// What prost writes through: the bytes the [`Gather`] does not take, back to back, into
/// `dst`; without `dst` it only counts them. Bytes past the end of `dst` (an encoding that
/// grew since it was counted) are counted, not written: the count tells the caller.
pub(super) struct Gathering<'a, 'g> {
    dst: Option<&'a mut [u8]>,
    /// Bytes written (or counted).
    written: usize,
    /// Bytes taken by the gather.
    taken: usize,
    gather: &'g mut dyn Gather,
    /// Where prost's default methods write what is only counted (nobody reads it).
    scratch: [u8; 16],
}

impl<'a, 'g> Gathering<'a, 'g> {
    pub(super) fn new(dst: Option<&'a mut [u8]>, gather: &'g mut dyn Gather) -> Self {
        Gathering {
            dst,
            written: 0,
            taken: 0,
            gather,
            scratch: [0; 16],
        }
    }

    /// Bytes written (or, counting, that would have been).
    pub(super) fn written(&self) -> usize {
        self.written
    }

    /// The rest of `dst`, if anything is left of it.
    fn rest(&mut self) -> Option<&mut [u8]> {
        let written = self.written;
        self.dst
            .as_deref_mut()
            .and_then(|dst| dst.get_mut(written..))
            .filter(|rest| !rest.is_empty())
    }
}

// SAFETY: `chunk_mut` hands out the unwritten rest of `dst`, or a scratch area nobody reads
// when there is none (counting, or past the end); `advance_mut` moves the count past the
// bytes the caller initialized there, and nothing is ever read from beyond what was
// written.
unsafe impl BufMut for Gathering<'_, '_> {
    fn remaining_mut(&self) -> usize {
        usize::MAX - self.written
    }

    // SAFETY: the caller initialized `cnt` bytes of `chunk_mut` (the trait's contract);
    // this only counts them, and reads nothing.
    unsafe fn advance_mut(&mut self, cnt: usize) {
        self.written += cnt;
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        // Two steps for the borrow checker: `rest` borrows `self` whole.
        if self.rest().is_some() {
            let written = self.written;
            let dst = self.dst.as_deref_mut().expect("checked");
            return UninitSlice::new(&mut dst[written..]);
        }
        UninitSlice::new(&mut self.scratch)
    }

    fn put_slice(&mut self, src: &[u8]) {
        if let Some(rest) = self.rest() {
            if let Some(room) = rest.get_mut(..src.len()) {
                room.copy_from_slice(src);
            }
        }
        self.written += src.len();
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        let whole = src.chunk();
        if whole.len() == src.remaining()
            && whole.len() >= self.gather.min_len()
            && self.gather.offer(self.written + self.taken, whole)
        {
            self.taken += whole.len();
            return;
        }
        while src.has_remaining() {
            let chunk = src.chunk();
            let n = chunk.len();
            self.put_slice(chunk);
            src.advance(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::Gather;
    use crate::body::EncodeBody;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Blob {
        #[prost(uint64, tag = "1")]
        seq: u64,
        #[prost(bytes = "bytes", tag = "2")]
        big: Bytes,
        #[prost(string, tag = "3")]
        name: String,
        #[prost(bytes = "bytes", tag = "4")]
        small: Bytes,
    }

    /// Takes the runs that lie in `region`, remembering where they go.
    struct InRegion<'r> {
        region: &'r [u8],
        taken: Vec<(usize, usize)>,
    }

    impl Gather for InRegion<'_> {
        fn min_len(&self) -> usize {
            8
        }

        fn offer(&mut self, at: usize, bytes: &[u8]) -> bool {
            let start = self.region.as_ptr() as usize;
            let inside = (bytes.as_ptr() as usize) >= start
                && bytes.as_ptr() as usize + bytes.len() <= start + self.region.len();
            if inside {
                self.taken.push((at, bytes.len()));
            }
            inside
        }
    }

    #[test]
    fn runs_taken_are_left_out_and_the_rest_is_written_back_to_back() {
        let region = Bytes::from(vec![7u8; 4096]);
        let blob = Blob {
            seq: 300,
            big: region.slice(100..1100),
            name: "name".into(),
            // In the region, but too short to offer; and a run elsewhere.
            small: region.slice(0..4),
        };
        let whole = prost::Message::encode_to_vec(&blob);

        let mut counting = InRegion {
            region: &region,
            taken: Vec::new(),
        };
        let len = blob.encode_gathered(None, &mut counting);
        assert_eq!(counting.taken.len(), 1);
        assert_eq!(len, whole.len() - 1000);

        let mut gather = InRegion {
            region: &region,
            taken: Vec::new(),
        };
        let mut dst = vec![0u8; len];
        assert_eq!(blob.encode_gathered(Some(&mut dst), &mut gather), len);
        assert_eq!(gather.taken, counting.taken, "both passes decide alike");

        // Putting the taken run back where it was offered gives the plain encoding.
        let (at, taken) = gather.taken[0];
        let mut rebuilt = dst[..at].to_vec();
        rebuilt.extend_from_slice(&blob.big);
        rebuilt.extend_from_slice(&dst[at..]);
        assert_eq!(taken, 1000);
        assert_eq!(rebuilt, whole);

        // An encoding longer than its buffer is counted, not written past the end.
        let mut short = vec![0u8; len - 1];
        let mut gather = InRegion {
            region: &region,
            taken: Vec::new(),
        };
        assert_eq!(blob.encode_gathered(Some(&mut short), &mut gather), len);

        // A run outside the region is written.
        let elsewhere = Blob {
            big: Bytes::from(vec![1u8; 1000]),
            ..blob
        };
        let mut gather = InRegion {
            region: &region,
            taken: Vec::new(),
        };
        let mut dst = vec![0u8; elsewhere.encoded_len()];
        let written = elsewhere.encode_gathered(Some(&mut dst), &mut gather);
        assert!(gather.taken.is_empty());
        assert_eq!(
            dst[..written],
            prost::Message::encode_to_vec(&elsewhere)[..]
        );
    }
}
