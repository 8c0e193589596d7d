//! Ending a connection without losing what is in flight, in the order the seeds teach:
//!
//! * **Leaving** ([`Conn::drained`]): a side that shuts down disconnects only once every
//!   frame it committed was posted and completed. A disconnect moves the queue pair to the
//!   error state, which flushes posted sends and writes the peer has not acknowledged;
//!   unsignaled sends complete silently, so a probe posted after the last of them serves
//!   as a fence (the protocol's `is_drained`).
//! * **Left** ([`Conn::peer_disconnected`]): when the peer disconnects, frames it sent
//!   before may still sit in the completion queue. The connection moves its queue pair to
//!   the error state and lets the protocol drain (its `disconnect` module: a probe as a
//!   marker behind everything posted, flushes expected, bodies that arrived handed up);
//!   it closes after, with the disconnect as its reason. Frames taken from the queue with
//!   the close are handed up before it (`hand_up` delivers first). A drain whose marker
//!   never comes back is given up after the keepalive timeout.

use std::time::Instant;

use rpc_core::server::ServedLink;
use rpc_core::Status;

use super::Conn;

/// The peer disconnected: what the close will say, and since when completions drain.
pub(super) struct Disconnected {
    pub(super) status: Status,
    since: Instant,
}

impl Conn {
    /// Whether everything this side committed was posted and is complete, so a disconnect
    /// now loses nothing; if only completions are missing, posts a probe whose completion
    /// proves them (call again later). True on a closed connection.
    pub(crate) fn drained(&self) -> bool {
        if self.is_closed() {
            return true;
        }
        if !self.queued_controls.lock().is_empty() {
            return false;
        }
        {
            let mut state = self.state.lock();
            if state.proto.is_drained() {
                return true;
            }
            if !state.proto.start_drain() {
                return false;
            }
            tracing::trace!(peer = %self.peer, "fence probe before disconnecting");
            self.post_probe(&mut state);
            self.run_actions(&mut state);
        }
        self.after_state();
        false
    }

    /// The peer disconnected (`status` says how): closes once the completions that arrived
    /// before are processed (see the module documentation).
    pub(crate) fn peer_disconnected(&self, status: Status) {
        if self.is_closed() {
            return;
        }
        // The queue pair goes to the error state (the cm may have done it already), so
        // everything posted comes back, flushed if it had not completed.
        let _ = self.id.disconnect();
        {
            let mut state = self.state.lock();
            if state.disconnected.is_some() || state.proto.is_closed() {
                return;
            }
            state.disconnected = Some(Disconnected {
                status,
                since: Instant::now(),
            });
            state.proto.on_peer_disconnected();
            self.run_actions(&mut state);
        }
        self.after_state();
    }

    /// Closes a connection whose drain after the peer's disconnect has lasted the
    /// keepalive timeout (the probe never came back). True if it is draining.
    pub(super) fn expire_disconnect(&self) -> bool {
        let expired = {
            let state = self.state.lock();
            match &state.disconnected {
                None => return false,
                Some(d) if d.since.elapsed() >= self.keepalive.timeout() => Some(d.status.clone()),
                Some(_) => None,
            }
        };
        if let Some(status) = expired {
            self.close(status);
        }
        true
    }
}

/// A server's graceful shutdown waits until the connection is [drained](Conn::drained)
/// before it disconnects.
impl ServedLink for Conn {
    fn flushed(&self) -> bool {
        self.drained()
    }

    fn close(&self, status: Status) {
        Conn::close(self, status);
    }
}
