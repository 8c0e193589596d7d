//! Verbs teardown off the dropping thread.
//!
//! Destroying a queue pair or an rdma_cm id can block in the kernel: soft-RoCE waits up to
//! 50 s for the last reference a queued packet holds on a queue pair, and the CM may wait
//! out its retries of an unanswered disconnect request. `Drop` must not block, and the last
//! reference to a connection may go anywhere (an async task, the application dropping a
//! received buffer, the poller), so a connection's verbs objects are destroyed, in their
//! order, by one reaper thread of the process, started with the first teardown. Their
//! resources count as in use until then.
//!
//! Deregistering an application's buffer unpins its pages, which takes long for a large one
//! but never waits on a peer: it has a thread of its own ([`release`]), so that freed
//! memory (and its share of `ProcessLimits::registered_bytes`) is not held up behind a
//! queue pair's teardown.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

type Teardown = Box<dyn FnOnce() + Send>;

/// A thread that runs what it is handed, in order, started with the first.
struct Reaper {
    name: &'static str,
    queue: OnceLock<Option<Mutex<Sender<Teardown>>>>,
}

impl Reaper {
    const fn new(name: &'static str) -> Reaper {
        Reaper {
            name,
            queue: OnceLock::new(),
        }
    }

    fn start(&self) -> Option<Mutex<Sender<Teardown>>> {
        let (tx, rx) = channel::<Teardown>();
        let spawned = std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || rx.into_iter().for_each(|teardown| teardown()));
        match spawned {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                tracing::warn!(%e, thread = self.name, "no reaper thread: teardown runs where dropped");
                None
            }
        }
    }

    /// Runs `teardown` on the thread (on this one if there is none).
    fn run(&self, teardown: Teardown) {
        let refused = match self.queue.get_or_init(|| self.start()) {
            Some(tx) => tx
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .send(teardown)
                .err()
                .map(|e| e.0),
            None => Some(teardown),
        };
        if let Some(teardown) = refused {
            teardown();
        }
    }
}

static VERBS: Reaper = Reaper::new("rpc-rdma-reaper");
static MEMORY: Reaper = Reaper::new("rpc-rdma-release");

/// Runs `teardown` on the reaper thread (on this one if there is none).
pub(crate) fn reap(teardown: impl FnOnce() + Send + 'static) {
    VERBS.run(Box::new(teardown));
}

/// Runs `release` (deregistering and freeing an application's buffer) on the release
/// thread (on this one if there is none).
pub(crate) fn release(release: impl FnOnce() + Send + 'static) {
    MEMORY.run(Box::new(release));
}
