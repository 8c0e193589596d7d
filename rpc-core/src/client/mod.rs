//! The client side: a [`Channel`] over any transport, the connection it calls over (one,
//! or one at a time for a channel that heals), and the unary call machinery that generated
//! stubs use.

pub mod balance;
#[cfg(test)]
mod balance_tests;
mod call;
mod connection;
mod reconnect;
#[cfg(test)]
mod reconnect_tests;
mod responses;
pub mod service;
pub mod stream_service;
mod streaming;
#[cfg(test)]
mod streaming_tests;
#[cfg(test)]
mod test_support;

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tracing::Instrument;

pub use crate::transport::{ClientTransport, Drive, Progress};
use balance::Balanced;
pub(crate) use call::PendingCall;
pub use connection::Connection;
use reconnect::{ConnectWait, Healing};
pub use reconnect::{Connectivity, Connector, ReconnectConfig};
pub use responses::Responses;
pub use service::{CallService, UnaryCall};
pub use stream_service::{StreamCall, StreamService, StreamShape};

use crate::body::EncodeBody;
use crate::call_table::CallTable;
use crate::frame::{InboundFrame, OutgoingFrame};
use crate::header::Header;
use crate::interceptor::{
    intercept_all, intercept_all_blocking, AsyncInterceptor, Intercept, Interceptor,
};
use crate::message::{Request, Response};
use crate::observe::{CallRecord, MethodRef};
use crate::stream::{Window, DEFAULT_STREAM_WINDOW};
use crate::{Code, Status};
use crate::{MetadataMap, ResponseMetadata};

pub use crate::message::DEFAULT_MAX_MESSAGE_SIZE;

/// Client settings shared by every call on a channel.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Largest encoded request sent and response accepted.
    pub max_message_size: usize,
    /// Time budget for calls that set none.
    pub default_timeout: Option<Duration>,
    /// What a server may send on one stream before this client reads it (never less than
    /// [`crate::stream::INITIAL_WINDOW`]): per stream, at most `bytes` plus
    /// `max_message_size` are buffered.
    pub stream_window: Window,
    /// Calls of a balanced channel ([`Channel::balance`]) waiting for the balancer's pick at
    /// once (default [`balance::DEFAULT_BALANCE_QUEUE`]); more wait for room, within their
    /// deadline.
    pub balance_queue: usize,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            default_timeout: None,
            stream_window: DEFAULT_STREAM_WINDOW,
            balance_queue: balance::DEFAULT_BALANCE_QUEUE,
        }
    }
}

/// Where a channel's calls go.
enum Source {
    /// One connection for the channel's life (`Channel::new`).
    Fixed(Arc<Connection>),
    /// One connection at a time, replaced when it dies (`Channel::healing`).
    Healing(Arc<Healing>),
    /// Several endpoint channels, one picked per call (`Channel::balance`).
    Balanced(Box<Balanced>),
}

struct ChannelInner {
    source: Source,
    config: ChannelConfig,
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // A fixed connection closes when the calls still holding it are done with it.
        if let Source::Healing(healing) = &self.source {
            healing.shut_down();
        }
    }
}

