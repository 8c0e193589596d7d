//! [`RegisteredBuffer`]: application memory registered with the process's devices.
//!
//! Who may touch the bytes is counted in `Region::holders`: every handle, every `Bytes`
//! view and every send gathering from it. [`RegisteredBuffer::get_mut`] writes only when
//! its own handle is the one holder. The list of reachable memory holds the region weakly
//! and its lookups touch only the address and the registrations, never the holders or the
//! bytes, so they never make a buffer look busy.

use std::mem::ManuallyDrop;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use rpc_core::{Landing, Status};

use super::reachable::{self, Reachable};
use crate::budget::Registered;
use crate::engine::Engine;
use crate::verbs::{AccessFlags, AlignedBuffer, MemoryRegion, ProtectionDomain, StableBuffer};

/// [`Region::written_by`]: nothing written since the buffer was zeroed.
const CLEAN: u64 = 0;
/// [`Region::written_by`]: the application wrote it.
const APPLICATION: u64 = u64::MAX;

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
#[derive(Debug)]
pub struct RegisteredBuffer {
    region: Arc<Region>,
}

/// The memory and its registrations. Its last holder may let go anywhere (an async task,
/// a connection's thread under its lock), and deregistering unpins every page, which for a
/// large buffer takes long: `Drop` hands the registrations and then the memory to the
/// release thread (`reaper::release`), in that order, so the memory is never freed while
/// a device may reach it.
#[derive(Debug)]
struct Region {
    registrations: Mutex<Vec<Registration>>,
    /// Handles, views and sends that may read the bytes (see the module documentation).
    holders: AtomicUsize,
    /// Whose bytes it holds: [`CLEAN`] (zeroed), [`APPLICATION`] (written through
    /// `get_mut`), or the serial of the connection whose peer wrote a request body into it.
    /// A server's landing is cleared before another peer's body may land in it, so that a
    /// peer that announces a body it did not write reads nobody else's bytes.
    written_by: AtomicU64,
    /// Where `memory` lies: how everything but a view reaches it, so that the bytes are
    /// never borrowed but by views and by [`RegisteredBuffer::get_mut`].
    at: Span,
    /// Taken only by `Drop`.
    memory: ManuallyDrop<AlignedBuffer>,
}

/// A registration of the region's memory with one protection domain. Private to this
/// module, which only reads its keys: `MemoryRegion`'s slice accessors are never called on
/// it (they would alias the views and `get_mut`).
#[derive(Debug)]
struct Registration {
    /// Shared with a [`Claim`] while a window over it may be bound.
    region: Arc<MemoryRegion<Shared>>,
    _counted: Registered,
}

/// Where a region's memory lies.
#[derive(Debug, Clone, Copy)]
struct Span {
    ptr: *const u8,
    len: usize,
}

// SAFETY: an address and a length, shared like the `Region` they point into.
unsafe impl Send for Span {}
// SAFETY: as above; nothing is read or written through it but under `get_mut`'s contract.
unsafe impl Sync for Span {}

/// The region's memory as one registration sees it; made only by `Region::register`.
#[derive(Debug)]
pub(crate) struct Shared(Span);

// SAFETY: the memory is the region's `AlignedBuffer`, which never moves and outlives every
// registration (`Region`'s `Drop` drops them first; a `Claim` sharing one holds a handle).
// Through the registration the device reads it for sends, and writes it only through a
// window bound while a `Claim` holds the buffer's one handle (no other handle, no view,
// so nothing borrows the bytes); the view of what arrived is made only once that window is
// gone. This module never asks the `MemoryRegion` for a slice of it.
unsafe impl StableBuffer for Shared {
    fn as_ptr(&self) -> *const u8 {
        self.0.ptr
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.ptr.cast_mut()
    }
    fn len(&self) -> usize {
        self.0.len
    }
}

