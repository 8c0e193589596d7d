//! A device context (`ibv_context`): the root every other verbs object hangs from.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device_attr, ibv_get_device_name,
    ibv_gid, ibv_mtu, ibv_open_device, ibv_port_attr, ibv_port_state, ibv_query_device,
    ibv_query_gid,
};

use super::device::DeviceList;
use super::error::{check, Result, VerbsError};

/// An open device.
///
/// Either opened by us ([`Context::open`], closed on drop) or the context librdmacm opened
/// for a `cm_id` ([`super::CmId::context`]); librdmacm keeps its contexts open for the life
/// of the process (it only closes one after the device was hot-removed and no `cm_id` uses
/// it), so those are never closed here. Objects created from a context hold an
/// `Arc<Context>`, so a context we own is closed only after all of them are gone.
#[derive(Debug)]
pub struct Context {
    raw: NonNull<ibv_context>,
    owned: bool,
}

// SAFETY: libibverbs contexts may be used from any thread; every verb taking a context is
// thread-safe (the provider locks internally), and we never hand out `&mut ibv_context`.
unsafe impl Send for Context {}
// SAFETY: see `Send`; all methods take `&self` and call thread-safe verbs.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name` (e.g. `rxe0`).
    pub fn open(name: &str) -> Result<Arc<Context>> {
        let list = DeviceList::get()?;
        let dev =
            list.iter()
                .find(|dev| dev.name() == name)
                .ok_or_else(|| VerbsError::NoDevice {
                    name: Some(name.to_string()),
                })?;
        Self::open_ref(dev.as_ptr())
    }

    /// Opens the first device libibverbs lists.
    pub fn open_first() -> Result<Arc<Context>> {
        let list = DeviceList::get()?;
        let dev = list
            .iter()
            .next()
            .ok_or(VerbsError::NoDevice { name: None })?;
        Self::open_ref(dev.as_ptr())
    }

    fn open_ref(dev: *mut crate::sys::ibv_device) -> Result<Arc<Context>> {
        // SAFETY: `dev` is a live entry of a device list the caller keeps alive for this call.
        let raw = unsafe { ibv_open_device(dev) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last_os("ibv_open_device"))?;
        Ok(Arc::new(Context { raw, owned: true }))
    }

    /// Wraps a context owned by librdmacm (never closed by us).
    ///
    /// # Safety
    /// `raw` must be a context from a `rdma_cm_id` (`id->verbs`), which librdmacm keeps open.
    pub(crate) unsafe fn from_rdma_cm(raw: NonNull<ibv_context>) -> Arc<Context> {
        Arc::new(Context { raw, owned: false })
    }

    /// Whether both name the same open device context (librdmacm hands every `cm_id` on a
    /// device the same one).
    pub fn is_same(&self, other: &Context) -> bool {
        self.raw == other.raw
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.raw.as_ptr()
    }

    /// The device's name.
    pub fn name(&self) -> String {
        // SAFETY: the context is open, so its `device` pointer is valid.
        let dev = unsafe { (*self.raw.as_ptr()).device };
        // SAFETY: `dev` belongs to the open context; the name is NUL-terminated and owned by
        // libibverbs.
        let name = unsafe { ibv_get_device_name(dev) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL and NUL-terminated; copied immediately.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Completion vectors of the device (interrupt lines a CQ may signal on; at least 1).
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: the context is open; `num_comp_vectors` is immutable.
        let n = unsafe { (*self.raw.as_ptr()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0).max(1)
    }

    /// Device limits and identity (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: `ibv_device_attr` is plain old data; all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer.
        check("ibv_query_device", unsafe {
            ibv_query_device(self.as_ptr(), &mut attr)
        })?;
        Ok(DeviceAttr::from_raw(&attr))
    }

    /// State and properties of port `port` (ports count from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: `ibv_port_attr` is plain old data; all-zero is a valid value.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer of the size the
        // provider is told.
        check("ibv_query_port", unsafe {
            ___ibv_query_port(self.as_ptr(), port, &mut attr)
        })?;
        Ok(PortAttr::from_raw(&attr))
    }

    /// Entry `index` of port `port`'s GID table (for RoCE: an IPv6 or IPv4-mapped address).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let index = i32::try_from(index)
            .map_err(|_| VerbsError::invalid("ibv_query_gid", "GID index too large"))?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open and `gid` is a valid out-pointer.
        check("ibv_query_gid", unsafe {
            ibv_query_gid(self.as_ptr(), port, index, &mut gid)
        })?;
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: we opened this context and every object created from it holds an
        // `Arc<Context>`, so none is left when the last Arc drops.
        let ret = unsafe { ibv_close_device(self.raw.as_ptr()) };
        if let Err(e) = check("ibv_close_device", ret) {
            tracing::warn!(error = %e, "closing an RDMA device context failed");
        }
    }
}

