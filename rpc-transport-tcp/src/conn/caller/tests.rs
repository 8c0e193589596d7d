//! The caller's read against a real socket, with and without the reader task.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rpc_core::body::RawBody;
use rpc_core::frame::OutgoingFrame;
use rpc_core::{FrameKind, Header, MetadataMap};

use super::*;
use crate::codec::FrameWriter;
use crate::config::ConnectionLimits;
use crate::conn::ReadPolicy;
use crate::reader::tests::Recorder;

const LONG: Duration = Duration::from_secs(5);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A client connection with no reader task (nothing reads but the caller), and the
/// server's end of its socket.
fn connection(runtime: &tokio::runtime::Runtime) -> (Arc<Conn>, std::net::TcpStream) {
    connection_with(runtime, &ConnectionLimits::default())
}

fn connection_with(
    runtime: &tokio::runtime::Runtime,
    limits: &ConnectionLimits,
) -> (Arc<Conn>, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    client.set_nonblocking(true).expect("nonblocking");
    let _entered = runtime.enter();
    let stream = TcpStream::from_std(client).expect("register");
    let policy = ReadPolicy {
        max_payload: 1024,
        idle_timeout: None,
        pause_when_full: false,
        caller_reads: true,
    };
    let conn = Conn::new(
        crate::socket::Socket::plain(stream),
        "tcp://test".into(),
        limits,
        policy,
    );
    (conn.expect("conn"), server)
}

fn answer(server: &mut std::net::TcpStream, call_id: u64) {
    let metadata = MetadataMap::new();
    let body = RawBody(b"answer");
    let header = Header::new(FrameKind::Response, call_id);
    let frame = OutgoingFrame::new(header, &metadata, &body).expect("frame");
    FrameWriter::new(&mut *server).write(&frame).expect("write");
    server.flush().expect("flush");
}

fn calls(recorder: &Recorder) -> Vec<u64> {
    recorder.0.lock().iter().map(|(call, _)| *call).collect()
}

/// With no event loop reading, a blocking caller waits in the socket itself and hands
/// up the answer that arrives: nobody has to read it for the caller and wake it.
#[test]
fn a_blocking_caller_reads_and_hands_up_its_answer_itself() {
    let runtime = runtime();
    let (conn, mut server) = connection(&runtime);
    let recorder = Recorder::default();
    // The first look at a connection on a thread only says to look at the calls again.
    assert!(conn.read_for_caller(&recorder, None, LONG));
    let answering = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        answer(&mut server, 7);
        server
    });
    let started = Instant::now();
    assert!(conn.read_for_caller(&recorder, None, LONG));
    assert!(
        started.elapsed() < LONG,
        "woken by the answer, not the slice"
    );
    assert_eq!(calls(&recorder), [7]);
    drop(answering.join());
}

/// An answer handed up by another thread (the event loop) after the caller last looked
/// at the calls, and before it took the reader, makes the caller look again at once
/// instead of waiting in the socket for an answer that already came.
#[test]
fn answers_another_thread_handed_up_send_the_caller_back_to_its_calls() {
    let runtime = runtime();
    let (conn, mut server) = connection(&runtime);
    let recorder = Recorder::default();
    conn.read_for_caller(&recorder, None, LONG);
    // The event loop's turn: it reads and hands up an answer.
    answer(&mut server, 8);
    {
        let mut reader = conn.reader.lock();
        assert!(wait_readable(&conn.socket.tcp, Instant::now() + LONG));
        reader.read(|buf| conn.recv(buf)).expect("read");
        let mut wakes = Wakes::new();
        let turn = reader.deliver(&recorder, &mut wakes, None, || true, "tcp://test");
        assert!(matches!(turn, Turn::Drained { delivered: 1 }), "{turn:?}");
    }
    let started = Instant::now();
    assert!(conn.read_for_caller(&recorder, None, LONG));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "looked again at once"
    );
    // Now up to date: with nothing arriving it waits its slice out, and parks.
    let slice = Duration::from_millis(100);
    let started = Instant::now();
    assert!(!conn.read_for_caller(&recorder, None, slice));
    assert!(started.elapsed() >= slice);
    assert_eq!(calls(&recorder), [8]);
}

