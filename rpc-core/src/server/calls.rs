//! The calls of one connection a server is running, and the cancels that came before their
//! requests.
//!
//! A transport may hand a connection's frames up from more than one thread (an RDMA poller
//! and a caller spinning on the same completion queue), so a client's `Cancel` can reach
//! the dispatcher before the `Request` it cancels. Such a cancel is remembered, and the
//! request it names is dropped when it comes. Client call ids only grow, so a remembered id
//! never names a later call; at most [`EARLY_CANCELS`] are kept, the oldest forgotten first,
//! so cancels for calls that never come (or already finished) cannot grow the set.

use std::collections::{HashMap, HashSet, VecDeque};

use futures::future::AbortHandle;

/// Cancels remembered for requests not seen yet, per connection.
pub(crate) const EARLY_CANCELS: usize = 1024;

/// Keyed by peer-chosen call ids: std's randomly keyed hasher keeps a hostile client from
/// flooding one bucket.
#[derive(Default)]
pub(crate) struct Calls {
    running: HashMap<u64, AbortHandle>,
    early: HashSet<u64>,
    early_order: VecDeque<u64>,
}

impl Calls {
    pub(crate) fn len(&self) -> usize {
        self.running.len()
    }

    pub(crate) fn contains(&self, call_id: u64) -> bool {
        self.running.contains_key(&call_id)
    }

    /// A cancel arrived: aborts the call if it runs, else remembers it for its request.
    pub(crate) fn cancel(&mut self, call_id: u64) {
        if let Some(handle) = self.running.remove(&call_id) {
            handle.abort();
            return;
        }
        if self.early.insert(call_id) {
            if self.early_order.len() == EARLY_CANCELS {
                if let Some(oldest) = self.early_order.pop_front() {
                    self.early.remove(&oldest);
                }
            }
            self.early_order.push_back(call_id);
        }
    }

    /// Whether the request of `call_id` was cancelled before it arrived; forgets the cancel.
    pub(crate) fn take_cancelled(&mut self, call_id: u64) -> bool {
        // Nearly always empty: no hashing of the id then (a keyed hash is ~100 instructions).
        if self.early.is_empty() {
            return false;
        }
        if self.early.remove(&call_id) {
            self.early_order.retain(|&c| c != call_id);
            true
        } else {
            false
        }
    }

    /// Registers a call about to be spawned. A cancel that arrived meanwhile (after the
    /// request was checked, before this) aborts it at once.
    pub(crate) fn start(&mut self, call_id: u64, handle: AbortHandle) {
        if self.take_cancelled(call_id) {
            handle.abort();
        } else {
            self.running.insert(call_id, handle);
        }
    }

    pub(crate) fn finish(&mut self, call_id: u64) {
        self.running.remove(&call_id);
    }

    /// Aborts every running call.
    pub(crate) fn abort_all(&mut self) {
        for (_, handle) in self.running.drain() {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_before_its_request_cancels_it_once() {
        let mut calls = Calls::default();
        calls.cancel(7);
        assert!(calls.take_cancelled(7));
        assert!(!calls.take_cancelled(7), "forgotten once used");
        let (handle, registration) = AbortHandle::new_pair();
        calls.cancel(8);
        calls.start(8, handle);
        assert!(
            registration.handle().is_aborted(),
            "cancelled between check and start"
        );
        assert_eq!(calls.len(), 0);
    }

    #[test]
    fn early_cancels_are_bounded() {
        let mut calls = Calls::default();
        for id in 0..(EARLY_CANCELS as u64 + 10) {
            calls.cancel(id);
        }
        assert_eq!(calls.early.len(), EARLY_CANCELS);
        assert_eq!(calls.early_order.len(), EARLY_CANCELS);
        assert!(!calls.take_cancelled(0), "the oldest were forgotten");
        assert!(calls.take_cancelled(EARLY_CANCELS as u64 + 9));
    }
}
