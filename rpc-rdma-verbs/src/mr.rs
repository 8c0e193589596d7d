//! Memory regions (`ibv_mr`): memory registered with a protection domain, addressable by the
//! device through its lkey (locally) and rkey (by the peer).

use std::alloc::{self, Layout};
use std::marker::PhantomData;
use std::ops::{BitOr, BitOrAssign, Range};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr};

use super::error::{check, Result, VerbsError};
use super::pd::ProtectionDomain;
use super::wr::{RemoteAddr, Sge};

/// Access rights of a registration (`IBV_ACCESS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// Only the local device reads it (send buffers).
    pub const NONE: AccessFlags = AccessFlags(0);
    /// The local device may write it (receive buffers, RDMA READ targets).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// The peer may RDMA WRITE into it (needs `LOCAL_WRITE` too).
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// The peer may RDMA READ it.
    pub const REMOTE_READ: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// The peer may run atomics on it (needs `LOCAL_WRITE` too).
    pub const REMOTE_ATOMIC: AccessFlags =
        AccessFlags(ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// Memory windows may be bound to it ([`super::MemoryWindow`]); as a window's access,
    /// nothing. A region with this and `LOCAL_WRITE` only is remotely writable exactly where
    /// and while a window grants it.
    pub const MW_BIND: AccessFlags = AccessFlags(ibv_access_flags::IBV_ACCESS_MW_BIND.0);

    /// Whether all flags of `other` are set.
    pub fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw `IBV_ACCESS_*` bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: AccessFlags) {
        self.0 |= rhs.0;
    }
}

