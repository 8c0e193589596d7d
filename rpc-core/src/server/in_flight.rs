//! The count of a server's handler runs, which a graceful shutdown waits on.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

/// Counts handler runs so a graceful shutdown can wait for them. Entering and leaving cost
/// one atomic operation each; the lock is taken only when a waiter needs waking.
#[derive(Default)]
pub(crate) struct InFlight {
    pub(crate) count: AtomicUsize,
    /// Threads inside [`Dispatcher::wait_idle`].
    pub(crate) waiters: AtomicUsize,
    pub(crate) lock: Mutex<()>,
    pub(crate) idle: Condvar,
}

impl InFlight {
    pub(crate) fn enter(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn exit(&self) {
        // SeqCst on both sides (here: count, then waiters; in `wait_idle`: waiters, then
        // count) means a waiter either sees the count reach zero or is seen here and woken.
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 && self.waiters.load(Ordering::SeqCst) > 0
        {
            let _guard = self.lock.lock();
            self.idle.notify_all();
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Counts a handler run on this thread until the returned guard drops.
    pub(crate) fn running(&self) -> Running<'_> {
        self.enter();
        Running(self)
    }
}

/// Leaves [`InFlight`] when a handler run on the current thread ends, however it ends.
pub(crate) struct Running<'a>(&'a InFlight);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.exit();
    }
}
