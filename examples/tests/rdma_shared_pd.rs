//! Every engine on a device (a process's server connections and its client connections)
//! shares one protection domain: an application buffer is registered once per device, and
//! a large body that arrived on a server connection goes on over a client connection from
//! where it lies (a proxy copies nothing). Run in the soft-RoCE VM by `cargo xtask test`.
//!
//! A binary of its own: the registration and copy counters it reads are the process's.

mod common;

use std::time::{Duration, Instant};

use rdma_rpc::prelude::*;
use rdma_rpc::{large_body_bytes, process_usage, RdmaConfig, RegisteredBuffer};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::{Echo, EchoServer};
use rpc_examples::echo::{EchoReply, EchoRequest};
use rpc_examples::{bulk_pattern, EchoService};
use rpc_transport_rdma::verbs::test_support::require_device;

const MIB: usize = 1 << 20;

fn builder(service: impl Echo) -> rdma_rpc::ServerBuilder {
    Server::builder()
        .max_message_size(64 * MIB)
        .add_service(EchoServer::new(service))
}

fn echo_client(url: &str) -> EchoClient {
    EchoClient::new(
        rdma_rpc::client()
            .max_message_size(64 * MIB)
            .connect_blocking(url)
            .expect("client connects"),
    )
}

/// Sends what it is asked to echo on to another echo server, and answers with its answer.
struct Forward(EchoClient);

impl Echo for Forward {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let answer = self.0.clone().echo(request.into_inner()).await?;
        Ok(Response::new(answer.into_inner()))
    }
}

/// The registered bytes once they stop changing (a registration with a new device happens
/// as its first connection sets it up).
fn registered() -> u64 {
    let until = Instant::now() + Duration::from_secs(5);
    let mut before = process_usage().registered_bytes;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = process_usage().registered_bytes;
        if now == before || Instant::now() > until {
            return now;
        }
        before = now;
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_proxy_sends_a_large_body_on_from_where_it_arrived() {
    if require_device().is_none() {
        return;
    }
    // A server that is also a client (a proxy), in front of an echo server.
    let backend = common::start_rdma(builder(EchoService), RdmaConfig::default());
    let proxy = common::start_rdma(
        builder(Forward(echo_client(backend.local_url()))),
        RdmaConfig::default(),
    );
    let client = echo_client(proxy.local_url());

    // Both roles' engines are up: a buffer registers once for the device.
    let before = registered();
    let len = 16 * MIB + 3;
    let mut buffer = RegisteredBuffer::new(len).expect("a registered buffer");
    assert_eq!(
        i128::from(registered()) - i128::from(before),
        len as i128,
        "the buffer was registered once, though server and client engines use the device"
    );
    buffer
        .get_mut()
        .expect("nothing else holds a new buffer")
        .copy_from_slice(&bulk_pattern(len, 11));

    // client → proxy → backend → proxy → client: every hop from where the body lies.
    let moved = large_body_bytes();
    let reply = client
        .echo_blocking(EchoRequest {
            payload: buffer.slice(..),
            seq: 11,
        })
        .expect("the call through the proxy")
        .into_inner();
    let moved = large_body_bytes().since(&moved);
    assert!(
        reply.payload == buffer.slice(..),
        "the body came back intact"
    );
    eprintln!("{len} B through a proxy and back: {moved:?}");
    assert_eq!(moved.in_place, 4 * len as u64, "four hops, each in place");
    assert!(moved.copied < 4 * 64, "only framing copied: {moved:?}");
}
