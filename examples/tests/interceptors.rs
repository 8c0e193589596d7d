//! Interceptors through generated stubs, over TCP (host) and RDMA (soft-RoCE VM): a server
//! interceptor that checks a token and enriches the metadata its handler sees, an async one
//! that refuses; client interceptors that add metadata (sync and async, chained, on async
//! and blocking calls) or refuse a call before it is sent.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use rdma_rpc::prelude::*;
use rdma_rpc::{InterceptedService, ServerBuilder, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::{EchoService, Tester};

const TOKEN: &[u8] = b"Bearer good";

/// The server's interceptors, and what they saw.
#[derive(Default)]
struct Checks {
    seen: AtomicUsize,
    refused: AtomicUsize,
}

fn services(tester: &Tester, checks: &Arc<Checks>) -> ServerBuilder {
    let check = {
        let checks = checks.clone();
        move |mut request: Request<()>| {
            checks.seen.fetch_add(1, Ordering::SeqCst);
            assert!(
                request.metadata().get("x-panic").is_none(),
                "{INTERCEPTOR_BUG}"
            );
            if request.metadata().get("authorization") != Some(TOKEN) {
                checks.refused.fetch_add(1, Ordering::SeqCst);
                return Err(Status::unauthenticated("missing or wrong token"));
            }
            request.metadata_mut().insert("x-tenant", "blue").unwrap();
            Ok(request)
        }
    };
    let deny = |request: Request<()>| async move {
        // Awaits, as a policy lookup would.
        tokio::time::sleep(Duration::from_millis(1)).await;
        match request.metadata().get("x-deny") {
            Some(_) => Err(Status::permission_denied("denied by policy")),
            None => Ok(request),
        }
    };
    Server::builder()
        .add_service(TesterServer::with_interceptor(tester.clone(), check))
        .add_service(InterceptedService::new_async(
            EchoServer::new(EchoService),
            deny,
        ))
}

fn sleep_request() -> SleepRequest {
    SleepRequest {
        duration: Some(Duration::from_millis(1).try_into().unwrap()),
    }
}

fn echo(seq: u64) -> Request<EchoRequest> {
    let mut request = Request::new(EchoRequest {
        payload: b"x".to_vec().into(),
        seq,
    });
    request.set_timeout(Duration::from_secs(5));
    request
}

/// The panic hook, silent for the panic this test provokes on purpose: with
/// `RUST_BACKTRACE` set, printing its backtrace takes the server's thread longer than the
/// call's deadline in the soft-RoCE VM (the call then fails `DEADLINE_EXCEEDED`, not the
/// `INTERNAL` under test). Every other panic still reports as usual.
fn quiet_expected_panic() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if common::panic_message(info) != Some(INTERCEPTOR_BUG) {
                report(info);
            }
        }));
    });
}

const INTERCEPTOR_BUG: &str = "an interceptor bug";

async fn intercept(server: ServerHandle, tester: Tester, checks: Arc<Checks>) {
    quiet_expected_panic();
    let channel = rdma_rpc::connect(server.local_url()).await.unwrap();

    // No token: refused by the server's interceptor; the handler never runs.
    let bare = TesterClient::new(channel.clone());
    let status = bare.sleep(sleep_request()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    assert_eq!(status.message(), "missing or wrong token");
    assert_eq!(tester.stats.sleeps_started.load(Ordering::SeqCst), 0);
    assert_eq!(checks.refused.load(Ordering::SeqCst), 1);

    // A sync client interceptor adds the token; the handler sees the server's enrichment.
    let add_token = |mut request: Request<()>| {
        request
            .metadata_mut()
            .insert("authorization", TOKEN)
            .unwrap();
        Ok(request)
    };
    let authed = TesterClient::with_interceptor(channel.clone(), add_token);
    authed.sleep(sleep_request()).await.unwrap();
    assert_eq!(tester.stats.sleeps_started.load(Ordering::SeqCst), 1);
    let reply = authed.echo(echo(1)).await.unwrap();
    assert_eq!(reply.metadata().get("authorization"), Some(TOKEN));
    assert_eq!(reply.metadata().get("x-tenant"), Some(&b"blue"[..]));

    // An async one chained after it, on async and blocking calls alike.
    let ids = Arc::new(AtomicU64::new(0));
    let add_id = {
        let ids = ids.clone();
        move |mut request: Request<()>| {
            let id = ids.fetch_add(1, Ordering::SeqCst);
            async move {
                // Needs the runtime's timer, in async and blocking calls alike.
                tokio::time::sleep(Duration::from_millis(1)).await;
                request
                    .metadata_mut()
                    .insert("x-request-id", id.to_string())
                    .unwrap();
                Ok(request)
            }
        }
    };
    let traced = TesterClient::new(
        channel
            .with_interceptor(add_token)
            .with_async_interceptor(add_id),
    );
    let reply = traced.echo(echo(2)).await.unwrap();
    assert_eq!(reply.metadata().get("x-request-id"), Some(&b"0"[..]));
    assert_eq!(reply.metadata().get("authorization"), Some(TOKEN));
    let blocking = traced.clone();
    let reply = tokio::task::spawn_blocking(move || blocking.echo_blocking(echo(3)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.metadata().get("x-request-id"), Some(&b"1"[..]));
    assert_eq!(reply.get_ref().seq, 3);

    // A server interceptor that panics answers INTERNAL, like a handler that panics, and
    // the connection serves on.
    let mut request = echo(8);
    request.metadata_mut().insert("x-panic", "1").unwrap();
    let status = authed.echo(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status}");
    authed
        .echo(echo(9))
        .await
        .expect("the connection serves on");

    // A client interceptor that refuses: the call fails with its status, nothing is sent.
    let seen = checks.seen.load(Ordering::SeqCst);
    let refuse = |_: Request<()>| Err(Status::failed_precondition("no quota left"));
    let refused = TesterClient::with_interceptor(channel.clone(), refuse);
    let status = refused.echo(echo(4)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    let blocking = refused.clone();
    let status = tokio::task::spawn_blocking(move || blocking.echo_blocking(echo(5)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert_eq!(
        checks.seen.load(Ordering::SeqCst),
        seen,
        "nothing reached the server"
    );

    // The server's async interceptor: refuses on its metadata, lets the rest through.
    let echo_client = EchoClient::new(channel.clone());
    echo_client.echo(echo(6)).await.unwrap();
    let mut denied = echo(7);
    denied.metadata_mut().insert("x-deny", "1").unwrap();
    let status = echo_client.echo(denied).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert_eq!(channel.in_flight(), 0);
    server.shutdown(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_interceptors() {
    let (tester, checks) = (Tester::default(), Arc::new(Checks::default()));
    let server = services(&tester, &checks)
        .start("tcp://127.0.0.1:0")
        .unwrap();
    intercept(server, tester, checks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_interceptors() {
    let (tester, checks) = (Tester::default(), Arc::new(Checks::default()));
    let server = common::start_rdma(services(&tester, &checks), Default::default());
    intercept(server, tester, checks).await;
}
