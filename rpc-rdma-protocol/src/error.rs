//! Errors of the sans-IO protocol, one enum per kind of caller reaction:
//!
//! * [`ProtocolViolation`]: the peer (or a completion) broke the protocol; the connection is
//!   closed and the driver must disconnect it.
//! * [`SendError`]: a local send could not be accepted now or ever; the connection lives on.
//! * [`ParamsError`]: connection parameters failed validation or negotiation; refuse the
//!   connection.

use rpc_wire::{FrameKind, HeaderError};

use crate::large::BodyId;

/// The peer or the completion stream contradicted the protocol. Fatal for the connection:
/// the state machine closes itself before returning one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolViolation {
    /// A received frame's header failed validation.
    #[error("frame in receive slot {slot} has a malformed header: {source}")]
    BadHeader {
        /// Receive slot the frame arrived in.
        slot: u32,
        /// What the header decoder rejected.
        #[source]
        source: HeaderError,
    },
    /// The completion reports more bytes than a receive slot holds.
    #[error(
        "receive completion of {byte_len} bytes in slot {slot} exceeds the slot size {slot_size}"
    )]
    CompletionExceedsSlot {
        /// Receive slot.
        slot: u32,
        /// Bytes reported by the work completion.
        byte_len: u32,
        /// Size of a receive slot.
        slot_size: u32,
    },
    /// The header declares a frame larger than a receive slot.
    #[error("frame in slot {slot} declares {declared} bytes, more than the slot size {slot_size}")]
    FrameExceedsSlot {
        /// Receive slot.
        slot: u32,
        /// Header plus metadata plus payload, as declared.
        declared: u64,
        /// Size of a receive slot.
        slot_size: u32,
    },
    /// The header's declared frame length differs from the bytes actually received.
    #[error(
        "frame in slot {slot} declares {declared} bytes but the completion carried {byte_len}"
    )]
    LengthMismatch {
        /// Receive slot.
        slot: u32,
        /// Header plus metadata plus payload, as declared.
        declared: u64,
        /// Bytes reported by the work completion.
        byte_len: u32,
    },
    /// The peer granted more credits than it has receive slots.
    #[error(
        "peer granted {granted} credits on top of {held} held, but its ring has only {ring} slots"
    )]
    CreditOverflow {
        /// Credits held before the grant.
        held: u32,
        /// Credits in the offending frame.
        granted: u32,
        /// Receive slots the peer announced.
        ring: u32,
    },
    /// A credit-only frame that returns nothing (never sent by a conforming peer).
    #[error("credit-only frame returns no credits")]
    EmptyCreditOnly,
    /// A receive completion names a slot outside the receive ring.
    #[error("receive completion for slot {slot}, outside the ring of {slots} slots")]
    RecvSlotOutOfRange {
        /// Slot named by the completion.
        slot: u32,
        /// Receive slots in the ring.
        slots: u32,
    },
    /// A receive completion for a slot that has no RECV posted.
    #[error("receive completion for slot {slot}, which has no receive posted")]
    RecvSlotNotPosted {
        /// Slot named by the completion.
        slot: u32,
    },
    /// The buffer handed in with a receive completion is shorter than the completion.
    #[error("receive buffer of {len} bytes for slot {slot} is shorter than the completion's {byte_len} bytes")]
    RecvBufferTooShort {
        /// Slot named by the completion.
        slot: u32,
        /// Bytes of the buffer handed in.
        len: usize,
        /// Bytes reported by the work completion.
        byte_len: u32,
    },
    /// `release_recv` for a slot the upper layer does not hold (a local bug, fatal all the
    /// same: the ring accounting can no longer be trusted).
    #[error("release of receive slot {slot}, which the upper layer does not hold")]
    RecvSlotNotHeld {
        /// Slot being released.
        slot: u32,
    },
    /// A frame arrived in the shared receive queue while the peer held no credit of this
    /// connection: it took a buffer committed to another connection.
    #[error("frame received without a credit: the peer overran its receive window")]
    RecvWithoutCredit,
    /// A send completion that matches no outstanding signaled send (RC completes in order).
    #[error("send completion for slot {slot}; the next signaled send is {expected:?}")]
    UnexpectedSendCompletion {
        /// Slot named by the completion.
        slot: u32,
        /// Slot of the oldest outstanding signaled send, if any.
        expected: Option<u32>,
    },
    /// A send completion for the control buffer while no credit-only frame is outstanding.
    #[error("send completion for the control buffer, which has no send outstanding")]
    UnexpectedControlCompletion,
    /// A buffer grant for a body that asked for none (or already has one).
    #[error("peer granted a buffer for {body}, which asked for none")]
    UnexpectedGrant {
        /// Body named by the grant.
        body: BodyId,
    },
    /// A buffer grant smaller than the body it is for.
    #[error("peer granted {granted} bytes for {body}, whose body needs {needed}")]
    GrantTooSmall {
        /// Body named by the grant.
        body: BodyId,
        /// Bytes granted.
        granted: u64,
        /// Bytes asked for.
        needed: u64,
    },
    /// A buffer (granted, or advertised with a request) whose address range wraps past
    /// the end of the address space: no WRITE may be computed into it.
    #[error("peer offered a buffer of {len} bytes at {addr:#x} for call {call_id}, past the end of the address space")]
    BufferOutOfRange {
        /// Call named by the buffer.
        call_id: u64,
        /// Its address.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A second buffer request for a body that has one pending or granted.
    #[error("peer asked again for a buffer for {body}")]
    DuplicateBufferRequest {
        /// Body named by the request.
        body: BodyId,
    },
    /// A request advertises a response buffer for a call that already has one.
    #[error("peer advertised a second response buffer for call {call_id}")]
    DuplicateResponseBuffer {
        /// Call named by the request.
        call_id: u64,
    },
    /// A frame says its body was written into a buffer, but none is granted for it.
    #[error("peer placed a body for {body} without a grant")]
    PlacedWithoutGrant {
        /// Body named by the frame.
        body: BodyId,
    },
    /// A frame says its body is larger than the buffer granted for it.
    #[error("peer placed {len} bytes for {body} in a grant of {granted}")]
    PlacedBeyondGrant {
        /// Body named by the frame.
        body: BodyId,
        /// Body length the frame declares.
        len: u64,
        /// Bytes granted.
        granted: u64,
    },
    /// An answer to a body offered for reading that this side did not offer, or that was
    /// answered already.
    #[error("peer answered an offer of {body} that is not outstanding")]
    UnexpectedSourceDone {
        /// Body named by the answer.
        body: BodyId,
    },
    /// A body offered for reading that is not a request's: stream messages, like responses,
    /// take the rendezvous.
    #[error("peer offered {body}, a stream message, for reading; only request bodies are")]
    OfferedStreamMessage {
        /// Body named by the offer.
        body: BodyId,
    },
    /// Offers refused before their notice came pile up: the peer does not send the notice
    /// right behind each offer.
    #[error("peer left {refused} refused offers without their notice")]
    NoticesMissing {
        /// Refused offers whose notice has not come.
        refused: usize,
    },
    /// More offers of bodies to read wait for their notice than `max_queued`, with
    /// [`crate::Connection::read_after_notice`]: a writer sends each notice right behind
    /// its offer.
    #[error("peer left {offers} offers without their notice")]
    OffersUnannounced {
        /// Offers whose notice has not come.
        offers: usize,
    },
    /// A completion for an RDMA WRITE, window bind or invalidation nothing is waiting for.
    #[error("completion of {what} {id}, which is not outstanding")]
    UnexpectedLargeCompletion {
        /// What completed: "write", "read", "bind", "invalidate" or "source invalidation".
        what: &'static str,
        /// Transfer or grant id.
        id: u32,
    },
}

