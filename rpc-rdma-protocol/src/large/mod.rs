//! Large bodies: the rendezvous, RDMA WRITE chunking and peer-writable grants.
//!
//! A body (metadata plus message) too large for a ring slot travels by RDMA WRITE into a
//! buffer the *receiver* grants for that one call:
//!
//! ```text
//! writer                                      receiver
//!   LargeRequest {call, len}        ───────▶  GrantNeeded → driver leases a buffer,
//!                                             binds a fresh memory window over it
//!                                  ◀───────  LargeGrant {call, addr, rkey, len}
//!   WRITE chunk 0 .. chunk n        ───────▶  (no completion at the receiver)
//!   Request|Response + LARGE_PAYLOAD ──────▶  local invalidate of the rkey, then deliver
//! ```
//!
//! Every frame of the exchange is header-only and is generated here; they travel through
//! the send ring under the same credits as any frame. The notification follows the last
//! WRITE on the same queue pair, so RC ordering puts the data in place before the
//! receiver sees it. WRITEs are cut into chunks with a bounded number outstanding, so small
//! frames posted meanwhile wait for at most `write_window` chunks, not for the whole body.
//!
//! Each body has its own rendezvous, named by a [`BodyId`]: the call and, for a stream
//! message, its sequence number, which `LargeRequest` and `LargeGrant` carry in their
//! `method_id` field (0 for the body of a request or response). So the messages of one
//! stream pipeline their transfers, and a `Cancel` ends every transfer and grant of its
//! call.
//!
//! A grant ends, and its rkey is invalidated, exactly when the writer can no longer write
//! to it: the notification arrived (the body is complete), or the writer's `Cancel` for the
//! call arrived (a writer never writes after cancelling, and RC delivers its earlier WRITEs
//! first). Only after the invalidation completes is the body handed up or the buffer reused,
//! so a late or forged WRITE fails at the device instead of landing in another call's data.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::ops::RangeInclusive;

use rpc_wire::{Code, Flags, FrameKind, Header, RemoteBuffer};

use super::action::{Action, WriteWork};
use super::error::{ProtocolViolation, SendError};

mod advertise;
mod receiver;
mod source;

use source::{Read, Sourced};

/// Tuning of the large-body path (local policy, never on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeConfig {
    /// Largest RDMA WRITE posted at once. A body goes as several, so that frames of other
    /// calls pass between them.
    pub chunk_size: u32,
    /// RDMA WRITEs outstanding at once on a connection, all transfers together.
    pub write_window: u32,
    /// Peer-writable grants (asked for or open) at once; further buffer requests wait.
    pub max_grants: u32,
    /// Buffer requests that may wait for a grant beyond `max_grants`; further ones are
    /// refused at once with `RESOURCE_EXHAUSTED`, so a peer cannot grow the queue without
    /// bound.
    pub max_queued: u32,
    /// Largest body the peer may ask a buffer for; larger requests are refused with
    /// `RESOURCE_EXHAUSTED`.
    pub max_message: u64,
}

impl Default for LargeConfig {
    fn default() -> Self {
        LargeConfig {
            chunk_size: 256 * 1024,
            write_window: 2,
            max_grants: 16,
            max_queued: 256,
            max_message: 2 << 30,
        }
    }
}

/// Which body a rendezvous is for: its call and, for a stream message, the message's
/// sequence number (0 for the body of a request or response, whose frames use `method_id`
/// for the method). Ordered by call first, so a call's bodies form one range of a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BodyId {
    /// The call.
    pub call_id: u64,
    /// The stream message's sequence number; 0 for a request's or response's body.
    pub seq: u32,
}

impl BodyId {
    /// The body a frame is about: a placed body's notification, or a rendezvous frame.
    pub fn of(header: &Header) -> Self {
        let seq = match header.kind {
            FrameKind::Message => header.seq(),
            kind if kind.is_rendezvous() => header.seq(),
            _ => 0,
        };
        BodyId {
            call_id: header.call_id,
            seq,
        }
    }

    /// Every body of `call_id`.
    fn of_call(call_id: u64) -> RangeInclusive<BodyId> {
        BodyId { call_id, seq: 0 }..=BodyId {
            call_id,
            seq: u32::MAX,
        }
    }

