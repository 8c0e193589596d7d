//! The message header that starts every frame on every transport.
//!
//! Two forms, little-endian (see `docs/PROTOCOL.md`). The **full** form is 64 bytes:
//!
//! | offset | size | field          | meaning                                                   |
//! |-------:|-----:|----------------|-----------------------------------------------------------|
//! | 0      | 2    | magic          | `0x5252` ("RR")                                           |
//! | 2      | 1    | version        | [`PROTOCOL_VERSION`]                                      |
//! | 3      | 1    | kind           | [`FrameKind`]                                             |
//! | 4      | 2    | flags          | [`Flags`], plus the form bit `COMPACT` (bit 2)            |
//! | 6      | 2    | status         | gRPC status code (responses only)                         |
//! | 8      | 8    | call_id        | chosen by the client, unique per connection               |
//! | 16     | 4    | method_id      | `rpc_core::method_id` of `/package.Service/Method`; the   |
//! |        |      |                | sequence number on stream frames ([`Header::seq`])        |
//! | 20     | 4    | metadata_len   | bytes of metadata following the header                    |
//! | 24     | 4    | payload_len    | bytes of payload following the metadata                   |
//! | 28     | 4    | credits        | receive slots granted to the peer (RDMA; 0 on TCP)        |
//! | 32     | 8    | timeout_us     | caller's remaining time budget in µs, 0 = none            |
//! | 40     | 8    | remote_addr    | large-payload descriptor: address                         |
//! | 48     | 4    | rkey           | large-payload descriptor: remote key                      |
//! | 52     | 4    | generation     | large-payload descriptor: grant generation                |
//! | 56     | 8    | remote_len     | large-payload descriptor: length in bytes                 |
//!
//! The **compact** form is the first 32 bytes alone, with the `COMPACT` flag bit set:
//! `timeout_us` and the descriptor are zero. The form is not a choice: a header whose
//! timeout, descriptor and flags are all zero (and whose kind is not a rendezvous kind) is
//! always compact, and every other header is always full; the decoder rejects the other
//! form. So each header has exactly one encoding, [`Header::encoded_len`] is its length on
//! the wire, and a small frame carries 32 fewer bytes.

use crate::error::HeaderError;
use crate::status::Code;

/// Size of a full [`Header`] in bytes: the longest a header can be.
pub const HEADER_LEN: usize = 64;
/// Size of a compact [`Header`] in bytes: the shortest a header can be.
pub const COMPACT_HEADER_LEN: usize = 32;
/// Form bit in the flags field: the header is compact (see the module documentation).
/// It describes the encoding, not the frame, so [`Flags`] never holds it.
const COMPACT_BIT: u16 = 1 << 2;
/// First two bytes of every frame.
pub const MAGIC: u16 = 0x5252;
/// Wire protocol version spoken by this crate (2: the compact header form; 3: the
/// `Messages` kind; 4: bodies read by RDMA READ, `LargeSource` and `LargeSourceDone`).
pub const PROTOCOL_VERSION: u8 = 4;

/// Largest payload of a [`FrameKind::Messages`] frame a sender builds. A receiver takes a
/// `Messages` frame of up to this many bytes whatever its own message size limit (each
/// message in it is checked against that limit); a larger one is refused as an oversized
/// message would be.
pub const MESSAGES_FRAME_LIMIT: usize = 16 * 1024;

/// Bytes before each message in a `Messages` payload: its length.
pub const LENGTH_PREFIX: usize = 4;

/// The largest `Messages` frame: [`MESSAGES_FRAME_LIMIT`] bytes of payload after its header
/// (always the compact form). A sender stages at most this much before it sends.
pub const STAGE_LIMIT: usize = COMPACT_HEADER_LEN + MESSAGES_FRAME_LIMIT;

