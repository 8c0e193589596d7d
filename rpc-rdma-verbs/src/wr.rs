//! Work requests: scatter/gather entries, send operations and flags, remote addresses.

use std::ops::{BitOr, BitOrAssign};

use crate::sys::{ibv_send_flags, ibv_sge};

/// A scatter/gather entry: `length` bytes at `addr`, inside the memory region of `lkey`.
/// Same layout as `ibv_sge`; build one with [`super::MemoryRegion::sge`].
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Sge(pub(crate) ibv_sge);

impl Sge {
    /// An entry from raw parts (prefer `MemoryRegion::sge`, which checks bounds).
    pub fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge(ibv_sge { addr, length, lkey })
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.0.addr
    }

    /// Length in bytes.
    pub fn length(&self) -> u32 {
        self.0.length
    }

    /// Local key of the region.
    pub fn lkey(&self) -> u32 {
        self.0.lkey
    }
}

impl std::fmt::Debug for Sge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sge")
            .field("addr", &format_args!("{:#x}", self.0.addr))
            .field("length", &self.0.length)
            .field("lkey", &format_args!("{:#x}", self.0.lkey))
            .finish()
    }
}

/// Where an RDMA operation lands at the peer: a virtual address inside one of its memory
/// regions, and that region's rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

impl RemoteAddr {
    /// The address `bytes` further into the same region.
    pub fn offset(self, bytes: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(bytes),
            rkey: self.rkey,
        }
    }
}

/// The operation of a send-queue work request. Immediate data is given in host byte order
/// (converted to network order on the wire; [`super::WorkCompletion::imm_data`] converts back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes a receive at the peer.
    Send,
    /// SEND with 32 bits of immediate data, delivered in the peer's receive completion.
    SendWithImm(u32),
    /// RDMA WRITE into the peer's memory; no receive consumed, the peer sees no completion.
    RdmaWrite(RemoteAddr),
    /// RDMA WRITE plus immediate data: consumes a receive at the peer, which gets a
    /// `RecvRdmaWithImm` completion after the data is in place.
    RdmaWriteWithImm(RemoteAddr, u32),
    /// RDMA READ from the peer's memory into the local SGEs (which need `LOCAL_WRITE`).
    RdmaRead(RemoteAddr),
}

/// Flags of a send work request (`IBV_SEND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(u32);

impl SendFlags {
    /// No flags: unsignaled (no completion unless it fails, or the QP signals all).
    pub const NONE: SendFlags = SendFlags(0);
    /// Generate a completion when done.
    pub const SIGNALED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SIGNALED.0);
    /// Copy the data into the work request at post time (up to `max_inline_data` bytes); the
    /// buffer is free again when the post returns and needs no registration.
    pub const INLINE: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_INLINE.0);
    /// Ask the peer's completion channel to wake up for this one (solicited event).
    pub const SOLICITED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SOLICITED.0);
    /// Wait for earlier RDMA READs/atomics to finish before starting this request.
    pub const FENCE: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_FENCE.0);

    /// Whether all flags of `other` are set.
    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw `IBV_SEND_*` bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for SendFlags {
    fn bitor_assign(&mut self, rhs: SendFlags) {
        self.0 |= rhs.0;
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct SendRequest<'a> {
    /// Echoed in the completion.
    pub wr_id: u64,
    /// Local data (source; destination for `RdmaRead`).
    pub sges: &'a [Sge],
    pub op: SendOp,
    pub flags: SendFlags,
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvRequest<'a> {
    /// Echoed in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND's payload goes.
    pub sges: &'a [Sge],
}
