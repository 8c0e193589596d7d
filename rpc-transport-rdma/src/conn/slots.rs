//! Who holds a received frame's slot while the upper layer reads it: [`RecvSlot`] (a
//! frame lent as a view of its slot, for as long as the application keeps it) and
//! [`HeldSlot`] (a frame handed up as a copy, until its hand-up ends).

use std::sync::Arc;

use super::{Conn, State};

/// The receive slot of a frame handed up as a copy, out of the ring until the hand-up ends:
/// released under a lock its holder takes anyway ([`HeldSlot::release_in`]), or by the
/// drop (a frame that is not the batch's last, or a handler that panicked).
pub(super) struct HeldSlot<'a> {
    conn: &'a Conn,
    slot: u32,
    /// Where it landed: the ring slot, or the shared receive queue's buffer.
    entry: u32,
    len: usize,
    released: bool,
}

impl<'a> HeldSlot<'a> {
    /// Slot `slot` of `conn`, received into `entry`, holding a frame of `len` bytes.
    pub(super) fn new(conn: &'a Conn, slot: u32, entry: u32, len: usize) -> Self {
        HeldSlot {
            conn,
            slot,
            entry,
            len,
            released: false,
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: the entry stays un-posted until this slot is released.
        let bytes = unsafe { self.conn.res.recv_entry(self.entry) };
        &bytes[..self.len]
    }

    /// Releases the slot under the state lock, which the caller holds.
    pub(super) fn release_in(mut self, state: &mut State) {
        self.released = true;
        self.conn.release_locked(state, self.slot, self.entry);
    }
}

impl Drop for HeldSlot<'_> {
    fn drop(&mut self) {
        if !self.released {
            self.conn.release_recv(self.slot, self.entry);
        }
    }
}

/// Keeps a receive slot out of the ring while the upper layer reads the frame in it; the
/// `Bytes` views of metadata and payload share it and release the slot when the last drops.
pub(super) struct RecvSlot {
    pub(super) conn: Arc<Conn>,
    pub(super) slot: u32,
    /// Where it landed: the ring slot, or the shared receive queue's buffer.
    pub(super) entry: u32,
    pub(super) len: usize,
}

impl AsRef<[u8]> for RecvSlot {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the entry stays un-posted until this owner's drop releases it.
        let bytes = unsafe { self.conn.res.recv_entry(self.entry) };
        &bytes[..self.len]
    }
}

impl Drop for RecvSlot {
    fn drop(&mut self) {
        self.conn.release_recv(self.slot, self.entry);
    }
}
