//! A connection's bounded output queue.
//!
//! Frames are encoded into one buffer. With nothing queued, the sender writes its frame to
//! the socket at once with a non-blocking write (one syscall on the caller's thread, the
//! latency of a plain blocking socket). Whatever the socket does not take waits in the
//! queue for the connection's writer task, which owns the socket's write side until the
//! queue is empty again; frames sent meanwhile append to the queue, in order. Nothing here
//! ever blocks a thread except [`Outbox::push_blocking`], the blocking stubs' path.

use std::io;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::{Condvar, Mutex, MutexGuard};
use rpc_core::frame::OutgoingFrame;
use rpc_core::Status;
use tokio::sync::Notify;

use crate::socket::Socket;

/// Bytes a stream's sender may leave corked ([`Outbox::poll_push_more`]) before they are
/// written anyway.
const CORK_LIMIT: usize = 64 * 1024;

/// Header-only frames (a dropped call's `Cancel`) may exceed the queue bound by this much, so
/// that giving up on a call works even while its connection's queue is full.
const CONTROL_ALLOWANCE: usize = 64 * 1024;

/// How a frame is to be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// A request or response: waits for room under the bound.
    Data,
    /// A header-only frame: never waits, dropped past the bound plus [`CONTROL_ALLOWANCE`].
    Control,
}

#[derive(Debug, Default)]
struct State {
    /// Encoded frames not yet handed to the writer task. Non-empty while not `writing` only
    /// when corked ([`Outbox::poll_push_more`]) until the sender's flush.
    pending: BytesMut,
    /// Bytes the writer task took and has not written yet.
    in_writer: usize,
    /// The writer task owns the socket's write side (`pending` non-empty implies it).
    writing: bool,
    /// A graceful close was asked for: once the queue is empty, it closes with this status.
    finish: Option<Status>,
    closed: Option<Status>,
    /// `closed` came from a graceful close: the peer's remaining frames are still read (and
    /// discarded) until it closes its side, so that the kernel never resets the connection
    /// under answers it has not delivered yet.
    graceful: bool,
    /// Async senders (and a paused reader) waiting for room.
    waiters: Vec<Waker>,
    /// Threads parked in [`Outbox::push_blocking`].
    parked: usize,
}

impl State {
    fn queued(&self) -> usize {
        self.pending.len() + self.in_writer
    }

    fn has_room(&self, len: usize, limit: usize, class: Class) -> bool {
        let queued = self.queued();
        match class {
            // The frame that crosses the bound is still taken (a lone frame larger than the
            // bound must go some time); the next waits until the queue is below it again,
            // which is also when a paused reader resumes.
            Class::Data => queued < limit,
            Class::Control => queued + len <= limit + CONTROL_ALLOWANCE,
        }
    }
}

/// The output queue of one connection.
#[derive(Debug)]
pub(crate) struct Outbox {
    state: Mutex<State>,
    room: Condvar,
    /// Wakes the writer task.
    writer: Notify,
    limit: usize,
}

/// What a push attempt did.
#[derive(Debug)]
pub(crate) enum Pushed {
    /// Written or queued.
    Sent,
    /// No room now (data) or ever (control past its allowance): nothing was queued.
    Full,
}

