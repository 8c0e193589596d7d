//! gRPC's message framing over an HTTP/2 body: each message after a 5-byte prefix (a
//! compressed flag, then its length as a big-endian u32).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Body;
use rpc_core::Status;

/// Bytes before each message: the compressed flag and the length.
pub(crate) const PREFIX_LEN: usize = 5;

/// Writes the prefix of an uncompressed message of `len` bytes.
pub(crate) fn put_prefix(dst: &mut [u8], len: usize) {
    dst[0] = 0;
    dst[1..PREFIX_LEN].copy_from_slice(&(len as u32).to_be_bytes());
}

/// `message` after its prefix, in one buffer (tests and small messages).
pub(crate) fn framed(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(PREFIX_LEN + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

/// Bytes a connection's readers hold, against its bound (`GrpcServerConfig::read_budget`).
#[derive(Debug, Clone)]
pub(crate) struct ReadBudget {
    held: Arc<AtomicUsize>,
    limit: usize,
    /// Which messages the connection reads (`request`, `response`), for errors.
    what: &'static str,
    /// The setting that sets `limit`, for errors.
    knob: &'static str,
}

impl ReadBudget {
    /// `limit` bytes of `what` messages (`request`, `response`), set by `knob`.
    pub(crate) fn new(limit: usize, what: &'static str, knob: &'static str) -> Self {
        ReadBudget {
            held: Arc::new(AtomicUsize::new(0)),
            limit,
            what,
            knob,
        }
    }

    /// Takes `n` bytes, unless that would pass the limit.
    fn take(&self, n: usize) -> Result<(), Status> {
        let before = self.held.fetch_add(n, Ordering::AcqRel);
        if before + n <= self.limit {
            return Ok(());
        }
        self.held.fetch_sub(n, Ordering::AcqRel);
        Err(Status::resource_exhausted(format!(
            "this connection holds {before} bytes of {} messages still arriving, and {n} \
             more would pass its read budget of {} bytes ({})",
            self.what, self.limit, self.knob
        )))
    }

    fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// Reads the messages of a request body, each at most `limit` bytes. What arrives is kept
/// as the body's own chunks until a message is whole: a message within one chunk is a
/// view of it; one spread over several is copied once, into a buffer of its size, after
/// all its bytes arrived. A message declared larger than `limit` fails at its prefix,
/// before any of it is kept. What it holds counts against its connection's
/// [`ReadBudget`] until the message is taken, or the reader dropped.
#[derive(Debug)]
pub(crate) struct MessageReader<B> {
    body: B,
    chunks: VecDeque<Bytes>,
    /// Bytes in `chunks`.
    held: usize,
    limit: usize,
    budget: ReadBudget,
    ended: bool,
    /// The body's trailers, once they came (a response's status).
    trailers: Option<http::HeaderMap>,
}

impl<B> Drop for MessageReader<B> {
    fn drop(&mut self) {
        self.budget.give_back(self.held);
    }
}

impl<B> MessageReader<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    /// Reads `body`'s messages, refusing any over `limit` bytes, holding what arrives
    /// against `budget`.
    pub(crate) fn new(body: B, limit: usize, budget: ReadBudget) -> Self {
        MessageReader {
            body,
            chunks: VecDeque::new(),
            held: 0,
            limit,
            budget,
            ended: false,
            trailers: None,
        }
    }

    /// The body's trailers, if it ended with some.
    pub(crate) fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        self.trailers.take()
    }

    /// The next message; `None` once the body ended between messages.
    pub(crate) fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, Status>> {
        loop {
            if let Some(message) = self.take_message()? {
                return Poll::Ready(Ok(Some(message)));
            }
            if self.ended {
                if self.held == 0 {
                    return Poll::Ready(Ok(None));
                }
                return Poll::Ready(Err(Status::internal(format!(
                    "the request body ended inside a message ({} bytes of it arrived)",
                    self.held
                ))));
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                None => self.ended = true,
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if !data.is_empty() {
                            self.budget.take(data.len())?;
                            self.held += data.len();
                            self.chunks.push_back(data);
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.trailers = Some(trailers);
                        }
                    }
                },
                Some(Err(e)) => return Poll::Ready(Err(body_failed(&e, self.budget.what))),
            }
        }
    }

    /// The next message, once it is whole.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, Status> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// The one message of a body that carries one, if it carries any; more than one
    /// fails.
    pub(crate) async fn single(&mut self) -> Result<Option<Bytes>, Status> {
        let Some(message) = self.next().await? else {
            return Ok(None);
        };
        match self.next().await? {
            None => Ok(Some(message)),
            Some(_) => Err(Status::internal(format!(
                "the method has one {} message, but the body holds more",
                self.budget.what
            ))),
        }
    }

    fn take_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.held < PREFIX_LEN {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX_LEN];
        self.copy_front(&mut prefix);
        match prefix[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "a compressed message, with no grpc-encoding agreed (identity only)",
                ))
            }
            flag => {
                return Err(Status::internal(format!(
                    "a message whose compressed flag is {flag} (0 or 1 expected)"
                )))
            }
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.limit {
            return Err(Status::message_too_large(
                &format!("{} message", self.budget.what),
                len as u64,
                self.limit as u64,
            ));
        }
        if self.held < PREFIX_LEN + len {
            return Ok(None);
        }
        self.advance(PREFIX_LEN);
        Ok(Some(self.split_front(len)))
    }

    /// Copies the first `dst.len()` bytes held (there are that many) without taking them.
    fn copy_front(&self, dst: &mut [u8]) {
        let mut at = 0;
        for chunk in &self.chunks {
            let n = chunk.len().min(dst.len() - at);
            dst[at..at + n].copy_from_slice(&chunk[..n]);
            at += n;
            if at == dst.len() {
                return;
            }
        }
    }

    fn advance(&mut self, mut n: usize) {
        self.held -= n;
        self.budget.give_back(n);
        while n > 0 {
            let front = self.chunks.front_mut().expect("held bytes are in chunks");
            if front.len() > n {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.chunks.pop_front();
        }
    }

    /// Takes the first `len` bytes held (there are that many).
    fn split_front(&mut self, len: usize) -> Bytes {
        if len == 0 {
            return Bytes::new();
        }
        let front = self.chunks.front_mut().expect("held bytes are in chunks");
        if front.len() >= len {
            let message = front.split_to(len);
            if front.is_empty() {
                self.chunks.pop_front();
            }
            self.held -= len;
            self.budget.give_back(len);
            return message;
        }
        let mut message = BytesMut::with_capacity(len);
        while message.len() < len {
            let front = self.chunks.front_mut().expect("held bytes are in chunks");
            let n = front.len().min(len - message.len());
            message.put_slice(&front[..n]);
            self.advance(n);
        }
        message.freeze()
    }
}

