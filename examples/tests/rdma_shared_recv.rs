//! Connections receiving from a shared receive queue (`Rings::recv`), over real
//! verbs (run in the soft-RoCE VM by `cargo xtask test`). Queue pairs use `rnr_retry = 0`,
//! so a receive-not-ready anywhere fails the call that hit it: the credits the server
//! grants out of the queue's buffers must always be backed.
//!
//! Every test needs an RDMA device, so a plain `cargo test` ignores them.

mod common;

use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use rdma_rpc::prelude::*;
use rdma_rpc::{RdmaConfig, Receives, Rings, ServerHandle, SharedRecvConfig};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::EchoService;
use rpc_transport_rdma::verbs::test_support::require_device;

fn shared(bounds: SharedRecvConfig) -> RdmaConfig {
    RdmaConfig::default().rings(Rings::default().recv(Receives::Shared(bounds)))
}

fn start(rdma: RdmaConfig) -> ServerHandle {
    common::start_rdma(
        Server::builder().add_service(EchoServer::new(EchoService)),
        rdma,
    )
}

fn connect(server: &ServerHandle, rdma: RdmaConfig) -> Result<EchoClient, rdma_rpc::Error> {
    let channel = rdma_rpc::client()
        .rdma_config(rdma)
        .connect_blocking(server.local_url())?;
    Ok(EchoClient::new(channel))
}

/// `calls` echo calls, `in_flight` at a time, each reply checked.
async fn echo_calls(client: EchoClient, first: u64, calls: u64, in_flight: usize) {
    stream::iter(first..first + calls)
        .map(|seq| {
            let client = client.clone();
            async move {
                let payload = vec![seq as u8; 32 + (seq as usize * 37) % 3000];
                let mut request = Request::new(EchoRequest {
                    payload: payload.clone().into(),
                    seq,
                });
                request.set_timeout(Duration::from_secs(30));
                let reply = client.echo(request).await.expect("echo").into_inner();
                assert_eq!((reply.seq, reply.payload), (seq, payload.into()));
            }
        })
        .buffer_unordered(in_flight)
        .collect::<()>()
        .await;
}

/// Eight clients, whose connections share one receive queue at the client too, keep 16
/// calls each in flight against a server whose connections share one: windows start at
/// the default and grow out of the queues' buffers; no RNR, every reply intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn eight_clients_sixteen_in_flight_each_on_shared_receive_queues() {
    if require_device().is_none() {
        return;
    }
    let rdma = shared(SharedRecvConfig::default());
    let server = start(rdma.clone());
    let clients: Vec<EchoClient> = (0..8)
        .map(|_| connect(&server, rdma.clone()).expect("rdma client connects"))
        .collect();
    let runs = clients
        .into_iter()
        .enumerate()
        .map(|(c, client)| tokio::spawn(echo_calls(client, c as u64 * 10_000, 600, 16)));
    for run in runs.collect::<Vec<_>>() {
        run.await.expect("a client's calls");
    }
}

/// A server whose queue holds at most 16 buffers (chunks of 8, a slack of 2) admits three
/// windows of 4 and refuses the fourth connection before accepting it; once a client
/// leaves, its buffers come back and the next connection is admitted.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_full_shared_receive_queue_refuses_connections_until_one_leaves() {
    if require_device().is_none() {
        return;
    }
    let bounds = SharedRecvConfig::default()
        .chunk(8)
        .max_buffers(16)
        .slack(2);
    let server = start(shared(bounds));
    let client_config = RdmaConfig::default();
    let mut clients: Vec<EchoClient> = (0..3)
        .map(|_| connect(&server, client_config.clone()).expect("admitted"))
        .collect();
    let refused = connect(&server, client_config.clone());
    assert!(refused.is_err(), "a fourth window of 4 fits 16 buffers");
    for (seq, client) in clients.iter().enumerate() {
        let reply = client
            .echo_blocking(EchoRequest {
                payload: vec![7; 100].into(),
                seq: seq as u64,
            })
            .expect("an admitted connection works")
            .into_inner();
        assert_eq!(reply.seq, seq as u64);
    }
    drop(clients.remove(0));
    // Its teardown queues on the reaper thread, where soft-RoCE may take tens of seconds.
    let deadline = Instant::now() + Duration::from_secs(90);
    let admitted = loop {
        match connect(&server, client_config.clone()) {
            Ok(client) => break client,
            Err(e) => {
                assert!(Instant::now() < deadline, "never admitted again: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let reply = admitted
        .echo_blocking(EchoRequest {
            payload: vec![9; 100].into(),
            seq: 99,
        })
        .expect("the newly admitted connection works")
        .into_inner();
    assert_eq!(reply.seq, 99);
}
