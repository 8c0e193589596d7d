//! The verbs layer's one error type, and work-completion failures by name.

use std::fmt;
use std::os::raw::c_int;

use crate::sys::ibv_wc_status;

/// Result of a verbs-layer operation.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

/// Everything the verbs layer reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// A verb returned an error; `errno` is the OS error number it reported.
    #[error("{verb} failed: {}", std::io::Error::from_raw_os_error(*errno))]
    Os {
        /// The C function that failed, e.g. `ibv_reg_mr`.
        verb: &'static str,
        /// The OS error number (`libc::ENOMEM`, ...).
        errno: i32,
    },
    /// Posting work requests failed; the first `posted` requests of the list were posted
    /// (their completions will arrive), the rest were not.
    #[error("{verb} failed after posting {posted} work request(s): {}", std::io::Error::from_raw_os_error(*errno))]
    Post {
        /// `ibv_post_send` or `ibv_post_recv`.
        verb: &'static str,
        /// The OS error number (`ENOMEM`: the queue is full; `EINVAL`: a bad request).
        errno: i32,
        /// Requests posted before the failing one.
        posted: usize,
    },
    /// No RDMA device (or none with the requested name).
    #[error("no RDMA device{}", name.as_ref().map(|n| format!(" named {n:?}")).unwrap_or_default())]
    NoDevice {
        /// The name that was asked for, if any.
        name: Option<String>,
    },
    /// The caller passed something the verb cannot take; nothing was done.
    #[error("{verb}: {reason}")]
    InvalidArgument {
        /// The operation that refused.
        verb: &'static str,
        /// Why.
        reason: String,
    },
    /// A work request completed with an error status.
    #[error(
        "work request {wr_id:#x} completed with error: {error} (vendor error {vendor_err:#x})"
    )]
    WorkCompletion {
        /// The `wr_id` of the failed work request.
        wr_id: u64,
        /// The completion status.
        error: WcError,
        /// Provider-specific detail.
        vendor_err: u32,
    },
    /// An rdma_cm operation ended with an event other than the one that means success.
    #[error("rdma_cm: expected {expected} but got {got} (status {status})")]
    UnexpectedCmEvent {
        /// The event that would have meant success.
        expected: &'static str,
        /// The event that arrived.
        got: String,
        /// The event's status (a negative errno, or a CM reject reason).
        status: i32,
    },
}

impl VerbsError {
    /// The OS error number, for [`VerbsError::Os`] and [`VerbsError::Post`].
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Os { errno, .. } | VerbsError::Post { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// True for `EAGAIN`/`EWOULDBLOCK` (a non-blocking channel had nothing to read).
    pub fn is_would_block(&self) -> bool {
        self.errno() == Some(libc::EAGAIN)
    }

    /// The error in `errno` after `verb` failed.
    pub(crate) fn last_os(verb: &'static str) -> Self {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .filter(|&e| e != 0)
            .unwrap_or(libc::EIO);
        VerbsError::Os { verb, errno }
    }

    pub(crate) fn invalid(verb: &'static str, reason: impl Into<String>) -> Self {
        VerbsError::InvalidArgument {
            verb,
            reason: reason.into(),
        }
    }
}

/// Maps a verb's return value to a result. Verbs report errors in three styles: `-1` with
/// `errno` set (librdmacm, most of libibverbs), a positive errno (`ibv_post_send`,
/// `ibv_req_notify_cq`, `ibv_query_device`, ...) or a negative errno.
pub(crate) fn check(verb: &'static str, ret: c_int) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(error_from_ret(verb, ret))
    }
}

/// The error for a non-zero return value of `verb` (see [`check`]).
pub(crate) fn error_from_ret(verb: &'static str, ret: c_int) -> VerbsError {
    match ret {
        -1 => VerbsError::last_os(verb),
        n => VerbsError::Os {
            verb,
            errno: n.checked_abs().filter(|&e| e != 0).unwrap_or(libc::EIO),
        },
    }
}

/// Why a work request failed (`ibv_wc_status` other than `IBV_WC_SUCCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcError {
    /// A posted receive buffer was too small for the message, or a send exceeded limits.
    LocalLength,
    /// Internal QP consistency error (e.g. too many SGEs).
    LocalQpOperation,
    /// Internal EE context error.
    LocalEecOperation,
    /// An SGE referred to memory not covered by a valid lkey with the needed access.
    LocalProtection,
    /// The QP went to the error state; outstanding work requests are flushed.
    WorkRequestFlushed,
    /// A memory-window bind failed.
    MemoryWindowBind,
    /// Unexpected transport opcode from the responder.
    BadResponse,
    /// Protection error on a local buffer targeted by an incoming RDMA operation.
    LocalAccess,
    /// The responder found the request invalid (e.g. message longer than its receive).
    RemoteInvalidRequest,
    /// The remote side rejected an RDMA access: bad rkey, range or access rights.
    RemoteAccess,
    /// The responder could not complete the operation (e.g. its receive queue broke).
    RemoteOperation,
    /// Transport retries exhausted: the peer did not acknowledge (gone, or link down).
    RetryExceeded,
    /// The peer had no receive posted and the RNR retries (`rnr_retry_count`) ran out.
    RnrRetryExceeded,
    /// Reliable-datagram domain violation.
    LocalRddViolation,
    /// Invalid RD request at the responder.
    RemoteInvalidRdRequest,
    /// The responder aborted the operation.
    RemoteAborted,
    /// Invalid EE context number.
    InvalidEecn,
    /// Invalid EE context state.
    InvalidEecState,
    /// Fatal device error.
    Fatal,
    /// Response timeout.
    ResponseTimeout,
    /// Other error.
    General,
    /// Tag-matching error.
    TagMatching,
    /// Tag-matching rendezvous incomplete.
    TagMatchingRendezvousIncomplete,
    /// A status this crate does not know.
    Unknown(u32),
}

