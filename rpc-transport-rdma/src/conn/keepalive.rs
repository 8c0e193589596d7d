//! Keepalive probes of idle connections (see the protocol's `probe` module): the only way
//! a connection learns that its queue pair went to the error state when no completion says
//! so (on a shared receive queue, with a device that raises no asynchronous event for it,
//! as soft-RoCE), or that its peer died while nothing was in flight.
//!
//! The engine's poller ticks every connection now and then ([`Conn::keepalive_tick`]). A
//! connection that processed no completion for [`RdmaConfig::keepalive`] posts a probe; a
//! failed probe closes it like any failed work request, and so does a probe left
//! unanswered, with nothing else completing, for [`RdmaConfig::keepalive_timeout`] (the
//! transport's retries may take longer, or forever: soft-RoCE never gives up at a
//! `retry_count` of 7). Busy connections are never probed; an idle one costs one
//! zero-length WRITE and its acknowledgement per interval.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rpc_core::Status;

use super::{Conn, State};
#[cfg(doc)]
use crate::config::RdmaConfig;
use crate::protocol::WorkId;

/// A connection's idleness and probe, as the poller sees them.
pub(super) struct Keepalive {
    /// Idle time after which to probe, in milliseconds; 0: never.
    interval_ms: u64,
    /// Longest a probe may go unanswered, in milliseconds.
    timeout_ms: u64,
    /// Bumped by every batch of completions processed.
    activity: AtomicU64,
    /// `activity` at the last tick.
    seen: AtomicU64,
    /// Milliseconds without activity (or, while `probing`, since the probe), as of the last
    /// tick.
    idle_ms: AtomicU64,
    /// A probe is posted and has not completed.
    probing: AtomicBool,
}

/// What a tick finds.
#[derive(Debug, PartialEq, Eq)]
enum Tick {
    Nothing,
    /// Idle for a whole interval: probe.
    Probe,
    /// The probe went unanswered for the whole timeout.
    Dead,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Keepalive {
    pub(super) fn new(interval: Option<Duration>, timeout: Duration) -> Keepalive {
        Keepalive {
            interval_ms: interval.map_or(0, |i| millis(i).max(1)),
            timeout_ms: millis(timeout).max(1),
            activity: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            idle_ms: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// Completions were processed. Called under the connection's state lock, so one
    /// thread at a time: a plain load and store, no locked instruction on the hot path.
    pub(super) fn active(&self) {
        let activity = self.activity.load(Ordering::Relaxed);
        self.activity
            .store(activity.wrapping_add(1), Ordering::Relaxed);
    }

    /// Longest a probe may go unanswered.
    pub(super) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The probe completed.
    pub(super) fn answered(&self) {
        self.probing.store(false, Ordering::Relaxed);
    }

    /// `elapsed` went by since the last tick.
    fn tick(&self, elapsed: Duration) -> Tick {
        if self.interval_ms == 0 {
            return Tick::Nothing;
        }
        let activity = self.activity.load(Ordering::Relaxed);
        if self.seen.swap(activity, Ordering::Relaxed) != activity {
            self.idle_ms.store(0, Ordering::Relaxed);
            return Tick::Nothing;
        }
        let idle = self
            .idle_ms
            .load(Ordering::Relaxed)
            .saturating_add(millis(elapsed));
        let (limit, due) = if self.probing.load(Ordering::Relaxed) {
            (self.timeout_ms, Tick::Dead)
        } else {
            (self.interval_ms, Tick::Probe)
        };
        if idle < limit {
            self.idle_ms.store(idle, Ordering::Relaxed);
            return Tick::Nothing;
        }
        self.idle_ms.store(0, Ordering::Relaxed);
        due
    }
}

impl Conn {
    /// `elapsed` went by since the engine's last tick: probes the connection if it was idle
    /// for its keepalive interval, closes it if its probe went unanswered for the timeout.
    /// Called by the poller only.
    pub(crate) fn keepalive_tick(&self, elapsed: Duration) {
        if self.is_closed() {
            return;
        }
        self.expire_grants();
        if self.expire_disconnect() {
            return;
        }
        match self.keepalive.tick(elapsed) {
            Tick::Nothing => {}
            Tick::Dead => self.close(Status::unavailable(format!(
                "{} did not acknowledge a keepalive probe within {:?}: the peer is \
                 unreachable or dead",
                self.peer,
                Duration::from_millis(self.keepalive.timeout_ms)
            ))),
            Tick::Probe => self.probe(),
        }
    }

    fn probe(&self) {
        {
            let mut state = self.state.lock();
            if !state.proto.start_probe() {
                return;
            }
            tracing::trace!(peer = %self.peer, "keepalive probe");
            self.post_probe(&mut state);
            self.run_actions(&mut state);
        }
        self.after_state();
    }

    /// Posts the probe the protocol let go (a keepalive, a fence for teardown, a drain's
    /// marker); one the queue pair refuses is reported to the protocol, whose actions the
    /// caller runs.
    pub(super) fn post_probe(&self, state: &mut State) {
        self.keepalive.probing.store(true, Ordering::Relaxed);
        if let Err(e) = self.res.qp.post_probe(self.res.wr_id(WorkId::Probe)) {
            tracing::warn!(peer = %self.peer, %e, "the queue pair refused a probe");
            state.proto.on_probe_refused();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_after_a_whole_idle_interval_and_never_while_active() {
        let k = Keepalive::new(Some(Duration::from_millis(1000)), Duration::from_secs(5));
        let tick = Duration::from_millis(400);
        assert_eq!(k.tick(tick), Tick::Nothing);
        assert_eq!(k.tick(tick), Tick::Nothing);
        assert_eq!(k.tick(tick), Tick::Probe, "idle for 1200 ms");
        assert_eq!(k.tick(tick), Tick::Nothing, "the count starts over");
        k.active();
        for _ in 0..10 {
            assert_eq!(k.tick(tick), Tick::Nothing, "never while completions come");
            k.active();
        }
        let off = Keepalive::new(None, Duration::from_secs(5));
        assert_eq!(off.tick(Duration::from_secs(3600)), Tick::Nothing);
    }

    #[test]
    fn an_unanswered_probe_is_dead_after_the_timeout_unless_something_completes() {
        let k = Keepalive::new(
            Some(Duration::from_millis(100)),
            Duration::from_millis(1000),
        );
        let tick = Duration::from_millis(400);
        assert_eq!(k.tick(tick), Tick::Probe);
        k.probing.store(true, Ordering::Relaxed);
        assert_eq!(k.tick(tick), Tick::Nothing);
        assert_eq!(k.tick(tick), Tick::Nothing);
        k.active();
        assert_eq!(k.tick(tick), Tick::Nothing, "the peer answered something");
        assert_eq!(k.tick(tick), Tick::Nothing);
        assert_eq!(k.tick(tick), Tick::Nothing);
        assert_eq!(k.tick(tick), Tick::Dead, "1200 ms of silence");
        // The probe's completion, processed like any.
        k.answered();
        k.active();
        assert_eq!(k.tick(tick), Tick::Nothing);
        assert_eq!(k.tick(tick), Tick::Probe, "probing again once answered");
    }
}
