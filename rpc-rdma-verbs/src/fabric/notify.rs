//! A queue whose length is an eventfd's count: what the fabric's channels (completion,
//! connection manager, asynchronous events) are, so their fds poll like the real ones.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use parking_lot::Mutex;

/// Items and an eventfd in semaphore mode counting them: readable while one is queued.
#[derive(Debug)]
pub(super) struct Mailbox<T> {
    items: Mutex<VecDeque<T>>,
    fd: OwnedFd,
}

impl<T> Mailbox<T> {
    pub(super) fn new() -> io::Result<Mailbox<T>> {
        // SAFETY: no pointer arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Mailbox {
            items: Mutex::new(VecDeque::new()),
            // SAFETY: `fd` is a new descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Queues `item` and makes the fd readable.
    pub(super) fn push(&self, item: T) {
        self.items.lock().push_back(item);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        let n = unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
        debug_assert_eq!(n, 8, "an eventfd write of 1 cannot fail below its limit");
    }

    /// The next item: blocks for one unless the fd is non-blocking (then `EAGAIN`).
    pub(super) fn take(&self) -> io::Result<T> {
        loop {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a valid u64 from our eventfd.
            let n = unsafe { libc::read(self.fd(), (&mut count as *mut u64).cast(), 8) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            // A count whose item `retain` removed has nothing behind it: read the next.
            if let Some(item) = self.items.lock().pop_front() {
                return Ok(item);
            }
        }
    }

    /// Drops the queued items `keep` rejects (their counts stay, and read as nothing).
    pub(super) fn retain(&self, keep: impl FnMut(&T) -> bool) {
        self.items.lock().retain(keep);
    }
}
