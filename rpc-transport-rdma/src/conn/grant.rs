//! What a grant lets the peer write, and what arrived there: a buffer leased from the
//! connection's pool, or the application's buffer offered for a response
//! ([`rpc_core::Landing`]); and how long a peer may hold a grant it asked for.

use std::time::Duration;

use bytes::Bytes;

use crate::app_memory::Claim;
use crate::large_pool::{ArrivedBody, LargeBuffer};
use crate::verbs::{AccessFlags, MemoryWindow, QueuePair, SendFlags, VerbsError};

/// The memory a grant lets the peer write.
#[derive(Debug)]
pub(super) enum GrantBuffer {
    Pool(LargeBuffer),
    App(Claim),
}

/// A body placed by RDMA WRITE, whose window is gone: in a leased buffer, or viewed in the
/// application's.
#[derive(Debug)]
pub(super) enum PlacedBody {
    Pool(ArrivedBody),
    App(Bytes),
}

impl GrantBuffer {
    pub(super) fn addr(&self) -> u64 {
        match self {
            GrantBuffer::Pool(buffer) => buffer.addr(),
            GrantBuffer::App(landing) => landing.addr(),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            GrantBuffer::Pool(buffer) => buffer.len(),
            GrantBuffer::App(landing) => landing.len(),
        }
    }

    /// The local key RDMA READs into it are posted with.
    pub(super) fn lkey(&self) -> u32 {
        match self {
            GrantBuffer::Pool(buffer) => buffer.lkey(),
            GrantBuffer::App(landing) => landing.region().lkey(),
        }
    }

    /// Binds `window` over the buffer's first `len` bytes for the peer's writes.
    ///
    /// # Safety
    /// The buffer stays where it is, unread, until the window is invalidated or
    /// deallocated (see `QueuePair::post_bind_window`).
    pub(super) unsafe fn bind(
        &self,
        qp: &QueuePair,
        wr_id: u64,
        window: &mut MemoryWindow,
        len: usize,
    ) -> Result<u32, VerbsError> {
        let (access, flags) = (AccessFlags::REMOTE_WRITE, SendFlags::SIGNALED);
        let range = 0..len.min(self.len());
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                GrantBuffer::Pool(buffer) => {
                    qp.post_bind_window(wr_id, window, buffer.region(), range, access, flags)
                }
                GrantBuffer::App(landing) => {
                    qp.post_bind_window(wr_id, window, landing.region(), range, access, flags)
                }
            }
        }
    }

    /// The body of `len` bytes that arrived in it. An application buffer goes back to its
    /// landing, viewed.
    ///
    /// # Safety
    /// The peer's last write completed, and no window bound on the buffer is left valid
    /// (invalidated or deallocated), nor any work request naming it.
    pub(super) unsafe fn arrived(self, len: usize) -> PlacedBody {
        match self {
            // SAFETY: the caller's contract.
            GrantBuffer::Pool(buffer) => PlacedBody::Pool(unsafe { ArrivedBody::new(buffer) }),
            // SAFETY: the caller's contract.
            GrantBuffer::App(landing) => PlacedBody::App(unsafe { landing.arrived(len) }),
        }
    }
}

/// How long a peer may hold a buffer granted at its request before it counts as hoarding
/// (`LargeBodies::grant_timeout`, `LargeBodies::grant_min_rate`).
#[derive(Debug, Clone, Copy)]
pub(super) struct GrantLimit {
    pub(super) timeout: Duration,
    /// Bytes per second.
    pub(super) min_rate: u64,
}

impl GrantLimit {
    /// The time a grant of `len` bytes may be held: the timeout, plus the body's writing at
    /// the slowest expected rate.
    pub(super) fn allowance(self, len: usize) -> Duration {
        let writing = Duration::from_secs_f64(len as f64 / self.min_rate.max(1) as f64);
        self.timeout.saturating_add(writing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant may be held its timeout plus the time its body takes at the slowest
    /// expected rate: a slow writer of a large body is not a hoarder.
    #[test]
    fn a_large_grant_may_be_held_while_its_body_is_written_slowly() {
        let limit = GrantLimit {
            timeout: Duration::from_secs(30),
            min_rate: 4 << 20,
        };
        assert_eq!(limit.allowance(0), Duration::from_secs(30));
        assert_eq!(limit.allowance(1 << 30), Duration::from_secs(30 + 256));
        // A body written at 10 MB/s, as soft-RoCE under emulation can.
        let writing = Duration::from_secs_f64((1u64 << 30) as f64 / 10e6);
        assert!(writing > limit.timeout && writing < limit.allowance(1 << 30));
        let no_rate = GrantLimit {
            min_rate: 0,
            ..limit
        };
        assert!(no_rate.allowance(1) > limit.timeout, "0 counts as 1 B/s");
    }
}
