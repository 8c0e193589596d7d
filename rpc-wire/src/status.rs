//! gRPC-compatible status codes and the [`Status`] every failed call ends with.

use std::fmt;

/// The gRPC status code set, with the same numeric values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The client specified an invalid argument.
    InvalidArgument = 3,
    /// The deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// Some requested entity was not found.
    NotFound = 5,
    /// The entity the client attempted to create already exists.
    AlreadyExists = 6,
    /// The caller does not have permission.
    PermissionDenied = 7,
    /// Some resource has been exhausted (for example a message size limit).
    ResourceExhausted = 8,
    /// The system is not in a state required for the operation.
    FailedPrecondition = 9,
    /// The operation was aborted.
    Aborted = 10,
    /// The operation was attempted past the valid range.
    OutOfRange = 11,
    /// The operation is not implemented or not supported.
    Unimplemented = 12,
    /// Internal error: an invariant expected by the system is broken.
    Internal = 13,
    /// The service is currently unavailable (peer gone, connection lost).
    Unavailable = 14,
    /// Unrecoverable data loss or corruption.
    DataLoss = 15,
    /// The request does not have valid authentication credentials.
    Unauthenticated = 16,
}

impl Code {
    /// The code for a wire value, or `None` if it is outside the gRPC set.
    pub const fn from_wire(raw: u16) -> Option<Code> {
        Some(match raw {
            0 => Code::Ok,
            1 => Code::Cancelled,
            2 => Code::Unknown,
            3 => Code::InvalidArgument,
            4 => Code::DeadlineExceeded,
            5 => Code::NotFound,
            6 => Code::AlreadyExists,
            7 => Code::PermissionDenied,
            8 => Code::ResourceExhausted,
            9 => Code::FailedPrecondition,
            10 => Code::Aborted,
            11 => Code::OutOfRange,
            12 => Code::Unimplemented,
            13 => Code::Internal,
            14 => Code::Unavailable,
            15 => Code::DataLoss,
            16 => Code::Unauthenticated,
            _ => return None,
        })
    }

    /// The canonical gRPC name, e.g. `DEADLINE_EXCEEDED`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest status message sent to a peer, in bytes ([`Status::wire_message`]); a longer one
/// is cut.
pub const MAX_STATUS_MESSAGE: usize = 4096;

/// The outcome of a failed call: a [`Code`] and a human-readable message.
///
/// ```
/// use rpc_wire::{Code, Status};
/// let status = Status::not_found("no such user: 42");
/// assert_eq!(status.code(), Code::NotFound);
/// assert_eq!(status.to_string(), "NOT_FOUND: no such user: 42");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Status {
    code: Code,
    message: String,
}

macro_rules! status_constructors {
    ($($(#[$doc:meta])* $name:ident => $code:ident,)*) => {
        $(
            $(#[$doc])*
            pub fn $name(message: impl Into<String>) -> Status {
                Status::new(Code::$code, message)
            }
        )*
    };
}

impl Status {
    /// A status with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }

    status_constructors! {
        /// [`Code::Cancelled`].
        cancelled => Cancelled,
        /// [`Code::Unknown`].
        unknown => Unknown,
        /// [`Code::InvalidArgument`].
        invalid_argument => InvalidArgument,
        /// [`Code::DeadlineExceeded`].
        deadline_exceeded => DeadlineExceeded,
        /// [`Code::NotFound`].
        not_found => NotFound,
        /// [`Code::AlreadyExists`].
        already_exists => AlreadyExists,
        /// [`Code::PermissionDenied`].
        permission_denied => PermissionDenied,
        /// [`Code::ResourceExhausted`].
        resource_exhausted => ResourceExhausted,
        /// [`Code::FailedPrecondition`].
        failed_precondition => FailedPrecondition,
        /// [`Code::Aborted`].
        aborted => Aborted,
        /// [`Code::OutOfRange`].
        out_of_range => OutOfRange,
        /// [`Code::Unimplemented`].
        unimplemented => Unimplemented,
        /// [`Code::Internal`].
        internal => Internal,
        /// [`Code::Unavailable`].
        unavailable => Unavailable,
        /// [`Code::DataLoss`].
        data_loss => DataLoss,
        /// [`Code::Unauthenticated`].
        unauthenticated => Unauthenticated,
    }

    /// The status code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The message as it goes on the wire: cut to [`MAX_STATUS_MESSAGE`] bytes, at a
    /// character boundary.
    pub fn wire_message(&self) -> &str {
        let message = self.message.as_str();
        if message.len() <= MAX_STATUS_MESSAGE {
            return message;
        }
        let mut end = MAX_STATUS_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        &message[..end]
    }

    /// The status for a message of `actual` bytes against a limit of `limit` bytes.
    pub fn message_too_large(what: &str, actual: u64, limit: u64) -> Status {
        Status::resource_exhausted(format!(
            "{what} of {actual} bytes exceeds the maximum message size of {limit} bytes"
        ))
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Status")
            .field("code", &self.code)
            .field("message", &self.message)
            .finish()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

impl From<std::io::Error> for Status {
    fn from(err: std::io::Error) -> Status {
        use std::io::ErrorKind::*;
        let code = match err.kind() {
            TimedOut => Code::DeadlineExceeded,
            ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected | BrokenPipe
            | UnexpectedEof | AddrNotAvailable => Code::Unavailable,
            InvalidInput | InvalidData => Code::InvalidArgument,
            _ => Code::Unknown,
        };
        Status::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let short = Status::internal("fits");
        assert_eq!(short.wire_message(), "fits");
        // 'é' is two bytes: the limit falls inside the last one.
        let long = Status::internal(format!("{}é", "x".repeat(MAX_STATUS_MESSAGE - 1)));
        assert_eq!(long.wire_message().len(), MAX_STATUS_MESSAGE - 1);
        assert!(long.wire_message().bytes().all(|b| b == b'x'));
    }

    #[test]
    fn wire_values_match_grpc() {
        for raw in 0..=16u16 {
            let code = Code::from_wire(raw).expect("every gRPC code decodes");
            assert_eq!(code as u16, raw);
        }
        assert_eq!(Code::from_wire(17), None);
        assert_eq!(Code::Unavailable as u16, 14);
    }

    #[test]
    fn too_large_names_both_sizes() {
        let s = Status::message_too_large("request", 5000, 4096);
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("5000") && s.message().contains("4096"));
    }
}
