//! An epoll set: the poller sleeps on the completion channel, its kick and the rdma_cm
//! channels of client connections at once, and learns which are ready in O(ready).

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use rpc_core::Status;

/// Most events taken from one wait.
const EVENTS: usize = 64;

pub(crate) struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub(crate) fn new() -> Result<Epoll, Status> {
        // SAFETY: no memory preconditions; the result is checked below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(os_status("epoll_create1"));
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
    }

    /// Watches `fd` for readability; its events carry `token`.
    pub(crate) fn add(&self, fd: RawFd, token: u64) -> Result<(), Status> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        let epfd = self.fd.as_raw_fd();
        // SAFETY: both fds are live; `event` is a valid epoll_event for the call.
        let ret = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut event) };
        if ret < 0 {
            return Err(os_status("epoll_ctl(ADD)"));
        }
        Ok(())
    }

    /// Stops watching `fd` (before it is closed).
    pub(crate) fn remove(&self, fd: RawFd) {
        // SAFETY: a null event is allowed for EPOLL_CTL_DEL; an fd not in the set is an error
        // we can ignore.
        let _ = unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
    }

    /// Waits up to `timeout` (zero: just looks) and calls `ready` with the token of each
    /// readable fd.
    pub(crate) fn wait(&self, timeout: Duration, mut ready: impl FnMut(u64)) {
        // Left uninitialised: the kernel fills what it reports, and zeroing 64 entries
        // on every wait cost more than the rest of a wait's user-space work.
        let mut events = [const { MaybeUninit::<libc::epoll_event>::uninit() }; EVENTS];
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `events` has room for EVENTS entries, which the kernel only writes.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr().cast(),
                EVENTS as libc::c_int,
                ms,
            )
        };
        let n = usize::try_from(n).unwrap_or(0).min(EVENTS);
        for event in &events[..n] {
            // SAFETY: epoll_wait initialised the first `n` entries.
            let token = unsafe { event.assume_init_ref() }.u64;
            ready(token);
        }
    }
}

fn os_status(what: &str) -> Status {
    Status::internal(format!("{what}: {}", std::io::Error::last_os_error()))
}
