//! Async callers driving the completions of their connection on their own executor (the
//! engine's drive lease), over real verbs (run in the soft-RoCE VM by `cargo xtask test`).
//!
//! Every test needs an RDMA device, so a plain `cargo test` ignores them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use rdma_rpc::prelude::*;
use rdma_rpc::{PollMode, Polling, RdmaConfig, ServeOptions, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::{EchoService, Tester};
use rpc_transport_rdma::verbs::test_support::{require_device, test_addr};

/// The tests run one at a time: each spins on both of the VM's two vCPUs (busy polling, a
/// blocked lease holder), and two at once starve soft-RoCE's kernel work, so that a connect
/// once timed out. One of them also measures that the process goes idle.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn start() -> ServerHandle {
    Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(TesterServer::new(Tester::default()))
        .start_with(
            &format!("rdma://{}:0", test_addr()),
            ServeOptions::default(),
        )
        .expect("rdma server starts")
}

fn connect(server: &ServerHandle, poll_mode: PollMode) -> Channel {
    rdma_rpc::client()
        .rdma_config(RdmaConfig::default().polling(Polling::default().mode(poll_mode)))
        .connect_blocking(server.local_url())
        .expect("rdma client connects")
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `calls` echo calls, `in_flight` at a time, each reply checked.
async fn echo_calls(client: EchoClient, calls: u64, in_flight: usize) {
    stream::iter(0..calls)
        .map(|seq| {
            let client = client.clone();
            async move {
                let mut request = Request::new(EchoRequest {
                    payload: vec![seq as u8; 32 + seq as usize % 500].into(),
                    seq,
                });
                request.set_timeout(Duration::from_secs(30));
                let reply = client.echo(request).await.expect("echo").into_inner();
                assert_eq!(reply.seq, seq);
                assert_eq!(reply.payload.len(), 32 + seq as usize % 500);
            }
        })
        .buffer_unordered(in_flight)
        .collect::<()>()
        .await;
}

/// CPU time (user + system) this process has used so far.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which ends with the last ')'): utime is the 12th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Calls from a current-thread runtime, a multi-thread runtime and a blocking thread share
/// one connection (so one CQ and its lease) in every polling mode: all complete. Then, in
/// the default adaptive mode, nobody keeps spinning: the process goes idle.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn async_and_blocking_callers_share_a_connection_then_go_idle() {
    if require_device().is_none() {
        return;
    }
    let _serial = one_at_a_time();
    let server = start();
    for mode in [PollMode::Busy, PollMode::Event, PollMode::default()] {
        let channel = connect(&server, mode);
        let client = EchoClient::new(channel);
        let single = {
            let client = client.clone();
            std::thread::spawn(move || current_thread().block_on(echo_calls(client, 1_000, 16)))
        };
        let multi = {
            let client = client.clone();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(echo_calls(client, 1_000, 8))
            })
        };
        for seq in 0..300 {
            let reply = client
                .echo_blocking(EchoRequest {
                    payload: vec![7; 100].into(),
                    seq,
                })
                .expect("blocking echo");
            assert_eq!(reply.get_ref().seq, seq);
        }
        single.join().expect("current-thread callers");
        multi.join().expect("multi-thread callers");
        eprintln!("{mode:?}: 2,300 calls done");
    }
    // Adaptive (the last mode): pollers and lease holders stop spinning 1 ms after the
    // last completion. A spinning thread would use a whole core over this window.
    std::thread::sleep(Duration::from_millis(200));
    let (cpu, wall) = (process_cpu(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let used = process_cpu() - cpu;
    let share = used.as_secs_f64() / wall.elapsed().as_secs_f64();
    eprintln!("idle: {used:?} of CPU over {:?}", wall.elapsed());
    assert!(
        share < 0.25,
        "an idle process used {:.0}% of a core",
        share * 100.0
    );
}

/// A lease holder whose executor stops polling it (its thread blocked) does not keep the
/// other callers of its CQ waiting: the poller looks at the CQ anyway and completes their
/// calls. Busy mode, so the blocked holder never steps down by itself.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_blocked_lease_holder_does_not_starve_other_callers() {
    if require_device().is_none() {
        return;
    }
    let _serial = one_at_a_time();
    let server = start();
    let channel = connect(&server, PollMode::Busy);
    // Long enough that the calls below, slowed by emulation on a loaded host (one caller
    // window per completion at worst, a few hundred ms per call there), end while the
    // holder is still blocked unless they waited for it.
    const BLOCKED: Duration = Duration::from_secs(8);
    let unblocked = Arc::new(AtomicBool::new(false));
    let holder = {
        let tester = TesterClient::new(channel.clone());
        let unblocked = unblocked.clone();
        std::thread::spawn(move || {
            current_thread().block_on(async move {
                // This call waits 1 s for its answer, driving the CQ meanwhile...
                let slow = tokio::spawn(async move {
                    tester
                        .sleep(SleepRequest {
                            duration: Some(Duration::from_secs(1).try_into().unwrap()),
                        })
                        .await
                        .expect("slow call")
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                // ...until its executor's thread blocks.
                std::thread::sleep(BLOCKED);
                unblocked.store(true, Ordering::SeqCst);
                slow.await.unwrap();
            })
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let client = EchoClient::new(channel);
    current_thread().block_on(async {
        for seq in 0..10 {
            let reply = client
                .echo(EchoRequest {
                    payload: vec![1; 32].into(),
                    seq,
                })
                .await
                .expect("echo");
            assert_eq!(reply.get_ref().seq, seq);
        }
    });
    let took = started.elapsed();
    eprintln!("10 calls beside a blocked lease holder: {took:?}");
    // Order, not time: the calls ended before the holder's thread was let go.
    assert!(
        !unblocked.load(Ordering::SeqCst),
        "the calls waited for the blocked holder ({took:?})"
    );
    holder.join().expect("holder");
}