impl RegisteredBuffer {
    /// `len` zeroed, page-aligned bytes, registered with the RDMA devices the process's
    /// connections use now (and, later, with those new connections bring). Fails for `len`
    /// 0 or when the memory cannot be had; a device it cannot be registered with is skipped
    /// (its connections send copies).
    pub fn new(len: usize) -> Result<RegisteredBuffer, Status> {
        if len == 0 {
            return Err(Status::invalid_argument("a registered buffer of 0 bytes"));
        }
        let memory = AlignedBuffer::new(len).map_err(|e| {
            Status::resource_exhausted(format!("cannot allocate a buffer of {len} bytes: {e}"))
        })?;
        let region = Arc::new(Region {
            registrations: Mutex::new(Vec::new()),
            holders: AtomicUsize::new(1),
            written_by: AtomicU64::new(CLEAN),
            at: Span {
                ptr: memory.as_ptr(),
                len,
            },
            memory: ManuallyDrop::new(memory),
        });
        // Listed before it looks for devices: a device set up meanwhile registers it too.
        let weak: Weak<dyn Reachable> = Arc::downgrade(&region) as _;
        reachable::list(region.start(), len, weak);
        for engine in crate::engine::engines() {
            region.register(&engine);
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
        // Acquire: the reads of every holder that let go happen before the writes below.
        if self.region.holders.load(Ordering::Acquire) != 1 {
            return None;
        }
        self.region.written_by.store(APPLICATION, Ordering::Relaxed);
        let Span { ptr, len } = self.region.at;
        // SAFETY: the allocation's own pointer to `len` initialized bytes. This handle is
        // the one holder and is borrowed mutably: no other handle or view exists to borrow
        // the bytes or to make a new holder, and the device reads them only for a send,
        // which is a holder.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast_mut(), len) })
    }

    /// A view of `range` of its bytes, holding the buffer while it lives.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Bytes {
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => Some(self.len()),
        };
        let (start, end) = match (start, end) {
            (Some(start), Some(end)) if start <= end && end <= self.len() => (start, end),
            _ => panic!("range out of bounds of a buffer of {} bytes", self.len()),
        };
        self.region.hold();
        Bytes::from_owner(View(self.region.clone())).slice(start..end)
    }
}

impl Clone for RegisteredBuffer {
    fn clone(&self) -> Self {
        self.region.hold();
        RegisteredBuffer {
            region: self.region.clone(),
        }
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        self.region.unhold();
    }
}

/// What a `Bytes` view owns: a holder.
struct View(Arc<Region>);

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        &self.0.memory
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.0.unhold();
    }
}

impl Region {
    fn start(&self) -> usize {
        self.at.ptr as usize
    }

    /// Registers the memory with `pd` unless it is already, or unless `retired()` says,
    /// under the registrations' lock, that its engine retired meanwhile (see
    /// [`Reachable::register`]).
    fn register_with(&self, pd: &Arc<ProtectionDomain>, retired: impl Fn() -> bool) {
        let registered = |registrations: &[Registration]| {
            registrations.iter().any(|r| Arc::ptr_eq(r.region.pd(), pd))
        };
        if registered(&self.registrations.lock()) {
            return;
        }
        let len = self.at.len;
        let Ok(counted) = Registered::take(len as u64) else {
            tracing::warn!(
                len,
                "registered memory at the process's limit: this buffer is copied"
            );
            return;
        };
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let region = match MemoryRegion::register(pd, Shared(self.at), access) {
            Ok(region) => Arc::new(region),
            Err(e) => {
                tracing::warn!(len, error = %e, "cannot register a buffer: it is copied");
                return;
            }
        };
        let registration = Registration {
            region,
            _counted: counted,
        };
        let mut registrations = self.registrations.lock();
        // The last engine of a protection domain retires before it unregisters every
        // buffer, under this lock: a registration pushed for an engine that retired
        // meanwhile might never be let go of. (If another engine still shares the domain,
        // this one is made again for it.)
        if retired() || registered(&registrations) {
            drop(registrations);
            drop(registration);
            return;
        }
        registrations.push(registration);
    }
}

impl Reachable for Region {
    /// Registers the memory with `engine`'s protection domain unless it is already; a
    /// failure leaves that engine's connections sending copies. Registering is slow: it
    /// runs outside the lock, which senders looking up a key take.
    ///
    /// Registered `LOCAL_WRITE` (a writable pin breaks copy-on-write at registration, where a
    /// read-only pin of pages never written may pin the shared zero page, which the
    /// application's writes then leave behind), and `MW_BIND`: a response lands in it
    /// through a window ([`Claim`]); the registration itself grants no remote access.
    fn register(&self, engine: &Engine) {
        self.register_with(&engine.pd, || engine.is_retired());
    }

    fn unregister(&self, pd: &Arc<ProtectionDomain>) {
        let gone: Vec<Registration> = {
            let mut registrations = self.registrations.lock();
            let (gone, kept) = std::mem::take(&mut *registrations)
                .into_iter()
                .partition(|r| Arc::ptr_eq(r.region.pd(), pd));
            *registrations = kept;
            gone
        };
        // Deregistered outside the lock.
        drop(gone);
    }

