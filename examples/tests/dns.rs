//! A channel balanced over what a name resolves to, re-resolved while it runs
//! (`ClientBuilder::balance_dns`, gRPC's `dns:///`), over TCP: servers that appear in an
//! answer take calls, servers gone from it take no more, and an answer that fails or is
//! empty changes nothing.

mod common;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Counted;
use parking_lot::Mutex;
use rdma_rpc::prelude::*;
use rdma_rpc::{Resolve, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;

/// How often the test's channels resolve their name.
const REFRESH: Duration = Duration::from_millis(50);

/// A name server the test controls: answers with the addresses set, or fails; counts the
/// questions.
#[derive(Clone)]
struct Answers(Arc<Mutex<io::Result<Vec<SocketAddr>>>>, Arc<AtomicUsize>);

impl Answers {
    fn new(answer: Vec<SocketAddr>) -> Answers {
        Answers(Arc::new(Mutex::new(Ok(answer))), Arc::default())
    }

    /// Answers `answer` from now on, and returns once the channel has acted on it (it
    /// asked again after the question that got it).
    fn set(&self, answer: io::Result<Vec<SocketAddr>>) {
        *self.0.lock() = answer;
        let asked = self.1.load(Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(30);
        while self.1.load(Ordering::SeqCst) < asked + 2 {
            assert!(Instant::now() < until, "the channel stopped resolving");
            std::thread::sleep(REFRESH / 5);
        }
    }
}

impl Resolve for Answers {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        assert_eq!((host, port), ("kv.test", 7471), "the URL's host and port");
        self.1.fetch_add(1, Ordering::SeqCst);
        match &*self.0.lock() {
            Ok(addrs) => Ok(addrs.clone()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }
}

fn server(counter: &Counted) -> (ServerHandle, SocketAddr) {
    let server = Server::builder()
        .add_service(EchoServer::new(counter.clone()))
        .start("tcp://127.0.0.1:0")
        .unwrap();
    let addr = server
        .local_url()
        .trim_start_matches("tcp://")
        .parse()
        .unwrap();
    (server, addr)
}

/// Calls until `done`, at most 30 s; `what` names what was waited for.
async fn call_until(client: &EchoClient, what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        let mut request = Request::new(EchoRequest::default());
        request.set_timeout(Duration::from_secs(5));
        client.echo(request).await.expect("every call is answered");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_follow_the_answers_of_the_name() {
    let counters = [Counted::default(), Counted::default()];
    let (_a, a) = server(&counters[0]);
    let (_b, b) = server(&counters[1]);
    let answers = Answers::new(vec![a]);
    let channel = rdma_rpc::client()
        .balance_resolved("tcp://kv.test:7471", REFRESH, answers.clone())
        .unwrap();
    let client = EchoClient::new(channel);
    let answered = |i: usize| counters[i].0.load(Ordering::SeqCst);

    call_until(&client, "the first server answers", || answered(0) >= 20).await;
    assert_eq!(answered(1), 0, "the second is not in the answer yet");

    answers.set(Ok(vec![b, a]));
    call_until(&client, "both servers answer", || answered(1) >= 20).await;

    // A failed or empty answer keeps both.
    for answer in [Err(io::Error::other("SERVFAIL")), Ok(vec![])] {
        answers.set(answer);
        let before = (answered(0), answered(1));
        call_until(&client, "both still answer", || {
            answered(0) > before.0 + 5 && answered(1) > before.1 + 5
        })
        .await;
    }

    // The first leaves the answer: once the balancer has it, it takes no new calls.
    answers.set(Ok(vec![b]));
    let left = answered(0);
    let from = answered(1);
    call_until(&client, "the second takes 100 calls", || {
        answered(1) >= from + 100
    })
    .await;
    assert_eq!(
        answered(0),
        left,
        "a server gone from the answer took calls"
    );

    // The channel gone, its name is resolved no more.
    drop(client);
    std::thread::sleep(Duration::from_secs(2));
    let asked = answers.1.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(answers.1.load(Ordering::SeqCst), asked, "still resolving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_resolver_finds_localhost() {
    let counter = Counted::default();
    let (_server, addr) = server(&counter);
    let url = format!("tcp://localhost:{}", addr.port());
    let channel = rdma_rpc::client()
        .balance_dns(&url, rdma_rpc::DEFAULT_DNS_REFRESH)
        .unwrap();
    let client = EchoClient::new(channel);
    call_until(&client, "the server answers", || {
        counter.0.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(rdma_rpc::client()
        .balance_dns("tcp://no port", REFRESH)
        .is_err());
}
