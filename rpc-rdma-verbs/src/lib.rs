//! Safe owners of verbs objects over `rdma-sys`: one file per object, each an RAII type whose
//! `Drop` calls the matching destroy verb.
//!
//! | object | type | file |
//! |---|---|---|
//! | rdma_cm event channel, events | [`EventChannel`], [`CmEvent`] | `event_channel.rs` |
//! | rdma_cm id (resolve, listen, connect, accept, disconnect) | [`CmId`], [`ConnParam`] | `cm_id.rs` |
//! | device list | [`devices`], [`DeviceInfo`] | `device.rs` |
//! | device context (query device/port/GID) | [`Context`] | `context.rs` |
//! | asynchronous events of a context | [`AsyncEvent`], [`AsyncEventKind`] | `async_event.rs` |
//! | protection domain | [`ProtectionDomain`] | `pd.rs` |
//! | memory region, page-aligned buffer | [`MemoryRegion`], [`AlignedBuffer`] | `mr.rs` |
//! | memory window (type 2) | [`MemoryWindow`] | `mw.rs` |
//! | completion channel | [`CompletionChannel`] | `comp_channel.rs` |
//! | completion queue | [`CompletionQueue`] | `cq.rs` |
//! | work completion, its errors | [`WorkCompletion`], [`WcError`] | `wc.rs`, `error.rs` |
//! | queue pair (RC, via rdma_cm) | [`QueuePair`], [`QpCapabilities`] | `qp.rs` |
//! | shared receive queue | [`SharedReceiveQueue`] | `srq.rs` |
//! | work requests | [`SendRequest`], [`RecvRequest`], [`Sge`], [`SendOp`] | `wr.rs` |
//! | skip-or-require-a-device helpers for tests | [`test_support`] | `test_support.rs` |
//!
//! Every libibverbs and librdmacm call goes through `sys.rs`. Built with
//! `RUSTFLAGS="--cfg verbs_fabric"`, those calls are answered by an in-memory provider
//! (`fabric/`): one device, `fab0`, whose queue pairs connect to each other within the
//! process and execute work requests as they are posted, checking keys and ranges as a device
//! does. Everything above this crate then runs without a NIC, at a repeatable instruction
//! count (`cargo xtask count`).
//!
//! # Teardown order
//!
//! Children hold `Arc`s to their parents, so a parent is destroyed only after its last child,
//! whatever order the owner drops things in:
//!
//! ```text
//! QueuePair ──> CompletionQueue ──> CompletionChannel ──> Context
//!     │ │  └──> ProtectionDomain ──────────────────────────┘
//!     │ └─────> SharedReceiveQueue ──> ProtectionDomain
//!     └──────> CmId (rdma_cm_id) ──> EventChannel
//! MemoryRegion ──> ProtectionDomain <── MemoryWindow
//! ```
//!
//! A QP is destroyed before its CQs, PD and `cm_id`; an MR is deregistered before its PD and
//! before its buffer is freed. What types cannot express: memory named by an outstanding work
//! request must stay registered until its completion is polled — hence
//! [`QueuePair::post_send`] and [`QueuePair::post_recv`] are `unsafe` with that contract
//! (inline sends, [`QueuePair::post_send_inline`], copy the data and are safe). Drop the QP
//! (or disconnect and drain the flushed completions) before dropping MRs in use.
//!
//! # rdma_cm modes
//!
//! [`CmId::new_sync`] gives blocking calls (resolve, connect, accept, [`CmId::get_request`]);
//! [`CmId::new`] on an [`EventChannel`] gives non-blocking calls whose outcome arrives as
//! [`CmEvent`]s on the channel's fd. Contexts of rdma_cm ids ([`CmId::context`]) are owned by
//! librdmacm; build the PD, CQs and MRs of a connection on them.
//!
//! # Threads
//!
//! Every type here is `Send + Sync`: libibverbs verbs are thread-safe, and calls on one
//! rdma_cm id are serialized by a lock inside [`CmId`] (shared with its QP).
//!
//! # Fork safety
//!
//! Registered memory is pinned and the device writes it by physical page. With old kernels
//! (before 5.13) or rdma-core (before v35), a `fork()` makes those pages copy-on-write and the
//! parent's next write moves its copy away from what the device sees, silently breaking
//! RDMA; `ibv_fork_init()` (marking registrations `MADV_DONTFORK`) prevents that but must run
//! before any other verb. Call [`fork_init`] first thing if the process may fork while memory
//! is registered (`std::process::Command` usually uses `posix_spawn`/`vfork` and is fine).
//! On current kernels [`fork_status`] reports [`ForkStatus::Unneeded`]. Either way the child
//! cannot use the parent's verbs objects.

mod async_event;
mod cm_id;
mod comp_channel;
mod context;
mod cq;
mod device;
mod error;
mod event_channel;
#[cfg(verbs_fabric)]
mod fabric;
mod locked;
mod mr;
mod mw;
mod pd;
mod qp;
mod sockaddr;
mod srq;
mod sys;
pub mod test_support;
mod wc;
mod wr;

pub use async_event::{AsyncEvent, AsyncEventKind, EventSubject};
pub use cm_id::{
    CmId, ConnParam, ConnectRequest, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA,
    MAX_REJECT_PRIVATE_DATA, READS_THE_DEVICE_ALLOWS,
};
pub use comp_channel::CompletionChannel;
pub use context::{Context, DeviceAttr, LinkLayer, PortAttr, PortState};
pub use cq::CompletionQueue;
pub use device::{devices, DeviceInfo};
pub use error::{Result, VerbsError, WcError};
pub use event_channel::{CmEvent, CmEventKind, EventChannel, PeerConnParam};
pub use mr::{AccessFlags, AlignedBuffer, Borrowed, MemoryRegion, StableBuffer};
pub use mw::MemoryWindow;
pub use pd::ProtectionDomain;
pub use qp::{QpCapabilities, QpInitAttr, QueuePair};
pub use srq::SharedReceiveQueue;
pub use wc::{WcOpcode, WorkCompletion};
pub use wr::{RecvRequest, RemoteAddr, SendFlags, SendOp, SendRequest, Sge};

/// Whether libibverbs protects registered memory across `fork()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkStatus {
    /// Not protected: do not fork while memory is registered (or call [`fork_init`] first).
    Disabled,
    /// [`fork_init`] (or `RDMAV_FORK_SAFE=1`) enabled protection.
    Enabled,
    /// The kernel keeps registered pages correct across fork by itself.
    Unneeded,
}

/// `ibv_fork_init()`: call before creating any verbs object if the process may fork while
/// memory is registered. A no-op where the kernel does not need it.
pub fn fork_init() -> Result<()> {
    // SAFETY: no preconditions beyond "before other verbs", which is only about effect.
    error::check("ibv_fork_init", unsafe { crate::sys::ibv_fork_init() })
}

/// `ibv_is_fork_initialized()`.
pub fn fork_status() -> ForkStatus {
    // SAFETY: no preconditions.
    match unsafe { crate::sys::ibv_is_fork_initialized() } {
        crate::sys::IBV_FORK_ENABLED => ForkStatus::Enabled,
        crate::sys::IBV_FORK_UNNEEDED => ForkStatus::Unneeded,
        _ => ForkStatus::Disabled,
    }
}
