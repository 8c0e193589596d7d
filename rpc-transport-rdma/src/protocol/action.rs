//! What the state machine asks the driver to do, and how the driver names its work requests.

use std::ops::Range;

use rpc_core::{FrameKind, Header, HEADER_LEN};

/// Byte offset of the `credits` field inside an encoded header.
pub const CREDITS_OFFSET: usize = 28;

/// A buffer a SEND is posted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendTarget {
    /// A slot of the send ring.
    Ring(u32),
    /// The connection's control buffer ([`crate::protocol::CONTROL_BUF_LEN`] bytes after the
    /// send ring), used only by credit-only frames.
    Control,
}

/// One SEND to post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWork {
    /// Buffer to send from.
    pub target: SendTarget,
    /// Bytes to send from the start of the buffer.
    pub len: u32,
    /// Credits this frame returns; [`SendWork::prepare`] writes them into the header.
    pub credits: u32,
    /// Post with `IBV_SEND_SIGNALED`. Unsignaled sends produce no completion on success;
    /// they are reclaimed by the next signaled completion (RC completes sends in order).
    pub signaled: bool,
    /// The frame fits the QP's inline limit; the driver may post it with `IBV_SEND_INLINE`.
    pub inline: bool,
    /// Kind of the frame (for tracing and for [`Action::SendDropped`]).
    pub kind: FrameKind,
    /// Call the frame belongs to (0 for credit-only frames).
    pub call_id: u64,
}

impl SendWork {
    /// Finishes the frame in `buf` (the target's memory, at least [`HEADER_LEN`] bytes)
    /// right before posting: writes the returned credits into a ring slot's header, or the
    /// whole credit-only frame into the control buffer.
    ///
    /// # Panics
    /// If `buf` is shorter than a header; the driver sizes buffers from the geometry.
    pub fn prepare(&self, buf: &mut [u8]) {
        match self.target {
            SendTarget::Ring(_) => {
                buf[CREDITS_OFFSET..CREDITS_OFFSET + 4]
                    .copy_from_slice(&self.credits.to_le_bytes());
            }
            SendTarget::Control => {
                let mut header = Header::new(FrameKind::CreditOnly, 0);
                header.credits = self.credits;
                header.encode(buf);
            }
        }
    }

    /// The work-request identity to post this send under.
    pub fn work_id(&self) -> WorkId {
        match self.target {
            SendTarget::Ring(slot) => WorkId::Send(slot),
            SendTarget::Control => WorkId::Control,
        }
    }
}

/// A frame delivered to the upper layer. Its slot stays out of the receive ring until
/// [`crate::protocol::Connection::release_recv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Receive slot holding the frame.
    pub slot: u32,
    /// The validated header.
    pub header: Header,
    /// Frame length (header, metadata and payload), equal to the completion's byte count.
    pub len: u32,
}

impl Received {
    /// Range of the metadata within the slot.
    pub fn metadata_range(&self) -> Range<usize> {
        HEADER_LEN..HEADER_LEN + self.header.metadata_len as usize
    }

    /// Range of the inline payload within the slot.
    pub fn payload_range(&self) -> Range<usize> {
        self.metadata_range().end..self.len as usize
    }
}

/// An instruction for the driver. Actions must be executed in the order they are polled:
/// a [`Action::PostRecv`] must be posted before any later [`Action::PostSend`], whose
/// credits may include that slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Post a RECV for this receive slot.
    PostRecv {
        /// Receive slot.
        slot: u32,
    },
    /// Call [`SendWork::prepare`] on the target's memory, then post the SEND.
    PostSend(SendWork),
    /// Send capacity is available again after a [`crate::protocol::SendError::WouldBlock`].
    Writable,
    /// A committed frame will never be sent (the connection closed first); fail its call.
    SendDropped {
        /// Send slot it occupied.
        slot: u32,
        /// Kind of the frame.
        kind: FrameKind,
        /// Call it belonged to.
        call_id: u64,
    },
}

/// Identity of a work request, packable into a 64-bit `wr_id` together with a
/// driver-chosen connection tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkId {
    /// A SEND from a send-ring slot.
    Send(u32),
    /// A SEND from the control buffer.
    Control,
    /// A RECV into a receive slot.
    Recv(u32),
}

impl WorkId {
    const TAG_SEND: u64 = 1;
    const TAG_CONTROL: u64 = 2;
    const TAG_RECV: u64 = 3;

    /// Packs the id with a connection tag: bits 63..32 tag, 31..2 slot, 1..0 kind.
    pub fn to_wr_id(self, conn: u32) -> u64 {
        let (kind, slot) = match self {
            WorkId::Send(slot) => (Self::TAG_SEND, slot),
            WorkId::Control => (Self::TAG_CONTROL, 0),
            WorkId::Recv(slot) => (Self::TAG_RECV, slot),
        };
        debug_assert!(slot < 1 << 30, "slot index beyond MAX_SLOT_COUNT");
        (u64::from(conn) << 32) | (u64::from(slot) << 2) | kind
    }

    /// Unpacks a `wr_id` made by [`WorkId::to_wr_id`]: `(connection tag, id)`.
    pub fn from_wr_id(wr_id: u64) -> Option<(u32, WorkId)> {
        let conn = (wr_id >> 32) as u32;
        let slot = ((wr_id & 0xffff_ffff) >> 2) as u32;
        let id = match wr_id & 0b11 {
            Self::TAG_SEND => WorkId::Send(slot),
            Self::TAG_CONTROL if slot == 0 => WorkId::Control,
            Self::TAG_RECV => WorkId::Recv(slot),
            _ => return None,
        };
        Some((conn, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_offset_matches_the_header_layout() {
        let mut h = Header::new(FrameKind::Request, 9);
        h.credits = 0xA1B2_C3D4;
        let bytes = h.to_bytes();
        assert_eq!(
            &bytes[CREDITS_OFFSET..CREDITS_OFFSET + 4],
            &0xA1B2_C3D4u32.to_le_bytes()
        );

        let mut buf = Header::new(FrameKind::Request, 9).to_bytes();
        let work = SendWork {
            target: SendTarget::Ring(0),
            len: 64,
            credits: 0xA1B2_C3D4,
            signaled: false,
            inline: false,
            kind: FrameKind::Request,
            call_id: 9,
        };
        work.prepare(&mut buf);
        assert_eq!(Header::decode(&buf), Ok(h));
    }

    #[test]
    fn control_prepare_writes_a_valid_credit_only_frame() {
        let mut buf = [0xEEu8; HEADER_LEN];
        let work = SendWork {
            target: SendTarget::Control,
            len: 64,
            credits: 5,
            signaled: true,
            inline: true,
            kind: FrameKind::CreditOnly,
            call_id: 0,
        };
        work.prepare(&mut buf);
        let h = Header::decode(&buf).unwrap();
        assert_eq!(
            (h.kind, h.credits, h.call_id),
            (FrameKind::CreditOnly, 5, 0)
        );
    }

    #[test]
    fn wr_id_round_trips() {
        for id in [
            WorkId::Send(0),
            WorkId::Send(65535),
            WorkId::Control,
            WorkId::Recv(7),
        ] {
            for conn in [0, 1, u32::MAX] {
                assert_eq!(WorkId::from_wr_id(id.to_wr_id(conn)), Some((conn, id)));
            }
        }
        assert_eq!(WorkId::from_wr_id(0), None);
        assert_eq!(WorkId::from_wr_id(0b110), None);
    }
}
