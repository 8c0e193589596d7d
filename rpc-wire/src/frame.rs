//! Frames as transports see them: a header, encoded metadata and a payload.

use bytes::{Bytes, BytesMut};

use crate::body::{EmptyBody, EncodeBody};
use crate::header::Header;
use crate::landing::Landing;
use crate::metadata::MetadataMap;
use crate::status::Status;

/// A frame about to be written by a transport into its own memory.
///
/// The header's `metadata_len` and `payload_len` already match the bodies; the transport
/// sets transport-owned fields (such as `credits`) with [`OutgoingFrame::header_mut`] before
/// writing, then calls [`OutgoingFrame::write_to`] on a slice of exactly [`OutgoingFrame::len`] bytes.
pub struct OutgoingFrame<'a> {
    header: Header,
    metadata: &'a dyn EncodeBody,
    payload: &'a dyn EncodeBody,
    /// Where the response to this request may land ([`Landing`]).
    landing: Option<&'a Landing>,
}

impl std::fmt::Debug for OutgoingFrame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutgoingFrame")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Error building a frame whose parts do not fit the 32-bit length fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} of {len} bytes does not fit a frame")]
pub struct FrameTooLarge {
    /// Which part.
    pub what: &'static str,
    /// Its size.
    pub len: usize,
}

/// The body of frames without one.
pub static EMPTY: EmptyBody = EmptyBody;

impl<'a> OutgoingFrame<'a> {
    /// A frame carrying `metadata` and `payload` after `header`; lengths are filled in.
    #[inline]
    pub fn new(
        mut header: Header,
        metadata: &'a dyn EncodeBody,
        payload: &'a dyn EncodeBody,
    ) -> Result<Self, FrameTooLarge> {
        let metadata_len = metadata.encoded_len();
        let payload_len = payload.encoded_len();
        header.metadata_len = u32::try_from(metadata_len).map_err(|_| FrameTooLarge {
            what: "metadata",
            len: metadata_len,
        })?;
        header.payload_len = u32::try_from(payload_len).map_err(|_| FrameTooLarge {
            what: "payload",
            len: payload_len,
        })?;
        Ok(OutgoingFrame {
            header,
            metadata,
            payload,
            landing: None,
        })
    }

    /// The same frame, offering `landing` for the response (a unary request's).
    pub fn with_landing(mut self, landing: Option<&'a Landing>) -> Self {
        self.landing = landing;
        self
    }

    /// The memory the caller offers for the response, if any.
    pub fn landing(&self) -> Option<&'a Landing> {
        self.landing
    }

    /// A frame with no body (cancel, credit-only, ...).
    pub fn control(header: Header) -> OutgoingFrame<'static> {
        OutgoingFrame {
            header: Header {
                metadata_len: 0,
                payload_len: 0,
                ..header
            },
            metadata: &EMPTY,
            payload: &EMPTY,
            landing: None,
        }
    }

    /// The header as it will be written.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Mutable header, for transport-owned fields such as `credits`.
    pub fn header_mut(&mut self) -> &mut Header {
        &mut self.header
    }

    /// The payload alone, for transports that place it elsewhere (RDMA WRITE).
    pub fn payload(&self) -> &'a dyn EncodeBody {
        self.payload
    }

    /// The metadata alone.
    pub fn metadata(&self) -> &'a dyn EncodeBody {
        self.metadata
    }

    /// Total bytes: header, metadata and payload.
    pub fn len(&self) -> usize {
        self.header.encoded_len()
            + self.header.metadata_len as usize
            + self.header.payload_len as usize
    }

    /// Always false: a frame holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the whole frame, encoded, to `out` (byte-stream transports: the message
    /// encodes itself into the buffer the socket write reads from).
    pub fn encode_to(&self, out: &mut BytesMut) {
        let start = out.len();
        out.resize(start + self.len(), 0);
        self.write_to(&mut out[start..]);
    }

    /// Writes the whole frame into `dst`, which must be exactly [`OutgoingFrame::len`] bytes.
    pub fn write_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len(), "frame buffer has the wrong size");
        let header_len = self.header.encode(dst);
        let rest = &mut dst[header_len..];
        let (meta, payload) = rest.split_at_mut(self.header.metadata_len as usize);
        self.metadata.encode_into(meta);
        self.payload.encode_into(payload);
    }
}

/// A frame received from a peer. Its buffers may be views into transport memory (a ring
/// slot kept alive by the `Bytes` owner) and are released when dropped.
#[derive(Debug, Clone)]
pub struct InboundFrame {
    /// The validated header.
    pub header: Header,
    /// Encoded metadata ([`MetadataMap::decode_from`]).
    pub metadata: Bytes,
    /// The payload (an encoded message, the messages of a `Messages` frame after their
    /// lengths, or a status message for error responses).
    pub payload: Bytes,
}

impl InboundFrame {
    /// Decodes the metadata.
    pub fn decode_metadata(&self) -> Result<MetadataMap, crate::Error> {
        MetadataMap::decode_from(&self.metadata)
    }

    /// The status a response or trailers frame ends its call with: the header's code, the
    /// payload as its message, and its metadata and details ([`Status::from_wire`]).
    /// Metadata that cannot be read leaves the code, and the message says why.
    pub fn status(&self) -> Status {
        match self.decode_metadata() {
            Ok(metadata) => Status::from_wire(self.header.status, &self.payload, metadata),
            Err(e) => Status::new(
                self.header.status,
                format!(
                    "{} (its metadata could not be read: {e})",
                    String::from_utf8_lossy(&self.payload)
                ),
            ),
        }
    }
}
