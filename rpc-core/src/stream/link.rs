//! Where a stream's frames go: the client's transport or the server's reply sink.

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::frame::{FrameSender, OutgoingFrame};
use crate::transport::progress::{self, Drive, Progress};
use crate::transport::ClientTransport;
use crate::Status;

/// The sending side of the connection a stream lives on, and on a client the transport a
/// waiting task may drive.
#[derive(Clone)]
pub(crate) struct Link {
    frames: Arc<dyn FrameSender>,
    client: Option<Arc<dyn ClientTransport>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.client {
            Some(_) => "Link::Client",
            None => "Link::Server",
        })
    }
}

impl Link {
    /// A client's connection.
    pub(crate) fn client(transport: Arc<dyn ClientTransport>) -> Self {
        Link {
            frames: transport.clone(),
            client: Some(transport),
        }
    }

    /// A server's connection.
    pub(crate) fn server(sink: Arc<dyn FrameSender>) -> Self {
        Link {
            frames: sink,
            client: None,
        }
    }

    /// Sends without blocking: `Pending` (and `cx` woken later) while there is no room.
    pub(crate) fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.frames.poll_send(cx, frame)
    }

    /// Sends a stream message that may wait for the next ones until [`Link::flush`].
    pub(crate) fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.frames.poll_send_more(cx, frame)
    }

    /// How much a sender may stage for the connection ([`FrameSender::stage_limit`]).
    pub(crate) fn stage_limit(&self) -> Option<usize> {
        self.frames.stage_limit()
    }

    /// Hands over frames a sender encoded, all of `encoded` ([`FrameSender::poll_send_encoded`]).
    pub(crate) fn poll_send_encoded(
        &self,
        cx: &mut Context<'_>,
        encoded: &mut bytes::BytesMut,
    ) -> Poll<Result<(), Status>> {
        self.frames.poll_send_encoded(cx, encoded)
    }

    /// Sends what [`Link::poll_send_more`] left waiting.
    pub(crate) fn flush(&self) {
        self.frames.flush();
    }

    /// Sends, blocking the thread while there is no room (blocking APIs only).
    pub(crate) fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.frames.send(frame)
    }

    /// Lets a client task waiting on the stream drive the transport's completions
    /// ([`crate::client::Progress::drive`]).
    pub(crate) fn drive(&self, cx: &mut Context<'_>, driving: &mut bool) -> Drive {
        progress::drive(self.progress(), cx, driving)
    }

    /// Gives back the lease [`Link::drive`] handed out.
    pub(crate) fn stop_driving(&self, driving: &mut bool) {
        progress::release(self.progress(), driving);
    }

    /// Polls the transport's completions on a blocked thread (run-to-completion); false if
    /// nothing arrived and the thread should park.
    pub(crate) fn poll_progress(&self) -> bool {
        progress::poll_progress(self.progress(), None)
    }

    fn progress(&self) -> Option<&dyn Progress> {
        self.client.as_ref().and_then(|t| t.progress())
    }
}
