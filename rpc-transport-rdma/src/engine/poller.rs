//! The engine's thread: processes the completions of every connection when no caller does,
//! and the rdma_cm events of client connections.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    should_yield, Engine, Polled, SharedCq, CLOCK_EVERY, TOKEN_ASYNC, TOKEN_COMPLETIONS, TOKEN_KICK,
};

/// How often a spinning poller looks at the rdma_cm channels.
const CM_CHECK: Duration = Duration::from_millis(1);
/// Longest a sleeping poller sleeps: everything that needs it sooner wakes it (a
/// completion on an armed CQ, an rdma_cm event, a kick from a parking caller, a close left
/// to it, the last connection leaving), so an idle process wakes only this often.
const SLEEP_SLICE: Duration = Duration::from_secs(1);
/// How long the poller sleeps between looks at whether blocking callers still drive the
/// CQs. Long on purpose: every case that needs the poller sooner wakes it (a caller about
/// to park, an async call about to wait, an rdma_cm event), and each needless wake-up
/// steals a core from the callers.
const CALLER_WINDOW: Duration = Duration::from_millis(50);

/// Least time between two keepalive ticks of the connections (a sleeping poller ticks when
/// it wakes, at least once a second).
const KEEPALIVE_TICK: Duration = Duration::from_millis(250);

/// Turns of a spinning poller's loop between two looks for stalled senders (a sleeping one
/// looks whenever it goes to sleep, at least once a second).
const STALL_CHECK_EVERY: u32 = 1 << 14;

pub(super) fn spawn(engine: Arc<Engine>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("rpc-rdma-poll".into())
        .spawn(move || {
            let mut poller = Poller::new(engine);
            // A panic escaping the upper layer must not leave every connection of the
            // engine without a poller: log it and go on.
            while std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| poller.run())).is_err() {
                tracing::error!("the RDMA poller panicked; it carries on");
            }
        })
        .map(drop)
}

/// Whether an event-mode poller that found nothing in its last `looks` looks at the CQs
/// looks again rather than arming and sleeping: completions close behind the last (a busy
/// connection's next messages) are then taken without a wake-up.
fn lingers(looks: u32, linger: u32) -> bool {
    looks <= linger
}

struct Poller {
    engine: Arc<Engine>,
    cqs: Arc<[Arc<SharedCq>]>,
    cqs_epoch: u64,
    /// A kick or a completion event: the next pass over the CQs is owed, whoever drives.
    kicked: bool,
    callers_epoch: u64,
    last_tick: Instant,
}

impl Poller {
    fn new(engine: Arc<Engine>) -> Poller {
        let (cqs_epoch, cqs) = engine.cqs();
        Poller {
            engine,
            cqs,
            cqs_epoch,
            kicked: false,
            callers_epoch: 0,
            last_tick: Instant::now(),
        }
    }

