//! Memory a device can send from where it lies, listed by the address of its first byte:
//! the application's [`RegisteredBuffer`](super::RegisteredBuffer)s, and bodies that arrived
//! by RDMA WRITE while `Bytes` views of them live ([`placed_view`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::RwLock;

use crate::engine::Engine;
use crate::large_pool::ArrivedBody;
use crate::verbs::ProtectionDomain;

/// Memory on the list.
pub(super) trait Reachable: Send + Sync + std::fmt::Debug {
    /// The local key of its registration with `pd`, if it has one.
    fn lkey(&self, pd: &Arc<ProtectionDomain>) -> Option<u32>;

    /// Registers it with a new engine's protection domain, if it is application memory.
    fn register(&self, _engine: &Engine) {}

    /// Lets go of its registration with a device's protection domain, which is going.
    fn unregister(&self, _pd: &Arc<ProtectionDomain>) {}

    /// A send starts reading it (see [`Held`]).
    fn hold(&self) {}

    /// The send is done reading it.
    fn unhold(&self) {}
}

/// A send's hold on memory it gathers from: the memory stays, and stays unwritten, until
/// the hold drops (after the send's WRITEs completed).
#[derive(Debug)]
pub(super) struct Held(Arc<dyn Reachable>);

impl Held {
    pub(super) fn new(memory: Arc<dyn Reachable>) -> Held {
        memory.hold();
        Held(memory)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.unhold();
    }
}

/// An entry of the list: the memory's length, and the memory, held weakly.
type Entry = (usize, Weak<dyn Reachable>);

/// The list, by first byte. Memory leaves when its last handle drops (see [`unlist`]).
static LISTED: RwLock<BTreeMap<usize, Entry>> = RwLock::new(BTreeMap::new());

/// Lists `len` bytes of memory at `start`.
pub(super) fn list(start: usize, len: usize, memory: Weak<dyn Reachable>) {
    LISTED.write().insert(start, (len, memory));
}

/// Takes the memory at `start` off the list, from its `Drop`: only if no handle is left, so
/// that memory listed since at the same address (once this was freed) stays.
pub(super) fn unlist(start: usize) {
    let mut listed = LISTED.write();
    if listed
        .get(&start)
        .is_some_and(|(_, memory)| memory.strong_count() == 0)
    {
        listed.remove(&start);
    }
}

/// Whether anything is listed: when nothing is, no body needs a look for runs to gather.
pub(crate) fn any_listed() -> bool {
    !LISTED.read().is_empty()
}

/// The listed memory that `len` bytes at `addr` lie in, and where it starts.
pub(super) fn find(addr: usize, len: usize) -> Option<(usize, Arc<dyn Reachable>)> {
    let (start, weak) = {
        let listed = LISTED.read();
        let (&start, (listed_len, memory)) = listed.range(..=addr).next_back()?;
        // Bounds first: memory the bytes do not lie in is not even upgraded.
        if addr.checked_add(len)? > start + listed_len {
            return None;
        }
        (start, memory.clone())
    };
    // Upgraded after the lock is let go: dropping the last handle takes the lock.
    Some((start, weak.upgrade()?))
}

/// Every listed memory now, upgraded (dropped by the caller, after the lock: it may hold
/// the last handle of some).
fn live() -> Vec<Arc<dyn Reachable>> {
    LISTED
        .read()
        .values()
        .filter_map(|(_, memory)| memory.upgrade())
        .collect()
}

/// Registers every listed buffer with a new engine's protection domain (a connection set
/// the engine up).
pub(crate) fn register_all(engine: &Engine) {
    for memory in live() {
        memory.register(engine);
    }
}

/// Lets go of every listed buffer's registration with a protection domain whose last
/// engine is gone, so that registrations do not pile up as engines come and go.
pub(crate) fn unregister_all(pd: &Arc<ProtectionDomain>) {
    for memory in live() {
        memory.unregister(pd);
    }
}

/// A large body that arrived by RDMA WRITE, handed up as `Bytes` views of its buffer.
/// Listed while they live, so that a message sending these bytes on over the same device
/// (an echo, or a call the handler makes to another server) sends them from where they
/// lie.
#[derive(Debug)]
struct Placed {
    body: ArrivedBody,
    start: usize,
}

impl Reachable for Placed {
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
    let len = placed.body.buffer().len();
    let weak: Weak<dyn Reachable> = Arc::downgrade(&placed) as Weak<dyn Reachable>;
    list(start, len, weak);
    Bytes::from_owner(PlacedView(placed))
}
