//! An in-memory verbs provider: the libibverbs and librdmacm calls this crate makes, done
//! over the process's own memory instead of a device. Built with `--cfg verbs_fabric`
//! (`RUSTFLAGS="--cfg verbs_fabric"`), it replaces those calls in [`crate::sys`], so every
//! safe type of the crate, and everything above it, runs unchanged without a NIC or a
//! kernel: the same code path, at a repeatable instruction count.
//!
//! # What it models
//!
//! One device, `fab0`, reachable at every address. A connection is two RC queue pairs in
//! this process, paired by the connection manager ([`cm`]). Work requests execute when they
//! are posted, on the posting thread:
//!
//! * SEND and SEND with immediate consume a receive posted at the peer (its receive queue or
//!   shared receive queue), scatter into it, and complete on both sides. With no receive
//!   posted the send waits, and every later send of its queue pair behind it, until the peer
//!   posts one, if the connection's `rnr_retry_count` is 7 ("for ever", the peer's connect
//!   parameter, as rdma_cm sets it); with a smaller count it fails with
//!   `RNR_RETRY_EXC_ERR` at once.
//! * RDMA WRITE (with immediate) and READ check the rkey the way a device does: a memory
//!   region or bound memory window of the peer's protection domain, with the right remote
//!   access, covering the whole range; else `REM_ACCESS_ERR`. A zero-length WRITE checks
//!   nothing (a liveness probe).
//! * Local SGEs must lie inside a memory region of the queue pair's protection domain
//!   (`LOC_PROT_ERR` otherwise); inline sends are copied without a key, as on hardware.
//! * An error completion moves the queue pair to the error state: its posted receives and
//!   every later request complete with `WR_FLUSH_ERR`. `rdma_disconnect` (or destroying a
//!   connected id) does the same to both queue pairs and reports `DISCONNECTED` to both ids.
//! * A completion queue holds at most its `cqe` entries; one more is an overrun, reported
//!   as an asynchronous `CQ_ERR` event, the completion lost (as on hardware).
//! * Completion channels, event channels and the asynchronous event queue are eventfds, so
//!   epoll-driven code waits on them as on the real ones.
//!
//! # What it does not model
//!
//! Time (nothing is in flight: a post is its own delivery; a finite receiver-not-ready
//! retry count fails at once), send-queue depth beyond the completion queue's, and packet
//! loss. Synchronous (channel-less) rdma_cm
//! ids wait for their own events as librdmacm's do.

mod cm;
mod cm_events;
mod cq;
mod device;
mod memory;
mod notify;
mod qp;
#[cfg(test)]
mod tests;
mod work;

pub(crate) use cm::{
    rdma_accept, rdma_bind_addr, rdma_connect, rdma_create_id, rdma_destroy_id, rdma_disconnect,
    rdma_get_request, rdma_listen, rdma_reject, rdma_resolve_addr, rdma_resolve_route,
    rdma_set_option,
};
pub(crate) use cm_events::{
    rdma_ack_cm_event, rdma_create_event_channel, rdma_destroy_event_channel, rdma_get_cm_event,
};
pub(crate) use cq::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq,
};
pub(crate) use device::{
    ___ibv_query_port, ibv_ack_async_event, ibv_alloc_pd, ibv_close_device, ibv_dealloc_pd,
    ibv_fork_init, ibv_free_device_list, ibv_get_async_event, ibv_get_device_guid,
    ibv_get_device_list, ibv_get_device_name, ibv_is_fork_initialized, ibv_open_device,
    ibv_query_device, ibv_query_gid,
};
pub(crate) use memory::{ibv_alloc_mw, ibv_dealloc_mw, ibv_dereg_mr, ibv_reg_mr};
pub(crate) use qp::{
    ibv_create_srq, ibv_destroy_srq, ibv_modify_srq, ibv_post_recv, ibv_post_send,
    ibv_post_srq_recv, rdma_create_qp, rdma_destroy_qp,
};

// Every C call answered here is `#[inline(never)]`, so that a profile sees the device's
// work, callees included, under the call's own name (`cargo xtask count` sums them).

/// Boxes what `make` builds from the address it is going to live at (the address the C
/// API hands out, which the object's events name), and leaks it to the caller.
fn boxed_at<T>(make: impl FnOnce(usize) -> T) -> *mut T {
    let ptr = Box::into_raw(Box::<T>::new_uninit()).cast::<T>();
    // SAFETY: `ptr` is a fresh allocation for one `T`, written once, here.
    unsafe { ptr.write(make(ptr as usize)) };
    ptr
}

/// Sets `errno` and returns `ret`: how the C calls report a failure.
fn fail<T>(errno: i32, ret: T) -> T {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() = errno };
    ret
}
