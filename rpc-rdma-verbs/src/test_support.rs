//! Helpers for tests that need a real RDMA device: skip cleanly where there is none, fail
//! loudly where one was promised (in the soft-RoCE VM, `cargo xtask test-rdma` sets
//! `RDMA_RPC_REQUIRE_DEVICE=1`).

use std::io::Write as _;
use std::net::IpAddr;

use super::device::{devices, DeviceInfo};

/// Set to `1` to turn "no RDMA device" from a skip into a test failure.
pub const REQUIRE_DEVICE_ENV: &str = "RDMA_RPC_REQUIRE_DEVICE";
/// The local address of the RDMA device tests connect to (rdma_cm needs a real interface
/// address, not 127.0.0.1).
pub const TEST_ADDR_ENV: &str = "RDMA_RPC_TEST_ADDR";
/// [`TEST_ADDR_ENV`]'s default: veth0 in the soft-RoCE VM.
pub const DEFAULT_TEST_ADDR: &str = "192.168.77.1";

/// Environment variable naming the test device's IPv6 address.
pub const TEST_ADDR6_ENV: &str = "RDMA_RPC_TEST_ADDR6";

/// [`TEST_ADDR6_ENV`]'s default: veth0's IPv6 address in the soft-RoCE VM.
pub const DEFAULT_TEST_ADDR6: &str = "fd77::1";

/// Whether [`REQUIRE_DEVICE_ENV`] asks for a device.
pub fn device_required() -> bool {
    std::env::var(REQUIRE_DEVICE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The first RDMA device, or `None` after printing `skipped: no RDMA device` when there is
/// none. Panics when there is none but [`REQUIRE_DEVICE_ENV`] is set, and when listing
/// devices fails.
///
/// ```no_run
/// # use rpc_rdma_verbs::test_support::require_device;
/// let Some(device) = require_device() else { return };
/// ```
pub fn require_device() -> Option<DeviceInfo> {
    let found = match devices() {
        Ok(found) => found,
        Err(e) => panic!("listing RDMA devices failed: {e}"),
    };
    match found.into_iter().next() {
        Some(device) => Some(device),
        None if device_required() => panic!(
            "no RDMA device, but {REQUIRE_DEVICE_ENV} is set: is rdma_rxe loaded and \
             `rdma link add rxe0 type rxe netdev <if>` done? (`cargo run -p xtask -- test-rdma` \
             sets this up in a VM)"
        ),
        None => {
            // Written to the stderr handle rather than with `eprintln!`, which the test
            // harness captures: the skip should be visible in `cargo test` output.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: no RDMA device (set {REQUIRE_DEVICE_ENV}=1 to make this an error)"
            );
            None
        }
    }
}

/// The IPv6 address of the test device: [`TEST_ADDR6_ENV`] or [`DEFAULT_TEST_ADDR6`].
/// Panics on an unparsable value.
pub fn test_addr6() -> IpAddr {
    let text = std::env::var(TEST_ADDR6_ENV).unwrap_or_else(|_| DEFAULT_TEST_ADDR6.to_string());
    match text.parse() {
        Ok(addr) => addr,
        Err(e) => panic!("{TEST_ADDR6_ENV}={text:?} is not an IP address: {e}"),
    }
}

/// The address tests bind and connect to: [`TEST_ADDR_ENV`] or [`DEFAULT_TEST_ADDR`].
/// Panics on an unparsable value.
pub fn test_addr() -> IpAddr {
    let text = std::env::var(TEST_ADDR_ENV).unwrap_or_else(|_| DEFAULT_TEST_ADDR.to_string());
    match text.parse() {
        Ok(addr) => addr,
        Err(e) => panic!("{TEST_ADDR_ENV}={text:?} is not an IP address: {e}"),
    }
}
