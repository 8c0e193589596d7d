//! Registered buffers for large bodies, and the memory windows that expose them.
//!
//! One pool per connection (registrations and windows belong to its protection domain).
//! Buffers are registered once and reused: a body leases the smallest free buffer that
//! holds it without wasting more than half, else a new one is registered with its size
//! rounded up to a power of two, so a steady workload stops registering after warm-up.
//! Buffers come back when the last `Bytes` view of a delivered body drops, or when the
//! transfer that read them completes; they stay registered while the cache holds fewer
//! than `cache_bytes`, and are deregistered otherwise. Leases never exceed `budget_bytes`.
//!
//! Every registration counts against the process's limit ([`ProcessLimits`]) until it is
//! deregistered; a lease that would pass it first deregisters this pool's cache, then is
//! refused.
//!
//! Buffers are registered `LOCAL_WRITE | MW_BIND` and never with remote access: the peer
//! reaches one only through a memory window bound over it for one grant.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

#[cfg(doc)]
use crate::budget::ProcessLimits;
use crate::budget::Registered;
use crate::verbs::{AccessFlags, MemoryRegion, MemoryWindow, ProtectionDomain, VerbsError};

/// Smallest buffer registered (smaller bodies round up to it).
const MIN_BUFFER: usize = 64 * 1024;

/// Why a buffer could not be lent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    #[error("{wanted} bytes would exceed the large-buffer budget of {budget} bytes ({lent} lent)")]
    Budget { wanted: u64, budget: u64, lent: u64 },
    #[error(
        "{wanted} bytes would exceed the process's limit of {limit} registered bytes \
         ({held} registered; ProcessLimits::registered_bytes)"
    )]
    Process { wanted: u64, limit: u64, held: u64 },
    #[error("registering a {len}-byte buffer: {source}")]
    Register { len: usize, source: VerbsError },
}

/// A registration, counted against the process's limit while it lives.
#[derive(Debug)]
struct Pooled {
    region: MemoryRegion,
    _counted: Registered,
}

