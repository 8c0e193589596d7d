//! Small frames copied out of their receive slots as they arrive
//! ([`Rings::copy_below`](crate::Rings::copy_below)): a copy of a few dozen bytes costs less
//! than lending the slot (an owner allocated per frame, the slot held until the application
//! drops the message), and the slot goes back to the ring with the next send or poll.

use bytes::{Bytes, BytesMut};
use rpc_core::frame::InboundFrame;
use rpc_core::Header;

use super::large::Arrival;
use super::{Conn, State};
use crate::protocol::Received;

/// Memory the copies are cut from is allocated this many bytes at a time: copies cost no
/// allocation until a chunk is used up, a chunk is reused once every copy cut from it was
/// dropped, and an application keeping one small message keeps at most one chunk with it.
const CHUNK: usize = 8 * 1024;

/// Where a connection's copies of small frames are cut from, part of its [`State`].
#[derive(Default)]
pub(super) struct Copies {
    chunk: BytesMut,
}

impl Copies {
    /// `bytes`, copied.
    fn copy(&mut self, bytes: &[u8]) -> Bytes {
        if self.chunk.capacity() < bytes.len() {
            self.chunk.reserve(CHUNK.max(bytes.len()));
        }
        self.chunk.extend_from_slice(bytes);
        self.chunk.split().freeze()
    }
}

impl Conn {
    /// The frame `rx`, received into `entry`, as it goes up: one of at most `copy_below`
    /// bytes copied (its metadata and payload) and its slot released, a larger one left in
    /// its slot.
    pub(super) fn arrival(&self, state: &mut State, rx: Received, entry: u32) -> Arrival {
        if rx.len > self.limits.copy_below {
            return Arrival::Slot(rx, entry);
        }
        // SAFETY: the receive into `entry` completed and the protocol handed the frame up;
        // the entry is not posted again before the release below.
        let slot = unsafe { self.res.recv_entry(entry) };
        let body = state
            .copies
            .copy(&slot[rx.metadata_range().start..rx.len as usize]);
        self.release_soon(state, rx.slot, entry);
        Arrival::Copied {
            header: rx.header,
            body,
        }
    }
}

/// The frame whose metadata and payload `body` holds.
pub(super) fn copied_frame(header: Header, body: Bytes) -> InboundFrame {
    let metadata_len = header.metadata_len as usize;
    let (metadata, payload) = if metadata_len == 0 {
        (Bytes::new(), body)
    } else {
        (body.slice(..metadata_len), body.slice(metadata_len..))
    };
    InboundFrame {
        header,
        metadata,
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_reuse_their_chunk_once_the_earlier_ones_are_dropped() {
        let mut copies = Copies::default();
        let first = copies.copy(b"first frame");
        assert_eq!(&first[..], b"first frame");
        let start = first.as_ptr();
        let second = copies.copy(&[7; 100]);
        assert_eq!(second.len(), 100);
        // Cut from the same chunk, after the first.
        assert_eq!(second.as_ptr(), start.wrapping_add(first.len()));
        drop((first, second));
        let mut cut = 0;
        while cut + 1000 <= CHUNK {
            drop(copies.copy(&[1; 1000]));
            cut += 1000;
        }
        let again = copies.copy(&[2; 1000]);
        assert_eq!(again.as_ptr(), start, "the chunk was reused, not replaced");
    }

    #[test]
    fn a_frame_larger_than_a_chunk_is_copied_whole() {
        let mut copies = Copies::default();
        let kept = copies.copy(b"kept");
        let big = copies.copy(&[3; 3 * CHUNK]);
        assert_eq!(big.len(), 3 * CHUNK);
        assert!(big.iter().all(|&b| b == 3));
        assert_eq!(&kept[..], b"kept");
    }
}