impl WcError {
    /// The error for a work-completion status, `None` for `IBV_WC_SUCCESS`.
    pub fn from_status(status: ibv_wc_status::Type) -> Option<WcError> {
        use ibv_wc_status::*;
        Some(match status {
            IBV_WC_SUCCESS => return None,
            IBV_WC_LOC_LEN_ERR => WcError::LocalLength,
            IBV_WC_LOC_QP_OP_ERR => WcError::LocalQpOperation,
            IBV_WC_LOC_EEC_OP_ERR => WcError::LocalEecOperation,
            IBV_WC_LOC_PROT_ERR => WcError::LocalProtection,
            IBV_WC_WR_FLUSH_ERR => WcError::WorkRequestFlushed,
            IBV_WC_MW_BIND_ERR => WcError::MemoryWindowBind,
            IBV_WC_BAD_RESP_ERR => WcError::BadResponse,
            IBV_WC_LOC_ACCESS_ERR => WcError::LocalAccess,
            IBV_WC_REM_INV_REQ_ERR => WcError::RemoteInvalidRequest,
            IBV_WC_REM_ACCESS_ERR => WcError::RemoteAccess,
            IBV_WC_REM_OP_ERR => WcError::RemoteOperation,
            IBV_WC_RETRY_EXC_ERR => WcError::RetryExceeded,
            IBV_WC_RNR_RETRY_EXC_ERR => WcError::RnrRetryExceeded,
            IBV_WC_LOC_RDD_VIOL_ERR => WcError::LocalRddViolation,
            IBV_WC_REM_INV_RD_REQ_ERR => WcError::RemoteInvalidRdRequest,
            IBV_WC_REM_ABORT_ERR => WcError::RemoteAborted,
            IBV_WC_INV_EECN_ERR => WcError::InvalidEecn,
            IBV_WC_INV_EEC_STATE_ERR => WcError::InvalidEecState,
            IBV_WC_FATAL_ERR => WcError::Fatal,
            IBV_WC_RESP_TIMEOUT_ERR => WcError::ResponseTimeout,
            IBV_WC_GENERAL_ERR => WcError::General,
            IBV_WC_TM_ERR => WcError::TagMatching,
            IBV_WC_TM_RNDV_INCOMPLETE => WcError::TagMatchingRendezvousIncomplete,
            other => WcError::Unknown(other),
        })
    }

    /// True for a flushed request: the QP is in the error state (after a disconnect or an
    /// earlier failure) and this request never ran. Usually not the root cause.
    pub fn is_flush(self) -> bool {
        self == WcError::WorkRequestFlushed
    }
}

impl fmt::Display for WcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            WcError::LocalLength => "local length error",
            WcError::LocalQpOperation => "local QP operation error",
            WcError::LocalEecOperation => "local EE context operation error",
            WcError::LocalProtection => "local protection error",
            WcError::WorkRequestFlushed => "work request flushed (QP in error state)",
            WcError::MemoryWindowBind => "memory window bind error",
            WcError::BadResponse => "bad response",
            WcError::LocalAccess => "local access error",
            WcError::RemoteInvalidRequest => "remote invalid request",
            WcError::RemoteAccess => {
                "remote access error (the peer refused an RDMA access: bad key or range)"
            }
            WcError::RemoteOperation => "remote operation error",
            WcError::RetryExceeded => {
                "transport retry counter exceeded (the peer is unreachable or dead)"
            }
            WcError::RnrRetryExceeded => {
                "RNR retry counter exceeded (no receive posted at the peer)"
            }
            WcError::LocalRddViolation => "local RDD violation",
            WcError::RemoteInvalidRdRequest => "remote invalid RD request",
            WcError::RemoteAborted => "remote aborted",
            WcError::InvalidEecn => "invalid EE context number",
            WcError::InvalidEecState => "invalid EE context state",
            WcError::Fatal => "fatal error",
            WcError::ResponseTimeout => "response timeout",
            WcError::General => "general error",
            WcError::TagMatching => "tag matching error",
            WcError::TagMatchingRendezvousIncomplete => "tag matching rendezvous incomplete",
            WcError::Unknown(status) => {
                return write!(f, "unknown work completion status {status}")
            }
        };
        f.write_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_names() {
        assert_eq!(WcError::from_status(ibv_wc_status::IBV_WC_SUCCESS), None);
        assert_eq!(
            WcError::from_status(ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR),
            Some(WcError::RnrRetryExceeded)
        );
        assert_eq!(
            WcError::from_status(ibv_wc_status::IBV_WC_REM_ACCESS_ERR),
            Some(WcError::RemoteAccess)
        );
        assert!(
            WcError::from_status(ibv_wc_status::IBV_WC_WR_FLUSH_ERR).is_some_and(WcError::is_flush)
        );
        assert_eq!(WcError::from_status(999), Some(WcError::Unknown(999)));
    }

    #[test]
    fn check_maps_all_error_styles() {
        assert!(check("x", 0).is_ok());
        assert_eq!(
            check("x", libc::EINVAL).unwrap_err().errno(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            check("x", -libc::ENOMEM).unwrap_err().errno(),
            Some(libc::ENOMEM)
        );
    }
}
