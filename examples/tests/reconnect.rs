//! A server restarted under clients that keep calling, over TCP (host) and RDMA (soft-RoCE
//! VM): the channel heals, calls resume, none hang, and the failures in between carry clear
//! statuses.

mod common;

use std::time::Duration;

use common::load::{echo, restart, until, Callers};
use rdma_rpc::prelude::*;
use rdma_rpc::{ReconnectConfig, ServeOptions, ServerBuilder, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::EchoService;

const CALLERS: u64 = 4;

fn echo_server() -> ServerBuilder {
    Server::builder().add_service(EchoServer::new(EchoService))
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
    // The first connect of a process over soft-RoCE under emulation can take seconds.
    let connect = || {
        rdma_rpc::client()
            .connect_timeout(Duration::from_secs(10))
            .reconnect(reconnect.clone())
    };
    let client = EchoClient::new(connect().connect(&url).await.unwrap());
    let patient = EchoClient::new(connect().wait_for_ready(true).connect_lazy(&url).unwrap());

    let callers = Callers::start(&client, CALLERS);
    until("calls before the restart", || callers.ok() >= 50).await;
    server.shutdown(Duration::ZERO).await;
    until("calls failing while the server is down", || {
        callers.failed() > 0
    })
    .await;
    let waiting = tokio::spawn({
        let patient = patient.clone();
        // Longer than a restart may take (`restart` retries for up to 10 s).
        let mut waiting = echo(u64::MAX);
        waiting.set_timeout(Duration::from_secs(15));
        async move { patient.echo(waiting).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failures_while_down = callers.failed();

    let restarted = tokio::task::spawn_blocking({
        let (url, options) = (url.clone(), options.clone());
        move || restart(&url, || echo_server().start_with(&url, options.clone()))
    })
    .await
    .unwrap();
    let resumed_from = callers.ok();
    until("calls after the restart", || {
        callers.ok() >= resumed_from + 50
    })
    .await;
    let answered = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the wait-for-ready call ended")
        .unwrap()
        .expect("the wait-for-ready call went through once the server was back");
    assert_eq!(answered.get_ref().seq, u64::MAX);

    let calls_answered = callers.ok();
    let failures: Vec<Status> = callers.stop().await.into_iter().map(|f| f.status).collect();
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
        calls_answered,
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
