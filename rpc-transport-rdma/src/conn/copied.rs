//! The receive slots of a batch's small frames, handed up as copies: given back together
//! once the batch is delivered, under the state lock its end takes anyway, rather than
//! each with a lock of its own.

use smallvec::SmallVec;

use super::{Conn, State};
use crate::engine::POLL_BATCH;

/// Slots whose frames were copied and handed up, kept out of the ring until the batch's
/// hand-ups are done (a server's inline handler answered first): at most a polled batch
/// of them, held inline. If a handler's panic unwinds past them, each goes back as a
/// dropped frame's slot does ([`Conn::release_recv`]).
pub(super) struct Copied<'a> {
    conn: &'a Conn,
    slots: SmallVec<[(u32, u32); POLL_BATCH]>,
}

impl<'a> Copied<'a> {
    pub(super) fn new(conn: &'a Conn) -> Self {
        Copied {
            conn,
            slots: SmallVec::new(),
        }
    }

    /// Keeps `slot`, received into `entry`, until [`Copied::give_back`].
    pub(super) fn keep(&mut self, slot: u32, entry: u32) {
        self.slots.push((slot, entry));
    }

    /// Gives the kept slots back, under the connection's state lock.
    pub(super) fn give_back(&mut self, state: &mut State) {
        for (slot, entry) in self.slots.drain(..) {
            self.conn.defer_release(state, slot, entry);
        }
    }
}

impl Drop for Copied<'_> {
    fn drop(&mut self) {
        for (slot, entry) in self.slots.drain(..) {
            self.conn.release_recv(slot, entry);
        }
    }
}
