//! gRPC-compatible status codes and the [`Status`] every failed call ends with.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;

use crate::metadata::MetadataMap;

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

/// The metadata key a status's [details](Status::details) travel under, as in gRPC.
pub const STATUS_DETAILS_KEY: &str = "grpc-status-details-bin";

/// The outcome of a failed call: a [`Code`], a human-readable message, and optionally
/// details and metadata (tonic's `Status::with_details` and `with_metadata`).
///
/// The details are opaque bytes, by convention an encoded `google.rpc.Status` (gRPC's rich
/// error model); they travel as the metadata entry [`STATUS_DETAILS_KEY`]. Metadata and
/// details together are bounded by [`MAX_METADATA_LEN`](crate::MAX_METADATA_LEN): a
/// status whose extras do not fit reaches its peer without them, its message saying so.
///
/// ```
/// use rpc_wire::{Code, MetadataMap, Status};
/// let status = Status::not_found("no such user: 42");
/// assert_eq!(status.code(), Code::NotFound);
/// assert_eq!(status.to_string(), "NOT_FOUND: no such user: 42");
///
/// let mut metadata = MetadataMap::new();
/// metadata.insert("x-retry-after-ms", "250").unwrap();
/// let status = Status::with_details_and_metadata(
///     Code::Unavailable,
///     "draining",
///     &b"encoded google.rpc.Status"[..],
///     metadata,
/// );
/// assert_eq!(status.details(), b"encoded google.rpc.Status");
/// assert_eq!(status.metadata().get("x-retry-after-ms"), Some(&b"250"[..]));
/// ```
#[derive(Clone)]
pub struct Status {
    code: Code,
    message: String,
    /// Details and metadata; boxed so that a status without them (nearly every one) stays
    /// small.
    extra: Option<Box<Extra>>,
}

/// What few statuses carry.
#[derive(Clone, PartialEq, Eq, Default)]
struct Extra {
    details: Bytes,
    metadata: MetadataMap,
}

/// A status as the frame that ends a call carries it ([`Status::to_wire`]).
#[derive(Debug, Clone)]
pub struct WireStatus<'a> {
    /// The message, the frame's payload.
    pub message: Cow<'a, str>,
    /// The metadata, details included.
    pub metadata: Cow<'a, MetadataMap>,
}

