//! Streaming calls as a [`tower::Service`] carries them, as unary ones
//! ([`super::service`]): tonic sends every call through its service, and so can a
//! generated client here.
//!
//! [`Channel`] is a `Service<StreamCall>`; so is any stack of generic layers over it (a
//! timeout, a concurrency limit, a load shed, a layer of the application's own). A
//! generated client's async streaming methods call over such a service ([`StreamService`]);
//! their blocking forms need the channel itself. A streaming call's messages cannot be sent
//! twice, so a [`StreamCall`] is not `Clone` and a retry layer cannot retry it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::{BoxFuture, Either};
use futures::{FutureExt, Stream, StreamExt, TryFutureExt};
use prost::Message;
use tower::{BoxError, Service, ServiceExt};

use super::{decode_message, Channel};
use crate::body::SharedBody;
use crate::error::status_from_error;
use crate::message::{Request, Response};
use crate::observe::{Method, MethodRef};
use crate::stream::Streaming;
use crate::Status;

/// The request messages of a [`StreamCall`], each type-erased (it still encodes itself
/// straight into the transport's memory).
pub type RequestMessages = Pin<Box<dyn Stream<Item = SharedBody> + Send>>;

/// Which side of a streaming call streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamShape {
    /// One request message, a stream of responses.
    Server,
    /// A stream of requests, one response.
    Client,
    /// Streams both ways.
    Bidirectional,
}

/// A streaming call on its way through a [`tower::Service`]: the method, its shape, and
/// the request with its messages type-erased.
pub struct StreamCall {
    method: MethodRef,
    shape: StreamShape,
    request: Request<RequestMessages>,
}

impl std::fmt::Debug for StreamCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCall")
            .field("method", &self.method.path())
            .field("shape", &self.shape)
            .field("metadata", self.request.metadata())
            .field("timeout", &self.request.timeout())
            .finish_non_exhaustive()
    }
}

impl StreamCall {
    /// A call of `method`, of `shape`, sending `request`'s messages.
    pub fn new<S, M>(method: impl Into<MethodRef>, shape: StreamShape, request: Request<S>) -> Self
    where
        S: Stream<Item = M> + Send + 'static,
        M: Message + Send + Sync + 'static,
    {
        StreamCall {
            method: method.into(),
            shape,
            request: request.map(|messages| messages.map(SharedBody::new).boxed()),
        }
    }

    /// The method called.
    pub fn method(&self) -> MethodRef {
        self.method
    }

    /// Which side streams.
    pub fn shape(&self) -> StreamShape {
        self.shape
    }

    /// The request (metadata, time budget; the messages are opaque).
    pub fn request(&self) -> &Request<RequestMessages> {
        &self.request
    }

    /// The request, to add metadata or change its budget.
    pub fn request_mut(&mut self) -> &mut Request<RequestMessages> {
        &mut self.request
    }
}

/// Messages not decoded yet: the type of a [`Streaming`] on its way back through a tower
/// service. Nothing is of this type.
#[derive(Debug)]
pub enum Encoded {}

/// What a streaming call answers through a tower service, its messages still encoded.
#[derive(Debug)]
pub enum StreamAnswer {
    /// Server or bidirectional streaming: the headers and the stream of messages.
    Stream(Response<Streaming<Encoded>>),
    /// Client streaming: the one response.
    Single(Response<Bytes>),
}

impl StreamAnswer {
    fn into_stream<Resp>(self) -> Result<Response<Streaming<Resp>>, Status> {
        match self {
            StreamAnswer::Stream(response) => Ok(response.map(Streaming::retype)),
            StreamAnswer::Single(_) => Err(Status::internal(
                "a tower service answered a streaming call with a single response",
            )),
        }
    }

    fn into_single<Resp: Message + Default>(self) -> Result<Response<Resp>, Status> {
        match self {
            StreamAnswer::Single(response) => decode_message(response),
            StreamAnswer::Stream(_) => Err(Status::internal(
                "a tower service answered a client-streaming call with a stream",
            )),
        }
    }
}

