//! A server's graceful shutdown, the same sequence on every transport.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ConnectionDispatch, Dispatcher};
use crate::Status;

/// Least time a shutdown gives answers already queued to leave, whatever its grace.
pub const FLUSH_AT_LEAST: Duration = Duration::from_millis(100);
/// How often a shutdown looks whether every connection's answers have left.
const FLUSH_CHECK: Duration = Duration::from_millis(1);

/// A served connection's transport side, as a graceful shutdown sees it.
pub trait ServedLink: Send + Sync {
    /// Lets what was sent leave and says whether all of it has (a connection that ended
    /// has). Called repeatedly until it says so or time is up; never blocks.
    fn flushed(&self) -> bool;

    /// Closes the connection now, with `status` for what is still waiting.
    fn close(&self, status: Status);

    /// Tells the peer, in the transport's own way, that the server takes no new calls
    /// (HTTP/2's GOAWAY); the calls it refuses anyway get `UNAVAILABLE`. By default nothing
    /// more is said.
    fn drain(&self) {}
}

/// One connection a server serves: its transport side and its dispatch.
#[derive(Debug)]
pub struct Served<L: ?Sized> {
    /// The transport's connection.
    pub link: Arc<L>,
    /// Its requests' dispatch.
    pub dispatch: Arc<ConnectionDispatch>,
}

impl<L: ?Sized> Clone for Served<L> {
    fn clone(&self) -> Self {
        Served {
            link: self.link.clone(),
            dispatch: self.dispatch.clone(),
        }
    }
}

/// Shuts the connections of a server that stopped accepting down gracefully: each refuses
/// new requests with `UNAVAILABLE`, running handlers answer for up to `grace`, answers
/// queued leave (within what is left of `grace`, and at least [`FLUSH_AT_LEAST`]), and
/// then every connection closes. Blocks until done.
pub fn shut_down<L: ServedLink + ?Sized>(
    dispatcher: &Dispatcher,
    served: &[Served<L>],
    started: Instant,
    grace: Duration,
) {
    for s in served {
        s.link.drain();
        s.dispatch.drain();
    }
    let left = (started + grace).saturating_duration_since(Instant::now());
    if !dispatcher.wait_idle(left) {
        tracing::warn!(
            in_flight = dispatcher.in_flight(),
            "shutdown grace period over with handlers still running"
        );
    }
    // Every connection starts flushing at once; then those not done are looked at again.
    let until = (started + grace).max(Instant::now() + FLUSH_AT_LEAST);
    let mut flushing: Vec<&Served<L>> = served.iter().filter(|s| !s.link.flushed()).collect();
    while !flushing.is_empty() && Instant::now() < until {
        std::thread::sleep(FLUSH_CHECK);
        flushing.retain(|s| !s.link.flushed());
    }
    for s in served {
        s.dispatch.close();
        s.link.close(Status::unavailable("the server shut down"));
    }
}
