//! Listing the RDMA devices libibverbs can see.

use std::ffi::CStr;
use std::ptr::NonNull;

use crate::sys::{
    ibv_device, ibv_free_device_list, ibv_get_device_guid, ibv_get_device_list, ibv_get_device_name,
};

use super::error::{Result, VerbsError};

/// Name and GUID of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `rxe0` or `mlx5_0`.
    pub name: String,
    /// Node GUID (host byte order).
    pub guid: u64,
}

/// The devices present; empty when there are none (or the kernel has no RDMA support).
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let list = DeviceList::get()?;
    Ok(list.iter().map(|dev| dev.info()).collect())
}

/// An owned `ibv_get_device_list` result, freed on drop.
pub(crate) struct DeviceList {
    list: Option<NonNull<*mut ibv_device>>,
    len: usize,
}

impl DeviceList {
    pub(crate) fn get() -> Result<DeviceList> {
        let mut num: std::os::raw::c_int = 0;
        // SAFETY: `num` is a valid out-pointer; the returned array (or NULL) is owned by us
        // until `ibv_free_device_list`.
        let raw = unsafe { ibv_get_device_list(&mut num) };
        match NonNull::new(raw) {
            Some(list) => Ok(DeviceList {
                list: Some(list),
                len: usize::try_from(num).unwrap_or(0),
            }),
            None => {
                let err = VerbsError::last_os("ibv_get_device_list");
                // No kernel support / no uverbs devices: that is "no devices", not an error.
                match err.errno() {
                    Some(libc::ENOSYS) | Some(libc::ENODEV) | Some(libc::ENOENT) => {
                        Ok(DeviceList { list: None, len: 0 })
                    }
                    _ => Err(err),
                }
            }
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = DeviceRef<'_>> + '_ {
        (0..self.len).filter_map(move |i| {
            let list = self.list?;
            // SAFETY: `i < len`, and the array holds `len` valid device pointers (followed by
            // NULL) for as long as the list is not freed, which `&self` guarantees.
            let dev = unsafe { *list.as_ptr().add(i) };
            NonNull::new(dev).map(|dev| DeviceRef { dev, _list: self })
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if let Some(list) = self.list {
            // SAFETY: `list` came from `ibv_get_device_list` and is freed exactly once; opened
            // contexts stay valid after the list is freed.
            unsafe { ibv_free_device_list(list.as_ptr()) };
        }
    }
}

/// A device in a [`DeviceList`], valid while the list lives.
pub(crate) struct DeviceRef<'a> {
    dev: NonNull<ibv_device>,
    _list: &'a DeviceList,
}

impl DeviceRef<'_> {
    pub(crate) fn name(&self) -> String {
        // SAFETY: `dev` is a live device of the list; the name is a NUL-terminated string
        // owned by libibverbs, copied before the borrow ends.
        let name = unsafe { ibv_get_device_name(self.dev.as_ptr()) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, valid for the list's lifetime.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    pub(crate) fn info(&self) -> DeviceInfo {
        // SAFETY: `dev` is a live device of the list.
        let guid = unsafe { ibv_get_device_guid(self.dev.as_ptr()) };
        DeviceInfo {
            name: self.name(),
            guid: u64::from_be(guid),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_device {
        self.dev.as_ptr()
    }
}
