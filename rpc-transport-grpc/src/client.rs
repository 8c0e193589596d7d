//! `grpc://` for our clients: a channel's calls as standard gRPC over HTTP/2, to any gRPC
//! server (tonic, grpc-go, grpcio, ours).
//!
//! The channel's frames become HTTP/2 requests: a `Request` starts one (the path from the
//! method's [`called`](rpc_core::observe::called) entry, metadata as headers, the budget as
//! `grpc-timeout`), a stream's messages are its body until the half-close, a `Cancel`
//! resets it. What comes back becomes our frames for the channel ([`crate::exchange`]).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Method};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use rpc_core::client::Responses;
use rpc_core::frame::OutgoingFrame;
use rpc_core::transport::DEFAULT_KEEPALIVE_TIMEOUT;
use rpc_core::{CallTable, ClientTransport, Flags, FrameKind, FrameSender, MethodKind, Status};
use rpc_transport_tcp::sockets::{client_event_loop, connect_any};
use tokio::task::AbortHandle;

use crate::body::ReplyBody;
use crate::config::{
    DEFAULT_MAX_HEADER_LIST_SIZE, DEFAULT_READ_BUDGET, HTTP2_CONNECTION_WINDOW, HTTP2_SEND_BUFFER,
    HTTP2_STREAM_WINDOW,
};
use crate::conn::{take_frame, GrpcConn, Side};
use crate::exchange::{exchange, Exchange};
use crate::headers::{add_metadata, grpc_timeout, GRPC_CONTENT_TYPE, GRPC_TIMEOUT};
use crate::tls::{agreed_h2, server_name, ClientTls, ALPN_H2};

/// `grpc://` client settings.
#[derive(Debug, Clone)]
pub struct GrpcClientConfig {
    /// How long to wait for the TCP handshake with each resolved address, then again for
    /// the TLS and HTTP/2 handshakes.
    pub connect_timeout: Duration,
    /// Largest response message accepted; a larger one fails its call with
    /// `RESOURCE_EXHAUSTED`.
    pub max_message_size: usize,
    /// Time after which the client pings a server it has calls running on and heard
    /// nothing from (HTTP/2 PING); `None` (the default, as gRPC clients do): never. gRPC
    /// servers by default allow a ping every 5 minutes and only while calls run, and
    /// answer more with GOAWAY (`too_many_pings`).
    pub keepalive: Option<Duration>,
    /// Longest a ping may go unanswered before the connection is closed and its calls
    /// fail with `UNAVAILABLE`.
    pub keepalive_timeout: Duration,
    /// Bytes of response messages the connection holds while they arrive; past it, the
    /// call whose message would pass it fails with `RESOURCE_EXHAUSTED` (at least one
    /// message of `max_message_size` always fits).
    pub read_budget: usize,
    /// Bytes of request messages the connection's calls queue for HTTP/2 (each call at
    /// most its stream window, 256 KiB and a message); past it the channel's senders wait.
    pub write_queue: usize,
    /// Largest header block (headers or trailers) a response may carry, in HTTP/2's
    /// measure.
    pub max_header_list_size: u32,
    /// For `grpcs://`: the authorities whose certificates the client trusts (the server's
    /// name is checked against the URL's host). `None`: plaintext.
    pub tls: Option<ClientTls>,
    /// The name the server's certificate is checked against (and sent as SNI) instead of
    /// the URL's host: for a channel balanced over resolved addresses (`balance_dns`),
    /// whose URLs hold IP addresses, give the name the certificate is for.
    pub tls_server_name: Option<String>,
}

impl Default for GrpcClientConfig {
    fn default() -> Self {
        GrpcClientConfig {
            connect_timeout: Duration::from_secs(5),
            max_message_size: rpc_core::client::DEFAULT_MAX_MESSAGE_SIZE,
            keepalive: None,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            read_budget: DEFAULT_READ_BUDGET,
            write_queue: 16 << 20,
            max_header_list_size: DEFAULT_MAX_HEADER_LIST_SIZE,
            tls: None,
            tls_server_name: None,
        }
    }
}

/// The event loop of every `grpc://` client connection in the process: one thread,
/// started with the first connection.
fn client_runtime() -> Result<&'static tokio::runtime::Runtime, Status> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    client_event_loop(&RUNTIME, "rpc-grpc-client")
}