/// Memory whose address does not change while it is registered.
///
/// # Safety
/// Implementations must return the same pointer and length from every call for as long as
/// the value lives, even when the value itself is moved (the bytes must live on the heap or
/// be borrowed, never inline), and the memory must be valid for reads and writes of `len`
/// bytes. A [`MemoryRegion`] relies on this: the device accesses the memory by address.
pub unsafe trait StableBuffer: Send {
    /// Start of the memory.
    fn as_ptr(&self) -> *const u8;
    /// Start of the memory, for writing.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the length is 0.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Vec's heap buffer does not move while the Vec is not resized; a MemoryRegion
// owns the Vec and only exposes its contents as a slice, never `&mut Vec`.
unsafe impl StableBuffer for Vec<u8> {
    fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: a boxed slice's heap buffer never moves and cannot be resized.
unsafe impl StableBuffer for Box<[u8]> {
    fn as_ptr(&self) -> *const u8 {
        <[u8]>::as_ptr(self)
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// Caller-owned memory in a [`MemoryRegion`]: made only by the `unsafe`
/// [`MemoryRegion::register_borrowed`], whose contract keeps the device away from the
/// memory once the borrow ends.
#[derive(Debug)]
pub struct Borrowed<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: `Borrowed` stands for an exclusive `&'a mut [u8]`, which is Send.
unsafe impl Send for Borrowed<'_> {}
// SAFETY: shared access only reads, like `&[u8]`.
unsafe impl Sync for Borrowed<'_> {}

// SAFETY: borrowed memory stays put for the borrow's lifetime; `register_borrowed`'s caller
// guarantees the region is deregistered before the borrow ends.
unsafe impl StableBuffer for Borrowed<'_> {
    fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl<'a> MemoryRegion<Borrowed<'a>> {
    /// Registers memory the caller keeps owning, for the borrow's lifetime.
    ///
    /// # Safety
    /// The device may read and write registered memory by address, whatever Rust knows of
    /// its borrows. The caller must make sure the region is dropped (deregistered) before
    /// `buf`'s borrow ends: not leaked with `mem::forget`, not kept alive by a reference
    /// cycle. And, as for every region, no work request may name the memory once the region
    /// is gone (destroy or drain the queue pairs using it first).
    ///
    /// Safe code cannot register borrowed memory, since a leaked region would outlive the
    /// borrow:
    ///
    /// ```compile_fail
    /// use std::sync::Arc;
    /// use rpc_rdma_verbs::{AccessFlags, MemoryRegion, ProtectionDomain};
    /// fn leak(pd: &Arc<ProtectionDomain>, buf: &mut [u8]) {
    ///     let region = MemoryRegion::register(pd, buf, AccessFlags::LOCAL_WRITE).unwrap();
    ///     std::mem::forget(region);
    /// }
    /// ```
    pub unsafe fn register_borrowed(
        pd: &Arc<ProtectionDomain>,
        buf: &'a mut [u8],
        access: AccessFlags,
    ) -> Result<Self> {
        let ptr = NonNull::new(buf.as_mut_ptr())
            .ok_or_else(|| VerbsError::invalid("ibv_reg_mr", "cannot register a null pointer"))?;
        let borrowed = Borrowed {
            ptr,
            len: buf.len(),
            _borrow: PhantomData,
        };
        Self::register(pd, borrowed, access)
    }
}

/// A zeroed, page-aligned heap buffer (what registrations are best made of: no other data
/// shares its pages, which matters for fork safety and for the device's page tables).
#[derive(Debug)]
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// Allocates `len` zeroed bytes aligned to the page size; `len` must not be 0.
    pub fn new(len: usize) -> Result<AlignedBuffer> {
        if len == 0 {
            return Err(VerbsError::invalid("AlignedBuffer::new", "length 0"));
        }
        let layout = Layout::from_size_align(len, page_size())
            .map_err(|e| VerbsError::invalid("AlignedBuffer::new", e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(VerbsError::Os {
            verb: "alloc_zeroed",
            errno: libc::ENOMEM,
        })?;
        Ok(AlignedBuffer { ptr, layout })
    }
}

impl std::ops::Deref for AlignedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialized (zeroed) bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl std::ops::DerefMut for AlignedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the allocation never moves and has a fixed size.
unsafe impl StableBuffer for AlignedBuffer {
    fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s.is_power_of_two())
        .unwrap_or(4096)
}

/// Registered memory. Owns its buffer `B` (or, for [`Borrowed`], borrows the caller's
/// memory through the `unsafe` [`MemoryRegion::register_borrowed`]); deregisters on drop
/// *before* the buffer is freed, and holds an `Arc` to its protection domain, so the domain
/// outlives it.
///
/// A region registered with [`AccessFlags::LOCAL_WRITE`] may be written by the device (a
/// receive or an RDMA READ posted into it) or by a peer (through its rkey with
/// [`AccessFlags::REMOTE_WRITE`], or a window bound on it) at any time, whatever Rust knows
/// of its borrows. Safe code therefore gets slices only of regions nothing else can write
/// ([`MemoryRegion::as_slice`] is `None` otherwise); the others are read through the `unsafe`
/// [`MemoryRegion::slice_unchecked`], once a completion or a protocol message says the
/// writes are done.
///
/// ```compile_fail
/// # use rpc_rdma_verbs::MemoryRegion;
/// // A slice of a region the device may be writing is not handed out by safe code.
/// fn peek(region: &MemoryRegion) -> &[u8] {
///     region.as_slice()
/// }
/// ```
///
/// ```compile_fail
/// # use rpc_rdma_verbs::MemoryRegion;
/// fn peek(region: &MemoryRegion) -> &[u8] {
///     region.slice_unchecked() // needs `unsafe` and its contract
/// }
/// ```
#[derive(Debug)]
pub struct MemoryRegion<B: StableBuffer = AlignedBuffer> {
    raw: NonNull<ibv_mr>,
    buf: B,
    access: AccessFlags,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: `ibv_mr` is immutable after registration and deregistration is thread-safe; the
// buffer is `Send` by the trait bound.
unsafe impl<B: StableBuffer> Send for MemoryRegion<B> {}
// SAFETY: shared access reads the immutable keys, or hands out `&[u8]` (which needs `B: Sync`)
// only of memory nobody else writes (`as_slice`) or under `slice_unchecked`'s contract.
unsafe impl<B: StableBuffer + Sync> Sync for MemoryRegion<B> {}

impl MemoryRegion<AlignedBuffer> {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers it.
    pub fn alloc(pd: &Arc<ProtectionDomain>, len: usize, access: AccessFlags) -> Result<Self> {
        Self::register(pd, AlignedBuffer::new(len)?, access)
    }
}

impl<B: StableBuffer> MemoryRegion<B> {
    /// Registers `buf` with `pd`. Remote write or atomic access requires `LOCAL_WRITE`.
    pub fn register(pd: &Arc<ProtectionDomain>, mut buf: B, access: AccessFlags) -> Result<Self> {
        if buf.is_empty() {
            return Err(VerbsError::invalid("ibv_reg_mr", "cannot register 0 bytes"));
        }
        let needs_local_write = access.contains(AccessFlags::REMOTE_WRITE)
            || access.contains(AccessFlags::REMOTE_ATOMIC);
        if needs_local_write && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(VerbsError::invalid(
                "ibv_reg_mr",
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
            ));
        }
        let flags = i32::try_from(access.bits())
            .map_err(|_| VerbsError::invalid("ibv_reg_mr", "bad access flags"))?;
        // SAFETY: the PD is alive (we hold an Arc), and `buf` is valid for `len` bytes at a
        // stable address (StableBuffer contract) for as long as the MR exists, since the MR
        // owns (or exclusively borrows) it and deregisters before releasing it.
        let raw = unsafe { ibv_reg_mr(pd.as_ptr(), buf.as_mut_ptr().cast(), buf.len(), flags) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::last_os("ibv_reg_mr"))?;
        Ok(MemoryRegion {
            raw,
            buf,
            access,
            pd: Arc::clone(pd),
        })
    }

    /// Key for local work requests (SGEs).
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered; `lkey` is immutable after registration.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    /// Key the peer uses for RDMA operations on this region.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for `lkey`.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// Virtual address of the first byte (what the peer puts in `remote_addr`).
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the region is empty (never: registering 0 bytes is refused).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Whether the device or a peer may write the memory (it was registered with
    /// `LOCAL_WRITE`, which receives, RDMA READ targets and every remote write need).
    pub fn device_writable(&self) -> bool {
        self.access.contains(AccessFlags::LOCAL_WRITE)
    }

    /// The memory, if nothing but this process can write it: `None` for a
    /// [device-writable](MemoryRegion::device_writable) region, whose bytes may change under
    /// any borrow (see [`MemoryRegion::slice_unchecked`]).
    pub fn as_slice(&self) -> Option<&[u8]> {
        // SAFETY: registered without LOCAL_WRITE, so neither the device nor a peer writes it
        // (a receive or READ into it fails, and remote write needs LOCAL_WRITE); the only
        // writer is `as_mut_slice`, which needs `&mut self`.
        (!self.device_writable()).then(|| unsafe { self.slice_unchecked() })
    }

    /// The memory, for writing (e.g. filling a send buffer), if nothing but this process can
    /// write it: `None` for a device-writable region (see
    /// [`MemoryRegion::slice_mut_unchecked`]).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if self.device_writable() {
            return None;
        }
        // SAFETY: as in `as_slice`; `&mut self` makes the access exclusive on our side.
        Some(unsafe { self.slice_mut_unchecked() })
    }

    /// The memory, whatever may write it.
    ///
    /// # Safety
    /// While the slice lives, nothing may write the memory: no receive or RDMA READ posted
    /// into it may be outstanding, and no peer may hold a key that lets it write there (the
    /// region's rkey with remote write, or a memory window bound on it).
    pub unsafe fn slice_unchecked(&self) -> &[u8] {
        // SAFETY: valid for `len` bytes (StableBuffer contract), initialized (all buffer
        // types are initialized byte slices), unchanged while borrowed (the caller's
        // contract; our own writers need `&mut self`).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr(), self.buf.len()) }
    }

    /// The memory for writing, whatever else may write it.
    ///
    /// # Safety
    /// As for [`MemoryRegion::slice_unchecked`]: nothing but this slice may write the memory
    /// while it lives.
    pub unsafe fn slice_mut_unchecked(&mut self) -> &mut [u8] {
        // SAFETY: as in `slice_unchecked`, and `&mut self` makes the access exclusive on our
        // side.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr(), self.buf.len()) }
    }

    /// A scatter/gather entry for bytes `range` of this region.
    pub fn sge(&self, range: Range<usize>) -> Result<Sge> {
        if range.start > range.end || range.end > self.len() {
            return Err(VerbsError::invalid(
                "MemoryRegion::sge",
                format!("range {range:?} outside the region of {} bytes", self.len()),
            ));
        }
        let length = u32::try_from(range.end - range.start)
            .map_err(|_| VerbsError::invalid("MemoryRegion::sge", "an SGE covers at most 4 GiB"))?;
        Ok(Sge::new(
            self.addr() + range.start as u64,
            length,
            self.lkey(),
        ))
    }

    pub(crate) fn as_raw(&self) -> *mut ibv_mr {
        self.raw.as_ptr()
    }

    /// Where the peer finds this region (address and rkey), to send it over.
    pub fn remote_addr(&self) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr(),
            rkey: self.rkey(),
        }
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl<B: StableBuffer> Drop for MemoryRegion<B> {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once; the buffer is released only
        // after this (fields drop after `drop` returns), so the device never sees freed memory.
        let ret = unsafe { ibv_dereg_mr(self.raw.as_ptr()) };
        if let Err(e) = check("ibv_dereg_mr", ret) {
            tracing::warn!(error = %e, "deregistering a memory region failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_page_aligned_and_zeroed() {
        let buf = AlignedBuffer::new(10_000).unwrap();
        assert_eq!(buf.as_ptr() as usize % page_size(), 0);
        assert_eq!(buf.len(), 10_000);
        assert!(buf.iter().all(|&b| b == 0));
        assert!(AlignedBuffer::new(0).is_err());
    }

    #[test]
    fn access_flags_compose() {
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert!(rw.contains(AccessFlags::REMOTE_WRITE));
        assert!(!rw.contains(AccessFlags::REMOTE_READ));
    }
}
