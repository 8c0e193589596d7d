//! Calls as a [`tower::Service`] carries them, so tower's layers (timeout, retry with a
//! budget, concurrency limit, rate limit, load shed) compose with generated clients.
//!
//! [`Channel`] is a `Service<UnaryCall>`; so is any stack of layers over it. A generated
//! client is generic over such a service ([`CallService`]):
//!
//! ```ignore
//! let service = tower::ServiceBuilder::new()
//!     .load_shed()
//!     .concurrency_limit(64)
//!     .timeout(Duration::from_millis(50))
//!     .service(channel);
//! let client = EchoClient::new(service);
//! ```
//!
//! Streaming calls go through a service too ([`super::stream_service`]). A layer's own
//! errors reach the caller as a [`Status`] ([`status_from_error`]).

use std::any::Any;
use std::future::Future;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::{BoxFuture, Either};
use prost::Message;
use tower::{BoxError, Service, ServiceExt};

use super::{decode_message, Channel};
use crate::body::{EncodeBody, SharedBody};
use crate::message::{Request, Response};
use crate::observe::{Method, MethodRef};
use crate::Status;

pub use crate::error::status_from_error;

/// A unary call on its way through a [`tower::Service`]: the method and the request, its
/// message type-erased (it still encodes itself straight into the transport's memory).
/// Cheap to clone, so a retry layer can send it again.
#[derive(Clone)]
pub struct UnaryCall {
    method: MethodRef,
    request: Request<SharedBody>,
}

impl std::fmt::Debug for UnaryCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnaryCall")
            .field("method", &self.method.path())
            .field("metadata", self.request.metadata())
            .field("timeout", &self.request.timeout())
            .finish_non_exhaustive()
    }
}

impl UnaryCall {
    /// A call of `method` with `request`.
    pub fn new<M: Message + Send + Sync + 'static>(
        method: impl Into<MethodRef>,
        request: Request<M>,
    ) -> Self {
        UnaryCall {
            method: method.into(),
            request: request.map(SharedBody::new),
        }
    }

    /// The method called.
    pub fn method(&self) -> MethodRef {
        self.method
    }

    /// The request (metadata, time budget; the message is opaque).
    pub fn request(&self) -> &Request<impl EncodeBody> {
        &self.request
    }

    /// The request, to add metadata or change its budget.
    pub fn request_mut(&mut self) -> &mut Request<impl EncodeBody> {
        &mut self.request
    }
}

/// A channel carries unary calls as a tower service: always ready (a call waits for a
/// connection within its own deadline, as [`Channel::unary`] does), the response's
/// message still encoded.
impl Service<UnaryCall> for Channel {
    type Response = Response<Bytes>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Response<Bytes>, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: UnaryCall) -> Self::Future {
        Box::pin(self.unary_encoded(call.method, call.request))
    }
}

/// A [`tower::Service`] that carries unary calls: a [`Channel`], or layers over one. What
/// generated clients call over.
pub trait CallService:
    Service<UnaryCall, Response = Response<Bytes>, Error: Into<BoxError>, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> CallService for S where
    S: Service<
            UnaryCall,
            Response = Response<Bytes>,
            Error: Into<BoxError>,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// Calls `method` with `request` over `service` and awaits the response (what a
/// generated client's unary method does). Over a plain [`Channel`] the call takes the
/// channel's own path: no type erasure, no boxed future.
pub fn unary<S, Req, Resp>(
    service: &S,
    method: &'static Method,
    request: Request<Req>,
) -> impl Future<Output = Result<Response<Resp>, Status>> + Send + 'static
where
    S: CallService,
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + 'static,
{
    match (service as &dyn Any).downcast_ref::<Channel>() {
        Some(channel) => Either::Left(channel.unary(method, request)),
        None => {
            let service = service.clone();
            Either::Right(async move {
                let response = service
                    .oneshot(UnaryCall::new(method, request))
                    .await
                    .map_err(status_from_error)?;
                decode_message(response)
            })
        }
    }
}

/// The blocking form of [`unary`]. Over a plain [`Channel`] it is
/// [`Channel::unary_blocking`]; over other services the call runs as
/// [`crate::interceptor`]'s async interceptors do for blocking calls: on the current
/// multi-threaded tokio runtime, else on the calling thread (so a layer that needs tokio's
/// timer, such as a timeout, needs a multi-threaded runtime there).
pub fn unary_blocking<S, Req, Resp>(
    service: &S,
    method: &'static Method,
    request: Request<Req>,
) -> Result<Response<Resp>, Status>
where
    S: CallService,
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + 'static,
{
    if let Some(channel) = (service as &dyn Any).downcast_ref::<Channel>() {
        return channel.unary_blocking(method, request);
    }
    crate::blocking::run("a tower service", unary(service, method, request))
}
