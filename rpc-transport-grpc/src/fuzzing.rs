//! Entry points for the fuzz targets (`rpc-fuzz`'s `grpc_request`): the parsers a gRPC
//! peer's bytes reach, without HTTP/2 around them. Not a public API.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame};
use rpc_core::{MetadataMap, Status};

use crate::codec::{MessageReader, ReadBudget};

/// A body that yields its chunks, then ends.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// The messages of a request body that arrives as `chunks`, each at most `limit` bytes,
/// and the status that ended it early, if one did.
pub fn read_messages(chunks: Vec<Bytes>, limit: usize) -> (Vec<Bytes>, Option<Status>) {
    let budget = ReadBudget::new(usize::MAX / 2, "request", "fuzzing");
    let mut reader = MessageReader::new(Chunks(chunks.into()), limit, budget);
    let mut cx = Context::from_waker(Waker::noop());
    let mut messages = Vec::new();
    loop {
        match reader.poll_next(&mut cx) {
            Poll::Ready(Ok(Some(message))) => messages.push(message),
            Poll::Ready(Ok(None)) => return (messages, None),
            Poll::Ready(Err(status)) => return (messages, Some(status)),
            Poll::Pending => unreachable!("the chunks are always ready"),
        }
    }
}

/// The headers HTTP/2 would deliver from `pairs` (those it cannot carry left out).
pub fn headers(pairs: &[(&[u8], &[u8])]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            map.append(name, value);
        }
    }
    map
}

/// A request's metadata and time budget, as the server reads them from `headers`.
pub fn request_metadata(
    headers: &HeaderMap,
) -> (
    Result<MetadataMap, Status>,
    Result<Option<Duration>, Status>,
) {
    (
        crate::headers::metadata_from(headers),
        crate::headers::timeout_from(headers),
    )
}

/// `metadata` as a response's headers, read back as a client reads them.
pub fn round_trip(metadata: &MetadataMap) -> Result<MetadataMap, Status> {
    let mut headers = HeaderMap::new();
    crate::headers::add_metadata(&mut headers, metadata);
    crate::headers::metadata_from(&headers)
}