/// A send the connection cannot accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Back-pressure: no free send slot, or the queue of frames waiting for credits is at its
    /// bound. Not an error of the connection: retry after [`crate::Action::Writable`].
    #[error("send ring full or send queue at its bound; retry after Action::Writable")]
    WouldBlock,
    /// The frame does not fit the negotiated maximum; use the large-payload path.
    #[error("frame of {len} bytes exceeds the negotiated maximum of {max} bytes")]
    TooLarge {
        /// Requested frame length (header included).
        len: u64,
        /// Largest frame the peer accepts.
        max: u32,
    },
    /// A frame is at least a header.
    #[error("frame of {len} bytes is shorter than a header")]
    TooShort {
        /// Requested frame length.
        len: usize,
    },
    /// The header would be rejected by the peer's decoder.
    #[error("header would be rejected by the peer: {0}")]
    InvalidHeader(#[source] HeaderError),
    /// Credit-only and rendezvous frames, and placed bodies, belong to the protocol;
    /// callers may not send them.
    #[error("{0:?} frames and placed bodies are emitted by the protocol, not by callers")]
    ReservedKind(FrameKind),
    /// A large transfer for this body is already under way.
    #[error("{body} already has a large transfer under way")]
    DuplicateTransfer {
        /// The body.
        body: BodyId,
    },
    /// A large transfer needs a body larger than a slot frame.
    #[error("a large transfer of {len} bytes is too small for the rendezvous")]
    NotLarge {
        /// Body length.
        len: u64,
    },
    /// A request carries a response-buffer descriptor that
    /// [`crate::Connection::advertise`] did not make for its call.
    #[error("request for call {call_id} advertises a response buffer that was not set up")]
    NotAdvertised {
        /// The call.
        call_id: u64,
    },
    /// The reservation is not outstanding on this connection.
    #[error("reservation for send slot {slot} is not outstanding on this connection")]
    UnknownReservation {
        /// Slot of the reservation.
        slot: u32,
    },
    /// The connection is closed; nothing more will be sent.
    #[error("connection is closed")]
    Closed,
}

