//! [`Progress`]: letting a waiting caller make the transport's progress on its own thread
//! (run to completion), an optional capability a transport offers through
//! [`ClientTransport::progress`](super::ClientTransport::progress). RDMA lets a waiting
//! caller poll the completion queue; TCP lets a blocking caller read the socket while no
//! other thread does.

use std::task::Context;
use std::time::Instant;

/// Polling a transport's completions from the caller's thread.
pub trait Progress: Send + Sync {
    /// Lets a blocked caller make progress: poll the completions (or read the socket) for
    /// a while, never past `until` (the call's deadline). True as soon as anything was
    /// received (by this thread or another), false if nothing was and the caller should
    /// park.
    fn poll_progress(&self, until: Option<Instant>) -> bool;

    /// One look at the completions for an async call waiting for its response, and the
    /// transport's advice on what its task does next. `lease` is the caller's: the
    /// transport sets it when it lets this caller spin and clears it when it takes the
    /// lease back; a caller that ends while holding it calls [`Progress::release`].
    fn drive(&self, cx: &mut Context<'_>, lease: &mut bool) -> Drive;

    /// Gives back the lease of a caller that ended while [`Progress::drive`] let it spin
    /// (its call completed, failed or was dropped), so another waiting caller, or the
    /// transport's own thread, drives the completions from now on. Never blocks.
    fn release(&self);
}

/// What an async call waiting for its response does after [`Progress::drive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    /// Something was received: look at the call again.
    Received,
    /// Nothing yet, and this caller drives the completions: be polled again soon (the task
    /// wakes itself and yields to the others on its executor).
    Spin,
    /// Wait to be woken: another caller, or the transport's own thread, drives them.
    Wait,
}

/// A caller's drive lease on `progress`, if any: one look ([`Progress::drive`]), or
/// [`Drive::Wait`] for a transport that offers no progress.
pub(crate) fn drive(
    progress: Option<&dyn Progress>,
    cx: &mut Context<'_>,
    lease: &mut bool,
) -> Drive {
    match progress {
        Some(progress) => progress.drive(cx, lease),
        None => Drive::Wait,
    }
}

/// Gives the lease back if the caller holds it.
pub(crate) fn release(progress: Option<&dyn Progress>, lease: &mut bool) {
    if std::mem::take(lease) {
        if let Some(progress) = progress {
            progress.release();
        }
    }
}

/// Polls for a blocked caller, at most until `until`; false (park) for a transport that
/// offers no progress.
pub(crate) fn poll_progress(progress: Option<&dyn Progress>, until: Option<Instant>) -> bool {
    progress.is_some_and(|progress| progress.poll_progress(until))
}
