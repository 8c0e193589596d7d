//! The writer's side of the rendezvous: a transfer asks for a buffer, WRITEs its body in
//! chunks under the write window once granted, sends its notice last, and is taken back on
//! `Cancel`.

use std::collections::VecDeque;

use rpc_wire::{Code, Flags, FrameKind, Header};

use super::{check_range, BodyId, Large, LocalBuffer, Transfer, TransferState};
use crate::action::{Action, WriteWork};
use crate::error::{ProtocolViolation, SendError};

impl Large {
    /// Starts sending the body announced by `notice` (a request, response or stream
    /// message whose lengths describe the body) from `local`: queues the buffer request.
    pub(crate) fn start(&mut self, notice: Header, local: LocalBuffer) -> Result<u32, SendError> {
        let (notice, total) = self.check_start(&notice)?;
        let body = BodyId::of(&notice);
        let call_id = body.call_id;
        let id = self.next_transfer_id();
        self.abandoned.remove(&body);
        // A response goes straight into the buffer its request advertised when it fits;
        // otherwise the rendezvous below also tells the peer to take its buffer back.
        let offer = match notice.kind {
            FrameKind::Response => self.take_offer(call_id),
            _ => None,
        };
        let state = match offer {
            Some(remote) if remote.len >= total => {
                self.counters.into_advertised += 1;
                self.writing.push_back(id);
                TransferState::Writing { remote, next: 0 }
            }
            _ => {
                self.counters.rendezvous += 1;
                let mut ask = body.frame(FrameKind::LargeRequest);
                ask.remote.len = total;
                self.frames.push_back(ask);
                TransferState::AwaitingGrant
            }
        };
        self.transfers.insert(
            id,
            Transfer {
                body,
                notice,
                local,
                total,
                in_flight: 0,
                state,
            },
        );
        self.transfer_by_body.insert(body, id);
        Ok(id)
    }

    /// The notice (with `LARGE_PAYLOAD`) of a body that may start a transfer, and the
    /// body's length.
    pub(super) fn check_start(&self, notice: &Header) -> Result<(Header, u64), SendError> {
        let body = BodyId::of(notice);
        if !matches!(
            notice.kind,
            FrameKind::Request | FrameKind::Response | FrameKind::Message
        ) {
            return Err(SendError::ReservedKind(notice.kind));
        }
        let total = notice.message_len();
        if total == 0 {
            return Err(SendError::NotLarge { len: total });
        }
        if self.transfer_by_body.contains_key(&body) {
            return Err(SendError::DuplicateTransfer { body });
        }
        let notice = Header {
            flags: notice.flags.with(Flags::LARGE_PAYLOAD),
            credits: 0,
            ..*notice
        };
        notice.validate().map_err(SendError::InvalidHeader)?;
        Ok((notice, total))
    }

    /// The peer answered our buffer request.
    pub(crate) fn on_grant(
        &mut self,
        grant: &Header,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let body = BodyId::of(grant);
        if self.abandoned.remove(&body) {
            return Ok(());
        }
        let transfer = self
            .transfer_by_body
            .get(&body)
            .and_then(|id| Some((*id, self.transfers.get_mut(id)?)));
        let Some((id, transfer)) = transfer else {
            return Err(ProtocolViolation::UnexpectedGrant { body });
        };
        if !matches!(transfer.state, TransferState::AwaitingGrant) {
            return Err(ProtocolViolation::UnexpectedGrant { body });
        }
        if grant.status != Code::Ok {
            let kind = transfer.notice.kind;
            let transfer_len = transfer.total;
            self.transfers.remove(&id);
            self.transfer_by_body.remove(&body);
            self.request_unsent(kind, body.call_id, out);
            out.push_back(Action::TransferFailed {
                transfer: id,
                call_id: body.call_id,
                kind,
                status: grant.status,
                len: transfer_len,
                limit: grant.remote.len,
            });
            return Ok(());
        }
        check_range(body.call_id, &grant.remote)?;
        if grant.remote.len < transfer.total {
            return Err(ProtocolViolation::GrantTooSmall {
                body,
                granted: grant.remote.len,
                needed: transfer.total,
            });
        }
        transfer.state = TransferState::Writing {
            remote: grant.remote,
            next: 0,
        };
        self.writing.push_back(id);
        Ok(())
    }

