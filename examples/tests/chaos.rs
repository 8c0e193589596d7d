//! Chaos on real verbs (run in the soft-RoCE VM by `cargo xtask test`; a plain `cargo test`
//! ignores them): 64 connections making calls while the server is killed (`kill -9`),
//! while the link goes down, and while 1,000 peers connect and vanish. After each, every
//! call has ended with a clear status within its deadline or the keepalive time, and the
//! device's resources (`rdma resource`) and this process's pinned memory are back to
//! their baseline. The figures are printed.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdma_rpc::prelude::*;
use rdma_rpc::RdmaConfig;
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::EchoService;
use rpc_transport_rdma::verbs::test_support::{require_device, test_addr};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One chaos at a time: they share the device and its link.
static SERIAL: Mutex<()> = Mutex::new(());

const CONNECTIONS: usize = 64;
/// Deadline of every call.
const DEADLINE: Duration = Duration::from_secs(2);
const KEEPALIVE: Duration = Duration::from_millis(500);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest any call may take: its deadline, or the keepalive's detection, plus slack for
/// the emulation.
const BOUND: Duration = Duration::from_secs(4);

fn rdma() -> RdmaConfig {
    RdmaConfig {
        keepalive: Some(KEEPALIVE),
        keepalive_timeout: KEEPALIVE_TIMEOUT,
        ..RdmaConfig::default()
    }
}

/// The device's resource counts, as `rdma resource` shows them (`pd`, `cq`, `qp`, `mr`,
/// ...), summed over devices.
fn device_resources() -> BTreeMap<String, u64> {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("the rdma tool (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if let Ok(n) = pair[1].parse::<u64>() {
                *counts.entry(pair[0].to_owned()).or_default() += n;
            }
        }
    }
    assert!(counts.contains_key("qp"), "rdma resource show: {text}");
    counts
}

/// This process's pinned memory, in KiB.
fn pinned_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmPin in /proc/self/status")
}

#[derive(Debug, PartialEq, Eq, Clone)]
struct Usage {
    device: BTreeMap<String, u64>,
    pinned_kib: u64,
}

fn usage() -> Usage {
    Usage {
        device: device_resources(),
        pinned_kib: pinned_kib(),
    }
}

/// The resources before a chaos. The process first makes one connection and call and
/// closes them, so that what librdmacm opens once per process (the device's context, `ctx`)
/// is in the baseline.
fn baseline() -> Usage {
    let server = common::start_rdma(
        Server::builder().add_service(EchoServer::new(EchoService)),
        rdma(),
    );
    let channel = rdma_rpc::connect_blocking(server.local_url()).expect("connects");
    EchoClient::new(channel.clone())
        .echo_blocking(EchoRequest::default())
        .expect("a call");
    drop(channel);
    server.shutdown(Duration::ZERO);
    let settled = Instant::now() + Duration::from_secs(5);
    let mut before = usage();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = usage();
        if now == before || Instant::now() > settled {
            return now;
        }
        before = now;
    }
}

/// Waits until `outcomes` counts `calls` answered, and prints the resources in use then.
fn under_load(outcomes: &Outcomes, calls: u64, what: &str) {
    while outcomes.ok.load(Ordering::Relaxed) < calls {
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("{what}: in use   {:?}", usage());
}

/// Waits (up to 10 s) for the resources to come back to `baseline`, and prints both.
fn back_to(baseline: &Usage, what: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    let mut now = usage();
    while now != *baseline && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        now = usage();
    }
    eprintln!("{what}: baseline {baseline:?}");
    eprintln!("{what}: after    {now:?}");
    assert_eq!(
        now, *baseline,
        "{what}: resources not back to their baseline"
    );
}

/// How the calls of a chaos ended.
#[derive(Default)]
struct Outcomes {
    ok: AtomicU64,
    failed: Mutex<BTreeMap<String, u64>>,
    /// The first failure, as the caller saw it.
    sample: Mutex<Option<Status>>,
    longest: Mutex<Duration>,
}

impl Outcomes {
    fn record(&self, result: &Result<(), Status>, took: Duration) {
        let mut longest = lock(&self.longest);
        *longest = (*longest).max(took);
        match result {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(status) => {
                assert!(
                    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
                    "an unclear status: {status}"
                );
                assert!(!status.message().is_empty(), "{status:?}");
                *lock(&self.failed)
                    .entry(status.code().to_string())
                    .or_default() += 1;
                lock(&self.sample).get_or_insert_with(|| status.clone());
            }
        }
    }

    fn report(&self, what: &str) {
        let longest = *lock(&self.longest);
        eprintln!(
            "{what}: {} calls ok, failed {:?}, longest call {longest:?}",
            self.ok.load(Ordering::Relaxed),
            lock(&self.failed)
        );
        if let Some(status) = &*lock(&self.sample) {
            eprintln!("{what}: e.g. {status}");
        }
        assert!(longest <= BOUND, "{what}: a call took {longest:?}");
    }
}

