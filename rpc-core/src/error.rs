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
