//! [`ReplySink`]: where a connection's response frames go.

use std::task::{Context, Poll};

use crate::frame::OutgoingFrame;
use crate::status::Status;

/// Where a connection's response frames go; implemented by transports.
pub trait ReplySink: Send + Sync + 'static {
    /// Writes and sends one frame.
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status>;

    /// Sends one frame without blocking: with no room for it now, returns `Pending` and
    /// wakes `cx` once there may be. A `Pending` attempt leaves nothing behind. The default
    /// calls [`ReplySink::send`].
    fn poll_send(
        &self,
        _cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        Poll::Ready(self.send(frame))
    }

    /// Like [`ReplySink::poll_send`], but the frame may wait in the transport, with others
    /// sent the same way, until [`ReplySink::flush`]: a stream's messages sent back to back
    /// leave together. The default sends at once.
    fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.poll_send(cx, frame)
    }

    /// Sends what [`ReplySink::poll_send_more`] left waiting. Never blocks.
    fn flush(&self) {}
}
