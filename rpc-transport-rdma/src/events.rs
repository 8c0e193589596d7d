//! Waiting on file descriptors (completion and rdma_cm channels) with a timeout.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::Status;

use crate::verbs::{CmEvent, CmEventKind, EventChannel};

/// Waits until one of `fds` is readable or `timeout` passes; returns which are readable.
pub(crate) fn wait_readable<const N: usize>(fds: [RawFd; N], timeout: Duration) -> [bool; N] {
    let mut pollfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pollfds` is a valid array of N initialized pollfd structs for the call.
    let ready = unsafe { libc::poll(pollfds.as_mut_ptr(), N as libc::nfds_t, ms) };
    if ready <= 0 {
        return [false; N];
    }
    pollfds.map(|p| p.revents != 0)
}

/// The next rdma_cm event on a non-blocking channel, waiting up to `deadline` for
/// `expected` (named in the timeout).
fn next_event(
    channel: &Arc<EventChannel>,
    deadline: Instant,
    what: &str,
    expected: CmEventKind,
) -> Result<CmEvent, Status> {
    loop {
        match channel.try_get_event() {
            Ok(Some(event)) => return Ok(event),
            Ok(None) => {}
            Err(e) => return Err(Status::unavailable(format!("{what}: {e}"))),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Status::unavailable(format!(
                "{what}: timed out waiting for {expected}"
            )));
        }
        wait_readable([channel.fd()], deadline - now);
    }
}

/// The InfiniBand CM's reject reason "invalid service ID": nobody listens on the port.
const REJECT_NO_LISTENER: i32 = 8;

/// Waits for `expected`, turning any other event into a clear error for `what`.
pub(crate) fn expect_event(
    channel: &Arc<EventChannel>,
    expected: CmEventKind,
    deadline: Instant,
    what: &str,
) -> Result<CmEvent, Status> {
    let event = next_event(channel, deadline, what, expected)?;
    if event.kind() == expected && event.status() == 0 {
        return Ok(event);
    }
    let reason = match event.kind() {
        CmEventKind::Rejected => match crate::protocol::decode_reject(event.private_data()) {
            Some((code, reason)) => {
                return Err(Status::new(
                    code,
                    format!("{what}: the server rejected the connection: {reason}"),
                ))
            }
            None if event.status() == REJECT_NO_LISTENER => format!(
                "connection refused: nothing listens on that port (rdma_cm reject reason \
                 {REJECT_NO_LISTENER})"
            ),
            None => format!(
                "connection refused (not an rdma-rpc server there, or it rejected the \
                 connection; rdma_cm reject reason {})",
                event.status()
            ),
        },
        CmEventKind::AddrError => "no RDMA device reaches that address".to_owned(),
        CmEventKind::RouteError => "no route to the address over RDMA".to_owned(),
        CmEventKind::Unreachable => "peer unreachable".to_owned(),
        kind => format!(
            "unexpected rdma_cm event {kind} (status {})",
            event.status()
        ),
    };
    Err(Status::unavailable(format!("{what}: {reason}")))
}
