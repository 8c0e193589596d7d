//! One TCP connection on the event loop: its socket, its output queue, and the two tasks
//! that drive them. Clients and servers differ only in what they do with received frames
//! (their [`Inbound`]).

use std::future::{poll_fn, Future};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::{Mutex, MutexGuard};
use std::task::{Context, Poll};

use rpc_core::frame::OutgoingFrame;
use rpc_core::server::{ReplySink, ServedLink};
use rpc_core::stream::Wakes;
use rpc_core::{Inbound, Status};
use tokio::io::Interest;
use tokio::sync::Notify;
use tokio::time::{timeout, Instant};

use crate::config::{ConnectionLimits, KEEPALIVE_PROBES};
use crate::deadline::ReadDeadline;
use crate::outbox::{Chunk, Outbox};
use crate::reader::{Reader, Turn, FRAMES_PER_TURN};
use crate::socket::Socket;

mod caller;

/// The next connection's serial (0: none).
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// A connection shared by its tasks and the transport that sends on it.
pub(crate) struct Conn {
    pub(crate) socket: Socket,
    pub(crate) outbox: Outbox,
    /// `tcp://host:port` of the other end, for messages.
    pub(crate) peer: String,
    limits: ConnectionLimits,
    policy: ReadPolicy,
    /// What is read and not yet handed up; its holder reads the socket (see `reader.rs`).
    reader: Mutex<Reader>,
    /// A blocking caller gave the reader back: the reader task may take it.
    reader_free: Notify,
    /// A blocking caller left the reader ended, or with a frame begun: the reader task,
    /// waiting for the socket, has to report the end or time the frame.
    reader_changed: Notify,
    /// Its reader ended and told its inbound side.
    ended: AtomicBool,
    /// Names the connection in a caller's `LAST_LOOK`, unique in the process.
    serial: u64,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.peer)
            .field("outbox", &self.outbox)
            .finish_non_exhaustive()
    }
}

/// A server's graceful shutdown half-closes the connection once its answers are written;
/// the connection has flushed them when it ended (the client closed its side in turn).
impl ServedLink for Conn {
    fn flushed(&self) -> bool {
        self.close_when_flushed();
        self.ended.load(Ordering::Acquire)
    }

    fn close(&self, status: Status) {
        Conn::close(self, status);
    }
}

/// The connection is where a server's answers go: the same output queue its client side
/// sends requests through.
impl ReplySink for Conn {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.outbox.push_blocking(&self.socket, frame)
    }

    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.outbox.poll_push(cx, &self.socket, frame)
    }

    fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.outbox.poll_push_more(cx, &self.socket, frame)
    }

    fn flush(&self) {
        self.outbox.flush(&self.socket);
    }

    fn stage_limit(&self) -> Option<usize> {
        Some(rpc_core::stream::STAGE_LIMIT)
    }

    fn poll_send_encoded(
        &self,
        cx: &mut Context<'_>,
        encoded: &mut BytesMut,
    ) -> Poll<Result<(), Status>> {
        self.outbox.poll_push_encoded(cx, &self.socket, encoded)
    }
}

/// How the reader treats a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadPolicy {
    /// Largest payload accepted.
    pub(crate) max_payload: usize,
    /// Close a silent connection with no call in progress after this long.
    pub(crate) idle_timeout: Option<Duration>,
    /// Stop reading while the output queue is full (servers: no new requests while their
    /// replies cannot leave).
    pub(crate) pause_when_full: bool,
    /// Blocking callers may read the socket too (clients with `TcpConfig::caller_reads`):
    /// the reader task then also listens for what their reads leave it to do.
    pub(crate) caller_reads: bool,
}

impl Conn {
    /// Wraps a connected socket registered with the event loop, read as `policy` says.
    pub(crate) fn new(
        socket: Socket,
        peer: String,
        limits: &ConnectionLimits,
        policy: ReadPolicy,
    ) -> io::Result<Arc<Conn>> {
        socket.tcp.set_nodelay(true)?;
        keep_alive(&socket.tcp, limits)?;
        Ok(Arc::new(Conn {
            socket,
            outbox: Outbox::new(limits.write_queue),
            peer,
            limits: limits.clone(),
            policy,
            reader: Mutex::new(Reader::new(policy.max_payload)),
            reader_free: Notify::new(),
            reader_changed: Notify::new(),
            ended: AtomicBool::new(false),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
        }))
    }

