//! Response buffers advertised with a request, so that a large response needs no
//! rendezvous.
//!
//! ```text
//! client                                        server
//!   bind a window over a pool buffer
//!   Request {RESPONSE_BUFFER, addr, rkey, len} ──▶  remembers the offer
//!                                   ◀──────────  WRITE chunks into it, then
//!                                                Response {LARGE_PAYLOAD}   (fits)
//!                                   ◀──────────  LargeRequest               (too large)
//!                                   ◀──────────  Response in a slot         (small)
//!                                   ◀──────────  Cancel                     (call cancelled
//!                                                                            before an answer)
//! ```
//!
//! Each of the four answers ends the offer: the client revokes the window (after the body
//! arrived, in the first case). The client does not revoke on its own `Cancel`, because
//! the server may be writing its response at that moment; the server's answer comes
//! anyway, and a server that had not answered yet releases the offer with a `Cancel`.

use std::collections::VecDeque;

use rpc_wire::{FrameKind, Header, RemoteBuffer};

use super::{BodyId, GrantState, Large};
use crate::action::Action;
use crate::error::{ProtocolViolation, SendError};

impl Large {
    // ---- the side that advertises (client) ----

    /// Makes `len` bytes at `addr` writable for the response to `call_id` through a window
    /// the driver binds with `rkey` ([`Action::BindWindow`] follows), at most the largest
    /// body this side takes (`max_message`). Returns the descriptor (its length is what the
    /// window must cover) to put in the request, or `None` when the grant limit is reached or the call already
    /// has a buffer (the response then takes the rendezvous if it is large).
    pub(crate) fn advertise(
        &mut self,
        call_id: u64,
        addr: u64,
        rkey: u32,
        len: u64,
        out: &mut VecDeque<Action>,
    ) -> Option<RemoteBuffer> {
        if len == 0 || self.open_grants() >= self.config.max_grants as usize {
            return None;
        }
        // No larger than a response this side takes: the peer may write what it is offered.
        let len = len.min(self.config.max_message);
        let body = BodyId { call_id, seq: 0 };
        if self.grant_by_body.contains_key(&body) {
            return None;
        }
        let id = self.open_grant(body, rkey, len, true, out);
        self.counters.advertised += 1;
        Some(RemoteBuffer {
            addr,
            rkey,
            generation: id,
            len,
        })
    }

    /// Checks that a request about to be sent advertises exactly the buffer
    /// [`Large::advertise`] made for its call.
    pub(crate) fn check_advertised(&self, request: &Header) -> Result<(), SendError> {
        let call_id = request.call_id;
        let matches = self
            .grant_by_body
            .get(&BodyId { call_id, seq: 0 })
            .and_then(|id| Some((*id, self.grants.get(id)?)))
            .is_some_and(|(id, grant)| {
                grant.advertised
                    && matches!(grant.state, GrantState::Open)
                    && request.remote.generation == id
                    && request.remote.rkey == grant.rkey
                    && request.remote.len == grant.len
            });
        if matches {
            Ok(())
        } else {
            Err(SendError::NotAdvertised { call_id })
        }
    }

    /// The request advertising a buffer for `call_id` will not be sent after all (or its
    /// answer came): the buffer is revoked.
    pub(crate) fn end_advertisement(&mut self, call_id: u64, out: &mut VecDeque<Action>) {
        let body = BodyId { call_id, seq: 0 };
        let advertised = self
            .grant_by_body
            .get(&body)
            .and_then(|id| self.grants.get(id))
            .is_some_and(|g| g.advertised);
        if advertised {
            self.revoke(body, out);
        }
    }

    // ---- the side that answers (server) ----

    /// A request arrived advertising a buffer for its response.
    pub(crate) fn on_offer(&mut self, request: &Header) -> Result<(), ProtocolViolation> {
        let call_id = request.call_id;
        if self.offers.contains_key(&call_id) {
            return Err(ProtocolViolation::DuplicateResponseBuffer { call_id });
        }
        super::check_range(call_id, &request.remote)?;
        self.offers.insert(call_id, request.remote);
        Ok(())
    }

    /// A response for `call_id` went into a slot: the peer revokes its offer on receipt.
    pub(crate) fn on_answered(&mut self, call_id: u64) {
        self.take_offer(call_id);
    }

    /// The buffer the peer advertised for `call_id`'s response, no longer offered. Costs
    /// nothing (no hash) while no call has advertised one, as with small responses.
    pub(super) fn take_offer(&mut self, call_id: u64) -> Option<RemoteBuffer> {
        if self.offers.is_empty() {
            return None;
        }
        self.offers.remove(&call_id)
    }

    /// The peer cancelled `call_id` before we answered: a `Cancel` back tells it that we
    /// will never write into the buffer it advertised.
    pub(super) fn release_offer(&mut self, call_id: u64) {
        if self.take_offer(call_id).is_some() {
            self.frames
                .push_back(Header::new(FrameKind::Cancel, call_id));
        }
    }
}
