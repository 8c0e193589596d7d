//! Completion channel (`ibv_comp_channel`): a file descriptor that becomes readable when an
//! armed completion queue gets a completion, for sleeping instead of busy-polling.

use std::os::fd::{AsRawFd, RawFd};
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_destroy_comp_channel,
    ibv_get_cq_event,
};

use super::context::Context;
use super::error::{check, Result, VerbsError};

/// A completion channel. Completion queues attached to it hold an `Arc`, so it is destroyed
/// after them.
///
/// Use: `cq.req_notify(false)`, wait for [`CompletionChannel::fd`] to be readable (or call
/// [`CompletionChannel::get_event`], which blocks), then poll the CQ, re-arm, and poll again
/// (completions that arrived before re-arming raise no event).
#[derive(Debug)]
pub struct CompletionChannel {
    raw: NonNull<ibv_comp_channel>,
    context: Arc<Context>,
}

// SAFETY: the channel is a kernel fd plus an immutable struct; `ibv_get_cq_event` may be
// called from any thread.
unsafe impl Send for CompletionChannel {}
// SAFETY: see `Send`.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// Creates a completion channel on `context`.
    pub fn new(context: &Arc<Context>) -> Result<Arc<CompletionChannel>> {
        // SAFETY: the context is open (we hold an Arc).
        let raw = unsafe { ibv_create_comp_channel(context.as_ptr()) };
        let raw =
            NonNull::new(raw).ok_or_else(|| VerbsError::last_os("ibv_create_comp_channel"))?;
        Ok(Arc::new(CompletionChannel {
            raw,
            context: Arc::clone(context),
        }))
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.context
    }

    /// Makes [`CompletionChannel::get_event`] return `EAGAIN` instead of blocking (for use
    /// with epoll / an async reactor on [`CompletionChannel::fd`]).
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.fd(), nonblocking)
    }

    /// The file descriptor, readable when an event is pending.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive; `fd` is immutable.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Waits for the next completion event and returns the `tag` of the completion queue
    /// that raised it (see [`super::CompletionQueue::new`]). The event is acknowledged before
    /// returning. The CQ is disarmed: call `req_notify` again for the next event.
    pub fn get_event(&self) -> Result<u64> {
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut cq_context: *mut c_void = ptr::null_mut();
        // SAFETY: the channel is alive and both out-pointers are valid.
        let ret = unsafe { ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut cq_context) };
        check("ibv_get_cq_event", ret)?;
        if !cq.is_null() {
            // SAFETY: `cq` was just returned with an unacknowledged event, and
            // `ibv_destroy_cq` waits for all events to be acknowledged, so it is still alive.
            unsafe { ibv_ack_cq_events(cq, 1) };
        }
        Ok(cq_context as u64)
    }

    /// Like [`CompletionChannel::get_event`] on a non-blocking channel: `None` when no event
    /// is pending.
    pub fn try_get_event(&self) -> Result<Option<u64>> {
        match self.get_event() {
            Ok(tag) => Ok(Some(tag)),
            Err(e) if e.is_would_block() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_comp_channel {
        self.raw.as_ptr()
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ using the channel holds an Arc to it, so none is left.
        let ret = unsafe { ibv_destroy_comp_channel(self.raw.as_ptr()) };
        if let Err(e) = check("ibv_destroy_comp_channel", ret) {
            tracing::warn!(error = %e, "destroying a completion channel failed");
        }
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`.
pub(crate) fn set_nonblocking(fd: RawFd, nonblocking: bool) -> Result<()> {
    // SAFETY: F_GETFL on an fd we own; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(VerbsError::last_os("fcntl(F_GETFL)"));
    }
    let flags = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: F_SETFL on an fd we own; no memory is passed.
    let ret = unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    check("fcntl(F_SETFL)", ret)
}
