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

use std::time::{Duration, Instant};

use rpc_core::server::ServedLink;
use rpc_core::Status;

use super::Conn;

/// How far a connection is closed, part of its `State`. Moves forward only, except that a
/// close waiting for hand-ups becomes due again (`Open`) when the last one is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    /// Open, or closed by the protocol with the close not yet run (the next `unlock`
    /// reports it).
    Open,
    /// The protocol closed while other threads still hand up frames taken before: the last
    /// of them runs the close (see `HandUps`).
    AfterHandUps,
    /// Closed: the upper layer was told, waiting senders woken, the peer disconnected.
    Closed,
}

/// The peer disconnected: what the close will say, and since when completions drain.
pub(super) struct Disconnected {
    pub(super) status: Status,
    since: Instant,
}

impl Disconnected {
    /// The close's status once the drain has lasted `limit` (the marker never came back).
    pub(super) fn expired(&self, limit: Duration) -> Option<Status> {
        (self.since.elapsed() >= limit).then(|| self.status.clone())
    }
}

impl Conn {
    /// Whether everything this side committed was posted and is complete, so a disconnect
    /// now loses nothing; if only completions are missing, posts a probe whose completion
    /// proves them (call again later). True on a closed connection.
    pub(crate) fn drained(&self) -> bool {
        if self.is_closed() {
            return true;
        }
        let mut state = self.state.lock();
        if !state.writers.controls.is_empty() {
            return false;
        }
        if state.proto.is_drained() {
            return true;
        }
        if state.proto.start_drain() {
            tracing::trace!(peer = %self.peer, "fence probe before disconnecting");
            self.post_probe(&mut state);
            self.run_actions(&mut state);
        }
        self.unlock(state);
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
        self.unlock(state);
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
