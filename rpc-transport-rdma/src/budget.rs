//! What all RDMA connections of the process may hold together, whatever each connection's
//! own bounds allow: connections, and the registered memory of large bodies.
//!
//! Per-connection bounds ([`LargeBodies::budget`](crate::LargeBodies::budget), ring sizes) stop one peer; these
//! stop many. A connection past [`ProcessLimits::connections`] is refused
//! (`RESOURCE_EXHAUSTED`, before any verbs object is made for it); a large body that would
//! take the registered memory past [`ProcessLimits::registered_bytes`] is refused like one
//! past its connection's budget (the peer's call fails with `RESOURCE_EXHAUSTED` naming the
//! limit), after the connection first gave back the registered memory it keeps cached.
//!
//! Rings and shared receive queues are not counted here: they are bounded by the number of
//! connections times their configured size.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rpc_core::Status;

#[cfg(doc)]
use crate::config::RdmaConfig;

/// Connections a process may have, unless [`set_process_limits`] says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8192;

/// Process-wide bounds (see [`set_process_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// RDMA connections, client and server, open at once.
    pub connections: u32,
    /// Bytes registered for large bodies by all connections together, leased and cached.
    pub registered_bytes: u64,
}

impl Default for ProcessLimits {
    /// [`DEFAULT_MAX_CONNECTIONS`], and half the machine's physical memory.
    fn default() -> Self {
        ProcessLimits {
            connections: DEFAULT_MAX_CONNECTIONS,
            registered_bytes: physical_memory() / 2,
        }
    }
}

/// What the process holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessUsage {
    /// Connections open (or being set up).
    pub connections: u32,
    /// Bytes registered for large bodies.
    pub registered_bytes: u64,
}

/// 0: not set yet, the default applies.
static MAX_CONNECTIONS: AtomicU32 = AtomicU32::new(0);
static MAX_REGISTERED: AtomicU64 = AtomicU64::new(0);
static CONNECTIONS: AtomicU32 = AtomicU32::new(0);
static REGISTERED: AtomicU64 = AtomicU64::new(0);

fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (u64::try_from(pages), u64::try_from(size)) {
        (Ok(pages), Ok(size)) if pages > 0 && size > 0 => pages.saturating_mul(size),
        _ => 8 << 30,
    }
}

/// Sets the process's limits. Lowering one below what is held refuses new connections or
/// bodies until enough are gone; nothing held is taken back.
pub fn set_process_limits(limits: ProcessLimits) {
    MAX_CONNECTIONS.store(limits.connections.max(1), Ordering::Relaxed);
    MAX_REGISTERED.store(limits.registered_bytes.max(1), Ordering::Relaxed);
}

/// The process's limits now.
pub fn process_limits() -> ProcessLimits {
    let connections = MAX_CONNECTIONS.load(Ordering::Relaxed);
    let registered_bytes = MAX_REGISTERED.load(Ordering::Relaxed);
    if connections == 0 || registered_bytes == 0 {
        let defaults = ProcessLimits::default();
        // Racing first calls store the same values.
        let _ = MAX_CONNECTIONS.compare_exchange(
            0,
            defaults.connections,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let _ = MAX_REGISTERED.compare_exchange(
            0,
            defaults.registered_bytes,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        return process_limits();
    }
    ProcessLimits {
        connections,
        registered_bytes,
    }
}

/// What the process's connections hold now.
pub fn process_usage() -> ProcessUsage {
    ProcessUsage {
        connections: CONNECTIONS.load(Ordering::Relaxed),
        registered_bytes: REGISTERED.load(Ordering::Relaxed),
    }
}

/// Sets the usage gauges (absolute values: right however late metrics were turned on).
fn report_usage() {
    if let Some(metrics) = crate::metrics::rdma() {
        let usage = process_usage();
        metrics.connections.set(f64::from(usage.connections));
        metrics.registered_bytes.set(usage.registered_bytes as f64);
    }
}

/// One connection of the process; gives its place back when dropped.
#[derive(Debug)]
pub(crate) struct ConnectionSlot(());

impl ConnectionSlot {
    /// Takes a place, or refuses naming the limit.
    pub(crate) fn take(peer: &str) -> Result<ConnectionSlot, Status> {
        let limit = process_limits().connections;
        CONNECTIONS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < limit).then_some(held + 1)
            })
            .map(|_| {
                report_usage();
                ConnectionSlot(())
            })
            .map_err(|held| {
                Status::resource_exhausted(format!(
                    "refusing a connection with {peer}: the process has {held} RDMA connections, \
                 its limit (ProcessLimits::connections)"
                ))
            })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
        report_usage();
    }
}

/// Registered bytes counted against the process; given back when dropped.
#[derive(Debug)]
pub(crate) struct Registered(u64);

/// Why registered memory was refused: the limit and what was held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverLimit {
    pub(crate) limit: u64,
    pub(crate) held: u64,
}

impl Registered {
    /// Counts `bytes` more, or refuses.
    pub(crate) fn take(bytes: u64) -> Result<Registered, OverLimit> {
        let limit = process_limits().registered_bytes;
        REGISTERED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= limit)
            })
            .map(|_| {
                report_usage();
                Registered(bytes)
            })
            .map_err(|held| OverLimit { limit, held })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        REGISTERED.fetch_sub(self.0, Ordering::AcqRel);
        report_usage();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The only test that touches the process's counters (tests run in parallel).
    #[test]
    fn counts_are_bounded_and_given_back() {
        let before = process_usage();
        let held = before.registered_bytes;
        set_process_limits(ProcessLimits {
            connections: before.connections + 2,
            registered_bytes: held + 1000,
        });
        let a = ConnectionSlot::take("a").expect("first");
        let b = ConnectionSlot::take("b").expect("second");
        let refused = ConnectionSlot::take("c").expect_err("over the limit");
        assert_eq!(refused.code(), rpc_core::Code::ResourceExhausted);
        assert!(
            refused.message().contains("ProcessLimits::connections"),
            "{refused}"
        );
        drop(a);
        let c = ConnectionSlot::take("c").expect("a place was given back");

        let r = Registered::take(600).expect("within");
        let over = Registered::take(600).expect_err("over");
        assert_eq!((over.limit, over.held), (held + 1000, held + 600));
        drop(r);
        let r = Registered::take(1000).expect("given back");
        assert_eq!(process_usage().registered_bytes, held + 1000);
        drop((b, c, r));
        assert_eq!(process_usage(), before);
        set_process_limits(ProcessLimits::default());
    }
}
