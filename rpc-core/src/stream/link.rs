//! Where a stream's frames go: the client's transport or the server's reply sink.

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::client::{ClientTransport, Drive};
use crate::frame::OutgoingFrame;
use crate::server::ReplySink;
use crate::status::Status;

/// The sending side of the connection a stream lives on.
#[derive(Clone)]
pub(crate) enum Link {
    /// A client's connection.
    Client(Arc<dyn ClientTransport>),
    /// A server's connection.
    Server(Arc<dyn ReplySink>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Link::Client(_) => "Link::Client",
            Link::Server(_) => "Link::Server",
        })
    }
}

impl Link {
    /// Sends without blocking: `Pending` (and `cx` woken later) while there is no room.
    pub(crate) fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        match self {
            Link::Client(t) => t.poll_send(cx, frame),
            Link::Server(s) => s.poll_send(cx, frame),
        }
    }

    /// Sends a stream message that may wait for the next ones until [`Link::flush`].
    pub(crate) fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        match self {
            Link::Client(t) => t.poll_send_more(cx, frame),
            Link::Server(s) => s.poll_send_more(cx, frame),
        }
    }

    /// Sends what [`Link::poll_send_more`] left waiting.
    pub(crate) fn flush(&self) {
        match self {
            Link::Client(t) => t.flush(),
            Link::Server(s) => s.flush(),
        }
    }

    /// Sends, blocking the thread while there is no room (blocking APIs only).
    pub(crate) fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        match self {
            Link::Client(t) => t.send(frame),
            Link::Server(s) => s.send(frame),
        }
    }

    /// Lets a client task waiting on the stream drive the transport ([`ClientTransport::drive`]).
    pub(crate) fn drive(&self, cx: &mut Context<'_>, driving: &mut bool) -> Drive {
        match self {
            Link::Client(t) => t.drive(cx, driving),
            Link::Server(_) => Drive::Wait,
        }
    }

    /// Gives back the lease [`Link::drive`] handed out.
    pub(crate) fn stop_driving(&self, driving: &mut bool) {
        if std::mem::take(driving) {
            if let Link::Client(t) = self {
                t.stop_driving();
            }
        }
    }

    /// Polls the transport's completions on a blocked thread (run-to-completion); false if
    /// nothing arrived and the thread should park.
    pub(crate) fn poll_progress(&self) -> bool {
        match self {
            Link::Client(t) => t.poll_progress(),
            Link::Server(_) => false,
        }
    }
}