/// A connection to a server, shared by any number of stubs, threads and tasks.
///
/// `Channel` is cheap to clone, `Send + Sync`, and keeps many calls in flight at once.
/// It is created by a transport (for example `rdma_rpc::connect("tcp://host:port")`,
/// which heals: see [`Channel::healing`]).
#[derive(Clone)]
pub struct Channel {
    inner: Arc<ChannelInner>,
    /// Run in order on every call made through this handle ([`Channel::with_interceptor`]).
    intercepts: Option<Arc<[Intercept]>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("peer", &self.peer())
            .field("connectivity", &self.connectivity())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Channel {
    /// A channel over one connected transport that completes calls in `calls`. When the
    /// connection dies, calls fail with `Unavailable` for good.
    pub fn new(
        calls: Arc<CallTable>,
        transport: Arc<dyn ClientTransport>,
        config: ChannelConfig,
    ) -> Channel {
        let connection = Arc::new(Connection::new(calls, transport));
        Channel::with_source(Source::Fixed(connection), config)
    }

    /// A channel that heals: it calls over `connected` (or, lazily, over the first
    /// connection `connector` opens) and replaces a connection that dies with a new one, as
    /// `reconnect` says. Calls in flight on a connection that dies fail with `Unavailable`;
    /// later calls go over the next one.
    pub fn healing(
        connector: Arc<dyn Connector>,
        connected: Option<Connection>,
        reconnect: ReconnectConfig,
        config: ChannelConfig,
    ) -> Channel {
        let healing = Healing::new(connector, connected, reconnect);
        Channel::with_source(Source::Healing(healing), config)
    }

    fn with_source(source: Source, config: ChannelConfig) -> Channel {
        Channel {
            inner: Arc::new(ChannelInner { source, config }),
            intercepts: None,
        }
    }

    /// This channel (the same connection and settings) with `interceptor` run on every call
    /// made through the returned handle, after the interceptors it already had; see
    /// [`crate::interceptor`].
    #[must_use]
    pub fn with_interceptor(&self, interceptor: impl Interceptor) -> Channel {
        self.intercepted(Intercept::Sync(Arc::new(interceptor)))
    }

    /// [`Channel::with_interceptor`] for an interceptor that awaits.
    #[must_use]
    pub fn with_async_interceptor(&self, interceptor: impl AsyncInterceptor) -> Channel {
        self.intercepted(Intercept::Async(Arc::new(interceptor)))
    }

    fn intercepted(&self, intercept: Intercept) -> Channel {
        let mut intercepts: Vec<Intercept> = self.intercepts.as_deref().unwrap_or(&[]).to_vec();
        intercepts.push(intercept);
        Channel {
            inner: self.inner.clone(),
            intercepts: Some(intercepts.into()),
        }
    }

    /// `request` after this handle's interceptors.
    pub(crate) async fn intercept<T>(&self, request: Request<T>) -> Result<Request<T>, Status> {
        match &self.intercepts {
            None => Ok(request),
            Some(intercepts) => intercept_all(intercepts, request).await,
        }
    }

    /// The blocking form of [`Channel::intercept`].
    pub(crate) fn intercept_blocking<T>(&self, request: Request<T>) -> Result<Request<T>, Status> {
        match &self.intercepts {
            None => Ok(request),
            Some(intercepts) => intercept_all_blocking(intercepts, request),
        }
    }

    /// The channel's settings.
    pub fn config(&self) -> &ChannelConfig {
        &self.inner.config
    }

    /// Where the channel connects.
    pub fn peer(&self) -> &str {
        match &self.inner.source {
            Source::Fixed(conn) => conn.peer(),
            Source::Healing(healing) => healing.target(),
            Source::Balanced(_) => "balanced endpoints",
        }
    }

    /// What the channel's connection is doing.
    pub fn connectivity(&self) -> Connectivity {
        match &self.inner.source {
            Source::Fixed(conn) if conn.is_closed() => Connectivity::Shutdown,
            Source::Fixed(_) => Connectivity::Ready,
            Source::Healing(healing) => healing.connectivity(),
            Source::Balanced(balanced) => balanced.connectivity(),
        }
    }

    /// Calls still in flight on the current connection.
    pub fn in_flight(&self) -> usize {
        match &self.inner.source {
            Source::Fixed(conn) => conn.calls.in_flight(),
            Source::Healing(healing) => healing.current().map_or(0, |c| c.calls.in_flight()),
            Source::Balanced(balanced) => balanced.in_flight(),
        }
    }

    /// When a call given `timeout` (or the channel's default) ends, from now.
    pub(crate) fn deadline(&self, timeout: Option<Duration>) -> Option<Instant> {
        let timeout = timeout.or(self.inner.config.default_timeout);
        // A budget too large to add to the clock is no deadline at all.
        timeout.and_then(|t| Instant::now().checked_add(t))
    }

    /// The connection a call made now goes over: at once when the channel has one, else
    /// when one is made (or the wait fails: see [`ReconnectConfig`]). A balanced channel
    /// first has its balancer pick an endpoint.
    pub(crate) async fn connection(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Arc<Connection>, Status> {
        let mut picked;
        let mut channel = self;
        while let Source::Balanced(balanced) = &channel.inner.source {
            picked = balanced.pick(deadline).await?;
            channel = &picked;
        }
        if let Some(conn) = channel.ready_connection() {
            return Ok(conn);
        }
        let mut wait = ConnectWait::new(deadline, true);
        poll_fn(|cx| channel.poll_connection(cx, &mut wait)).await
    }

    /// The blocking form of [`Channel::connection`]: parks the calling thread.
    pub(crate) fn connection_blocking(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Arc<Connection>, Status> {
        let mut picked;
        let mut channel = self;
        while let Source::Balanced(balanced) = &channel.inner.source {
            // The pick needs no reactor: the balancer runs on its own thread.
            picked = futures::executor::block_on(balanced.pick(deadline))?;
            channel = &picked;
        }
        // A connection there already needs no waker (the common case: no allocation per
        // call).
        if let Some(conn) = channel.ready_connection() {
            return Ok(conn);
        }
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut wait = ConnectWait::new(deadline, false);
        loop {
            if let Poll::Ready(result) = channel.poll_connection(&mut cx, &mut wait) {
                return result;
            }
            match wait.limit() {
                Some(at) => std::thread::park_timeout(at.saturating_duration_since(Instant::now())),
                None => std::thread::park(),
            }
        }
    }

    /// The connection a call of a channel that is not balanced takes at once, if there is
    /// one: a fixed channel's, a healing channel's live one.
    fn ready_connection(&self) -> Option<Arc<Connection>> {
        match &self.inner.source {
            Source::Fixed(conn) => Some(conn.clone()),
            Source::Healing(healing) => healing.live(),
            Source::Balanced(_) => None,
        }
    }

    /// The connection of a channel that is not balanced.
    fn poll_connection(
        &self,
        cx: &mut Context<'_>,
        wait: &mut ConnectWait,
    ) -> Poll<Result<Arc<Connection>, Status>> {
        match &self.inner.source {
            Source::Fixed(conn) => Poll::Ready(Ok(conn.clone())),
            Source::Healing(healing) => healing.poll_connection(cx, wait),
            Source::Balanced(_) => Poll::Ready(Err(Status::internal(
                "a balanced channel has no connection of its own",
            ))),
        }
    }

    /// Calls `method` (a generated [`crate::Method`], or a bare id: see
    /// [`crate::method_id`]) with `request` and awaits the response.
    ///
    /// The future works on any executor. Dropping it before it completes cancels the call at
    /// the server.
    pub fn unary<Req, Resp>(
        &self,
        method: impl Into<MethodRef>,
        request: Request<Req>,
    ) -> impl Future<Output = Result<Response<Resp>, Status>> + Send + 'static
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let call = self.unary_encoded(method.into(), request);
        async move { decode_message(call.await?) }
    }

    /// [`Channel::unary`] with the response's message left encoded: the call as a
    /// [`tower::Service`] makes it ([`UnaryCall`]). Recorded ([`crate::observe`]) from here.
    pub(crate) fn unary_encoded<B: EncodeBody + 'static>(
        &self,
        method: MethodRef,
        mut request: Request<B>,
    ) -> impl Future<Output = Result<Response<Bytes>, Status>> + Send + 'static {
        let channel = self.clone();
        let record = CallRecord::client(method, self.peer(), request.metadata_mut());
        let span = record.span().clone();
        async move {
            let result = channel.unary_call(method.id(), request).await;
            record.end(&result);
            result
        }
        .instrument(span)
    }

