//! Errors of connecting and serving.

use rpc_core::Status;

/// What can go wrong choosing, connecting or serving a transport.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL does not name a usable endpoint.
    #[error("invalid URL '{url}': {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server could not be built (duplicate methods, runtime creation).
    #[error(transparent)]
    Core(#[from] rpc_core::Error),
    /// Listening failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Connecting failed.
    #[error(transparent)]
    Connect(#[from] Status),
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        match err {
            Error::Connect(status) => status,
            Error::InvalidUrl { .. } => Status::invalid_argument(err.to_string()),
            Error::Core(core) => core.into(),
            Error::Io(io) => io.into(),
        }
    }
}