    fn lkey(&self, pd: &Arc<ProtectionDomain>) -> Option<u32> {
        self.registrations
            .lock()
            .iter()
            .find(|r| Arc::ptr_eq(r.region.pd(), pd))
            .map(|r| r.region.lkey())
    }

    fn hold(&self) {
        self.holders.fetch_add(1, Ordering::Relaxed);
    }

    fn unhold(&self) {
        // Release: pairs with `get_mut`'s Acquire.
        self.holders.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        reachable::unlist(self.start());
        let registrations = std::mem::take(self.registrations.get_mut());
        // SAFETY: taken once, here; `self` does not use the memory after.
        let memory = unsafe { ManuallyDrop::take(&mut self.memory) };
        crate::reaper::release(move || {
            drop(registrations);
            drop(memory);
        });
    }
}

/// A [`RegisteredBuffer`] taken out of a [`Landing`] for one large body (a client's
/// response, a server's request): a window over it lets the peer write the body in. It holds the buffer's one handle (no clone, no
/// view exists), so nothing reads or writes the bytes meanwhile; dropped, it puts the
/// buffer back.
#[derive(Debug)]
pub(crate) struct Claim {
    /// The registration with the connection's protection domain; let go before the buffer
    /// goes back, so that whoever takes the buffer next may be its last holder.
    mr: Option<Arc<MemoryRegion<Shared>>>,
    buffer: Option<RegisteredBuffer>,
    landing: Landing,
}

impl Claim {
    /// `landing`'s buffer, if it holds a [`RegisteredBuffer`] of at least `min_len` bytes
    /// that nothing else holds (no view of an earlier body is alive) and that is
    /// registered with `pd`; otherwise the landing keeps what it holds, and nobody sees it
    /// empty meanwhile. For a peer's request body (`peer`: its connection's serial), the
    /// first `min_len` bytes are cleared unless they are zeroed already or that peer's own.
    pub(crate) fn take(
        landing: &Landing,
        pd: &Arc<ProtectionDomain>,
        min_len: usize,
        peer: Option<u64>,
    ) -> Option<Claim> {
        let registration = |buffer: &RegisteredBuffer| {
            buffer
                .region
                .registrations
                .lock()
                .iter()
                .find(|r| Arc::ptr_eq(r.region.pd(), pd))
                .map(|r| r.region.clone())
        };
        let mut mr = None;
        let mut buffer = landing.take_if(|buffer: &RegisteredBuffer| {
            // Acquire: the reads of every view let go happen before the peer writes.
            let free = buffer.region.holders.load(Ordering::Acquire) == 1;
            mr = (free && buffer.len() >= min_len)
                .then(|| registration(buffer))
                .flatten();
            mr.is_some()
        })?;
        let written_by = &buffer.region.written_by;
        match peer {
            Some(peer) => {
                let before = written_by.load(Ordering::Relaxed);
                if before != CLEAN && before != peer {
                    // The one holder: nothing else reads or writes the bytes.
                    let bytes = buffer.get_mut().expect("the one holder");
                    bytes[..min_len].fill(0);
                }
                buffer.region.written_by.store(peer, Ordering::Relaxed);
            }
            // A response the application asked for is the application's to keep private.
            None => written_by.store(APPLICATION, Ordering::Relaxed),
        }
        Some(Claim {
            mr,
            buffer: Some(buffer),
            landing: landing.clone(),
        })
    }

    /// The registration a window over it is bound with.
    pub(crate) fn region(&self) -> &MemoryRegion<Shared> {
        self.mr.as_ref().expect("held until dropped")
    }

    pub(crate) fn addr(&self) -> u64 {
        self.region().addr()
    }

    pub(crate) fn len(&self) -> usize {
        self.region().len()
    }

