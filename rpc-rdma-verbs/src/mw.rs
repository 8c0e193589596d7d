//! Memory windows (`ibv_mw`, type 2): revocable remote access to part of a memory region.
//!
//! A region registered with [`super::AccessFlags::MW_BIND`] (and no remote access of its own)
//! is unreachable by any peer. Binding a window to a range of it, by a work request on a
//! queue pair ([`super::QueuePair::post_bind_window`]), hands out a fresh rkey valid on that
//! queue pair only; a local invalidation ([`super::QueuePair::post_local_invalidate`]) takes
//! it back, after which a WRITE with that rkey fails at the responder instead of landing.
//! Each bind picks a new 8-bit key in the low byte of the rkey, so an rkey that was
//! invalidated stays invalid when the window is bound again (for the next 255 binds).

use std::ptr::NonNull;
use std::sync::Arc;

use crate::sys::{ibv_alloc_mw, ibv_dealloc_mw, ibv_mw, ibv_mw_type};

use super::error::{check, Result, VerbsError};
use super::pd::ProtectionDomain;

/// A type 2 memory window. Dropping it deallocates it (invalidating any binding).
#[derive(Debug)]
pub struct MemoryWindow {
    raw: NonNull<ibv_mw>,
    /// The rkey of the most recent bind (or the allocation's, before any).
    rkey: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: `ibv_mw` is only passed to thread-safe verbs; it is changed only through `&mut`.
unsafe impl Send for MemoryWindow {}
// SAFETY: see `Send`.
unsafe impl Sync for MemoryWindow {}

impl MemoryWindow {
    /// Allocates a type 2 window on `pd`. Fails with `EOPNOTSUPP` on devices without them.
    pub fn alloc(pd: &Arc<ProtectionDomain>) -> Result<MemoryWindow> {
        // SAFETY: the PD is alive (we hold an Arc); the provider either fills a new window or
        // returns NULL/None with errno set.
        let raw = unsafe { ibv_alloc_mw(pd.as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) };
        let raw = raw
            .and_then(NonNull::new)
            .ok_or_else(|| VerbsError::last_os("ibv_alloc_mw"))?;
        // SAFETY: just allocated and non-null; `rkey` is plain data.
        let rkey = unsafe { (*raw.as_ptr()).rkey };
        Ok(MemoryWindow {
            raw,
            rkey,
            pd: Arc::clone(pd),
        })
    }

    /// The rkey of the latest bind.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The rkey the next bind will hand out: same index, next key byte (`ibv_inc_rkey`).
    pub fn next_rkey(&self) -> u32 {
        let rkey = self.rkey();
        (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
    }

    /// Records that a bind with `rkey` was posted. The `ibv_mw` itself is updated too:
    /// providers name the window by `mw->rkey` in later binds (rxe checks it against the
    /// key the device holds and fails the bind when it is stale).
    pub(crate) fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
        // SAFETY: the window is alive, and `&mut self` makes this the only access to the
        // struct from our side; `rkey` is the consumer's to keep current between binds.
        unsafe { (*self.raw.as_ptr()).rkey = rkey };
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_mw {
        self.raw.as_ptr()
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc`, deallocated once; the PD outlives it (field drops
        // after this).
        let ret = unsafe { ibv_dealloc_mw(self.raw.as_ptr()) };
        if let Err(e) = check("ibv_dealloc_mw", ret) {
            tracing::warn!(error = %e, "deallocating a memory window failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn next_rkey_turns_over_the_key_byte_only() {
        let next = |rkey: u32| (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff);
        assert_eq!(next(0x1234_5601), 0x1234_5602);
        assert_eq!(next(0x1234_56ff), 0x1234_5600);
        assert_eq!(next(u32::MAX), 0xffff_ff00);
    }
}
