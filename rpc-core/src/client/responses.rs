//! [`Responses`]: a client connection's side of [`Inbound`], for every transport.

use std::sync::Arc;

use crate::call_table::CallTable;
use crate::frame::InboundFrame;
use crate::header::{FrameKind, Header};
use crate::stream::{is_message_frame, is_stream_frame, Wakes};
use crate::transport::Inbound;
use crate::{Code, Status};

/// Completes a client connection's calls from what it receives.
pub struct Responses {
    calls: Arc<CallTable>,
    peer: String,
    /// Largest response accepted, for refusals of larger ones.
    limit: usize,
}

impl std::fmt::Debug for Responses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responses")
            .field("peer", &self.peer)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Responses {
    /// Completes `calls`, made to `peer`, accepting responses of up to `limit` bytes.
    pub fn new(calls: Arc<CallTable>, peer: impl Into<String>, limit: usize) -> Responses {
        Responses {
            calls,
            peer: peer.into(),
            limit,
        }
    }

    /// Fails `call_id` if `kind` is a frame of the client's (the request, or a message of
    /// its stream): its server will never see it.
    fn fail_sent(&self, call_id: u64, kind: FrameKind, status: Status) {
        if kind == FrameKind::Request || is_message_frame(kind) {
            self.calls.complete(call_id, Err(status));
        }
    }
}

impl Inbound for Responses {
    fn on_frame(&self, frame: InboundFrame, wakes: &mut Wakes) -> Result<(), Status> {
        match frame.header.kind {
            // Call id 0 is never a call's: a status for it is about the connection (a server
            // at its connection limit says so, then closes). The connection is closed from
            // this side too: a server that says so and keeps it open cannot hold it.
            FrameKind::Response if frame.header.call_id == 0 => {
                let code = match frame.header.status {
                    Code::Ok => Code::Unavailable,
                    code => code,
                };
                let status = Status::new(
                    code,
                    format!(
                        "{} refused the connection: {}",
                        self.peer,
                        String::from_utf8_lossy(&frame.payload)
                    ),
                );
                self.calls.close(status.clone());
                return Err(status);
            }
            FrameKind::Response => {
                self.calls.complete(frame.header.call_id, Ok(frame));
            }
            kind if is_stream_frame(kind) => self.calls.on_stream_frame(frame, wakes),
            kind => {
                tracing::debug!(?kind, peer = %self.peer, "ignoring a frame clients do not act on")
            }
        }
        Ok(())
    }

    fn on_messages(&self, call_id: u64, run: &mut Vec<InboundFrame>, wakes: &mut Wakes) {
        self.calls.on_stream_messages(call_id, run.drain(..), wakes);
    }

    fn on_oversized(&self, header: &Header, declared: u64) {
        let (what, limit) = crate::stream::batch::oversized(header.kind, self.limit, "response");
        self.calls.complete(
            header.call_id,
            Err(Status::message_too_large(what, declared, limit)),
        );
    }

    fn on_dropped(&self, call_id: u64, kind: FrameKind) {
        let status = Status::unavailable("the connection closed before the request was sent");
        self.fail_sent(call_id, kind, status);
    }

    fn on_transfer_failed(&self, call_id: u64, kind: FrameKind, status: Status) {
        self.fail_sent(call_id, kind, status);
    }

    fn idle(&self) -> bool {
        false
    }

    fn on_closed(&self, status: Status) {
        tracing::debug!(peer = %self.peer, %status, "client connection ended");
        self.calls.close(status);
    }
}