/// What a frame is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// A call from client to server.
    Request = 1,
    /// The server's answer to a request (success or error status).
    Response = 2,
    /// The client gave up on a call (dropped, cancelled, deadline passed).
    Cancel = 3,
    /// Carries only returned credits (RDMA); no call, no payload.
    CreditOnly = 4,
    /// Asks the peer for a registered buffer of `remote.len` bytes to RDMA WRITE the body
    /// (metadata and message) of this call's request or response into (RDMA rendezvous).
    LargeRequest = 5,
    /// Answers a [`FrameKind::LargeRequest`]: grants the buffer the descriptor names, or
    /// refuses with a non-OK status, no buffer, and the receiver's limit (0: not said) as
    /// the descriptor's length (RDMA rendezvous).
    LargeGrant = 6,
    /// One message of a streaming call, in either direction; its payload is the encoded
    /// message and [`Header::seq`] its place in the stream (from 1).
    Message = 7,
    /// The client sends no more messages on this streaming call; [`Header::seq`] is one past
    /// its last message.
    HalfClose = 8,
    /// The server ends a streaming call: the status, trailing metadata, and the status
    /// message as payload; [`Header::seq`] is one past its last message.
    Trailers = 9,
    /// Returns room in a stream's flow-control window to the peer: the payload is
    /// `rpc_core::stream::WindowUpdate` (messages and bytes consumed).
    WindowUpdate = 10,
    /// Several consecutive messages of a streaming call in one frame: the payload is each
    /// message after its length (4 bytes, little-endian), and [`Header::seq`] is the first
    /// one's place; the others take the places after it (`rpc_core::stream::batch`).
    Messages = 11,
    /// Offers the body of this call's request (or stream message, [`Header::seq`]) for the
    /// receiver to RDMA READ from the descriptor, instead of asking for a buffer to WRITE it
    /// into; the body's notice follows at once (RDMA).
    LargeSource = 12,
    /// The receiver is done with a [`FrameKind::LargeSource`]: it read the body (status OK),
    /// or it will not (a non-OK status: refused, with its limit as the descriptor's length,
    /// or cancelled). The sender may reuse the memory once it revoked its window (RDMA).
    LargeSourceDone = 13,
}

impl FrameKind {
    /// Whether the kind belongs to a large body's exchange of buffers (RDMA only, always in
    /// the full header form, generated by the protocol and never by its user).
    pub const fn is_rendezvous(self) -> bool {
        matches!(
            self,
            FrameKind::LargeRequest
                | FrameKind::LargeGrant
                | FrameKind::LargeSource
                | FrameKind::LargeSourceDone
        )
    }
}

impl FrameKind {
    fn from_wire(raw: u8) -> Result<Self, HeaderError> {
        Ok(match raw {
            1 => Self::Request,
            2 => Self::Response,
            3 => Self::Cancel,
            4 => Self::CreditOnly,
            5 => Self::LargeRequest,
            6 => Self::LargeGrant,
            7 => Self::Message,
            8 => Self::HalfClose,
            9 => Self::Trailers,
            10 => Self::WindowUpdate,
            11 => Self::Messages,
            12 => Self::LargeSource,
            13 => Self::LargeSourceDone,
            other => return Err(HeaderError::UnknownKind(other)),
        })
    }
}

/// Frame flags. Unknown bits are rejected by the decoder so that a later protocol version
/// cannot be misread as this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(u16);

impl Flags {
    /// No flags.
    pub const NONE: Flags = Flags(0);
    /// The body (`metadata_len` bytes of metadata, then `payload_len` bytes of payload) was
    /// placed by RDMA WRITE at the start of the buffer the receiver granted for this call;
    /// nothing follows the header. RDMA only.
    pub const LARGE_PAYLOAD: Flags = Flags(1 << 0);
    /// The descriptor of a request advertises a registered buffer the server may WRITE the
    /// response body into (sparing the rendezvous). RDMA only.
    pub const RESPONSE_BUFFER: Flags = Flags(1 << 1);
    /// On a request: the call is streaming (its messages follow as [`FrameKind::Message`]
    /// and [`FrameKind::Messages`] frames, the request itself carries metadata only). On a response: the headers of a
    /// streaming response (status OK, metadata, no message).
    pub const STREAM: Flags = Flags(1 << 3);
    const KNOWN: u16 = Self::LARGE_PAYLOAD.0 | Self::RESPONSE_BUFFER.0 | Self::STREAM.0;

    /// Raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }
    /// Whether all bits of `other` are set in `self`.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    /// `self` with the bits of `other` added.
    #[must_use]
    pub const fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
    /// `self` without the bits of `other`.
    #[must_use]
    pub const fn without(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }
    fn from_wire(raw: u16) -> Result<Self, HeaderError> {
        if raw & !Self::KNOWN != 0 {
            return Err(HeaderError::UnknownFlags(raw & !Self::KNOWN));
        }
        Ok(Flags(raw))
    }
}

