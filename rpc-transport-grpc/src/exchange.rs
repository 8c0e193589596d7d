//! One call of a `grpc://` client: its HTTP/2 request sent, and what comes back turned into
//! our frames for the channel.

use bytes::Bytes;
use hyper::client::conn::http2::SendRequest;
use rpc_core::frame::InboundFrame;
use rpc_core::{Code, Flags, FrameKind, Header, MetadataMap, ResponseMetadata, Status};

use crate::body::ReplyBody;
use crate::codec::MessageReader;
use crate::conn::{inbound_frame, GrpcConn};
use crate::headers::{metadata_from, status_of, status_of_http};
use crate::pump::{pump, Ending};
use std::sync::Arc;

/// What an exchange needs of its call.
#[derive(Debug)]
pub(crate) struct Exchange {
    pub(crate) link: Arc<GrpcConn>,
    pub(crate) id: u64,
    pub(crate) method_id: u32,
    /// The channel takes one `Response` (unary and client-streaming calls), not the stream
    /// shape (headers, messages, trailers).
    pub(crate) answers_once: bool,
    /// Largest response message.
    pub(crate) limit: usize,
}

/// Sends `request` and hands what comes back to the channel; the call is forgotten here
/// once its end went up.
pub(crate) async fn exchange(
    call: Exchange,
    mut sender: SendRequest<ReplyBody>,
    request: http::Request<ReplyBody>,
) {
    let sent = async {
        sender.ready().await?;
        sender.send_request(request).await
    };
    match sent.await {
        Ok(response) => call.answer(response).await,
        Err(e) => call.respond(&Status::unavailable(format!("{}: {e}", call.link.peer))),
    }
    call.link.end_call(call.id, false);
}

impl Exchange {
    async fn answer(&self, response: http::Response<hyper::body::Incoming>) {
        let (parts, body) = response.into_parts();
        if parts.status != http::StatusCode::OK {
            return self.respond(&status_of_http(parts.status));
        }
        if let Some(status) = status_of(&parts.headers) {
            // Trailers-Only: the headers end the call.
            return match status.code() {
                Code::Ok if self.answers_once => self.respond(&Status::internal(
                    "the server ended the call without its response message",
                )),
                Code::Ok => {
                    self.deliver(self.headers(&MetadataMap::new()));
                    self.deliver(trailers_frame(self.id, 1, &status));
                }
                _ => self.respond(&status),
            };
        }
        let metadata = match metadata_from(&parts.headers) {
            Ok(metadata) => metadata,
            Err(e) => return self.respond(&Status::internal(format!("response {}", e.message()))),
        };
        let mut reader = MessageReader::new(body, self.limit, self.link.read_budget.clone());
        if self.answers_once {
            let message = match reader.single().await {
                Ok(message) => message,
                Err(status) => return self.respond(&status),
            };
            let status = ended_with(&mut reader);
            let Some(message) = message else {
                // No message: an error status says why (after headers, as a handler that
                // sent its headers first ends); an OK one breaks the method's shape.
                return self.respond(&match status.code() {
                    Code::Ok => {
                        Status::internal("the server ended the call without its response message")
                    }
                    _ => status,
                });
            };
            if status.code() != Code::Ok {
                return self.respond(&status);
            }
            return self.deliver(self.unary(&metadata, status.metadata(), message));
        }
        self.deliver(self.headers(&metadata));
        match pump(&self.link, self.id, &mut reader).await {
            Ending::Ended(seq) => {
                self.deliver(trailers_frame(self.id, seq, &ended_with(&mut reader)))
            }
            Ending::Failed(status, seq) => self.deliver(trailers_frame(self.id, seq, &status)),
            Ending::Over => {}
        }
    }

    /// Ends the call before any headers went up: a `Response` with `status`.
    fn respond(&self, status: &Status) {
        let mut header = Header::new(FrameKind::Response, self.id);
        header.method_id = self.method_id;
        self.deliver(status_frame(header, status));
    }

    /// A stream's headers.
    fn headers(&self, metadata: &MetadataMap) -> InboundFrame {
        let mut header = Header::new(FrameKind::Response, self.id);
        header.method_id = self.method_id;
        header.flags = Flags::STREAM;
        inbound_frame(header, metadata, Bytes::new())
    }

    /// A successful unary answer: headers and trailers in one metadata section.
    fn unary(&self, headers: &MetadataMap, trailers: &MetadataMap, message: Bytes) -> InboundFrame {
        let mut header = Header::new(FrameKind::Response, self.id);
        header.method_id = self.method_id;
        inbound_frame(header, &ResponseMetadata { headers, trailers }, message)
    }

    fn deliver(&self, frame: InboundFrame) {
        self.link.deliver(frame);
    }
}

/// The status the body's trailers end the call with (`INTERNAL` if they say none).
fn ended_with<B>(reader: &mut MessageReader<B>) -> Status
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    reader
        .take_trailers()
        .as_ref()
        .and_then(status_of)
        .unwrap_or_else(|| Status::internal("the server ended the call without a grpc-status"))
}

/// The `Trailers` frame ending a stream with `status` after the messages before `seq`.
fn trailers_frame(id: u64, seq: u32, status: &Status) -> InboundFrame {
    status_frame(Header::stream(FrameKind::Trailers, id, seq), status)
}

/// `header` (a response or trailers) carrying `status` as our frames do: its code, its
/// message as payload, its metadata and details as metadata.
fn status_frame(mut header: Header, status: &Status) -> InboundFrame {
    static NO_TRAILERS: MetadataMap = MetadataMap::new();
    header.status = status.code();
    let wire = status.to_wire(&NO_TRAILERS);
    inbound_frame(
        header,
        &*wire.metadata,
        Bytes::copy_from_slice(wire.message.as_bytes()),
    )
}
