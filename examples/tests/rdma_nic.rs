//! Choosing the NIC (`RdmaConfig::nic`) on real verbs (soft-RoCE VM): a client and a
//! server named by device reach each other through it, over IPv4 and IPv6; a source
//! address, a device, a port or a GID that cannot be used fails with its name, and so does
//! a server given a device and an address that is not on it.

mod common;

use std::net::IpAddr;

use rdma_rpc::prelude::*;
use rdma_rpc::{Nic, RdmaConfig, ServeOptions, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::EchoService;
use rpc_transport_rdma::verbs::test_support::{require_device, test_addr, test_addr6};

fn device() -> String {
    require_device().expect("an RDMA device").name
}

fn server_on(url: &str, nic: Nic) -> Result<ServerHandle, rdma_rpc::Error> {
    Server::builder()
        .add_service(EchoServer::new(EchoService))
        .start_with(
            url,
            ServeOptions {
                rdma: RdmaConfig::default().nic(nic),
                ..Default::default()
            },
        )
}

fn connect(url: &str, nic: Nic) -> Result<EchoClient, Status> {
    let channel = rdma_rpc::client()
        .rdma_config(RdmaConfig::default().nic(nic))
        .connect_blocking(url)
        .map_err(|e| Status::unavailable(e.to_string()))?;
    Ok(EchoClient::new(channel))
}

fn echoes(client: &EchoClient) {
    let reply = client
        .echo_blocking(rpc_examples::echo::EchoRequest {
            payload: b"through the named NIC".to_vec().into(),
            seq: 3,
        })
        .expect("echo")
        .into_inner();
    assert_eq!(reply.seq, 3);
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

fn url(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("rdma://{v4}:{port}"),
        IpAddr::V6(v6) => format!("rdma://[{v6}]:{port}"),
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_device_named_on_both_ends_carries_calls_over_ipv4_and_ipv6() {
    let name = device();
    for (listen, address) in [
        ("rdma://0.0.0.0:0", test_addr()),
        ("rdma://[::]:0", test_addr6()),
    ] {
        // A server on every address of the named device listens on the device's address.
        let server = server_on(listen, Nic::default().device(&name)).expect("server starts");
        assert_eq!(
            server.local_url(),
            url(address, port_of(server.local_url()))
        );
        let client = connect(server.local_url(), Nic::default().device(&name)).expect("connects");
        echoes(&client);
        // The same through the device's address as the source.
        let client = connect(server.local_url(), Nic::default().source(address)).expect("connects");
        echoes(&client);
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_device_port_or_gid_that_cannot_be_used_is_named() {
    let name = device();
    let server = server_on(&url(test_addr(), 0), Nic::default()).expect("server starts");
    let target = server.local_url();
    let missing = connect(target, Nic::default().device("mlx5_9")).unwrap_err();
    let message = missing.message();
    assert!(message.contains("no RDMA device mlx5_9"), "{message}");
    assert!(
        message.contains(&format!("devices here: {name}")),
        "{message}"
    );
    assert!(message.contains(target), "{message}");

    let no_port = Nic::default().device(&name).port(7);
    let message = connect(target, no_port).unwrap_err().to_string();
    assert!(
        message.contains(&format!("device {name} has no port 7")),
        "{message}"
    );

    let no_gid = Nic::default().device(&name).gid_index(100_000);
    let message = connect(target, no_gid).unwrap_err().to_string();
    assert!(message.contains("GID 100000"), "{message}");
    assert!(message.contains("no usable address"), "{message}");

    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let message = connect(target, Nic::default().source(loopback))
        .unwrap_err()
        .to_string();
    assert!(message.contains("from 127.0.0.1"), "{message}");
    assert!(message.contains("address of an RDMA device"), "{message}");

    let refused = server_on("rdma://0.0.0.0:0", Nic::default().device("mlx5_9")).unwrap_err();
    assert!(
        refused.to_string().contains("no RDMA device mlx5_9"),
        "{refused}"
    );
    let off_device = server_on("rdma://127.0.0.1:0", Nic::default().device(&name)).unwrap_err();
    let message = off_device.to_string();
    assert!(
        message.contains("127.0.0.1 is not an address of an RDMA device"),
        "{message}"
    );
    // The server on the right device still answers.
    echoes(&connect(target, Nic::default().device(&name)).expect("connects"));
}
