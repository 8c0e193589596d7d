//! RDMA transport for rdma-rpc: RC queue pairs set up with rdma_cm, pre-registered
//! memory-region rings, SEND/RECV under a credit protocol, large bodies by RDMA WRITE.
//!
//! Three crates, cut along their seams; this one is what users pick:
//!
//! * [`verbs`] (crate `rpc-rdma-verbs`): safe RAII owners over `rdma-sys`, one file per
//!   verbs object.
//! * [`protocol`] (crate `rpc-rdma-protocol`): the sans-IO wire protocol (credits, ring
//!   slots, large bodies); no verbs, no libibverbs, no libclang: it builds, tests and fuzzes
//!   anywhere.
//! * here, the driver: [`RdmaClient`], [`RdmaServer`], [`RdmaConfig`], which run the
//!   protocol over verbs with a completion engine shared by connections; used by `rdma-rpc`
//!   for `rdma://` URLs.

pub use rpc_rdma_protocol as protocol;
pub use rpc_rdma_verbs as verbs;

mod app_memory;
mod budget;
mod client;
mod config;
mod conn;
mod engine;
mod events;
mod kick;
mod large_pool;
mod metrics;
mod nic;
mod reaper;
mod resources;
mod response_sizes;
mod send_memory;
mod server;
mod shared_recv;

pub use app_memory::{large_body_bytes, LargeBodyBytes, RegisteredBuffer};
pub use budget::{
    process_limits, process_usage, set_process_limits, ProcessLimits, ProcessUsage,
    DEFAULT_MAX_CONNECTIONS,
};
pub use client::RdmaClient;
pub use config::{
    LargeBodies, Liveness, PollMode, Polling, RdmaConfig, Receives, Rings, SharedRecvConfig,
    DEFAULT_KEEPALIVE, DEFAULT_SEND_WINDOW, DEFAULT_SHARED_WINDOW,
};
pub use nic::Nic;
pub use server::RdmaServer;
