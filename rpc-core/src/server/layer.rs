//! Tower layers around every call a server runs ([`ServerBuilder::layer`], as tonic's
//! `Server::builder().layer(...)`): timeouts, concurrency limits, load shedding, or a
//! layer of the application's own, over unary and streaming calls alike.
//!
//! The layers see each call as a [`ServerCall`] (its method, metadata, budget and peer)
//! and answer it with a [`ServerReply`]; the innermost service runs the call's handler. A
//! layer's own error ends the call with the status [`status_from_error`] gives it: a
//! timeout's `DEADLINE_EXCEEDED`, a load shed's `UNAVAILABLE`. A server without layers runs
//! its handlers directly, with nothing of this on the call's path.
//!
//! [`ServerBuilder::layer`]: super::ServerBuilder::layer

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceExt};

use super::router::Router;
use super::{HandlerFuture, ServerCall, ServerReply};
use crate::error::status_from_error;
use crate::Status;

/// What a layer given to [`ServerBuilder::layer`](super::ServerBuilder::layer) wraps: the
/// layers added after it, then the handlers.
pub type CallStack = BoxCloneSyncService<ServerCall, ServerReply, BoxError>;

/// A layer added to a server's builder, kept until the server is built.
pub(crate) type Wrap = Box<dyn FnOnce(CallStack) -> CallStack + Send>;

/// The innermost service of a server's layers: runs the handler of each call's method.
#[derive(Clone)]
struct Handlers {
    router: Arc<Router>,
}

impl tower::Service<ServerCall> for Handlers {
    type Response = ServerReply;
    type Error = Status;
    type Future = HandlerFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ServerCall) -> HandlerFuture {
        let route = call
            .method()
            .and_then(|m| Some((m, self.router.get(m.id)?)));
        match route {
            Some((method, route)) => route.service.call(method.id, call),
            // The dispatcher routed the call before its layers saw it: only a layer that
            // made a call of its own gets here.
            None => HandlerFuture::new(async move {
                Err(Status::unimplemented(format!(
                    "no handler for the method {:?}",
                    call.method().map(|m| m.path)
                )))
            }),
        }
    }
}

/// A server's layers over its handlers.
pub(crate) struct Layers(CallStack);

impl Layers {
    /// `wraps` over the handlers of `router`, the first added outermost (as
    /// `tower::ServiceBuilder` stacks them); `None` without any.
    pub(crate) fn new(router: Arc<Router>, wraps: Vec<Wrap>) -> Option<Layers> {
        if wraps.is_empty() {
            return None;
        }
        let handlers = CallStack::new(Handlers { router }.map_err(BoxError::from));
        Some(Layers(
            wraps
                .into_iter()
                .rev()
                .fold(handlers, |inner, wrap| wrap(inner)),
        ))
    }

    /// Runs `call` through the layers: a clone of the stack waits until it is ready (a
    /// concurrency limit's permit) and takes the call.
    pub(crate) fn call(&self, call: ServerCall) -> HandlerFuture {
        let stack = self.0.clone();
        HandlerFuture::new(async move { stack.oneshot(call).await.map_err(status_from_error) })
    }
}

impl std::fmt::Debug for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layers").finish_non_exhaustive()
    }
}
