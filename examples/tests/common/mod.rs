//! Helpers shared by the integration tests of the examples.

// Each test binary uses some of them.
#[allow(dead_code)]
pub mod load;

use std::time::Duration;

use rdma_rpc::{Channel, RdmaConfig, ServeExt, ServeOptions, ServerBuilder, ServerHandle};
use rpc_examples::testing::SleepRequest;
use rpc_transport_rdma::verbs::test_support::test_addr;

/// Serves `builder`'s services over RDMA on the test device's address (an ephemeral port),
/// with `rdma`.
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