/// A channel carries streaming calls as a tower service: always ready (a call waits for a
/// connection within its own deadline), the messages of its answer still encoded.
impl Service<StreamCall> for Channel {
    type Response = StreamAnswer;
    type Error = Status;
    type Future = BoxFuture<'static, Result<StreamAnswer, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: StreamCall) -> Self::Future {
        let StreamCall {
            method,
            shape,
            request,
        } = call;
        match shape {
            StreamShape::Client => self
                .client_streaming_encoded(method, request)
                .map_ok(StreamAnswer::Single)
                .boxed(),
            // A server-streaming call is a stream of one request message.
            StreamShape::Server | StreamShape::Bidirectional => self
                .streaming::<_, SharedBody, Encoded>(method, request)
                .map_ok(StreamAnswer::Stream)
                .boxed(),
        }
    }
}

/// A [`tower::Service`] that carries streaming calls: a [`Channel`], or layers over one.
/// What generated clients' async streaming methods call over.
pub trait StreamService:
    Service<StreamCall, Response = StreamAnswer, Error: Into<BoxError>, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> StreamService for S where
    S: Service<StreamCall, Response = StreamAnswer, Error: Into<BoxError>, Future: Send + 'static>
        + Clone
        + Send
        + 'static
{
}

/// Calls over `service` with `request`: the channel's own path (`on_channel`) over a plain
/// [`Channel`], else the request made into a [`StreamCall`] (`erase`) through the service's
/// stack, its answer taken as `finish` says.
fn call_over<S, R, F, T>(
    service: &S,
    request: R,
    on_channel: impl FnOnce(&Channel, R) -> F,
    erase: impl FnOnce(R) -> StreamCall,
    finish: fn(StreamAnswer) -> Result<T, Status>,
) -> impl Future<Output = Result<T, Status>> + Send + 'static
where
    S: StreamService,
    F: Future<Output = Result<T, Status>> + Send + 'static,
    T: 'static,
{
    match (service as &dyn Any).downcast_ref::<Channel>() {
        Some(channel) => Either::Left(on_channel(channel, request)),
        None => Either::Right(
            service
                .clone()
                .oneshot(erase(request))
                .map_err(status_from_error)
                .map(move |answer| finish(answer?)),
        ),
    }
}

/// Calls the server-streaming `method` with `request` over `service` (what a generated
/// client's method does). Over a plain [`Channel`] the call takes the channel's own path.
pub fn server_streaming<S, Req, Resp>(
    service: &S,
    method: &'static Method,
    request: Request<Req>,
) -> impl Future<Output = Result<Response<Streaming<Resp>>, Status>> + Send + 'static
where
    S: StreamService,
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + 'static,
{
    call_over(
        service,
        request,
        move |channel, request| channel.server_streaming(method, request),
        move |request| {
            let request = request.map(|message| futures::stream::iter(Some(message)));
            StreamCall::new(method, StreamShape::Server, request)
        },
        StreamAnswer::into_stream,
    )
}

/// Calls the client-streaming `method` with `request`'s messages over `service`.
pub fn client_streaming<S, M, Req, Resp>(
    service: &S,
    method: &'static Method,
    request: Request<M>,
) -> impl Future<Output = Result<Response<Resp>, Status>> + Send + 'static
where
    S: StreamService,
    M: Stream<Item = Req> + Send + 'static,
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + 'static,
{
    call_over(
        service,
        request,
        move |channel, request| channel.client_streaming(method, request),
        move |request| StreamCall::new(method, StreamShape::Client, request),
        StreamAnswer::into_single,
    )
}

/// Calls the bidirectional-streaming `method` with `request`'s messages over `service`.
pub fn streaming<S, M, Req, Resp>(
    service: &S,
    method: &'static Method,
    request: Request<M>,
) -> impl Future<Output = Result<Response<Streaming<Resp>>, Status>> + Send + 'static
where
    S: StreamService,
    M: Stream<Item = Req> + Send + 'static,
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + 'static,
{
    call_over(
        service,
        request,
        move |channel, request| channel.streaming(method, request),
        move |request| StreamCall::new(method, StreamShape::Bidirectional, request),
        StreamAnswer::into_stream,
    )
}
