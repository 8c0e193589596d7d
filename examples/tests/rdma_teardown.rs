//! Ending RDMA connections without losing what is in flight (run in the soft-RoCE VM by
//! `cargo xtask test`; a plain `cargo test` ignores them).

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdma_rpc::prelude::*;
use rdma_rpc::{RdmaConfig, ServerHandle};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::{BulkRequest, SleepRequest};
use rpc_examples::{bulk_pattern, Tester};
use rpc_transport_rdma::verbs::test_support::require_device;

fn start(tester: &Tester) -> ServerHandle {
    common::start_rdma(
        Server::builder().add_service(TesterServer::new(tester.clone())),
        RdmaConfig::default(),
    )
}

fn delay(d: Duration) -> Option<prost_types::Duration> {
    Some(d.try_into().expect("small duration"))
}

/// A server shut down under load answers every call it accepted, small answers by SEND and
/// large ones by RDMA WRITE: it disconnects only once they completed, and the client closes
/// only once what arrived before the disconnect is delivered. Calls made during the drain
/// fail with `UNAVAILABLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn shutdown_under_load_answers_every_accepted_call_by_send_and_by_write() {
    require_device().expect("an RDMA device");
    // Warnings (a failed work request, a protocol violation) say why a call was lost.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_test_writer()
        .try_init();
    const CALLS: u64 = 32;
    const LARGE: usize = 1024 * 1024;
    let tester = Tester::default();
    let server = start(&tester);
    let client = TesterClient::new(rdma_rpc::connect(server.local_url()).await.unwrap());
    let call = |i: u64, pause: Duration| {
        let client = client.clone();
        tokio::spawn(async move {
            if i.is_multiple_of(2) {
                let request = SleepRequest {
                    duration: delay(pause),
                };
                client.sleep(request).await.map(|_| None)
            } else {
                let request = BulkRequest {
                    reply_len: LARGE as u64,
                    seed: i,
                    payload: Default::default(),
                    delay: delay(pause),
                };
                let reply = client.bulk(request).await?.into_inner();
                assert_eq!(reply.payload, bulk_pattern(LARGE, i), "reply {i}");
                Ok(Some(i))
            }
        })
    };
    call(1, Duration::ZERO)
        .await
        .unwrap()
        .expect("a first call");
    let accepted: Vec<_> = (0..CALLS)
        .map(|i| call(i, Duration::from_millis(300)))
        .collect();
    let stats = tester.stats.clone();
    while stats.sleeps_started.load(Ordering::SeqCst) < CALLS + 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let shutdown = tokio::spawn(server.shutdown(Duration::from_secs(5)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let late: Vec<_> = (0..8).map(|i| call(i, Duration::ZERO)).collect();
    shutdown.await.unwrap();
    eprintln!("shutdown took {:?}", started.elapsed());
    let mut large = 0;
    for (i, result) in join_all(accepted).await.into_iter().enumerate() {
        let answer = result.unwrap();
        let bulk = answer.unwrap_or_else(|status| panic!("accepted call {i}: {status}"));
        large += u64::from(bulk.is_some());
    }
    for result in join_all(late).await {
        if let Err(status) = result.unwrap() {
            assert_eq!(status.code(), Code::Unavailable, "{status}");
        }
    }
    eprintln!(
        "late calls ended {:?} after the shutdown began",
        started.elapsed()
    );
    let finished = stats.sleeps_finished.load(Ordering::SeqCst);
    eprintln!("{CALLS} calls accepted and answered ({large} by RDMA WRITE)");
    assert_eq!(finished, CALLS + 1, "every started call ran to its end");
    assert_eq!(large, CALLS / 2);
    // Dropping never blocks, though destroying the queue pair may (soft-RoCE sometimes waits
    // 50 s for a packet's reference to it): the reaper thread does that.
    let dropping = Instant::now();
    drop(client);
    let took = dropping.elapsed();
    eprintln!("client dropped in {took:?}");
    assert!(
        took < Duration::from_secs(1),
        "dropping the client took {took:?}"
    );
}
