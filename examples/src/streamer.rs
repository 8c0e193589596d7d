//! [`Streamer`]: the streaming service of the integration tests and benchmarks.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use rdma_rpc::{Code, Request, Response, Status, Streaming};

use crate::streaming::{streamer_server, Chunk, ConsumeSummary, ProduceRequest};
use crate::{asked, bulk_pattern, HEADER_PREFIX, TRAILER_PREFIX};

/// Request metadata for `Consume`: answer after this many chunks, reading no more.
pub const STOP_AFTER: &str = "stop-after";

/// Request metadata for `Chat`: fail at once with this gRPC status code (and the message
/// "asked to fail"), as the gRPC interop suite's `status_code_and_message` case does.
pub const FAIL_WITH: &str = "fail-with";

/// Counters of what the [`Streamer`] saw.
#[derive(Debug, Default)]
pub struct StreamerStats {
    /// Chunks handed to the transport by `Produce` streams.
    pub produced: AtomicU64,
    /// `Produce` streams dropped before their end (the call was cancelled or failed).
    pub produce_dropped: AtomicU64,
    /// Chunks `Consume` and `Chat` read.
    pub consumed: AtomicU64,
}

/// Produces, consumes and echoes streams of [`Chunk`]s.
#[derive(Debug, Default, Clone)]
pub struct Streamer {
    /// Shared counters.
    pub stats: Arc<StreamerStats>,
}

/// A boxed stream of chunks, as the handlers answer.
pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<Chunk, Status>> + Send>>;

/// Counts a `Produce` stream as dropped unless it ran to its end.
struct ProduceGuard {
    stats: Arc<StreamerStats>,
    finished: bool,
}

impl ProduceGuard {
    /// The stream ran to its end.
    fn disarm(&mut self) {
        self.finished = true;
    }
}

impl Drop for ProduceGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.stats.produce_dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl streamer_server::Streamer for Streamer {
    type ProduceStream = ChunkStream;
    type ChatStream = ChunkStream;

    async fn produce(
        &self,
        request: Request<ProduceRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let headers = asked(request.metadata(), HEADER_PREFIX);
        let trailers = asked(request.metadata(), TRAILER_PREFIX);
        let ask = request.into_inner();
        let payload = Bytes::from(bulk_pattern(ask.size as usize, 0));
        let interval = ask.interval.map(|d| {
            Duration::new(
                d.seconds.max(0) as u64,
                d.nanos.clamp(0, 999_999_999) as u32,
            )
        });
        let fail = (ask.fail_code != 0).then(|| {
            let code = Code::from_wire(ask.fail_code as u16).unwrap_or(Code::Unknown);
            (ask.fail_after, code)
        });
        // Chunks until the end or the asked failure (at index `after`, if within the count).
        let failure = fail.filter(|(after, _)| *after <= ask.count);
        let last = failure.map_or(ask.count, |(after, _)| after);
        let failure = failure.map(|(after, code)| {
            let details = Bytes::copy_from_slice(&after.to_le_bytes());
            Err(Status::with_details(
                code,
                format!("failed after {after} chunks"),
                details,
            ))
        });
        let stats = self.stats.clone();
        let chunks = futures::stream::iter(0..last)
            .map(move |index| {
                Ok(Chunk {
                    index,
                    payload: payload.clone(),
                })
            })
            .chain(futures::stream::iter(failure));
        let count = move |chunk: &Result<Chunk, Status>| {
            if chunk.is_ok() {
                stats.produced.fetch_add(1, Ordering::Relaxed);
            }
        };
        let mut chunks: ChunkStream = match interval {
            Some(pause) => Box::pin(
                chunks
                    .then(move |chunk| async move {
                        tokio::time::sleep(pause).await;
                        chunk
                    })
                    .inspect(count),
            ),
            None => Box::pin(chunks.inspect(count)),
        };
        // Lives as long as the stream; disarmed when the stream ends.
        let mut guard = ProduceGuard {
            stats: self.stats.clone(),
            finished: false,
        };
        let counted = futures::stream::poll_fn(move |cx| {
            let next = chunks.poll_next_unpin(cx);
            if let std::task::Poll::Ready(None) = next {
                guard.disarm();
            }
            next
        });
        let mut response = Response::from_parts(headers, Box::pin(counted) as ChunkStream);
        *response.trailers_mut() = trailers;
        Ok(response)
    }

    async fn consume(
        &self,
        request: Request<Streaming<Chunk>>,
    ) -> Result<Response<ConsumeSummary>, Status> {
        let stop_after = request
            .metadata()
            .get(STOP_AFTER)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        let trailers = asked(request.metadata(), TRAILER_PREFIX);
        let mut chunks = request.into_inner();
        let mut summary = ConsumeSummary {
            in_order: true,
            ..ConsumeSummary::default()
        };
        let mut pattern = Bytes::new();
        while summary.chunks < stop_after {
            let Some(chunk) = chunks.message().await? else {
                break;
            };
            self.stats.consumed.fetch_add(1, Ordering::Relaxed);
            if chunk.payload.len() != pattern.len() {
                pattern = Bytes::from(bulk_pattern(chunk.payload.len(), 0));
            }
            summary.in_order &= chunk.index == summary.chunks && chunk.payload == pattern;
            summary.chunks += 1;
            summary.bytes += chunk.payload.len() as u64;
        }
        let mut response = Response::new(summary);
        *response.trailers_mut() = trailers;
        Ok(response)
    }

    async fn chat(
        &self,
        request: Request<Streaming<Chunk>>,
    ) -> Result<Response<ChunkStream>, Status> {
        let fail_with = request
            .metadata()
            .get(FAIL_WITH)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u16>().ok());
        let trailers = asked(request.metadata(), TRAILER_PREFIX);
        if let Some(code) = fail_with {
            let code = Code::from_wire(code).unwrap_or(Code::Unknown);
            return Err(Status::with_metadata(code, "asked to fail", trailers));
        }
        let stats = self.stats.clone();
        let echoed = request.into_inner().inspect(move |_| {
            stats.consumed.fetch_add(1, Ordering::Relaxed);
        });
        let mut response = Response::new(Box::pin(echoed) as ChunkStream);
        *response.trailers_mut() = trailers;
        Ok(response)
    }
}