/// Selected fields of `ibv_device_attr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    /// Node GUID, host byte order.
    pub node_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    /// Outstanding RDMA READ/atomic requests a QP can answer (responder resources).
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA READ/atomic requests a QP can issue (initiator depth).
    pub max_qp_init_rd_atom: u32,
    pub max_srq: u32,
    /// Receives one shared receive queue can hold.
    pub max_srq_wr: u32,
    pub phys_port_cnt: u8,
}

fn nonneg(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

impl DeviceAttr {
    fn from_raw(a: &ibv_device_attr) -> Self {
        let fw: Vec<u8> = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            max_qp: nonneg(a.max_qp),
            max_qp_wr: nonneg(a.max_qp_wr),
            max_sge: nonneg(a.max_sge),
            max_cq: nonneg(a.max_cq),
            max_cqe: nonneg(a.max_cqe),
            max_mr: nonneg(a.max_mr),
            max_pd: nonneg(a.max_pd),
            max_qp_rd_atom: nonneg(a.max_qp_rd_atom),
            max_qp_init_rd_atom: nonneg(a.max_qp_init_rd_atom),
            max_srq: nonneg(a.max_srq),
            max_srq_wr: nonneg(a.max_srq_wr),
            phys_port_cnt: a.phys_port_cnt,
        }
    }
}

/// Logical port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(u32),
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    Unspecified,
    InfiniBand,
    /// RoCE (soft-RoCE included).
    Ethernet,
    Unknown(u8),
}

/// Selected fields of `ibv_port_attr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    pub state: PortState,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu: u32,
    /// MTU in use, in bytes.
    pub active_mtu: u32,
    pub gid_tbl_len: u32,
    pub max_msg_sz: u32,
    pub lid: u16,
    pub link_layer: LinkLayer,
}

/// `IBV_MTU_*` to bytes.
fn mtu_bytes(mtu: ibv_mtu::Type) -> u32 {
    match mtu {
        ibv_mtu::IBV_MTU_256 => 256,
        ibv_mtu::IBV_MTU_512 => 512,
        ibv_mtu::IBV_MTU_1024 => 1024,
        ibv_mtu::IBV_MTU_2048 => 2048,
        ibv_mtu::IBV_MTU_4096 => 4096,
        _ => 0,
    }
}

impl PortAttr {
    fn from_raw(a: &ibv_port_attr) -> Self {
        let state = match a.state {
            ibv_port_state::IBV_PORT_NOP => PortState::Nop,
            ibv_port_state::IBV_PORT_DOWN => PortState::Down,
            ibv_port_state::IBV_PORT_INIT => PortState::Init,
            ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
            ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
            ibv_port_state::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            other => PortState::Unknown(other),
        };
        // IBV_LINK_LAYER_* are preprocessor constants that rdma-sys does not bind.
        let link_layer = match a.link_layer {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            other => LinkLayer::Unknown(other),
        };
        PortAttr {
            state,
            max_mtu: mtu_bytes(a.max_mtu),
            active_mtu: mtu_bytes(a.active_mtu),
            gid_tbl_len: nonneg(a.gid_tbl_len),
            max_msg_sz: a.max_msg_sz,
            lid: a.lid,
            link_layer,
        }
    }
}
