//! One gRPC call: an HTTP/2 request turned into our frames for the dispatcher, and the
//! dispatcher's answer turned into the HTTP/2 response.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Body;
use rpc_core::frame::InboundFrame;
use rpc_core::server::MethodKind;
use rpc_core::{Code, Flags, FrameKind, Header, MetadataMap, ResponseMetadata, Status};

use crate::body::ReplyBody;
use crate::codec::MessageReader;
use crate::conn::{inbound_frame, stream_frame, GrpcConn, Reply};
use crate::headers::{
    add_metadata, headers_of, is_grpc, metadata_from, status_headers, timeout_from,
    GRPC_ACCEPT_ENCODING, GRPC_CONTENT_TYPE, GRPC_ENCODING,
};
use crate::pump::{pump, Ending};

/// What a server's calls need of it.
#[derive(Debug)]
pub(crate) struct ServerSide {
    pub(crate) dispatcher: Arc<rpc_core::server::Dispatcher>,
    /// Longest a unary or server-streaming request message may take to arrive.
    pub(crate) request_read_timeout: Duration,
}

/// A call on its way: forgotten when dropped, and cancelled at the dispatcher if its
/// response had not ended (HTTP/2 drops a stream's response when the client resets it).
#[derive(Debug)]
pub(crate) struct CallGuard {
    pub(crate) conn: Arc<GrpcConn>,
    pub(crate) id: u64,
    ended: bool,
}

impl CallGuard {
    /// The response ended as the dispatcher said: nothing to cancel.
    pub(crate) fn finish(&mut self) {
        if !std::mem::replace(&mut self.ended, true) {
            self.conn.end_call(self.id, false);
        }
    }

