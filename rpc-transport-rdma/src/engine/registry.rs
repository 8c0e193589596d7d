//! Which connection a completion belongs to: the tag packed into every `wr_id`.
//!
//! Tags are handed out in increasing order and never reused while the process lives (29
//! bits: half a billion connections), so a late completion of a connection that is gone
//! finds no entry instead of someone else's. A tag is reserved before its queue pair
//! exists; completions that arrive before the connection registers (a client's first
//! receive can race the ESTABLISHED event) wait in the entry and are handed over with the
//! registration.
//!
//! A shared receive queue has a tag of its own, in the `wr_id` of its receives: their
//! completions are routed by the `qp_num` of the queue pair that received, which each
//! connection binds to its tag when its queue pair is created.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::ops::Range;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::conn::Conn;
use crate::shared_recv::SharedRecv;
use crate::verbs::WorkCompletion;

/// Largest tag `WorkId::to_wr_id` can carry.
const MAX_TAG: u32 = (1 << crate::protocol::WorkId::CONNECTION_BITS) - 1;

/// Completions that may wait for a connection still being set up: its whole receive ring
/// at most, plus the few sends of a handshake.
pub(crate) const MAX_EARLY: usize = 4096;

enum Entry {
    /// Reserved; the connection is being created. Completions wait here.
    Early(Vec<WorkCompletion>),
    /// More completions came before the connection registered than may wait: some were
    /// lost, so the connection cannot start.
    Overflowed,
    Live(Weak<Conn>),
    /// A shared receive queue: completions of its receives name it.
    Srq(Weak<SharedRecv>),
}

/// Where a completion goes.
pub(crate) enum Route {
    Conn(Arc<Conn>),
    /// Kept for a connection being set up.
    Held,
    /// Its connection is gone (or the tag was never ours): drop it.
    Gone,
    /// Receives of a shared receive queue whose queue pair is gone: their buffers go back.
    Srq(Arc<SharedRecv>),
}

#[derive(Default)]
pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u32,
    entries: FxHashMap<u32, Entry>,
    /// The connection tag of each queue pair (to route a shared receive queue's receives
    /// and the device's asynchronous events).
    qps: FxHashMap<u32, u32>,
}

impl Inner {
    /// Where completions with `tag` go; keeps them if their connection is being set up.
    fn route(&mut self, tag: u32, run: &[WorkCompletion]) -> Route {
        match self.entries.get_mut(&tag) {
            Some(Entry::Live(conn)) => conn.upgrade().map_or(Route::Gone, Route::Conn),
            Some(Entry::Early(early)) if early.len() + run.len() <= MAX_EARLY => {
                early.extend(run.iter().cloned());
                Route::Held
            }
            Some(entry @ Entry::Early(_)) => {
                tracing::warn!(tag, "completions of a connection being set up overflowed");
                *entry = Entry::Overflowed;
                Route::Gone
            }
            Some(Entry::Srq(srq)) => srq.upgrade().map_or(Route::Gone, Route::Srq),
            Some(Entry::Overflowed) | None => Route::Gone,
        }
    }

    fn next_tag(&mut self) -> Option<u32> {
        if self.next >= MAX_TAG {
            return None;
        }
        self.next += 1;
        Some(self.next)
    }
}

impl Registry {
    /// A fresh tag, for a connection about to be created. None once every tag was used.
    pub(crate) fn reserve(&self) -> Option<u32> {
        let mut inner = self.inner.lock();
        let tag = inner.next_tag()?;
        inner.entries.insert(tag, Entry::Early(Vec::new()));
        Some(tag)
    }

    /// The connection of `tag` is ready: returns the completions that arrived before it, or
    /// `None` if more came than could wait (the connection must not start).
    pub(crate) fn register(&self, tag: u32, conn: &Arc<Conn>) -> Option<Vec<WorkCompletion>> {
        let mut inner = self.inner.lock();
        match inner.entries.insert(tag, Entry::Live(Arc::downgrade(conn))) {
            Some(Entry::Early(early)) => Some(early),
            Some(Entry::Overflowed) => None,
            _ => Some(Vec::new()),
        }
    }

