//! [`Inbound`]: the one interface through which every transport hands up what a
//! connection receives, and the two sides that implement it, written once for every
//! transport: a client's [`crate::client::Responses`] and a server's
//! [`crate::server::Requests`].

use super::Wakes;
use crate::frame::InboundFrame;
use crate::header::{FrameKind, Header};
use crate::Status;

/// What a connection's transport calls as frames arrive, given to it when the connection
/// is set up. Calls may come from several threads at once: TCP hands frames up from the
/// connection's reader, RDMA from whichever thread drives the completion queue (the engine's
/// poller, or callers spinning on it), and the end of a connection (`on_dropped`,
/// `on_closed`) may be reported from the thread that closed it. The frames of one read or
/// completion batch come in the order they arrived.
pub trait Inbound: Send + Sync + 'static {
    /// A complete frame. Wakeups it causes may be held in `wakes`, which the transport
    /// performs once the frames of one read or completion batch are handed up. An error
    /// says the connection must end with that status (the peer said it refused it): the
    /// transport closes it, and what arrived after this frame may be dropped.
    fn on_frame(&self, frame: InboundFrame, wakes: &mut Wakes) -> Result<(), Status>;

    /// A run of `Message` and `Messages` frames of stream `call_id`, in order (the frames
    /// of one read that follow each other), to be taken out of `run` and fed under one
    /// lookup.
    fn on_messages(&self, call_id: u64, run: &mut Vec<InboundFrame>, wakes: &mut Wakes);

    /// A frame over the payload limit, refused at its header (its bytes are skipped).
    fn on_oversized(&self, header: &Header, declared: u64);

    /// A frame of call `call_id` was accepted for sending but never left: the connection
    /// closed first.
    fn on_dropped(&self, call_id: u64, kind: FrameKind);

    /// A large body (`kind`: its frame's kind) of call `call_id` could not be sent (the
    /// peer refused a buffer for it); its call fails with `status`.
    fn on_transfer_failed(&self, call_id: u64, kind: FrameKind, status: Status);

    /// Whether no call is in progress, so that a silent peer may be closed as idle.
    fn idle(&self) -> bool;

    /// The connection ended for `status`'s reason; nothing more comes.
    fn on_closed(&self, status: Status);

    /// Memory large bodies of requests may land in ([`crate::ServerBuilder::land_requests_in`]);
    /// none by default.
    fn landings(&self) -> &[crate::Landing] {
        &[]
    }

    /// Memory the large request bodies of one method each may land in, by method id,
    /// tried before [`Inbound::landings`]
    /// ([`crate::ServerBuilder::land_method_requests_in`]); none by default.
    fn method_landings(&self) -> &[(u32, crate::Landing)] {
        &[]
    }
}
