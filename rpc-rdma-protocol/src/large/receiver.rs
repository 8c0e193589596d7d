//! The receiving role of the large-body path: buffer requests from the peer, the grants
//! that answer them, placed bodies, and revocation.

use std::collections::VecDeque;

use rpc_wire::{Code, FrameKind, Header, RemoteBuffer};

use super::{BodyId, Grant, GrantState, Large};
use crate::action::Action;
use crate::error::ProtocolViolation;

impl Large {
    /// The peer asks for a buffer.
    pub(crate) fn on_buffer_request(
        &mut self,
        ask: &Header,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let body = BodyId::of(ask);
        if body.seq == 0 {
            // The response outgrew the buffer we advertised for it: the peer will not write
            // there, so the buffer is revoked and the request handled like any other.
            self.end_advertisement(body.call_id, out);
        }
        if self.knows(body) {
            return Err(ProtocolViolation::DuplicateBufferRequest { body });
        }
        self.queue_buffer_request(body, ask.remote.len, out);
        Ok(())
    }

    /// Queues the peer's request for a buffer of `len` bytes for `body` (to write into,
    /// or to read an offered body into), or refuses it at once: too large, or too many
    /// waiting.
    pub(super) fn queue_buffer_request(
        &mut self,
        body: BodyId,
        len: u64,
        out: &mut VecDeque<Action>,
    ) {
        if len > self.config.max_message {
            self.push_refusal(body, Code::ResourceExhausted, self.config.max_message);
            return;
        }
        let busy = self.open_grants() >= self.config.max_grants as usize;
        if busy && self.waiting.len() >= self.config.max_queued as usize {
            self.counters.queue_refusals += 1;
            self.push_refusal(body, Code::ResourceExhausted, 0);
            return;
        }
        self.waiting.push_back(body);
        self.waiting_len.insert(body, len);
        self.admit_waiting(out);
    }

    pub(super) fn admit_waiting(&mut self, out: &mut VecDeque<Action>) {
        while self.open_grants() < self.config.max_grants as usize {
            let Some(body) = self.waiting.pop_front() else {
                return;
            };
            let len = self
                .waiting_len
                .remove(&body)
                .expect("queued bodies have a length");
            self.asked.insert(body);
            out.push_back(if self.incoming.contains_key(&body) {
                Action::ReadNeeded { body, len }
            } else {
                Action::GrantNeeded { body, len }
            });
        }
    }

    /// The driver lent a buffer for `body` and will bind a window over it with `rkey`.
    /// Returns the grant id, or `None` if the request is gone (cancelled meanwhile): the
    /// driver takes its buffer back.
    pub(crate) fn grant(
        &mut self,
        body: BodyId,
        addr: u64,
        rkey: u32,
        len: u64,
        out: &mut VecDeque<Action>,
    ) -> Option<u32> {
        if !self.asked.remove(&body) {
            return None;
        }
        let id = self.open_grant(body, rkey, len, false, out);
        let mut frame = body.frame(FrameKind::LargeGrant);
        frame.remote = RemoteBuffer {
            addr,
            rkey,
            generation: id,
            len,
        };
        self.frames.push_back(frame);
        Some(id)
    }

    /// Opens a grant for `body` under a fresh id (never 0, so a descriptor's generation
    /// is never empty) and asks the driver to bind its window.
    pub(super) fn open_grant(
        &mut self,
        body: BodyId,
        rkey: u32,
        len: u64,
        advertised: bool,
        out: &mut VecDeque<Action>,
    ) -> u32 {
        let id = self.fresh_grant_id();
        self.grants.insert(
            id,
            Grant {
                rkey,
                len,
                state: GrantState::Open,
                advertised,
            },
        );
        self.grant_by_body.insert(body, id);
        out.push_back(Action::BindWindow { grant: id });
        id
    }

    /// A grant id in use by no grant or read, never 0 (so a descriptor's generation is
    /// never empty).
    pub(super) fn fresh_grant_id(&mut self) -> u32 {
        self.next_grant = self.next_grant.wrapping_add(1);
        while self.next_grant == 0
            || self.grants.contains_key(&self.next_grant)
            || self.reads.contains_key(&self.next_grant)
        {
            self.next_grant = self.next_grant.wrapping_add(1);
        }
        self.next_grant
    }

    /// The driver cannot lend a buffer for `body` (budget, registration failure);
    /// `limit` tells the writer the most it could have lent, 0 if unknown.
    pub(crate) fn refuse(
        &mut self,
        body: BodyId,
        status: Code,
        limit: u64,
        out: &mut VecDeque<Action>,
    ) {
        if self.asked.remove(&body) {
            self.push_refusal(body, status, limit);
            self.admit_waiting(out);
        }
    }

