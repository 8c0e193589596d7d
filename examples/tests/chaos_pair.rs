//! Chaos between two hosts: `cargo xtask test` runs this binary in the first VM of a pair
//! (`cargo xtask vm-pair`; a plain `cargo test` ignores it), with `echo-server` serving
//! over rdma:// and tcp:// in the second. The server's link `link0`, the one its address
//! `PAIR_PEER` is on, goes down from its own side, so frames are lost on the wire with no
//! error, reset or event reaching this host: at that address the peer just goes silent,
//! as a host that dies or a cable that is pulled does. This side asks for the link to go
//! down and up through files in the pair's meeting directory (`PAIR_DIR`).
//!
//! Checked: every call of 64 RDMA connections ends with a clear status within its deadline
//! or the keepalive time; a call with no deadline, over rdma:// and over tcp://, fails with
//! `UNAVAILABLE` within the keepalive's detection time; the device's resources and this
//! process's pinned memory come back to their baseline; over tcp:// new connections work
//! again once the link is back. Whether soft-RoCE's connection manager takes new
//! connections again after the flap is printed.

// The chaos tests' shared helpers; this binary uses some of them.
#[allow(dead_code)]
mod chaos_support;
mod common;

use std::time::{Duration, Instant};

use chaos_support::pair::{new_connections_work, Peer};
use chaos_support::*;
use rdma_rpc::prelude::*;
use rdma_rpc::{ConnectionLimits, ReconnectConfig};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;

/// Longest a no-deadline call may take to fail once the peer went silent: the keepalive's
/// detection (every [`KEEPALIVE`], dead after [`KEEPALIVE_TIMEOUT`]), then at most
/// [`RECONNECT_WAIT`] for a new connection, plus slack for the emulation.
const DETECTION_BOUND: Duration = Duration::from_secs(8);

/// How long a call waits for a new connection once the keepalive closed the old one.
const RECONNECT_WAIT: Duration = Duration::from_secs(2);

/// A channel to `url` whose calls have no deadline: only the keepalive can end them. Once
/// it has closed the connection, a call waits [`RECONNECT_WAIT`] at most for a new one.
fn no_deadline_channel(url: &str) -> EchoClient<Channel> {
    let tcp = ConnectionLimits {
        keepalive: Some(KEEPALIVE),
        keepalive_timeout: KEEPALIVE_TIMEOUT,
        ..ConnectionLimits::default()
    };
    let reconnect = ReconnectConfig {
        connect_wait: RECONNECT_WAIT,
        ..ReconnectConfig::default()
    };
    let channel = rdma_rpc::client()
        .rdma_config(rdma())
        .tcp_limits(tcp)
        .reconnect(reconnect)
        .connect_timeout(Duration::from_secs(30))
        .connect_blocking(url)
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    let client = EchoClient::new(channel);
    client
        .echo_blocking(EchoRequest::default())
        .unwrap_or_else(|e| panic!("a first call to {url}: {e}"));
    client
}

/// Calls once on `client` (whose peer went silent at `down`) on a thread of its own, and
/// checks that the call fails `UNAVAILABLE` within [`DETECTION_BOUND`] of `down`: in flight
/// when the keepalive finds the peer dead, or, if the keepalive found it first, waiting for
/// a new connection.
fn silent_call(
    client: EchoClient<Channel>,
    what: &'static str,
    down: Instant,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let result = client.echo_blocking(EchoRequest::default());
        let took = down.elapsed();
        let status = result.expect_err("a call to a silent peer cannot succeed");
        say(format!(
            "{what}: a call with no deadline failed {took:?} after the link went down: {status}"
        ));
        assert_eq!(status.code(), Code::Unavailable, "{what}: {status}");
        assert!(took <= DETECTION_BOUND, "{what}: took {took:?}");
    })
}

#[test]
#[ignore = "needs two hosts: `cargo xtask test` runs it in a pair of soft-RoCE VMs"]
fn the_servers_link_goes_down() {
    let peer = Peer::from_env();
    let (rdma_url, tcp_url) = peer.urls();
    // The baseline has librdmacm's context of the device that reaches the peer.
    warm_up(&rdma_url);
    let baseline = settled();
    let calling = Calling::start(&rdma_url, "server's link down");
    let silent = [
        (no_deadline_channel(&rdma_url), "rdma://"),
        (no_deadline_channel(&tcp_url), "tcp://"),
    ];
    let down = Instant::now();
    peer.set_link0("down");
    let silent: Vec<_> = silent
        .into_iter()
        .map(|(client, what)| silent_call(client, what, down))
        .collect();
    let outcomes = calling.finish(CONNECTIONS as u64);
    say(format!(
        "server's link down: the 64 connections' calls ended {:?} after it went down",
        down.elapsed()
    ));
    outcomes.report("server's link down");
    for call in silent {
        call.join().expect("the silent call's checks");
    }
    peer.set_link0("up");
    let tcp = new_connections_work(&tcp_url);
    say(format!("link back up: new tcp:// connections: {tcp:?}"));
    assert!(tcp.is_ok(), "tcp:// does not recover: {tcp:?}");
    let rdma = new_connections_work(&rdma_url);
    say(format!(
        "link back up: new rdma:// connections (soft-RoCE's connection manager): {rdma:?}"
    ));
    back_to(&baseline, "server's link down");
}
