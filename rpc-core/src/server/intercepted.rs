//! [`InterceptedService`]: a service whose calls pass an interceptor first.

use std::sync::Arc;

use super::{HandlerFuture, MethodDescriptor, NamedService, ServerCall, Service};
use crate::interceptor::{AsyncInterceptor, Intercept, Interceptor};
use crate::message::Request;

/// A service whose calls pass an interceptor before its handlers run (tonic's
/// `InterceptedService`); generated servers make one with `FooServer::with_interceptor`.
pub struct InterceptedService<S> {
    inner: Arc<S>,
    intercept: Intercept,
}

impl<S> std::fmt::Debug for InterceptedService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterceptedService")
            .field("intercept", &self.intercept)
            .finish_non_exhaustive()
    }
}

impl<S: Service> InterceptedService<S> {
    /// `inner`, its calls first passing `interceptor`.
    pub fn new(inner: S, interceptor: impl Interceptor) -> Self {
        InterceptedService {
            inner: Arc::new(inner),
            intercept: Intercept::Sync(Arc::new(interceptor)),
        }
    }

    /// `inner`, its calls first passing the async `interceptor`.
    pub fn new_async(inner: S, interceptor: impl AsyncInterceptor) -> Self {
        InterceptedService {
            inner: Arc::new(inner),
            intercept: Intercept::Async(Arc::new(interceptor)),
        }
    }
}

impl<S: NamedService> NamedService for InterceptedService<S> {
    const NAME: &'static str = S::NAME;
}

impl<S: Service> Service for InterceptedService<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn methods(&self) -> &'static [MethodDescriptor] {
        self.inner.methods()
    }

    fn call(&self, method_id: u32, call: ServerCall) -> HandlerFuture {
        let (inner, intercept) = (self.inner.clone(), self.intercept.clone());
        // In the handler's future, so the interceptor runs where a handler does: inside
        // the server's runtime, its panic caught (INTERNAL), its time within the deadline.
        HandlerFuture::new(async move {
            let mut call = call;
            let mut head =
                Request::from_parts(std::mem::take(&mut call.metadata), (), call.timeout);
            head.peer = call.peer.clone();
            // Only the metadata comes back: the budget is the client's to set.
            call.metadata = intercept.run(head).await?.into_parts().0;
            inner.call(method_id, call).await
        })
    }
}