    /// The first `len` bytes, where the response arrived, as a view.
    ///
    /// # Safety
    /// The peer's last write completed, and no window bound on the buffer is left valid
    /// (invalidated or deallocated), nor any work request naming it.
    pub(crate) unsafe fn arrived(&self, len: usize) -> Bytes {
        let buffer = self.buffer.as_ref().expect("held until dropped");
        buffer.slice(..len.min(buffer.len()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        drop(self.mr.take());
        if let Some(buffer) = self.buffer.take() {
            // Put back unless the application put something else in meanwhile: then the
            // buffer goes (its views, if any, keep its memory).
            drop(self.landing.put(buffer));
        }
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
        // Lookups in the list do not hold it.
        let start = buffer.region.start();
        let found = reachable::find(start, 8192).expect("listed");
        assert!(buffer.get_mut().is_some(), "a lookup is not a holder");
        // A send gathering from it is.
        let held = reachable::Held::new(found.1);
        assert!(buffer.get_mut().is_none(), "a send still reads it");
        drop(held);
        assert!(buffer.get_mut().is_some());
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_range_past_the_end_panics_without_overflowing() {
        let buffer = RegisteredBuffer::new(4096).expect("a buffer");
        let _ = buffer.slice(..=usize::MAX);
    }

    #[test]
    fn a_dropped_buffer_leaves_the_list() {
        let buffer = RegisteredBuffer::new(4096).expect("a buffer");
        let start = buffer.region.start();
        assert!(reachable::find(start, 1).is_some());
        drop(buffer);
        assert!(reachable::find(start, 1).is_none());
        assert_eq!(
            RegisteredBuffer::new(0).unwrap_err().code(),
            rpc_core::Code::InvalidArgument
        );
    }

    /// A protection domain on the test device, if there is one.
    fn device_pd() -> Option<Arc<ProtectionDomain>> {
        crate::verbs::test_support::require_device()?;
        let context = crate::verbs::Context::open_first().expect("the device opens");
        Some(ProtectionDomain::new(&context).expect("a protection domain"))
    }

    /// Deregistering unpins every page of the buffer, which takes long for a large one: the
    /// last holder's drop leaves it to the release thread instead of doing it where it is
    /// (an async task, a connection's thread under its lock).
    #[test]
    #[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
    fn the_last_drop_deregisters_on_the_release_thread() {
        let Some(pd) = device_pd() else {
            return;
        };
        let buffer = RegisteredBuffer::new(1 << 20).expect("a buffer");
        buffer.region.register_with(&pd, || false);
        assert_eq!(
            Arc::strong_count(&pd),
            2,
            "the registration holds the domain"
        );
        // The release thread waits until told to go on.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        crate::reaper::release(move || {
            let _ = wait.recv();
        });
        let view = buffer.slice(..);
        drop(buffer);
        drop(view);
        assert_eq!(
            Arc::strong_count(&pd),
            2,
            "the dropping thread deregistered the memory"
        );
        go.send(()).expect("the release thread waits");
        let (done, finished) = std::sync::mpsc::channel();
        crate::reaper::release(move || {
            let _ = done.send(());
        });
        finished.recv().expect("the release thread runs in order");
        assert_eq!(
            Arc::strong_count(&pd),
            1,
            "deregistered by the release thread"
        );
    }

    /// A server's landing is cleared before a peer's body may land in it, as far as the
    /// body goes, unless the bytes are that peer's own: a peer that announces a body it
    /// did not write must not read what the application or another peer left there.
    #[test]
    #[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
    fn a_landing_is_cleared_before_another_peers_body() {
        let Some(pd) = device_pd() else {
            return;
        };
        let mut buffer = RegisteredBuffer::new(8192).expect("a buffer");
        buffer.region.register_with(&pd, || false);
        buffer.get_mut().expect("alone").fill(7);
        let landing = Landing::new(buffer);
        let claim = Claim::take(&landing, &pd, 4096, Some(5)).expect("claimed");
        drop(claim);
        let mut buffer = landing.take::<RegisteredBuffer>().expect("back");
        let bytes = buffer.get_mut().expect("alone");
        assert!(
            bytes[..4096].iter().all(|&b| b == 0),
            "the application's bytes were left"
        );
        assert!(
            bytes[4096..].iter().all(|&b| b == 7),
            "cleared past the body"
        );
        // A client's response landing is the application's own memory: left as it is.
        bytes.fill(9);
        landing.put(buffer).expect("empty");
        drop(Claim::take(&landing, &pd, 4096, None).expect("claimed"));
        let mut buffer = landing.take::<RegisteredBuffer>().expect("back");
        assert!(buffer.get_mut().expect("alone").iter().all(|&b| b == 9));
        // What a response left in fresh memory is the application's: cleared before a
        // peer's body.
        let fresh = RegisteredBuffer::new(8192).expect("a buffer");
        fresh.region.register_with(&pd, || false);
        let responses = Landing::new(fresh);
        drop(Claim::take(&responses, &pd, 4096, None).expect("claimed"));
        let fresh = responses.take::<RegisteredBuffer>().expect("back");
        assert_eq!(fresh.region.written_by.load(Ordering::Relaxed), APPLICATION);
        // Too small, or viewed: not claimed, and the landing keeps it.
        landing.put(buffer).expect("empty");
        assert!(Claim::take(&landing, &pd, 8193, Some(5)).is_none());
        assert!(!landing.is_empty());
    }
}
