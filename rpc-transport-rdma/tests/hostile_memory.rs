//! A peer cannot make the server touch memory beyond what the protocol lets it name: a
//! request body offered for reading with a forged rkey, past its region, deregistered, or
//! from a peer that vanishes mid-READ ends only that peer's connection; buffers it asks
//! for and never fills are refused or taken back. Nothing stays registered. A server that
//! reads offers after their notice answers one cancelled before it, and bounds those
//! waiting for it.
//! Ignored by a plain `cargo test` (it needs a device); `cargo xtask test` runs it in the
//! soft-RoCE VM with `--include-ignored`.

mod common;

use std::time::{Duration, Instant};

use common::hostile::{
    ask_buffer, call_succeeds_as_unimplemented, init_tracing, placed, serve, serve_with, vm_pin,
    well_behaved_client, HostilePeer, LIMIT,
};
use rpc_core::{Code, FrameKind, Header};
use rpc_transport_rdma::verbs::{AccessFlags, MemoryRegion};
use rpc_transport_rdma::{LargeBodies, RdmaConfig};

/// Offers call 7's request body of `len` bytes at `addr` (`rkey`) for the server to READ,
/// and sends its notice right behind, as a client does.
fn offer(peer: &HostilePeer, addr: u64, rkey: u32, len: u64) {
    offer_alone(peer, addr, rkey, len);
    peer.send(&placed(7, len as u32).to_bytes());
}

/// Offers call 7's request body as [`offer`] does, without the notice.
fn offer_alone(peer: &HostilePeer, addr: u64, rkey: u32, len: u64) {
    offer_call(peer, 7, addr, rkey, len);
}

/// Offers the request body of `call_id`, without its notice.
fn offer_call(peer: &HostilePeer, call_id: u64, addr: u64, rkey: u32, len: u64) {
    let mut source = Header::new(FrameKind::LargeSource, call_id);
    source.remote = rpc_core::RemoteBuffer {
        addr,
        rkey,
        generation: 1,
        len,
    };
    peer.send(&source.to_bytes());
}

/// `len` bytes of `peer`'s memory the server may read.
fn readable(peer: &HostilePeer, len: usize) -> MemoryRegion {
    MemoryRegion::alloc(peer.qp.pd(), len, AccessFlags::REMOTE_READ).expect("readable region")
}

