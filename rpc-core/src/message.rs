//! Typed request and response wrappers, as seen by generated stubs and handlers.

use std::sync::Arc;
use std::time::Duration;

use crate::auth::Peer;
use crate::Landing;
use crate::MetadataMap;

/// Default limit on encoded request and response sizes, on both sides (the gRPC default).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// A request message with its metadata and time budget.
///
/// ```
/// use std::time::Duration;
/// let mut req = rpc_core::Request::new(42u32);
/// req.set_timeout(Duration::from_millis(250));
/// req.metadata_mut().insert("x-tenant", "blue").unwrap();
/// assert_eq!(req.timeout(), Some(Duration::from_millis(250)));
/// assert_eq!(req.into_inner(), 42);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Request<T> {
    metadata: MetadataMap,
    message: T,
    timeout: Option<Duration>,
    pub(crate) peer: Option<Arc<Peer>>,
    /// Memory offered for the response (client side).
    landing: Option<Landing>,
}

impl<T> Request<T> {
    /// A request with no metadata and no deadline.
    pub fn new(message: T) -> Self {
        Request {
            metadata: MetadataMap::new(),
            message,
            timeout: None,
            peer: None,
            landing: None,
        }
    }

    /// Builds a request from its parts (used by servers when decoding).
    pub fn from_parts(metadata: MetadataMap, message: T, timeout: Option<Duration>) -> Self {
        Request {
            metadata,
            message,
            timeout,
            peer: None,
            landing: None,
        }
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// Consumes the request, returning the message.
    pub fn into_inner(self) -> T {
        self.message
    }

    /// Splits into metadata, message and time budget.
    pub fn into_parts(self) -> (MetadataMap, T, Option<Duration>) {
        (self.metadata, self.message, self.timeout)
    }

    /// The same request around another message (the peer and the landing go along).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Request<U> {
        Request {
            metadata: self.metadata,
            message: f(self.message),
            timeout: self.timeout,
            peer: self.peer,
            landing: self.landing,
        }
    }

    /// Offers `landing`'s memory for a unary call's response: a large response is written
    /// straight into it where the transport can (`rdma://`), and the decoded message's
    /// `bytes` fields are views of it. Streaming calls, and transports that cannot place a
    /// response, leave it alone.
    ///
    /// ```
    /// let landing = rpc_core::Landing::new(vec![0u8; 4096]);
    /// let mut req = rpc_core::Request::new(7u32);
    /// req.receive_into(landing.clone());
    /// assert!(req.landing().is_some());
    /// ```
    pub fn receive_into(&mut self, landing: Landing) {
        self.landing = Some(landing);
    }

    /// The memory offered for the response, if any.
    pub fn landing(&self) -> Option<&Landing> {
        self.landing.as_ref()
    }

    /// Request metadata.
    pub fn metadata(&self) -> &MetadataMap {
        &self.metadata
    }

    /// Request metadata, mutably.
    pub fn metadata_mut(&mut self) -> &mut MetadataMap {
        &mut self.metadata
    }

    /// Sets the call's time budget. The client fails the call with `DeadlineExceeded` when it
    /// runs out and the budget travels to the server, which stops the handler then too.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = Some(timeout);
    }

    /// The time budget: on the client the one set, on the server what remained on arrival.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// On the server: the connection's peer, its address and the identity it
    /// authenticated as ([`crate::auth`]). `None` on the client.
    pub fn peer(&self) -> Option<&Peer> {
        self.peer.as_deref()
    }

    /// On the server: the peer's address, as a URL (`rdma://10.0.0.2:40312`).
    pub fn remote_addr(&self) -> Option<&str> {
        self.peer().map(|p| p.addr.as_str())
    }
}

impl<T> From<T> for Request<T> {
    fn from(message: T) -> Self {
        Request::new(message)
    }
}

/// A response message with its metadata: the headers, and the trailers the server sends
/// after the message.
///
/// On the server a handler sets both; on the client a unary or client-streaming call's
/// response holds what the server sent. A streaming response's trailers end its stream
/// ([`Streaming::trailers`](crate::Streaming::trailers)), so they are not in its
/// `Response`. Unlike tonic, which merges a unary call's trailers into its metadata, the two
/// stay apart, as gRPC sends them.
///
/// ```
/// let mut response = rpc_core::Response::new("done");
/// response.metadata_mut().insert("x-shard", "7").unwrap();
/// response.trailers_mut().insert("x-rows-scanned", "1204").unwrap();
/// assert_eq!(response.trailers().get("x-rows-scanned"), Some(&b"1204"[..]));
/// assert_eq!(response.metadata().get("x-rows-scanned"), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Response<T> {
    metadata: MetadataMap,
    message: T,
    trailers: MetadataMap,
}

