//! A blocking caller reads its answer itself: while it waits, and no other thread holds
//! the connection's reader, it blocks in `ppoll(2)` on the socket and hands up what comes,
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
    /// thread holds the reader: it blocks in `ppoll(2)` until bytes arrive, the connection
    /// ends, or `until` (at most `slice` from now, `TcpConfig::caller_reads`), and hands
    /// up every whole frame that came, whoever's call it answers. True if frames were
    /// handed up (by this caller, or by another thread since this one last looked) or
    /// this read found the connection ended; false if the caller should park and be
    /// woken by the event loop (which reports an end a caller found: `reader_changed`).
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
        let slice_end = Instant::now().checked_add(slice);
        let until = match (until, slice_end) {
            (Some(until), Some(end)) => until.min(end),
            (until, end) => until.or(end).unwrap_or_else(far_future),
        };
        let frame_started = reader.frame_started;
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
            if !self.socket.has_buffered() && !wait_readable(&self.socket.tcp, until) {
                break false;
            }
            let read = reader.read(|buf| self.drain(buf));
            if let Some(end) = self.after_read(&reader, read) {
                reader.ended = Some(end);
                break true;
            }
        };
        LAST_LOOK.set((self.serial, reader.deliveries));
        // The reader task may be waiting for the socket with no timer, or a later one.
        // So may it if this read left TLS plaintext, an end or a failure in the session, with
        // the socket's readiness cleared.
        let changed = reader.ended.is_some()
            || (reader.frame_started.is_some() && reader.frame_started != frame_started)
            || self.socket.has_buffered();
        drop(reader);
        wakes.wake_all();
        if changed {
            self.reader_changed.notify_one();
        }
        self.reader_free.notify_waiters();
        progressed
    }

    /// A caller's read, which empties the socket, clears the event loop's readiness of it
    /// as the reader task's reads do, so that the task does not wake to read what this
    /// caller read, nor read the answer of this caller's next call before it does. If the
    /// event loop has not seen the bytes yet, a plain `recv` reads them (the task then
    /// wakes once for nothing).
    fn drain(&self, buf: &mut BytesMut) -> io::Result<usize> {
        self.read_clearing(buf).unwrap_or_else(|| self.recv(buf))
    }
}

/// A wait with no end worth naming (a `caller_reads` too long to add to now).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// Blocks in `ppoll(2)` until `stream` has bytes to read (or has ended or failed: a read
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
mod tests;