    /// The connection of `tag` is gone; later completions with it are dropped. `qp_num`:
    /// its queue pair, if it had one.
    pub(crate) fn remove(&self, tag: u32, qp_num: Option<u32>) {
        let mut inner = self.inner.lock();
        inner.entries.remove(&tag);
        // The device may already have given the number to a new queue pair (this one was
        // destroyed before its attachment): only our own binding goes.
        if let Some(qp_num) = qp_num.filter(|n| inner.qps.get(n) == Some(&tag)) {
            inner.qps.remove(&qp_num);
        }
    }

    /// A fresh tag for a shared receive queue.
    pub(crate) fn reserve_srq(&self) -> Option<u32> {
        self.inner.lock().next_tag()
    }

    /// The shared receive queue of `tag` is ready.
    pub(crate) fn register_srq(&self, tag: u32, srq: &Arc<SharedRecv>) {
        let entry = Entry::Srq(Arc::downgrade(srq));
        self.inner.lock().entries.insert(tag, entry);
    }

    /// Queue pair `qp_num` belongs to the connection of `tag`.
    pub(crate) fn bind_qp(&self, qp_num: u32, tag: u32) {
        self.inner.lock().qps.insert(qp_num, tag);
    }

    /// Routes a batch of polled completions under one lock: splits it into runs of one
    /// connection each, in CQ order, and says where each run goes. A completion's tag is
    /// `tag_of(wc)` (which also says whether it is a receive's), but a shared receive
    /// queue's receive goes by the connection whose queue pair received it (by the queue's
    /// own tag if that connection is gone); `shared_recv` says whether any such queue
    /// exists. A connection being set up keeps its runs ([`Route::Held`]).
    pub(crate) fn route_batch(
        &self,
        polled: &[WorkCompletion],
        shared_recv: bool,
        tag_of: impl Fn(&WorkCompletion) -> (u32, bool),
    ) -> SmallVec<[(Range<usize>, Route); 2]> {
        let mut inner = self.inner.lock();
        let tag = |inner: &Inner, wc: &WorkCompletion| {
            let (tag, receive) = tag_of(wc);
            if !(shared_recv && receive) {
                return tag;
            }
            match inner.entries.get(&tag) {
                Some(Entry::Srq(_)) => inner.qps.get(&wc.qp_num()).copied().unwrap_or(tag),
                _ => tag,
            }
        };
        let mut routes = SmallVec::new();
        let mut start = 0;
        while start < polled.len() {
            let run_tag = tag(&inner, &polled[start]);
            let end = (start + 1..polled.len())
                .find(|&i| tag(&inner, &polled[i]) != run_tag)
                .unwrap_or(polled.len());
            let route = inner.route(run_tag, &polled[start..end]);
            routes.push((start..end, route));
            start = end;
        }
        routes
    }

    /// The live connection of `tag`.
    pub(crate) fn get(&self, tag: u32) -> Option<Arc<Conn>> {
        match self.inner.lock().entries.get(&tag) {
            Some(Entry::Live(conn)) => conn.upgrade(),
            _ => None,
        }
    }

    /// The live connection whose queue pair is `qp_num`.
    pub(crate) fn qp_conn(&self, qp_num: u32) -> Option<Arc<Conn>> {
        let inner = self.inner.lock();
        let tag = inner.qps.get(&qp_num)?;
        match inner.entries.get(tag) {
            Some(Entry::Live(conn)) => conn.upgrade(),
            _ => None,
        }
    }

    /// Every live connection.
    pub(crate) fn live(&self) -> Vec<Arc<Conn>> {
        self.inner
            .lock()
            .entries
            .values()
            .filter_map(|entry| match entry {
                Entry::Live(conn) => conn.upgrade(),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_removal_keeps_the_new_owner_of_a_reused_qp_number() {
        let registry = Registry::default();
        let old = registry.reserve().expect("tag");
        registry.bind_qp(5, old);
        // The old queue pair is destroyed; the device gives its number to a new one before
        // the old connection's attachment goes.
        let new = registry.reserve().expect("tag");
        registry.bind_qp(5, new);
        registry.remove(old, Some(5));
        assert_eq!(registry.inner.lock().qps.get(&5), Some(&new));
        registry.remove(new, Some(5));
        assert!(registry.inner.lock().qps.is_empty());
    }
}
