//! The thread that processes a connection's completions when no caller does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::Status;

use crate::transport::config::PollMode;
use crate::transport::conn::{Conn, Polled, CLOCK_EVERY};
use crate::transport::events::wait_readable;
use crate::verbs::{CmEventKind, EventChannel};

/// How often a spinning poller looks at the rdma_cm channel, and how long a sleeping one
/// waits before re-checking for shutdown.
const CM_CHECK: Duration = Duration::from_millis(1);
const SLEEP_SLICE: Duration = Duration::from_millis(100);
/// Empty polls between two yields of the CPU while spinning...
const YIELD_EVERY: u32 = 128;
/// ...once this many went by without a completion. A yield is a system call (about 2 µs
/// under emulation) that a frame arriving meanwhile waits for, and a connection that
/// receives now and then (a ping-pong) would pay it on most frames; one that went quiet
/// for this long gives the CPU away.
const YIELD_AFTER: u32 = 4 * CLOCK_EVERY;
/// How long the poller sleeps between looks at whether blocking callers still drive the CQ.
/// Long on purpose: every case that needs the poller sooner wakes it (a caller about to
/// park, an async call about to wait, an rdma_cm event), and each needless wake-up steals a
/// core from the callers.
const CALLER_WINDOW: Duration = Duration::from_millis(50);

/// Starts the poller of `conn`. `cm` is the connection's own rdma_cm channel (clients);
/// servers watch their listener's channel elsewhere.
pub(crate) fn spawn(
    conn: Arc<Conn>,
    mode: PollMode,
    cm: Option<Arc<EventChannel>>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("rpc-rdma-poll".into())
        .spawn(move || run(&conn, mode, cm.as_ref()))
        .map(drop)
}

fn run(conn: &Arc<Conn>, mode: PollMode, cm: Option<&Arc<EventChannel>>) {
    let res = conn.resources();
    let comp_fd = res.channel.fd();
    let cm_fd = cm.map_or(-1, |c| c.fd());
    let kick_fd = conn.kick.fd();
    let mut last_activity = Instant::now();
    let mut last_cm_check = Instant::now();
    let mut kicked = false;
    let mut idle_spins: u32 = 0;
    let mut callers_epoch = 0;
    while !conn.is_closed() {
        if conn.take_deferred_report() {
            conn.report_dropped_and_close();
            continue;
        }
        // A kick (or a completion event) buys exactly one pass over the CQ.
        if !std::mem::take(&mut kicked) && conn.callers_drive(&mut callers_epoch) {
            // Blocking callers poll the CQ themselves: stay off the CPU and the CQ, unarmed
            // (armed, every completion would wake us for nothing). A caller about to park,
            // or an async call about to wait, kicks us awake.
            conn.poller_unarmed.store(true, Ordering::Release);
            let [kick, cm_ready] = wait_readable([kick_fd, cm_fd], CALLER_WINDOW);
            conn.poller_unarmed.store(false, Ordering::Release);
            if kick {
                conn.kick.drain();
                conn.callers_handed_over(&mut callers_epoch);
                kicked = true;
            }
            if cm_ready {
                check_cm(conn, cm);
            }
            continue;
        }
        if conn.progress() {
            idle_spins = 0;
            continue;
        }
        idle_spins = idle_spins.wrapping_add(1);
        // Clock reads are not free everywhere: look at the time now and then, never right
        // after a completion (the next one may be close behind).
        if !idle_spins.is_multiple_of(CLOCK_EVERY) {
            if idle_spins >= YIELD_AFTER && idle_spins.is_multiple_of(YIELD_EVERY) {
                // Spinning must not starve the threads our completions wake (an async
                // runtime, a handler) when cores are scarce.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        if idle_spins == CLOCK_EVERY {
            last_activity = Instant::now();
        }
        if last_cm_check.elapsed() >= CM_CHECK {
            last_cm_check = Instant::now();
            check_cm(conn, cm);
        }
        if mode
            .spin()
            .is_none_or(|spin| last_activity.elapsed() < spin)
        {
            std::hint::spin_loop();
            continue;
        }
        if let Err(e) = res.cq.req_notify(false) {
            conn.close(Status::unavailable(format!("ibv_req_notify_cq: {e}")));
            return;
        }
        // A completion that arrived before arming raised no event: look once more, and
        // do not sleep while another thread is in the middle of polling.
        if conn.poll_once() != Polled::Empty {
            continue;
        }
        let [comp_ready, cm_ready, kick] = wait_readable([comp_fd, cm_fd, kick_fd], SLEEP_SLICE);
        if comp_ready {
            while let Ok(Some(_)) = res.channel.try_get_event() {}
            // Whatever woke us is ours to process, even if a caller polled a moment ago.
            kicked = true;
        }
        if kick {
            conn.kick.drain();
            conn.callers_handed_over(&mut callers_epoch);
        }
        if cm_ready {
            check_cm(conn, cm);
        }
    }
}

fn check_cm(conn: &Conn, cm: Option<&Arc<EventChannel>>) {
    let Some(cm) = cm else { return };
    while let Ok(Some(event)) = cm.try_get_event() {
        match event.kind() {
            CmEventKind::Disconnected | CmEventKind::DeviceRemoval | CmEventKind::TimewaitExit => {
                conn.close(Status::unavailable(format!(
                    "{} disconnected ({})",
                    conn.peer(),
                    event.kind()
                )));
            }
            kind => tracing::debug!(%kind, "rdma_cm event on a connected id"),
        }
    }
}
