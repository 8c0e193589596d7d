//! A connection's socket: plain TCP, or TCP carrying TLS (`tcps://`). Either way the
//! connection reads and writes its frames as bytes, without blocking; with TLS the bytes are
//! rustls's plaintext, and rustls's records travel underneath.
//!
//! The TLS session is one piece of state shared by whoever writes (a sender's thread or
//! the writer task) and whoever reads (the reader task or a blocking caller), so it has
//! one lock, held only for non-blocking work: encrypting, decrypting, and a non-blocking
//! `send` or `recv`. Two things differ from a plain socket, and the connection honours
//! both:
//!
//! * what was written may still wait inside the session as records the socket did not take
//!   ([`Socket::has_unsent`]): whoever writes next sends them first, and the writer task
//!   keeps going until they left;
//! * what was read may wait inside the session as plaintext that did not fit
//!   ([`Socket::has_buffered`]): a reader looks there before it waits for the socket.

use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::net::Shutdown;

use parking_lot::Mutex;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Most plaintext bytes encrypted by one write (the records of at most this much wait in
/// the session when the socket takes none of them).
const TLS_WRITE_CHUNK: usize = 64 * 1024;

/// A connection's socket.
#[derive(Debug)]
pub(crate) struct Socket {
    /// The TCP socket, registered with the event loop.
    pub(crate) tcp: TcpStream,
    tls: Option<Mutex<Tls>>,
}

/// A TLS session over the socket.
struct Tls {
    session: rustls::Connection,
    /// The peer closed the TCP connection (or sent TLS's close_notify): once the plaintext
    /// before it is read, reads return end of stream.
    ended: bool,
    /// What failed after a read had already taken plaintext from the session: that
    /// plaintext is returned first, this with the next read (a reset is reported once).
    failed: Option<io::Error>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// The TCP socket as `io::Read` and `io::Write` for rustls: one non-blocking `recv` or
/// `send`, whatever the event loop knows of its readiness.
struct Raw<'a>(&'a TcpStream);

impl Read for Raw<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `recv` only writes into the buffer, and `u8` and `MaybeUninit<u8>` have the
        // same layout: initialized bytes may be viewed as possibly uninitialized ones.
        let buf = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
        socket2::SockRef::from(self.0).recv(buf)
    }
}

