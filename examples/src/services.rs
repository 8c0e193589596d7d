use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rdma_rpc::{Code, MetadataMap, Request, Response, Status};

use crate::echo::{echo_server, EchoReply, EchoRequest};
use crate::testing::{tester_server, BulkReply, BulkRequest, FailRequest, SleepRequest};

/// Echoes every request.
#[derive(Debug, Default, Clone, Copy)]
pub struct EchoService;

impl echo_server::Echo for EchoService {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        self.echo_inner(request)
    }
}

/// Counters of what the [`Tester`] service saw.
#[derive(Debug, Default)]
pub struct TesterStats {
    /// Sleep handlers started.
    pub sleeps_started: AtomicU64,
    /// Sleep handlers that ran to the end.
    pub sleeps_finished: AtomicU64,
    /// Sleep handlers stopped before their end (cancelled or out of time).
    pub sleeps_dropped: AtomicU64,
}

/// The integration tests' service: echoes, sleeps or fails as asked.
#[derive(Debug, Default, Clone)]
pub struct Tester {
    /// Shared counters.
    pub stats: Arc<TesterStats>,
}

/// Counts a sleep as dropped unless it was disarmed at the end.
struct SleepGuard<'a> {
    stats: &'a TesterStats,
    finished: bool,
}

impl Drop for SleepGuard<'_> {
    fn drop(&mut self) {
        let counter = if self.finished {
            &self.stats.sleeps_finished
        } else {
            &self.stats.sleeps_dropped
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// Request metadata keys that start with this come back as the response's trailers (the
/// [`Tester`]'s `Echo`, and every method of the [`Streamer`](crate::Streamer)).
pub const TRAILER_PREFIX: &str = "trailer-";

/// Request metadata keys that start with this come back as a streaming response's headers
/// (the [`Streamer`](crate::Streamer)'s `Produce`).
pub const HEADER_PREFIX: &str = "header-";

/// What a request asks to be sent back: its metadata entries whose key starts with
/// `prefix` ([`TRAILER_PREFIX`], [`HEADER_PREFIX`]).
pub fn asked(metadata: &MetadataMap, prefix: &str) -> MetadataMap {
    let mut asked = MetadataMap::new();
    for (key, value) in metadata.iter() {
        if key.starts_with(prefix) {
            asked
                .insert(key, value)
                .expect("an entry of a valid map is valid");
        }
    }
    asked
}

impl tester_server::Tester for Tester {
    /// Echoes the message and returns the request's metadata as the response's, with the
    /// peer's address (`peer-addr`) and authenticated identity (`peer-identity`) added,
    /// and the trailers asked for ([`TRAILER_PREFIX`]).
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let trailers = asked(request.metadata(), TRAILER_PREFIX);
        let mut metadata = request.metadata().clone();
        if let Some(peer) = request.peer() {
            let added =
                metadata
                    .insert("peer-addr", &peer.addr)
                    .and_then(|()| match &peer.identity {
                        Some(identity) => metadata.insert("peer-identity", identity),
                        None => Ok(()),
                    });
            added.map_err(|e| Status::internal(format!("metadata: {e}")))?;
        }
        let mut response = EchoService.echo_inner(request)?;
        *response.metadata_mut() = metadata;
        *response.trailers_mut() = trailers;
        Ok(response)
    }

    async fn sleep(&self, request: Request<SleepRequest>) -> Result<Response<()>, Status> {
        let duration = request
            .into_inner()
            .duration
            .ok_or_else(|| Status::invalid_argument("duration is required"))?;
        let duration = Duration::try_from(duration)
            .map_err(|e| Status::invalid_argument(format!("bad duration: {e}")))?;
        self.stats.sleeps_started.fetch_add(1, Ordering::SeqCst);
        let mut guard = SleepGuard {
            stats: &self.stats,
            finished: false,
        };
        tokio::time::sleep(duration).await;
        guard.finished = true;
        Ok(Response::new(()))
    }

    /// Fails with the status asked for: its code, message and details, and the request's
    /// metadata as its metadata.
    async fn fail(&self, request: Request<FailRequest>) -> Result<Response<()>, Status> {
        let metadata = request.metadata().clone();
        let FailRequest {
            code,
            message,
            details,
        } = request.into_inner();
        let code = u16::try_from(code)
            .ok()
            .and_then(Code::from_wire)
            .ok_or_else(|| Status::invalid_argument(format!("{code} is not a status code")))?;
        Err(Status::with_details_and_metadata(
            code, message, details, metadata,
        ))
    }

    async fn bulk(&self, request: Request<BulkRequest>) -> Result<Response<BulkReply>, Status> {
        let BulkRequest {
            reply_len,
            seed,
            payload,
            delay,
        } = request.into_inner();
        let reply_len = usize::try_from(reply_len)
            .map_err(|_| Status::invalid_argument("reply_len does not fit memory"))?;
        if let Some(delay) = delay {
            self.sleep(Request::new(SleepRequest {
                duration: Some(delay),
            }))
            .await?;
        }
        Ok(Response::new(BulkReply {
            matched: payload[..] == bulk_pattern(payload.len(), seed)[..],
            received: payload.len() as u64,
            payload: bulk_pattern(reply_len, seed).into(),
        }))
    }

    async fn panic(&self, _request: Request<()>) -> Result<Response<()>, Status> {
        panic!("the Tester was asked to panic")
    }

    async fn now(&self, _request: Request<()>) -> Result<Response<prost_types::Timestamp>, Status> {
        Ok(Response::new(SystemTime::now().into()))
    }
}

impl EchoService {
    fn echo_inner(self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let EchoRequest { payload, seq } = request.into_inner();
        Ok(Response::new(EchoReply { payload, seq }))
    }
}

/// `len` bytes of test pattern for `seed`: 64 KiB blocks of a seeded byte sequence, each
/// starting with its block index, so that lost, repeated or misplaced blocks show. Built
/// with block copies, fast even for a GiB in a debug build.
pub fn bulk_pattern(len: usize, seed: u64) -> Vec<u8> {
    const BLOCK: usize = 64 * 1024;
    let block: Vec<u8> = (0..BLOCK)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed) as u8)
        .collect();
    let mut out = Vec::with_capacity(len);
    let mut index = 0u64;
    while out.len() < len {
        let start = out.len();
        let take = BLOCK.min(len - start);
        out.extend_from_slice(&block[..take]);
        let tag = (index ^ seed).to_le_bytes();
        let tagged = tag.len().min(take);
        out[start..start + tagged].copy_from_slice(&tag[..tagged]);
        index += 1;
    }
    out
}
