//! The client side of a TCP connection.

use std::io;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rpc_core::frame::OutgoingFrame;
use rpc_core::{CallTable, ClientTransport, FrameKind, Status};

use crate::codec::{FrameReader, FrameWriter, Inbound};

/// TCP connection settings.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// How long to wait for the TCP handshake with each resolved address.
    pub connect_timeout: Duration,
    /// Largest payload accepted from the peer.
    pub max_message_size: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            connect_timeout: Duration::from_secs(5),
            max_message_size: rpc_core::client::DEFAULT_MAX_MESSAGE_SIZE,
        }
    }
}

/// A connected TCP client transport. Writes happen on the calling thread; one reader
/// thread completes calls in the [`CallTable`].
#[derive(Debug)]
pub struct TcpClient {
    peer: String,
    stream: TcpStream,
    writer: Mutex<FrameWriter<TcpStream>>,
}

impl TcpClient {
    /// Connects to `addr` (`host:port`) and starts the reader that completes `calls`.
    pub fn connect(
        addr: &str,
        calls: Arc<CallTable>,
        config: &TcpConfig,
    ) -> Result<Arc<TcpClient>, Status> {
        let peer = format!("tcp://{addr}");
        let stream = connect_any(addr, config.connect_timeout)
            .map_err(|e| Status::unavailable(format!("cannot connect to {peer}: {e}")))?;
        stream
            .set_nodelay(true)
            .map_err(|e| Status::unavailable(format!("cannot configure {peer}: {e}")))?;
        let clone = |s: &TcpStream| {
            s.try_clone()
                .map_err(|e| Status::unavailable(format!("cannot use socket to {peer}: {e}")))
        };
        let reader = FrameReader::new(clone(&stream)?, config.max_message_size);
        let client = Arc::new(TcpClient {
            writer: Mutex::new(FrameWriter::new(clone(&stream)?)),
            stream,
            peer: peer.clone(),
        });
        let limit = config.max_message_size as u64;
        std::thread::Builder::new()
            .name("rpc-tcp-client".into())
            .spawn(move || read_responses(reader, &calls, &peer, limit))
            .map_err(|e| Status::internal(format!("cannot start the reader thread: {e}")))?;
        Ok(client)
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

fn read_responses(mut reader: FrameReader<TcpStream>, calls: &CallTable, peer: &str, limit: u64) {
    let reason = loop {
        match reader.read() {
            Ok(Some(Inbound::Frame(frame))) => match frame.header.kind {
                FrameKind::Response => {
                    calls.complete(frame.header.call_id, Ok(frame));
                }
                kind => tracing::debug!(?kind, peer, "ignoring a frame clients do not act on"),
            },
            Ok(Some(Inbound::Oversized { header, declared })) => {
                calls.complete(
                    header.call_id,
                    Err(Status::message_too_large("response", declared, limit)),
                );
            }
            Ok(None) => break format!("{peer} closed the connection"),
            Err(e) => break format!("connection to {peer} failed: {e}"),
        }
    };
    tracing::debug!(peer, %reason, "client connection ended");
    calls.close(Status::unavailable(reason));
}

impl ClientTransport for TcpClient {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.writer
            .lock()
            .write(frame)
            .map_err(|e| Status::unavailable(format!("cannot send to {}: {e}", self.peer)))
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn close(&self) {
        // Wakes the reader thread, which closes the call table.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
