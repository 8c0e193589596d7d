//! The wire format of rdma-rpc, shared by every transport and by the sans-IO RDMA protocol.
//!
//! * [`header`]: the frame header (a 64-byte full form and a 32-byte compact form), validated
//!   field by field, and the frame kinds and flags.
//! * [`Status`] and [`Code`]: gRPC-compatible outcomes, carried in response headers.
//! * [`MetadataMap`]: request and response metadata, and its protobuf encoding.
//! * [`body`]: the trait that lets a message serialize itself straight into a transport's
//!   own (registered) memory.
//! * [`frame`]: a frame as a transport sends ([`OutgoingFrame`]) and receives it
//!   ([`InboundFrame`]).
//! * [`auth`]: the sizes of the connection handshake's hello and proof.
//!
//! No I/O and no async runtime: `docs/PROTOCOL.md` describes the bytes.

// One module implements `bytes::BufMut` (an unsafe trait) for encoding around gathered
// bytes (`body::gather`); everything else is safe code.
#![deny(unsafe_code)]

pub mod auth;
pub mod body;
mod error;
pub mod frame;
pub mod header;
mod landing;
mod metadata;
mod status;

pub use error::{Error, HeaderError};
pub use frame::{FrameTooLarge, InboundFrame, OutgoingFrame};
pub use header::{Flags, FrameKind, Header, RemoteBuffer, COMPACT_HEADER_LEN, HEADER_LEN};
pub use landing::Landing;
pub use metadata::{MetadataMap, ResponseMetadata, BINARY_SUFFIX, MAX_METADATA_LEN};
pub use status::{Code, Status, WireStatus, MAX_STATUS_MESSAGE, STATUS_DETAILS_KEY};