    /// A header-only rendezvous frame about this body.
    fn frame(self, kind: FrameKind) -> Header {
        Header::stream(kind, self.call_id, self.seq)
    }
}

impl fmt::Display for BodyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seq {
            0 => write!(f, "call {}", self.call_id),
            seq => write!(f, "call {} message {seq}", self.call_id),
        }
    }
}

/// Registered local memory an outgoing body was encoded into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBuffer {
    /// Address of the first byte of the body.
    pub addr: u64,
    /// Local key of its registration.
    pub lkey: u32,
}

/// What [`Large::counts`] reports.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LargeCounts {
    /// Transfers under way (this side writing).
    pub(crate) transfers: u32,
    /// Grants open or asked for (the peer writing), advertised ones included.
    pub(crate) grants: u32,
    /// Bodies sent by rendezvous (a `LargeRequest` each).
    pub(crate) rendezvous: u64,
    /// Responses written straight into the buffer their request advertised.
    pub(crate) into_advertised: u64,
    /// Response buffers advertised with our requests.
    pub(crate) advertised: u64,
    /// Responses the peer placed in a buffer we advertised.
    pub(crate) advertised_filled: u64,
    /// Bodies offered for the peer to READ (a `LargeSource` each).
    pub(crate) sourced: u64,
    /// Bodies this side read from the peer's memory.
    pub(crate) read: u64,
    /// Buffer requests refused because `max_queued` were already waiting.
    pub(crate) queue_refusals: u64,
}

#[derive(Debug)]
enum TransferState {
    /// The buffer request is queued or sent; no grant yet.
    AwaitingGrant,
    /// Granted: chunks from `next` on are still to be posted.
    Writing { remote: RemoteBuffer, next: u64 },
    /// Every chunk and the notification are posted.
    Written,
    /// Cancelled while chunks were outstanding; no more are posted.
    Aborted,
    /// Offered for the peer to READ: the window is bound, the `LargeSource` and the notice
    /// are queued or sent; the peer's `LargeSourceDone` ends it.
    Sourced(Sourced),
}

#[derive(Debug)]
struct Transfer {
    body: BodyId,
    /// The frame that announces the placed body.
    notice: Header,
    local: LocalBuffer,
    total: u64,
    in_flight: u32,
    state: TransferState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrantState {
    /// The peer may write.
    Open,
    /// The body arrived; the rkey is being invalidated before it is handed up.
    Arrived(Header),
    /// The call was cancelled; the rkey is being invalidated before the buffer is reused.
    Revoking,
}

#[derive(Debug)]
struct Grant {
    rkey: u32,
    len: u64,
    state: GrantState,
    /// Offered with our request as its response buffer, not asked for by the peer.
    advertised: bool,
}

/// Both roles of the large-body path on one connection: writer of outgoing bodies and
/// grantor of incoming ones.
#[derive(Debug)]
pub(crate) struct Large {
    config: LargeConfig,
    next_transfer: u32,
    transfers: HashMap<u32, Transfer>,
    transfer_by_body: BTreeMap<BodyId, u32>,
    /// Bodies whose call was cancelled while their buffer request was on the wire: the
    /// answer that may still come is expected, and ignored (the receiver revokes the grant
    /// on our Cancel).
    abandoned: BTreeSet<BodyId>,
    /// Transfers with chunks left to post, served round robin.
    writing: VecDeque<u32>,
    /// RDMA WRITEs and READs outstanding, bounded by `write_window`.
    one_sided_in_flight: u32,
    next_grant: u32,
    grants: HashMap<u32, Grant>,
    grant_by_body: BTreeMap<BodyId, u32>,
    /// Buffer requests handed to the driver (`GrantNeeded`) and not yet answered.
    asked: BTreeSet<BodyId>,
    /// Buffer requests beyond `max_grants`, in arrival order (at most `max_queued`).
    waiting: VecDeque<BodyId>,
    /// The lengths asked for by the bodies in `waiting`, for membership without a scan.
    waiting_len: BTreeMap<BodyId, u64>,
    /// Response buffers the peer advertised with requests we have not answered yet.
    offers: HashMap<u64, RemoteBuffer>,
    /// Bodies the peer offered for reading, queued or asked of the driver: where they lie,
    /// and their notice once it came.
    incoming: BTreeMap<BodyId, (RemoteBuffer, Option<Header>)>,
    /// Bodies being read into a grant's buffer, by grant id (which `grants` never holds).
    reads: HashMap<u32, Read>,
    /// Read grants with chunks left to post, served round robin.
    reading: VecDeque<u32>,
    /// Offered bodies refused before their notice came: the notice is dropped on arrival.
    refused: BTreeSet<BodyId>,
    /// Header-only frames to send, in order.
    frames: VecDeque<Header>,
    counters: LargeCounts,
}

impl Large {
    pub(crate) fn new(config: LargeConfig) -> Self {
        Large {
            config,
            next_transfer: 0,
            transfers: HashMap::new(),
            transfer_by_body: BTreeMap::new(),
            abandoned: BTreeSet::new(),
            writing: VecDeque::new(),
            one_sided_in_flight: 0,
            next_grant: 0,
            grants: HashMap::new(),
            grant_by_body: BTreeMap::new(),
            asked: BTreeSet::new(),
            waiting: VecDeque::new(),
            waiting_len: BTreeMap::new(),
            offers: HashMap::new(),
            incoming: BTreeMap::new(),
            reads: HashMap::new(),
            reading: VecDeque::new(),
            refused: BTreeSet::new(),
            frames: VecDeque::new(),
            counters: LargeCounts::default(),
        }
    }

