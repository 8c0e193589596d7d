//! The RDMA transport: verbs resources driven by the [`crate::protocol`] state machine.
//!
//! * [`RdmaConfig`], [`PollMode`]: ring geometry and completion processing.
//! * [`RdmaClient`]: a `rpc_core::ClientTransport` over one RC queue pair.
//! * [`RdmaServer`]: an rdma_cm listener serving a `rpc_core` dispatcher.

mod budget;
mod client;
mod config;
mod conn;
mod engine;
mod events;
mod kick;
mod large_pool;
mod metrics;
mod reaper;
mod resources;
mod response_sizes;
mod send_memory;
mod server;
mod shared_recv;

pub use budget::{
    process_limits, process_usage, set_process_limits, ProcessLimits, ProcessUsage,
    DEFAULT_MAX_CONNECTIONS,
};
pub use client::RdmaClient;
pub use config::{
    PollMode, RdmaConfig, Receives, SharedRecvConfig, DEFAULT_KEEPALIVE, DEFAULT_SEND_WINDOW,
    DEFAULT_SHARED_WINDOW,
};
pub use server::RdmaServer;
