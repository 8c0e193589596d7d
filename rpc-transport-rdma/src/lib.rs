//! RDMA transport for rdma-rpc: RC queue pairs set up with rdma_cm, pre-registered
//! memory-region rings, SEND/RECV under a credit protocol.
//!
//! * [`verbs`]: safe RAII owners over `rdma-sys` (one file per verbs object).
//! * [`protocol`]: the sans-IO wire protocol (credits, ring slots); no verbs inside.
//! * [`RdmaClient`], [`RdmaServer`], [`RdmaConfig`]: the transport that drives the protocol
//!   with verbs, used by `rdma-rpc` for `rdma://` URLs.

pub mod protocol;
mod transport;
pub mod verbs;

pub use transport::{PollMode, RdmaClient, RdmaConfig, RdmaServer};
