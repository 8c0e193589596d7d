//! [`RegisteredBuffer`]: application memory registered with the process's devices.

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use rpc_core::Status;

use super::reachable::{self, Reachable};
use crate::budget::Registered;
use crate::verbs::{AccessFlags, AlignedBuffer, MemoryRegion, ProtectionDomain, StableBuffer};

/// A buffer of application memory, registered with the process's RDMA devices, whose
/// bytes go to the wire from where they lie when they are a large message's `bytes` field.
///
/// Fill it with [`RegisteredBuffer::get_mut`], hand parts of it to messages with
/// [`RegisteredBuffer::slice`] (a `Bytes` field configured with `.bytes(..)` in codegen),
/// and send: a large request, response or stream message sends such a field by RDMA WRITE
/// straight from this memory, with no copy. Over `tcp://`, and for bodies small enough for
/// one SEND, the bytes are copied as any others are; the code is the same.
///
/// ```no_run
/// use rpc_transport_rdma::RegisteredBuffer;
/// let mut buffer = RegisteredBuffer::new(64 << 20)?;
/// buffer.get_mut().expect("nothing else holds it yet").fill(7);
/// let field: bytes::Bytes = buffer.slice(..);
/// # Ok::<(), rpc_core::Status>(())
/// ```
#[derive(Debug, Clone)]
pub struct RegisteredBuffer {
    region: Arc<Region>,
}

/// The memory and its registrations. Field order is drop order: the registrations go
/// first, so the memory is never freed while a device may reach it.
#[derive(Debug)]
struct Region {
    registrations: Mutex<Vec<Registration>>,
    /// Where `memory` lies: how everything but a view reaches it, so that the bytes are
    /// never borrowed but by views and by [`RegisteredBuffer::get_mut`].
    at: Shared,
    memory: AlignedBuffer,
}

#[derive(Debug)]
struct Registration {
    region: MemoryRegion<Shared>,
    _counted: Registered,
}

/// The memory of a [`Region`], by address.
#[derive(Debug, Clone, Copy)]
struct Shared {
    ptr: *const u8,
    len: usize,
}

// SAFETY: an address and a length, shared like the `Region` they point into.
unsafe impl Send for Shared {}
// SAFETY: as above; nothing is read or written through it by safe code.
unsafe impl Sync for Shared {}

// SAFETY: the memory is the region's `AlignedBuffer`, which never moves and outlives every
// registration (dropped after them, by field order); the device only reads it (registered
// without LOCAL_WRITE), and nothing here writes through `as_mut_ptr`.
unsafe impl StableBuffer for Shared {
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.cast_mut()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl RegisteredBuffer {
    /// `len` zeroed, page-aligned bytes, registered with every RDMA device the process's
    /// connections use now (and, later, with each device a new connection brings). Fails
    /// for `len` 0 or when the memory cannot be had; a device it cannot be registered with
    /// is skipped (it sends copies).
    pub fn new(len: usize) -> Result<RegisteredBuffer, Status> {
        let memory = AlignedBuffer::new(len).map_err(|e| {
            Status::resource_exhausted(format!("cannot allocate a buffer of {len} bytes: {e}"))
        })?;
        let region = Arc::new(Region {
            registrations: Mutex::new(Vec::new()),
            at: Shared {
                ptr: memory.as_ptr(),
                len,
            },
            memory,
        });
        // Listed before it looks for devices: a device set up meanwhile registers it too.
        let weak: std::sync::Weak<dyn Reachable> = Arc::downgrade(&region) as _;
        reachable::list(region.start(), weak);
        for pd in crate::engine::protection_domains() {
            region.register(&pd);
        }
        Ok(RegisteredBuffer { region })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.region.at.len
    }

    /// Whether it is empty (never: a buffer has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes, to write, when nothing else holds the buffer: no clone, no `Bytes` view
    /// alive, no send still reading it. `None` otherwise.
    pub fn get_mut(&mut self) -> Option<&mut [u8]> {
        // Holders are clones of the `Arc` (views, transfers); only a view's bytes are ever
        // looked up (and so upgraded from the list of reachable memory), so with no view none can appear.
        match Arc::strong_count(&self.region) {
            1 => {
                let Shared { ptr, len } = self.region.at;
                // SAFETY: the allocation's own pointer, `len` initialized bytes. This handle
                // is the only strong one and is borrowed mutably: no view exists, so nothing
                // borrows the bytes, and the device reads them only for a send, which holds
                // a strong handle. (`Arc::get_mut` would refuse: the list holds a weak one,
                // whose upgrades touch only `at` and the registrations, never the bytes.)
                Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast_mut(), len) })
            }
            _ => None,
        }
    }

    /// A view of `range` of its bytes, holding the buffer while it lives.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Bytes {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len(),
        };
        assert!(start <= end && end <= self.len(), "range out of bounds");
        Bytes::from_owner(View(self.region.clone())).slice(start..end)
    }
}

/// What a `Bytes` view owns.
struct View(Arc<Region>);

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        &self.0.memory
    }
}

impl Region {
    fn start(&self) -> usize {
        self.at.ptr as usize
    }
}

impl Reachable for Region {
    fn len(&self) -> usize {
        self.at.len
    }

    /// Registers the memory with `pd` unless it is already; a failure leaves this device
    /// sending copies. Also lets go of registrations whose device nothing else uses.
    fn register(&self, pd: &Arc<ProtectionDomain>) {
        let mut registrations = self.registrations.lock();
        registrations.retain(|r| Arc::strong_count(r.region.pd()) > 1);
        if registrations.iter().any(|r| Arc::ptr_eq(r.region.pd(), pd)) {
            return;
        }
        let Shared { ptr, len } = self.at;
        let Ok(counted) = Registered::take(len as u64) else {
            tracing::warn!(
                len,
                "registered memory at the process's limit: this buffer is copied"
            );
            return;
        };
        match MemoryRegion::register(pd, Shared { ptr, len }, AccessFlags::NONE) {
            Ok(region) => registrations.push(Registration {
                region,
                _counted: counted,
            }),
            Err(e) => tracing::warn!(len, error = %e, "cannot register a buffer: it is copied"),
        }
    }

    /// The local key of the registration with `pd`.
    fn lkey(&self, pd: &Arc<ProtectionDomain>) -> Option<u32> {
        self.registrations
            .lock()
            .iter()
            .find(|r| Arc::ptr_eq(r.region.pd(), pd))
            .map(|r| r.region.lkey())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        reachable::unlist(self.start());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_hold_the_buffer_and_writing_waits_for_them() {
        let mut buffer = RegisteredBuffer::new(8192).expect("a buffer");
        assert_eq!(buffer.len(), 8192);
        buffer.get_mut().expect("alone")[..4].copy_from_slice(b"abcd");
        let view = buffer.slice(1..3);
        assert_eq!(&view[..], b"bc");
        assert!(buffer.get_mut().is_none(), "a view still reads it");
        let clone = buffer.clone();
        drop(view);
        assert!(buffer.get_mut().is_none(), "a clone still holds it");
        drop(clone);
        assert!(buffer.get_mut().is_some());
    }

    #[test]
    fn a_dropped_buffer_leaves_the_list() {
        let buffer = RegisteredBuffer::new(4096).expect("a buffer");
        let start = buffer.region.start();
        assert!(reachable::find(start, 1).is_some());
        drop(buffer);
        assert!(reachable::find(start, 1).is_none());
    }
}
