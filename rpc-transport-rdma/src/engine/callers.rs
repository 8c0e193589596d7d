//! Blocking callers (and async lease holders) that poll CQs on their own threads, as the
//! poller sees them: the one hand-over between those threads and the poller.
//!
//! While a caller polls, the poller stays off the CPU and leaves that caller's CQ unarmed
//! (armed, every completion would wake it for nothing). A caller that gives up polling
//! without receiving anything is about to park: it **kicks** the poller, which from then on
//! ignores what callers did before the kick and drives the CQs until a caller polls again.
//! A caller that received something bumps the epoch, so a poller that sees activity since
//! its last look keeps leaving the CQs to the callers.
//!
//! The property that matters (checked by the tests below under every order of steps a
//! deterministic scheduler picks): a parked caller is never left with a poller that sleeps
//! on nothing but its timeout.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Default)]
pub(super) struct Callers {
    /// Callers polling a CQ themselves right now.
    polling: AtomicUsize,
    /// Bumped each time a caller's own polling received something.
    epoch: AtomicU64,
}

impl Callers {
    /// A caller starts polling on its own thread.
    pub(super) fn enter(&self) {
        self.polling.fetch_add(1, Ordering::AcqRel);
    }

    /// The caller's polling received something (before it leaves, so a poller that sees
    /// it gone sees this too).
    pub(super) fn progressed(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The caller stopped polling. One that received nothing must then kick the poller.
    pub(super) fn leave(&self) {
        self.polling.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether callers drive the CQs: one is polling now, or one received something since
    /// the poller's last look (`last_seen`, updated here).
    ///
    /// After a kick ([`Callers::handed_over`]) only a caller polling again counts: the
    /// caller that kicked is parked, and its earlier activity must not send the poller
    /// back to sleep while nobody watches the CQs.
    pub(super) fn drive(&self, last_seen: &mut u64) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        let recent = epoch != *last_seen;
        *last_seen = epoch;
        recent || self.polling.load(Ordering::Acquire) > 0
    }

    /// A kick arrived: a caller is parking, or an async call waits. What callers did so far
    /// is history; the poller drives the CQs until one polls again.
    pub(super) fn handed_over(&self, last_seen: &mut u64) {
        *last_seen = self.epoch.load(Ordering::Acquire);
    }
}

#[cfg(test)]
mod tests;
