//! The standard health service through generated stubs, over TCP (host) and RDMA
//! (soft-RoCE VM): what an orchestrator's probe sees.

mod common;

use std::time::Duration;

use futures::StreamExt;
use rdma_rpc::health::pb::health_client::HealthClient;
use rdma_rpc::health::pb::HealthCheckRequest;
use rdma_rpc::health::{health_reporter, HealthReporter, ServingStatus};
use rdma_rpc::prelude::*;
use rdma_rpc::ServerHandle;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::EchoService;

fn builder() -> (rdma_rpc::ServerBuilder, HealthReporter) {
    let (reporter, health) = health_reporter();
    let builder = Server::builder()
        .add_service(health)
        .add_service(EchoServer::new(EchoService));
    (builder, reporter)
}

fn ask(service: &str) -> Request<HealthCheckRequest> {
    let mut request = Request::new(HealthCheckRequest {
        service: service.into(),
    });
    request.set_timeout(Duration::from_secs(5));
    request
}

const ECHO: &str = "echo.Echo";

/// Check answers what the reporter set (NOT_FOUND before); Watch sends the status at once
/// and then each change, and ends when the client drops it; the blocking stub probes too.
async fn probe(server: ServerHandle, reporter: HealthReporter) {
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();
    let health = HealthClient::new(channel.clone());
    let whole = health.check(ask("")).await.unwrap().into_inner();
    assert_eq!(whole.status(), ServingStatus::Serving);
    let missing = health.check(ask(ECHO)).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing}");

    let mut watch = health.watch(ask(ECHO)).await.unwrap().into_inner();
    let mut next = async || {
        let next = tokio::time::timeout(Duration::from_secs(5), watch.next());
        next.await.expect("a status").unwrap().unwrap().status()
    };
    assert_eq!(next().await, ServingStatus::ServiceUnknown);
    reporter.set_serving::<EchoServer<EchoService>>();
    assert_eq!(next().await, ServingStatus::Serving);
    let echo = health.check(ask(ECHO)).await.unwrap().into_inner();
    assert_eq!(echo.status(), ServingStatus::Serving);
    reporter.set_not_serving::<EchoServer<EchoService>>();
    assert_eq!(next().await, ServingStatus::NotServing);
    drop(watch);

    let blocking = health.clone();
    let status = tokio::task::spawn_blocking(move || blocking.check_blocking(ask(ECHO)))
        .await
        .unwrap()
        .unwrap()
        .into_inner()
        .status();
    assert_eq!(status, ServingStatus::NotServing);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while channel.in_flight() > 0 {
        assert!(
            std::time::Instant::now() < until,
            "the watch still in flight"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_health() {
    let (builder, reporter) = builder();
    let server = builder.start("tcp://127.0.0.1:0").unwrap();
    probe(server, reporter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_health() {
    let (builder, reporter) = builder();
    let server = common::start_rdma(builder, Default::default());
    probe(server, reporter).await;
}
