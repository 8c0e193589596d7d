//! The interface between core and a transport, and the only one: what a transport
//! implements for each connection and what it calls.
//!
//! * Sending: [`FrameSender`] (a server's [`ReplySink`](crate::server::ReplySink) is the
//!   same), and for a client [`ClientTransport`].
//! * Receiving: [`Inbound`], which core implements once per side
//!   ([`crate::client::Responses`], [`crate::server::Requests`]).
//! * Optional: [`Progress`], for a transport whose completions a waiting caller may poll
//!   on its own thread.
//! * Serving: [`Listener`], a transport's server side as its user holds it; and
//!   [`crate::server::ServedLink`], each served connection in a graceful shutdown.
//!
//! `docs/ARCHITECTURE.md` shows where a new transport plugs in.

mod inbound;
pub(crate) mod progress;
mod wake;

pub use crate::frame::FrameSender;
pub use inbound::Inbound;
pub use progress::{Drive, Progress};
pub(crate) use wake::Waiter;
pub use wake::Wakes;

use std::net::SocketAddr;
use std::time::Duration;

use crate::frame::OutgoingFrame;
use crate::Status;

/// Idle time after which a transport probes a connection's peer (TCP keepalive, an RDMA
/// probe), unless its settings say otherwise.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);
/// Longest a peer may leave a probe, or data sent to it, unacknowledged before it is
/// declared dead and the connection closed (`UNAVAILABLE`).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a sender may find no room to send (a full socket, no credit or slot) before the
/// peer is taken as stuck and the connection closed.
pub const DEFAULT_STALL_LIMIT: Duration = Duration::from_secs(10);

/// What a transport provides to the client side of a connection: sending frames
/// ([`FrameSender`]) and the rest below. What the connection receives goes up through the
/// [`Inbound`] side it is given at connect time ([`crate::client::Responses`] over the
/// channel's [`CallTable`](crate::CallTable)), which also hears of the connection's end.
pub trait ClientTransport: FrameSender {
    /// Sends a header-only frame (a `Cancel`) without ever blocking, from any context,
    /// `Drop` included: a transport with no room now queues it within a bound, or drops it
    /// (the call was given up on; its late answer is ignored). The default calls `send`.
    fn send_control(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.send(frame)
    }

    /// Whether a waiting caller may poll this transport's completions on its own thread
    /// ([`Progress`]); `None` (the default): callers wait to be woken by the receive path.
    fn progress(&self) -> Option<&dyn Progress> {
        None
    }

    /// Where the connection goes, for messages.
    fn peer(&self) -> &str;

    /// Closes the connection; pending calls fail with `Unavailable`.
    fn close(&self);
}

/// A transport's server side, serving a dispatcher's services until it is shut down.
/// Dropping it shuts it down too.
pub trait Listener: Send + std::fmt::Debug {
    /// The bound address (with the real port when bound to port 0).
    fn local_addr(&self) -> SocketAddr;

    /// Stops accepting, refuses new requests with `UNAVAILABLE`, lets running handlers
    /// answer for up to `grace`, then closes every connection once its answers left
    /// ([`crate::server::shut_down`]). Blocks until done; does nothing a second time.
    fn shutdown(&mut self, grace: Duration);
}
