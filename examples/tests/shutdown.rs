//! Graceful shutdown under load, over TCP (host) and RDMA (soft-RoCE VM): awaited from the
//! same single-threaded runtime as the callers, it never blocks that thread, and no call
//! the server accepted is lost: every handler that started finishes and its answer
//! arrives; the calls refused meanwhile get `UNAVAILABLE`.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdma_rpc::prelude::*;
use rdma_rpc::{ServerBuilder, ServerHandle};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::Tester;

const CALLERS: usize = 16;
const HANDLER_TIME: Duration = Duration::from_millis(20);

fn tester_server(tester: &Tester) -> ServerBuilder {
    Server::builder().add_service(TesterServer::new(tester.clone()))
}

fn sleep() -> Request<SleepRequest> {
    let mut request = Request::new(SleepRequest {
        duration: Some(HANDLER_TIME.try_into().unwrap()),
    });
    request.set_timeout(Duration::from_secs(10));
    request
}

async fn shutdown_under_load(server: ServerHandle, tester: Tester) {
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(Mutex::new(Vec::<Status>::new()));
    // Each caller calls until the server refuses it.
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (client, answered, refused) = (client.clone(), answered.clone(), refused.clone());
            tokio::spawn(async move {
                loop {
                    match client.sleep(sleep()).await {
                        Ok(_) => answered.fetch_add(1, Ordering::SeqCst),
                        Err(status) => return refused.lock().push(status),
                    };
                }
            })
        })
        .collect();
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let stats = tester.stats.clone();
    let until = Instant::now() + Duration::from_secs(20);
    while stats.sleeps_started.load(Ordering::SeqCst) < 4 * CALLERS as u64 {
        assert!(Instant::now() < until, "calls under way");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let ticks_before = ticks.load(Ordering::Relaxed);
    let started = Instant::now();
    server.shutdown(Duration::from_secs(5)).await;
    let took = started.elapsed();
    let ticked = ticks.load(Ordering::Relaxed) - ticks_before;
    ticker.abort();
    for caller in callers {
        tokio::time::timeout(Duration::from_secs(10), caller)
            .await
            .expect("every caller ends")
            .unwrap();
    }

    let started = stats.sleeps_started.load(Ordering::SeqCst);
    let finished = stats.sleeps_finished.load(Ordering::SeqCst);
    let dropped = stats.sleeps_dropped.load(Ordering::SeqCst);
    let answered = answered.load(Ordering::SeqCst) as u64;
    eprintln!(
        "shutdown took {took:?}, {ticked} ticks meanwhile; {started} handlers started, \
         {finished} finished, {answered} answers arrived"
    );
    assert!(
        ticked > 0,
        "awaiting the shutdown left the executor's thread free"
    );
    assert_eq!(dropped, 0, "no running handler was cut short");
    assert_eq!(started, finished, "every accepted call ran to its end");
    assert_eq!(answered, finished, "and its answer reached the client");
    let refused = refused.lock();
    assert_eq!(refused.len(), CALLERS);
    for status in refused.iter() {
        assert_eq!(status.code(), Code::Unavailable, "{status}");
    }
}

/// While a shutdown waits for a running call, connecting is refused at once (not accepted
/// and then reset, which a reconnecting client would take for a server that is up).
async fn connecting_during_the_grace_period_is_refused(server: ServerHandle, tester: Tester) {
    let url = server.local_url().to_owned();
    let client = TesterClient::new(rdma_rpc::connect(&url).await.unwrap());
    let running = tokio::spawn(async move {
        let mut request = sleep();
        request.get_mut().duration = Some(Duration::from_secs(3).try_into().unwrap());
        client.sleep(request).await
    });
    while tester.stats.sleeps_started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let shutdown = tokio::spawn(server.shutdown(Duration::from_secs(10)));
    // The listener closes soon after the shutdown begins; until then a connection may still
    // be accepted (and then closed). Refused, either way, while the call still runs.
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let attempt = rdma_rpc::client()
            .connect_timeout(Duration::from_secs(2))
            .connect(&url)
            .await;
        match attempt {
            Err(refused) => break Status::from(refused),
            Ok(_) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(_) => panic!("still connecting 10 s into the grace period"),
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert_eq!(
        tester.stats.sleeps_finished.load(Ordering::SeqCst),
        0,
        "refused while the call ran"
    );
    running.await.unwrap().expect("the running call finished");
    shutdown.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connecting_during_the_grace_period_is_refused() {
    let tester = Tester::default();
    let server = tester_server(&tester).start("tcp://127.0.0.1:0").unwrap();
    connecting_during_the_grace_period_is_refused(server, tester).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_connecting_during_the_grace_period_is_refused() {
    let tester = Tester::default();
    let server = common::start_rdma(tester_server(&tester), Default::default());
    connecting_during_the_grace_period_is_refused(server, tester).await;
}

#[tokio::test(flavor = "current_thread")]
async fn tcp_graceful_shutdown_under_load_loses_no_accepted_call() {
    let tester = Tester::default();
    let server = tester_server(&tester).start("tcp://127.0.0.1:0").unwrap();
    shutdown_under_load(server, tester).await;
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_graceful_shutdown_under_load_loses_no_accepted_call() {
    let tester = Tester::default();
    let server = common::start_rdma(tester_server(&tester), Default::default());
    shutdown_under_load(server, tester).await;
}
