//! A scripted server for client tests: up or down, answering at once or holding its
//! answers, killing connections on demand.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::executor::block_on;
use parking_lot::Mutex;

use super::{Channel, ChannelConfig, Connection, Connector, ReconnectConfig};
use crate::frame::{FrameSender, InboundFrame, OutgoingFrame};
use crate::header::{FrameKind, Header};
use crate::{CallTable, ClientTransport, Request, Status};

/// A connection to a server that answers every request at once with an empty message,
/// unless told to hold its answers.
struct Answers {
    calls: Arc<CallTable>,
    hold: bool,
    answered: Arc<AtomicUsize>,
}

impl FrameSender for Answers {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let header = *frame.header();
        if header.kind == FrameKind::Request && !self.hold {
            let answer = InboundFrame {
                header: Header::new(FrameKind::Response, header.call_id),
                metadata: Bytes::new(),
                payload: Bytes::new(),
            };
            self.answered.fetch_add(1, Ordering::SeqCst);
            self.calls.complete(header.call_id, Ok(answer));
        }
        Ok(())
    }

    fn poll_send(
        &self,
        _: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        Poll::Ready(self.send(frame))
    }
}

impl ClientTransport for Answers {
    fn peer(&self) -> &str {
        "scripted://server"
    }

    fn close(&self) {
        self.calls
            .close(Status::unavailable("scripted connection closed"));
    }
}

/// A server that is up or down, and remembers every attempt and connection.
#[derive(Default)]
pub(super) struct Server {
    pub(super) down: AtomicBool,
    /// Connections are made, then die at once (a server that accepts and drops).
    pub(super) drops: AtomicBool,
    pub(super) panics: AtomicBool,
    pub(super) hold: AtomicBool,
    pub(super) attempts: Mutex<Vec<Instant>>,
    pub(super) connections: Mutex<Vec<Arc<CallTable>>>,
    /// Requests answered, over all connections.
    pub(super) answered: Arc<AtomicUsize>,
}

impl Server {
    pub(super) fn attempts(&self) -> usize {
        self.attempts.lock().len()
    }

    /// Kills the newest connection, as a server restart or a QP error would.
    pub(super) fn kill(&self) {
        let calls = self
            .connections
            .lock()
            .last()
            .cloned()
            .expect("a connection");
        calls.close(Status::unavailable(
            "connection reset by the scripted server",
        ));
    }
}

pub(super) struct ToServer(pub(super) Arc<Server>);

impl Connector for ToServer {
    fn connect(&self) -> Result<Connection, Status> {
        self.0.attempts.lock().push(Instant::now());
        if self.0.panics.load(Ordering::SeqCst) {
            panic!("a connector bug");
        }
        if self.0.down.load(Ordering::SeqCst) {
            return Err(Status::unavailable(
                "cannot connect to scripted://server: refused",
            ));
        }
        let calls = Arc::new(CallTable::new());
        self.0.connections.lock().push(calls.clone());
        let transport = Answers {
            calls: calls.clone(),
            hold: self.0.hold.load(Ordering::SeqCst),
            answered: self.0.answered.clone(),
        };
        if self.0.drops.load(Ordering::SeqCst) {
            calls.close(Status::unavailable("dropped by the scripted server"));
        }
        Ok(Connection::new(calls, Arc::new(transport)))
    }

    fn target(&self) -> &str {
        "scripted://server"
    }
}

pub(super) fn no_jitter() -> ReconnectConfig {
    ReconnectConfig {
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(80),
        multiplier: 2.0,
        jitter: 0.0,
        min_connected: Duration::ZERO,
        ..ReconnectConfig::default()
    }
}

pub(super) fn healing(server: &Arc<Server>, reconnect: ReconnectConfig) -> Channel {
    let connector = Arc::new(ToServer(server.clone()));
    Channel::healing(connector, None, reconnect, ChannelConfig::default())
}

pub(super) fn call(channel: &Channel) -> Result<(), Status> {
    block_on(channel.unary::<(), ()>(1, Request::new(()))).map(|_| ())
}

pub(super) fn call_blocking(channel: &Channel, timeout: Option<Duration>) -> Result<(), Status> {
    let mut request = Request::new(());
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    channel.unary_blocking::<(), ()>(1, request).map(|_| ())
}

pub(super) fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}
