//! The crate's errors: everything that can go wrong while reading a peer's frames.

use crate::header::FrameKind;
use crate::status::Status;

/// A frame header that failed validation. Every variant names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than the header's form needs were available.
    #[error("truncated header: {len} bytes, need {need}")]
    Truncated {
        /// Bytes available.
        len: usize,
        /// Bytes the header needs ([`crate::COMPACT_HEADER_LEN`] to tell its form, then
        /// the form's length).
        need: usize,
    },
    /// The magic number is wrong: not an rdma-rpc peer, or a framing error.
    #[error("bad magic 0x{0:04x} (expected 0x5252): peer is not speaking rdma-rpc")]
    BadMagic(u16),
    /// The peer speaks a protocol version this build does not.
    #[error(
        "unsupported protocol version {0} (this build speaks version {spoken})",
        spoken = crate::header::PROTOCOL_VERSION
    )]
    UnsupportedVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Flag bits this version does not define.
    #[error("unknown flag bits 0x{0:04x}")]
    UnknownFlags(u16),
    /// A status code outside the gRPC set.
    #[error("invalid status code {0}")]
    InvalidStatus(u16),
    /// Only responses (and refused grants) carry a status.
    #[error("{kind:?} frame carries a status code")]
    StatusOnNonResponse {
        /// Kind of the frame.
        kind: FrameKind,
    },
    /// Control frames carry no metadata or payload.
    #[error("{kind:?} frame carries a body")]
    UnexpectedBody {
        /// Kind of the frame.
        kind: FrameKind,
    },
    /// The kind does not allow these flags.
    #[error("{kind:?} frame may not carry flags 0x{flags:04x}")]
    FlagsNotAllowed {
        /// Kind of the frame.
        kind: FrameKind,
        /// Flag bits.
        flags: u16,
    },
    /// A large-payload descriptor on a frame that gives it no meaning.
    #[error("{kind:?} frame carries a large-payload descriptor without a flag that uses it")]
    StrayDescriptor {
        /// Kind of the frame.
        kind: FrameKind,
    },
    /// A large-payload descriptor that breaks the rules of its kind.
    #[error("{kind:?} frame carries a bad large-payload descriptor: {reason}")]
    BadDescriptor {
        /// Kind of the frame.
        kind: FrameKind,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The header is in the form its content does not call for: each header has one
    /// encoding (compact exactly when timeout, flags and descriptor are all zero).
    #[error("{kind:?} header in the {} form, which its fields do not call for", if *compact { "compact" } else { "full" })]
    WrongForm {
        /// Kind of the frame.
        kind: FrameKind,
        /// The header was compact.
        compact: bool,
    },
    /// Credit-only frames belong to no call.
    #[error("credit-only frame names call {0}")]
    CallIdOnCreditOnly(u64),
}

/// Errors of the wire format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A frame header failed validation.
    #[error("malformed frame header: {0}")]
    Header(#[from] HeaderError),
    /// Metadata failed to decode or broke a rule.
    #[error("malformed metadata: {0}")]
    Metadata(String),
    /// A frame declared more bytes than the configured limit allows.
    #[error("{what} of {actual} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Declared size.
        actual: u64,
        /// Configured limit.
        limit: u64,
    },
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        match err {
            Error::TooLarge {
                what,
                actual,
                limit,
            } => Status::message_too_large(what, actual, limit),
            Error::Header(_) | Error::Metadata(_) => Status::internal(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_version_names_the_one_spoken() {
        let message = HeaderError::UnsupportedVersion(9).to_string();
        let spoken = format!("speaks version {}", crate::header::PROTOCOL_VERSION);
        assert!(message.contains(&spoken), "{message}");
    }
}