/// A registered buffer the peer may RDMA WRITE into: the large-payload descriptor of
/// rendezvous grants and advertised response buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteBuffer {
    /// Virtual address in the owner's registered memory.
    pub addr: u64,
    /// Remote key of the registration.
    pub rkey: u32,
    /// The grantor's sequence number of this grant, for diagnostics (the rkey itself is what
    /// is revoked when the grant ends).
    pub generation: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteBuffer {
    fn is_empty_descriptor(&self) -> bool {
        *self == RemoteBuffer::default()
    }
}

/// The decoded, validated form of the 64-byte frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the frame is for.
    pub kind: FrameKind,
    /// Frame flags.
    pub flags: Flags,
    /// Status code of a response; [`Code::Ok`] for every other kind.
    pub status: Code,
    /// Call the frame belongs to (0 for [`FrameKind::CreditOnly`]).
    pub call_id: u64,
    /// Method being called (requests, echoed in responses); on stream frames the sequence
    /// number ([`Header::seq`]); 0 elsewhere, accepted and ignored.
    pub method_id: u32,
    /// Length of the encoded metadata that follows the header.
    pub metadata_len: u32,
    /// Length of the payload that follows the metadata.
    pub payload_len: u32,
    /// Credits (receive slots) granted to the peer by this frame.
    pub credits: u32,
    /// Remaining time budget of the call in microseconds; 0 means no deadline.
    pub timeout_us: u64,
    /// Large-payload descriptor; all zero unless a flag or kind gives it meaning.
    pub remote: RemoteBuffer,
}

impl Header {
    /// A header of `kind` for `call_id` with every other field zeroed.
    pub const fn new(kind: FrameKind, call_id: u64) -> Self {
        Header {
            kind,
            flags: Flags::NONE,
            status: Code::Ok,
            call_id,
            method_id: 0,
            metadata_len: 0,
            payload_len: 0,
            credits: 0,
            timeout_us: 0,
            remote: RemoteBuffer {
                addr: 0,
                rkey: 0,
                generation: 0,
                len: 0,
            },
        }
    }

    /// The place of a stream frame ([`FrameKind::Message`], the first message of a
    /// [`FrameKind::Messages`], [`FrameKind::HalfClose`],
    /// [`FrameKind::Trailers`], and the rendezvous frames of a large message) in its
    /// direction of the call: messages count from 1; 0 is the call's opening frame. It
    /// travels in the `method_id` field, which stream frames do not need.
    pub const fn seq(&self) -> u32 {
        self.method_id
    }

    /// A stream frame of `kind` for `call_id` at `seq`.
    pub const fn stream(kind: FrameKind, call_id: u64, seq: u32) -> Self {
        let mut header = Header::new(kind, call_id);
        header.method_id = seq;
        header
    }

    /// Bytes that follow the header in the same frame: metadata plus payload, or nothing
    /// when [`Flags::LARGE_PAYLOAD`] says the body was placed by RDMA WRITE.
    pub fn body_len(&self) -> u64 {
        if self.flags.contains(Flags::LARGE_PAYLOAD) {
            0
        } else {
            self.message_len()
        }
    }

    /// Bytes of the body (metadata plus payload) wherever it travels.
    pub fn message_len(&self) -> u64 {
        u64::from(self.metadata_len) + u64::from(self.payload_len)
    }

    /// Whether the frame uses RDMA-only features (rendezvous kinds, placed bodies, response
    /// buffers), which a byte-stream transport must refuse.
    pub fn is_rdma_only(&self) -> bool {
        self.flags.without(Flags::STREAM) != Flags::NONE || self.kind.is_rendezvous()
    }

    /// Whether this header travels in the compact form: nothing in the 32 bytes it omits.
    pub fn is_compact(&self) -> bool {
        self.timeout_us == 0
            && self.flags.without(Flags::STREAM) == Flags::NONE
            && self.remote.is_empty_descriptor()
            && !self.kind.is_rendezvous()
    }

