//! What generated servers implement, and the type-erased call they receive.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;

use crate::auth::Peer;
use crate::message::{Request, Response};
use crate::server::reuse::{self, HandlerFuture, ReplyBody};
use crate::stream::{Link, MessageStream, StreamShared, Streaming, TypedMessages};
use crate::{MetadataMap, ResponseMetadata};
use crate::{MethodKind, Status};

/// A method a service serves: its path, the id derived from it, and which of its sides
/// stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodDescriptor {
    /// `/package.Service/Method`.
    pub path: &'static str,
    /// [`crate::method_id`] of `path`.
    pub id: u32,
    /// Which sides stream (a transport that carries each shape differently, gRPC's, needs
    /// it before the handler runs).
    pub kind: MethodKind,
}

impl MethodDescriptor {
    /// The descriptor of the unary method `path`.
    pub const fn new(path: &'static str) -> Self {
        MethodDescriptor {
            path,
            id: crate::method_id(path),
            kind: MethodKind::Unary,
        }
    }

    /// The same method, of `kind`.
    pub const fn with_kind(self, kind: MethodKind) -> Self {
        MethodDescriptor { kind, ..self }
    }
}

/// An incoming call before its message is decoded.
#[derive(Debug)]
pub struct ServerCall {
    /// Request metadata.
    pub metadata: MetadataMap,
    /// The encoded request message (possibly a view into transport memory).
    pub payload: Bytes,
    /// The caller's remaining time budget on arrival.
    pub timeout: Option<Duration>,
    /// Who sent it (`None` outside a server, in tests).
    pub peer: Option<Arc<Peer>>,
    /// The method called (`None` outside a server, in tests).
    pub(crate) method: Option<MethodDescriptor>,
    /// The request messages of a streaming call (which carries no `payload`).
    pub(crate) stream: Option<InboundStream>,
}

/// The client's side of a streaming call, as the dispatcher opened it.
#[derive(Debug)]
pub(crate) struct InboundStream {
    pub(crate) shared: Arc<StreamShared>,
    pub(crate) link: Link,
    pub(crate) call_id: u64,
}

impl ServerCall {
    /// A unary call: `payload` is the encoded request message.
    pub fn new(metadata: MetadataMap, payload: Bytes, timeout: Option<Duration>) -> Self {
        ServerCall {
            metadata,
            payload,
            timeout,
            peer: None,
            method: None,
            stream: None,
        }
    }

    /// The method called: its path and id (`None` for a call made outside a server).
    pub fn method(&self) -> Option<MethodDescriptor> {
        self.method
    }

    /// Whether the client opened the call as a stream.
    pub fn is_streaming(&self) -> bool {
        self.stream.is_some()
    }

    /// The request of a client- or bidirectional-streaming call: its messages as a
    /// [`Streaming`].
    pub fn into_streaming<M>(self) -> Result<Request<Streaming<M>>, Status> {
        let Some(inbound) = self.stream else {
            return Err(Status::unimplemented(
                "this method streams its requests, but the call is unary",
            ));
        };
        let stream = Streaming::new(inbound.shared, inbound.link, inbound.call_id, None);
        let mut request = Request::from_parts(self.metadata, stream, self.timeout);
        request.peer = self.peer;
        Ok(request)
    }

    /// The single request message of a server-streaming call.
    pub async fn into_single<M: Message + Default>(self) -> Result<Request<M>, Status> {
        let mut request = self.into_streaming::<M>()?;
        let message = request.get_mut().message().await?.ok_or_else(|| {
            Status::invalid_argument("the client ended the stream without its request message")
        })?;
        Ok(request.map(|_| message))
    }

    /// Decodes the request message.
    pub fn decode<M: Message + Default>(self) -> Result<Request<M>, Status> {
        if self.stream.is_some() {
            return Err(Status::unimplemented(
                "this method takes one request message, but the call is streaming",
            ));
        }
        let message = M::decode(self.payload)
            .map_err(|e| Status::internal(format!("failed to decode the request message: {e}")))?;
        let mut request = Request::from_parts(self.metadata, message, self.timeout);
        request.peer = self.peer;
        Ok(request)
    }
}

/// A handler's successful answer, type-erased so any message type can be sent.
pub struct ServerReply {
    /// Response metadata (the headers).
    pub metadata: MetadataMap,
    /// The trailers: sent with a unary reply's message, or after a streaming reply's last
    /// message (with the status that ends it).
    pub trailers: MetadataMap,
    /// The response message, encoded straight into the transport's buffer.
    pub(crate) body: Box<dyn ReplyBody>,
    /// The messages of a streaming response (whose `body` is empty).
    pub(crate) messages: Option<Box<dyn MessageStream>>,
}

impl ServerReply {
    /// A unary reply: `body` is the response message.
    pub fn new<M: ReplyBody>(metadata: MetadataMap, body: M) -> Self {
        ServerReply {
            metadata,
            trailers: MetadataMap::new(),
            body: reuse::reply_box(body),
            messages: None,
        }
    }

