//! A completion queue shared by many queue pairs, and who polls it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::lease;
use crate::verbs::{CompletionQueue, WorkCompletion};

/// A completion queue shared by many queue pairs.
pub(crate) struct SharedCq {
    pub(crate) cq: Arc<CompletionQueue>,
    /// Entries promised to the queue pairs on this CQ (their send plus receive depths).
    pub(super) reserved: Mutex<u32>,
    /// The poll buffer; holding it is what makes a thread the CQ's poller for a moment.
    pub(super) completions: Mutex<Vec<WorkCompletion>>,
    /// Blocking callers spinning on this CQ right now, and the async caller holding its
    /// drive lease.
    pub(super) spinners: AtomicUsize,
    /// Which async caller drives this CQ on its own task ([`lease`]).
    pub(super) lease: lease::Lease,
    /// Polling it failed: its connections were closed and nobody polls it any more.
    pub(super) failed: AtomicBool,
    /// Entries of queue pairs destroyed since the CQ was last found empty. Some providers
    /// leave a destroyed QP's completions in the CQ, so its entries are given back only once
    /// the CQ was seen empty after its destruction.
    pub(super) released: AtomicU32,
}

impl SharedCq {
    /// The CQ was found empty: the entries of queue pairs destroyed before are free.
    pub(super) fn drained(&self) {
        if self.released.load(Ordering::Acquire) != 0 {
            let entries = self.released.swap(0, Ordering::AcqRel);
            *self.reserved.lock() -= entries;
        }
    }
}
