//! What a connection is admitted with: the process's limits on connections and registered
//! memory, and a device that offers less inline data than asked for.
//!
//! Ignored by a plain `cargo test` (it needs a device); `cargo xtask test` runs it in the
//! soft-RoCE VM with `--include-ignored`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rpc_core::{method_id, CallTable, Channel, ChannelConfig, Code, Request, Server, Status};
use rpc_transport_rdma::verbs::test_support;
use rpc_transport_rdma::{
    process_limits, process_usage, set_process_limits, ProcessLimits, RdmaClient, RdmaConfig,
    RdmaServer, Rings,
};

/// The tests change process-wide limits: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn server() -> RdmaServer {
    let dispatcher = Server::builder()
        .max_message_size(16 << 20)
        .build()
        .expect("dispatcher");
    RdmaServer::bind(
        &SocketAddr::new(test_support::test_addr(), 0).to_string(),
        dispatcher,
        RdmaConfig::default(),
    )
    .expect("server")
}

fn connect(server: &RdmaServer, config: &RdmaConfig) -> Result<Channel, Status> {
    let calls = Arc::new(CallTable::new());
    let client = RdmaClient::connect(&server.local_addr().to_string(), calls.clone(), config)?;
    let config = ChannelConfig {
        max_message_size: 16 << 20,
        ..ChannelConfig::default()
    };
    Ok(Channel::new(calls, client, config))
}

/// Waits until the connections of the tests before are gone: they are torn down on the
/// reaper thread (soft-RoCE may take tens of seconds to destroy a queue pair), and count
/// until then.
fn settle() {
    let until = Instant::now() + Duration::from_secs(90);
    while process_usage().connections > 0 {
        assert!(Instant::now() < until, "{:?}", process_usage());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A call to a method nobody serves, with a request of `len` bytes.
fn call(channel: &Channel, len: usize) -> Status {
    channel
        .unary_blocking::<Vec<u8>, ()>(method_id("/nobody.Home/Call"), Request::new(vec![7; len]))
        .unwrap_err()
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn connections_past_the_process_limit_are_refused_naming_it() {
    let _serial = SERIAL.lock();
    if test_support::require_device().is_none() {
        return;
    }
    settle();
    let server = server();
    let before = process_usage();
    let defaults = process_limits();
    // One client connection and its server side, then one more client connection whose
    // server side is over the limit.
    set_process_limits(ProcessLimits {
        connections: before.connections + 3,
        ..defaults
    });
    let first = connect(&server, &RdmaConfig::default()).expect("first connection");
    assert_eq!(call(&first, 10).code(), Code::Unimplemented);
    let refused = connect(&server, &RdmaConfig::default()).expect_err("over the limit");
    eprintln!("server side over the limit: {refused}");
    assert!(
        refused.message().contains("ProcessLimits::connections"),
        "{refused}"
    );
    set_process_limits(ProcessLimits {
        connections: before.connections + 2,
        ..defaults
    });
    let refused = connect(&server, &RdmaConfig::default()).expect_err("over the limit");
    eprintln!("client side over the limit: {refused}");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
    drop(first);
    set_process_limits(defaults);
    let again = connect(&server, &RdmaConfig::default()).expect("under the limit again");
    assert_eq!(call(&again, 10).code(), Code::Unimplemented);
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn large_bodies_past_the_process_registered_limit_are_refused_naming_it() {
    let _serial = SERIAL.lock();
    if test_support::require_device().is_none() {
        return;
    }
    settle();
    let server = server();
    let channel = connect(&server, &RdmaConfig::default()).expect("connects");
    let defaults = process_limits();
    let held = process_usage().registered_bytes;
    set_process_limits(ProcessLimits {
        registered_bytes: held + (4 << 20),
        ..defaults
    });
    assert_eq!(
        call(&channel, 1 << 20).code(),
        Code::Unimplemented,
        "1 MiB fits"
    );
    let refused = call(&channel, 8 << 20);
    eprintln!("8 MiB past the process's limit: {refused}");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
    assert!(
        refused
            .message()
            .contains("ProcessLimits::registered_bytes"),
        "{refused}"
    );
    set_process_limits(defaults);
    assert_eq!(call(&channel, 8 << 20).code(), Code::Unimplemented);
}

/// soft-RoCE offers less inline data than 4 KiB: the queue pair is created with what the
/// device grants, and calls work.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_device_offering_less_inline_data_than_asked_still_connects() {
    let _serial = SERIAL.lock();
    if test_support::require_device().is_none() {
        return;
    }
    let server = server();
    let config = RdmaConfig::default().rings(Rings::default().max_inline(64 * 1024));
    let channel = connect(&server, &config).expect("connects with less inline data");
    for len in [10, 1000, 100_000] {
        assert_eq!(call(&channel, len).code(), Code::Unimplemented);
    }
}