/// `CONNECTIONS` channels to `url`, each calling until `stop` says so or its connection
/// fails; every call's end goes to `outcomes`.
async fn callers(url: &str, stop: Arc<AtomicU64>, outcomes: Arc<Outcomes>) {
    let channels: Vec<Channel> = join_all((0..CONNECTIONS).map(|_| {
        rdma_rpc::client()
            .rdma_config(rdma())
            .timeout(DEADLINE)
            .connect(url)
    }))
    .await
    .into_iter()
    .map(|c| c.expect("connects"))
    .collect();
    let calls = channels.into_iter().enumerate().map(|(i, channel)| {
        let stop = stop.clone();
        let outcomes = outcomes.clone();
        async move {
            let client = EchoClient::new(channel);
            let mut seq = 0u64;
            while stop.load(Ordering::Acquire) == 0 {
                seq += 1;
                let started = Instant::now();
                let request = EchoRequest {
                    payload: vec![i as u8; 64 + (seq as usize * 97) % 4000].into(),
                    seq,
                };
                let result = client.echo(request).await.map(drop);
                outcomes.record(&result, started.elapsed());
                if result.is_err() {
                    break;
                }
            }
        }
    });
    join_all(calls).await;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The echo server in a process of its own, and the URL it serves.
fn server_process() -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_echo-server"))
        .arg(format!("rdma://{}:0", test_addr()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("echo-server starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .rsplit(' ')
        .next()
        .expect("echo-server prints its URL")
        .to_owned();
    (child, url)
}

/// `kill -9`: the process gets no chance to say goodbye.
fn kill_9(child: &mut Child) {
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_server_killed_under_64_connections() {
    require_device().expect("an RDMA device");
    let _serial = lock(&SERIAL);
    let baseline = baseline();
    let (mut server, url) = server_process();
    let stop = Arc::new(AtomicU64::new(0));
    let outcomes = Arc::new(Outcomes::default());
    let rt = runtime();
    let calling = rt.spawn({
        let (url, stop, outcomes) = (url.clone(), stop.clone(), outcomes.clone());
        async move { callers(&url, stop, outcomes).await }
    });
    under_load(&outcomes, 1000, "server killed");
    let killed = Instant::now();
    kill_9(&mut server);
    rt.block_on(calling).unwrap();
    let ended = killed.elapsed();
    outcomes.report("server killed");
    eprintln!("server killed: every call ended {ended:?} after the kill");
    assert!(ended <= BOUND, "{ended:?}");
    assert_eq!(
        lock(&outcomes.failed).values().sum::<u64>(),
        CONNECTIONS as u64,
        "each connection's last call failed"
    );
    drop(rt);
    back_to(&baseline, "server killed");
}

/// Sets veth0's link down for as long as it lives.
struct LinkDown;

impl LinkDown {
    fn set(up: bool) {
        let state = if up { "up" } else { "down" };
        let status = Command::new("ip")
            .args(["link", "set", "veth0", state])
            .status()
            .unwrap();
        assert!(status.success(), "ip link set veth0 {state}");
    }

    fn new() -> LinkDown {
        LinkDown::set(false);
        LinkDown
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        LinkDown::set(true);
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn the_link_goes_down_under_64_connections() {
    require_device().expect("an RDMA device");
    let _serial = lock(&SERIAL);
    let baseline = baseline();
    let server = common::start_rdma(
        Server::builder().add_service(EchoServer::new(EchoService)),
        rdma(),
    );
    let url = server.local_url().to_owned();
    let stop = Arc::new(AtomicU64::new(0));
    let outcomes = Arc::new(Outcomes::default());
    let rt = runtime();
    let calling = rt.spawn({
        let (stop, outcomes) = (stop.clone(), outcomes.clone());
        async move { callers(&url, stop, outcomes).await }
    });
    under_load(&outcomes, 1000, "link down");
    let down = LinkDown::new();
    std::thread::sleep(BOUND);
    drop(down);
    stop.store(1, Ordering::Release);
    rt.block_on(calling).unwrap();
    outcomes.report("link down");
    drop(rt);
    server.shutdown(Duration::from_secs(1));
    back_to(&baseline, "link down");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_thousand_peers_connect_and_vanish_under_64_connections() {
    require_device().expect("an RDMA device");
    let _serial = lock(&SERIAL);
    let baseline = baseline();
    let server = common::start_rdma(
        Server::builder().add_service(EchoServer::new(EchoService)),
        rdma(),
    );
    let url = server.local_url().to_owned();
    let stop = Arc::new(AtomicU64::new(0));
    let outcomes = Arc::new(Outcomes::default());
    let rt = runtime();
    let calling = rt.spawn({
        let (url, stop, outcomes) = (url.clone(), stop.clone(), outcomes.clone());
        async move { callers(&url, stop, outcomes).await }
    });
    // Peers in processes of their own that connect, call, and are killed wherever they
    // are: before, during or after connecting, in the middle of a call.
    const PEERS: usize = 1000;
    const AT_ONCE: usize = 8;
    under_load(&outcomes, 1000, "peers vanish");
    let started = Instant::now();
    let mut peers: Vec<Child> = Vec::new();
    for i in 0..PEERS {
        let peer = Command::new(env!("CARGO_BIN_EXE_echo-client"))
            .args([url.as_str(), "--count", "1000000", "--size", "3000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("echo-client starts");
        peers.push(peer);
        if peers.len() == AT_ONCE {
            std::thread::sleep(Duration::from_millis((i % 7) as u64 * 5));
            peers.iter_mut().for_each(kill_9);
            peers.clear();
        }
    }
    peers.iter_mut().for_each(kill_9);
    eprintln!(
        "{PEERS} peers connected and vanished in {:?}",
        started.elapsed()
    );
    stop.store(1, Ordering::Release);
    rt.block_on(calling).unwrap();
    outcomes.report("peers vanished");
    assert!(
        lock(&outcomes.failed).is_empty(),
        "the 64 connections never noticed: {:?}",
        lock(&outcomes.failed)
    );
    drop(rt);
    server.shutdown(Duration::from_secs(1));
    back_to(&baseline, "peers vanished");
}
