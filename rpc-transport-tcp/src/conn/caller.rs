//! A blocking caller reads its answer itself: while it waits, and no other thread holds
//! the connection's reader, it blocks in `poll(2)` on the socket and hands up what comes,
//! instead of parking until the event loop has read the answer and woken it (one hand-off
//! between threads less per call: a blocking call's latency is then the socket's).

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rpc_core::stream::Wakes;
use rpc_core::Inbound;
use tokio::net::TcpStream;

use super::Conn;
use crate::reader::Turn;

/// Longest a blocking caller waits for the reader while another thread reads (the event
/// loop's task holds it for a read and a delivery at a time) before it parks instead.
const CALLER_READER_WAIT: Duration = Duration::from_micros(200);

thread_local! {
    /// A blocking caller's last look at a connection's deliveries: its serial, and the
    /// reader's count of deliveries when this thread last gave the reader back.
    static LAST_LOOK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

impl Conn {
    /// A blocking caller waiting for an answer reads the socket itself, unless another
    /// thread holds the reader: it blocks in `poll(2)` until bytes arrive, the connection
    /// ends, or `until` (at most `slice` from now, `TcpConfig::caller_reads`), and hands
    /// up every whole
    /// frame that came, whoever's call it answers. True if anything was handed up or the
    /// connection ended (the reader task reports that); false if the caller should park
    /// and be woken by the event loop.
    pub(crate) fn read_for_caller(
        &self,
        inbound: &dyn Inbound,
        until: Option<Instant>,
        slice: Duration,
    ) -> bool {
        let Some(mut reader) = self.reader.try_lock_for(CALLER_READER_WAIT) else {
            return false;
        };
        // Frames handed up by another thread since this one last looked may hold its
        // answer (it checked for it before taking the reader): it looks again first.
        let seen = (self.serial, reader.deliveries);
        if LAST_LOOK.replace(seen) != seen {
            drop(reader);
            self.reader_free.notify_waiters();
            return true;
        }
        let slice_end = Instant::now() + slice;
        let until = until.map_or(slice_end, |until| until.min(slice_end));
        let mut wakes = Wakes::new();
        let progressed = loop {
            if reader.ended.is_some() {
                break false;
            }
            match reader.deliver(inbound, &mut wakes, None, || true, &self.peer) {
                Turn::Drained { delivered: 0 } => {}
                Turn::End(status, abort) => {
                    reader.ended = Some((status, abort));
                    break true;
                }
                Turn::Drained { .. } | Turn::Yield | Turn::Full => break true,
            }
            if !wait_readable(&self.stream, until) {
                break false;
            }
            let read = reader.read(|buf| self.drain(buf));
            if let Some(end) = self.after_read(&reader, read) {
                reader.ended = Some(end);
                break true;
            }
        };
        LAST_LOOK.set((self.serial, reader.deliveries));
        drop(reader);
        wakes.wake_all();
        self.reader_free.notify_waiters();
        progressed
    }
}

impl Conn {
    /// A caller's read, which empties the socket, clears the event loop's readiness of it
    /// as the reader task's reads do, so that the task does not wake to read what this
    /// caller read, nor read the answer of this caller's next call before it does. If the
    /// event loop has not seen the bytes yet, a plain `recv` reads them (the task then
    /// wakes once for nothing).
    fn drain(&self, buf: &mut BytesMut) -> io::Result<usize> {
        self.read_clearing(buf).unwrap_or_else(|| self.recv(buf))
    }
}

/// Blocks in `poll(2)` until `stream` has bytes to read (or has ended or failed: a read
/// then says so), at most until `until`. False if `until` came first.
fn wait_readable(stream: &TcpStream, until: Instant) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let timeout = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(left.subsec_nanos() as i32),
        };
        // SAFETY: `fd` is one valid pollfd for the call, `timeout` a valid timespec, and a
        // null signal mask leaves the thread's as it is.
        let ready = unsafe { libc::ppoll(&mut fd, 1, &timeout, std::ptr::null()) };
        if ready > 0 {
            return true;
        }
        if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // Not a wait that can fail for this fd: let the read find out what is wrong.
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
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
        };
        let conn = Conn::new(
            stream,
            "tcp://test".into(),
            &ConnectionLimits::default(),
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
            assert!(wait_readable(&conn.stream, Instant::now() + LONG));
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
}
