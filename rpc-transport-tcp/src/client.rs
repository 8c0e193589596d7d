//! The client side of a TCP connection.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::stream::Wakes;
use rpc_core::{CallTable, ClientTransport, Code, FrameKind, FrameSender, Header, Status};

use crate::conn::{Conn, Inbox, ReadPolicy};
use crate::handshake;
use crate::outbox::{Class, Pushed};

pub use crate::config::TcpConfig;

/// The event loop of every TCP client connection in the process: one thread, started with
/// the first connection, that reads responses and writes what senders could not.
fn client_runtime() -> Result<&'static tokio::runtime::Runtime, Status> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("rpc-tcp-client")
                .enable_io()
                .enable_time()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Status::internal(format!("cannot start the TCP event loop: {e}")))
}

/// A connected TCP client transport. Frames are written on the calling thread when the
/// socket takes them, else queued for the event loop, which also completes calls in the
/// [`CallTable`] as responses arrive.
#[derive(Debug)]
pub struct TcpClient {
    conn: Arc<Conn>,
}

impl TcpClient {
    /// Connects to `addr` (`host:port`) and starts completing `calls` from its responses.
    pub fn connect(
        addr: &str,
        calls: Arc<CallTable>,
        config: &TcpConfig,
    ) -> Result<Arc<TcpClient>, Status> {
        let peer = format!("tcp://{addr}");
        let mut stream = connect_any(addr, config.connect_timeout)
            .map_err(|e| Status::unavailable(format!("cannot connect to {peer}: {e}")))?;
        if let Some(credentials) = &config.credentials {
            handshake::client(&mut stream, credentials, &peer, config.connect_timeout)?;
        }
        let runtime = client_runtime()?;
        let conn = {
            let _entered = runtime.enter();
            stream
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(stream))
                .and_then(|stream| Conn::new(stream, peer.clone(), &config.limits))
                .map_err(|e| Status::unavailable(format!("cannot use the socket to {peer}: {e}")))?
        };
        let policy = ReadPolicy {
            max_payload: config.max_message_size,
            idle_timeout: None,
            pause_when_full: false,
        };
        let limit = config.max_message_size as u64;
        let responses = Responses {
            calls,
            peer,
            limit,
            conn: conn.clone(),
        };
        conn.start(runtime.handle(), responses, policy);
        Ok(Arc::new(TcpClient { conn }))
    }
}

fn connect_any(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = None;
    for resolved in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&resolved, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the host name resolved to no address",
        )
    }))
}

/// Completes calls from the responses a connection receives.
struct Responses {
    calls: Arc<CallTable>,
    peer: String,
    limit: u64,
    conn: Arc<Conn>,
}

impl Inbox for Responses {
    fn on_messages(&self, call_id: u64, run: &mut Vec<InboundFrame>, wakes: &mut Wakes) {
        self.calls.on_stream_messages(call_id, run.drain(..), wakes);
    }

    fn on_frame(&self, frame: InboundFrame, wakes: &mut Wakes) {
        match frame.header.kind {
            // Call id 0 is never a call's: a status for it is about the connection (a server
            // at its connection limit says so, then closes).
            FrameKind::Response if frame.header.call_id == 0 => {
                let code = match frame.header.status {
                    Code::Ok => Code::Unavailable,
                    code => code,
                };
                let status = Status::new(
                    code,
                    format!(
                        "{} refused the connection: {}",
                        self.peer,
                        String::from_utf8_lossy(&frame.payload)
                    ),
                );
                // Closed from this side too: a server that says so and keeps the
                // connection open cannot hold it.
                self.conn.close(status.clone());
                self.calls.close(status);
            }
            FrameKind::Response => {
                self.calls.complete(frame.header.call_id, Ok(frame));
            }
            kind if rpc_core::stream::is_stream_frame(kind) => {
                self.calls.on_stream_frame(frame, wakes)
            }
            kind => {
                tracing::debug!(?kind, peer = %self.peer, "ignoring a frame clients do not act on")
            }
        }
    }

    fn on_oversized(&self, header: &Header, declared: u64) {
        let (what, limit) =
            rpc_core::stream::batch::oversized(header.kind, self.limit as usize, "response");
        self.calls.complete(
            header.call_id,
            Err(Status::message_too_large(what, declared, limit)),
        );
    }

    fn idle(&self) -> bool {
        false
    }

    fn on_closed(&self, status: Status) {
        tracing::debug!(peer = %self.peer, %status, "client connection ended");
        self.calls.close(status);
    }
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
    fn send_control(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        match self
            .conn
            .outbox
            .try_push(&self.conn.stream, frame, Class::Control)?
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

impl Drop for TcpClient {
    fn drop(&mut self) {
        // The connection's tasks hold it too; without this it would outlive its channel.
        self.close();
    }
}
