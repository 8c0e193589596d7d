//! What the chaos tests share: 64 calling connections, outcomes, and the device's
//! resources against their baseline.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdma_rpc::prelude::*;
use rdma_rpc::{Liveness, RdmaConfig, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::EchoService;
use rpc_transport_rdma::verbs::test_support::test_addr;

use super::common;

// The pair tests' own part; the one-VM chaos binaries use none of it.
#[allow(dead_code)]
pub mod pair;

/// Prints a figure of the chaos where the test's output is shown even when it passes
/// (written to stderr directly: the test harness captures `eprintln!`).
pub fn say(line: String) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One chaos at a time: they share the device and its link.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub const CONNECTIONS: usize = 64;
/// Deadline of every call.
pub const DEADLINE: Duration = Duration::from_secs(2);
pub const KEEPALIVE: Duration = Duration::from_millis(500);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest any call may take: its deadline, or the keepalive's detection, plus slack for
/// the emulation.
pub const BOUND: Duration = Duration::from_secs(4);

pub fn rdma() -> RdmaConfig {
    RdmaConfig::default().liveness(
        Liveness::default()
            .keepalive(Some(KEEPALIVE))
            .keepalive_timeout(KEEPALIVE_TIMEOUT),
    )
}

/// The device's resource counts, as `rdma resource` shows them (`pd`, `cq`, `qp`, `mr`,
/// ...), summed over devices.
pub fn device_resources() -> BTreeMap<String, u64> {
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
pub fn pinned_kib() -> u64 {
    rpc_examples::blob::pinned_bytes().expect("VmPin in /proc/self/status") / 1024
}

#[derive(Debug, PartialEq, Eq, Clone)]
pub struct Usage {
    device: BTreeMap<String, u64>,
    pinned_kib: u64,
}

pub fn usage() -> Usage {
    Usage {
        device: device_resources(),
        pinned_kib: pinned_kib(),
    }
}

/// The resources before a chaos. The process first makes one connection and call and
/// closes them, so that what librdmacm opens once per process (the device's context, `ctx`)
/// is in the baseline.
pub fn baseline() -> Usage {
    let server = echo_server();
    warm_up(server.local_url());
    server.shutdown_blocking(Duration::ZERO);
    settled()
}

/// One connection to `url` and one call, closed: what librdmacm opens once per process for
/// the device it goes through (the device's context, `ctx`) stays open after.
pub fn warm_up(url: &str) {
    let channel = rdma_rpc::connect_blocking(url).expect("connects");
    EchoClient::new(channel.clone())
        .echo_blocking(EchoRequest::default())
        .expect("a call");
    drop(channel);
}

/// The resources once they stop changing between two looks 100 ms apart (at most 5 s).
pub fn settled() -> Usage {
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

/// The echo service over RDMA, in this process, with the chaos' keepalive.
pub fn echo_server() -> ServerHandle {
    common::start_rdma(
        Server::builder().add_service(EchoServer::new(EchoService)),
        rdma(),
    )
}

/// Longest an `echo-server` process may take to say where it listens.
const SERVER_START_BOUND: Duration = Duration::from_secs(30);

/// The echo server over RDMA in a process of its own, with its standard error going to
/// `stderr`, and the URL it serves; or why not, once it said nothing for
/// [`SERVER_START_BOUND`] (it is killed) or ended first.
pub fn server_process(stderr: Stdio) -> Result<(Child, String), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_echo-server"))
        .arg(format!("rdma://{}:0", test_addr()))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("echo-server does not start: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(SERVER_START_BOUND).unwrap_or_default();
    // `echo-server listening on <url>`
    match line.trim().strip_prefix("echo-server listening on ") {
        Some(url) => Ok((child, url.to_owned())),
        None => {
            let _ = child.kill();
            Err(format!(
                "echo-server did not say where it listens within {SERVER_START_BOUND:?}: {line:?}"
            ))
        }
    }
}

/// [`CONNECTIONS`] connections calling a server on a runtime of their own (see `callers`).
pub struct Calling {
    rt: tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<()>,
    stop: Arc<AtomicU64>,
    outcomes: Arc<Outcomes>,
}

impl Calling {
    /// Starts calling `url`; returns once 1,000 calls were answered, having printed the
    /// resources in use then, as `what`.
    pub fn start(url: &str, what: &str) -> Calling {
        let stop = Arc::new(AtomicU64::new(0));
        let outcomes = Arc::new(Outcomes::default());
        let rt = runtime();
        let task = rt.spawn({
            let (url, stop, outcomes) = (url.to_owned(), stop.clone(), outcomes.clone());
            async move { callers(&url, stop, outcomes).await }
        });
        under_load(&outcomes, 1000, what);
        Calling {
            rt,
            task,
            stop,
            outcomes,
        }
    }

    /// Waits (up to [`BOUND`]) until `failed` connections have seen a call fail (each
    /// stops calling at its first failure), then stops calling, waits for every call to
    /// end, and returns how they ended. A test of a dead server asks for every connection,
    /// so that one between two calls is not told to stop before it could see the death.
    pub fn finish(self, failed: u64) -> Arc<Outcomes> {
        let until = Instant::now() + BOUND;
        while lock(&self.outcomes.failed).values().sum::<u64>() < failed && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop.store(1, Ordering::Release);
        self.rt.block_on(self.task).unwrap();
        self.outcomes
    }
}

/// Longest the callers may take to have their first calls answered (setting up 64
/// connections under emulation takes seconds): past it the test fails, saying what it saw,
/// instead of hanging until the suite's timeout.
const LOAD_BOUND: Duration = Duration::from_secs(60);

/// Waits (up to [`LOAD_BOUND`]) until `outcomes` counts `calls` answered, and prints the
/// resources in use then.
fn under_load(outcomes: &Outcomes, calls: u64, what: &str) {
    let until = Instant::now() + LOAD_BOUND;
    loop {
        let ok = outcomes.ok.load(Ordering::Relaxed);
        if ok >= calls {
            break;
        }
        assert!(
            Instant::now() < until,
            "{what}: {ok} of {calls} calls answered within {LOAD_BOUND:?}; failed: {:?}",
            lock(&outcomes.failed)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    say(format!("{what}: in use   {:?}", usage()));
}

/// Waits (up to 90 s: teardowns queue on the reaper thread, and soft-RoCE may take tens of
/// seconds to destroy a queue pair) for the resources to come back to `baseline`, and
/// prints both.
pub fn back_to(baseline: &Usage, what: &str) {
    let until = Instant::now() + Duration::from_secs(90);
    let mut now = usage();
    while now != *baseline && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        now = usage();
    }
    say(format!("{what}: baseline {baseline:?}"));
    say(format!("{what}: after    {now:?}"));
    assert_eq!(
        now, *baseline,
        "{what}: resources not back to their baseline"
    );
}

/// How the calls of a chaos ended.
#[derive(Default)]
pub struct Outcomes {
    pub ok: AtomicU64,
    pub failed: Mutex<BTreeMap<String, u64>>,
    /// The first failure, as the caller saw it.
    sample: Mutex<Option<Status>>,
    longest: Mutex<Duration>,
}

impl Outcomes {
    pub fn record(&self, result: &Result<(), Status>, took: Duration) {
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

    pub fn report(&self, what: &str) {
        let longest = *lock(&self.longest);
        say(format!(
            "{what}: {} calls ok, failed {:?}, longest call {longest:?}",
            self.ok.load(Ordering::Relaxed),
            lock(&self.failed)
        ));
        if let Some(status) = &*lock(&self.sample) {
            say(format!("{what}: e.g. {status}"));
        }
        assert!(longest <= BOUND, "{what}: a call took {longest:?}");
    }
}

/// Longest each of the [`CONNECTIONS`] connections, made all at once, may take to set up.
/// The connection manager resends a handshake message left unanswered after about 4.3 s
/// (`CMA_CM_RESPONSE_TIMEOUT`), which with any other delay is past the default 5 s: in one
/// CI run one of the 64 timed out waiting for `ESTABLISHED`, before any chaos began.
const CONNECT_BOUND: Duration = Duration::from_secs(20);

/// `CONNECTIONS` channels to `url`, each calling until `stop` says so or its connection
/// fails; every call's end goes to `outcomes`.
async fn callers(url: &str, stop: Arc<AtomicU64>, outcomes: Arc<Outcomes>) {
    let mut config = rdma();
    config.liveness.connect_timeout = CONNECT_BOUND;
    let channels: Vec<Channel> = join_all((0..CONNECTIONS).map(|_| {
        rdma_rpc::client()
            .rdma_config(config.clone())
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
