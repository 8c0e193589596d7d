//! One connection of a channel: the transport and the table its calls complete in.

use std::sync::Arc;
use std::time::Instant;

use super::call::PendingCall;
use super::ClientTransport;
use crate::call_table::CallTable;
use crate::header::{FrameKind, Header};
use crate::MetadataMap;
use crate::Status;

/// A connected transport and the [`CallTable`] it completes calls in.
///
/// A [`super::Channel`] calls over one connection at a time; a healing channel replaces a
/// dead one ([`super::Connector`]). Calls hold the connection they were made on, so the
/// transport closes when the channel and the last of those calls are done with it.
pub struct Connection {
    pub(crate) calls: Arc<CallTable>,
    pub(crate) transport: Arc<dyn ClientTransport>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.transport.peer())
            .field("in_flight", &self.calls.in_flight())
            .finish()
    }
}

impl Connection {
    /// Wraps a connected transport that completes calls in `calls`.
    pub fn new(calls: Arc<CallTable>, transport: Arc<dyn ClientTransport>) -> Connection {
        Connection { calls, transport }
    }

    /// Where the connection goes.
    pub fn peer(&self) -> &str {
        self.transport.peer()
    }

    /// The connection died (or was closed): it takes no more calls.
    pub fn is_closed(&self) -> bool {
        self.calls.is_closed()
    }

    /// Registers a call of `method_id` with `metadata`, ending at `deadline`, and returns it
    /// with the header of its request frame. The header carries what is left of the time
    /// budget, so time spent waiting for a connection counts against it.
    pub(crate) fn register_call(
        self: &Arc<Self>,
        method_id: u32,
        metadata: &MetadataMap,
        deadline: Option<Instant>,
    ) -> Result<(PendingCall, Header), Status> {
        metadata.checked_encoded_len().map_err(Status::from)?;
        let timeout_us = match deadline {
            None => 0,
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Status::deadline_exceeded(
                        "deadline exceeded before the request was sent",
                    ));
                }
                left.as_micros().clamp(1, u64::MAX as u128) as u64
            }
        };
        let id = self.calls.register()?;
        let call = PendingCall::new(self.clone(), id, deadline);
        let mut header = Header::new(FrameKind::Request, id);
        header.method_id = method_id;
        header.timeout_us = timeout_us;
        Ok((call, header))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.transport.close();
    }
}
