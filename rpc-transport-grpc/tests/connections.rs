//! A server's connections as sockets see them: a peer that never sends HTTP/2's preface is
//! closed after the handshake timeout, and connections that ended leave nothing behind
//! (the dispatcher they served goes once the server does).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_transport_grpc::{GrpcServer, GrpcServerConfig};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn server(config: GrpcServerConfig) -> (GrpcServer, std::sync::Weak<rpc_core::server::Dispatcher>) {
    let dispatcher = rpc_core::Server::builder().build().unwrap();
    let weak = Arc::downgrade(&dispatcher);
    let server = GrpcServer::bind("127.0.0.1:0", dispatcher, config).unwrap();
    (server, weak)
}

/// How long until the server closes `socket` (reads until end of stream or an error).
fn closed_after(mut socket: TcpStream) -> Duration {
    let started = Instant::now();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                panic!("the server kept the connection 10 s")
            }
            Err(_) => return started.elapsed(),
        }
    }
}

#[test]
fn a_peer_without_the_preface_is_closed_after_the_handshake_timeout() {
    let (server, _) = server(GrpcServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..Default::default()
    });
    // Silent, and half a preface then silent: both wait for the timeout, then close.
    let started = Instant::now();
    let silent = TcpStream::connect(server.local_addr()).unwrap();
    let mut half = TcpStream::connect(server.local_addr()).unwrap();
    half.write_all(&PREFACE[..10]).unwrap();
    for socket in [silent, half] {
        closed_after(socket);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
            "closed after {waited:?}"
        );
    }
    // Something else than HTTP/2 is closed at once.
    let mut other = TcpStream::connect(server.local_addr()).unwrap();
    other
        .write_all(b"\x00\x00\x00\x20not http/2 at all")
        .unwrap();
    assert!(closed_after(other) < Duration::from_millis(250));
    // Forgotten once its task ended, which may be just after the peer saw the close.
    until_forgotten(&server);
}

/// Waits until `server` serves no connection (each is forgotten once its task ended).
fn until_forgotten(server: &GrpcServer) {
    let until = Instant::now() + Duration::from_secs(10);
    while server.connections() > 0 {
        assert!(
            Instant::now() < until,
            "{} connections left",
            server.connections()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn ended_connections_leave_nothing_behind() {
    let (mut server, dispatcher) = server(GrpcServerConfig::default());
    for _ in 0..3 {
        let mut socket = TcpStream::connect(server.local_addr()).unwrap();
        socket.write_all(PREFACE).unwrap();
        drop(socket);
    }
    until_forgotten(&server);
    server.shutdown(Duration::from_secs(1));
    drop(server);
    // The server's tasks are dropped with its runtime, in the background.
    let until = Instant::now() + Duration::from_secs(10);
    while dispatcher.upgrade().is_some() {
        assert!(
            Instant::now() < until,
            "the dispatcher outlived its server and connections"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
