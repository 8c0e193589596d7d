//! Channels that heal: a channel made from a [`Connector`] replaces a connection that died
//! with a new one, trying again with exponential backoff and jitter while the server is
//! unreachable.
//!
//! The states are gRPC's ([`Connectivity`]). A channel connects lazily: the first call
//! (or a call that finds the connection dead) starts an attempt on a helper thread, and calls
//! wait for it. While attempts fail, calls fail fast with the last error's message and
//! `UNAVAILABLE` (or the last error's own code when the client must act on it:
//! `UNAUTHENTICATED`, `PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`), or, with
//! [`ReconnectConfig::wait_for_ready`], wait for a connection until their deadline (or
//! [`ReconnectConfig::connect_wait`] when they have none). One helper thread
//! per channel at most, and only while it has no connection; it sleeps between attempts and
//! ends when the channel is dropped.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::Connection;
use crate::timer::{DeadlineTimer, WakeAt};
use crate::{Code, Status};

/// Opens the connections of a healing channel (a transport and an address).
pub trait Connector: Send + Sync + 'static {
    /// Connects, on the calling thread (the channel's helper thread), within the
    /// transport's connect timeout; the error names the target and the cause.
    fn connect(&self) -> Result<Connection, Status>;

    /// Where it connects, for messages (a URL).
    fn target(&self) -> &str;
}

/// How a healing channel reconnects, and what calls do meanwhile.
///
/// The delay before attempt `n + 1` after `n` failures in a row is
/// `min(initial_backoff × multiplier^(n−1), max_backoff)`, randomized by ±`jitter`
/// (gRPC's connection backoff). A connection that succeeds resets the count, so the first
/// attempt after a connection dies is immediate.
#[derive(Debug, Clone)]
pub struct ReconnectConfig {
    /// Delay after the first failed attempt (default 100 ms).
    pub initial_backoff: Duration,
    /// Longest delay between attempts (default 10 s).
    pub max_backoff: Duration,
    /// Growth of the delay per failed attempt (default 1.6).
    pub multiplier: f64,
    /// Relative randomization of each delay, in `0.0..=1.0` (default 0.2: ±20%), so that
    /// clients of a restarted server do not all come back at the same instant.
    pub jitter: f64,
    /// Calls made while attempts fail wait for a connection instead of failing at once
    /// (gRPC's wait-for-ready; default false: they fail fast with `Unavailable`).
    pub wait_for_ready: bool,
    /// How long a call without a deadline waits for a connection, in either mode, before it
    /// fails with `Unavailable` (default 20 s). Calls with a deadline wait until it.
    pub connect_wait: Duration,
    /// A connection that dies sooner than this after it was made counts as a failed
    /// attempt (default 1 s): a server that accepts and drops at once gets backoff, not a
    /// reconnect storm.
    pub min_connected: Duration,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        ReconnectConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            multiplier: 1.6,
            jitter: 0.2,
            wait_for_ready: false,
            connect_wait: Duration::from_secs(20),
            min_connected: Duration::from_secs(1),
        }
    }
}

impl ReconnectConfig {
    /// The delay after `failures` failed attempts in a row (at least one), before jitter.
    /// Any settings give a delay: a multiplier below 1 or not a number counts as 1.
    pub fn backoff(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(64) as i32;
        let multiplier = if self.multiplier >= 1.0 {
            self.multiplier
        } else {
            1.0
        };
        let grown = self.initial_backoff.as_secs_f64() * multiplier.powi(exponent);
        let cap = self.max_backoff.min(MAX_DELAY);
        Duration::try_from_secs_f64(grown).map_or(cap, |d| d.min(cap))
    }

    /// [`ReconnectConfig::backoff`] randomized by ±`jitter`.
    pub(crate) fn jittered_backoff(&self, failures: u32) -> Duration {
        let base = self.backoff(failures);
        let jitter = if self.jitter > 0.0 {
            self.jitter.min(1.0)
        } else {
            0.0
        };
        // A uniform draw in [0, 1); without randomness the delay is simply not spread.
        let unit = getrandom::u64().map_or(0.5, |r| (r >> 11) as f64 / (1u64 << 53) as f64);
        base.mul_f64(1.0 + jitter * (2.0 * unit - 1.0))
    }
}

/// What a call that fails fast says: a refusal the client must act on keeps its code
/// (credentials, permissions, a server at its connection limit); anything else is gRPC's
/// "not connected", `UNAVAILABLE`, which retry policies key on.
fn fail_fast_code(failure: Code) -> Code {
    match failure {
        Code::Unauthenticated | Code::PermissionDenied | Code::ResourceExhausted => failure,
        _ => Code::Unavailable,
    }
}

/// The longest delay between attempts, whatever the settings: no sleep is ever asked for
/// that the clock cannot add.
const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);

