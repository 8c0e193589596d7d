//! Chaos on real verbs (run in the soft-RoCE VM by `cargo xtask test`; a plain `cargo test`
//! ignores them): 64 connections making calls while the server is killed (`kill -9`) and
//! while 1,000 peers connect and vanish (the link going down is `chaos_link`). After each,
//! every call has ended with a clear status within its deadline or the keepalive time, and
//! the device's resources (`rdma resource`) and this process's pinned memory are back to
//! their baseline. The figures are printed.

mod chaos_support;
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chaos_support::*;
use rpc_transport_rdma::verbs::test_support::require_device;

/// `kill -9`: the process gets no chance to say goodbye.
fn kill_9(child: &mut Child) {
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_server_killed_under_64_connections() {
    require_device().expect("an RDMA device");
    let _serial = lock(&SERIAL);
    let baseline = baseline();
    let (mut server, url) = server_process(Stdio::inherit()).expect("echo-server");
    let calling = Calling::start(&url, "server killed");
    let killed = Instant::now();
    kill_9(&mut server);
    let outcomes = calling.finish(CONNECTIONS as u64);
    let ended = killed.elapsed();
    outcomes.report("server killed");
    say(format!(
        "server killed: every call ended {ended:?} after the kill"
    ));
    assert!(ended <= BOUND, "{ended:?}");
    assert_eq!(
        lock(&outcomes.failed).values().sum::<u64>(),
        CONNECTIONS as u64,
        "each connection's last call failed"
    );
    back_to(&baseline, "server killed");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_thousand_peers_connect_and_vanish_under_64_connections() {
    require_device().expect("an RDMA device");
    let _serial = lock(&SERIAL);
    let baseline = baseline();
    let server = echo_server();
    let url = server.local_url().to_owned();
    let calling = Calling::start(&url, "peers vanish");
    // Peers in processes of their own that connect, call, and are killed wherever they
    // are: before, during or after connecting, in the middle of a call.
    const PEERS: usize = 1000;
    const AT_ONCE: usize = 8;
    let started = Instant::now();
    let mut peers: Vec<Child> = Vec::new();
    for i in 0..PEERS {
        let peer = Command::new(env!("CARGO_BIN_EXE_echo-client"))
            .args([url.as_str(), "--count", "1000000", "--size", "3000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("echo-client starts");
        peers.push(peer);
        if peers.len() == AT_ONCE {
            std::thread::sleep(Duration::from_millis((i % 7) as u64 * 5));
            peers.iter_mut().for_each(kill_9);
            peers.clear();
        }
    }
    peers.iter_mut().for_each(kill_9);
    say(format!(
        "{PEERS} peers connected and vanished in {:?}",
        started.elapsed()
    ));
    let outcomes = calling.finish(0);
    outcomes.report("peers vanished");
    assert!(
        lock(&outcomes.failed).is_empty(),
        "the 64 connections never noticed: {:?}",
        lock(&outcomes.failed)
    );
    server.shutdown_blocking(Duration::from_secs(1));
    back_to(&baseline, "peers vanished");
}