    /// Nothing is under way in either role.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.transfers.is_empty()
            && self.abandoned.is_empty()
            && self.grants.is_empty()
            && self.asked.is_empty()
            && self.waiting.is_empty()
            && self.offers.is_empty()
            && self.incoming.is_empty()
            && self.reads.is_empty()
            && self.refused.is_empty()
            && self.frames.is_empty()
    }

    /// An rkey invalidation or a READ is outstanding (a body to hand up, a buffer to give
    /// back, a source to release).
    pub(crate) fn invalidating(&self) -> bool {
        self.grants
            .values()
            .any(|g| matches!(g.state, GrantState::Arrived(_) | GrantState::Revoking))
            || self.reads.values().any(Read::in_flight)
            || self.transfers.values().any(|t| t.state.unsourcing())
    }

    /// Whether WRITEs wait to be posted or header-only frames to be sent (the connection's
    /// flush looks at nothing else of the large-body path while they do not).
    #[inline]
    pub(crate) fn has_sends(&self) -> bool {
        !self.writing.is_empty() || !self.reading.is_empty() || !self.frames.is_empty()
    }

    /// This side has no body to write and no header-only frame to send.
    pub(crate) fn sending_idle(&self) -> bool {
        self.transfers.is_empty() && self.frames.is_empty()
    }

    /// Gauges and counters for [`super::Stats`].
    pub(crate) fn counts(&self) -> LargeCounts {
        LargeCounts {
            transfers: self.transfers.len() as u32,
            grants: self.open_grants() as u32,
            ..self.counters
        }
    }

    /// Grants open or asked for: buffers the peer writes, or this side reads into.
    fn open_grants(&self) -> usize {
        self.grants.len() + self.reads.len() + self.asked.len()
    }

    /// A fresh transfer id.
    fn next_transfer_id(&mut self) -> u32 {
        self.next_transfer = self.next_transfer.wrapping_add(1);
        while self.transfers.contains_key(&self.next_transfer) {
            self.next_transfer = self.next_transfer.wrapping_add(1);
        }
        self.next_transfer
    }

    // ---- writer ----

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
    fn check_start(&self, notice: &Header) -> Result<(Header, u64), SendError> {
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

    // ---- frames ----

    /// The next header-only frame to send, if any.
    pub(crate) fn next_frame(&self) -> Option<&Header> {
        self.frames.front()
    }

    /// Removes the frame returned by [`Large::next_frame`] (it was committed to the ring).
    pub(crate) fn pop_frame(&mut self) {
        self.frames.pop_front();
    }
}

/// A buffer of the peer's whose last byte has an address: every WRITE into it is computed
/// as `addr + offset` with `offset < len`, which then cannot overflow.
pub(crate) fn check_range(call_id: u64, remote: &RemoteBuffer) -> Result<(), ProtocolViolation> {
    match remote.addr.checked_add(remote.len) {
        Some(_) => Ok(()),
        None => Err(ProtocolViolation::BufferOutOfRange {
            call_id,
            addr: remote.addr,
            len: remote.len,
        }),
    }
}
