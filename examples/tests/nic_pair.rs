//! Choosing the NIC between two hosts (run as `chaos_pair` is, which see), each with two
//! soft-RoCE devices, one on each of two links to the other, and the server listening on
//! every device: a client that names a device (`Nic::device`) or its address
//! (`Nic::source`) reaches the server through that device, its calls' packets leaving
//! through it and not through the other. A client that names the device of the other link
//! fails naming it and its address: rdma_cm looks the route up on the named device's link
//! only, where (no route there covering the peer's address) the kernel takes the peer to
//! be on the link; the peer answers ARP there for its address on the other link (or
//! sometimes not, and resolving the address times out), and its device on this one drops
//! RoCE packets to an address it does not hold, so the handshake times out.

// The chaos tests' shared helpers; this binary uses the pair's.
#[allow(dead_code)]
mod chaos_support;
mod common;

use std::sync::{Mutex, MutexGuard};

use chaos_support::pair::{Peer, Route};
use chaos_support::{lock, say};
use rdma_rpc::prelude::*;
use rdma_rpc::{Nic, RdmaConfig};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;

/// Calls made through each device; far more packets than the other device may send
/// meanwhile (it carries nothing of this test's).
const CALLS: u64 = 50;

/// One test at a time: one counts the packets each device sends, the other sends some.
static SERIAL: Mutex<()> = Mutex::new(());

/// Packets `device` (port 1) has sent, as soft-RoCE counts them.
fn sent_packets(device: &str) -> u64 {
    let path = format!("/sys/class/infiniband/{device}/ports/1/hw_counters/sent_pkts");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

fn connect(url: &str, nic: Nic) -> Result<EchoClient<Channel>, Status> {
    let channel = rdma_rpc::client()
        .rdma_config(RdmaConfig::default().nic(nic))
        .connect_blocking(url)
        .map_err(|e| Status::unavailable(e.to_string()))?;
    Ok(EchoClient::new(channel))
}

/// Connections tried when resolving the server's address times out: on the emulated link
/// the first resolution over it once took longer than the 5 s connect timeout (an ARP
/// exchange lost, presumably). Such an attempt sends no RoCE packet, so the counts stay
/// exact.
const RESOLVE_ATTEMPTS: u32 = 3;

/// [`connect`], tried again while resolving the address times out.
fn connect_resolving(url: &str, nic: &Nic) -> Result<EchoClient<Channel>, Status> {
    let mut attempt = 1;
    loop {
        match connect(url, nic.clone()) {
            Err(e) if e.message().contains("ADDR_RESOLVED") && attempt < RESOLVE_ATTEMPTS => {
                say(format!("{url} with {nic:?}, attempt {attempt}: {e}"));
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// Makes [`CALLS`] calls to `url` through `nic`, each echo checked; the packets each of
/// `routes`' devices sent meanwhile.
fn packets_of_calls(url: &str, nic: Nic, routes: &[Route]) -> Vec<u64> {
    let before: Vec<u64> = routes.iter().map(|r| sent_packets(&r.device)).collect();
    let client = connect_resolving(url, &nic).unwrap_or_else(|e| panic!("{url} with {nic:?}: {e}"));
    for seq in 0..CALLS {
        let payload = format!("call {seq} through {nic:?}");
        let reply = client
            .echo_blocking(EchoRequest {
                payload: payload.clone().into_bytes().into(),
                seq,
            })
            .unwrap_or_else(|e| panic!("call {seq} to {url}: {e}"))
            .into_inner();
        assert_eq!((reply.seq, &reply.payload[..]), (seq, payload.as_bytes()));
    }
    drop(client);
    routes
        .iter()
        .zip(before)
        .map(|(r, before)| sent_packets(&r.device) - before)
        .collect()
}

/// The routes to the peer (two at least), and this test's turn.
fn routes_one_test_at_a_time() -> (MutexGuard<'static, ()>, Vec<Route>) {
    let _peer = Peer::from_env();
    let serial = lock(&SERIAL);
    let routes = Peer::routes();
    assert!(routes.len() >= 2, "two links to the peer: {routes:?}");
    (serial, routes)
}

#[test]
#[ignore = "needs two hosts: `cargo xtask test` runs it in a pair of soft-RoCE VMs"]
fn each_device_reaches_the_server_through_itself() {
    let (_serial, routes) = routes_one_test_at_a_time();
    for link in &routes {
        let choices = [
            ("device", Nic::default().device(link.device.clone())),
            ("source address", Nic::default().source(link.local)),
        ];
        for (how, nic) in choices {
            let sent = packets_of_calls(&link.url(), nic, &routes);
            say(format!(
                "{how} of {} ({}): {CALLS} calls to {}; packets sent by {:?}: {sent:?}",
                link.device,
                link.local,
                link.url(),
                routes.iter().map(|r| &r.device).collect::<Vec<_>>()
            ));
            for (other, sent) in routes.iter().zip(sent) {
                if other.device == link.device {
                    assert!(sent >= CALLS, "{how} {}: only {sent} packets", link.device);
                } else {
                    assert!(
                        sent < CALLS,
                        "{how} {}: {sent} packets left through {}",
                        link.device,
                        other.device
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs two hosts: `cargo xtask test` runs it in a pair of soft-RoCE VMs"]
fn the_device_of_the_other_link_fails_naming_it() {
    let (_serial, routes) = routes_one_test_at_a_time();
    let (there, named) = (&routes[0], &routes[1]);
    let started = std::time::Instant::now();
    let result = connect(&there.url(), Nic::default().device(named.device.clone()))
        .and_then(|client| client.echo_blocking(EchoRequest::default()));
    say(format!(
        "{} named for {}, reached through {}: after {:?}: {result:?}",
        named.device,
        there.url(),
        there.device,
        started.elapsed()
    ));
    let status = result.expect_err("a call through a device the route does not take");
    // It times out resolving the address (no answer to ARP on the link) or in the
    // handshake (below); either way it names the device and its address.
    let message = status.message();
    assert!(
        message.contains(&named.device) && message.contains(&named.local.to_string()),
        "{status}"
    );
}