/// What a channel's connection is doing (gRPC's connectivity states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connectivity {
    /// No connection, and no attempt running: the next call starts one.
    Idle,
    /// An attempt runs, and none has failed since the channel last had a connection.
    Connecting,
    /// Connected.
    Ready,
    /// The last attempt failed; another follows after a backoff delay.
    TransientFailure,
    /// The channel was closed.
    Shutdown,
}

impl Phase {
    fn ready(conn: Connection) -> Phase {
        Phase::Ready {
            conn: Arc::new(conn),
            since: Instant::now(),
        }
    }
}

enum Phase {
    Idle,
    /// The helper thread connects, or sleeps before its next attempt.
    Connecting {
        /// The last attempt's error, once one has failed.
        failure: Option<Status>,
    },
    Ready {
        conn: Arc<Connection>,
        since: Instant,
    },
    Shutdown,
}

struct State {
    phase: Phase,
    /// Consecutive failed attempts.
    failures: u32,
    /// The helper thread, while it runs.
    worker: Option<Thread>,
    /// Calls waiting for a connection, each under its own key: as many entries as waiting
    /// call futures, however often they are polled.
    waiters: FxHashMap<u64, Waker>,
    next_waiter: u64,
}

/// The connection of a healing channel and the machinery that replaces it.
pub(crate) struct Healing {
    connector: Arc<dyn Connector>,
    config: ReconnectConfig,
    state: Mutex<State>,
}

impl Healing {
    pub(crate) fn new(
        connector: Arc<dyn Connector>,
        connected: Option<Connection>,
        config: ReconnectConfig,
    ) -> Arc<Healing> {
        Arc::new(Healing {
            connector,
            config,
            state: Mutex::new(State {
                phase: connected.map_or(Phase::Idle, Phase::ready),
                failures: 0,
                worker: None,
                waiters: FxHashMap::default(),
                next_waiter: 0,
            }),
        })
    }

    pub(crate) fn target(&self) -> &str {
        self.connector.target()
    }

    pub(crate) fn connectivity(&self) -> Connectivity {
        match &self.state.lock().phase {
            Phase::Idle => Connectivity::Idle,
            Phase::Connecting { failure: None } => Connectivity::Connecting,
            Phase::Connecting { failure: Some(_) } => Connectivity::TransientFailure,
            Phase::Ready { conn, .. } if conn.is_closed() => Connectivity::Idle,
            Phase::Ready { .. } => Connectivity::Ready,
            Phase::Shutdown => Connectivity::Shutdown,
        }
    }

    /// The live connection, if there is one (no attempt is started).
    pub(crate) fn current(&self) -> Option<Arc<Connection>> {
        match &self.state.lock().phase {
            Phase::Ready { conn, .. } => Some(conn.clone()),
            _ => None,
        }
    }

    /// The live connection, if it is open: what a call takes without waiting.
    pub(crate) fn live(&self) -> Option<Arc<Connection>> {
        match &self.state.lock().phase {
            Phase::Ready { conn, .. } if !conn.is_closed() => Some(conn.clone()),
            _ => None,
        }
    }

    /// The live connection for a call, or starts getting one and registers `wait`'s task.
    pub(crate) fn poll_connection(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        wait: &mut ConnectWait,
    ) -> Poll<Result<Arc<Connection>, Status>> {
        let mut state = self.state.lock();
        if let Some(outcome) = self.decide(&mut state, wait) {
            wait.forget(&mut state);
            return Poll::Ready(outcome);
        }
        let key = *wait.key.get_or_insert_with(|| {
            state.next_waiter += 1;
            state.next_waiter
        });
        wait.healing = Some(Arc::downgrade(self));
        state.waiters.insert(key, cx.waker().clone());
        drop(state);
        wait.arm_timer(cx);
        Poll::Pending
    }

    /// Whether the channel has a live connection, for a balancer choosing among endpoints:
    /// ready if it has; else an attempt is started (or runs, backing off) and the task under
    /// `key` is woken when one ends. Never fails while the channel is open: an endpoint whose
    /// server is down stays pending, not removed.
    pub(crate) fn poll_ready(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        key: &mut Option<u64>,
    ) -> Poll<Result<(), Status>> {
        let mut state = self.state.lock();
        loop {
            match &state.phase {
                Phase::Ready { conn, .. } if !conn.is_closed() => {
                    if let Some(key) = key.take() {
                        state.waiters.remove(&key);
                    }
                    return Poll::Ready(Ok(()));
                }
                Phase::Ready { .. } | Phase::Idle => {
                    if self.start_worker(&mut state).is_err() {
                        // No thread for an attempt now: look again after a backoff.
                        let at = Instant::now() + self.config.jittered_backoff(1);
                        DeadlineTimer::global().schedule_wake(at, cx.waker().clone());
                        return Poll::Pending;
                    }
                }
                Phase::Connecting { .. } => {
                    let key = *key.get_or_insert_with(|| {
                        state.next_waiter += 1;
                        state.next_waiter
                    });
                    state.waiters.insert(key, cx.waker().clone());
                    return Poll::Pending;
                }
                Phase::Shutdown => {
                    return Poll::Ready(Err(Status::unavailable(format!(
                        "the channel to {} is closed",
                        self.target()
                    ))))
                }
            }
        }
    }

