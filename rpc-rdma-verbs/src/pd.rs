//! Protection domain (`ibv_pd`): the scope of memory registrations and queue pairs.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::sys::{ibv_alloc_pd, ibv_dealloc_pd, ibv_pd};

use super::context::Context;
use super::error::{check, Result, VerbsError};

/// A protection domain. Memory regions and queue pairs hold an `Arc` to it, so it is
/// deallocated only after all of them.
#[derive(Debug)]
pub struct ProtectionDomain {
    raw: NonNull<ibv_pd>,
    context: Arc<Context>,
}

// SAFETY: `ibv_pd` is only passed to thread-safe verbs; the handle is immutable after creation.
unsafe impl Send for ProtectionDomain {}
// SAFETY: see `Send`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `context`.
    pub fn new(context: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is open (we hold an Arc to it).
        let raw = unsafe { ibv_alloc_pd(context.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last_os("ibv_alloc_pd"))?;
        Ok(Arc::new(ProtectionDomain {
            raw,
            context: Arc::clone(context),
        }))
    }

    /// The device context the domain belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: the last Arc is gone, so every MR and QP (which hold Arcs) is gone too.
        let ret = unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
        if let Err(e) = check("ibv_dealloc_pd", ret) {
            tracing::warn!(error = %e, "deallocating a protection domain failed");
        }
    }
}