/// Request bodies offered for reading: the server reads an honest one and answers; a
/// forged rkey, a range past the region, a region deregistered before the READ, and a
/// peer that vanishes mid-READ end only the offender's connection, and leave nothing
/// registered behind.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn offered_bodies_the_server_cannot_read_end_only_the_offender() {
    init_tracing();
    let Some(server) = serve(RdmaConfig::default()) else {
        return;
    };
    let addr = server.local_addr();
    let channel = well_behaved_client(addr);

    // Honest: read, answered, then the call's status.
    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    offer(&peer, body.addr(), body.rkey(), 100_000);
    let done = peer.receive();
    assert_eq!(
        (done.kind, done.call_id, done.status),
        (FrameKind::LargeSourceDone, 7, Code::Ok)
    );
    let answer = peer.receive();
    assert_eq!(
        (answer.kind, answer.call_id, answer.status),
        (FrameKind::Response, 7, Code::Unimplemented)
    );
    drop(peer);
    drop(body);
    eprintln!("an honest offer: read, answered");

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    offer(&peer, body.addr(), body.rkey() ^ 0x5a5a_0000, 100_000);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("an offer with a forged rkey: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    offer(&peer, body.addr() + (1 << 20), body.rkey(), 100_000);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("an offer past its region: offender disconnected, other client fine");

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    let (gone_addr, gone_rkey) = (body.addr(), body.rkey());
    drop(body);
    offer(&peer, gone_addr, gone_rkey, 100_000);
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("an offer of a region deregistered first: offender disconnected, other client fine");

    // The in-memory verbs provider pins nothing and completes a READ as it is posted: a
    // READ under way, and the memory it holds, need a device.
    if cfg!(verbs_fabric) {
        return;
    }
    // Vanishes while the server reads the largest body it takes: its queue pair is
    // destroyed at once, and then its connection.
    let len = rpc_core::client::DEFAULT_MAX_MESSAGE_SIZE;
    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, len);
    let before = vm_pin();
    offer(&peer, body.addr(), body.rkey(), len as u64);
    // The server leased a buffer as large: it is reading.
    let deadline = Instant::now() + LIMIT;
    while vm_pin().saturating_sub(before) < len as u64 {
        assert!(
            Instant::now() < deadline,
            "the server never leased a buffer to read into"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (channel_left, id) = peer.lose_queue_pair();
    drop(body);
    drop(id);
    drop(channel_left);
    call_succeeds_as_unimplemented(&channel);
    // The peer's body and the server's lease are both gone.
    let deadline = Instant::now() + LIMIT;
    loop {
        let now = vm_pin();
        if now + len as u64 <= before {
            eprintln!(
                "a peer gone mid-READ: other client fine, VmPin {} KiB below the offer's start",
                (before - now) / 1024
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "VmPin {now} bytes, {before} before the offer of {len}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A peer asks for buffers of 1 GiB from a server whose messages are limited to 4 MiB: both
/// are refused, naming the limit, and nothing is registered. Then it asks for a buffer it
/// never writes, or offers a body it never announces: the server closes the connection
/// once the grant timeout passes (after the body is read, for the offer).
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_peer_cannot_make_the_server_register_memory_it_does_not_fill() {
    let limit =
        rpc_core::client::DEFAULT_MAX_MESSAGE_SIZE as u64 + rpc_core::MAX_METADATA_LEN as u64;
    let grant_timeout = Duration::from_secs(1);
    let config = RdmaConfig::default().large(LargeBodies::default().grant_timeout(grant_timeout));
    let Some(server) = serve(config) else {
        return;
    };
    let peer = HostilePeer::connect(server.local_addr());
    let pinned = vm_pin();
    for call_id in [7, 8] {
        let answer = ask_buffer(&peer, call_id, 1 << 30);
        assert_eq!(
            (answer.status, answer.remote.len, answer.remote.rkey),
            (Code::ResourceExhausted, limit, 0),
            "a 1 GiB buffer is refused, naming the server's limit"
        );
    }
    let grown = vm_pin().saturating_sub(pinned);
    eprintln!(
        "two 1 GiB buffer requests refused (limit {limit} bytes); VmPin grew by {grown} bytes"
    );
    assert!(grown < 1 << 20, "VmPin grew by {grown} bytes");

    let grant = ask_buffer(&peer, 9, 1 << 20);
    assert_eq!(grant.status, Code::Ok);
    let started = Instant::now();
    peer.expect_disconnected();
    let held = started.elapsed();
    eprintln!("a grant of 1 MiB never written: disconnected after {held:?}");
    assert!(held >= grant_timeout, "disconnected after {held:?}");

    let peer = HostilePeer::connect(server.local_addr());
    let body = readable(&peer, 1 << 20);
    offer_alone(&peer, body.addr(), body.rkey(), 1 << 20);
    let done = peer.receive();
    assert_eq!(
        (done.kind, done.call_id, done.status),
        (FrameKind::LargeSourceDone, 7, Code::Ok),
        "the body is read"
    );
    let started = Instant::now();
    peer.expect_disconnected();
    let held = started.elapsed();
    eprintln!("a body of 1 MiB read and never announced: disconnected after {held:?}");
    assert!(held >= grant_timeout, "disconnected after {held:?}");
}

/// A server with landings for one method reads an offered body only once its notice names
/// the method. An offer cancelled before its notice is answered `CANCELLED`, and its peer
/// goes on; more offers waiting for their notice than `max_queued` end only the offender's
/// connection.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn offers_waiting_for_their_notice_are_answered_and_bounded() {
    let landing = rpc_core::Landing::new(
        rpc_transport_rdma::RegisteredBuffer::new(1 << 20).expect("a registered buffer"),
    );
    let builder = rpc_core::Server::builder().land_method_requests_in("/a.B/C", [landing]);
    let config = RdmaConfig::default().large(LargeBodies::default().max_queued(2));
    let Some(server) = serve_with(builder, config) else {
        return;
    };
    let addr = server.local_addr();
    let channel = well_behaved_client(addr);

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    offer_alone(&peer, body.addr(), body.rkey(), 100_000);
    // A Cancel goes in the compact form: exactly its encoded bytes.
    let mut cancel = [0u8; 64];
    let len = Header::new(FrameKind::Cancel, 7).encode(&mut cancel);
    peer.send(&cancel[..len]);
    let done = peer.receive();
    assert_eq!(
        (done.kind, done.call_id, done.status),
        (FrameKind::LargeSourceDone, 7, Code::Cancelled)
    );
    // The same peer's next request, offered and announced, is read and answered.
    offer_call(&peer, 8, body.addr(), body.rkey(), 100_000);
    peer.send(&placed(8, 100_000).to_bytes());
    let done = peer.receive();
    assert_eq!((done.kind, done.call_id), (FrameKind::LargeSourceDone, 8));
    assert_eq!(peer.receive().status, Code::Unimplemented);
    drop(peer);
    eprintln!("an offer cancelled before its notice: answered CANCELLED, the peer goes on");

    let peer = HostilePeer::connect(addr);
    let body = readable(&peer, 100_000);
    for call_id in 1..=3 {
        offer_call(&peer, call_id, body.addr(), body.rkey(), 100_000);
    }
    peer.expect_disconnected();
    call_succeeds_as_unimplemented(&channel);
    eprintln!("three offers without their notice (max_queued 2): offender disconnected");
}
