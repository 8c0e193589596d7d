//! The server side: an accept thread and one reader thread per connection.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use rpc_core::frame::OutgoingFrame;
use rpc_core::server::{ConnectionDispatch, Dispatcher, ReplySink};
use rpc_core::Status;

use crate::codec::{FrameReader, FrameWriter, Inbound};

struct TcpReplySink {
    writer: Mutex<FrameWriter<TcpStream>>,
}

impl ReplySink for TcpReplySink {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.writer.lock().write(frame).map_err(Status::from)
    }
}

struct Shared {
    dispatcher: Arc<Dispatcher>,
    local_addr: SocketAddr,
    draining: AtomicBool,
    next_conn: AtomicU64,
    connections: Mutex<HashMap<u64, Connection>>,
}

struct Connection {
    stream: TcpStream,
    dispatch: Arc<ConnectionDispatch>,
}

/// A running TCP server. Dropping it shuts it down gracefully.
pub struct TcpServer {
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpServer")
            .field("local_addr", &self.shared.local_addr)
            .finish()
    }
}

impl TcpServer {
    /// Binds `addr` (`host:port`, port 0 for any) and serves `dispatcher` on it.
    pub fn bind(addr: &str, dispatcher: Arc<Dispatcher>) -> io::Result<TcpServer> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on tcp://{addr}: {e}")))?;
        let shared = Arc::new(Shared {
            dispatcher,
            local_addr: listener.local_addr()?,
            draining: AtomicBool::new(false),
            next_conn: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("rpc-tcp-accept".into())
                .spawn(move || accept_loop(&listener, &shared))?
        };
        Ok(TcpServer {
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// Stops accepting, stops reading new requests, lets running handlers answer for up to
    /// `grace`, then closes every connection.
    pub fn shutdown(&mut self, grace: Duration) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.draining.store(true, Ordering::SeqCst);
        // The accept thread is blocked in accept(): a connection of our own wakes it. If
        // even that fails, leave the thread behind rather than hang here.
        match TcpStream::connect_timeout(&self.shared.local_addr, Duration::from_secs(1)) {
            Ok(_) => {
                let _ = acceptor.join();
            }
            Err(e) => tracing::warn!(%e, "could not wake the accept thread; leaving it"),
        }
        for conn in self.shared.connections.lock().values() {
            let _ = conn.stream.shutdown(Shutdown::Read);
        }
        if !self.shared.dispatcher.wait_idle(grace) {
            tracing::warn!(
                in_flight = self.shared.dispatcher.in_flight(),
                "shutdown grace period over with handlers still running"
            );
        }
        for (_, conn) in self.shared.connections.lock().drain() {
            conn.dispatch.close();
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(5));
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.draining.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => {
                if let Err(e) = start_connection(stream, peer, shared) {
                    tracing::warn!(%peer, %e, "could not start a connection");
                }
            }
            Err(e) => {
                tracing::warn!(%e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn start_connection(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let limit = shared.dispatcher.config().max_message_size;
    let reader = FrameReader::new(stream.try_clone()?, limit);
    let sink = Arc::new(TcpReplySink {
        writer: Mutex::new(FrameWriter::new(stream.try_clone()?)),
    });
    let dispatch = ConnectionDispatch::new(shared.dispatcher.clone(), sink);
    shared.connections.lock().insert(
        id,
        Connection {
            stream,
            dispatch: dispatch.clone(),
        },
    );
    let shared = shared.clone();
    std::thread::Builder::new()
        .name("rpc-tcp-conn".into())
        .spawn(move || {
            serve_connection(reader, &dispatch, peer);
            // While draining, the read side was shut on purpose and running handlers still
            // answer on the write side; `TcpServer::shutdown` closes the connection later.
            if !shared.draining.load(Ordering::SeqCst) {
                dispatch.close();
                if let Some(conn) = shared.connections.lock().remove(&id) {
                    let _ = conn.stream.shutdown(Shutdown::Both);
                }
            }
        })?;
    Ok(())
}

fn serve_connection(
    mut reader: FrameReader<TcpStream>,
    dispatch: &Arc<ConnectionDispatch>,
    peer: SocketAddr,
) {
    loop {
        match reader.read() {
            Ok(Some(Inbound::Frame(frame))) => dispatch.on_frame(frame),
            Ok(Some(Inbound::Oversized { header, declared })) => {
                dispatch.reject_oversized(&header, declared)
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(%peer, %e, "closing connection");
                return;
            }
        }
    }
}