    /// Bytes read from the socket before the connection was made (during a handshake): the
    /// start of the first frame, handed up with what follows it.
    pub(crate) fn prime(&self, first: &[u8]) {
        self.reader.lock().prime(first);
    }

    /// Starts the connection's reader and writer on `runtime`.
    pub(crate) fn start(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        inbound: Arc<dyn Inbound>,
    ) {
        runtime.spawn(self.clone().write_loop());
        runtime.spawn(self.clone().read_loop(inbound));
    }

    /// Closes the connection at once: queued frames are dropped, both tasks end, every
    /// later send fails with `status` (the first close's status sticks).
    pub(crate) fn close(&self, status: Status) {
        self.outbox.close(status);
        // Wakes the reader (end of stream) as well.
        self.socket.shutdown();
    }

    /// Closes the connection with a reset (a peer that broke a limit): what either side
    /// still has queued is discarded, by the kernel too, instead of lingering for a peer
    /// that does not read.
    pub(crate) fn abort(&self, status: Status) {
        let _ = socket2::SockRef::from(&self.socket.tcp).set_linger(Some(Duration::ZERO));
        self.close(status);
    }

    /// Closes the connection once its queued frames are written: then the write side is
    /// shut (the peer reads every answer, then end of stream) while the reader keeps reading
    /// and discarding until the peer closes its side.
    pub(crate) fn close_when_flushed(&self) {
        let status = Status::unavailable(format!("{} closed: the server shut down", self.peer));
        if self.outbox.finish(status) {
            self.shutdown_write();
        }
    }

    fn shutdown_write(&self) {
        self.socket.shutdown_write();
    }

    async fn write_loop(self: Arc<Self>) {
        loop {
            match self.outbox.next_chunk(&self.socket) {
                Chunk::Write(chunk) => {
                    let mut at = 0;
                    while at < chunk.len() {
                        match self.write_some(&chunk[at..]).await {
                            Ok(n) => {
                                at += n;
                                self.outbox.wrote(n);
                            }
                            Err(status) => return self.abort(status),
                        }
                    }
                }
                Chunk::Flush => {
                    if let Err(status) = self.write_some(&[]).await {
                        return self.abort(status);
                    }
                }
                Chunk::Idle => self.outbox.writer_wakeup().await,
                Chunk::Finished => return self.shutdown_write(),
                Chunk::Closed => return,
            }
        }
    }

