//! One TCP connection on the event loop: its socket, its output queue, and the two tasks
//! that drive them. Clients and servers differ only in what they do with received frames
//! (their [`Inbound`]).

use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use std::task::{Context, Poll};

use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::server::{ReplySink, ServedLink};
use rpc_core::stream::{is_message_frame, Wakes};
use rpc_core::{Inbound, Status};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

use crate::codec::{Decoded, FrameDecoder};
use crate::config::{ConnectionLimits, KEEPALIVE_PROBES};
use crate::deadline::ReadDeadline;
use crate::outbox::{Chunk, Outbox};

/// Most bytes one read asks for: frames smaller than this arrive in one read, larger ones
/// grow their buffer with the bytes that arrive.
const READ_CHUNK: usize = 64 * 1024;
/// Fewest bytes a read asks for (a header and a small message). A reader whose reads fill
/// what they asked for asks for twice as much next time, up to [`READ_CHUNK`], and for
/// half as much again when a read brings less than a quarter: busy connections take a
/// burst of small frames in one system call, idle ones keep small buffers.
const MIN_READ: usize = 4 * 1024;
/// Frames a connection's reader delivers (running inline handlers) before it lets the other
/// tasks of its thread run; a run of stream messages counts as one.
const FRAMES_PER_TURN: u32 = 16;
/// Most messages of one stream the reader hands up at once (one lookup of the stream and
/// one hold of its lock for the run): long enough to amortize both, short enough that the
/// stream's reader never waits long for the lock.
const MAX_RUN: usize = 64;

/// A connection shared by its tasks and the transport that sends on it.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    pub(crate) outbox: Outbox,
    /// `tcp://host:port` of the other end, for messages.
    pub(crate) peer: String,
    limits: ConnectionLimits,
    /// Its reader ended and told its inbound side.
    ended: AtomicBool,
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
        self.outbox.push_blocking(&self.stream, frame)
    }

    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.outbox.poll_push(cx, &self.stream, frame)
    }

    fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.outbox.poll_push_more(cx, &self.stream, frame)
    }

    fn flush(&self) {
        self.outbox.flush(&self.stream);
    }

    fn stage_limit(&self) -> Option<usize> {
        Some(rpc_core::stream::STAGE_LIMIT)
    }

    fn poll_send_encoded(
        &self,
        cx: &mut Context<'_>,
        encoded: &mut BytesMut,
    ) -> Poll<Result<(), Status>> {
        self.outbox.poll_push_encoded(cx, &self.stream, encoded)
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
}

impl Conn {
    /// Wraps a connected socket registered with the event loop.
    pub(crate) fn new(
        stream: TcpStream,
        peer: String,
        limits: &ConnectionLimits,
    ) -> io::Result<Arc<Conn>> {
        stream.set_nodelay(true)?;
        keep_alive(&stream, limits)?;
        Ok(Arc::new(Conn {
            stream,
            outbox: Outbox::new(limits.write_queue),
            peer,
            limits: limits.clone(),
            ended: AtomicBool::new(false),
        }))
    }

    /// Starts the connection's reader and writer on `runtime`.
    pub(crate) fn start(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        inbound: impl Inbound,
        policy: ReadPolicy,
    ) {
        runtime.spawn(self.clone().write_loop());
        runtime.spawn(self.clone().read_loop(inbound, policy));
    }

    /// Closes the connection at once: queued frames are dropped, both tasks end, every
    /// later send fails with `status` (the first close's status sticks).
    pub(crate) fn close(&self, status: Status) {
        self.outbox.close(status);
        // Wakes the reader (end of stream) as well.
        let _ = socket2::SockRef::from(&self.stream).shutdown(Shutdown::Both);
    }

