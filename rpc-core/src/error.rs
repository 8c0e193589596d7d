//! The crate's error enum.

use crate::Status;

pub use rpc_wire::HeaderError;

/// Errors of `rpc-core`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A peer's frame broke the wire format (header, metadata, a size limit).
    #[error(transparent)]
    Wire(#[from] rpc_wire::Error),
    /// Two methods share an id, or a service was added twice.
    #[error("method id collision: {first} and {second} both hash to {id:#010x}")]
    MethodIdCollision {
        /// First method path.
        first: String,
        /// Second method path.
        second: String,
        /// The shared id.
        id: u32,
    },
    /// An I/O error of the underlying transport.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl From<HeaderError> for Error {
    fn from(err: HeaderError) -> Error {
        Error::Wire(err.into())
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        match err {
            Error::Wire(wire) => wire.into(),
            Error::Io(io) => io.into(),
            Error::MethodIdCollision { .. } => Status::internal(err.to_string()),
        }
    }
}

/// The [`Status`] a tower service's error ends its call with, on a client's layers or a
/// server's: the status itself, or for tower's own errors `DEADLINE_EXCEEDED` (a timeout
/// layer elapsed) and `UNAVAILABLE` (a load-shed layer refused: the service was not ready);
/// `UNKNOWN` with its message for any other.
pub fn status_from_error(error: impl Into<tower::BoxError>) -> Status {
    let error = error.into();
    let error = match error.downcast::<Status>() {
        Ok(status) => return *status,
        Err(error) => error,
    };
    if error.is::<tower::timeout::error::Elapsed>() {
        Status::deadline_exceeded(format!("the call's timeout layer: {error}"))
    } else if error.is::<tower::load_shed::error::Overloaded>() {
        Status::unavailable(format!("the call's load-shed layer: {error}"))
    } else {
        Status::unknown(error.to_string())
    }
}