/// A `grpc://` client connection.
pub struct GrpcClient {
    link: Arc<GrpcConn>,
    sender: http2::SendRequest<ReplyBody>,
    /// `host:port`, the requests' authority.
    authority: String,
    /// `http`, or `https` over TLS.
    uri_scheme: &'static str,
    max_message_size: usize,
    runtime: tokio::runtime::Handle,
    /// Each call's exchange, to reset it when the call is cancelled.
    exchanges: Arc<Mutex<HashMap<u64, AbortHandle>>>,
    connection: AbortHandle,
}

impl std::fmt::Debug for GrpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcClient")
            .field("peer", &self.link.peer)
            .finish_non_exhaustive()
    }
}

impl GrpcClient {
    /// Connects to `authority` (`host:port`); what comes back completes calls in `calls`.
    pub fn connect(
        authority: &str,
        calls: Arc<CallTable>,
        config: &GrpcClientConfig,
    ) -> Result<Arc<GrpcClient>, Status> {
        let scheme = if config.tls.is_some() {
            "grpcs"
        } else {
            "grpc"
        };
        let peer = format!("{scheme}://{authority}");
        let unavailable = |e: &dyn std::fmt::Display| Status::unavailable(format!("{peer}: {e}"));
        let runtime = client_runtime()?;
        let stream = connect_any(authority, config.connect_timeout).map_err(|e| unavailable(&e))?;
        let _ = stream.set_nodelay(true);
        stream.set_nonblocking(true).map_err(|e| unavailable(&e))?;
        let stream = {
            let _entered = runtime.enter();
            tokio::net::TcpStream::from_std(stream).map_err(|e| unavailable(&e))?
        };
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(config.keepalive)
            .keep_alive_timeout(config.keepalive_timeout)
            .keep_alive_while_idle(false)
            .max_header_list_size(config.max_header_list_size)
            .max_send_buf_size(HTTP2_SEND_BUFFER)
            .initial_stream_window_size(HTTP2_STREAM_WINDOW)
            .initial_connection_window_size(HTTP2_CONNECTION_WINDOW);
        let link = GrpcConn::new(
            peer.clone(),
            Side::Client,
            config.max_message_size,
            config.read_budget,
            config.write_queue,
        );
        let responses = Responses::new(calls, peer.clone(), config.max_message_size);
        link.set_upper(Arc::new(responses));
        // The handshakes (TLS's, then HTTP/2's) run on the event loop, which then drives
        // the connection; this thread (a connect is blocking) waits for them.
        let (done, handshaken) = std::sync::mpsc::sync_channel(1);
        let tls = match &config.tls {
            None => None,
            Some(tls) => Some((
                tls.config(ALPN_H2),
                server_name(config.tls_server_name.as_deref().unwrap_or(authority))
                    .map_err(|e| unavailable(&e))?,
            )),
        };
        let ended = link.clone();
        let connection = runtime.spawn(async move {
            match tls {
                None => drive(stream, builder, ended, done).await,
                Some((config, name)) => {
                    let connector = tokio_rustls::TlsConnector::from(config);
                    match connector.connect(name, stream).await {
                        Ok(tls) if agreed_h2(tls.get_ref().1.alpn_protocol()) => {
                            drive(tls, builder, ended, done).await;
                        }
                        Ok(_) => {
                            let _ = done.send(Err("the server's TLS agreed on a protocol other \
                                                   than HTTP/2"
                                .to_owned()));
                        }
                        Err(e) => {
                            let _ = done.send(Err(format!("TLS handshake: {e}")));
                        }
                    }
                }
            }
        });
        let abort = connection.abort_handle();
        let sender = match handshaken.recv_timeout(config.connect_timeout) {
            Ok(Ok(sender)) => sender,
            Ok(Err(why)) => {
                abort.abort();
                return Err(unavailable(&why));
            }
            Err(_) => {
                abort.abort();
                return Err(unavailable(&"no handshake within the connect timeout"));
            }
        };
        Ok(Arc::new(GrpcClient {
            link,
            sender,
            authority: authority.to_owned(),
            uri_scheme: if config.tls.is_some() {
                "https"
            } else {
                "http"
            },
            max_message_size: config.max_message_size,
            runtime: runtime.handle().clone(),
            exchanges: Arc::default(),
            connection: abort,
        }))
    }

