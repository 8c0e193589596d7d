//! Work completions (`ibv_wc`): one finished (or failed) work request.

use std::fmt;

use crate::sys::{ibv_wc, ibv_wc_flags, ibv_wc_opcode};

use super::error::{VerbsError, WcError};

/// One completion, filled in by [`super::CompletionQueue::poll`]. `repr(transparent)` over
/// `ibv_wc`, so a `[WorkCompletion]` is the `ibv_wc` array the verb fills.
#[repr(transparent)]
pub struct WorkCompletion(ibv_wc);

impl Clone for WorkCompletion {
    fn clone(&self) -> Self {
        // SAFETY: `ibv_wc` is plain old data (integers and an integer union), so a bitwise
        // copy is a valid, independent value.
        WorkCompletion(unsafe { std::ptr::read(&self.0) })
    }
}

impl Default for WorkCompletion {
    fn default() -> Self {
        // SAFETY: `ibv_wc` is plain old data (integers and an integer union); all-zero is valid.
        WorkCompletion(unsafe { std::mem::zeroed() })
    }
}

/// What kind of work request completed. Only meaningful for successful completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompareSwap,
    FetchAdd,
    BindMw,
    LocalInvalidate,
    /// A receive consumed by a SEND (or SEND with immediate).
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
    Other(u32),
}

impl WorkCompletion {
    /// A zeroed completion array of `n` entries, to poll into.
    pub fn array(n: usize) -> Vec<WorkCompletion> {
        (0..n).map(|_| WorkCompletion::default()).collect()
    }

    /// The `wr_id` of the work request.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// `Ok` for success, else the named failure.
    pub fn status(&self) -> Result<(), WcError> {
        match WcError::from_status(self.0.status) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Whether the work request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status().is_ok()
    }

    /// The status as a [`VerbsError::WorkCompletion`], for `?`.
    pub fn result(&self) -> Result<(), VerbsError> {
        self.status().map_err(|error| VerbsError::WorkCompletion {
            wr_id: self.0.wr_id,
            error,
            vendor_err: self.0.vendor_err,
        })
    }

    /// The completed operation (undefined by the spec for failed completions).
    pub fn opcode(&self) -> WcOpcode {
        match self.0.opcode {
            ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
            ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            ibv_wc_opcode::IBV_WC_COMP_SWAP => WcOpcode::CompareSwap,
            ibv_wc_opcode::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
            ibv_wc_opcode::IBV_WC_BIND_MW => WcOpcode::BindMw,
            ibv_wc_opcode::IBV_WC_LOCAL_INV => WcOpcode::LocalInvalidate,
            ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }

    /// Bytes received (receive completions only).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Immediate data in host byte order, if the message carried any.
    pub fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
            return None;
        }
        // SAFETY: with IBV_WC_WITH_IMM set the union holds `imm_data`; both members are u32,
        // so any bit pattern is valid either way.
        Some(u32::from_be(unsafe {
            self.0.imm_data_invalidated_rkey_union.imm_data
        }))
    }

    /// Number of the local QP the work request belonged to.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// Provider-specific error detail.
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// The underlying `ibv_wc`.
    pub fn raw(&self) -> &ibv_wc {
        &self.0
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("WorkCompletion");
        d.field("wr_id", &self.wr_id())
            .field("status", &self.status());
        if self.is_ok() {
            d.field("opcode", &self.opcode())
                .field("byte_len", &self.byte_len())
                .field("imm_data", &self.imm_data());
        } else {
            d.field("vendor_err", &self.vendor_err());
        }
        d.field("qp_num", &self.qp_num()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_completion_is_a_successful_send() {
        let wc = WorkCompletion::default();
        assert!(wc.is_ok());
        assert_eq!(wc.opcode(), WcOpcode::Send);
        assert_eq!(wc.imm_data(), None);
        assert_eq!(
            std::mem::size_of::<WorkCompletion>(),
            std::mem::size_of::<ibv_wc>()
        );
    }
}
