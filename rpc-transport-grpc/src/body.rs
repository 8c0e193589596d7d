//! The body of a gRPC response, as hyper sends it: nothing (the headers ended the call),
//! a unary answer, or a stream's messages taken from its call as HTTP/2 has room for them.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};

use crate::call::{end_headers, CallGuard};
use crate::conn::{GrpcConn, Reply};
use crate::headers::headers_of;

/// A gRPC response's body.
#[derive(Debug)]
pub(crate) enum ReplyBody {
    /// None: the headers ended the call, or the request was not gRPC.
    Empty,
    /// One message, then the trailers.
    Unary {
        message: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    /// A stream's messages, then its trailers.
    Stream { call: CallGuard, done: bool },
    /// A client's request stream: its messages until the half-close (the call goes on,
    /// for its response).
    Requests {
        conn: Arc<GrpcConn>,
        id: u64,
        done: bool,
    },
}

impl ReplyBody {
    pub(crate) fn unary(message: Bytes, trailers: HeaderMap) -> Self {
        ReplyBody::Unary {
            message: Some(message),
            trailers: Some(trailers),
        }
    }

    pub(crate) fn stream(call: CallGuard) -> Self {
        ReplyBody::Stream { call, done: false }
    }
}

impl Body for ReplyBody {
    type Data = Bytes;
    /// Only a client's request stream fails: its call was cancelled or failed here, and
    /// HTTP/2 resets the stream (`CANCEL`) rather than ending it as if it were whole.
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let frame = match self.get_mut() {
            ReplyBody::Empty => None,
            ReplyBody::Unary { message, trailers } => match message.take() {
                Some(message) => Some(Frame::data(message)),
                None => trailers.take().map(Frame::trailers),
            },
            ReplyBody::Stream { done: true, .. } | ReplyBody::Requests { done: true, .. } => None,
            ReplyBody::Requests { conn, id, done } => match ready!(conn.poll_reply(*id, cx)) {
                Reply::Message(message) => Some(Frame::data(message)),
                // The half-close: the request is whole.
                Reply::Frame(..) => {
                    *done = true;
                    None
                }
                // The call ended here (cancelled, failed, its connection gone).
                Reply::Failed(_) => {
                    *done = true;
                    return Poll::Ready(Some(Err(h2::Error::from(h2::Reason::CANCEL))));
                }
            },
            ReplyBody::Stream { call, done } => {
                let reply = ready!(call.conn.poll_reply(call.id, cx));
                Some(match reply {
                    Reply::Message(message) => Frame::data(message),
                    Reply::Frame(frame, _) => {
                        *done = true;
                        call.finish();
                        Frame::trailers(end_headers(&frame))
                    }
                    Reply::Failed(status) => {
                        *done = true;
                        call.cancel();
                        Frame::trailers(headers_of(&status))
                    }
                })
            }
        };
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplyBody::Empty => true,
            ReplyBody::Unary { message, trailers } => message.is_none() && trailers.is_none(),
            ReplyBody::Stream { done, .. } | ReplyBody::Requests { done, .. } => *done,
        }
    }
}