impl Outbox {
    /// An empty queue bounded at `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        Outbox {
            state: Mutex::new(State::default()),
            room: Condvar::new(),
            writer: Notify::new(),
            limit,
        }
    }

    /// Writes or queues `frame` if there is room; never blocks.
    pub(crate) fn try_push(
        &self,
        socket: &Socket,
        frame: &OutgoingFrame<'_>,
        class: Class,
    ) -> Result<Pushed, Status> {
        let mut st = self.state.lock();
        self.push_locked(&mut st, socket, frame, class)
    }

    /// Like [`Outbox::try_push`] for a data frame, but with no room registers `cx` to be
    /// woken once there is (or the connection closed) and returns `Pending`.
    pub(crate) fn poll_push(
        &self,
        cx: &mut Context<'_>,
        socket: &Socket,
        frame: &OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        let mut st = self.state.lock();
        match self.push_locked(&mut st, socket, frame, Class::Data) {
            Ok(Pushed::Sent) => Poll::Ready(Ok(())),
            Err(status) => Poll::Ready(Err(status)),
            Ok(Pushed::Full) => {
                register(&mut st.waiters, cx.waker());
                Poll::Pending
            }
        }
    }

    /// Like [`Outbox::poll_push`], but the frame may wait corked with the ones before it
    /// until [`Outbox::flush`] or until [`CORK_LIMIT`] bytes are corked: a stream sending
    /// messages back to back writes them in one syscall.
    pub(crate) fn poll_push_more(
        &self,
        cx: &mut Context<'_>,
        socket: &Socket,
        frame: &OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.poll_cork(cx, socket, frame.len(), |pending| frame.encode_to(pending))
    }

    /// Like [`Outbox::poll_push_more`] for frames the sender encoded itself (whole frames,
    /// in order): takes all of `encoded`, leaving it empty.
    pub(crate) fn poll_push_encoded(
        &self,
        cx: &mut Context<'_>,
        socket: &Socket,
        encoded: &mut BytesMut,
    ) -> Poll<Result<(), Status>> {
        // Copied, not swapped: the sender keeps its own small buffer, and never takes the
        // queue's (which a large message may have grown, for the sender's whole life).
        self.poll_cork(cx, socket, encoded.len(), |pending| {
            pending.extend_from_slice(encoded);
            encoded.clear();
        })
    }

    /// Queues `len` bytes that `put` appends, corked, if there is room; with none, writes
    /// what is corked and registers `cx`.
    fn poll_cork(
        &self,
        cx: &mut Context<'_>,
        socket: &Socket,
        len: usize,
        put: impl FnOnce(&mut BytesMut),
    ) -> Poll<Result<(), Status>> {
        let mut st = self.state.lock();
        if let Some(status) = &st.closed {
            return Poll::Ready(Err(status.clone()));
        }
        if !st.has_room(len, self.limit, Class::Data) {
            // What is corked goes out first; room comes back as it is written.
            if let Err(status) = self.start_write(&mut st, socket) {
                return Poll::Ready(Err(status));
            }
            register(&mut st.waiters, cx.waker());
            return Poll::Pending;
        }
        put(&mut st.pending);
        if st.pending.len() >= CORK_LIMIT {
            if let Err(status) = self.start_write(&mut st, socket) {
                return Poll::Ready(Err(status));
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Writes what [`Outbox::poll_push_more`] corked.
    pub(crate) fn flush(&self, socket: &Socket) {
        let mut st = self.state.lock();
        if st.closed.is_none() {
            // A failure closed the queue; the senders see it on their next push.
            let _ = self.start_write(&mut st, socket);
        }
    }

    /// Writes or queues a data frame, parking the thread while the queue is full, at most
    /// until the frame's deadline (`timeout_us`) if it has one. A peer that never reads is
    /// disconnected after the stall limit, which ends the wait too.
    pub(crate) fn push_blocking(
        &self,
        socket: &Socket,
        frame: &OutgoingFrame<'_>,
    ) -> Result<(), Status> {
        let budget = frame.header().timeout_us;
        let deadline = (budget > 0).then(|| Instant::now() + Duration::from_micros(budget));
        let mut st = self.state.lock();
        loop {
            match self.push_locked(&mut st, socket, frame, Class::Data)? {
                Pushed::Sent => return Ok(()),
                Pushed::Full => {
                    count_stall();
                    st.parked += 1;
                    let timed_out = match deadline {
                        Some(deadline) => self.room.wait_until(&mut st, deadline).timed_out(),
                        None => {
                            self.room.wait(&mut st);
                            false
                        }
                    };
                    st.parked -= 1;
                    if timed_out {
                        return Err(Status::deadline_exceeded(format!(
                            "deadline of {budget} µs passed while the connection's output \
                             queue ({} bytes) was full",
                            st.queued()
                        )));
                    }
                }
            }
        }
    }

    /// `Ready` once a data frame would be accepted or the queue closed (a server stops
    /// reading requests while its replies cannot leave).
    pub(crate) fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if Self::open_room(&st, self.limit) {
            return Poll::Ready(());
        }
        register(&mut st.waiters, cx.waker());
        Poll::Pending
    }

    /// Whether [`Outbox::poll_room`] would be ready now.
    pub(crate) fn has_room(&self) -> bool {
        Self::open_room(&self.state.lock(), self.limit)
    }

    fn open_room(st: &State, limit: usize) -> bool {
        st.closed.is_some() || st.queued() < limit
    }

    /// Whether nothing waits to be written.
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().queued() == 0
    }

    fn push_locked(
        &self,
        st: &mut MutexGuard<'_, State>,
        socket: &Socket,
        frame: &OutgoingFrame<'_>,
        class: Class,
    ) -> Result<Pushed, Status> {
        if let Some(status) = &st.closed {
            return Err(status.clone());
        }
        if !st.has_room(frame.len(), self.limit, class) {
            return Ok(Pushed::Full);
        }
        frame.encode_to(&mut st.pending);
        self.start_write(st, socket)?;
        Ok(Pushed::Sent)
    }

    /// Unless the writer task owns the socket: writes what is pending on this thread, and
    /// hands what the socket does not take to the writer task.
    fn start_write(&self, st: &mut MutexGuard<'_, State>, socket: &Socket) -> Result<(), Status> {
        if st.writing || (st.pending.is_empty() && !socket.has_unsent()) {
            // The writer task takes it after what it is writing.
            return Ok(());
        }
        // Nothing queued: write on this thread. The lock keeps other senders' frames behind
        // this one; the write never blocks.
        let written = socket.try_write(&st.pending);
        if let (Ok(n), Some(metrics)) = (&written, crate::metrics::tcp()) {
            metrics.sent.increment(*n as u64);
        }
        match written {
            Ok(n) if n == st.pending.len() => st.pending.clear(),
            Ok(n) => {
                let _ = st.pending.split_to(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                // The connection is broken: fail it here (the reader may be asleep).
                let status = Status::unavailable(format!("cannot send: {e}"));
                socket.shutdown();
                // Woken under the lock: this path is rare, and a wake only schedules.
                self.shut(st, status.clone())
                    .into_iter()
                    .for_each(Waker::wake);
                return Err(status);
            }
        }
        if st.pending.is_empty() && !socket.has_unsent() {
            return Ok(());
        }
        st.writing = true;
        self.writer.notify_one();
        Ok(())
    }

    /// The writer task's next chunk to write, or what to do when there is none.
    pub(crate) fn next_chunk(&self, socket: &Socket) -> Chunk {
        let mut st = self.state.lock();
        if st.closed.is_some() {
            return Chunk::Closed;
        }
        if st.pending.is_empty() && socket.has_unsent() {
            return Chunk::Flush;
        }
        if st.pending.is_empty() {
            st.writing = false;
            if let Some(status) = st.finish.take() {
                // Closed under the same lock, so no sender slips a frame in behind the last.
                st.closed = Some(status);
                st.graceful = true;
                self.wake_room(st);
                return Chunk::Finished;
            }
            return Chunk::Idle;
        }
        let chunk = st.pending.split().freeze();
        st.in_writer = chunk.len();
        Chunk::Write(chunk)
    }

    /// The writer task wrote `n` bytes of its chunk.
    pub(crate) fn wrote(&self, n: usize) {
        let mut st = self.state.lock();
        st.in_writer -= n;
        // Waiters only come back to find the queue full again until it has room.
        if st.queued() < self.limit {
            self.wake_room(st);
        }
    }

    /// Waits until the writer task has something to do.
    pub(crate) async fn writer_wakeup(&self) {
        self.writer.notified().await;
    }

    /// Closes the queue with `status` once everything queued is written (graceful
    /// shutdown); later pushes fail. Returns true if that is now, false if the writer task
    /// does it (it then returns [`Chunk::Finished`]) or the queue was already closed.
    pub(crate) fn finish(&self, status: Status) -> bool {
        let mut st = self.state.lock();
        if st.closed.is_some() {
            return false;
        }
        if st.queued() == 0 && !st.writing {
            st.closed = Some(status);
            st.graceful = true;
            self.wake_room(st);
            return true;
        }
        st.finish = Some(status);
        if !st.writing {
            // Corked frames: the writer task writes them, then closes.
            st.writing = true;
            self.writer.notify_one();
        }
        false
    }

    /// Fails every later push with `status` and wakes every waiter; the first status
    /// sticks. Queued bytes are dropped.
    pub(crate) fn close(&self, status: Status) {
        let mut st = self.state.lock();
        let waiters = self.shut(&mut st, status);
        drop(st);
        waiters.into_iter().for_each(Waker::wake);
    }

    /// [`Outbox::close`] under the lock: tells the writer and parked threads, and returns
    /// the async waiters to wake.
    fn shut(&self, st: &mut State, status: Status) -> Vec<Waker> {
        st.closed.get_or_insert(status);
        st.graceful = false;
        st.pending = BytesMut::new();
        self.writer.notify_one();
        self.room.notify_all();
        std::mem::take(&mut st.waiters)
    }

    /// The status the queue was closed with, if it was.
    pub(crate) fn closed(&self) -> Option<Status> {
        self.state.lock().closed.clone()
    }

    /// Why the reader must stop now: the queue was closed at once (not gracefully).
    pub(crate) fn reset(&self) -> Option<Status> {
        let st = self.state.lock();
        st.closed.clone().filter(|_| !st.graceful)
    }

    fn wake_room(&self, mut st: MutexGuard<'_, State>) {
        if st.parked > 0 {
            self.room.notify_all();
        }
        let waiters = std::mem::take(&mut st.waiters);
        drop(st);
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// What the writer task is to do next.
#[derive(Debug)]
pub(crate) enum Chunk {
    /// Write these bytes.
    Write(Bytes),
    /// Nothing queued, but TLS records the socket did not take yet wait in the session:
    /// send them.
    Flush,
    /// Nothing queued: wait for a wake-up.
    Idle,
    /// Everything queued was written and the queue is now closed (graceful close).
    Finished,
    /// The connection is closed.
    Closed,
}

/// Adds a task waiting for room (counted as a stall when it starts waiting).
fn register(waiters: &mut Vec<Waker>, waker: &Waker) {
    if !waiters.iter().any(|w| w.will_wake(waker)) {
        count_stall();
        waiters.push(waker.clone());
    }
}

/// A send starts waiting for room in the output queue.
fn count_stall() {
    if let Some(metrics) = crate::metrics::tcp() {
        metrics.send_stalls.increment(1);
    }
}