/// The status a body that failed ends its call with: as gRPC maps the HTTP/2 reset that
/// ended it (`CANCEL` is `CANCELLED`, `REFUSED_STREAM` `UNAVAILABLE`, `ENHANCE_YOUR_CALM`
/// `RESOURCE_EXHAUSTED`, `INADEQUATE_SECURITY` `PERMISSION_DENIED`, any other `INTERNAL`),
/// or `UNAVAILABLE` if the connection failed.
fn body_failed(e: &(dyn std::error::Error + 'static), what: &str) -> Status {
    let mut source = Some(e);
    let mut reason = None;
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            reason = h2.reason();
            break;
        }
        source = err.source();
    }
    let message = format!("the {what} body failed: {e}");
    let code = match reason {
        None => rpc_core::Code::Unavailable,
        Some(h2::Reason::CANCEL | h2::Reason::NO_ERROR) => rpc_core::Code::Cancelled,
        Some(h2::Reason::REFUSED_STREAM) => rpc_core::Code::Unavailable,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => rpc_core::Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => rpc_core::Code::PermissionDenied,
        Some(_) => rpc_core::Code::Internal,
    };
    Status::new(code, message)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::task::Waker;

    use http_body::Frame;
    use rpc_core::Code;

    use super::*;

    /// A body that yields `chunks`, then ends.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
        }
    }

    fn read_all(chunks: Vec<Bytes>, limit: usize) -> Result<Vec<Bytes>, Status> {
        let budget = ReadBudget::new(usize::MAX / 2, "request", "the test's");
        let mut reader = MessageReader::new(Chunks(chunks.into()), limit, budget.clone());
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        loop {
            match reader.poll_next(&mut cx) {
                Poll::Ready(Ok(Some(m))) => out.push(m),
                Poll::Ready(Ok(None)) => {
                    assert_eq!(budget.held(), 0, "every byte held was given back");
                    return Ok(out);
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => unreachable!("the test body is always ready"),
            }
        }
    }

    #[test]
    fn messages_whole_split_and_empty() {
        let mut wire = BytesMut::new();
        for m in [&b"hello"[..], b"", b"world!"] {
            wire.put_slice(&framed(m));
        }
        let wire = wire.freeze();
        let expected = vec![Bytes::from("hello"), Bytes::new(), Bytes::from("world!")];
        assert_eq!(read_all(vec![wire.clone()], 64).unwrap(), expected);
        // Every split point, and one byte at a time.
        for at in 0..wire.len() {
            let parts = vec![wire.slice(..at), wire.slice(at..)];
            assert_eq!(read_all(parts, 64).unwrap(), expected, "split at {at}");
        }
        let bytes: Vec<Bytes> = (0..wire.len()).map(|i| wire.slice(i..i + 1)).collect();
        assert_eq!(read_all(bytes, 64).unwrap(), expected);
    }

    #[test]
    fn a_message_within_a_chunk_is_a_view_of_it() {
        let wire = framed(b"zero copy");
        let message = read_all(vec![wire.clone()], 64).unwrap().remove(0);
        assert_eq!(message.as_ptr(), wire[PREFIX_LEN..].as_ptr());
    }

    #[test]
    fn a_message_over_the_limit_fails_at_its_prefix() {
        let mut prefix = [0u8; PREFIX_LEN];
        put_prefix(&mut prefix, 1 << 30);
        let err = read_all(vec![Bytes::copy_from_slice(&prefix)], 1024).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("1073741824"), "{err}");
        assert!(read_all(vec![framed(&[7; 1024])], 1024).is_ok());
    }

    #[test]
    fn the_connection_budget_bounds_what_readers_hold() {
        let budget = ReadBudget::new(100, "request", "the test's");
        let mut cx = Context::from_waker(Waker::noop());
        let wire = framed(&[1; 80]);
        // A first reader holds 60 bytes of its message, still arriving.
        let first = Chunks(vec![wire.slice(..60)].into());
        let mut first = MessageReader::new(first, 1024, budget.clone());
        let _ = first.poll_next(&mut cx);
        assert_eq!(budget.held(), 60);
        // A second whose chunk would take the connection past 100 fails, holding nothing.
        let second = Chunks(vec![wire.clone()].into());
        let mut second = MessageReader::new(second, 1024, budget.clone());
        let Poll::Ready(Err(err)) = second.poll_next(&mut cx) else {
            panic!("the second reader passed the budget")
        };
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(err.message().contains("read budget of 100 bytes"), "{err}");
        assert_eq!(budget.held(), 60);
        // Dropping the first gives its bytes back; the second's message now fits.
        drop(first);
        assert_eq!(budget.held(), 0);
        let third = Chunks(vec![wire].into());
        let mut third = MessageReader::new(third, 1024, budget.clone());
        let Poll::Ready(Ok(Some(message))) = third.poll_next(&mut cx) else {
            panic!("a lone message within the budget was refused")
        };
        assert_eq!(message.len(), 80);
        assert_eq!(budget.held(), 0, "a message taken leaves the budget");
    }

    #[test]
    fn compressed_truncated_and_bad_flags() {
        let mut compressed = framed(b"x").to_vec();
        compressed[0] = 1;
        let err = read_all(vec![compressed.into()], 64).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(err.message().contains("compressed"), "{err}");
        let mut bad = framed(b"x").to_vec();
        bad[0] = 9;
        let err = read_all(vec![bad.into()], 64).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        let wire = framed(b"cut short");
        let err = read_all(vec![wire.slice(..8)], 64).unwrap_err();
        assert!(err.message().contains("ended inside a message"), "{err}");
    }
}