/// `text` cut to at most `limit` bytes, at a character boundary.
fn cut(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The metadata of a status without any.
static NO_METADATA: MetadataMap = MetadataMap::new();

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
            extra: None,
        }
    }

    /// A status with `code`, `message` and `details` (opaque bytes, by convention an
    /// encoded `google.rpc.Status`).
    pub fn with_details(
        code: Code,
        message: impl Into<String>,
        details: impl Into<Bytes>,
    ) -> Status {
        Status::with_details_and_metadata(code, message, details, MetadataMap::new())
    }

    /// A status with `code`, `message` and `metadata`.
    pub fn with_metadata(code: Code, message: impl Into<String>, metadata: MetadataMap) -> Status {
        Status::with_details_and_metadata(code, message, Bytes::new(), metadata)
    }

    /// A status with `code`, `message`, `details` and `metadata`.
    pub fn with_details_and_metadata(
        code: Code,
        message: impl Into<String>,
        details: impl Into<Bytes>,
        metadata: MetadataMap,
    ) -> Status {
        let extra = Extra {
            details: details.into(),
            metadata,
        };
        Status {
            code,
            message: message.into(),
            extra: (extra != Extra::default()).then(|| Box::new(extra)),
        }
    }

    /// The status a peer sent: its code, its message (invalid UTF-8 replaced), and its
    /// metadata, out of which the entry [`STATUS_DETAILS_KEY`] is taken as the details.
    pub fn from_wire(code: Code, message: &[u8], mut metadata: MetadataMap) -> Status {
        let details = metadata.remove(STATUS_DETAILS_KEY).unwrap_or_default();
        Status::with_details_and_metadata(
            code,
            String::from_utf8_lossy(message).into_owned(),
            details,
            metadata,
        )
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

    /// The details: empty unless set.
    pub fn details(&self) -> &[u8] {
        self.extra.as_ref().map_or(&[], |extra| &extra.details)
    }

    /// The metadata: empty unless set.
    pub fn metadata(&self) -> &MetadataMap {
        self.extra
            .as_ref()
            .map_or(&NO_METADATA, |extra| &extra.metadata)
    }

    /// The metadata, mutably.
    pub fn metadata_mut(&mut self) -> &mut MetadataMap {
        &mut self.extra.get_or_insert_with(Box::default).metadata
    }

    /// What the frame that ends a call with this status carries: its message, cut to
    /// [`MAX_STATUS_MESSAGE`] bytes, and as metadata `trailers`, then the status's own
    /// metadata, then its details under [`STATUS_DETAILS_KEY`] (an entry under that key in
    /// `trailers` or the metadata gives way to them). Metadata beyond
    /// [`MAX_METADATA_LEN`](crate::MAX_METADATA_LEN) is left out whole, as
    /// [`Status::to_wire_bare`] says.
    pub fn to_wire<'a>(&'a self, trailers: &'a MetadataMap) -> WireStatus<'a> {
        let metadata = match &self.extra {
            None => Cow::Borrowed(trailers),
            Some(extra) => {
                let mut all = trailers.clone();
                all.extend(&extra.metadata);
                if !extra.details.is_empty() {
                    all.remove(STATUS_DETAILS_KEY);
                    all.insert(STATUS_DETAILS_KEY, &extra.details)
                        .expect("the details key is a binary key");
                }
                Cow::Owned(all)
            }
        };
        match metadata.checked_encoded_len() {
            Ok(_) => WireStatus {
                message: Cow::Borrowed(self.wire_message()),
                metadata,
            },
            Err(e) => self.to_wire_bare(&e.to_string()),
        }
    }

    /// The frame that ends a call with this status when its trailing metadata and details
    /// cannot go (`why`): no metadata, and a message that says so, within
    /// [`MAX_STATUS_MESSAGE`] bytes.
    pub fn to_wire_bare(&self, why: &str) -> WireStatus<'static> {
        let note = format!("[trailing metadata and details left out: {why}]");
        let note = cut(&note, MAX_STATUS_MESSAGE);
        let room = MAX_STATUS_MESSAGE.saturating_sub(note.len() + 1);
        let message = cut(&self.message, room);
        let message = if message.is_empty() {
            note.to_owned()
        } else {
            format!("{message} {note}")
        };
        WireStatus {
            message: Cow::Owned(message),
            metadata: Cow::Owned(MetadataMap::new()),
        }
    }

    /// The message as it goes on the wire: cut to [`MAX_STATUS_MESSAGE`] bytes, at a
    /// character boundary.
    pub fn wire_message(&self) -> &str {
        cut(&self.message, MAX_STATUS_MESSAGE)
    }

    /// The status for a message of `actual` bytes against a limit of `limit` bytes.
    pub fn message_too_large(what: &str, actual: u64, limit: u64) -> Status {
        Status::resource_exhausted(format!(
            "{what} of {actual} bytes exceeds the maximum message size of {limit} bytes"
        ))
    }
}

/// Statuses are equal when their code, message, details and metadata are (an empty
/// metadata set through [`Status::metadata_mut`] is no metadata).
impl PartialEq for Status {
    fn eq(&self, other: &Status) -> bool {
        self.code == other.code
            && self.message == other.message
            && self.details() == other.details()
            && self.metadata() == other.metadata()
    }
}

