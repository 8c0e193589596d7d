//! RDMA transport for rdma-rpc: RC queue pairs set up with rdma_cm, pre-registered
//! memory-region rings, SEND/RECV under a credit protocol.
//!
//! * [`protocol`]: the sans-IO wire protocol (credits, ring slots); no verbs inside.

pub mod protocol;