/// Connection parameters that failed validation or negotiation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// Fewer bytes than an encoded [`crate::ConnectParams`].
    #[error("connection parameters truncated: {len} bytes, need {need}")]
    Truncated {
        /// Bytes available.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Not rdma-rpc private data.
    #[error("bad connection-parameter magic 0x{0:08x}: peer is not speaking rdma-rpc")]
    BadMagic(u32),
    /// Flag bits this version does not define.
    #[error("unknown connection-parameter flags 0x{0:04x}")]
    UnknownFlags(u16),
    /// A version range whose minimum exceeds its maximum, or that includes version 0.
    #[error("invalid protocol version range {min}..={max}")]
    InvalidVersionRange {
        /// Lowest version offered.
        min: u8,
        /// Highest version offered.
        max: u8,
    },
    /// The two sides share no protocol version.
    #[error(
        "no common protocol version: local {local_min}..={local_max}, peer {peer_min}..={peer_max}"
    )]
    NoCommonVersion {
        /// Local lowest version.
        local_min: u8,
        /// Local highest version.
        local_max: u8,
        /// Peer lowest version.
        peer_min: u8,
        /// Peer highest version.
        peer_max: u8,
    },
    /// A receive window below the credits liveness needs or above its ring.
    #[error("{what}: {window} receives posted at first, allowed {min}..={max}")]
    WindowOutOfRange {
        /// Which window.
        what: &'static str,
        /// Offending window.
        window: u32,
        /// Smallest allowed.
        min: u32,
        /// Largest allowed: the ring's slot count.
        max: u32,
    },
    /// A slot count of zero or beyond the supported maximum.
    #[error("{what}: {count} slots, allowed {min}..={max}")]
    SlotCountOutOfRange {
        /// Which ring.
        what: &'static str,
        /// Offending count.
        count: u32,
        /// Smallest allowed.
        min: u32,
        /// Largest allowed.
        max: u32,
    },
    /// A slot size too small for a header or beyond the supported maximum.
    #[error("{what}: slot size {size} bytes, allowed {min}..={max}")]
    SlotSizeOutOfRange {
        /// Which ring.
        what: &'static str,
        /// Offending size.
        size: u32,
        /// Smallest allowed.
        min: u32,
        /// Largest allowed.
        max: u32,
    },
    /// A ring whose total size is absurd.
    #[error("{what}: ring of {bytes} bytes exceeds the maximum of {max} bytes")]
    RingTooLarge {
        /// Which ring.
        what: &'static str,
        /// slot count × slot size.
        bytes: u64,
        /// Largest allowed.
        max: u64,
    },
    /// A local tuning knob outside its allowed range.
    #[error("{what} = {value}, allowed {min}..={max}")]
    PolicyOutOfRange {
        /// Which knob.
        what: &'static str,
        /// Offending value.
        value: u32,
        /// Smallest allowed.
        min: u32,
        /// Largest allowed.
        max: u32,
    },
}
