//! Sending large bodies from where their bytes lie, uncopied: the application's own
//! registered memory ([`RegisteredBuffer`], `buffer.rs`), and bodies that arrived by RDMA
//! WRITE and are sent on over the same device (an echo, or a proxy's call to another
//! server) from the buffer they arrived in. Both are listed
//! by address (`reachable.rs`); as a large body is encoded, each run of bytes it holds in
//! one piece is looked up there, and those the connection's device can reach are gathered
//! by its WRITEs instead of copied (`gather.rs`).
//!
//! A buffer is registered with the protection domain of each device the process's
//! completion engines use (one domain per device, which all its engines share): those there
//! are when it is made, and each a later connection sets up. Never on a call's path. When
//! the last engine of a protection domain retires, the buffers let go of their
//! registrations with it. Registrations count
//! against [`ProcessLimits::registered_bytes`]; a device it cannot be registered with (the
//! limit, the device's own) gets copies of its bytes instead, as any other memory does.
//!
//! The device only reads this memory, and only while a send holds it: every `Bytes` view
//! holds its memory, and so does a transfer until its WRITEs completed.
//! [`RegisteredBuffer::get_mut`] hands the bytes out for writing only when nothing else
//! holds the buffer, as `Arc::get_mut` does.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(doc)]
use crate::budget::ProcessLimits;

mod buffer;
mod gather;
mod reachable;

pub(crate) use buffer::Claim;
pub use buffer::RegisteredBuffer;
pub(crate) use gather::{Gathered, InPlace};
pub(crate) use reachable::{any_listed, placed_view, register_all, unregister_all};

static COPIED: AtomicU64 = AtomicU64::new(0);
static IN_PLACE: AtomicU64 = AtomicU64::new(0);
static LANDED: AtomicU64 = AtomicU64::new(0);

/// Bytes of the large bodies (those sent by RDMA WRITE) this process has sent, by how, and
/// of those it received into the application's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LargeBodyBytes {
    /// Encoded (copied) into the transport's registered buffers.
    pub copied: u64,
    /// Sent from the application's [`RegisteredBuffer`]s where they lie, uncopied.
    pub in_place: u64,
    /// Received straight into the application's buffers offered for them
    /// ([`rpc_core::Landing`]), uncopied.
    pub landed: u64,
}

impl LargeBodyBytes {
    /// What was counted between `earlier` and these counts.
    #[must_use]
    pub fn since(&self, earlier: &LargeBodyBytes) -> LargeBodyBytes {
        LargeBodyBytes {
            copied: self.copied.saturating_sub(earlier.copied),
            in_place: self.in_place.saturating_sub(earlier.in_place),
            landed: self.landed.saturating_sub(earlier.landed),
        }
    }
}

/// How the large bodies sent so far went: copied, or from application memory in place;
/// and how many bytes landed in application memory. Also counted, with metrics on, as
/// `rdma_rpc_large_body_bytes_total` by `path` (`copied`, `in_place`, `landed`).
pub fn large_body_bytes() -> LargeBodyBytes {
    LargeBodyBytes {
        copied: COPIED.load(Ordering::Relaxed),
        in_place: IN_PLACE.load(Ordering::Relaxed),
        landed: LANDED.load(Ordering::Relaxed),
    }
}

/// A large body of `len` bytes landed in application memory.
pub(crate) fn count_landed(len: u64) {
    LANDED.fetch_add(len, Ordering::Relaxed);
    if let Some(metrics) = crate::metrics::rdma() {
        metrics.large_landed.increment(len);
    }
}

/// A large body is sent: `copied` bytes encoded into a transport buffer, `in_place` from
/// application memory.
pub(crate) fn count_large_body(copied: u64, in_place: u64) {
    COPIED.fetch_add(copied, Ordering::Relaxed);
    IN_PLACE.fetch_add(in_place, Ordering::Relaxed);
    if let Some(metrics) = crate::metrics::rdma() {
        metrics.large_copied.increment(copied);
        metrics.large_in_place.increment(in_place);
    }
}
