//! What generated servers implement, and the type-erased call they receive.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use prost::Message;

use crate::auth::Peer;
use crate::body::EncodeBody;
use crate::message::{Request, Response};
use crate::metadata::MetadataMap;
use crate::status::Status;

/// A method a service serves: its path and the id derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodDescriptor {
    /// `/package.Service/Method`.
    pub path: &'static str,
    /// [`crate::method_id`] of `path`.
    pub id: u32,
}

impl MethodDescriptor {
    /// The descriptor of `path`.
    pub const fn new(path: &'static str) -> Self {
        MethodDescriptor {
            path,
            id: crate::method_id(path),
        }
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
}

impl ServerCall {
    /// Decodes the request message.
    pub fn decode<M: Message + Default>(self) -> Result<Request<M>, Status> {
        let message = M::decode(self.payload)
            .map_err(|e| Status::internal(format!("failed to decode the request message: {e}")))?;
        let mut request = Request::from_parts(self.metadata, message, self.timeout);
        request.peer = self.peer;
        Ok(request)
    }
}

/// A handler's successful answer, type-erased so any message type can be sent.
pub struct ServerReply {
    /// Response metadata.
    pub metadata: MetadataMap,
    /// The response message, encoded straight into the transport's buffer.
    pub body: Box<dyn EncodeBody>,
}

impl std::fmt::Debug for ServerReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerReply")
            .field("metadata", &self.metadata)
            .field("body_len", &self.body.encoded_len())
            .finish()
    }
}

impl<M: Message + 'static> From<Response<M>> for ServerReply {
    fn from(response: Response<M>) -> Self {
        let (metadata, message) = response.into_parts();
        ServerReply {
            metadata,
            body: Box::new(message),
        }
    }
}

/// A service the server can host; implemented by generated `FooServer` types.
pub trait Service: Send + Sync + 'static {
    /// Fully qualified service name, e.g. `echo.Echo`.
    fn name(&self) -> &'static str;

    /// Every method the service serves.
    fn methods(&self) -> &'static [MethodDescriptor];

    /// Runs method `method_id` on `call`.
    fn call(
        &self,
        method_id: u32,
        call: ServerCall,
    ) -> BoxFuture<'static, Result<ServerReply, Status>>;
}

/// Decodes `call`, runs `handler` on the typed request and erases the response type: the
/// body of every generated unary method.
pub async fn unary<Req, Resp, F, Fut>(call: ServerCall, handler: F) -> Result<ServerReply, Status>
where
    Req: Message + Default,
    Resp: Message + 'static,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
{
    let request = call.decode::<Req>()?;
    Ok(handler(request).await?.into())
}
