//! Bodies read by RDMA READ: the writer offers its body where it lies, and the receiver
//! pulls it, so a large request moves without the rendezvous's round trip.
//!
//! ```text
//! writer (has the body)                          receiver
//!   bind a window over the body (REMOTE_READ)
//!   LargeSource {call, addr, rkey, len}   ───▶  lease a buffer ≥ len
//!   Request {LARGE_PAYLOAD}               ───▶  READ chunk 0 .. chunk n from the source
//!                                    ◀───────  LargeSourceDone {call}   (all READs done)
//!   invalidate the window, free the body         hand the body up once its notice is in
//! ```
//!
//! The notice goes right behind the offer, so the receiver knows the call before the body
//! is in. Every `LargeSource` gets exactly one `LargeSourceDone`: read (OK), refused
//! (`RESOURCE_EXHAUSTED` with the receiver's limit, as a refused grant), or cancelled (the
//! writer's `Cancel` came first). The writer keeps its window, and the body under it,
//! until that answer: it never revokes on its own `Cancel`, because the receiver may be
//! reading at that moment. A refused body's notice, which is already on its way, is
//! dropped by the receiver on arrival (the response buffer it may advertise with it
//! included), and the writer fails the call.
//!
//! The receiver's buffer has no window: nothing but its own READs writes there, and it is
//! handed up, or reused, only when the last of them completed.

use std::collections::VecDeque;

use rpc_wire::{Code, FrameKind, Header, RemoteBuffer};

use super::{BodyId, Large, LocalBuffer, Transfer, TransferState};
use crate::action::{Action, ReadWork};
use crate::error::{ProtocolViolation, SendError};

/// A transfer offered for reading.
/// How [`crate::Connection::start_source`] sends a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStart {
    /// Offered for the peer to READ through the window: the transfer.
    Offered(u32),
    /// By the rendezvous, as [`crate::Connection::start_large`] sends it, because
    /// `max_grants` windows are open to the peer already: the transfer. The window is
    /// not used.
    Written(u32),
}