    async fn unary_call<B: EncodeBody>(
        &self,
        method_id: u32,
        request: Request<B>,
    ) -> Result<Response<Bytes>, Status> {
        let request = self.intercept(request).await?;
        // The deadline runs from here: waiting for a connection, or for room to send,
        // counts against it.
        let deadline = self.deadline(request.timeout());
        self.check_size(&request)?;
        let conn = self.connection(deadline).await?;
        let (mut call, header) = conn.register_call(method_id, request.metadata(), deadline)?;
        let mut frame = request_frame(header, &request)?;
        call.schedule_deadline();
        poll_fn(|cx| call.poll_send(cx, &mut frame)).await?;
        encoded_response(call.await?)
    }

    /// The blocking form of [`Channel::unary`], for synchronous code. The calling thread
    /// waits on its own call (and may drive the transport itself while it does).
    pub fn unary_blocking<Req, Resp>(
        &self,
        method: impl Into<MethodRef>,
        request: Request<Req>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Message,
        Resp: Message + Default,
    {
        decode_message(self.unary_encoded_blocking(method.into(), request)?)
    }

    /// The blocking form of [`Channel::unary_encoded`].
    pub(crate) fn unary_encoded_blocking<B: EncodeBody>(
        &self,
        method: MethodRef,
        mut request: Request<B>,
    ) -> Result<Response<Bytes>, Status> {
        let record = CallRecord::client(method, self.peer(), request.metadata_mut());
        let result = record
            .span()
            .in_scope(|| self.unary_call_blocking(method.id(), request));
        record.end(&result);
        result
    }

    fn unary_call_blocking<B: EncodeBody>(
        &self,
        method_id: u32,
        request: Request<B>,
    ) -> Result<Response<Bytes>, Status> {
        let request = self.intercept_blocking(request)?;
        let deadline = self.deadline(request.timeout());
        self.check_size(&request)?;
        let conn = self.connection_blocking(deadline)?;
        let (mut call, header) = conn.register_call(method_id, request.metadata(), deadline)?;
        let mut frame = request_frame(header, &request)?;
        // A blocking caller may block in `send` itself when the transport is full.
        let sent = conn.transport.send(&mut frame);
        call.sent(sent)?;
        encoded_response(call.wait_blocking()?)
    }

    /// Refuses a request larger than the channel sends.
    fn check_size<B: EncodeBody>(&self, request: &Request<B>) -> Result<(), Status> {
        let limit = self.inner.config.max_message_size;
        let size = request.get_ref().encoded_len();
        if size > limit {
            return Err(Status::message_too_large(
                "request",
                size as u64,
                limit as u64,
            ));
        }
        Ok(())
    }
}

/// Wakes a thread parked in a blocking call.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// The frame of a request: `header`, then the request's metadata and message.
fn request_frame<'a, B: EncodeBody>(
    header: Header,
    request: &'a Request<B>,
) -> Result<OutgoingFrame<'a>, Status> {
    let metadata: &MetadataMap = request.metadata();
    OutgoingFrame::new(header, metadata, request.get_ref())
        .map(|frame| frame.with_landing(request.landing()))
        .map_err(|e| Status::resource_exhausted(e.to_string()))
}

pub(crate) fn decode_response<Resp: Message + Default>(
    frame: InboundFrame,
) -> Result<Response<Resp>, Status> {
    decode_message(encoded_response(frame)?)
}

/// A response frame's status, or its metadata and still encoded message.
pub(crate) fn encoded_response(frame: InboundFrame) -> Result<Response<Bytes>, Status> {
    if frame.header.status != Code::Ok {
        return Err(frame.status());
    }
    let (metadata, trailers) = ResponseMetadata::decode_from(&frame.metadata)
        .map_err(|e| Status::internal(format!("response {e}")))?;
    Ok(Response::from_parts(metadata, frame.payload).with_trailers(trailers))
}

/// Decodes a response's message.
pub(crate) fn decode_message<Resp: Message + Default>(
    response: Response<Bytes>,
) -> Result<Response<Resp>, Status> {
    let (metadata, payload, trailers) = response.into_all_parts();
    let message = Resp::decode(payload)
        .map_err(|e| Status::internal(format!("failed to decode the response message: {e}")))?;
    Ok(Response::from_parts(metadata, message).with_trailers(trailers))
}
