//! Memory a device can send from where it lies, listed by the address of its first byte:
//! the application's [`RegisteredBuffer`](super::RegisteredBuffer)s, and bodies that arrived
//! by RDMA WRITE while `Bytes` views of them live ([`placed_view`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::RwLock;

use crate::large_pool::ArrivedBody;
use crate::verbs::ProtectionDomain;

/// Memory on the list.
pub(super) trait Reachable: Send + Sync + std::fmt::Debug {
    /// Bytes from the listed address.
    fn len(&self) -> usize;

    /// The local key of its registration with `pd`, if it has one.
    fn lkey(&self, pd: &Arc<ProtectionDomain>) -> Option<u32>;

    /// Registers it with a device's new protection domain, if it is application memory.
    fn register(&self, _pd: &Arc<ProtectionDomain>) {}
}

/// The list. Entries are weak: memory leaves when its last holder drops (see [`unlist`]).
static LISTED: RwLock<BTreeMap<usize, Weak<dyn Reachable>>> = RwLock::new(BTreeMap::new());

/// Lists the memory at `start`.
pub(super) fn list(start: usize, memory: Weak<dyn Reachable>) {
    LISTED.write().insert(start, memory);
}

/// Takes the memory at `start` off the list, from its `Drop`: only if no holder is left, so
/// that memory listed since at the same address (once this was freed) stays.
pub(super) fn unlist(start: usize) {
    let mut listed = LISTED.write();
    if listed.get(&start).is_some_and(|m| m.strong_count() == 0) {
        listed.remove(&start);
    }
}

/// The listed memory that `len` bytes at `addr` lie in, and where it starts.
pub(super) fn find(addr: usize, len: usize) -> Option<(usize, Arc<dyn Reachable>)> {
    // Upgraded after the lock is let go: dropping the last holder takes the lock.
    let (start, weak) = LISTED
        .read()
        .range(..=addr)
        .next_back()
        .map(|(&start, memory)| (start, memory.clone()))?;
    let memory = weak.upgrade()?;
    (addr + len <= start + memory.len()).then_some((start, memory))
}

/// Registers every listed buffer with a device's new protection domain (a connection set
/// up the device's engine).
pub(crate) fn register_all(pd: &Arc<ProtectionDomain>) {
    let live: Vec<Arc<dyn Reachable>> = LISTED.read().values().filter_map(Weak::upgrade).collect();
    for memory in &live {
        memory.register(pd);
    }
    // `live` drops here, after the lock: it may hold the last handle of some.
}

/// A large body that arrived by RDMA WRITE, handed up as `Bytes` views of its buffer.
/// Listed while they live, so that a message sending these bytes on over the same
/// connection's device (an echo) sends them from where they lie.
#[derive(Debug)]
struct Placed {
    body: ArrivedBody,
    start: usize,
}

impl Reachable for Placed {
    fn len(&self) -> usize {
        self.body.buffer().len()
    }

    fn lkey(&self, pd: &Arc<ProtectionDomain>) -> Option<u32> {
        let buffer = self.body.buffer();
        Arc::ptr_eq(buffer.pd(), pd).then(|| buffer.lkey())
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        // Before the buffer goes back to its pool (the `body` field drops after this).
        unlist(self.start);
    }
}

/// What the views own.
struct PlacedView(Arc<Placed>);

impl AsRef<[u8]> for PlacedView {
    fn as_ref(&self) -> &[u8] {
        self.0.body.as_ref()
    }
}

/// The arrived `body` as `Bytes`, listed while a view lives.
pub(crate) fn placed_view(body: ArrivedBody) -> Bytes {
    let start = body.as_ref().as_ptr() as usize;
    let placed = Arc::new(Placed { body, start });
    let weak: Weak<dyn Reachable> = Arc::downgrade(&placed) as Weak<dyn Reachable>;
    list(start, weak);
    Bytes::from_owner(PlacedView(placed))
}