    /// A refusal is a grant (or, for a body offered for reading, a `LargeSourceDone`) with
    /// an error status and no buffer; its length carries the receiver's limit, so the
    /// writer's error can name both sizes.
    fn push_refusal(&mut self, body: BodyId, status: Code, limit: u64) {
        let status = if status == Code::Ok {
            Code::ResourceExhausted
        } else {
            status
        };
        if self.incoming.contains_key(&body) {
            return self.refuse_source(body, status, limit);
        }
        let mut frame = body.frame(FrameKind::LargeGrant);
        frame.status = status;
        frame.remote.len = limit;
        self.frames.push_back(frame);
    }

    /// A frame announces that its body was written into the grant of its body.
    pub(crate) fn on_placed(
        &mut self,
        notice: &Header,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        if self.on_read_notice(notice, out)? {
            return Ok(());
        }
        let body = BodyId::of(notice);
        let grant = self
            .grant_by_body
            .get(&body)
            .and_then(|id| Some((*id, self.grants.get_mut(id)?)));
        let Some((id, grant)) = grant else {
            return Err(ProtocolViolation::PlacedWithoutGrant { body });
        };
        let len = notice.message_len();
        if len > grant.len {
            return Err(ProtocolViolation::PlacedBeyondGrant {
                body,
                len,
                granted: grant.len,
            });
        }
        if grant.advertised {
            self.counters.advertised_filled += 1;
        }
        grant.state = GrantState::Arrived(*notice);
        self.grant_by_body.remove(&body);
        out.push_back(Action::Invalidate {
            grant: id,
            rkey: grant.rkey,
        });
        Ok(())
    }

    /// The peer cancelled `call_id`: it will not write for it any more. Buffer requests
    /// of the call not granted yet are answered with refusals, so that every request gets
    /// one answer, and its open grants are revoked.
    pub(crate) fn on_peer_cancel(&mut self, call_id: u64, out: &mut VecDeque<Action>) {
        self.release_offer(call_id);
        self.forget_refused(call_id);
        let waiting: Vec<BodyId> = self
            .waiting_len
            .range(BodyId::of_call(call_id))
            .map(|(&body, _)| body)
            .collect();
        if !waiting.is_empty() {
            // At most `max_queued` long.
            self.waiting.retain(|body| body.call_id != call_id);
        }
        let asked: Vec<BodyId> = self
            .asked
            .range(BodyId::of_call(call_id))
            .copied()
            .collect();
        // Offers still waiting for their notice (`Connection::read_after_notice`).
        let unannounced: Vec<BodyId> = self
            .incoming
            .range(BodyId::of_call(call_id))
            .map(|(&body, _)| body)
            .filter(|body| !self.waiting_len.contains_key(body) && !self.asked.contains(body))
            .collect();
        for body in waiting.iter().chain(&asked).chain(&unannounced) {
            self.waiting_len.remove(body);
            self.asked.remove(body);
            self.push_refusal(*body, Code::Cancelled, 0);
        }
        self.revoke_call(call_id, out);
        self.admit_waiting(out);
    }

    /// Ends every open grant of `call_id`: their rkeys are invalidated, then the buffers
    /// go back to the driver.
    fn revoke_call(&mut self, call_id: u64, out: &mut VecDeque<Action>) {
        let bodies: Vec<BodyId> = self
            .grant_by_body
            .range(BodyId::of_call(call_id))
            .map(|(&body, _)| body)
            .collect();
        for body in bodies {
            self.revoke(body, out);
        }
    }

    /// Ends the open grant of `body`, if any: its rkey is invalidated, then the buffer
    /// goes back to the driver.
    pub(super) fn revoke(&mut self, body: BodyId, out: &mut VecDeque<Action>) {
        let Some(id) = self.grant_by_body.remove(&body) else {
            return;
        };
        if self.reads.contains_key(&id) {
            return self.cancel_read(id, out);
        }
        if let Some(grant) = self.grants.get_mut(&id) {
            grant.state = GrantState::Revoking;
            out.push_back(Action::Invalidate {
                grant: id,
                rkey: grant.rkey,
            });
        }
    }

    /// The bind of grant `id`'s window completed.
    pub(crate) fn on_bind_complete(&mut self, id: u32) -> Result<(), ProtocolViolation> {
        if self.grants.contains_key(&id) {
            Ok(())
        } else {
            Err(ProtocolViolation::UnexpectedLargeCompletion { what: "bind", id })
        }
    }

    /// The invalidation of grant `id`'s rkey completed: hand the body up, or the buffer back.
    pub(crate) fn on_invalidated(
        &mut self,
        id: u32,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let state = self.grants.get(&id).map(|g| g.state);
        match state {
            Some(GrantState::Arrived(header)) => {
                self.grants.remove(&id);
                out.push_back(Action::DeliverLarge { grant: id, header });
            }
            Some(GrantState::Revoking) => {
                self.grants.remove(&id);
                out.push_back(Action::ReleaseGrant { grant: id });
            }
            Some(GrantState::Open) | None => {
                return Err(ProtocolViolation::UnexpectedLargeCompletion {
                    what: "invalidate",
                    id,
                })
            }
        }
        self.admit_waiting(out);
        Ok(())
    }
}