    /// The response ended on this side: the dispatcher stops the call.
    pub(crate) fn cancel(&mut self) {
        if !std::mem::replace(&mut self.ended, true) {
            self.conn.end_call(self.id, true);
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Serves one HTTP/2 request as a gRPC call.
pub(crate) async fn serve<B>(
    conn: Arc<GrpcConn>,
    server: Arc<ServerSide>,
    request: http::Request<B>,
) -> Result<http::Response<ReplyBody>, Infallible>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let not_grpc = if request.method() != Method::POST {
        Some(StatusCode::METHOD_NOT_ALLOWED)
    } else if !is_grpc(request.headers()) {
        Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
    } else {
        None
    };
    if let Some(status) = not_grpc {
        // Not gRPC: HTTP's own answer, as gRPC's protocol asks.
        let mut response = http::Response::new(ReplyBody::Empty);
        *response.status_mut() = status;
        return Ok(response);
    }
    Ok(match start(conn, &server, request).await {
        Ok(response) => response,
        Err(status) => trailers_only(headers_of(&status)),
    })
}

async fn start<B>(
    conn: Arc<GrpcConn>,
    server: &ServerSide,
    request: http::Request<B>,
) -> Result<http::Response<ReplyBody>, Status>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let method = server
        .dispatcher
        .method(path)
        .ok_or_else(|| Status::unimplemented(format!("unknown method {path}")))?;
    if let Some(encoding) = parts.headers.get(GRPC_ENCODING) {
        if encoding != "identity" {
            return Err(Status::unimplemented(format!(
                "grpc-encoding {encoding:?}: this server takes identity only"
            )));
        }
    }
    let started = Instant::now();
    let metadata = metadata_from(&parts.headers)?;
    let timeout = timeout_from(&parts.headers)?;
    let limit = server.dispatcher.config().max_message_size;
    let mut reader = MessageReader::new(body, limit, conn.read_budget.clone());
    let mut header = Header::new(FrameKind::Request, 0);
    header.method_id = method.id;
    if method.kind.is_streaming() {
        header.flags = Flags::STREAM;
    }
    // Checked before the call exists: a request refused here was never the dispatcher's.
    let mut request = request_frame(header, &metadata)?;
    // A call whose request is one message reads it before the call starts, within its
    // deadline and the read timeout.
    let single = if method.kind.streams_requests() {
        None
    } else {
        Some(read_single(&mut reader, timeout, server.request_read_timeout).await?)
    };
    if let Some(t) = timeout {
        // What is left of the client's budget (at least 1 µs: 0 means none).
        let left = t.saturating_sub(started.elapsed());
        request.header.timeout_us = (left.as_micros() as u64).max(1);
    }
    let mut call = CallGuard {
        id: conn.open_call()?,
        conn: conn.clone(),
        ended: false,
    };
    request.header.call_id = call.id;
    match (method.kind, single) {
        (MethodKind::Unary, Some(message)) => {
            request.header.payload_len = message.len() as u32;
            request.payload = message;
            conn.deliver(request);
        }
        (MethodKind::ServerStreaming, Some(message)) => {
            conn.deliver(request);
            conn.deliver(stream_frame(FrameKind::Message, call.id, 1, message));
            conn.deliver(stream_frame(FrameKind::HalfClose, call.id, 2, Bytes::new()));
        }
        _ => {
            conn.deliver(request);
            let (conn, id) = (conn.clone(), call.id);
            tokio::spawn(async move {
                match pump(&conn, id, &mut reader).await {
                    Ending::Ended(seq) => {
                        conn.deliver(stream_frame(FrameKind::HalfClose, id, seq, Bytes::new()));
                    }
                    Ending::Failed(status, _) => conn.fail_call(id, status),
                    Ending::Over => {}
                }
            });
        }
    }
    let first = std::future::poll_fn(|cx| conn.poll_reply(call.id, cx)).await;
    respond(call_first(&mut call, first), call)
}

/// What the first reply says: headers of a stream, or the whole answer.
enum First {
    /// Headers, a stream's messages to follow.
    Stream(HeaderMap),
    /// A unary answer: headers, the framed message, trailers.
    Unary(HeaderMap, Bytes, HeaderMap),
    /// Only trailers: an error, or an empty stream.
    TrailersOnly(HeaderMap),
}

fn call_first(call: &mut CallGuard, first: Reply) -> Result<First, Status> {
    match first {
        Reply::Frame(frame, framed) => {
            let kind = frame.header.kind;
            if kind == FrameKind::Response && frame.header.flags.contains(Flags::STREAM) {
                let metadata = frame
                    .decode_metadata()
                    .map_err(|e| Status::internal(format!("response {e}")))?;
                let mut headers = HeaderMap::new();
                add_metadata(&mut headers, &metadata);
                return Ok(First::Stream(headers));
            }
            call.finish();
            if kind == FrameKind::Response && frame.header.status == Code::Ok {
                let (metadata, trailers) = ResponseMetadata::decode_from(&frame.metadata)
                    .map_err(|e| Status::internal(format!("response {e}")))?;
                let mut headers = HeaderMap::new();
                add_metadata(&mut headers, &metadata);
                let trailers = status_headers(Code::Ok, b"", &trailers);
                return Ok(First::Unary(headers, framed, trailers));
            }
            Ok(First::TrailersOnly(end_headers(&frame)))
        }
        Reply::Message(_) => {
            call.cancel();
            Err(Status::internal(
                "the server sent a message before its headers",
            ))
        }
        Reply::Failed(status) => {
            call.cancel();
            Err(status)
        }
    }
}

fn respond(
    first: Result<First, Status>,
    call: CallGuard,
) -> Result<http::Response<ReplyBody>, Status> {
    Ok(match first? {
        First::Stream(headers) => grpc_response(headers, ReplyBody::stream(call)),
        First::Unary(headers, message, trailers) => {
            grpc_response(headers, ReplyBody::unary(message, trailers))
        }
        First::TrailersOnly(headers) => trailers_only(headers),
    })
}

/// The headers that end a call as the dispatcher's `Trailers` or error `Response` frame
/// says.
pub(crate) fn end_headers(frame: &InboundFrame) -> HeaderMap {
    match frame.decode_metadata() {
        Ok(metadata) => status_headers(frame.header.status, &frame.payload, &metadata),
        Err(_) => headers_of(&frame.status()),
    }
}

/// A gRPC response with `headers` (the content type, and the one encoding this server
/// takes) and `body`.
fn grpc_response(mut headers: HeaderMap, body: ReplyBody) -> http::Response<ReplyBody> {
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(GRPC_CONTENT_TYPE),
    );
    headers.insert(GRPC_ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let mut response = http::Response::new(body);
    *response.headers_mut() = headers;
    response
}

/// A response of headers only that end the call (gRPC's "Trailers-Only").
fn trailers_only(headers: HeaderMap) -> http::Response<ReplyBody> {
    grpc_response(headers, ReplyBody::Empty)
}

/// The `Request` frame opening a call, without its payload yet; metadata over our bound
/// is refused.
fn request_frame(header: Header, metadata: &MetadataMap) -> Result<InboundFrame, Status> {
    metadata
        .checked_encoded_len()
        .map_err(|e| Status::invalid_argument(format!("request metadata: {e}")))?;
    Ok(inbound_frame(header, metadata, Bytes::new()))
}

/// The one request message, within the call's deadline and `read_timeout`, whichever ends
/// first: past it, `DEADLINE_EXCEEDED` naming which.
async fn read_single<B>(
    reader: &mut MessageReader<B>,
    deadline: Option<Duration>,
    read_timeout: Duration,
) -> Result<Bytes, Status>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (limit, what) = match deadline {
        Some(d) if d < read_timeout => (d, "its deadline"),
        _ => (read_timeout, "the server's request_read_timeout"),
    };
    let single = async {
        reader
            .single()
            .await?
            .ok_or_else(|| Status::internal("the request body ended without its message"))
    };
    tokio::time::timeout(limit, single)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!(
                "the request message did not arrive within {what} of {limit:?}"
            )))
        })
}
