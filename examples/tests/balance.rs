//! Three servers behind one balanced channel, over TCP (host) and RDMA (soft-RoCE VM):
//! calls spread over all three; one is killed under load and calls go on over the other
//! two; it comes back at its URL and takes calls again.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdma_rpc::prelude::*;
use rdma_rpc::{ReconnectConfig, ServerBuilder, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::{Echo, EchoServer};
use rpc_examples::echo::{EchoReply, EchoRequest};

const CALLERS: u64 = 4;
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Echoes, counting the calls it answers.
#[derive(Clone, Default)]
struct Counted(Arc<AtomicUsize>);

impl Echo for Counted {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let EchoRequest { payload, seq } = request.into_inner();
        Ok(Response::new(EchoReply { payload, seq }))
    }
}

fn builder(counter: &Counted) -> ServerBuilder {
    Server::builder().add_service(EchoServer::new(counter.clone()))
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[derive(Default)]
struct Outcomes {
    ok: AtomicUsize,
    failures: Mutex<Vec<Status>>,
}

/// `start(counter, url)` starts a server (at `url`, or anywhere when `None`).
async fn three_servers_one_killed(start: impl Fn(&Counted, Option<&str>) -> ServerHandle) {
    let counters: Vec<Counted> = (0..3).map(|_| Counted::default()).collect();
    let mut servers: Vec<Option<ServerHandle>> =
        counters.iter().map(|c| Some(start(c, None))).collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.as_ref().unwrap().local_url().to_owned())
        .collect();
    let channel = rdma_rpc::client()
        .connect_timeout(Duration::from_secs(2))
        .reconnect(ReconnectConfig {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            ..ReconnectConfig::default()
        })
        .balance_list(&urls)
        .unwrap();
    let client = EchoClient::new(channel.clone());

    let outcomes = Arc::new(Outcomes::default());
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let (client, outcomes, stop) = (client.clone(), outcomes.clone(), stop.clone());
            tokio::spawn(async move {
                let mut seq = caller << 32;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let mut request = Request::new(EchoRequest {
                        payload: vec![7; 16].into(),
                        seq,
                    });
                    request.set_timeout(CALL_TIMEOUT);
                    match client.echo(request).await {
                        Ok(reply) => {
                            assert_eq!(reply.get_ref().seq, seq);
                            outcomes.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(status) => {
                            outcomes.failures.lock().push(status);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                    }
                }
            })
        })
        .collect();
    let ok = || outcomes.ok.load(Ordering::Relaxed);
    let answered = |i: usize| counters[i].0.load(Ordering::SeqCst);

    until("every server takes calls", || {
        (0..3).all(|i| answered(i) >= 20)
    })
    .await;

    // Kill server 1 under load.
    servers[1].take().unwrap().shutdown(Duration::ZERO).await;
    let killed_at = answered(1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let failures_at_kill = outcomes.failures.lock().len();
    let from = ok();
    until("calls go on over the other two", || ok() >= from + 300).await;
    assert_eq!(answered(1), killed_at, "a dead server answered");
    let failures = outcomes.failures.lock().clone();
    assert_eq!(
        failures.len(),
        failures_at_kill,
        "calls failed after the dead server was known: {:?}",
        &failures[failures_at_kill..]
    );
    for status in &failures {
        // Only calls that were on the killed server's connection when it went.
        assert_eq!(status.code(), Code::Unavailable, "{status}");
    }

    // It comes back at its URL and takes calls again.
    servers[1] = Some(restart(&start, &counters[1], &urls[1]).await);
    until("the restarted server takes calls", || {
        answered(1) > killed_at
    })
    .await;

    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        tokio::time::timeout(CALL_TIMEOUT * 2, caller)
            .await
            .expect("no caller hangs")
            .unwrap();
    }
    assert_eq!(channel.connectivity(), rdma_rpc::Connectivity::Ready);
    assert_eq!(channel.in_flight(), 0, "nothing stays in flight");
    eprintln!(
        "{} calls answered ({:?} per server), {} failed when server 1 was killed",
        ok(),
        (0..3).map(answered).collect::<Vec<_>>(),
        failures.len()
    );
    for server in servers.into_iter().flatten() {
        server.shutdown(Duration::ZERO).await;
    }
}

/// Starts the server again at `url`, retrying while the old one lets go of it.
async fn restart(
    start: &impl Fn(&Counted, Option<&str>) -> ServerHandle,
    counter: &Counted,
    url: &str,
) -> ServerHandle {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let started =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| start(counter, Some(url))));
        match started {
            Ok(server) => return server,
            Err(_) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => panic!("cannot restart at {url}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_three_servers_one_killed() {
    three_servers_one_killed(|counter, url| {
        builder(counter)
            .start(url.unwrap_or("tcp://127.0.0.1:0"))
            .unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_three_servers_one_killed() {
    three_servers_one_killed(|counter, url| match url {
        Some(url) => builder(counter).start(url).unwrap(),
        None => common::start_rdma(builder(counter), Default::default()),
    })
    .await;
}