    /// Forgets the waiter `key` of [`Healing::poll_ready`].
    pub(crate) fn forget_waiter(&self, key: u64) {
        self.state.lock().waiters.remove(&key);
    }

    /// What a call gets now: the live connection, or the status that ends its wait; `None`
    /// while it waits for an attempt.
    fn decide(
        self: &Arc<Self>,
        state: &mut State,
        wait: &mut ConnectWait,
    ) -> Option<Result<Arc<Connection>, Status>> {
        loop {
            match &state.phase {
                Phase::Ready { conn, .. } if !conn.is_closed() => return Some(Ok(conn.clone())),
                Phase::Ready { .. } | Phase::Idle => {
                    // Never connected, or the connection died: a call wants one now
                    // (unless its time is up already). Then look again: a connection that
                    // died young is a failure already.
                    if let Some(status) = wait.expired(self.target(), &state.phase, &self.config) {
                        return Some(Err(status));
                    }
                    if let Err(status) = self.start_worker(state) {
                        return Some(Err(status));
                    }
                }
                Phase::Connecting {
                    failure: Some(failure),
                } if !self.config.wait_for_ready => {
                    return Some(Err(Status::new(
                        fail_fast_code(failure.code()),
                        format!(
                            "not connected to {}, reconnecting: {}",
                            self.target(),
                            failure.message()
                        ),
                    )));
                }
                Phase::Connecting { .. } => {
                    let expired = wait.expired(self.target(), &state.phase, &self.config);
                    return expired.map(Err);
                }
                Phase::Shutdown => {
                    return Some(Err(Status::unavailable(format!(
                        "the channel to {} is closed",
                        self.target()
                    ))));
                }
            }
        }
    }

    /// Starts the helper thread (none runs while the phase is `Idle` or `Ready`); the
    /// phase becomes `Connecting`. A dead connection goes to the helper to be torn down
    /// there, off the caller's thread and outside the lock.
    fn start_worker(self: &Arc<Self>, state: &mut State) -> Result<(), Status> {
        let old = std::mem::replace(&mut state.phase, Phase::Connecting { failure: None });
        let mut first_delay = Duration::ZERO;
        if let Phase::Ready { since, conn } = &old {
            if since.elapsed() < self.config.min_connected {
                // It died young: that was a failed attempt.
                state.failures = state.failures.saturating_add(1);
                first_delay = self.config.jittered_backoff(state.failures);
                // Its closing status says why (a server at its connection limit, say).
                let why = conn
                    .calls
                    .closed_status()
                    .unwrap_or_else(|| Status::unavailable(""));
                state.phase = Phase::Connecting {
                    failure: Some(Status::new(
                        why.code(),
                        format!(
                            "the connection to {} died as soon as it was made: {}",
                            self.target(),
                            why.message()
                        ),
                    )),
                };
            } else {
                state.failures = 0;
            }
        }
        let (healing, connector) = (Arc::downgrade(self), self.connector.clone());
        match std::thread::Builder::new()
            .name("rpc-reconnect".into())
            .spawn(move || {
                drop(old);
                reconnect(healing, connector, first_delay);
            }) {
            Ok(handle) => {
                state.worker = Some(handle.thread().clone());
                Ok(())
            }
            Err(e) => {
                state.phase = Phase::Idle;
                Err(Status::unavailable(format!(
                    "cannot connect to {}: no thread for the attempt: {e}",
                    self.target()
                )))
            }
        }
    }

    /// One attempt's outcome: the delay before the next attempt, or `None` when the helper
    /// thread is done (connected, or the channel closed).
    fn settle(&self, result: Result<Connection, Status>) -> Option<Duration> {
        let mut state = self.state.lock();
        // Torn down after the lock, should the channel have closed meanwhile.
        let mut unwanted = None;
        let delay = match (&state.phase, result) {
            (Phase::Shutdown, result) => {
                unwanted = result.ok();
                None
            }
            (_, Ok(conn)) => {
                // The count of failures resets once the connection proves itself
                // (`min_connected`).
                state.phase = Phase::ready(conn);
                None
            }
            (_, Err(status)) => {
                state.failures = state.failures.saturating_add(1);
                let delay = self.config.jittered_backoff(state.failures);
                tracing::debug!(
                    target = self.target(),
                    failures = state.failures,
                    ?delay,
                    %status,
                    "connect attempt failed"
                );
                state.phase = Phase::Connecting {
                    failure: Some(status),
                };
                Some(delay)
            }
        };
        if delay.is_none() {
            state.worker = None;
        }
        let waiters = std::mem::take(&mut state.waiters);
        drop(state);
        drop(unwanted);
        waiters.into_values().for_each(Waker::wake);
        delay
    }