/// A caller waits no longer than its call's deadline, however long its slice.
#[test]
fn a_caller_waits_no_longer_than_its_deadline() {
    let runtime = runtime();
    let (conn, _server) = connection(&runtime);
    let recorder = Recorder::default();
    conn.read_for_caller(&recorder, None, LONG);
    let deadline = Duration::from_millis(50);
    let started = Instant::now();
    assert!(!conn.read_for_caller(&recorder, Some(started + deadline), LONG));
    let waited = started.elapsed();
    assert!(
        waited >= deadline && waited < Duration::from_secs(1),
        "{waited:?}"
    );
}

/// A peer that closes ends the caller's wait at once; the reader keeps why, for the
/// event loop's task to close the connection with, and later callers park.
#[test]
fn a_closing_peer_ends_the_wait_and_leaves_the_close_to_the_reader_task() {
    let runtime = runtime();
    let (conn, server) = connection(&runtime);
    let recorder = Recorder::default();
    conn.read_for_caller(&recorder, None, LONG);
    drop(server);
    let started = Instant::now();
    assert!(conn.read_for_caller(&recorder, None, LONG));
    assert!(started.elapsed() < Duration::from_secs(1));
    let ended = conn.reader.lock().ended.clone().expect("the end is kept");
    assert!(
        ended.0.message().contains("closed the connection"),
        "{:?}",
        ended.0
    );
    assert!(
        !conn.read_for_caller(&recorder, None, LONG),
        "nothing more to read"
    );
}

/// The reader task waits for the socket; then bytes arrive and a caller reads them before
/// the task runs, clearing the event loop's readiness (the runtime's driver saw the bytes,
/// the task was not polled yet: a current-thread runtime polls the `block_on` future
/// first). Whatever the caller found is then the task's to act on, though the socket stays
/// quiet. Returns the connection once the task closed it.
fn caller_reads_first(bytes: &[u8], limits: &ConnectionLimits, slice: Duration) -> Arc<Conn> {
    let runtime = runtime();
    let (conn, mut server) = connection_with(&runtime, limits);
    let recorder = Arc::new(Recorder::default());
    conn.start(runtime.handle(), recorder.clone());
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
    conn.read_for_caller(&*recorder, None, LONG);
    server.write_all(bytes).expect("write");
    runtime
        .block_on(conn.socket.tcp.readable())
        .expect("readable");
    conn.read_for_caller(&*recorder, None, slice);
    let ended = runtime.block_on(async {
        tokio::time::timeout(LONG, async {
            while !conn.ended.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    });
    assert!(ended.is_ok(), "the reader task closed the connection");
    drop(server);
    conn
}

/// Garbage a caller read ends the connection: the reader task closes it (resetting it, as
/// it would had it read the garbage itself), though the socket has nothing more to say.
#[test]
fn an_end_a_caller_found_is_reported_though_the_socket_stays_quiet() {
    let conn = caller_reads_first(&[0xff; 64], &ConnectionLimits::default(), LONG);
    let status = conn.outbox.closed().expect("closed");
    assert!(status.message().contains("sent garbage"), "{status:?}");
}

/// Half a frame a caller read is timed by the reader task: the peer that sends no more is
/// reset after the read timeout, though the caller, not the task, saw the frame begin.
#[test]
fn a_frame_a_caller_began_is_held_to_the_read_timeout() {
    let metadata = MetadataMap::new();
    let body = RawBody(b"half of this frame arrives");
    let frame = OutgoingFrame::new(Header::new(FrameKind::Response, 3), &metadata, &body);
    let mut wire = Vec::new();
    FrameWriter::new(&mut wire)
        .write(&frame.expect("frame"))
        .expect("encode");
    let limits = ConnectionLimits {
        read_timeout: Duration::from_millis(200),
        ..ConnectionLimits::default()
    };
    let started = Instant::now();
    let conn = caller_reads_first(&wire[..wire.len() / 2], &limits, Duration::from_millis(50));
    assert!(started.elapsed() >= limits.read_timeout);
    let status = conn.outbox.closed().expect("closed");
    assert!(status.message().contains("read timeout"), "{status:?}");
}
