//! Memory the application registers once and sends large bodies from in place
//! ([`RegisteredBuffer`]), and the driver's side of it: finding the registration a body's
//! bytes lie in ([`InPlace`]).
//!
//! A buffer is registered with every RDMA device the process uses: the devices of its
//! connections when it is made, and each device a later connection brings (when that
//! connection's completion engine is set up). Never on a call's path. Registrations count
//! against [`ProcessLimits::registered_bytes`]; a device it cannot be registered with (the
//! limit, the device's own) gets copies of its bytes instead, as any other memory does.
//!
//! The device only reads this memory (it is registered for local access, never remote),
//! and only while a send holds the buffer: every `Bytes` view holds it, and so does a
//! transfer until its WRITEs completed. [`RegisteredBuffer::get_mut`] hands the bytes out
//! for writing only when nothing else holds the buffer, as `Arc::get_mut` does.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use rpc_core::body::Gather;
use rpc_core::Status;
use smallvec::SmallVec;

#[cfg(doc)]
use crate::budget::ProcessLimits;
use crate::budget::Registered;
use crate::verbs::{AccessFlags, AlignedBuffer, MemoryRegion, ProtectionDomain, Sge, StableBuffer};

/// Runs of fewer bytes are copied: a copy of them costs less than a gather entry.
pub(crate) const IN_PLACE_MIN: usize = 16 * 1024;

static COPIED: AtomicU64 = AtomicU64::new(0);
static IN_PLACE: AtomicU64 = AtomicU64::new(0);

/// Bytes of the large bodies (those sent by RDMA WRITE) this process has sent, by how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LargeBodyBytes {
    /// Encoded (copied) into the transport's registered buffers.
    pub copied: u64,
    /// Sent from the application's [`RegisteredBuffer`]s where they lie, uncopied.
    pub in_place: u64,
}

/// How the large bodies sent so far went: copied, or from application memory in place.
/// Also counted, with metrics on, as `rdma_rpc_large_body_bytes_total` by `path`
/// (`copied`, `in_place`).
pub fn large_body_bytes() -> LargeBodyBytes {
    LargeBodyBytes {
        copied: COPIED.load(Ordering::Relaxed),
        in_place: IN_PLACE.load(Ordering::Relaxed),
    }
}

/// A large body is sent: `copied` bytes encoded into a transport buffer, `in_place` from
/// application memory.
pub(crate) fn count_large_body(copied: u64, in_place: u64) {
    COPIED.fetch_add(copied, Ordering::Relaxed);
    IN_PLACE.fetch_add(in_place, Ordering::Relaxed);
    if let Some(metrics) = crate::metrics::rdma() {
        metrics.large_copied.increment(copied);
        metrics.large_in_place.increment(in_place);
    }
}

/// Buffers of the process by the address of their first byte, for finding the one a run of
/// bytes lies in.
static BUFFERS: RwLock<BTreeMap<usize, Weak<Region>>> = RwLock::new(BTreeMap::new());

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
        BUFFERS
            .write()
            .insert(region.start(), Arc::downgrade(&region));
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
        // looked up (and so upgraded from `BUFFERS`), so with no view none can appear.
        match Arc::strong_count(&self.region) {
            1 => {
                let Shared { ptr, len } = self.region.at;
                // SAFETY: the allocation's own pointer, `len` initialized bytes. This handle
                // is the only strong one and is borrowed mutably: no view exists, so nothing
                // borrows the bytes, and the device reads them only for a send, which holds
                // a strong handle. (`Arc::get_mut` would refuse: `BUFFERS` holds a weak one,
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
        let mut buffers = BUFFERS.write();
        // Only its own entry: a buffer made since at the same address has a live one.
        if buffers
            .get(&self.start())
            .is_some_and(|w| w.strong_count() == 0)
        {
            buffers.remove(&self.start());
        }
    }
}

/// Registers every live buffer with a device's new protection domain (a connection set up
/// the device's engine).
pub(crate) fn register_all(pd: &Arc<ProtectionDomain>) {
    let live: Vec<Arc<Region>> = BUFFERS.read().values().filter_map(Weak::upgrade).collect();
    for region in live {
        region.register(pd);
    }
}

/// A run of a body's bytes sent from where it lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    /// Where it goes in the body.
    at: u64,
    addr: u64,
    len: u32,
    lkey: u32,
}

/// Where a body's bytes lie: runs of application memory (held until the body is written),
/// and between them the copied bytes, back to back in the transfer's own buffer.
#[derive(Debug)]
pub(crate) struct Gathered {
    /// In body order.
    pieces: Vec<Piece>,
    _holds: Vec<Arc<Region>>,
}

impl Gathered {
    /// Bytes sent from application memory.
    pub(crate) fn in_place(&self) -> u64 {
        self.pieces.iter().map(|p| u64::from(p.len)).sum()
    }