    /// Posts chunks while the write window allows, round robin over transfers; queues a
    /// transfer's notification right behind its last chunk.
    pub(crate) fn pump_writes(&mut self, out: &mut VecDeque<Action>) {
        while self.one_sided_in_flight < self.config.write_window {
            let Some(id) = self.writing.pop_front() else {
                return;
            };
            let Some(t) = self.transfers.get_mut(&id) else {
                continue;
            };
            let TransferState::Writing { remote, next } = &mut t.state else {
                continue;
            };
            let len = (t.total - *next).min(u64::from(self.config.chunk_size));
            out.push_back(Action::PostWrite(WriteWork {
                transfer: id,
                local_addr: t.local.addr + *next,
                lkey: t.local.lkey,
                len: len as u32,
                remote_addr: remote.addr + *next,
                rkey: remote.rkey,
            }));
            *next += len;
            t.in_flight += 1;
            self.one_sided_in_flight += 1;
            if *next == t.total {
                t.state = TransferState::Written;
                self.frames.push_back(t.notice);
            } else {
                self.writing.push_back(id);
            }
        }
    }

    /// A WRITE of `id` completed.
    pub(crate) fn on_write_complete(
        &mut self,
        id: u32,
        out: &mut VecDeque<Action>,
    ) -> Result<(), ProtocolViolation> {
        let unexpected = ProtocolViolation::UnexpectedLargeCompletion { what: "write", id };
        let Some(t) = self.transfers.get_mut(&id) else {
            return Err(unexpected);
        };
        if t.in_flight == 0 {
            return Err(unexpected);
        }
        t.in_flight -= 1;
        self.one_sided_in_flight -= 1;
        let finished = matches!(t.state, TransferState::Written | TransferState::Aborted);
        if finished && t.in_flight == 0 {
            let body = t.body;
            self.transfers.remove(&id);
            if self.transfer_by_body.get(&body) == Some(&id) {
                self.transfer_by_body.remove(&body);
            }
            out.push_back(Action::TransferDone { transfer: id });
        }
        Ok(())
    }

    /// The upper layer cancelled `call_id` (its Cancel frame is being committed): stop
    /// writing its bodies. Chunks already posted precede the Cancel on the wire.
    pub(crate) fn abort(&mut self, call_id: u64, out: &mut VecDeque<Action>) {
        let bodies: Vec<(BodyId, u32)> = self
            .transfer_by_body
            .range(BodyId::of_call(call_id))
            .map(|(&body, &id)| (body, id))
            .collect();
        for (body, id) in bodies {
            self.abort_transfer(body, id, out);
        }
    }

    fn abort_transfer(&mut self, body: BodyId, id: u32, out: &mut VecDeque<Action>) {
        let Some(t) = self.transfers.get_mut(&id) else {
            return;
        };
        if matches!(
            t.state,
            TransferState::AwaitingGrant | TransferState::Writing { .. }
        ) {
            // Its notice will not go: neither will the response buffer it advertised.
            let kind = t.notice.kind;
            self.request_unsent(kind, body.call_id, out);
        }
        let Some(t) = self.transfers.get_mut(&id) else {
            return;
        };
        match t.state {
            TransferState::AwaitingGrant => {
                let queued = self
                    .frames
                    .iter()
                    .position(|h| h.kind == FrameKind::LargeRequest && BodyId::of(h) == body);
                match queued {
                    Some(at) => {
                        self.frames.remove(at);
                    }
                    None => {
                        self.abandoned.insert(body);
                    }
                }
                self.transfers.remove(&id);
                self.transfer_by_body.remove(&body);
                out.push_back(Action::TransferDone { transfer: id });
            }
            TransferState::Writing { .. } => {
                self.writing.retain(|&w| w != id);
                if t.in_flight == 0 {
                    self.transfers.remove(&id);
                    self.transfer_by_body.remove(&body);
                    out.push_back(Action::TransferDone { transfer: id });
                } else {
                    t.state = TransferState::Aborted;
                }
            }
            // The notification is on its way; the receiver revokes on the Cancel after it.
            TransferState::Written | TransferState::Aborted => {}
            TransferState::Sourced(_) => self.abort_source(body, id, out),
        }
    }

    /// A request body's transfer ended before its notice went: the peer never heard of the
    /// response buffer the notice advertised, and will never answer it, so it is revoked
    /// here.
    fn request_unsent(&mut self, kind: FrameKind, call_id: u64, out: &mut VecDeque<Action>) {
        if kind == FrameKind::Request {
            self.end_advertisement(call_id, out);
        }
    }
}
