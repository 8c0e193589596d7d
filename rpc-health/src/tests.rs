//! The service's answers, called directly (the transports are covered by
//! `examples/tests/health.rs`).

use futures::StreamExt;
use rpc_core::{Code, Request};

use super::pb::health_server::Health;
use super::*;

fn ask(service: &str) -> Request<HealthCheckRequest> {
    Request::new(HealthCheckRequest {
        service: service.into(),
    })
}

async fn check(health: &HealthService, service: &str) -> Result<ServingStatus, Status> {
    let response = health.check(ask(service)).await?.into_inner();
    Ok(response.status())
}

async fn watch(health: &HealthService, service: &str) -> WatchStream {
    health.watch(ask(service)).await.unwrap().into_inner()
}

async fn next(statuses: &mut WatchStream) -> ServingStatus {
    let next = tokio::time::timeout(std::time::Duration::from_secs(5), statuses.next());
    next.await.expect("a status").unwrap().unwrap().status()
}

/// Nothing comes within 50 ms.
async fn quiet(statuses: &mut WatchStream) {
    let next = tokio::time::timeout(std::time::Duration::from_millis(50), statuses.next());
    assert!(next.await.is_err(), "an unexpected status");
}

#[tokio::test]
async fn check_answers_the_reported_status_and_not_found_for_others() {
    let reporter = HealthReporter::new();
    let health = reporter.service();
    assert_eq!(check(&health, "").await.unwrap(), ServingStatus::Serving);
    let unknown = check(&health, "kv.Store").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("kv.Store"), "{unknown}");

    reporter.set_serving::<HealthServer<HealthService>>();
    let name = "grpc.health.v1.Health";
    assert_eq!(check(&health, name).await.unwrap(), ServingStatus::Serving);
    reporter.set_not_serving::<HealthServer<HealthService>>();
    assert_eq!(
        check(&health, name).await.unwrap(),
        ServingStatus::NotServing
    );
    reporter.clear_service_status(name);
    assert_eq!(
        check(&health, name).await.unwrap_err().code(),
        Code::NotFound
    );
}

#[tokio::test]
async fn watch_sends_the_status_at_once_then_each_change() {
    let reporter = HealthReporter::new();
    let health = reporter.service();
    let mut statuses = watch(&health, "kv.Store").await;
    assert_eq!(next(&mut statuses).await, ServingStatus::ServiceUnknown);
    quiet(&mut statuses).await;

    reporter.set_service_status("kv.Store", ServingStatus::Serving);
    assert_eq!(next(&mut statuses).await, ServingStatus::Serving);
    reporter.set_service_status("kv.Store", ServingStatus::Serving);
    reporter.set_service_status("other.Service", ServingStatus::NotServing);
    quiet(&mut statuses).await;

    reporter.set_service_status("kv.Store", ServingStatus::NotServing);
    assert_eq!(next(&mut statuses).await, ServingStatus::NotServing);
    reporter.clear_service_status("kv.Store");
    assert_eq!(next(&mut statuses).await, ServingStatus::ServiceUnknown);

    let mut whole = watch(&health, "").await;
    assert_eq!(next(&mut whole).await, ServingStatus::Serving);
}

/// A watcher that does not read sees the latest status, not every change in between.
#[tokio::test]
async fn a_slow_watcher_gets_the_latest_status() {
    let reporter = HealthReporter::new();
    let mut statuses = watch(&reporter.service(), "kv.Store").await;
    assert_eq!(next(&mut statuses).await, ServingStatus::ServiceUnknown);
    for i in 0..10_000 {
        let status = [ServingStatus::Serving, ServingStatus::NotServing][i % 2];
        reporter.set_service_status("kv.Store", status);
    }
    assert_eq!(next(&mut statuses).await, ServingStatus::NotServing);
    quiet(&mut statuses).await;
}

/// Watching names nobody reported adds nothing to the reporter's table.
#[tokio::test]
async fn watching_made_up_names_does_not_grow_the_table() {
    let reporter = HealthReporter::new();
    let health = reporter.service();
    let mut watches = Vec::new();
    for i in 0..1000 {
        let mut statuses = watch(&health, &format!("made.Up{i}")).await;
        assert_eq!(next(&mut statuses).await, ServingStatus::ServiceUnknown);
        watches.push(statuses);
    }
    assert_eq!(
        reporter.shared.statuses.read().len(),
        1,
        "only the server's own"
    );
}
