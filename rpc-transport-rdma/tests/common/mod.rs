//! Shared helpers of the RDMA integration tests (which skip without a device; see
//! `verbs::test_support`).

#![allow(dead_code)]

use std::time::{Duration, Instant};

pub mod hostile;

use rpc_transport_rdma::verbs::{CompletionChannel, CompletionQueue, ConnParam, WorkCompletion};

/// Connection parameters with `rnr_retry_count = 0`: a missing receive fails at once.
pub fn conn_param(private_data: &[u8]) -> ConnParam<'_> {
    ConnParam {
        private_data,
        rnr_retry_count: 0,
        ..ConnParam::default()
    }
}

/// How long any single wait may take before the test fails instead of hanging.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Busy-polls `cq` until one completion arrives; panics after [`WAIT_LIMIT`] and on a failed
/// completion.
pub fn poll_one(cq: &CompletionQueue, what: &str) -> WorkCompletion {
    let mut wcs = WorkCompletion::array(1);
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let n = cq.poll(&mut wcs).expect("ibv_poll_cq").len();
        if n == 1 {
            let wc = wcs.pop().expect("one completion");
            if let Err(e) = wc.result() {
                panic!("{what}: {e}");
            }
            return wc;
        }
        assert!(
            start.elapsed() < WAIT_LIMIT,
            "{what}: no completion after {WAIT_LIMIT:?}"
        );
        spins += 1;
        if spins < 1000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Waits for one completion on `cq` by sleeping on its completion `channel` (arm, poll,
/// sleep), the way an event-driven transport does. Panics on a failed completion.
pub fn wait_one(cq: &CompletionQueue, channel: &CompletionChannel, what: &str) -> WorkCompletion {
    let mut wcs = WorkCompletion::array(1);
    loop {
        if cq.poll(&mut wcs).expect("ibv_poll_cq").len() == 1 {
            break;
        }
        cq.req_notify(false).expect("ibv_req_notify_cq");
        // A completion may have arrived before arming: poll once more before sleeping.
        if cq.poll(&mut wcs).expect("ibv_poll_cq").len() == 1 {
            break;
        }
        let tag = channel.get_event().expect("ibv_get_cq_event");
        assert_eq!(tag, cq.tag(), "{what}: event for another CQ");
    }
    let wc = wcs.pop().expect("one completion");
    if let Err(e) = wc.result() {
        panic!("{what}: {e}");
    }
    wc
}

/// Runs `f` on a named thread and returns its handle.
pub fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .expect("spawning a thread")
}
