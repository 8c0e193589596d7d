//! Errors of a benchmark run and the exit codes they map to.

use std::fmt;

/// Exit code of usage errors (bad arguments, bad URL), as clap uses.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of failures while running (connect, call, reply mismatch).
pub const EXIT_FAILURE: u8 = 1;

/// Why a benchmark could not run or was stopped.
#[derive(Debug)]
pub enum BenchError {
    /// The arguments do not make sense (exit code [`EXIT_USAGE`]).
    Usage(String),
    /// Setting up or running the benchmark failed (exit code [`EXIT_FAILURE`]).
    Failed(String),
    /// A reply did not match its request (exit code [`EXIT_FAILURE`]).
    Mismatch {
        /// Sequence number of the request.
        seq: u64,
        /// What differed.
        what: String,
    },
}

impl BenchError {
    /// A [`BenchError::Failed`] with `context` before the cause.
    pub fn failed(context: &str, cause: impl fmt::Display) -> Self {
        BenchError::Failed(format!("{context}: {cause}"))
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => EXIT_USAGE,
            BenchError::Failed(_) | BenchError::Mismatch { .. } => EXIT_FAILURE,
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Usage(message) | BenchError::Failed(message) => f.write_str(message),
            BenchError::Mismatch { seq, what } => {
                write!(f, "reply to call {seq} does not match its request: {what}")
            }
        }
    }
}

impl std::error::Error for BenchError {}

impl From<rdma_rpc::Error> for BenchError {
    fn from(err: rdma_rpc::Error) -> Self {
        match err {
            rdma_rpc::Error::InvalidUrl { .. } => BenchError::Usage(err.to_string()),
            other => BenchError::Failed(other.to_string()),
        }
    }
}
