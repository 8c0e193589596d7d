//! The drive lease's hand-over, under every order of a few callers' steps (a deterministic
//! scheduler: proptest picks who runs next).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Instant;

use proptest::prelude::*;

use super::{Lease, CLOCK_EVERY, MAX_LEASE_WAITERS};

/// A task's waker that counts its wake-ups.
#[derive(Default)]
struct Task(AtomicUsize);

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn task() -> (Arc<Task>, Waker) {
    let task = Arc::new(Task::default());
    (task.clone(), Waker::from(task))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Caller {
    /// Not waiting for anything.
    Done,
    /// Holds the lease.
    Driving,
    /// Registered as a waiter at this many wake-ups; woken once the count moves.
    Waiting(usize),
}

#[derive(Debug, Clone, Copy)]
enum Turn {
    /// The caller's task is polled: it waits for a call and tries to drive.
    Poll(usize),
    /// The caller's call completes (if it drives: it gives the lease back).
    Complete(usize),
    /// The holder found nothing for its spin time and steps down (if it holds the lease).
    Idle(usize),
}

fn turn(callers: usize) -> impl Strategy<Value = Turn> {
    (0..callers, 0..3u8).prop_map(|(who, what)| match what {
        0 => Turn::Poll(who),
        1 => Turn::Complete(who),
        _ => Turn::Idle(who),
    })
}

proptest! {
    /// At most one caller drives; a caller that waits for the lease is woken by the next
    /// release; one that stepped down (the poller drives then) is woken by the next release
    /// too; a release wakes everyone waiting, so nobody waits on a free lease unwoken unless
    /// the poller was handed the CQ.
    #[test]
    fn one_driver_and_no_lost_wakeup(steps in prop::collection::vec(turn(4), 1..200)) {
        let lease = Lease::default();
        let tasks: Vec<_> = (0..4).map(|_| task()).collect();
        let wakes = |i: usize| tasks[i].0 .0.load(Ordering::SeqCst);
        let mut callers = [Caller::Done; 4];
        // Whether the poller drives (a holder stepped down, nobody took the lease since).
        let mut poller_drives = false;
        for turn in steps {
            match turn {
                Turn::Poll(i) => match callers[i] {
                    Caller::Driving => {}
                    _ => {
                        callers[i] = if lease.acquire(&tasks[i].1) {
                            poller_drives = false;
                            Caller::Driving
                        } else {
                            Caller::Waiting(wakes(i))
                        };
                    }
                },
                Turn::Complete(i) => {
                    if callers[i] == Caller::Driving {
                        let waiters = lease.release();
                        waiters.into_iter().for_each(Waker::wake);
                    }
                    callers[i] = Caller::Done;
                }
                Turn::Idle(i) => {
                    if callers[i] == Caller::Driving {
                        lease.step_down(&tasks[i].1);
                        callers[i] = Caller::Waiting(wakes(i));
                        poller_drives = true;
                    }
                }
            }
            let drivers = callers.iter().filter(|c| **c == Caller::Driving).count();
            prop_assert!(drivers <= 1, "{drivers} callers drive at once");
            let held = lease.state.lock().held;
            prop_assert_eq!(held, drivers == 1);
            if !held && !poller_drives {
                for (i, caller) in callers.iter().enumerate() {
                    if let Caller::Waiting(at) = caller {
                        prop_assert!(wakes(i) > *at, "caller {i} waits on a free lease, unwoken");
                    }
                }
            }
        }
    }
}

#[test]
fn a_sender_waits_for_the_holder_only_while_there_is_one() {
    let lease = Lease::default();
    let (holder, holder_waker) = task();
    let (sender, sender_waker) = task();
    assert!(
        !lease.wait_if_held(&sender_waker),
        "free: the poller must serve it"
    );
    assert!(lease.acquire(&holder_waker));
    assert!(lease.wait_if_held(&sender_waker));
    assert!(lease.wait_if_held(&sender_waker), "recorded once");
    let waiters = lease.release();
    assert_eq!(waiters.len(), 1);
    waiters.into_iter().for_each(Waker::wake);
    assert_eq!(sender.0.load(Ordering::SeqCst), 1);
    assert_eq!(holder.0.load(Ordering::SeqCst), 0);
}

#[test]
fn waiters_are_bounded_and_woken_past_the_bound() {
    let lease = Lease::default();
    let (_, holder) = task();
    assert!(lease.acquire(&holder));
    let tasks: Vec<_> = (0..=MAX_LEASE_WAITERS).map(|_| task()).collect();
    for (_, waker) in &tasks {
        assert!(!lease.acquire(waker));
    }
    // The one past the bound woke every earlier waiter (they come back if still waiting).
    assert_eq!(lease.state.lock().waiters.len(), 1);
    assert!(tasks[..MAX_LEASE_WAITERS]
        .iter()
        .all(|(t, _)| t.0.load(Ordering::SeqCst) == 1));
    assert_eq!(tasks[MAX_LEASE_WAITERS].0 .0.load(Ordering::SeqCst), 0);
}

#[test]
fn idle_time_reads_the_clock_now_and_then_and_restarts_on_progress() {
    let lease = Lease::default();
    let (_, waker) = task();
    assert!(lease.acquire(&waker));
    let mut reads = 0;
    for _ in 0..2 * CLOCK_EVERY {
        lease.idled(|| {
            reads += 1;
            Instant::now()
        });
    }
    assert_eq!(
        reads, 1,
        "the clock is read once, at the first CLOCK_EVERY-th look"
    );
    assert!(lease.idled(Instant::now).1.is_some());
    lease.progressed();
    assert_eq!(lease.idled(Instant::now), (1, None));
}
