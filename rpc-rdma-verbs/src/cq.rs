//! Completion queue (`ibv_cq`): where the device reports finished work requests.

use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::sys::{ibv_cq, ibv_create_cq, ibv_destroy_cq, ibv_poll_cq, ibv_req_notify_cq};

use super::comp_channel::CompletionChannel;
use super::context::Context;
use super::error::{check, error_from_ret, Result, VerbsError};
use super::wc::WorkCompletion;

/// A completion queue. Queue pairs using it hold an `Arc`, so it is destroyed after them; it
/// holds `Arc`s to its context and completion channel.
#[derive(Debug)]
pub struct CompletionQueue {
    raw: NonNull<ibv_cq>,
    tag: u64,
    channel: Option<Arc<CompletionChannel>>,
    context: Arc<Context>,
}

// SAFETY: polling and arming a CQ are thread-safe verbs (providers lock the CQ); the handle
// is immutable after creation.
unsafe impl Send for CompletionQueue {}
// SAFETY: see `Send`.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Creates a CQ with room for at least `min_entries` completions. With a `channel`, the
    /// CQ can be armed ([`CompletionQueue::req_notify`]) and its events carry `tag`.
    pub fn new(
        context: &Arc<Context>,
        min_entries: u32,
        channel: Option<&Arc<CompletionChannel>>,
        tag: u64,
    ) -> Result<Arc<CompletionQueue>> {
        Self::with_vector(context, min_entries, channel, tag, 0)
    }

    /// [`CompletionQueue::new`] signalling on completion vector `comp_vector` (below
    /// [`Context::num_comp_vectors`]): with several CQs, spreading them over the vectors
    /// spreads their interrupts over the device's interrupt lines (and cores).
    pub fn with_vector(
        context: &Arc<Context>,
        min_entries: u32,
        channel: Option<&Arc<CompletionChannel>>,
        tag: u64,
        comp_vector: u32,
    ) -> Result<Arc<CompletionQueue>> {
        let comp_vector = c_int::try_from(comp_vector)
            .map_err(|_| VerbsError::invalid("ibv_create_cq", "completion vector too large"))?;
        let cqe = c_int::try_from(min_entries.max(1))
            .map_err(|_| VerbsError::invalid("ibv_create_cq", "too many entries"))?;
        if let Some(channel) = channel {
            if channel.context().as_ptr() != context.as_ptr() {
                return Err(VerbsError::invalid(
                    "ibv_create_cq",
                    "the completion channel belongs to another device",
                ));
            }
        }
        let channel_ptr = channel.map_or(ptr::null_mut(), |c| c.as_ptr());
        // SAFETY: the context (and channel, if any) are alive (we hold Arcs); `tag` is stored
        // as an opaque cq_context and never dereferenced.
        let raw = unsafe {
            ibv_create_cq(
                context.as_ptr(),
                cqe,
                tag as *mut _,
                channel_ptr,
                comp_vector,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last_os("ibv_create_cq"))?;
        Ok(Arc::new(CompletionQueue {
            raw,
            tag,
            channel: channel.cloned(),
            context: Arc::clone(context),
        }))
    }

    /// The tag given at creation (returned by the channel's `get_event`).
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// What names this CQ in an [`super::EventSubject::Cq`].
    pub fn id(&self) -> usize {
        self.raw.as_ptr() as usize
    }

    /// The number of entries the CQ really has (at least what was asked for).
    pub fn capacity(&self) -> u32 {
        // SAFETY: the CQ is alive; `cqe` is only changed by ibv_resize_cq, which we never call.
        let cqe = unsafe { (*self.raw.as_ptr()).cqe };
        u32::try_from(cqe).unwrap_or(0)
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// The completion channel, if any.
    pub fn channel(&self) -> Option<&Arc<CompletionChannel>> {
        self.channel.as_ref()
    }

    /// Moves up to `wcs.len()` completions into `wcs` and returns the filled prefix (empty if
    /// there were none). Check each entry's [`WorkCompletion::status`].
    pub fn poll<'a>(&self, wcs: &'a mut [WorkCompletion]) -> Result<&'a mut [WorkCompletion]> {
        let max = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: the CQ is alive and `wcs` has room for `max` entries; WorkCompletion is
        // `repr(transparent)` over `ibv_wc`.
        let n = unsafe { ibv_poll_cq(self.raw.as_ptr(), max, wcs.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(error_from_ret("ibv_poll_cq", n));
        }
        let n = usize::try_from(n).unwrap_or(0).min(wcs.len());
        Ok(&mut wcs[..n])
    }

    /// Arms the CQ: the next completion (or, with `solicited_only`, the next solicited one or
    /// error) raises one event on the completion channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(VerbsError::invalid(
                "ibv_req_notify_cq",
                "the CQ has no completion channel",
            ));
        }
        // SAFETY: the CQ is alive.
        let ret = unsafe { ibv_req_notify_cq(self.raw.as_ptr(), c_int::from(solicited_only)) };
        check("ibv_req_notify_cq", ret)
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.raw.as_ptr()
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold Arcs to it, so none is left; channel events are
        // acknowledged as they are read (`CompletionChannel::get_event`), so this cannot block.
        let ret = unsafe { ibv_destroy_cq(self.raw.as_ptr()) };
        if let Err(e) = check("ibv_destroy_cq", ret) {
            tracing::warn!(error = %e, "destroying a completion queue failed");
        }
    }
}