    /// A unary reply whose body is any [`EncodeBody`](crate::body::EncodeBody): a message
    /// encoded already, or a [`SharedBody`](crate::body::SharedBody). Unlike
    /// [`ServerReply::new`]'s, its heap block is not reused from call to call.
    pub fn from_body(metadata: MetadataMap, body: Box<dyn crate::body::EncodeBody>) -> Self {
        ServerReply {
            metadata,
            trailers: MetadataMap::new(),
            body: Box::new(reuse::AnyBody(body)),
            messages: None,
        }
    }

    /// The response message.
    pub fn body(&self) -> &dyn crate::body::EncodeBody {
        &*self.body
    }

    /// The metadata section of a unary reply: headers and trailers.
    pub(crate) fn wire_metadata(&self) -> ResponseMetadata<'_> {
        ResponseMetadata {
            headers: &self.metadata,
            trailers: &self.trailers,
        }
    }

    /// The reply was sent: its message's heap block goes to the thread's next reply.
    pub(crate) fn recycle(self) {
        self.body.recycle();
    }

    /// A streaming reply: `metadata` goes in the headers, then every message of `stream`,
    /// then the trailers.
    pub fn streaming<S, M>(response: Response<S>) -> Self
    where
        S: futures::Stream<Item = Result<M, Status>> + Send + 'static,
        M: Message + Send + Sync + 'static,
    {
        let (metadata, stream, trailers) = response.into_all_parts();
        ServerReply {
            metadata,
            trailers,
            // Zero-sized: no heap block.
            body: Box::new(()),
            messages: Some(Box::new(TypedMessages::new(stream))),
        }
    }
}

impl std::fmt::Debug for ServerReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerReply")
            .field("metadata", &self.metadata)
            .field("trailers", &self.trailers)
            .field("body_len", &self.body.encoded_len())
            .finish()
    }
}

impl<M: Message + Default + 'static> From<Response<M>> for ServerReply {
    fn from(response: Response<M>) -> Self {
        let (metadata, message, trailers) = response.into_all_parts();
        ServerReply {
            trailers,
            ..ServerReply::new(metadata, message)
        }
    }
}

/// A service the server can host; implemented by generated `FooServer` types.
pub trait Service: Send + Sync + 'static {
    /// Fully qualified service name, e.g. `echo.Echo`.
    fn name(&self) -> &'static str;

    /// Every method the service serves.
    fn methods(&self) -> &'static [MethodDescriptor];

    /// Runs method `method_id` on `call`: the handler's future, made into a
    /// [`HandlerFuture`] (whose heap block the server reuses from call to call).
    fn call(&self, method_id: u32, call: ServerCall) -> HandlerFuture;
}

/// A service's fully qualified name, known from its type (as tonic's `NamedService`): what a
/// health reporter is told serving status for, e.g. `set_serving::<EchoServer<MyEcho>>()`.
/// Implemented by generated `FooServer` types.
pub trait NamedService {
    /// Fully qualified service name, e.g. `echo.Echo`.
    const NAME: &'static str;
}

/// Decodes `call`, runs `handler` on the typed request and erases the response type: the
/// body of every generated unary method.
pub async fn unary<Req, Resp, F, Fut>(call: ServerCall, handler: F) -> Result<ServerReply, Status>
where
    Req: Message + Default,
    Resp: Message + Default + 'static,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
{
    let request = call.decode::<Req>()?;
    Ok(handler(request).await?.into())
}

/// The body of every generated server-streaming method: takes the single request
/// message, runs `handler` and streams what it returns.
pub async fn server_streaming<Req, Resp, S, F, Fut>(
    call: ServerCall,
    handler: F,
) -> Result<ServerReply, Status>
where
    Req: Message + Default,
    Resp: Message + Send + Sync + 'static,
    S: futures::Stream<Item = Result<Resp, Status>> + Send + 'static,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<S>, Status>>,
{
    let request = call.into_single::<Req>().await?;
    Ok(ServerReply::streaming(handler(request).await?))
}

/// The body of every generated client-streaming method.
pub async fn client_streaming<Req, Resp, F, Fut>(
    call: ServerCall,
    handler: F,
) -> Result<ServerReply, Status>
where
    Req: Message + Default,
    Resp: Message + Default + 'static,
    F: FnOnce(Request<Streaming<Req>>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
{
    let request = call.into_streaming::<Req>()?;
    Ok(handler(request).await?.into())
}

/// The body of every generated bidirectional-streaming method.
pub async fn streaming<Req, Resp, S, F, Fut>(
    call: ServerCall,
    handler: F,
) -> Result<ServerReply, Status>
where
    Req: Message + Default,
    Resp: Message + Send + Sync + 'static,
    S: futures::Stream<Item = Result<Resp, Status>> + Send + 'static,
    F: FnOnce(Request<Streaming<Req>>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<S>, Status>>,
{
    let request = call.into_streaming::<Req>()?;
    Ok(ServerReply::streaming(handler(request).await?))
}