    /// Closes the connection with a reset (a peer that broke a limit): what either side
    /// still has queued is discarded, by the kernel too, instead of lingering for a peer
    /// that does not read.
    pub(crate) fn abort(&self, status: Status) {
        let _ = socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO));
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
        let _ = socket2::SockRef::from(&self.stream).shutdown(Shutdown::Write);
    }

    async fn write_loop(self: Arc<Self>) {
        loop {
            match self.outbox.next_chunk() {
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
                Chunk::Idle => self.outbox.writer_wakeup().await,
                Chunk::Finished => return self.shutdown_write(),
                Chunk::Closed => return,
            }
        }
    }

    /// Writes some of `bytes`, waiting at most the stall limit for the socket to take any.
    async fn write_some(&self, bytes: &[u8]) -> Result<usize, Status> {
        let broken = |e| Status::unavailable(format!("cannot send to {}: {e}", self.peer));
        loop {
            match self.stream.try_write(bytes) {
                Ok(n) => {
                    if let Some(metrics) = crate::metrics::tcp() {
                        metrics.sent.increment(n as u64);
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(broken(e)),
            }
            match timeout(self.limits.stall_limit, self.stream.writable()).await {
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
        let mut short = None;
        let read = self.stream.try_io(Interest::READABLE, || {
            let spare = buf.spare_capacity_mut();
            let room = spare.len();
            let n = socket2::SockRef::from(&self.stream).recv(spare)?;
            if let Some(metrics) = crate::metrics::tcp() {
                metrics.received.increment(n as u64);
            }
            // SAFETY: recv initialized the first `n` bytes of the spare capacity.
            unsafe { buf.set_len(buf.len() + n) };
            if n > 0 && n < room {
                // tokio clears readiness only as of the event it saw, so data arriving after
                // this recv still wakes the reader.
                short = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match (read, short) {
            (_, Some(n)) => Ok(n),
            (read, None) => read,
        }
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

    async fn read_loop(self: Arc<Self>, inbound: impl Inbound, policy: ReadPolicy) {
        let (status, abort) = self.read_frames(&inbound, policy).await;
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

    /// Reads and delivers frames until the connection ends; returns why it did, and whether
    /// the peer broke a limit (the connection is then reset).
    async fn read_frames(&self, inbound: &impl Inbound, policy: ReadPolicy) -> (Status, bool) {
        let mut decoder = FrameDecoder::new(policy.max_payload);
        let mut buf = BytesMut::new();
        // Held while the frames of one read are handed up: a stream's reader wakes once to
        // all of its messages in the read, not once per message.
        let mut wakes = Wakes::new();
        // Consecutive messages of one stream, handed up together.
        let mut run = Run::default();
        let mut read_size = MIN_READ;
        // When the frame being received started to arrive.
        let mut frame_started: Option<Instant> = None;
        let mut last_heard = Instant::now();
        let mut read_deadline = ReadDeadline::new();
        loop {
            // Frames taken from the buffer, and deliveries (frames, runs) made, this turn.
            let (mut decoded, mut delivered) = (0u32, 0u32);
            loop {
                if policy.pause_when_full {
                    // Between frames, so that a burst of requests read at once stops at the
                    // first whose answer would find the queue full.
                    poll_fn(|cx| self.outbox.poll_room(cx)).await;
                }
                let before = delivered;
                match decoder.decode(&mut buf) {
                    Ok(Some(Decoded::Frame(frame))) if is_message_frame(frame.header.kind) => {
                        if let Some(frame) = run.push(frame) {
                            delivered += run.hand_up(inbound, &mut wakes);
                            run.push(frame);
                        }
                        if run.frames.len() >= MAX_RUN {
                            delivered += run.hand_up(inbound, &mut wakes);
                        }
                    }
                    Ok(Some(Decoded::Frame(frame))) => {
                        run.hand_up(inbound, &mut wakes);
                        let handed = inbound.on_frame(frame, &mut wakes);
                        delivered += 1;
                        if let Err(status) = handed {
                            wakes.wake_all();
                            return (status, false);
                        }
                    }
                    Ok(Some(Decoded::Oversized { header, declared })) => {
                        run.hand_up(inbound, &mut wakes);
                        inbound.on_oversized(&header, declared);
                        delivered += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let status =
                            Status::unavailable(format!("{} sent garbage: {e}", self.peer));
                        return (status, true);
                    }
                }
                decoded += 1;
                if delivered > before && delivered.is_multiple_of(FRAMES_PER_TURN) {
                    // Inline handlers run here: let the other connections of this thread in.
                    tokio::task::yield_now().await;
                }
            }
            run.hand_up(inbound, &mut wakes);
            wakes.wake_all();
            if !decoder.mid_frame(&buf) {
                frame_started = None;
            } else if decoded > 0 || frame_started.is_none() {
                // A new frame began in the bytes of the last read.
                frame_started = Some(last_heard);
            }
            if let Some(status) = self.outbox.reset() {
                return (status, false);
            }
            let deadline = match frame_started {
                Some(started) => Some(started + self.limits.read_timeout),
                None => policy.idle_timeout.map(|idle| last_heard + idle),
            };
            let readable = match deadline {
                Some(deadline) => read_deadline
                    .wait(deadline, self.stream.readable())
                    .await
                    .ok_or(()),
                None => Ok(self.stream.readable().await),
            };
            match readable {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return self.failed(e),
                Err(_) if frame_started.is_some() => {
                    let status = Status::unavailable(format!(
                        "{} sent part of a frame and then nothing for {:?} (read timeout)",
                        self.peer, self.limits.read_timeout
                    ));
                    return (status, true);
                }
                Err(_) => {
                    if inbound.idle() && self.outbox.is_empty() {
                        let status = Status::unavailable(format!(
                            "{} was idle for {:?} (idle timeout)",
                            self.peer,
                            policy.idle_timeout.unwrap_or_default()
                        ));
                        return (status, false);
                    }
                    // Calls are running: the peer is waiting for us, not idle.
                    last_heard = Instant::now();
                    continue;
                }
            }
            buf.reserve(decoder.missing(&buf).clamp(read_size, READ_CHUNK));
            let room = buf.capacity() - buf.len();
            let read = self.read_some(&mut buf);
            if let Ok(n) = read {
                if n == room {
                    read_size = (read_size * 2).min(READ_CHUNK);
                } else if n < read_size / 4 {
                    read_size = (read_size / 2).max(MIN_READ);
                }
            }
            match read {
                Ok(0) => {
                    let how = if decoder.mid_frame(&buf) {
                        "closed the connection mid-frame"
                    } else {
                        "closed the connection"
                    };
                    return (Status::unavailable(format!("{} {how}", self.peer)), false);
                }
                Ok(_) => last_heard = Instant::now(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return self.failed(e),
            }
        }
    }
}

/// Consecutive `Message` and `Messages` frames of one stream, read and not yet handed up.
#[derive(Debug, Default)]
struct Run {
    frames: Vec<InboundFrame>,
}

impl Run {
    /// Adds `frame` to the run; gives it back if it belongs to another stream than the run.
    fn push(&mut self, frame: InboundFrame) -> Option<InboundFrame> {
        match self.frames.last() {
            Some(last) if last.header.call_id != frame.header.call_id => Some(frame),
            _ => {
                self.frames.push(frame);
                None
            }
        }
    }

    /// Hands the run up, if there is one: before any other frame, so that frames reach the
    /// upper layer in the order they came.
    /// Returns the deliveries made (0 or 1).
    fn hand_up(&mut self, inbound: &impl Inbound, wakes: &mut Wakes) -> u32 {
        let Some(first) = self.frames.first() else {
            return 0;
        };
        inbound.on_messages(first.header.call_id, &mut self.frames, wakes);
        self.frames.clear();
        1
    }
}

/// Turns on the kernel's keepalive probes and bounds unacknowledged time
/// ([`ConnectionLimits::keepalive`]): a dead peer is noticed about `keepalive +
/// keepalive_timeout` after the connection went quiet, or `keepalive_timeout` after data we
/// sent went unacknowledged, and the read fails with `TimedOut`.
fn keep_alive(stream: &TcpStream, limits: &ConnectionLimits) -> io::Result<()> {
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
    use parking_lot::Mutex;
    use rpc_core::{FrameKind, Header};

    /// Records what it is handed: `(call id, seqs)` per delivery.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u64, Vec<u32>)>>);

    impl Inbound for Recorder {
        fn on_frame(&self, frame: InboundFrame, _: &mut Wakes) -> Result<(), Status> {
            let seq = frame.header.seq();
            self.0.lock().push((frame.header.call_id, vec![seq]));
            Ok(())
        }
        fn on_messages(&self, call_id: u64, run: &mut Vec<InboundFrame>, _: &mut Wakes) {
            let seqs = run.drain(..).map(|f| f.header.seq()).collect();
            self.0.lock().push((call_id, seqs));
        }
        fn on_oversized(&self, _: &Header, _: u64) {}
        fn on_dropped(&self, _: u64, _: FrameKind) {}
        fn on_transfer_failed(&self, _: u64, _: FrameKind, _: Status) {}
        fn idle(&self) -> bool {
            true
        }
        fn on_closed(&self, _: Status) {}
    }

    fn frame(kind: FrameKind, call_id: u64, seq: u32) -> InboundFrame {
        InboundFrame {
            header: Header::stream(kind, call_id, seq),
            metadata: Default::default(),
            payload: Default::default(),
        }
    }

    /// Messages of one stream that follow each other go up as one run; a message of
    /// another stream, or any other frame, ends the run first, so every frame reaches the
    /// upper layer in the order it came.
    #[test]
    fn runs_of_one_streams_messages_go_up_together_and_in_order() {
        let inbound = Recorder::default();
        let mut wakes = Wakes::new();
        let mut run = Run::default();
        let mut delivered = 0;
        for (call, seq) in [(1, 1), (1, 2), (1, 3), (2, 1), (1, 4)] {
            if let Some(frame) = run.push(frame(FrameKind::Message, call, seq)) {
                delivered += run.hand_up(&inbound, &mut wakes);
                assert!(run.push(frame).is_none(), "an empty run takes any stream");
            }
        }
        delivered += run.hand_up(&inbound, &mut wakes);
        inbound
            .on_frame(frame(FrameKind::Trailers, 1, 5), &mut wakes)
            .unwrap();
        assert_eq!(
            run.hand_up(&inbound, &mut wakes),
            0,
            "nothing left to hand up"
        );
        assert_eq!(delivered, 3);
        assert_eq!(
            *inbound.0.lock(),
            [(1, vec![1, 2, 3]), (2, vec![1]), (1, vec![4]), (1, vec![5]),]
        );
    }

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
            let stream = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .expect("connect");
            let limits = ConnectionLimits {
                keepalive: Some(Duration::from_secs(7)),
                keepalive_timeout: Duration::from_secs(9),
                ..ConnectionLimits::default()
            };
            let conn = Conn::new(stream, "tcp://test".into(), &limits).expect("conn");
            let socket = socket2::SockRef::from(&conn.stream);
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
            let stream = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .expect("connect");
            let conn = Conn::new(stream, "tcp://test".into(), &off).expect("conn");
            assert!(!socket2::SockRef::from(&conn.stream).keepalive().unwrap());
        });
    }
}
