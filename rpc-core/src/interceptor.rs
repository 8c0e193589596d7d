//! Interceptors: code that sees (and may change or refuse) every call's metadata before
//! it goes out (client) or before its handler runs (server), as in tonic.
//!
//! An interceptor gets the call as a `Request<()>`: its metadata, its time budget and, on
//! the server, its peer. It returns the request to go on with (metadata added or removed),
//! or a [`Status`] that ends the call: on the client the call fails with it before anything
//! is sent; on the server the client gets it and the handler never runs.
//!
//! ```
//! use rpc_core::{Request, Status};
//! // Client: add a token to every call.
//! let add_token = |mut request: Request<()>| -> Result<Request<()>, Status> {
//!     request.metadata_mut().insert("authorization", "Bearer s3cr3t").unwrap();
//!     Ok(request)
//! };
//! // Server: refuse calls without it.
//! let check_token = |request: Request<()>| match request.metadata().get("authorization") {
//!     Some(b"Bearer s3cr3t") => Ok(request),
//!     _ => Err(Status::unauthenticated("no valid token")),
//! };
//! // channel.with_interceptor(add_token), FooServer::with_interceptor(service, check_token)
//! # fn is_interceptor(_: impl rpc_core::Interceptor) {}
//! # is_interceptor(add_token);
//! # is_interceptor(check_token);
//! ```
//!
//! Async interceptors ([`AsyncInterceptor`]) may await (fetch a token, ask a policy
//! service). A blocking call made on a multi-threaded tokio runtime's thread runs them on
//! that runtime; made outside any runtime it runs them on its own thread, where they must
//! not need a reactor; on a current-thread runtime's thread it fails `FAILED_PRECONDITION`
//! (blocking that thread would stop what the interceptor waits for).
//!
//! A call's budget starts after the client's interceptors; a server interceptor runs
//! within the call's deadline, and a panic in it answers `INTERNAL` like a handler's.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::message::Request;
use crate::Status;

/// A synchronous interceptor; any `Fn(Request<()>) -> Result<Request<()>, Status>` is one.
pub trait Interceptor: Send + Sync + 'static {
    /// Looks at a call: the request to go on with, or the status that ends the call.
    fn call(&self, request: Request<()>) -> Result<Request<()>, Status>;
}

impl<F> Interceptor for F
where
    F: Fn(Request<()>) -> Result<Request<()>, Status> + Send + Sync + 'static,
{
    fn call(&self, request: Request<()>) -> Result<Request<()>, Status> {
        self(request)
    }
}

/// An interceptor that may await; any `Fn(Request<()>) -> impl Future<Output =
/// Result<Request<()>, Status>>` is one.
pub trait AsyncInterceptor: Send + Sync + 'static {
    /// Looks at a call: the request to go on with, or the status that ends the call.
    fn call(&self, request: Request<()>) -> BoxFuture<'static, Result<Request<()>, Status>>;
}

impl<F, Fut> AsyncInterceptor for F
where
    F: Fn(Request<()>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Request<()>, Status>> + Send + 'static,
{
    fn call(&self, request: Request<()>) -> BoxFuture<'static, Result<Request<()>, Status>> {
        self(request).boxed()
    }
}

/// One interceptor, either kind.
#[derive(Clone)]
pub(crate) enum Intercept {
    Sync(Arc<dyn Interceptor>),
    Async(Arc<dyn AsyncInterceptor>),
}

impl std::fmt::Debug for Intercept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Intercept::Sync(_) => "Interceptor",
            Intercept::Async(_) => "AsyncInterceptor",
        })
    }
}

impl Intercept {
    pub(crate) async fn run(&self, request: Request<()>) -> Result<Request<()>, Status> {
        match self {
            Intercept::Sync(interceptor) => interceptor.call(request),
            Intercept::Async(interceptor) => interceptor.call(request).await,
        }
    }

    /// Runs the interceptor for a blocking call: an async one on the current tokio
    /// runtime if there is a multi-threaded one (its timers and I/O work), on the calling
    /// thread otherwise (it must then need no reactor).
    pub(crate) fn run_blocking(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let interceptor = match self {
            Intercept::Sync(interceptor) => return interceptor.call(request),
            Intercept::Async(interceptor) => interceptor,
        };
        crate::blocking::run("an async interceptor", interceptor.call(request))
    }
}

/// Runs `intercepts` in order on `request`'s metadata and budget; the message rides along.
pub(crate) async fn intercept_all<T>(
    intercepts: &[Intercept],
    request: Request<T>,
) -> Result<Request<T>, Status> {
    let (mut head, message) = split(request);
    for intercept in intercepts {
        head = intercept.run(head).await?;
    }
    Ok(head.map(|()| message))
}

/// The blocking form of [`intercept_all`].
pub(crate) fn intercept_all_blocking<T>(
    intercepts: &[Intercept],
    request: Request<T>,
) -> Result<Request<T>, Status> {
    let (mut head, message) = split(request);
    for intercept in intercepts {
        head = intercept.run_blocking(head)?;
    }
    Ok(head.map(|()| message))
}

/// The request's head (everything but its message: the interceptors see that) and its
/// message.
fn split<T>(request: Request<T>) -> (Request<()>, T) {
    let mut message = None;
    let head = request.map(|m| message = Some(m));
    (head, message.expect("map calls its closure"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tagging() -> Intercept {
        Intercept::Async(Arc::new(|mut request: Request<()>| async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            request.metadata_mut().insert("x-tag", "1").unwrap();
            Ok(request)
        }))
    }

    /// A blocking call runs an async interceptor on a multi-threaded runtime it is called
    /// from (the interceptor's timer works), and refuses on a current-thread one instead
    /// of blocking the thread that would run it.
    #[test]
    fn blocking_calls_run_async_interceptors_where_they_can() {
        let intercepts = [tagging()];
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let tagged = multi
            .block_on(async {
                tokio::spawn(async move { intercept_all_blocking(&intercepts, Request::new(7)) })
                    .await
            })
            .unwrap()
            .unwrap();
        assert_eq!(tagged.metadata().get("x-tag"), Some(&b"1"[..]));
        assert_eq!(tagged.into_inner(), 7);

        let single = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let refused = single
            .block_on(async { intercept_all_blocking(&[tagging()], Request::new(7)) })
            .unwrap_err();
        assert_eq!(refused.code(), crate::Code::FailedPrecondition, "{refused}");
    }
}