impl BodyStart {
    /// The transfer, which the driver's actions name from now on.
    pub fn transfer(self) -> u32 {
        match self {
            BodyStart::Offered(id) | BodyStart::Written(id) => id,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Sourced {
    /// The rkey of the window over the body.
    rkey: u32,
    /// The peer's answer, once it came: the window is being invalidated.
    answer: Option<(Code, u64)>,
    /// The call was cancelled: no failure is reported.
    aborted: bool,
}

impl TransferState {
    /// The window over an offered body is being invalidated.
    pub(super) fn unsourcing(&self) -> bool {
        matches!(
            self,
            TransferState::Sourced(Sourced {
                answer: Some(_),
                ..
            })
        )
    }
}

/// A body being read into a grant's buffer.
#[derive(Debug)]
pub(crate) struct Read {
    body: BodyId,
    remote: RemoteBuffer,
    local: LocalBuffer,
    /// Bytes from here on are still to be read.
    next: u64,
    in_flight: u32,
    /// The body's notice, once it came.
    notice: Option<Header>,
    /// The call was cancelled: no more chunks are posted.
    cancelled: bool,
}

impl Read {
    pub(super) fn in_flight(&self) -> bool {
        self.in_flight > 0
    }

    fn read_all(&self) -> bool {
        self.next == self.remote.len && self.in_flight == 0
    }
}

impl Large {
    // ---- the side that offers (writer) ----

    /// Starts sending the request body announced by `notice` from `local` by offering it
    /// for the peer to READ through a window the driver binds with `rkey`
    /// ([`Action::BindSource`] follows): queues the `LargeSource` and the notice. By the
    /// rendezvous instead when `max_grants` windows are open already.
    pub(crate) fn start_source(
        &mut self,
        notice: Header,
        local: LocalBuffer,
        rkey: u32,
        out: &mut VecDeque<Action>,
    ) -> Result<BodyStart, SendError> {
        if notice.kind != FrameKind::Request {
            return Err(SendError::ReservedKind(notice.kind));
        }
        if self.open_grants() >= self.config.max_grants as usize {
            return self.start(notice, local).map(BodyStart::Written);
        }
        let (notice, total) = self.check_start(&notice)?;
        let body = BodyId::of(&notice);
        let id = self.next_transfer_id();
        self.abandoned.remove(&body);
        out.push_back(Action::BindSource {
            transfer: id,
            len: total,
        });
        let mut offer = body.frame(FrameKind::LargeSource);
        offer.remote = RemoteBuffer {
            addr: local.addr,
            rkey,
            generation: id,
            len: total,
        };
        self.frames.push_back(offer);
        self.frames.push_back(notice);
        self.counters.sourced += 1;
        self.transfers.insert(
            id,
            Transfer {
                body,
                notice,
                local,
                total,
                in_flight: 0,
                state: TransferState::Sourced(Sourced {
                    rkey,
                    answer: None,
                    aborted: false,
                }),
            },
        );
        self.transfer_by_body.insert(body, id);
        self.offered += 1;
        Ok(BodyStart::Offered(id))
    }

    /// The peer is done with a body we offered.
    pub(crate) fn on_source_done(
        &mut self,
        done: &Header,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let body = BodyId::of(done);
        let unexpected = ProtocolViolation::UnexpectedSourceDone { body };
        let Some(&id) = self.transfer_by_body.get(&body) else {
            return Err(unexpected);
        };
        let Some(t) = self.transfers.get_mut(&id) else {
            return Err(unexpected);
        };
        let TransferState::Sourced(sourced) = &mut t.state else {
            return Err(unexpected);
        };
        if sourced.answer.is_some() {
            return Err(unexpected);
        }
        sourced.answer = Some((done.status, done.remote.len));
        let rkey = sourced.rkey;
        self.transfer_by_body.remove(&body);
        if done.status != Code::Ok {
            // The peer drops the notice, and with it the response buffer it advertised.
            self.end_advertisement(body.call_id, out);
        }
        out.push_back(Action::InvalidateSource { transfer: id, rkey });
        Ok(())
    }

    /// The window over transfer `id`'s body is invalidated: the body may go, and a refusal
    /// fails the call.
    pub(crate) fn on_source_invalidated(
        &mut self,
        id: u32,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let unexpected = ProtocolViolation::UnexpectedLargeCompletion {
            what: "source invalidation",
            id,
        };
        let Some(t) = self.transfers.get(&id) else {
            return Err(unexpected);
        };
        let TransferState::Sourced(Sourced {
            answer: Some((status, limit)),
            aborted,
            ..
        }) = t.state
        else {
            return Err(unexpected);
        };
        let (body, kind, len) = (t.body, t.notice.kind, t.total);
        self.transfers.remove(&id);
        self.offered = self.offered.saturating_sub(1);
        if self.transfer_by_body.get(&body) == Some(&id) {
            self.transfer_by_body.remove(&body);
        }
        out.push_back(if status == Code::Ok || aborted {
            Action::TransferDone { transfer: id }
        } else {
            Action::TransferFailed {
                transfer: id,
                call_id: body.call_id,
                kind,
                status,
                len,
                limit,
            }
        });
        Ok(())
    }

    /// The call of offered transfer `id` is cancelled (its `Cancel` is being committed).
    /// Frames not yet committed stay home; once the offer went, its answer is awaited.
    pub(super) fn abort_source(&mut self, body: BodyId, id: u32, out: &mut VecDeque<Action>) {
        let queued = |h: &Header, kind| h.kind == kind && BodyId::of(h) == body;
        let offer_queued = self
            .frames
            .iter()
            .any(|h| queued(h, FrameKind::LargeSource));
        let notice_at = self.frames.iter().position(|h| {
            h.flags.contains(rpc_wire::Flags::LARGE_PAYLOAD) && BodyId::of(h) == body
        });
        if let Some(at) = notice_at {
            self.frames.remove(at);
            // The peer never hears of the response buffer the notice advertised.
            self.end_advertisement(body.call_id, out);
        }
        let Some(t) = self.transfers.get_mut(&id) else {
            return;
        };
        let TransferState::Sourced(sourced) = &mut t.state else {
            return;
        };
        sourced.aborted = true;
        if offer_queued {
            self.frames.retain(|h| !queued(h, FrameKind::LargeSource));
            // The peer never saw the window: it goes now.
            if sourced.answer.is_none() {
                sourced.answer = Some((Code::Cancelled, 0));
                let rkey = sourced.rkey;
                self.transfer_by_body.remove(&body);
                out.push_back(Action::InvalidateSource { transfer: id, rkey });
            }
        }
    }

    // ---- the side that reads (receiver) ----

    /// The peer offers a body for reading.
    pub(crate) fn on_source(
        &mut self,
        offer: &Header,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let body = BodyId::of(offer);
        if body.seq != 0 {
            return Err(ProtocolViolation::OfferedStreamMessage { body });
        }
        if self.knows(body) {
            return Err(ProtocolViolation::DuplicateBufferRequest { body });
        }
        // A notice comes right behind its offer, so by the next offer it is in: a peer that
        // leaves more than a queue's worth out (at least one) is not following the protocol.
        let missing = (self.config.max_queued as usize).max(1);
        if self.refused.len() >= missing {
            return Err(ProtocolViolation::NoticesMissing {
                refused: self.refused.len(),
            });
        }
        if self.read_after_notice && self.unannounced >= missing {
            return Err(ProtocolViolation::OffersUnannounced {
                offers: self.unannounced,
            });
        }
        super::check_range(body.call_id, &offer.remote)?;
        self.incoming.insert(body, (offer.remote, None));
        self.unannounced += 1;
        if !self.read_after_notice {
            self.queue_buffer_request(body, offer.remote.len, out);
        }
        // Else asked of the driver once the notice came (`on_read_notice`).
        Ok(())
    }

    /// Forgets the offer of `body`: its notice, if it came.
    fn remove_incoming(&mut self, body: BodyId) -> Option<Header> {
        let (_, notice) = self.incoming.remove(&body)?;
        if notice.is_none() {
            self.unannounced -= 1;
        }
        notice
    }

    /// Offered bodies are read once their notice came.
    pub(crate) fn read_after_notice(&mut self) {
        self.read_after_notice = true;
    }

    /// The notice of `body`, offered for reading, once it came and while its buffer is
    /// still to be lent: what the driver may choose the buffer by.
    pub(crate) fn offered_notice(&self, body: BodyId) -> Option<&Header> {
        self.incoming.get(&body)?.1.as_ref()
    }

    /// Whether `body` has a buffer request, offer, grant or read under way, or a refused
    /// offer whose notice is still to come.
    pub(super) fn knows(&self, body: BodyId) -> bool {
        self.asked.contains(&body)
            || self.grant_by_body.contains_key(&body)
            || self.waiting_len.contains_key(&body)
            || self.incoming.contains_key(&body)
            || self.refused.contains(&body)
    }

    /// Answers [`Action::ReadNeeded`]: the driver lent `len` bytes at `local`; the READs
    /// follow as the write window allows. Returns the grant id, or `None` if the offer is
    /// gone (its call was cancelled meanwhile) or `len` is short of it (refused, naming
    /// `len`): the driver takes its buffer back.
    pub(crate) fn read_into(
        &mut self,
        body: BodyId,
        local: LocalBuffer,
        len: u64,
        out: &mut VecDeque<Action>,
    ) -> Option<u32> {
        if !self.asked.contains(&body) {
            return None;
        }
        let (remote, notice) = *self.incoming.get(&body)?;
        if len < remote.len {
            // Too small a buffer: refused, with what could be had.
            self.refuse(body, Code::ResourceExhausted, len, out);
            return None;
        }
        self.asked.remove(&body);
        self.remove_incoming(body);
        let id = self.fresh_grant_id();
        self.reads.insert(
            id,
            Read {
                body,
                remote,
                local,
                next: 0,
                in_flight: 0,
                notice,
                cancelled: false,
            },
        );
        self.grant_by_body.insert(body, id);
        self.reading.push_back(id);
        Some(id)
    }

    /// Posts READ chunks while the write window allows, round robin over the bodies.
    pub(crate) fn pump_reads(&mut self, out: &mut VecDeque<Action>) {
        while self.one_sided_in_flight < self.config.write_window {
            let Some(id) = self.reading.pop_front() else {
                return;
            };
            let Some(r) = self.reads.get_mut(&id) else {
                continue;
            };
            if r.cancelled || r.next == r.remote.len {
                continue;
            }
            let len = (r.remote.len - r.next).min(u64::from(self.config.chunk_size));
            out.push_back(Action::PostRead(ReadWork {
                grant: id,
                local_addr: r.local.addr + r.next,
                lkey: r.local.lkey,
                len: len as u32,
                remote_addr: r.remote.addr + r.next,
                rkey: r.remote.rkey,
            }));
            r.next += len;
            r.in_flight += 1;
            self.one_sided_in_flight += 1;
            if r.next < r.remote.len {
                self.reading.push_back(id);
            }
        }
    }

    /// A READ into grant `id` completed.
    pub(crate) fn on_read_complete(
        &mut self,
        id: u32,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let Some(r) = self.reads.get_mut(&id).filter(|r| r.in_flight > 0) else {
            return Err(ProtocolViolation::UnexpectedLargeCompletion { what: "read", id });
        };
        r.in_flight -= 1;
        self.one_sided_in_flight -= 1;
        if r.cancelled {
            if r.in_flight == 0 {
                let body = r.body;
                self.reads.remove(&id);
                self.push_source_done(body, Code::Cancelled, 0);
                out.push_back(Action::ReleaseGrant { grant: id });
                self.admit_waiting(out);
            }
        } else if r.read_all() {
            let body = r.body;
            self.counters.read += 1;
            self.push_source_done(body, Code::Ok, 0);
            self.deliver_read(id, out);
        }
        Ok(())
    }

    /// Whether the body read into grant `id` is all in and its notice has not come.
    pub(crate) fn read_awaits_notice(&self, id: u32) -> bool {
        self.reads
            .get(&id)
            .is_some_and(|r| r.read_all() && r.notice.is_none())
    }

    /// Hands up the body read into grant `id` if its notice came.
    fn deliver_read(&mut self, id: u32, out: &mut VecDeque<Action>) {
        let Some(r) = self.reads.get(&id) else {
            return;
        };
        let Some(header) = r.notice.filter(|_| r.read_all()) else {
            return;
        };
        self.grant_by_body.remove(&r.body);
        self.reads.remove(&id);
        out.push_back(Action::DeliverLarge { grant: id, header });
        self.admit_waiting(out);
    }

    /// The notice of a body offered for reading: `Ok(false)` if there is none (the caller
    /// checks grants), `Ok(true)` once taken (kept until the body is read, or dropped: its
    /// offer was refused).
    pub(super) fn on_read_notice(
        &mut self,
        notice: &Header,
        out: &mut VecDeque<Action>,
    ) -> Result<bool, ProtocolViolation> {
        let body = BodyId::of(notice);
        let len = notice.message_len();
        let beyond = |granted| ProtocolViolation::PlacedBeyondGrant { body, len, granted };
        let twice = ProtocolViolation::PlacedWithoutGrant { body };
        if let Some((remote, held)) = self.incoming.get_mut(&body) {
            if len > remote.len {
                return Err(beyond(remote.len));
            }
            if held.replace(*notice).is_some() {
                return Err(twice);
            }
            let offered = remote.len;
            self.unannounced -= 1;
            // Unless it was asked for or queued on its arrival (before `read_after_notice`).
            let queued = self.asked.contains(&body) || self.waiting_len.contains_key(&body);
            if self.read_after_notice && !queued {
                self.queue_buffer_request(body, offered, out);
            }
            return Ok(true);
        }
        let Some(&id) = self.grant_by_body.get(&body) else {
            return Ok(false);
        };
        let Some(r) = self.reads.get_mut(&id) else {
            return Ok(false);
        };
        if len > r.remote.len {
            return Err(beyond(r.remote.len));
        }
        if r.notice.replace(*notice).is_some() {
            return Err(twice);
        }
        self.deliver_read(id, out);
        Ok(true)
    }

    /// The peer cancelled the call of a body being read into grant `id`: no more chunks;
    /// the buffer goes back once no READ is outstanding.
    pub(super) fn cancel_read(&mut self, id: u32, out: &mut VecDeque<Action>) {
        let Some(r) = self.reads.get_mut(&id) else {
            return;
        };
        r.cancelled = true;
        if r.in_flight > 0 {
            return;
        }
        let (body, answered) = (r.body, r.read_all());
        self.reads.remove(&id);
        if !answered {
            self.push_source_done(body, Code::Cancelled, 0);
        }
        out.push_back(Action::ReleaseGrant { grant: id });
    }

    /// Answers an offer.
    pub(super) fn push_source_done(&mut self, body: BodyId, status: Code, limit: u64) {
        let mut frame = body.frame(FrameKind::LargeSourceDone);
        frame.status = status;
        frame.remote.len = limit;
        self.frames.push_back(frame);
    }

    /// Refuses the offer of `body` (queued or asked of the driver, or just arrived): its
    /// notice, if still to come, is dropped on arrival.
    pub(super) fn refuse_source(&mut self, body: BodyId, status: Code, limit: u64) {
        let notice = self.remove_incoming(body);
        match notice {
            // The writer withdraws the response buffer its notice advertised.
            Some(notice) if notice.flags.contains(rpc_wire::Flags::RESPONSE_BUFFER) => {
                self.take_offer(body.call_id);
            }
            Some(_) => {}
            None if status != Code::Cancelled => {
                self.refused.insert(body);
            }
            None => {}
        }
        self.push_source_done(body, status, limit);
    }

    /// Whether `notice` announces a body whose offer was refused (it is dropped, and
    /// forgotten).
    pub(crate) fn take_refused(&mut self, notice: &Header) -> bool {
        !self.refused.is_empty() && self.refused.remove(&BodyId::of(notice))
    }

    /// A READ into grant `id` was flushed (the peer disconnected): the body will not be
    /// complete; its buffer goes back once no READ is outstanding.
    pub(crate) fn on_read_flushed(&mut self, id: u32, out: &mut VecDeque<Action>) {
        let Some(r) = self.reads.get_mut(&id).filter(|r| r.in_flight > 0) else {
            return;
        };
        r.in_flight -= 1;
        self.one_sided_in_flight -= 1;
        r.cancelled = true;
        if r.in_flight == 0 {
            let body = r.body;
            self.reads.remove(&id);
            if self.grant_by_body.get(&body) == Some(&id) {
                self.grant_by_body.remove(&body);
            }
            out.push_back(Action::ReleaseGrant { grant: id });
        }
    }

    /// The peer cancelled `call_id`: the notices of its refused offers will not come.
    pub(super) fn forget_refused(&mut self, call_id: u64) {
        let refused: Vec<BodyId> = self
            .refused
            .range(BodyId::of_call(call_id))
            .copied()
            .collect();
        for body in refused {
            self.refused.remove(&body);
        }
    }
}
