//! The fabric's one device, `fab0`: its list, context, attributes, protection domains and
//! asynchronous events.

use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::OnceLock;

use rdma_sys::{
    __be64, ibv_async_event, ibv_context, ibv_device, ibv_device_attr, ibv_event_type,
    ibv_fork_status, ibv_gid, ibv_mtu, ibv_pd, ibv_port_attr, ibv_port_state, IBV_FORK_UNNEEDED,
};

use super::fail;
use super::notify::Mailbox;

/// Largest queue, completion queue and shared receive queue the device grants.
pub(super) const MAX_QUEUE: u32 = 1 << 16;
/// Largest number of SGEs in one work request.
pub(super) const MAX_SGE: u32 = 32;
/// Largest inline payload.
pub(super) const MAX_INLINE: u32 = 256;
const NAME: &[u8] = b"fab0\0";

/// The device, its context and the context's asynchronous events, alive for the process.
pub(super) struct Device {
    list: [*mut ibv_device; 2],
    context: *mut ibv_context,
    async_events: Mailbox<AsyncEvent>,
}

// SAFETY: the raw pointers name leaked, never-freed structs that are only read after
// construction; the mailbox is thread-safe.
unsafe impl Send for Device {}
// SAFETY: see `Send`.
unsafe impl Sync for Device {}

/// One asynchronous event: its type and the object it is about (the pointer the C API
/// hands out, compared but never followed here).
#[derive(Debug, Clone, Copy)]
pub(super) struct AsyncEvent {
    pub(super) kind: ibv_event_type,
    pub(super) element: usize,
}

/// The process's device, made on first use.
pub(super) fn device() -> &'static Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE.get_or_init(|| {
        let async_events = Mailbox::new().expect("an eventfd for the fabric's async events");
        // SAFETY: plain old data; all-zero is valid (null pointers, zero counts).
        let mut dev: ibv_device = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut ctx: ibv_context = unsafe { std::mem::zeroed() };
        for (dst, &src) in dev.name.iter_mut().zip(NAME) {
            *dst = src as c_char;
        }
        let dev = Box::into_raw(Box::new(dev));
        ctx.device = dev;
        ctx.async_fd = async_events.fd();
        ctx.num_comp_vectors = 1;
        Device {
            list: [dev, ptr::null_mut()],
            context: Box::into_raw(Box::new(ctx)),
            async_events,
        }
    })
}

impl Device {
    pub(super) fn context(&self) -> *mut ibv_context {
        self.context
    }

    /// Queues an asynchronous event about `element`.
    pub(super) fn raise(&self, kind: ibv_event_type, element: usize) {
        self.async_events.push(AsyncEvent { kind, element });
    }

    /// Drops queued events about `element`, which is being destroyed.
    pub(super) fn forget(&self, element: usize) {
        self.async_events.retain(|e| e.element != element);
    }
}

#[inline(never)]
pub unsafe fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    if !num_devices.is_null() {
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { *num_devices = 1 };
    }
    // The list is never written through: `ibv_free_device_list` does nothing.
    device().list.as_ptr().cast_mut()
}

#[inline(never)]
pub unsafe fn ibv_free_device_list(_list: *mut *mut ibv_device) {}

#[inline(never)]
pub unsafe fn ibv_get_device_name(_device: *mut ibv_device) -> *const c_char {
    NAME.as_ptr().cast()
}

#[inline(never)]
pub unsafe fn ibv_get_device_guid(_device: *mut ibv_device) -> __be64 {
    0xfab0_u64.to_be()
}

#[inline(never)]
pub unsafe fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    if dev == device().list[0] {
        device().context
    } else {
        fail(libc::ENODEV, ptr::null_mut())
    }
}

#[inline(never)]
pub unsafe fn ibv_close_device(_context: *mut ibv_context) -> c_int {
    0
}

#[inline(never)]
pub unsafe fn ibv_query_device(_context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    let max = MAX_QUEUE as c_int;
    // SAFETY: `ibv_device_attr` is plain old data; all-zero is valid.
    let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
    a.node_guid = 0xfab0_u64.to_be();
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 4096;
    (a.max_qp, a.max_qp_wr, a.max_cq, a.max_cqe) = (max, max, max, max);
    (a.max_mr, a.max_pd, a.max_srq, a.max_srq_wr) = (max, max, max, max);
    (a.max_sge, a.max_srq_sge) = (MAX_SGE as c_int, MAX_SGE as c_int);
    (a.max_qp_rd_atom, a.max_qp_init_rd_atom) = (16, 16);
    a.max_mw = max;
    a.phys_port_cnt = 1;
    // SAFETY: the caller passes a valid out-pointer.
    unsafe { *attr = a };
    0
}

#[inline(never)]
pub unsafe fn ___ibv_query_port(
    _context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    if port_num != 1 {
        return libc::EINVAL;
    }
    // SAFETY: `ibv_port_attr` is plain old data; all-zero is valid.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    a.state = ibv_port_state::IBV_PORT_ACTIVE;
    a.max_mtu = ibv_mtu::IBV_MTU_4096;
    a.active_mtu = ibv_mtu::IBV_MTU_4096;
    a.gid_tbl_len = 1;
    a.max_msg_sz = 1 << 31;
    a.link_layer = 2; // Ethernet: RoCE
                      // SAFETY: the caller passes a valid out-pointer.
    unsafe { *attr = a };
    0
}

#[inline(never)]
pub unsafe fn ibv_query_gid(
    _context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    if port_num != 1 || index != 0 {
        return fail(libc::EINVAL, -1);
    }
    let mut raw = [0u8; 16];
    raw[10..].copy_from_slice(&[0xff, 0xff, 127, 0, 0, 1]);
    // SAFETY: the caller passes a valid out-pointer.
    unsafe { (*gid).raw = raw };
    0
}

#[inline(never)]
pub unsafe fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: `ibv_pd` is plain old data; all-zero is valid.
    let mut pd: ibv_pd = unsafe { std::mem::zeroed() };
    pd.context = context;
    Box::into_raw(Box::new(pd))
}

#[inline(never)]
pub unsafe fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: `pd` came from `ibv_alloc_pd` and is deallocated once.
    drop(unsafe { Box::from_raw(pd) });
    0
}

#[inline(never)]
pub unsafe fn ibv_get_async_event(
    _context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    match device().async_events.take() {
        Ok(e) => {
            // SAFETY: `ibv_async_event` is plain old data; all-zero is valid.
            let mut raw: ibv_async_event = unsafe { std::mem::zeroed() };
            raw.event_type = e.kind;
            raw.element.qp = e.element as *mut _;
            // SAFETY: the caller passes a valid out-pointer.
            unsafe { *event = raw };
            0
        }
        Err(e) => fail(e.raw_os_error().unwrap_or(libc::EIO), -1),
    }
}

#[inline(never)]
pub unsafe fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

#[inline(never)]
pub unsafe fn ibv_fork_init() -> c_int {
    0
}

#[inline(never)]
pub unsafe fn ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}