    /// Length of this header on the wire: [`COMPACT_HEADER_LEN`] or [`HEADER_LEN`].
    pub fn encoded_len(&self) -> usize {
        if self.is_compact() {
            COMPACT_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header into the first [`Header::encoded_len`] bytes of `dst` and returns
    /// that length.
    ///
    /// # Panics
    /// If `dst` is shorter than [`Header::encoded_len`]; callers size their buffers from the
    /// header.
    pub fn encode(&self, dst: &mut [u8]) -> usize {
        let compact = self.is_compact();
        let form = if compact { COMPACT_BIT } else { 0 };
        let len = if compact {
            COMPACT_HEADER_LEN
        } else {
            HEADER_LEN
        };
        let dst = &mut dst[..len];
        dst[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        dst[2] = PROTOCOL_VERSION;
        dst[3] = self.kind as u8;
        dst[4..6].copy_from_slice(&(self.flags.bits() | form).to_le_bytes());
        dst[6..8].copy_from_slice(&(self.status as u16).to_le_bytes());
        dst[8..16].copy_from_slice(&self.call_id.to_le_bytes());
        dst[16..20].copy_from_slice(&self.method_id.to_le_bytes());
        dst[20..24].copy_from_slice(&self.metadata_len.to_le_bytes());
        dst[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        dst[28..32].copy_from_slice(&self.credits.to_le_bytes());
        if compact {
            return COMPACT_HEADER_LEN;
        }
        dst[32..40].copy_from_slice(&self.timeout_us.to_le_bytes());
        dst[40..48].copy_from_slice(&self.remote.addr.to_le_bytes());
        dst[48..52].copy_from_slice(&self.remote.rkey.to_le_bytes());
        dst[52..56].copy_from_slice(&self.remote.generation.to_le_bytes());
        dst[56..64].copy_from_slice(&self.remote.len.to_le_bytes());
        HEADER_LEN
    }

    /// Rewrites `payload_len` in the header encoded at the start of `wire` (either form): a
    /// sender growing a frame it already encoded, such as a [`FrameKind::Messages`] frame
    /// taking one more message.
    ///
    /// # Panics
    /// If `wire` is shorter than [`COMPACT_HEADER_LEN`].
    pub fn set_encoded_payload_len(wire: &mut [u8], payload_len: u32) {
        wire[24..28].copy_from_slice(&payload_len.to_le_bytes());
    }

    /// The encoded header: the first [`Header::encoded_len`] bytes of the array (the rest
    /// are zero).
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        self.encode(&mut out);
        out
    }

    /// Length of the header that starts `src`, read from its flags: what a stream reader
    /// must have buffered before [`Header::decode`]. Validates nothing else.
    pub fn wire_len(src: &[u8]) -> Result<usize, HeaderError> {
        match src.get(4..6) {
            Some(&[lo, hi]) if u16::from_le_bytes([lo, hi]) & COMPACT_BIT != 0 => {
                Ok(COMPACT_HEADER_LEN)
            }
            Some(_) => Ok(HEADER_LEN),
            None => Err(HeaderError::Truncated {
                len: src.len(),
                need: COMPACT_HEADER_LEN,
            }),
        }
    }

    /// Decodes and validates a header from the start of `src`, which may hold more bytes
    /// (the body) after it. The header's length is [`Header::encoded_len`].
    ///
    /// Every field is checked; peer-controlled input can only produce an error.
    pub fn decode(src: &[u8]) -> Result<Header, HeaderError> {
        let truncated = |need| HeaderError::Truncated {
            len: src.len(),
            need,
        };
        let head: &[u8; COMPACT_HEADER_LEN] = src
            .get(..COMPACT_HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(truncated(COMPACT_HEADER_LEN))?;
        let u16_at = |at: usize| u16::from_le_bytes([head[at], head[at + 1]]);
        let u32_at =
            |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
        let u64_from = |b: &[u8]| {
            let mut out = [0u8; 8];
            out.copy_from_slice(b);
            u64::from_le_bytes(out)
        };

        let magic = u16_at(0);
        if magic != MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        if head[2] != PROTOCOL_VERSION {
            return Err(HeaderError::UnsupportedVersion(head[2]));
        }
        let kind = FrameKind::from_wire(head[3])?;
        let raw_flags = u16_at(4);
        let compact = raw_flags & COMPACT_BIT != 0;
        let flags = Flags::from_wire(raw_flags & !COMPACT_BIT)?;
        let raw_status = u16_at(6);
        let status = Code::from_wire(raw_status).ok_or(HeaderError::InvalidStatus(raw_status))?;
        let mut header = Header {
            kind,
            flags,
            status,
            call_id: u64_from(&head[8..16]),
            method_id: u32_at(16),
            metadata_len: u32_at(20),
            payload_len: u32_at(24),
            credits: u32_at(28),
            timeout_us: 0,
            remote: RemoteBuffer::default(),
        };
        if !compact {
            let full: &[u8; HEADER_LEN] = src
                .get(..HEADER_LEN)
                .and_then(|s| s.try_into().ok())
                .ok_or(truncated(HEADER_LEN))?;
            header.timeout_us = u64_from(&full[32..40]);
            header.remote = RemoteBuffer {
                addr: u64_from(&full[40..48]),
                rkey: u32::from_le_bytes([full[48], full[49], full[50], full[51]]),
                generation: u32::from_le_bytes([full[52], full[53], full[54], full[55]]),
                len: u64_from(&full[56..64]),
            };
        }
        if header.is_compact() != compact {
            return Err(HeaderError::WrongForm { kind, compact });
        }
        header.validate()?;
        Ok(header)
    }

    /// The cross-field rules [`Header::decode`] enforces (what each kind may carry).
    ///
    /// The field types already rule out what else the decoder checks (magic, version,
    /// unknown kinds, flags or status codes), so a header that passes encodes to bytes
    /// every decoder accepts: senders check their own headers with this, without a round
    /// trip through the wire form.
    pub fn validate(&self) -> Result<(), HeaderError> {
        let kind = self.kind;
        let status_allowed = matches!(
            kind,
            FrameKind::Response
                | FrameKind::LargeGrant
                | FrameKind::LargeSourceDone
                | FrameKind::Trailers
        );
        if self.status != Code::Ok && !status_allowed {
            return Err(HeaderError::StatusOnNonResponse { kind });
        }
        let carries_metadata = matches!(
            kind,
            FrameKind::Request | FrameKind::Response | FrameKind::Trailers
        );
        let carries_payload = carries_metadata
            || matches!(
                kind,
                FrameKind::Message | FrameKind::Messages | FrameKind::WindowUpdate
            );
        if (!carries_metadata && self.metadata_len != 0)
            || (!carries_payload && self.payload_len != 0)
        {
            return Err(HeaderError::UnexpectedBody { kind });
        }
        let allowed_flags = match kind {
            FrameKind::Request => Flags::LARGE_PAYLOAD
                .with(Flags::RESPONSE_BUFFER)
                .with(Flags::STREAM),
            FrameKind::Response => Flags::LARGE_PAYLOAD.with(Flags::STREAM),
            FrameKind::Message => Flags::LARGE_PAYLOAD,
            _ => Flags::NONE,
        };
        let stream_rules = if self.flags.contains(Flags::STREAM) {
            // A streaming request advertises no response buffer (its answers are
            // messages), and stream headers carry no message and no error.
            self.flags.contains(Flags::RESPONSE_BUFFER)
                || self.payload_len != 0
                || self.status != Code::Ok
        } else {
            false
        };
        if self.flags.bits() & !allowed_flags.bits() != 0 || stream_rules {
            return Err(HeaderError::FlagsNotAllowed {
                kind,
                flags: self.flags.bits(),
            });
        }
        if kind == FrameKind::CreditOnly && self.call_id != 0 {
            return Err(HeaderError::CallIdOnCreditOnly(self.call_id));
        }
        self.validate_descriptor()
    }

    /// Which kinds and flags give the large-payload descriptor a meaning, and what it must
    /// then hold.
    fn validate_descriptor(&self) -> Result<(), HeaderError> {
        let kind = self.kind;
        let d = &self.remote;
        let bad = |reason| Err(HeaderError::BadDescriptor { kind, reason });
        match kind {
            FrameKind::Request if self.flags.contains(Flags::RESPONSE_BUFFER) => {
                if d.len == 0 {
                    return bad("an advertised response buffer has no length");
                }
            }
            FrameKind::LargeRequest => {
                if d.len == 0 {
                    return bad("a buffer request asks for 0 bytes");
                }
                if d.addr != 0 || d.rkey != 0 || d.generation != 0 {
                    return bad("a buffer request names a buffer");
                }
            }
            FrameKind::LargeGrant if self.status == Code::Ok => {
                if d.len == 0 {
                    return bad("a grant of 0 bytes");
                }
            }
            FrameKind::LargeSource => {
                if d.len == 0 {
                    return bad("a source of 0 bytes");
                }
            }
            FrameKind::LargeGrant | FrameKind::LargeSourceDone => {
                // A refusal's length is the receiver's limit; it names no buffer. A source
                // read (or cancelled) says nothing more.
                if d.addr != 0 || d.rkey != 0 || d.generation != 0 {
                    return bad("a refusal names a buffer");
                }
                if kind == FrameKind::LargeSourceDone && self.status == Code::Ok && d.len != 0 {
                    return bad("a source read carries a length");
                }
            }
            _ => {
                if !d.is_empty_descriptor() {
                    return Err(HeaderError::StrayDescriptor { kind });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
