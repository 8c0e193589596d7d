//! Who waits for what a transport delivers (a stream's reader or writer), and wakeups held
//! back to the end of a batch of frames.
//!
//! A transport hands up frames one at a time, but receives them in batches: one socket read
//! holds hundreds of small messages, one completion-queue poll dozens. Waking a stream's
//! reader for each message would switch threads for each; instead the transport collects
//! the wakeups of a batch in [`Wakes`] and performs them at its end (or when it is
//! dropped), so a reader wakes once to a queue of messages.

use std::task::{Context, Waker};
use std::thread::Thread;

/// The task or thread waiting on one side of a stream (or anything a transport's frames
/// move).
#[derive(Debug, Default)]
pub(crate) enum Waiter {
    #[default]
    None,
    Task(Waker),
    Thread(Thread),
}

impl Waiter {
    pub(crate) fn set_task(&mut self, cx: &Context<'_>) {
        match self {
            Waiter::Task(w) if w.will_wake(cx.waker()) => {}
            _ => *self = Waiter::Task(cx.waker().clone()),
        }
    }

    pub(crate) fn is_thread(&self) -> bool {
        matches!(self, Waiter::Thread(_))
    }

    /// Wakes the waiter now; it is no longer registered.
    pub(crate) fn wake(&mut self) {
        std::mem::take(self).wake_owned();
    }

    fn wake_owned(self) {
        match self {
            Waiter::None => {}
            Waiter::Task(w) => w.wake(),
            Waiter::Thread(t) => t.unpark(),
        }
    }
}

/// Wakeups held back while a transport hands up one batch of frames, performed by
/// [`Wakes::wake_all`] or on drop. A waiter is taken out of its stream when its wakeup is
/// held, so a batch holds at most one wakeup per waiting reader or writer: the bound is two
/// per stream of the connection.
#[derive(Debug, Default)]
pub struct Wakes {
    held: Vec<Waiter>,
}

impl Wakes {
    /// No wakeups held.
    pub fn new() -> Self {
        Wakes::default()
    }

    /// Holds `waiter`'s wakeup until the end of the batch.
    pub(crate) fn defer(&mut self, waiter: &mut Waiter) {
        let waiter = std::mem::take(waiter);
        if !matches!(waiter, Waiter::None) {
            self.held.push(waiter);
        }
    }

    /// Performs the wakeups held so far: the end of a batch.
    pub fn wake_all(&mut self) {
        if self.held.is_empty() {
            return;
        }
        for waiter in self.held.drain(..) {
            waiter.wake_owned();
        }
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        self.wake_all();
    }
}
