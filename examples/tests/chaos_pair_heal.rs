//! A partition that heals, between two hosts (run as `chaos_pair` is, which see): the
//! server's link `link0` goes down for [`OUTAGE`] and comes back while calls with no deadline go
//! on over rdma:// and tcp://. Over tcp:// the connection outlives the partition (TCP
//! retransmits for minutes): every call succeeds. Over rdma:// the queue pair retransmits
//! within its transport retry budget ([`ACK_TIMEOUT`] times `retry_count`), and soft-RoCE
//! does not always get the connection through: its queue pairs may spend their retries
//! after the link is back, or fail a send with a local error, which closes the server's
//! side while its disconnect is (so far always) lost. So the calls either all succeed or
//! the connection ends `UNAVAILABLE`, found dead by its retries or by its keepalive
//! ([`KEEPALIVE`]) or disconnected by the server, and nothing hangs: every outcome is
//! bounded within [`AFTER_BOUND`]. Which it was, and
//! whether new rdma:// connections work after the partition, is printed.

// The chaos tests' shared helpers; this binary uses some of them.
#[allow(dead_code)]
mod chaos_support;
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chaos_support::pair::{new_connections_work, Peer};
use chaos_support::{lock, say};
use rdma_rpc::prelude::*;
use rdma_rpc::{Liveness, RdmaConfig};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;

/// How long the link is down.
const OUTAGE: Duration = Duration::from_millis(300);

/// Calls each connection must complete before the partition, and how long they may take
/// (connecting included).
const BEFORE: u64 = 20;
const BEFORE_BOUND: Duration = Duration::from_secs(30);

/// Calls each connection must complete after the link is back, and how long they may take
/// (or the connection end): the slowest outcome is the keepalive's, about [`KEEPALIVE`] plus
/// [`KEEPALIVE_TIMEOUT`] after the partition; the transport's retries with rdma_cm's ACK
/// timeout, or the default keepalive, would take 30 s and more.
const AFTER: u64 = 50;
const AFTER_BOUND: Duration = Duration::from_secs(10);

/// The rdma:// connection's queue pair retransmits after 4.096 µs × 2^16 = 268 ms, so its
/// `retry_count` (6) of them outlast the partition but end within 2 s of a peer gone for
/// good (rdma_cm's choice on RoCE is seconds per retry).
const ACK_TIMEOUT: u8 = 16;
/// The rdma:// connection is probed after this long without a completion (a call in flight
/// whose answer was lost counts), and found dead when the probe is not acknowledged within
/// [`KEEPALIVE_TIMEOUT`].
const KEEPALIVE: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection calling with no deadline, one call after another, until stopped.
struct Caller {
    what: &'static str,
    calls: Arc<AtomicU64>,
    longest: Arc<Mutex<Duration>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<(), Status>>,
}

impl Caller {
    fn start(url: &str, what: &'static str) -> Caller {
        let client = EchoClient::new(
            rdma_rpc::client()
                .rdma_config(
                    RdmaConfig::default().liveness(
                        Liveness::default()
                            .ack_timeout(Some(ACK_TIMEOUT))
                            .keepalive(Some(KEEPALIVE))
                            .keepalive_timeout(KEEPALIVE_TIMEOUT),
                    ),
                )
                .connect_timeout(Duration::from_secs(30))
                .connect_blocking(url)
                .unwrap_or_else(|e| panic!("connecting to {url}: {e}")),
        );
        let (calls, longest, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(Mutex::new(Duration::ZERO)),
            Arc::new(AtomicBool::new(false)),
        );
        let thread = std::thread::spawn({
            let (calls, longest, stop) = (calls.clone(), longest.clone(), stop.clone());
            move || {
                while !stop.load(Ordering::Acquire) {
                    let started = Instant::now();
                    client.echo_blocking(EchoRequest::default())?;
                    let took = started.elapsed();
                    let mut longest = lock(&longest);
                    *longest = (*longest).max(took);
                    calls.fetch_add(1, Ordering::Release);
                }
                Ok(())
            }
        });
        Caller {
            what,
            calls,
            longest,
            stop,
            thread,
        }
    }

    /// Waits until `n` calls more than `since` were answered (or the thread ended).
    fn wait_for(&self, since: u64, n: u64, bound: Duration) {
        let until = Instant::now() + bound;
        while self.calls.load(Ordering::Acquire) < since + n && !self.thread.is_finished() {
            assert!(
                Instant::now() < until,
                "{}: {} calls in {bound:?}",
                self.what,
                self.calls.load(Ordering::Acquire) - since
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops calling; how the calls ended (the first failure ends them).
    fn finish(self) -> Result<(), Status> {
        self.stop.store(true, Ordering::Release);
        let result = self.thread.join().expect("the caller's thread");
        say(format!(
            "{}: {} calls, the longest {:?}: {result:?}",
            self.what,
            self.calls.load(Ordering::Acquire),
            *lock(&self.longest)
        ));
        result
    }
}

#[test]
#[ignore = "needs two hosts: `cargo xtask test` runs it in a pair of soft-RoCE VMs"]
fn a_partition_that_heals() {
    let peer = Peer::from_env();
    let (rdma_url, tcp_url) = peer.urls();
    let callers = [
        Caller::start(&rdma_url, "rdma://"),
        Caller::start(&tcp_url, "tcp://"),
    ];
    for caller in &callers {
        caller.wait_for(0, BEFORE, BEFORE_BOUND);
    }
    peer.blip(OUTAGE);
    let healed = Instant::now();
    for caller in &callers {
        let so_far = caller.calls.load(Ordering::Acquire);
        caller.wait_for(so_far, AFTER, AFTER_BOUND);
    }
    say(format!(
        "partition of {OUTAGE:?}: {AFTER} more calls on each connection within {:?} of the link's return",
        healed.elapsed()
    ));
    let [rdma, tcp] = callers.map(Caller::finish);
    tcp.expect("tcp:// outlives a short partition");
    if let Err(status) = rdma {
        // Its retries ("transport retry counter exceeded") or its keepalive found the peer
        // gone, or the server's disconnect (of a queue pair that failed there) arrived.
        assert_eq!(status.code(), Code::Unavailable, "{status}");
        let message = status.message();
        assert!(
            message.contains("the peer is unreachable or dead") || message.contains("disconnected"),
            "{status}"
        );
    }
    let tcp = new_connections_work(&tcp_url);
    say(format!(
        "after the partition: new tcp:// connections: {tcp:?}"
    ));
    assert!(tcp.is_ok(), "tcp:// does not recover: {tcp:?}");
    let rdma = new_connections_work(&rdma_url);
    say(format!(
        "after the partition: new rdma:// connections (soft-RoCE's connection manager): {rdma:?}"
    ));
}