    /// Closes the channel: drops its connection, fails waiting calls, ends the helper.
    pub(crate) fn shut_down(&self) {
        let mut state = self.state.lock();
        let old = std::mem::replace(&mut state.phase, Phase::Shutdown);
        let worker = state.worker.take();
        let waiters = std::mem::take(&mut state.waiters);
        drop(state);
        drop(old);
        waiters.into_values().for_each(Waker::wake);
        if let Some(worker) = worker {
            worker.unpark();
        }
    }

    /// Calls waiting for a connection.
    #[cfg(test)]
    pub(crate) fn waiters(&self) -> usize {
        self.state.lock().waiters.len()
    }

    fn is_shut_down(&self) -> bool {
        matches!(self.state.lock().phase, Phase::Shutdown)
    }
}

/// The helper thread: after `delay`, attempts until one succeeds or the channel closes.
/// It holds the channel only while it settles an attempt, so dropping the channel ends it
/// (at its next wake: the drop unparks it, or when its attempt returns).
fn reconnect(healing: Weak<Healing>, connector: Arc<dyn Connector>, mut delay: Duration) {
    loop {
        let until = Instant::now().checked_add(delay);
        loop {
            match healing.upgrade() {
                Some(h) if !h.is_shut_down() => {}
                _ => return,
            }
            let left = until.map(|at| at.saturating_duration_since(Instant::now()));
            match left {
                Some(left) if left.is_zero() => break,
                Some(left) => std::thread::park_timeout(left),
                None => std::thread::park(),
            }
        }
        // A connector that panics is one that failed: the channel backs off and tries again.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| connector.connect()))
            .unwrap_or_else(|_| {
                Err(Status::internal(format!(
                    "the connector to {} panicked",
                    connector.target()
                )))
            });
        let Some(strong) = healing.upgrade() else {
            return;
        };
        match strong.settle(result) {
            Some(next) => delay = next,
            None => return,
        }
    }
}

/// One call's wait for a connection: its place among the waiters, and its limit.
#[derive(Debug)]
pub(crate) struct ConnectWait {
    key: Option<u64>,
    /// The call's deadline.
    deadline: Option<Instant>,
    /// When a call without a deadline gives up ([`ReconnectConfig::connect_wait`]).
    give_up: Option<Instant>,
    /// Wake the task at the limit (async waits; blocking ones park with a timeout).
    use_timer: bool,
    timer: WakeAt,
    healing: Option<Weak<Healing>>,
}

impl ConnectWait {
    pub(crate) fn new(deadline: Option<Instant>, use_timer: bool) -> ConnectWait {
        ConnectWait {
            key: None,
            deadline,
            give_up: None,
            use_timer,
            timer: WakeAt::default(),
            healing: None,
        }
    }

    /// When the wait ends at the latest (set once the call has waited).
    pub(crate) fn limit(&self) -> Option<Instant> {
        self.deadline.or(self.give_up)
    }

    fn expired(&mut self, target: &str, phase: &Phase, config: &ReconnectConfig) -> Option<Status> {
        let now = Instant::now();
        if self.deadline.is_none() && self.give_up.is_none() {
            self.give_up = now.checked_add(config.connect_wait);
        }
        let limit = self.limit()?;
        if now < limit {
            return None;
        }
        let why = match phase {
            Phase::Connecting {
                failure: Some(failure),
            } => format!(": {}", failure.message()),
            _ => String::new(),
        };
        Some(match self.deadline {
            Some(_) => Status::deadline_exceeded(format!(
                "deadline exceeded waiting for a connection to {target}{why}"
            )),
            None => Status::unavailable(format!(
                "no connection to {target} within {:?}{why}",
                config.connect_wait
            )),
        })
    }

    /// Has the task woken at the limit; again if it is now a different task's waker.
    fn arm_timer(&mut self, cx: &Context<'_>) {
        if let (true, Some(at)) = (self.use_timer, self.limit()) {
            self.timer.arm(at, cx);
        }
    }

    /// Leaves the waiters (under the channel's lock) and stops the timer.
    fn forget(&mut self, state: &mut State) {
        if let Some(key) = self.key.take() {
            state.waiters.remove(&key);
        }
        self.timer.stop();
    }
}

impl Drop for ConnectWait {
    fn drop(&mut self) {
        let (Some(key), Some(healing)) = (self.key.take(), self.healing.take()) else {
            return;
        };
        if let Some(healing) = healing.upgrade() {
            healing.state.lock().waiters.remove(&key);
        }
    }
}
