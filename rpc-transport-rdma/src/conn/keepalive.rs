//! Keepalive probes of idle connections (see the protocol's `probe` module): the only way
//! a connection learns that its queue pair went to the error state when no completion says
//! so (on a shared receive queue, with a device that raises no asynchronous event for it,
//! as soft-RoCE), or that its peer died while nothing was in flight.
//!
//! The engine's poller ticks every connection now and then ([`Conn::keepalive_tick`]). A
//! connection that processed no completion for [`Liveness::keepalive`](crate::Liveness::keepalive) posts a probe; a
//! failed probe closes it like any failed work request, and so does a probe left
//! unanswered, with nothing else completing, for [`Liveness::keepalive_timeout`](crate::Liveness::keepalive_timeout) (the
//! transport's retries may take longer, or forever: soft-RoCE never gives up at a
//! `retry_count` of 7). Busy connections are never probed; an idle one costs one
//! zero-length WRITE and its acknowledgement per interval.

use std::time::Duration;

use rpc_core::Status;

use super::{Conn, State};
#[cfg(doc)]
use crate::config::RdmaConfig;
use crate::protocol::WorkId;

/// A connection's idleness and probe, part of its `State`.
pub(super) struct Keepalive {
    /// Idle time after which to probe; `None`: never.
    interval: Option<Duration>,
    /// Longest a probe may go unanswered.
    timeout: Duration,
    /// Completions were processed since the last tick.
    active: bool,
    /// Time without activity (or, while `probing`, since the probe), as of the last tick.
    idle: Duration,
    /// A probe is posted and has not completed.
    probing: bool,
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

impl Keepalive {
    pub(super) fn new(interval: Option<Duration>, timeout: Duration) -> Keepalive {
        Keepalive {
            interval,
            timeout,
            active: false,
            idle: Duration::ZERO,
            probing: false,
        }
    }

    /// Completions were processed.
    pub(super) fn active(&mut self) {
        self.active = true;
    }

    /// Longest a probe may go unanswered.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The probe completed.
    pub(super) fn answered(&mut self) {
        self.probing = false;
    }

    /// `elapsed` went by since the last tick.
    fn tick(&mut self, elapsed: Duration) -> Tick {
        let Some(interval) = self.interval else {
            return Tick::Nothing;
        };
        if std::mem::take(&mut self.active) {
            self.idle = Duration::ZERO;
            return Tick::Nothing;
        }
        self.idle = self.idle.saturating_add(elapsed);
        let (limit, due) = if self.probing {
            (self.timeout, Tick::Dead)
        } else {
            (interval, Tick::Probe)
        };
        if self.idle < limit {
            return Tick::Nothing;
        }
        self.idle = Duration::ZERO;
        due
    }
}

impl Conn {
    /// `elapsed` went by since the engine's last tick: closes the connection if its peer
    /// hoards a granted buffer, or drained too long after disconnecting, or left a probe
    /// unanswered for the timeout; probes it if it was idle for its keepalive interval.
    /// Called by the poller only.
    pub(crate) fn keepalive_tick(&self, elapsed: Duration) {
        if self.is_closed() {
            return;
        }
        let mut state = self.state.lock();
        // Slots gathered on a connection that went quiet wait no longer than a tick.
        self.release_deferred(&mut state);
        let verdict = self
            .overdue_grant(&state)
            .or_else(|| self.liveness(&mut state, elapsed));
        self.unlock(state);
        if let Some(status) = verdict {
            self.close(status);
        }
    }

    /// Ticks the keepalive; why the connection is dead, if it is.
    fn liveness(&self, state: &mut State, elapsed: Duration) -> Option<Status> {
        if let Some(disconnected) = &state.disconnected {
            // Draining after the peer's disconnect: bounded by the probe's timeout.
            return disconnected.expired(state.keepalive.timeout());
        }
        match state.keepalive.tick(elapsed) {
            Tick::Nothing => None,
            Tick::Dead => Some(Status::unavailable(format!(
                "{} did not acknowledge a keepalive probe within {:?}: the peer is \
                 unreachable or dead",
                self.peer,
                state.keepalive.timeout()
            ))),
            Tick::Probe => {
                if state.proto.start_probe() {
                    tracing::trace!(peer = %self.peer, "keepalive probe");
                    self.post_probe(state);
                    self.run_actions(state);
                }
                None
            }
        }
    }

    /// Posts the probe the protocol let go (a keepalive, a fence for teardown, a drain's
    /// marker); one the queue pair refuses is reported to the protocol, whose actions the
    /// caller runs.
    pub(super) fn post_probe(&self, state: &mut State) {
        state.keepalive.probing = true;
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
        let mut k = Keepalive::new(Some(Duration::from_millis(1000)), Duration::from_secs(5));
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
        let mut off = Keepalive::new(None, Duration::from_secs(5));
        assert_eq!(off.tick(Duration::from_secs(3600)), Tick::Nothing);
    }

    #[test]
    fn an_unanswered_probe_is_dead_after_the_timeout_unless_something_completes() {
        let mut k = Keepalive::new(
            Some(Duration::from_millis(100)),
            Duration::from_millis(1000),
        );
        let tick = Duration::from_millis(400);
        assert_eq!(k.tick(tick), Tick::Probe);
        k.probing = true;
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