impl Pooled {
    fn len(&self) -> usize {
        self.region.len()
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Registered, unused buffers by capacity.
    free: BTreeMap<usize, Vec<Pooled>>,
    cached: u64,
    lent: u64,
    windows: Vec<MemoryWindow>,
}

/// The pool of one connection.
#[derive(Debug)]
pub(crate) struct LargePool {
    pd: Arc<ProtectionDomain>,
    budget: u64,
    cache: u64,
    inner: Mutex<Inner>,
}

impl LargePool {
    pub(crate) fn new(pd: Arc<ProtectionDomain>, budget: u64, cache: u64) -> Arc<LargePool> {
        Arc::new(LargePool {
            pd,
            budget,
            cache,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Bytes a lease of `len` would take from the budget: `len` rounded up to a sixteenth
    /// of the next power of two (at least [`MIN_BUFFER`]), so a buffer serves bodies of
    /// nearby sizes and wastes at most about 6 % (a power of two would waste up to half:
    /// 2 GiB pinned for a body of 1 GiB and a byte).
    fn capacity_for(len: usize) -> usize {
        let len = len.max(MIN_BUFFER);
        let granule = len
            .checked_next_power_of_two()
            .map_or(MIN_BUFFER, |p| (p / 16).max(MIN_BUFFER));
        len.div_ceil(granule).saturating_mul(granule)
    }

    /// Lends a registered buffer of at least `len` bytes.
    pub(crate) fn lease(self: &Arc<Self>, len: usize) -> Result<LargeBuffer, PoolError> {
        let reused = {
            let mut inner = self.inner.lock();
            let found = inner
                .free
                .range_mut(len.max(1)..=len.saturating_mul(2).max(MIN_BUFFER))
                .find_map(|(_, regions)| regions.pop());
            let charge = found.as_ref().map_or(Self::capacity_for(len), Pooled::len) as u64;
            if inner.lent + charge > self.budget {
                if let Some(region) = found {
                    inner.free.entry(region.len()).or_default().push(region);
                }
                return Err(PoolError::Budget {
                    wanted: charge,
                    budget: self.budget,
                    lent: inner.lent,
                });
            }
            inner.lent += charge;
            inner.free.retain(|_, regions| !regions.is_empty());
            if let Some(region) = &found {
                inner.cached -= region.len() as u64;
            }
            found
        };
        let region = match reused {
            Some(region) => region,
            None => {
                let capacity = Self::capacity_for(len);
                self.register(capacity).inspect_err(|_| {
                    self.inner.lock().lent -= capacity as u64;
                })?
            }
        };
        Ok(LargeBuffer {
            region: Some(region),
            len,
            pool: Arc::clone(self),
        })
    }

    /// Registers a new buffer of `capacity` bytes, within the process's limit.
    fn register(&self, capacity: usize) -> Result<Pooled, PoolError> {
        let counted = Registered::take(capacity as u64).or_else(|_| {
            // Our own cache may be what fills the process's share: give it back first.
            let cache = {
                let mut inner = self.inner.lock();
                inner.cached = 0;
                std::mem::take(&mut inner.free)
            };
            // Deregistered here, outside the lock.
            drop(cache);
            Registered::take(capacity as u64).map_err(|over| PoolError::Process {
                wanted: capacity as u64,
                limit: over.limit,
                held: over.held,
            })
        })?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let region = MemoryRegion::alloc(&self.pd, capacity, access).map_err(|source| {
            PoolError::Register {
                len: capacity,
                source,
            }
        })?;
        Ok(Pooled {
            region,
            _counted: counted,
        })
    }

    fn give_back(&self, region: Pooled) {
        let capacity = region.len() as u64;
        let mut inner = self.inner.lock();
        inner.lent -= capacity;
        if inner.cached + capacity <= self.cache {
            inner.cached += capacity;
            inner.free.entry(region.len()).or_default().push(region);
        }
        // Otherwise `region` drops here: deregistered and freed.
    }

    /// Most bytes lent at once.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// A memory window to bind for a grant.
    pub(crate) fn window(&self) -> Result<MemoryWindow, VerbsError> {
        if let Some(window) = self.inner.lock().windows.pop() {
            return Ok(window);
        }
        MemoryWindow::alloc(&self.pd)
    }

    /// Returns a window whose binding was invalidated.
    pub(crate) fn put_window(&self, window: MemoryWindow) {
        self.inner.lock().windows.push(window);
    }
}

/// A leased buffer: the first `len` bytes of a registered region. Returns to its pool when
/// dropped.
#[derive(Debug)]
pub(crate) struct LargeBuffer {
    region: Option<Pooled>,
    len: usize,
    pool: Arc<LargePool>,
}

impl LargeBuffer {
    /// The registration (whole capacity).
    pub(crate) fn region(&self) -> &MemoryRegion {
        &self.region.as_ref().expect("present until drop").region
    }

    /// Address of the first byte.
    pub(crate) fn addr(&self) -> u64 {
        self.region().addr()
    }

    /// Local key.
    pub(crate) fn lkey(&self) -> u32 {
        self.region().lkey()
    }

    /// Bytes asked for.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The protection domain it is registered with.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pool.pd
    }

    /// The leased bytes, for encoding a body into.
    ///
    /// # Safety
    /// Nothing else may write the buffer while the slice lives: no memory window is bound
    /// on it and no work request names it (it was just leased).
    pub(crate) unsafe fn body_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        let region = &mut self.region.as_mut().expect("present until drop").region;
        // SAFETY: the caller's contract.
        unsafe { &mut region.slice_mut_unchecked()[..len] }
    }
}

/// A leased buffer whose body arrived: no window lets a peer write it any more and no work
/// request names it, so its bytes can be read (and handed up as `Bytes`).
#[derive(Debug)]
pub(crate) struct ArrivedBody(LargeBuffer);

impl ArrivedBody {
    /// # Safety
    /// The peer's last write into `buffer` completed, and no window bound on it is left
    /// valid (it was invalidated or deallocated), nor any work request naming it.
    pub(crate) unsafe fn new(buffer: LargeBuffer) -> ArrivedBody {
        ArrivedBody(buffer)
    }

    /// The buffer it arrived in.
    pub(crate) fn buffer(&self) -> &LargeBuffer {
        &self.0
    }
}

impl AsRef<[u8]> for ArrivedBody {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: nothing writes the buffer any more (`ArrivedBody::new`'s contract).
        unsafe { &self.0.region().slice_unchecked()[..self.0.len] }
    }
}

impl Drop for LargeBuffer {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.pool.give_back(region);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_round_up_by_a_sixteenth_of_the_size() {
        assert_eq!(LargePool::capacity_for(1), MIN_BUFFER);
        assert_eq!(LargePool::capacity_for(MIN_BUFFER + 1), 2 * MIN_BUFFER);
        assert_eq!(LargePool::capacity_for(3 << 20), 3 << 20);
        assert_eq!(
            LargePool::capacity_for((1 << 30) + 8),
            (1 << 30) + (128 << 20)
        );
        for len in [
            100_000usize,
            1 << 20,
            (16 << 20) + 5,
            256 << 20,
            usize::MAX / 4,
        ] {
            let capacity = LargePool::capacity_for(len);
            assert!(
                capacity >= len && capacity - len <= len / 8 + MIN_BUFFER,
                "{len}: {capacity}"
            );
        }
    }
}