    /// The gather list of `len` bytes at `offset` of the body, whose copied bytes are at
    /// `staged` (address, local key): at most `2 × pieces + 1` entries.
    pub(crate) fn sges(&self, offset: u64, len: u32, staged: (u64, u32)) -> SmallVec<[Sge; 4]> {
        let (staged_addr, staged_lkey) = staged;
        let end = offset + u64::from(len);
        let mut out = SmallVec::new();
        let mut pos = offset;
        // Bytes of application memory before `pos`: the copied bytes are where `pos` is,
        // less these.
        let mut skipped = 0u64;
        for p in &self.pieces {
            let p_end = p.at + u64::from(p.len);
            if p_end <= pos {
                skipped += u64::from(p.len);
                continue;
            }
            if p.at >= end {
                break;
            }
            if pos < p.at {
                out.push(Sge::new(
                    staged_addr + (pos - skipped),
                    (p.at - pos) as u32,
                    staged_lkey,
                ));
                pos = p.at;
            }
            let stop = p_end.min(end);
            out.push(Sge::new(p.addr + (pos - p.at), (stop - pos) as u32, p.lkey));
            pos = stop;
            skipped += u64::from(p.len);
            if pos == end {
                return out;
            }
        }
        if pos < end {
            out.push(Sge::new(
                staged_addr + (pos - skipped),
                (end - pos) as u32,
                staged_lkey,
            ));
        }
        out
    }
}

/// Decides, as a body is encoded, which of its runs go from application memory: those in a
/// [`RegisteredBuffer`] registered with the connection's device, at most `max_pieces` of
/// them (a WRITE gathers at most `2 × max_pieces + 1` entries).
pub(crate) struct InPlace<'a> {
    pd: &'a Arc<ProtectionDomain>,
    /// Where the payload starts in the body.
    base: u64,
    max_pieces: usize,
    pieces: Vec<Piece>,
    /// The buffers the pieces lie in, held until the pieces are written.
    holds: Vec<Arc<Region>>,
}

impl<'a> InPlace<'a> {
    pub(crate) fn new(pd: &'a Arc<ProtectionDomain>, base: u64, max_pieces: usize) -> Self {
        InPlace {
            pd,
            base,
            max_pieces,
            pieces: Vec::new(),
            holds: Vec::new(),
        }
    }

    /// Whether no run was taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The runs taken, and the buffers they lie in.
    pub(crate) fn finish(self) -> Gathered {
        Gathered {
            pieces: self.pieces,
            _holds: self.holds,
        }
    }

    /// Whether this pass took the same runs as `other`.
    pub(crate) fn same_as(&self, other: &InPlace<'_>) -> bool {
        self.pieces == other.pieces
    }
}

impl Gather for InPlace<'_> {
    fn min_len(&self) -> usize {
        IN_PLACE_MIN
    }

    fn offer(&mut self, at: usize, bytes: &[u8]) -> bool {
        if self.pieces.len() >= self.max_pieces {
            return false;
        }
        let Ok(len) = u32::try_from(bytes.len()) else {
            return false;
        };
        let addr = bytes.as_ptr() as usize;
        // Upgraded after the lock is let go: the last handle's drop takes it.
        let candidate = BUFFERS
            .read()
            .range(..=addr)
            .next_back()
            .map(|(&start, region)| (start, region.clone()));
        let Some((start, region)) = candidate else {
            return false;
        };
        let Some(region) = region.upgrade() else {
            return false;
        };
        if addr + bytes.len() > start + region.at.len {
            return false;
        }
        let Some(lkey) = region.lkey(self.pd) else {
            return false;
        };
        self.pieces.push(Piece {
            at: self.base + at as u64,
            addr: addr as u64,
            len,
            lkey,
        });
        self.holds.push(region);
        true
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

    /// A body of 100 bytes: copied 0..10, application memory 10..40 (at 1000), copied
    /// 40..50, application memory 50..90 (at 2000), copied 90..100 (staged at 500).
    #[test]
    fn a_chunk_gathers_its_runs_and_the_copied_bytes_between_them() {
        let piece = |at, addr, len, lkey| Piece {
            at,
            addr,
            len,
            lkey,
        };
        let gathered = Gathered {
            pieces: vec![piece(10, 1000, 30, 7), piece(50, 2000, 40, 8)],
            _holds: Vec::new(),
        };
        assert_eq!(gathered.in_place(), 70);
        let list = |offset, len| -> Vec<(u64, u32, u32)> {
            gathered
                .sges(offset, len, (500, 1))
                .iter()
                .map(|s| (s.addr(), s.length(), s.lkey()))
                .collect()
        };
        assert_eq!(
            list(0, 100),
            [
                (500, 10, 1),
                (1000, 30, 7),
                (510, 10, 1),
                (2000, 40, 8),
                (520, 10, 1)
            ]
        );
        // Chunks that start and end inside runs.
        assert_eq!(list(0, 25), [(500, 10, 1), (1000, 15, 7)]);
        assert_eq!(list(25, 30), [(1015, 15, 7), (510, 10, 1), (2000, 5, 8)]);
        assert_eq!(list(55, 45), [(2005, 35, 8), (520, 10, 1)]);
        assert_eq!(list(92, 8), [(522, 8, 1)]);
        assert_eq!(list(12, 3), [(1002, 3, 7)]);
    }

    #[test]
    fn a_dropped_buffer_leaves_the_list() {
        let buffer = RegisteredBuffer::new(4096).expect("a buffer");
        let start = buffer.region.start();
        assert!(BUFFERS.read().contains_key(&start));
        drop(buffer);
        let left = BUFFERS.read().get(&start).map(Weak::strong_count);
        assert!(
            left.is_none_or(|n| n > 0),
            "only a newer buffer may be listed there"
        );
    }
}