impl Write for Raw<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        socket2::SockRef::from(self.0).send(buf)
    }

    /// Several records in one `sendmsg` (rustls hands its queue over as slices).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        socket2::SockRef::from(self.0).send_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Socket {
    /// A plain TCP socket.
    pub(crate) fn plain(tcp: TcpStream) -> Socket {
        Socket { tcp, tls: None }
    }

    /// `tcp` carrying the TLS `session`, its handshake done.
    pub(crate) fn tls(tcp: TcpStream, session: impl Into<rustls::Connection>) -> Socket {
        let tls = Tls {
            session: session.into(),
            ended: false,
            failed: None,
        };
        Socket {
            tcp,
            tls: Some(Mutex::new(tls)),
        }
    }

    /// Writes some of `bytes` without blocking; `WouldBlock` if the socket takes none now
    /// (its write readiness is then cleared, so waiting for it waits for room). With TLS,
    /// records waiting in the session go first, and `bytes` may be empty to send just those.
    pub(crate) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            return self.tcp.try_write(bytes);
        };
        let mut tls = tls.lock();
        self.send_records(&mut tls.session)?;
        if bytes.is_empty() {
            return Ok(0);
        }
        let take = bytes.len().min(TLS_WRITE_CHUNK);
        let n = tls.session.writer().write(&bytes[..take])?;
        match self.send_records(&mut tls.session) {
            Ok(()) => Ok(n),
            // Taken: the records wait in the session for the next write.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
            Err(e) => Err(e),
        }
    }

    /// Sends the session's records until none waits; `WouldBlock` if the socket takes no
    /// more.
    fn send_records(&self, session: &mut rustls::Connection) -> io::Result<()> {
        while session.wants_write() {
            self.tcp.try_io(Interest::WRITABLE, || {
                session.write_tls(&mut Raw(&self.tcp))
            })?;
        }
        Ok(())
    }

    /// Whether TLS records the socket did not take yet wait in the session.
    pub(crate) fn has_unsent(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|tls| tls.lock().session.wants_write())
    }

    /// Whether TLS plaintext that did not fit the last read waits in the session, or the
    /// end of the stream or a failure was seen and not yet read (each is read without
    /// waiting for the socket).
    pub(crate) fn has_buffered(&self) -> bool {
        self.tls.as_ref().is_some_and(|tls| {
            let mut tls = tls.lock();
            tls.ended
                || tls.failed.is_some()
                || tls
                    .session
                    .process_new_packets()
                    .is_ok_and(|state| state.plaintext_bytes_to_read() > 0)
        })
    }

    /// One non-blocking read into `buf` (`recv`, or with TLS the plaintext of what the
    /// socket holds), whatever the event loop knows of the socket's readiness: `Ok(0)` at
    /// the end of the stream, `WouldBlock` if nothing came. With TLS, a read shorter than
    /// `buf` means the socket was drained, as with plain TCP.
    pub(crate) fn recv(&self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            return socket2::SockRef::from(&self.tcp).recv(buf);
        };
        let mut tls = tls.lock();
        if let Some(failed) = tls.failed.take() {
            return Err(failed);
        }
        let mut filled = 0;
        // A failure after plaintext was taken waits for the next read, behind it.
        let fail = |tls: &mut Tls, filled: usize, e: io::Error| {
            if filled == 0 {
                return Err(e);
            }
            tls.failed = Some(e);
            Ok(filled)
        };
        loop {
            let state = match tls.session.process_new_packets() {
                Ok(state) => state,
                Err(e) => {
                    // Tells the peer why (an alert), best effort.
                    let _ = self.send_records(&mut tls.session);
                    let e = io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"));
                    return fail(&mut tls, filled, e);
                }
            };
            let waiting = state.plaintext_bytes_to_read();
            let take = waiting.min(buf.len() - filled);
            filled += plaintext(&mut tls.session, &mut buf[filled..filled + take])?;
            if state.peer_has_closed() && take == waiting {
                // TLS's close_notify, and everything before it read.
                tls.ended = true;
            }
            if filled == buf.len() || tls.ended {
                return Ok(filled);
            }
            // What the session answers on its own (a key update) goes now if the socket
            // takes it, else with the next write.
            let _ = self.send_records(&mut tls.session);
            match tls.session.read_tls(&mut Raw(&self.tcp)) {
                // The peer closed TCP, with or without TLS's close_notify: our frames say
                // where they end, so a cut stream is seen for what it is (a frame begun and
                // not ended) either way.
                Ok(0) => tls.ended = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && filled > 0 => return Ok(filled),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(e),
                Err(e) => return fail(&mut tls, filled, e),
            }
        }
    }

    /// Shuts the write side: with TLS, after telling the peer so (close_notify), best
    /// effort.
    pub(crate) fn shutdown_write(&self) {
        if let Some(tls) = &self.tls {
            let mut tls = tls.lock();
            tls.session.send_close_notify();
            let _ = self.send_records(&mut tls.session);
        }
        let _ = socket2::SockRef::from(&self.tcp).shutdown(Shutdown::Write);
    }

    /// Shuts both sides at once (a reader waiting for bytes wakes to the end of stream).
    pub(crate) fn shutdown(&self) {
        let _ = socket2::SockRef::from(&self.tcp).shutdown(Shutdown::Both);
    }
}

/// Reads `buf.len()` bytes of the plaintext waiting in `session` (no more than waits).
fn plaintext(session: &mut rustls::Connection, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    // SAFETY: every byte is zeroed before the slice is viewed as initialized, and `u8` and
    // `MaybeUninit<u8>` have the same layout.
    let buf = unsafe {
        std::ptr::write_bytes(buf.as_mut_ptr(), 0, buf.len());
        &mut *(buf as *mut [MaybeUninit<u8>] as *mut [u8])
    };
    session.reader().read(buf)
}

#[cfg(test)]
mod tests;
