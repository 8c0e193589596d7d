//! Helpers shared by the integration tests of the examples.

// Each test binary uses some of them.
#[allow(dead_code)]
pub mod load;

use rdma_rpc::{RdmaConfig, ServeExt, ServeOptions, ServerBuilder, ServerHandle};
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

/// The message of a panic, whether it was formatted or a literal.
#[allow(dead_code)]
pub fn panic_message<'a>(info: &'a std::panic::PanicHookInfo<'_>) -> Option<&'a str> {
    let payload = info.payload();
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}
