//! The TLS socket against a rustls peer on loopback.

use std::io::Write;
use std::mem::MaybeUninit;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::Socket;
use crate::tls::{ClientTls, ServerTls, ALPN_RPC};

/// A server certificate for `localhost`, and the authority that signed it.
fn certificate() -> (ServerTls, ClientTls) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let server = ServerTls::from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes());
    let client = ClientTls::trusting_pem(ca.pem().as_bytes());
    (server.unwrap(), client.unwrap())
}

/// Completes a TLS handshake on a blocking socket.
fn handshake(session: &mut rustls::Connection, stream: &mut TcpStream) {
    while session.is_handshaking() {
        session.complete_io(stream).expect("TLS handshake");
    }
}

fn read(socket: &Socket, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); len];
    let n = socket.recv(&mut buf)?;
    let read = buf[..n].iter().map(|b| {
        // SAFETY: `recv` initialized the first `n` bytes.
        unsafe { b.assume_init() }
    });
    Ok(read.collect())
}

/// Plaintext decrypted in the read that then finds the connection reset is returned by
/// that read, and the reset by the next: a peer's last words before it reset the
/// connection (a server refusing at its limit) are not lost.
#[test]
fn plaintext_before_a_reset_is_read_before_the_reset() {
    let (server_tls, client_tls) = certificate();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_nodelay(true).unwrap();
        let mut session: rustls::Connection =
            rustls::ServerConnection::new(server_tls.config(ALPN_RPC))
                .unwrap()
                .into();
        handshake(&mut session, &mut stream);
        session.writer().write_all(b"last words").unwrap();
        while session.wants_write() {
            session.write_tls(&mut stream).unwrap();
        }
        // Sent before the reset (which drops what was not).
        std::thread::sleep(Duration::from_millis(50));
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
    });
    let mut stream = TcpStream::connect(addr).unwrap();
    let name = "localhost".try_into().unwrap();
    let mut session: rustls::Connection =
        rustls::ClientConnection::new(client_tls.config(ALPN_RPC), name)
            .unwrap()
            .into();
    handshake(&mut session, &mut stream);
    peer.join().unwrap();
    // The record and the reset are both in this side's kernel now.
    std::thread::sleep(Duration::from_millis(50));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    stream.set_nonblocking(true).unwrap();
    let socket = Socket::tls(tokio::net::TcpStream::from_std(stream).unwrap(), session);
    assert_eq!(
        read(&socket, 64).expect("the plaintext first"),
        b"last words"
    );
    assert!(socket.has_buffered(), "the reset waits for the next read");
    let reset = read(&socket, 64).unwrap_err();
    assert_eq!(reset.kind(), std::io::ErrorKind::ConnectionReset, "{reset}");
}