    /// Runs until the engine has no connection left. Never inlined into the thread's entry,
    /// so that profiles (`cargo xtask count`) name the poller's own loop.
    #[inline(never)]
    fn run(&mut self) {
        let mode = self.engine.mode;
        let event_mode = mode.sleeps_at_once();
        let mut last_activity = Instant::now();
        let mut last_cm_check = Instant::now();
        let mut idle_spins: u32 = 0;
        let mut passes: u32 = 0;
        loop {
            if self.engine.retire_if_unused() {
                return;
            }
            self.engine.run_attention();
            passes = passes.wrapping_add(1);
            if passes.is_multiple_of(STALL_CHECK_EVERY) {
                self.engine.check_stalls();
                self.tick();
            }
            if !std::mem::take(&mut self.kicked)
                && self.engine.callers.drive(&mut self.callers_epoch)
            {
                // Blocking callers poll their CQs themselves: stay off the CPU and off
                // those CQs, unarmed (armed, every completion would wake us for nothing). A
                // caller about to park, or an async call about to wait, kicks us awake. The
                // CQs nobody spins on are armed as when sleeping.
                let engine = self.engine.clone();
                engine.poller_unarmed.store(true, Ordering::Release);
                if self.arm(|cq| cq.spinners.load(Ordering::Acquire) == 0) {
                    self.wait(CALLER_WINDOW);
                }
                engine.poller_unarmed.store(false, Ordering::Release);
                // One look at every CQ even so: a caller whose executor stopped polling it
                // must not keep the other connections on its CQ waiting.
                self.poll_all();
                continue;
            }
            if self.poll_all() == Polled::Some {
                idle_spins = 0;
                continue;
            }
            idle_spins = idle_spins.wrapping_add(1);
            if event_mode && lingers(idle_spins, self.engine.event_linger) {
                std::hint::spin_loop();
                continue;
            }
            // Clock reads are not free everywhere: look at the time now and then, never
            // right after a completion (the next one may be close behind). Event mode does
            // not spin past its linger: it arms and sleeps once that many looks found
            // nothing (an idle or lightly loaded process leaves the CPU to the threads its
            // completions wake).
            if !event_mode && !idle_spins.is_multiple_of(CLOCK_EVERY) {
                if should_yield(idle_spins) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            if idle_spins == CLOCK_EVERY {
                last_activity = Instant::now();
            }
            if !event_mode && last_cm_check.elapsed() >= CM_CHECK {
                last_cm_check = Instant::now();
                self.wait(Duration::ZERO);
            }
            if !event_mode
                && mode
                    .spin()
                    .is_none_or(|spin| last_activity.elapsed() < spin)
            {
                std::hint::spin_loop();
                continue;
            }
            if self.arm(|_| true) {
                self.wait(SLEEP_SLICE);
            }
        }
    }

    /// Arms the CQs `which` selects, then looks at them once more: a completion that
    /// arrived before arming raised no event. True if it is safe to sleep: nothing was
    /// found, and no other thread was in the middle of polling one of them.
    fn arm(&mut self, which: impl Fn(&SharedCq) -> bool) -> bool {
        self.refresh_cqs();
        let mut quiet = true;
        for cq in self.cqs.iter().filter(|cq| which(cq)) {
            if let Err(e) = cq.cq.req_notify(false) {
                tracing::error!(%e, "ibv_req_notify_cq failed; polling instead of sleeping");
                quiet = false;
            }
        }
        for cq in self.cqs.iter().filter(|cq| which(cq)) {
            if self.engine.poll(cq) != Polled::Empty {
                quiet = false;
            }
        }
        quiet && !self.kicked
    }

    /// Re-reads the engine's CQs if a new one was created since the last look.
    fn refresh_cqs(&mut self) {
        if self.engine.cqs_epoch.load(Ordering::Acquire) != self.cqs_epoch {
            (self.cqs_epoch, self.cqs) = self.engine.cqs();
        }
    }

    /// One pass over every CQ: `Some` if any had completions, `Busy` if none had but one
    /// was being polled by another thread.
    fn poll_all(&mut self) -> Polled {
        self.refresh_cqs();
        let mut result = Polled::Empty;
        for cq in self.cqs.iter() {
            match self.engine.poll(cq) {
                Polled::Some => result = Polled::Some,
                Polled::Busy if result == Polled::Empty => result = Polled::Busy,
                _ => {}
            }
        }
        result
    }

    /// Ticks the connections' keepalive if it is time.
    fn tick(&mut self) {
        let elapsed = self.last_tick.elapsed();
        if elapsed >= KEEPALIVE_TICK {
            self.last_tick = Instant::now();
            self.engine.keepalive_tick(elapsed);
        }
    }

    /// Sleeps in epoll for up to `timeout` and handles what woke it.
    fn wait(&mut self, timeout: Duration) {
        let engine = self.engine.clone();
        engine.check_stalls();
        self.tick();
        engine.epoll.wait(timeout, |token| match token {
            TOKEN_COMPLETIONS => {
                while let Ok(Some(_)) = engine.channel.try_get_event() {}
                // Whatever woke us is ours to process, even if a caller polled a moment ago.
                self.kicked = true;
            }
            TOKEN_KICK => {
                engine.kick.drain();
                engine.callers.handed_over(&mut self.callers_epoch);
                self.kicked = true;
            }
            TOKEN_ASYNC => engine.async_events(),
            tag => engine.cm_ready(tag),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::lingers;

    #[test]
    fn event_polling_sleeps_after_its_linger_and_at_once_without_one() {
        assert!(!lingers(1, 0), "no linger: the first empty look sleeps");
        assert!(lingers(1, 64) && lingers(64, 64), "looks within the linger");
        assert!(!lingers(65, 64), "the look past it sleeps");
    }
}