impl<T> Response<T> {
    /// A response with no metadata.
    pub fn new(message: T) -> Self {
        Response::from_parts(MetadataMap::new(), message)
    }

    /// Builds a response from its metadata and message, with no trailers.
    pub fn from_parts(metadata: MetadataMap, message: T) -> Self {
        Response {
            metadata,
            message,
            trailers: MetadataMap::new(),
        }
    }

    /// The message.
    pub fn get_ref(&self) -> &T {
        &self.message
    }

    /// The message, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.message
    }

    /// Consumes the response, returning the message.
    pub fn into_inner(self) -> T {
        self.message
    }

    /// Response metadata (the headers).
    pub fn metadata(&self) -> &MetadataMap {
        &self.metadata
    }

    /// Response metadata, mutably.
    pub fn metadata_mut(&mut self) -> &mut MetadataMap {
        &mut self.metadata
    }

    /// The trailers: metadata sent after the message.
    pub fn trailers(&self) -> &MetadataMap {
        &self.trailers
    }

    /// The trailers, mutably.
    pub fn trailers_mut(&mut self) -> &mut MetadataMap {
        &mut self.trailers
    }

    /// Splits into metadata and message, dropping the trailers.
    pub fn into_parts(self) -> (MetadataMap, T) {
        (self.metadata, self.message)
    }

    /// The same response around another message (metadata and trailers go along).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Response<U> {
        Response {
            metadata: self.metadata,
            message: f(self.message),
            trailers: self.trailers,
        }
    }

    /// Splits into metadata, message and trailers.
    pub(crate) fn into_all_parts(self) -> (MetadataMap, T, MetadataMap) {
        (self.metadata, self.message, self.trailers)
    }

    /// Sets the trailers.
    pub(crate) fn with_trailers(mut self, trailers: MetadataMap) -> Self {
        self.trailers = trailers;
        self
    }
}

/// The stable 32-bit id of a method path such as `/echo.Echo/Echo` (FNV-1a).
///
/// Computed at compile time by generated code; the server refuses to start if two of its
/// methods collide.
///
/// ```
/// const ID: u32 = rpc_core::method_id("/echo.Echo/Echo");
/// assert_eq!(ID, rpc_core::method_id("/echo.Echo/Echo"));
/// assert_ne!(ID, rpc_core::method_id("/echo.Echo/Other"));
/// ```
pub const fn method_id(path: &str) -> u32 {
    let bytes = path.as_bytes();
    let mut hash: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u32;
        hash = hash.wrapping_mul(0x0100_0193);
        i += 1;
    }
    hash
}

/// Anything a client stub accepts as a request: a bare message or a [`Request`].
pub trait IntoRequest<T> {
    /// Wraps or passes through.
    fn into_request(self) -> Request<T>;
}

impl<T> IntoRequest<T> for T {
    fn into_request(self) -> Request<T> {
        Request::new(self)
    }
}

impl<T> IntoRequest<T> for Request<T> {
    fn into_request(self) -> Request<T> {
        self
    }
}

/// Anything a client stub accepts as the request of a client- or bidirectional-streaming
/// call: a `Stream` of messages, or a [`Request`] around one (as tonic's).
pub trait IntoStreamingRequest {
    /// The stream of messages.
    type Stream: futures::Stream<Item = Self::Message> + Send + 'static;
    /// The message type.
    type Message;
    /// Wraps or passes through.
    fn into_streaming_request(self) -> Request<Self::Stream>;
}

impl<S> IntoStreamingRequest for S
where
    S: futures::Stream + Send + 'static,
{
    type Stream = S;
    type Message = S::Item;
    fn into_streaming_request(self) -> Request<S> {
        Request::new(self)
    }
}

impl<S> IntoStreamingRequest for Request<S>
where
    S: futures::Stream + Send + 'static,
{
    type Stream = S;
    type Message = S::Item;
    fn into_streaming_request(self) -> Request<S> {
        self
    }
}
