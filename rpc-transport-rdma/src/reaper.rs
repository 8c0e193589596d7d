//! Verbs teardown off the dropping thread.
//!
//! Destroying a queue pair or an rdma_cm id can block in the kernel: soft-RoCE waits up to
//! 50 s for the last reference a queued packet holds on a queue pair, and the CM may wait
//! out its retries of an unanswered disconnect request. `Drop` must not block, and the last
//! reference to a connection may go anywhere (an async task, the application dropping a
//! received buffer, the poller), so a connection's verbs objects are destroyed, in their
//! order, by one reaper thread of the process, started with the first teardown. Their
//! resources count as in use until then.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

type Teardown = Box<dyn FnOnce() + Send>;

static REAPER: OnceLock<Option<Mutex<Sender<Teardown>>>> = OnceLock::new();

fn start() -> Option<Mutex<Sender<Teardown>>> {
    let (tx, rx) = channel::<Teardown>();
    let spawned = std::thread::Builder::new()
        .name("rpc-rdma-reaper".into())
        .spawn(move || rx.into_iter().for_each(|teardown| teardown()));
    match spawned {
        Ok(_) => Some(Mutex::new(tx)),
        Err(e) => {
            tracing::warn!(%e, "no reaper thread: verbs objects are destroyed where dropped");
            None
        }
    }
}

/// Runs `teardown` on the reaper thread (on this one if there is none).
pub(crate) fn reap(teardown: impl FnOnce() + Send + 'static) {
    let teardown: Teardown = Box::new(teardown);
    let refused = match REAPER.get_or_init(start) {
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