    /// Writes some of `bytes` (with none, the TLS records waiting in the session), waiting
    /// at most the stall limit for the socket to take any.
    async fn write_some(&self, bytes: &[u8]) -> Result<usize, Status> {
        let broken = |e| Status::unavailable(format!("cannot send to {}: {e}", self.peer));
        loop {
            match self.socket.try_write(bytes) {
                Ok(n) => {
                    if let Some(metrics) = crate::metrics::tcp() {
                        metrics.sent.increment(n as u64);
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(broken(e)),
            }
            match timeout(self.limits.stall_limit, self.socket.tcp.writable()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(broken(e)),
                Err(_) => {
                    return Err(Status::unavailable(format!(
                        "{} stopped reading: its socket took none of {} queued bytes in {:?} \
                         (stall limit)",
                        self.peer,
                        bytes.len(),
                        self.limits.stall_limit
                    )))
                }
            }
        }
    }

    /// Reads what the socket holds into `buf`'s spare capacity. A short read means the
    /// socket was drained, so its readiness is cleared right away: the next wait goes
    /// straight to the event loop instead of costing one more `recv` that would find nothing.
    fn read_some(&self, buf: &mut BytesMut) -> io::Result<usize> {
        self.read_clearing(buf)
            .unwrap_or_else(|| Err(io::ErrorKind::WouldBlock.into()))
    }

    /// [`Conn::read_some`]; `None` if the event loop has not seen the socket readable
    /// (nothing was read, nothing cleared).
    fn read_clearing(&self, buf: &mut BytesMut) -> Option<io::Result<usize>> {
        if self.socket.has_buffered() {
            // TLS plaintext read from the socket earlier: no readiness to look at.
            return Some(self.recv(buf));
        }
        let mut short = None;
        let mut tried = false;
        let read = self.socket.tcp.try_io(Interest::READABLE, || {
            tried = true;
            let n = self.recv(buf)?;
            if n > 0 && buf.len() < buf.capacity() {
                // tokio clears readiness only as of the event it saw before this recv, so
                // data arriving after it still wakes the reader.
                short = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match (read, short) {
            _ if !tried => None,
            (_, Some(n)) => Some(Ok(n)),
            (read, None) => Some(read),
        }
    }

    /// One `recv` into `buf`'s spare capacity, whatever the event loop knows of the
    /// socket's readiness.
    fn recv(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let spare = buf.spare_capacity_mut();
        let n = self.socket.recv(spare)?;
        if let Some(metrics) = crate::metrics::tcp() {
            metrics.received.increment(n as u64);
        }
        // SAFETY: recv initialized the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    fn failed(&self, e: io::Error) -> (Status, bool) {
        let message = if e.kind() == io::ErrorKind::TimedOut {
            format!(
                "{} acknowledged neither keepalive probes nor data for {:?} ({e}): the peer \
                 is unreachable or dead",
                self.peer, self.limits.keepalive_timeout
            )
        } else {
            format!("{} failed: {e}", self.peer)
        };
        (Status::unavailable(message), false)
    }

    /// What a read that returned `read` means for the connection: `Some` once it is over.
    fn after_read(&self, reader: &Reader, read: io::Result<usize>) -> Option<(Status, bool)> {
        match read {
            Ok(0) => Some((reader.end_of_stream(&self.peer), false)),
            Ok(_) => None,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => Some(self.failed(e)),
        }
    }

    async fn read_loop(self: Arc<Self>, inbound: Arc<dyn Inbound>) {
        let (status, abort) = self.read_frames(&*inbound).await;
        // A close by this side already set the status the senders see; keep it.
        let status = self.outbox.closed().unwrap_or(status);
        if abort {
            self.abort(status.clone());
        } else {
            self.close(status.clone());
        }
        inbound.on_closed(status);
        self.ended.store(true, Ordering::Release);
    }

    /// When the reader task stops waiting for bytes: a frame begun must be complete within
    /// the read timeout, and a connection with an idle timeout must hear something within it.
    fn deadline(&self, reader: &Reader) -> Option<Instant> {
        match reader.frame_started {
            Some(started) => Some(started + self.limits.read_timeout),
            None => self
                .policy
                .idle_timeout
                .map(|idle| reader.last_heard + idle),
        }
    }

    /// Waits until the socket is readable (`Some`), or until a caller's read left the
    /// reader in a state the task must act on (`None`): it found the connection ended, or
    /// it left a frame begun, whose read timeout the task enforces.
    async fn readable_or_changed(&self) -> Option<io::Result<()>> {
        if self.socket.has_buffered() {
            return Some(Ok(()));
        }
        if !self.policy.caller_reads {
            return Some(self.socket.tcp.readable().await);
        }
        let mut readable = std::pin::pin!(self.socket.tcp.readable());
        let mut changed = std::pin::pin!(self.reader_changed.notified());
        poll_fn(|cx| {
            if let Poll::Ready(ready) = readable.as_mut().poll(cx) {
                return Poll::Ready(Some(ready));
            }
            changed.as_mut().poll(cx).map(|()| None)
        })
        .await
    }

    /// The reader, once no blocking caller holds it. Never held across an await.
    async fn reader(&self) -> MutexGuard<'_, Reader> {
        if let Some(reader) = self.reader.try_lock() {
            return reader;
        }
        loop {
            // Registered before the look, so that a caller giving it back in between is heard.
            let mut freed = std::pin::pin!(self.reader_free.notified());
            freed.as_mut().enable();
            if let Some(reader) = self.reader.try_lock() {
                return reader;
            }
            freed.await;
        }
    }

    /// Reads and delivers frames until the connection ends; returns why it did, and whether
    /// the peer broke a limit (the connection is then reset).
    async fn read_frames(&self, inbound: &dyn Inbound) -> (Status, bool) {
        let policy = self.policy;
        // Held while the frames of one read are handed up: a stream's reader wakes once to
        // all of its messages in the read, not once per message.
        let mut wakes = Wakes::new();
        let mut read_deadline = ReadDeadline::new();
        let room = || !policy.pause_when_full || self.outbox.has_room();
        loop {
            // Hand up what was read, a turn at a time; then see how long to wait for more.
            let deadline = loop {
                let (turn, deadline) = {
                    let mut reader = self.reader().await;
                    if let Some(end) = reader.ended.take() {
                        return end;
                    }
                    let every = Some(FRAMES_PER_TURN);
                    let turn = reader.deliver(inbound, &mut wakes, every, room, &self.peer);
                    (turn, self.deadline(&reader))
                };
                wakes.wake_all();
                match turn {
                    Turn::Drained { .. } => break deadline,
                    Turn::Yield => tokio::task::yield_now().await,
                    Turn::Full => poll_fn(|cx| self.outbox.poll_room(cx)).await,
                    Turn::End(status, abort) => return (status, abort),
                }
            };
            if let Some(status) = self.outbox.reset() {
                return (status, false);
            }
            let readable = match deadline {
                Some(at) => read_deadline.wait(at, self.readable_or_changed()).await,
                None => Some(self.readable_or_changed().await),
            };
            let mut reader = self.reader().await;
            if let Some(end) = reader.ended.take() {
                return end;
            }
            match readable {
                Some(Some(Ok(()))) => {}
                Some(Some(Err(e))) => return self.failed(e),
                // A caller's read changed what to wait for: look again.
                Some(None) => continue,
                // The deadline passed, unless a caller's read moved it on meanwhile.
                None if self.deadline(&reader).is_none_or(|at| at > Instant::now()) => continue,
                None if reader.frame_started.is_some() => {
                    let status = Status::unavailable(format!(
                        "{} sent part of a frame and then nothing for {:?} (read timeout)",
                        self.peer, self.limits.read_timeout
                    ));
                    return (status, true);
                }
                None => {
                    if inbound.idle() && self.outbox.is_empty() {
                        let status = Status::unavailable(format!(
                            "{} was idle for {:?} (idle timeout)",
                            self.peer,
                            policy.idle_timeout.unwrap_or_default()
                        ));
                        return (status, false);
                    }
                    // Calls are running: the peer is waiting for us, not idle.
                    reader.last_heard = Instant::now();
                    continue;
                }
            }
            let read = reader.read(|buf| self.read_some(buf));
            if let Some(end) = self.after_read(&reader, read) {
                return end;
            }
        }
    }
}

/// Turns on the kernel's keepalive probes and bounds unacknowledged time
/// ([`ConnectionLimits::keepalive`]): a dead peer is noticed about `keepalive +
/// keepalive_timeout` after the connection went quiet, or `keepalive_timeout` after data we
/// sent went unacknowledged, and the read fails with `TimedOut`.
fn keep_alive(stream: &tokio::net::TcpStream, limits: &ConnectionLimits) -> io::Result<()> {
    let Some(idle) = limits.keepalive else {
        return Ok(());
    };
    let socket = socket2::SockRef::from(stream);
    let second = Duration::from_secs(1);
    // The kernel counts these in whole seconds.
    let interval = (limits.keepalive_timeout / KEEPALIVE_PROBES).max(second);
    let probes = socket2::TcpKeepalive::new()
        .with_time(idle.max(second))
        .with_interval(interval)
        .with_retries(KEEPALIVE_PROBES);
    socket.set_tcp_keepalive(&probes)?;
    socket.set_tcp_user_timeout(Some(limits.keepalive_timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: ReadPolicy = ReadPolicy {
        max_payload: 1024,
        idle_timeout: None,
        pause_when_full: false,
        caller_reads: false,
    };

    /// The options a dead peer is noticed by are set on every connection's socket.
    #[test]
    fn connections_probe_idle_peers_and_bound_unacknowledged_time() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .expect("connect");
            let limits = ConnectionLimits {
                keepalive: Some(Duration::from_secs(7)),
                keepalive_timeout: Duration::from_secs(9),
                ..ConnectionLimits::default()
            };
            let socket = Socket::plain(stream);
            let conn = Conn::new(socket, "tcp://test".into(), &limits, POLICY).expect("conn");
            let socket = socket2::SockRef::from(&conn.socket.tcp);
            assert!(socket.keepalive().expect("SO_KEEPALIVE"));
            assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(7));
            assert_eq!(
                socket.tcp_keepalive_interval().unwrap(),
                Duration::from_secs(3)
            );
            assert_eq!(socket.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
            assert_eq!(
                socket.tcp_user_timeout().unwrap(),
                Some(Duration::from_secs(9))
            );
            let off = ConnectionLimits {
                keepalive: None,
                ..ConnectionLimits::default()
            };
            let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .expect("connect");
            let conn =
                Conn::new(Socket::plain(stream), "tcp://test".into(), &off, POLICY).expect("conn");
            assert!(!socket2::SockRef::from(&conn.socket.tcp)
                .keepalive()
                .unwrap());
        });
    }
}
