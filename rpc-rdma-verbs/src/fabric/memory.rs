//! Memory regions and memory windows: the key table the fabric checks every local SGE and
//! remote access against, as a device does.

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use rdma_sys::{ibv_mr, ibv_mw, ibv_mw_type, ibv_pd};

use super::fail;

/// What a key grants: bytes `addr..addr + len` of a protection domain, with access rights.
#[derive(Debug, Clone, Copy)]
struct Grant {
    addr: u64,
    len: u64,
    access: u32,
    pd: usize,
    /// The memory window the key is bound through, if it is not a region's.
    window: Option<usize>,
}

/// Every live key (a region's lkey and rkey are the same).
fn keys() -> &'static Mutex<HashMap<u32, Grant>> {
    static KEYS: OnceLock<Mutex<HashMap<u32, Grant>>> = OnceLock::new();
    KEYS.get_or_init(Default::default)
}

/// A fresh key index, shifted above the 8 bits a window's rkey varies by.
fn next_key() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) << 8
}

/// Whether bytes `addr..addr + len` may be accessed through `key` by a queue pair of `pd`
/// needing `access` (0: a local read, which any region grants).
pub(super) fn allows(key: u32, pd: usize, addr: u64, len: u64, access: u32) -> bool {
    let keys = keys().lock();
    keys.get(&key).is_some_and(|g| {
        g.pd == pd
            && g.access & access == access
            && addr >= g.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= g.addr + g.len)
    })
}

/// Binds `window` to a range of the region `lkey` under `rkey`, replacing the window's
/// previous binding. False when the range is not inside the region.
pub(super) fn bind(window: usize, rkey: u32, lkey: u32, addr: u64, len: u64, access: u32) -> bool {
    let mut keys = keys().lock();
    let Some(region) = keys.get(&lkey).copied() else {
        return false;
    };
    if addr < region.addr || addr + len > region.addr + region.len {
        return false;
    }
    keys.retain(|_, g| g.window != Some(window));
    keys.insert(
        rkey,
        Grant {
            addr,
            len,
            access,
            pd: region.pd,
            window: Some(window),
        },
    );
    true
}

/// Removes a window's `rkey` (a local invalidate). False if no window had it.
pub(super) fn invalidate(rkey: u32) -> bool {
    let mut keys = keys().lock();
    match keys.get(&rkey) {
        Some(g) if g.window.is_some() => {
            keys.remove(&rkey);
            true
        }
        _ => false,
    }
}

#[inline(never)]
pub unsafe fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    if addr.is_null() || length == 0 {
        return fail(libc::EINVAL, ptr::null_mut());
    }
    let key = next_key();
    let grant = Grant {
        addr: addr as u64,
        len: length as u64,
        access: access as u32,
        pd: pd as usize,
        window: None,
    };
    keys().lock().insert(key, grant);
    // SAFETY: `pd` is a live protection domain (the caller's contract).
    let context = unsafe { (*pd).context };
    Box::into_raw(Box::new(ibv_mr {
        context,
        pd,
        addr,
        length,
        handle: key,
        lkey: key,
        rkey: key,
    }))
}

#[inline(never)]
pub unsafe fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: `mr` came from `ibv_reg_mr` and is deregistered once.
    let mr = unsafe { Box::from_raw(mr) };
    keys().lock().remove(&mr.lkey);
    0
}

#[inline(never)]
pub unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type::Type) -> Option<*mut ibv_mw> {
    // SAFETY: `pd` is a live protection domain (the caller's contract).
    let context = unsafe { (*pd).context };
    Some(Box::into_raw(Box::new(ibv_mw {
        context,
        pd,
        rkey: next_key(),
        handle: 0,
        type_,
    })))
}

#[inline(never)]
pub unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    keys().lock().retain(|_, g| g.window != Some(mw as usize));
    // SAFETY: `mw` came from `ibv_alloc_mw` and is deallocated once.
    drop(unsafe { Box::from_raw(mw) });
    0
}
