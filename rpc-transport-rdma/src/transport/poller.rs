//! The thread that processes a connection's completions when no caller does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::Status;

use crate::transport::config::PollMode;
use crate::transport::conn::Conn;
use crate::transport::events::wait_readable;
use crate::verbs::{CmEventKind, EventChannel};

/// How often a spinning poller looks at the rdma_cm channel, and how long a sleeping one
/// waits before re-checking for shutdown.
const CM_CHECK: Duration = Duration::from_millis(1);
const SLEEP_SLICE: Duration = Duration::from_millis(100);

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
    let mut last_activity = Instant::now();
    let mut last_cm_check = Instant::now();
    while !conn.is_closed() {
        if conn.self_polling.load(Ordering::Acquire) > 0 {
            // A blocking caller drives the CQ: stay out of its way (and off the CPU).
            if wait_readable([cm_fd], CM_CHECK)[0] {
                check_cm(conn, cm);
            }
            continue;
        }
        if conn.progress() {
            last_activity = Instant::now();
            continue;
        }
        if last_cm_check.elapsed() >= CM_CHECK {
            last_cm_check = Instant::now();
            check_cm(conn, cm);
        }
        if mode.spin().is_none_or(|spin| last_activity.elapsed() < spin) {
            std::hint::spin_loop();
            continue;
        }
        if let Err(e) = res.cq.req_notify(false) {
            conn.close(Status::unavailable(format!("ibv_req_notify_cq: {e}")));
            return;
        }
        // A completion that arrived before arming raised no event: look once more.
        if conn.progress() {
            last_activity = Instant::now();
            continue;
        }
        let [comp_ready, cm_ready] = wait_readable([comp_fd, cm_fd], SLEEP_SLICE);
        if comp_ready {
            while let Ok(Some(_)) = res.channel.try_get_event() {}
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
