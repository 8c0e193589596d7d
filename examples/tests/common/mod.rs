//! Helpers shared by the integration tests of the examples.

// Each test binary uses some of them.
#[allow(dead_code)]
pub mod grpcio;
#[allow(dead_code)]
pub mod load;
#[allow(dead_code)]
pub mod tls;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdma_rpc::{Channel, RdmaConfig, ServeExt, ServeOptions, ServerBuilder, ServerHandle};
use rdma_rpc::{Request, Response, Status};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::Echo;
use rpc_examples::echo::{EchoReply, EchoRequest};
use rpc_examples::testing::SleepRequest;
use rpc_transport_rdma::verbs::test_support::test_addr;

/// Serves `builder`'s services over RDMA on the test device's address (an ephemeral port),
/// with `rdma`.
#[allow(dead_code)]
pub fn start_rdma(builder: ServerBuilder, rdma: RdmaConfig) -> ServerHandle {
    builder
        .start_with(
            &format!("rdma://{}:0", test_addr()),
            ServeOptions {
                rdma,
                ..Default::default()
            },
        )
        .expect("rdma server starts")
}

/// A channel to `server` over RDMA with `rdma`, connected before it returns.
#[allow(dead_code)]
pub fn connect_rdma(server: &ServerHandle, rdma: RdmaConfig) -> Channel {
    rdma_rpc::client()
        .rdma_config(rdma)
        .connect_blocking(server.local_url())
        .expect("rdma client connects")
}

/// A request for the test service's handler to sleep for `d`.
#[allow(dead_code)]
pub fn sleep_for(d: Duration) -> SleepRequest {
    SleepRequest {
        duration: Some(d.try_into().expect("small duration")),
    }
}

/// The message of a panic, whether it was formatted or a literal.
#[allow(dead_code)]
pub fn panic_message<'a>(info: &'a std::panic::PanicHookInfo<'_>) -> Option<&'a str> {
    let payload = info.payload();
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

/// `len` bytes that differ with `seed`: a reply carrying another call's payload shows.
#[allow(dead_code)]
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed) as u8)
        .collect()
}

fn echo_request(seq: u64, payload: &[u8]) -> EchoRequest {
    EchoRequest {
        payload: payload.to_vec().into(),
        seq,
    }
}

/// Echoes `payload` as call `seq` with the blocking stub; panics unless the reply is that
/// call's.
#[allow(dead_code)]
pub fn echo_blocking_checked(client: &EchoClient, seq: u64, payload: &[u8]) {
    let request = echo_request(seq, payload);
    let reply = client.echo_blocking(request).unwrap().into_inner();
    assert_eq!(
        (reply.seq, &reply.payload[..]),
        (seq, payload),
        "call {seq}"
    );
}

/// [`echo_blocking_checked`] with the async stub.
#[allow(dead_code)]
pub async fn echo_checked(client: &EchoClient, seq: u64, payload: &[u8]) {
    let request = echo_request(seq, payload);
    let reply = client.echo(request).await.unwrap().into_inner();
    assert_eq!(
        (reply.seq, &reply.payload[..]),
        (seq, payload),
        "call {seq}"
    );
}

/// Echoes, counting the calls it answers.
#[allow(dead_code)]
#[derive(Clone, Default)]
pub struct Counted(pub Arc<AtomicUsize>);

impl Echo for Counted {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let EchoRequest { payload, seq } = request.into_inner();
        Ok(Response::new(EchoReply { payload, seq }))
    }
}
