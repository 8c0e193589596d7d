//! Async callers that drive a completion queue on their own task.
//!
//! An async call waiting for its response may poll its connection's CQ itself, as a
//! blocking caller does on its thread: the completion is then processed on the executor
//! thread that waits for it, and waking the call costs no hand-over from the poller thread
//! to the executor. One waiting call per CQ at a time holds the CQ's **drive lease**; it
//! looks at the CQ each time it is polled and wakes itself to be polled again (so the tasks
//! it completes run in between). The other waiting calls wait to be woken, by the lease
//! holder's completions or, once it ends, to take the lease over.
//!
//! The lease counts as a spinning caller (`SharedCq::spinners`, `Engine::callers`),
//! so the poller thread leaves the CQ alone while it is held. It ends:
//! * when the holder's call ends (`release`); the callers waiting for it are woken and one
//!   of them takes it (with none, nobody waits, and the next call takes it);
//! * in adaptive mode, once nothing arrived for the mode's spin time: the holder stops
//!   spinning and joins the waiters, and the poller, woken, takes the CQ over, so an idle
//!   process spins nowhere.
//!
//! Every async caller that waits is therefore the holder, a waiter, or (no lease held)
//! served by the poller; async senders waiting for room join the waiters too
//! (`wait_for_room`), since the holder's looks at the CQ bring their credits.
//!
//! Event mode takes no lease: an async call looks at the CQ once and waits for the poller.
//!
//! A lease held by a task whose executor stops polling it cannot starve the CQ's other
//! connections for long: the poller, watching callers, looks at every CQ at least once per
//! `CALLER_WINDOW` (see `poller`).

use std::sync::atomic::Ordering;
use std::task::{Context, Waker};
use std::time::Instant;

use parking_lot::Mutex;
use rpc_core::Drive;

use super::{should_yield, Engine, Polled, SharedCq, CLOCK_EVERY};
use crate::config::PollMode;

/// Tasks recorded as waiting for one CQ's lease before they are all woken to make room
/// (see `LeaseState::wait`): bounds the list when a lease is held for long while many
/// short-lived tasks come and go.
const MAX_LEASE_WAITERS: usize = 1024;

/// The drive lease of one CQ: who drives it, who waits for it. Plain state; the engine
/// glue below keeps the spinning counts.
#[derive(Default)]
pub(crate) struct Lease {
    state: Mutex<LeaseState>,
}

#[derive(Default)]
struct LeaseState {
    held: bool,
    /// Callers that found the lease taken; woken when it is given back.
    waiters: Vec<Waker>,
    /// Empty looks since the last completion, and when they began (read now and then).
    idle_polls: u32,
    idle_since: Option<Instant>,
}

impl LeaseState {
    /// Records a caller to wake when the lease is given back. Past [`MAX_LEASE_WAITERS`]
    /// tasks (some may have ended since they waited) every one is woken at once: the
    /// tasks still waiting come back.
    fn wait(&mut self, waker: &Waker) {
        if self.waiters.iter().any(|w| w.will_wake(waker)) {
            return;
        }
        if self.waiters.len() >= MAX_LEASE_WAITERS {
            self.waiters.drain(..).for_each(Waker::wake);
        }
        self.waiters.push(waker.clone());
    }
}

impl Lease {
    /// Takes the lease if it is free (true); otherwise `waker` waits for it.
    fn acquire(&self, waker: &Waker) -> bool {
        let mut lease = self.state.lock();
        if lease.held {
            lease.wait(waker);
            return false;
        }
        lease.held = true;
        lease.idle_polls = 0;
        lease.idle_since = None;
        true
    }

    /// If the lease is held, `waker` waits for it to be given back (true).
    fn wait_if_held(&self, waker: &Waker) -> bool {
        let mut lease = self.state.lock();
        if lease.held {
            lease.wait(waker);
        }
        lease.held
    }

    /// The holder found completions: its idle time starts over.
    fn progressed(&self) {
        let mut lease = self.state.lock();
        lease.idle_polls = 0;
        lease.idle_since = None;
    }

