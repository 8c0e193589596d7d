//! A server restarted under clients that keep calling, over TCP (host) and RDMA (soft-RoCE
//! VM): the channel heals, calls resume, none hang, and the failures in between carry clear
//! statuses.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdma_rpc::prelude::*;
use rdma_rpc::{ReconnectConfig, ServeOptions, ServerBuilder, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::EchoService;

const CALLERS: usize = 4;
/// Every call's budget: a call that hangs fails the test as `DeadlineExceeded`.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

fn echo_server() -> ServerBuilder {
    Server::builder().add_service(EchoServer::new(EchoService))
}

/// Starts the server again at the URL it had, retrying while the old one lets go of it.
fn restart(url: &str, options: &ServeOptions) -> ServerHandle {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match echo_server().start_with(url, options.clone()) {
            Ok(server) => return server,
            Err(e) if Instant::now() < until => {
                eprintln!("restart at {url}: {e}; again");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("cannot restart at {url}: {e}"),
        }
    }
}

fn request(seq: u64) -> Request<EchoRequest> {
    let mut request = Request::new(EchoRequest {
        payload: seq.to_le_bytes().to_vec().into(),
        seq,
    });
    request.set_timeout(CALL_TIMEOUT);
    request
}

#[derive(Default)]
struct Outcomes {
    ok: AtomicUsize,
    failures: Mutex<Vec<Status>>,
}

async fn until(what: &str, check: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Four tasks call without pause; the server goes down for 300 ms and comes back at the same
/// URL; a wait-for-ready call made while it is down completes once it is back.
async fn restart_under_calls(server: ServerHandle, options: ServeOptions) {
    let url = server.local_url().to_owned();
    let reconnect = ReconnectConfig {
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        ..ReconnectConfig::default()
    };
    let connect = || {
        rdma_rpc::client()
            .connect_timeout(Duration::from_secs(2))
            .reconnect(reconnect.clone())
    };
    let client = EchoClient::new(connect().connect(&url).await.unwrap());
    let patient = EchoClient::new(connect().wait_for_ready(true).connect_lazy(&url).unwrap());

    let outcomes = Arc::new(Outcomes::default());
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS as u64)
        .map(|caller| {
            let (client, outcomes, stop) = (client.clone(), outcomes.clone(), stop.clone());
            tokio::spawn(async move {
                let mut seq = caller << 32;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    match client.echo(request(seq)).await {
                        Ok(reply) => {
                            assert_eq!(reply.get_ref().seq, seq, "the answer to this call");
                            outcomes.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(status) => {
                            outcomes.failures.lock().push(status);
                            // Failing fast: no busy loop while the server is away.
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                    }
                }
            })
        })
        .collect();

    let ok = || outcomes.ok.load(Ordering::Relaxed);
    until("calls before the restart", || ok() >= 50).await;
    server.shutdown(Duration::ZERO).await;
    until("calls failing while the server is down", || {
        !outcomes.failures.lock().is_empty()
    })
    .await;
    let waiting = tokio::spawn({
        let patient = patient.clone();
        // Longer than a restart may take (`restart` retries for up to 10 s).
        let mut waiting = request(u64::MAX);
        waiting.set_timeout(Duration::from_secs(15));
        async move { patient.echo(waiting).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failures_while_down = outcomes.failures.lock().len();

    let restarted = tokio::task::spawn_blocking({
        let (url, options) = (url.clone(), options.clone());
        move || restart(&url, &options)
    })
    .await
    .unwrap();
    let resumed_from = ok();
    until("calls after the restart", || ok() >= resumed_from + 50).await;
    let answered = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the wait-for-ready call ended")
        .unwrap()
        .expect("the wait-for-ready call went through once the server was back");
    assert_eq!(answered.get_ref().seq, u64::MAX);

    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        tokio::time::timeout(CALL_TIMEOUT * 2, caller)
            .await
            .expect("no caller hangs")
            .unwrap();
    }
    let failures = std::mem::take(&mut *outcomes.failures.lock());
    assert!(failures_while_down > 0);
    // Strict on purpose: a call whose connection dies fails at once with UNAVAILABLE,
    // never by running out its deadline.
    for status in failures.iter() {
        assert_eq!(status.code(), Code::Unavailable, "{status}");
        assert!(!status.message().is_empty(), "{status}");
    }
    assert!(
        failures
            .iter()
            .any(|s| s.message().contains("reconnecting")),
        "calls failed fast while attempts failed: {:?}",
        failures.iter().take(5).collect::<Vec<_>>()
    );
    assert_eq!(
        client.channel().connectivity(),
        rdma_rpc::Connectivity::Ready
    );
    assert_eq!(client.channel().in_flight(), 0, "nothing stays in flight");
    eprintln!(
        "{} calls answered, {} failed while the server was away",
        ok(),
        failures.len()
    );
    restarted.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_server_restarted_under_calling_clients() {
    let server = echo_server().start("tcp://127.0.0.1:0").unwrap();
    restart_under_calls(server, ServeOptions::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_server_restarted_under_calling_clients() {
    let server = common::start_rdma(echo_server(), Default::default());
    restart_under_calls(server, ServeOptions::default()).await;
}
