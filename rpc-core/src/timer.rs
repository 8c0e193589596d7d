//! One process-wide thread that fails async calls whose deadline passed, and wakes async
//! waits that have a deadline (a call waiting for its channel to connect).
//!
//! Async calls must time out on any executor, so the client cannot borrow a runtime's timer.
//! Blocking calls do not use this: they park with a timeout.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Waker};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::call_table::CallTable;
use crate::Status;

/// Identifies a scheduled deadline so it can be cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TimerKey {
    at: Instant,
    seq: u64,
}

enum Entry {
    /// Fail call `call_id` of `table` (if both are still there).
    Call {
        table: Weak<CallTable>,
        call_id: u64,
    },
    /// Wake a task that looks at its deadline itself.
    Wake(Waker),
}

pub(crate) struct DeadlineTimer {
    entries: Mutex<BTreeMap<TimerKey, Entry>>,
    changed: Condvar,
    seq: AtomicU64,
}

impl DeadlineTimer {
    /// The process-wide timer, started on first use.
    pub(crate) fn global() -> &'static Arc<DeadlineTimer> {
        static TIMER: OnceLock<Arc<DeadlineTimer>> = OnceLock::new();
        TIMER.get_or_init(|| {
            let timer = Arc::new(DeadlineTimer {
                entries: Mutex::new(BTreeMap::new()),
                changed: Condvar::new(),
                seq: AtomicU64::new(0),
            });
            let worker = timer.clone();
            std::thread::Builder::new()
                .name("rpc-deadlines".into())
                .spawn(move || worker.run())
                .expect("spawning the deadline thread");
            timer
        })
    }

    /// Fails `call_id` in `table` with `DeadlineExceeded` at `at` unless cancelled first.
    pub(crate) fn schedule(&self, at: Instant, table: &Arc<CallTable>, call_id: u64) -> TimerKey {
        self.insert(
            at,
            Entry::Call {
                table: Arc::downgrade(table),
                call_id,
            },
        )
    }

    /// Wakes `waker` at `at` unless cancelled first.
    pub(crate) fn schedule_wake(&self, at: Instant, waker: Waker) -> TimerKey {
        self.insert(at, Entry::Wake(waker))
    }

    fn insert(&self, at: Instant, entry: Entry) -> TimerKey {
        let key = TimerKey {
            at,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
        };
        let mut entries = self.entries.lock();
        let is_earliest = entries.keys().next().is_none_or(|first| key < *first);
        entries.insert(key, entry);
        drop(entries);
        if is_earliest {
            self.changed.notify_one();
        }
        key
    }

    pub(crate) fn cancel(&self, key: TimerKey) {
        // A waker's drop may run a task's code: not under our lock.
        let removed = self.entries.lock().remove(&key);
        drop(removed);
    }

    fn run(&self) {
        let mut entries = self.entries.lock();
        loop {
            let now = Instant::now();
            while let Some(entry) = entries.first_entry() {
                if entry.key().at > now {
                    break;
                }
                // Completing a call or waking a task runs foreign code: not under our lock.
                let entry = entry.remove();
                parking_lot::MutexGuard::unlocked(&mut entries, || fire(entry));
            }
            match entries.keys().next().map(|k| k.at) {
                Some(at) => {
                    self.changed.wait_until(&mut entries, at);
                }
                None => self.changed.wait(&mut entries),
            }
        }
    }
}

fn fire(entry: Entry) {
    match entry {
        Entry::Call { table, call_id } => {
            if let Some(table) = table.upgrade() {
                table.complete(
                    call_id,
                    Err(Status::deadline_exceeded(
                        "deadline exceeded before the response arrived",
                    )),
                );
            }
        }
        Entry::Wake(waker) => waker.wake(),
    }
}

/// Has a task woken at an instant, once per waker (the task's, as last polled); stops on
/// drop. For futures that look at their own limit when polled.
#[derive(Debug, Default)]
pub(crate) struct WakeAt {
    armed: Option<(TimerKey, Waker)>,
}

impl WakeAt {
    /// Wakes `cx`'s task at `at`: schedules it once, again if the task's waker changed.
    pub(crate) fn arm(&mut self, at: Instant, cx: &Context<'_>) {
        if let Some((key, waker)) = &self.armed {
            if key.at == at && waker.will_wake(cx.waker()) {
                return;
            }
            DeadlineTimer::global().cancel(*key);
        }
        let key = DeadlineTimer::global().schedule_wake(at, cx.waker().clone());
        self.armed = Some((key, cx.waker().clone()));
    }

    /// Cancels the wake, if one is scheduled.
    pub(crate) fn stop(&mut self) {
        if let Some((key, _)) = self.armed.take() {
            DeadlineTimer::global().cancel(key);
        }
    }
}

impl Drop for WakeAt {
    fn drop(&mut self) {
        self.stop();
    }
}
