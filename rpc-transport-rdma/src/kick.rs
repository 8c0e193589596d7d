//! An eventfd that wakes a sleeping poller thread.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use rpc_core::Status;

pub(crate) struct Kick {
    fd: OwnedFd,
}

impl Kick {
    pub(crate) fn new() -> Result<Kick, Status> {
        // SAFETY: eventfd has no memory preconditions; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Status::internal(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Kick { fd })
    }

    /// Makes the fd readable (wakes a `poll` on it).
    pub(crate) fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter (EAGAIN)
        // already means "readable", so the result needs no handling.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the fd to not readable.
    pub(crate) fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
