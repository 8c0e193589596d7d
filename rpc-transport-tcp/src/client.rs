//! The client side of a TCP connection.

use std::io;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rpc_core::client::Responses;
use rpc_core::frame::OutgoingFrame;
use rpc_core::transport::Progress;
use rpc_core::{CallTable, ClientTransport, Drive, FrameSender, Status};

use crate::conn::{Conn, ReadPolicy};
use crate::handshake;
use crate::outbox::{Class, Pushed};
use crate::socket::Socket;
use crate::sockets::{client_event_loop, connect_any};
use crate::tls::{agreed, server_name, ALPN_RPC};

pub use crate::config::TcpConfig;

/// The event loop of every TCP client connection in the process: one thread, started with
/// the first connection, that reads responses and writes what senders could not.
fn client_runtime() -> Result<&'static tokio::runtime::Runtime, Status> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    client_event_loop(&RUNTIME, "rpc-tcp-client")
}

/// A connected TCP client transport. Frames are written on the calling thread when the
/// socket takes them, else queued for the event loop, which also completes calls in the
/// [`CallTable`] as responses arrive; a blocking caller reads its answer itself while no
/// other thread reads ([`Progress`]).
#[derive(Debug)]
pub struct TcpClient {
    conn: Arc<Conn>,
    responses: Arc<Responses>,
    /// `TcpConfig::caller_reads`.
    caller_reads: Duration,
}

impl TcpClient {
    /// Connects to `addr` (`host:port`) and starts completing `calls` from its responses.
    pub fn connect(
        addr: &str,
        calls: Arc<CallTable>,
        config: &TcpConfig,
    ) -> Result<Arc<TcpClient>, Status> {
        let scheme = if config.tls.is_some() { "tcps" } else { "tcp" };
        let peer = format!("{scheme}://{addr}");
        let mut stream = connect_any(addr, config.connect_timeout)
            .map_err(|e| Status::unavailable(format!("cannot connect to {peer}: {e}")))?;
        let session = match &config.tls {
            None => None,
            Some(tls) => {
                let name = config.tls_server_name.as_deref().unwrap_or(addr);
                let name = server_name(name).map_err(Status::invalid_argument)?;
                let session = secure(
                    &mut stream,
                    tls.config(ALPN_RPC),
                    name,
                    config.connect_timeout,
                )
                .map_err(|e| Status::unavailable(format!("cannot connect to {peer}: {e}")))?;
                Some(session)
            }
        };
        let (stream, session) = match (&config.credentials, session) {
            (None, session) => (stream, session),
            (Some(credentials), None) => {
                handshake::client(&mut stream, credentials, &peer, config.connect_timeout)?;
                (stream, None)
            }
            (Some(credentials), Some(session)) => {
                let mut tls = rustls::StreamOwned::new(session, stream);
                handshake::client(&mut tls, credentials, &peer, config.connect_timeout)?;
                (tls.sock, Some(tls.conn))
            }
        };
        let runtime = client_runtime()?;
        let policy = ReadPolicy {
            max_payload: config.max_message_size,
            idle_timeout: None,
            pause_when_full: false,
            caller_reads: !config.caller_reads.is_zero(),
        };
        let conn = {
            let _entered = runtime.enter();
            stream
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(stream))
                .map(|tcp| match session {
                    None => Socket::plain(tcp),
                    Some(session) => Socket::tls(tcp, session),
                })
                .and_then(|socket| Conn::new(socket, peer.clone(), &config.limits, policy))
                .map_err(|e| Status::unavailable(format!("cannot use the socket to {peer}: {e}")))?
        };
        let responses = Arc::new(Responses::new(calls, peer, config.max_message_size));
        conn.start(runtime.handle(), responses.clone());
        Ok(Arc::new(TcpClient {
            conn,
            responses,
            caller_reads: config.caller_reads,
        }))
    }
}

/// The client's TLS handshake on the blocking socket, within `timeout`; our frames must be
/// agreed by ALPN.
fn secure(
    stream: &mut std::net::TcpStream,
    config: Arc<rustls::ClientConfig>,
    name: rustls::pki_types::ServerName<'static>,
    timeout: Duration,
) -> Result<rustls::ClientConnection, String> {
    let mut session = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    while session.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no TLS handshake within {timeout:?}"));
        }
        let timed = stream
            .set_read_timeout(Some(left))
            .and_then(|()| stream.set_write_timeout(Some(left)));
        match timed.and_then(|()| session.complete_io(stream)) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!("no TLS handshake within {timeout:?}"))
            }
            Err(e) => return Err(format!("TLS handshake: {e}")),
        }
    }
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None))
        .map_err(|e| e.to_string())?;
    if !agreed(session.alpn_protocol(), ALPN_RPC) {
        return Err("the server's TLS agreed on a protocol other than ours".to_owned());
    }
    Ok(session)
}

/// Requests go through the connection's output queue, as the server's answers do.
impl FrameSender for TcpClient {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.conn.send(frame)
    }

    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.conn.poll_send(cx, frame)
    }

    fn poll_send_more(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        self.conn.poll_send_more(cx, frame)
    }

    fn flush(&self) {
        self.conn.flush();
    }

    fn stage_limit(&self) -> Option<usize> {
        self.conn.stage_limit()
    }

    fn poll_send_encoded(
        &self,
        cx: &mut Context<'_>,
        encoded: &mut bytes::BytesMut,
    ) -> Poll<Result<(), Status>> {
        self.conn.poll_send_encoded(cx, encoded)
    }
}

impl ClientTransport for TcpClient {
    fn progress(&self) -> Option<&dyn Progress> {
        (!self.caller_reads.is_zero()).then_some(self)
    }

    fn send_control(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        match self
            .conn
            .outbox
            .try_push(&self.conn.socket, frame, Class::Control)?
        {
            Pushed::Sent => Ok(()),
            Pushed::Full => {
                tracing::debug!(peer = %self.conn.peer, "output queue full: control frame dropped");
                Ok(())
            }
        }
    }

    fn peer(&self) -> &str {
        &self.conn.peer
    }

    fn close(&self) {
        self.conn.close(Status::unavailable(format!(
            "{} closed by the client",
            self.conn.peer
        )));
    }
}

/// A blocking caller reads the socket for its answer when no other thread does (no
/// hand-off from the event loop); async callers are woken by the event loop.
impl Progress for TcpClient {
    fn poll_progress(&self, until: Option<std::time::Instant>) -> bool {
        self.conn
            .read_for_caller(&*self.responses, until, self.caller_reads)
    }

    fn drive(&self, _: &mut Context<'_>, _: &mut bool) -> Drive {
        Drive::Wait
    }

    fn release(&self) {}
}

impl Drop for TcpClient {
    fn drop(&mut self) {
        // The connection's tasks hold it too; without this it would outlive its channel.
        self.close();
    }
}
