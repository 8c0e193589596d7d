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

use rpc_wire::{FrameKind, Header, RemoteBuffer};

use super::error::ProtocolViolation;

mod advertise;
mod receiver;
mod source;
mod writer;

pub use source::BodyStart;
use source::{Read, Sourced};

/// Tuning of the large-body path (local policy, never on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeConfig {
    /// Largest RDMA WRITE or READ posted at once. A body goes as several, so that frames of
    /// other calls pass between them.
    pub chunk_size: u32,
    /// RDMA WRITEs and READs outstanding at once on a connection, all bodies together.
    pub write_window: u32,
    /// Windows over this side's memory open to the peer at once, and buffers lent to it:
    /// grants (asked for or open, or read into), advertised response buffers and offered
    /// request bodies. Further buffer requests wait; further requests go without a response
    /// buffer and by the rendezvous instead of an offer. Each window costs at most two
    /// send-queue entries (its bind and its invalidation), which the queue is sized for.
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
    /// Entries of `incoming` whose notice has not come.
    unannounced: usize,
    /// An offered body is asked memory for only once its notice came
    /// ([`crate::Connection::read_after_notice`]).
    read_after_notice: bool,
    /// Bodies being read into a grant's buffer, by grant id (which `grants` never holds).
    reads: HashMap<u32, Read>,
    /// Read grants with chunks left to post, served round robin.
    reading: VecDeque<u32>,
    /// Offered bodies refused before their notice came: the notice is dropped on arrival.
    refused: BTreeSet<BodyId>,
    /// Bodies this side offered whose window is not yet invalidated.
    offered: usize,
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
            unannounced: 0,
            read_after_notice: false,
            reads: HashMap::new(),
            reading: VecDeque::new(),
            refused: BTreeSet::new(),
            offered: 0,
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
            && self.unannounced == 0
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

    /// Header-only frames wait for room in the send ring.
    pub(crate) fn has_frames(&self) -> bool {
        !self.frames.is_empty()
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

    /// What counts against `max_grants`: grants open or asked for (buffers the peer writes,
    /// or this side reads into) and bodies offered (windows the peer reads through).
    fn open_grants(&self) -> usize {
        self.grants.len() + self.reads.len() + self.asked.len() + self.offered
    }

    /// A fresh transfer id.
    fn next_transfer_id(&mut self) -> u32 {
        self.next_transfer = self.next_transfer.wrapping_add(1);
        while self.transfers.contains_key(&self.next_transfer) {
            self.next_transfer = self.next_transfer.wrapping_add(1);
        }
        self.next_transfer
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
