//! The C API this crate calls: `rdma-sys` (libibverbs and librdmacm), or with
//! `--cfg verbs_fabric` the same functions from the in-memory [`crate::fabric`]. Types and
//! constants always come from `rdma-sys`; the explicit re-export of a function shadows the
//! glob's.

pub(crate) use rdma_sys::*;

#[cfg(verbs_fabric)]
pub(crate) use crate::fabric::{
    ___ibv_query_port, ibv_ack_async_event, ibv_ack_cq_events, ibv_alloc_mw, ibv_alloc_pd,
    ibv_close_device, ibv_create_comp_channel, ibv_create_cq, ibv_create_srq, ibv_dealloc_mw,
    ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_comp_channel, ibv_destroy_cq, ibv_destroy_srq,
    ibv_fork_init, ibv_free_device_list, ibv_get_async_event, ibv_get_cq_event,
    ibv_get_device_guid, ibv_get_device_list, ibv_get_device_name, ibv_is_fork_initialized,
    ibv_modify_srq, ibv_open_device, ibv_poll_cq, ibv_post_recv, ibv_post_send, ibv_post_srq_recv,
    ibv_query_device, ibv_query_gid, ibv_reg_mr, ibv_req_notify_cq, rdma_accept, rdma_ack_cm_event,
    rdma_bind_addr, rdma_connect, rdma_create_event_channel, rdma_create_id, rdma_create_qp,
    rdma_destroy_event_channel, rdma_destroy_id, rdma_destroy_qp, rdma_disconnect,
    rdma_get_cm_event, rdma_get_request, rdma_listen, rdma_reject, rdma_resolve_addr,
    rdma_resolve_route, rdma_set_option,
};