    /// The holder found nothing: the empty looks so far, and since when it has looked
    /// (`now` is read once every [`CLOCK_EVERY`] looks, clocks being slow under emulation).
    fn idled(&self, now: impl FnOnce() -> Instant) -> (u32, Option<Instant>) {
        let mut lease = self.state.lock();
        lease.idle_polls = lease.idle_polls.wrapping_add(1);
        let idle = lease.idle_polls;
        if idle.is_multiple_of(CLOCK_EVERY) && lease.idle_since.is_none() {
            lease.idle_since = Some(now());
        }
        (idle, lease.idle_since)
    }

    /// The holder gives the lease back: the waiters to wake (one of them takes it over).
    fn release(&self) -> Vec<Waker> {
        let mut lease = self.state.lock();
        debug_assert!(lease.held, "a lease given back that was not held");
        lease.held = false;
        std::mem::take(&mut lease.waiters)
    }

    /// The holder stops driving but goes on waiting for its call: it joins the waiters,
    /// who are woken at the next release.
    fn step_down(&self, waker: &Waker) {
        let mut lease = self.state.lock();
        debug_assert!(lease.held, "a lease given back that was not held");
        lease.held = false;
        lease.wait(waker);
    }
}

impl Engine {
    /// One look at `cq` for an async caller waiting for a response; see the module
    /// documentation. `driving` is the caller's lease flag.
    pub(crate) fn drive(&self, cq: &SharedCq, cx: &mut Context<'_>, driving: &mut bool) -> Drive {
        if self.mode == PollMode::Event {
            return match self.poll(cq) {
                Polled::Some => Drive::Received,
                _ => {
                    self.wake_if_unarmed();
                    Drive::Wait
                }
            };
        }
        if !*driving {
            if !cq.lease.acquire(cx.waker()) {
                return Drive::Wait;
            }
            *driving = true;
            self.callers.enter();
            cq.spinners.fetch_add(1, Ordering::AcqRel);
        }
        match self.poll(cq) {
            Polled::Some => {
                self.callers.progressed();
                cq.lease.progressed();
                Drive::Received
            }
            // A blocking caller polls it right now: it counts as activity.
            Polled::Busy => Drive::Spin,
            Polled::Empty if self.still_spinning(cq) => Drive::Spin,
            Polled::Empty => {
                // Quiet for the mode's spin time: the poller takes over. This caller, like
                // those that waited for the lease, may take it again after the next release.
                cq.lease.step_down(cx.waker());
                *driving = false;
                self.stopped_driving(cq);
                self.kick.kick();
                Drive::Wait
            }
        }
    }

    /// The lease holder's call ended: the callers waiting for the lease are woken, and one
    /// of them takes it over.
    ///
    /// With none, no async call waits on this CQ (each is the holder or a waiter), so the
    /// poller is not woken: the next call takes the lease, and completions nobody waits for
    /// (credits, send completions) wait for the poller's next look, within its caller
    /// window. Waking it here would cost a caller that makes one call at a time a
    /// hand-over per call.
    pub(crate) fn release(&self, cq: &SharedCq) {
        let waiters = cq.lease.release();
        self.stopped_driving(cq);
        waiters.into_iter().for_each(Waker::wake);
    }

    /// An async sender waits for room on `cq`: it is woken when the lease is given back if a
    /// caller holds it (that caller's looks at the CQ bring the credits), else the poller
    /// must be watching the CQ.
    pub(crate) fn wait_for_room(&self, cq: &SharedCq, cx: &mut Context<'_>) {
        if self.mode == PollMode::Event || !cq.lease.wait_if_held(cx.waker()) {
            self.wake_if_unarmed();
        }
    }

    /// Whether the lease holder keeps spinning after an empty look: always in busy mode,
    /// for the spin time since the last completion in adaptive mode. Like the poller, a
    /// holder that has found nothing for a while gives the CPU away now and then.
    fn still_spinning(&self, cq: &SharedCq) -> bool {
        let (idle, since) = cq.lease.idled(Instant::now);
        if should_yield(idle) {
            std::thread::yield_now();
        }
        match (self.mode.spin(), since) {
            (Some(spin), Some(since)) if idle.is_multiple_of(CLOCK_EVERY) => since.elapsed() < spin,
            _ => true,
        }
    }

    /// A lease was given back: its holder no longer counts as spinning.
    fn stopped_driving(&self, cq: &SharedCq) {
        cq.spinners.fetch_sub(1, Ordering::AcqRel);
        self.callers.leave();
    }
}

#[cfg(test)]
mod tests;