impl Eq for Status {}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("Status");
        f.field("code", &self.code).field("message", &self.message);
        if let Some(extra) = &self.extra {
            f.field("details_len", &extra.details.len())
                .field("metadata", &extra.metadata);
        }
        f.finish()
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
    fn details_and_metadata_cross_the_wire_as_metadata() {
        let mut metadata = MetadataMap::new();
        metadata.insert("x-shard", "7").unwrap();
        let status = Status::with_details_and_metadata(
            Code::FailedPrecondition,
            "r\u{e9}sum\u{e9} locked",
            &[0u8, 1, 2][..],
            metadata,
        );
        let mut trailers = MetadataMap::new();
        trailers.insert("x-sent", "3").unwrap();
        let wire = status.to_wire(&trailers);
        let keys: Vec<_> = wire.metadata.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["x-sent", "x-shard", STATUS_DETAILS_KEY]);
        assert_eq!(
            wire.metadata.get(STATUS_DETAILS_KEY),
            Some(&[0u8, 1, 2][..])
        );
        let none = MetadataMap::new();
        let wire = status.to_wire(&none);
        let back = Status::from_wire(
            status.code(),
            wire.message.as_bytes(),
            wire.metadata.into_owned(),
        );
        assert_eq!(back, status);
        assert_eq!(back.metadata().get(STATUS_DETAILS_KEY), None);
    }

    #[test]
    fn extras_beyond_the_metadata_limit_are_left_out_and_the_message_says_so() {
        let huge = vec![1u8; crate::MAX_METADATA_LEN];
        let status = Status::with_details(Code::Aborted, "conflict", huge.clone());
        let wire = status.to_wire(&NO_METADATA);
        assert!(wire.metadata.is_empty());
        assert!(wire
            .message
            .starts_with("conflict [trailing metadata and details left out"));
        assert!(wire.message.contains("16384"), "{}", wire.message);
        // A long message leaves room for the note, within the limit.
        let long = Status::with_details(Code::Aborted, "x".repeat(MAX_STATUS_MESSAGE), huge);
        let wire = long.to_wire(&NO_METADATA);
        assert!(wire.message.len() <= MAX_STATUS_MESSAGE);
        assert!(wire.message.ends_with(" bytes]"), "{}", wire.message);
        assert!(Status::new(Code::Ok, "")
            .to_wire_bare("too large")
            .message
            .starts_with("[trailing"));
    }

    #[test]
    fn the_details_win_over_an_entry_under_their_key() {
        let mut trailers = MetadataMap::new();
        trailers.insert(STATUS_DETAILS_KEY, b"forged").unwrap();
        let mut metadata = MetadataMap::new();
        metadata.insert(STATUS_DETAILS_KEY, b"copied").unwrap();
        let status = Status::with_details_and_metadata(Code::Internal, "x", &b"real"[..], metadata);
        let wire = status.to_wire(&trailers);
        let back = Status::from_wire(Code::Internal, b"x", wire.metadata.into_owned());
        assert_eq!(back.details(), b"real");
        assert_eq!(back.metadata().get(STATUS_DETAILS_KEY), None);
    }

    #[test]
    fn a_plain_status_stays_small_and_borrows_what_it_sends() {
        let status = Status::internal("x");
        assert!(status.details().is_empty() && status.metadata().is_empty());
        let mut trailers = MetadataMap::new();
        trailers.insert("x-t", "1").unwrap();
        let wire = status.to_wire(&trailers);
        assert!(matches!(wire.metadata, Cow::Borrowed(m) if *m == trailers));
        assert!(matches!(wire.message, Cow::Borrowed("x")));
        assert!(std::mem::size_of::<Status>() <= 40);
        assert_eq!(
            Status::with_details(Code::Internal, "x", Bytes::new()),
            status
        );
        let mut touched = status.clone();
        touched.metadata_mut();
        assert_eq!(touched, status, "empty metadata is no metadata");
        let mut tagged = status.clone();
        tagged.metadata_mut().insert("x-a", "1").unwrap();
        assert_ne!(tagged, status);
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