    /// Starts the HTTP/2 request of the call `frame` opens.
    fn start(&self, frame: &OutgoingFrame<'_>) -> Result<(), Status> {
        let (request, framed) = take_frame(frame);
        let header = request.header;
        let id = header.call_id;
        let method = rpc_core::observe::called(header.method_id).ok_or_else(|| {
            Status::unimplemented(format!(
                "grpc:// names a method by its path, and method id {:#010x} has none here: \
                 call it through a generated client (or an rpc_core::Method)",
                header.method_id
            ))
        })?;
        let metadata = request
            .decode_metadata()
            .map_err(|e| Status::internal(format!("request {e}")))?;
        let streaming = header.flags.contains(Flags::STREAM);
        let mut http = http::Request::builder()
            .method(Method::POST)
            .uri(format!(
                "{}://{}{}",
                self.uri_scheme,
                self.authority,
                method.path()
            ))
            .body(())
            .map_err(|e| Status::internal(format!("request for {}: {e}", method.path())))?;
        let headers = http.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(GRPC_CONTENT_TYPE),
        );
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        if header.timeout_us > 0 {
            headers.insert(GRPC_TIMEOUT, grpc_timeout(header.timeout_us));
        }
        add_metadata(headers, &metadata);
        self.link.open_call_as(id)?;
        let body = if streaming {
            ReplyBody::Requests {
                conn: self.link.clone(),
                id,
                done: false,
            }
        } else {
            ReplyBody::Unary {
                message: Some(framed),
                trailers: None,
            }
        };
        // A stream answers in the stream shape (headers, messages, trailers) unless its
        // method answers once (client streaming): then as a unary call does.
        let answers_once = !streaming || method.kind() == MethodKind::ClientStreaming;
        let exchange_of = Exchange {
            link: self.link.clone(),
            id,
            method_id: header.method_id,
            answers_once,
            limit: self.max_message_size,
        };
        let exchanges = self.exchanges.clone();
        let sender = self.sender.clone();
        // Spawned and registered under the lock: the task's own removal, which takes it,
        // comes after.
        let mut running = self.exchanges.lock();
        let task = self.runtime.spawn(async move {
            exchange(exchange_of, sender, http.map(|()| body)).await;
            exchanges.lock().remove(&id);
        });
        running.insert(id, task.abort_handle());
        Ok(())
    }

    /// The call was given up on: its HTTP/2 stream is reset, and nothing more of it goes up.
    fn cancel(&self, id: u64) {
        let exchange = self.exchanges.lock().remove(&id);
        if let Some(exchange) = exchange {
            exchange.abort();
        }
        self.link.end_call(id, false);
    }
}

/// The HTTP/2 handshake over `stream`; its sender goes to `done`, then the connection is
/// driven until it ends: a GOAWAY lets the running calls end first (new calls fail
/// `UNAVAILABLE` from then on), and the channel hears of the end once they have.
async fn drive<S>(
    stream: S,
    builder: http2::Builder<TokioExecutor>,
    link: Arc<GrpcConn>,
    done: std::sync::mpsc::SyncSender<Result<http2::SendRequest<ReplyBody>, String>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let connection = match builder.handshake(TokioIo::new(stream)).await {
        Ok((sender, connection)) => {
            let _ = done.send(Ok(sender));
            connection
        }
        Err(e) => {
            let _ = done.send(Err(e.to_string()));
            return;
        }
    };
    let status = match connection.await {
        Ok(()) => {
            link.peer_goes_away();
            link.drained().await;
            Status::unavailable(format!("{} went away (HTTP/2 GOAWAY)", link.peer))
        }
        Err(e) => Status::unavailable(format!("{}: {e}", link.peer)),
    };
    link.on_closed(status);
}

impl FrameSender for GrpcClient {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        match frame.header().kind {
            FrameKind::Request => self.start(frame),
            FrameKind::Cancel => {
                self.cancel(frame.header().call_id);
                Ok(())
            }
            _ => self.link.send(frame),
        }
    }

    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        match frame.header().kind {
            FrameKind::Request | FrameKind::Cancel => Poll::Ready(self.send(frame)),
            _ => self.link.poll_send(cx, frame),
        }
    }
}

impl ClientTransport for GrpcClient {
    fn peer(&self) -> &str {
        &self.link.peer
    }

    fn close(&self) {
        self.connection.abort();
        let aborted: Vec<AbortHandle> = self.exchanges.lock().drain().map(|(_, e)| e).collect();
        aborted.iter().for_each(AbortHandle::abort);
        self.link
            .on_closed(Status::unavailable(format!("{} closed", self.link.peer)));
    }
}

impl Drop for GrpcClient {
    fn drop(&mut self) {
        self.connection.abort();
    }
}
