//! Callers that keep calling an echo server while a test breaks things, and waiting.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdma_rpc::{Request, Status};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;
use tokio::task::JoinHandle;

/// Every call's budget: a call that hangs fails the test as `DeadlineExceeded`.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// An echo of `seq` with [`CALL_TIMEOUT`].
pub fn echo(seq: u64) -> Request<EchoRequest> {
    let mut request = Request::new(EchoRequest {
        payload: seq.to_le_bytes().to_vec().into(),
        seq,
    });
    request.set_timeout(CALL_TIMEOUT);
    request
}

/// A call that failed: when it began, and its status.
pub struct Failure {
    pub began: Instant,
    pub status: Status,
}

#[derive(Default)]
struct Outcomes {
    ok: AtomicUsize,
    failures: Mutex<Vec<Failure>>,
}

/// Tasks calling without pause (a short pause after a failure: failing fast must not turn
/// into a busy loop), each answer checked against its call.
pub struct Callers {
    outcomes: Arc<Outcomes>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Callers {
    /// `n` tasks calling through `client`.
    pub fn start(client: &EchoClient, n: u64) -> Callers {
        let outcomes = Arc::new(Outcomes::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..n)
            .map(|caller| {
                let (client, outcomes, stop) = (client.clone(), outcomes.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut seq = caller << 32;
                    while !stop.load(Ordering::Relaxed) {
                        seq += 1;
                        let began = Instant::now();
                        match client.echo(echo(seq)).await {
                            Ok(reply) => {
                                assert_eq!(reply.get_ref().seq, seq, "the answer to this call");
                                outcomes.ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(status) => {
                                outcomes.failures.lock().push(Failure { began, status });
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Callers {
            outcomes,
            stop,
            tasks,
        }
    }

    /// Calls answered so far.
    pub fn ok(&self) -> usize {
        self.outcomes.ok.load(Ordering::Relaxed)
    }

    /// Calls failed so far.
    pub fn failed(&self) -> usize {
        self.outcomes.failures.lock().len()
    }

    /// Calls begun at or after `at` that failed so far.
    #[allow(dead_code)]
    pub fn failed_since(&self, at: Instant) -> usize {
        let failures = self.outcomes.failures.lock();
        failures.iter().filter(|f| f.began >= at).count()
    }

    /// Stops the callers (none may hang) and returns every failure they saw, in the order
    /// they failed.
    pub async fn stop(self) -> Vec<Failure> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            tokio::time::timeout(CALL_TIMEOUT * 2, task)
                .await
                .expect("no caller hangs")
                .unwrap();
        }
        std::mem::take(&mut *self.outcomes.failures.lock())
    }
}

/// Waits until `check` holds (20 s at most).
pub async fn until(what: &str, check: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts a server again at `url` with `start`, retrying (10 s at most) while the old one
/// lets go of the address. Blocks the calling thread.
pub fn restart<T, E: Display>(url: &str, start: impl Fn() -> Result<T, E>) -> T {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match start() {
            Ok(server) => return server,
            Err(e) if Instant::now() < until => {
                eprintln!("restart at {url}: {e}; again");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("cannot restart at {url}: {e}"),
        }
    }
}
