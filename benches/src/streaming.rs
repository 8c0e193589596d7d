//! `rpc-bench stream`: messages per second and goodput of one server-streaming call
//! (`rpc.streaming.Streamer/Produce`) over rdma-rpc, and over tonic on TCP loopback for
//! comparison.

use std::time::Duration;

use futures::StreamExt as _;
use rdma_rpc::prelude::*;
use rdma_rpc::{Endpoint, RdmaConfig, ServeOptions};
use rpc_examples::streaming::streamer_client::StreamerClient;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::ProduceRequest;
use serde::{Deserialize, Serialize};

use crate::clock::Instant;
use crate::error::BenchError;

use crate::tonic_echo::message_limit;

/// What one streamed call achieved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamResult {
    /// `tcp` or `rdma` (rdma-rpc), or `tonic`.
    pub transport: String,
    /// Payload bytes per message.
    pub size: usize,
    /// Messages measured (after a warm-up stream of a tenth as many).
    pub messages: u64,
    /// Wall-clock time from the call to its last message, seconds.
    pub elapsed_s: f64,
    /// Messages received per second.
    pub messages_per_sec: f64,
    /// Payload bytes received per second, MiB/s.
    pub goodput_mib_s: f64,
}

impl StreamResult {
    fn new(transport: &str, size: usize, messages: u64, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64().max(1e-9);
        StreamResult {
            transport: transport.to_owned(),
            size,
            messages,
            elapsed_s: secs,
            messages_per_sec: messages as f64 / secs,
            goodput_mib_s: (messages as f64 * size as f64) / secs / (1 << 20) as f64,
        }
    }

    /// One line for people.
    pub fn line(&self) -> String {
        format!(
            "{:<6} {:>9} B x {:>8}: {:>11.0} msgs/s {:>9.1} MiB/s ({:.2} s)",
            self.transport,
            self.size,
            self.messages,
            self.messages_per_sec,
            self.goodput_mib_s,
            self.elapsed_s
        )
    }
}

/// The measured service of rdma-rpc: `Produce` exactly as the tonic baseline's
/// ([`tonic_streamer`]), so that the two runs differ only in the framework (the example
/// [`rpc_examples::Streamer`] also counts what it produces, for the tests).
struct BenchStreamer;

mod bench_streamer {
    use std::pin::Pin;

    use bytes::Bytes;
    use futures::{Stream, StreamExt};
    use rdma_rpc::{Request, Response, Status, Streaming};
    use rpc_examples::streaming::streamer_server::Streamer;
    use rpc_examples::streaming::{Chunk, ConsumeSummary, ProduceRequest};

    type Chunks = Pin<Box<dyn Stream<Item = Result<Chunk, Status>> + Send>>;

    impl Streamer for super::BenchStreamer {
        type ProduceStream = Chunks;
        type ChatStream = Chunks;

        async fn produce(
            &self,
            request: Request<ProduceRequest>,
        ) -> Result<Response<Chunks>, Status> {
            let ask = request.into_inner();
            let payload = Bytes::from(rpc_examples::bulk_pattern(ask.size as usize, 0));
            let chunks = futures::stream::iter(0..ask.count).map(move |index| {
                Ok(Chunk {
                    index,
                    payload: payload.clone(),
                })
            });
            Ok(Response::new(Box::pin(chunks)))
        }

        async fn consume(
            &self,
            _: Request<Streaming<Chunk>>,
        ) -> Result<Response<ConsumeSummary>, Status> {
            Err(Status::unimplemented("not measured"))
        }

        async fn chat(&self, _: Request<Streaming<Chunk>>) -> Result<Response<Chunks>, Status> {
            Err(Status::unimplemented("not measured"))
        }
    }
}

/// Serves the streamer on `url` in this process and streams `messages` chunks of `size`
/// bytes from it (after a warm-up stream), the client granting `window_bytes` of stream
/// window (the default when `None`).
pub fn run_ours(
    url: &Endpoint,
    rdma: RdmaConfig,
    size: usize,
    messages: u64,
    window_bytes: Option<u64>,
) -> Result<StreamResult, BenchError> {
    let window = rdma_rpc::stream::Window {
        bytes: window_bytes.unwrap_or(rdma_rpc::stream::DEFAULT_STREAM_WINDOW.bytes),
        ..rdma_rpc::stream::DEFAULT_STREAM_WINDOW
    };
    let server = Server::builder()
        .max_message_size(message_limit(size))
        .add_service(StreamerServer::new(BenchStreamer))
        .start_with(
            &url.to_string(),
            ServeOptions {
                rdma: rdma.clone(),
                ..Default::default()
            },
        )
        .map_err(|e| BenchError::failed(&format!("serving on {url}"), e))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::failed("creating the tokio runtime", e))?;
    let local = server.local_url().to_owned();
    let transport = crate::ours::transport_name(url);
    runtime.block_on(async move {
        let channel = rdma_rpc::client()
            .max_message_size(message_limit(size))
            .stream_window(window)
            .rdma_config(rdma)
            .connect(&local)
            .await
            .map_err(|e| BenchError::failed(&format!("connecting to {local}"), e))?;
        let client = StreamerClient::new(channel);
        let elapsed = time_streams(size, messages, |count| {
            let client = client.clone();
            let request = ProduceRequest {
                count,
                size: size as u64,
                ..Default::default()
            };
            async move {
                let stream = client
                    .produce(request)
                    .await
                    .map_err(|s| BenchError::failed("opening the stream", s))?
                    .into_inner();
                Ok(received(stream, "streaming", |c| {
                    (c.index, c.payload.len())
                }))
            }
        })
        .await?;
        Ok(StreamResult::new(transport, size, messages, elapsed))
    })
}

/// The chunks of `stream` as [`time_streams`] reads them: index and payload length, or the
/// failure, named `what`.
fn received<C, E: std::fmt::Display>(
    stream: impl futures::Stream<Item = Result<C, E>>,
    what: &'static str,
    parts: fn(&C) -> (u64, usize),
) -> impl futures::Stream<Item = Result<(u64, usize), BenchError>> {
    stream.map(move |chunk| {
        let chunk = chunk.map_err(|e| BenchError::failed(what, e))?;
        Ok(parts(&chunk))
    })
}

/// Streams a warm-up of a tenth of `messages`, then `messages` chunks of `size` bytes,
/// from the streams `open` returns for a request of that many chunks (items: index and
/// payload length, in order), and returns how long the measured stream took.
async fn time_streams<F, Fut, S>(
    size: usize,
    messages: u64,
    mut open: F,
) -> Result<Duration, BenchError>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<S, BenchError>>,
    S: futures::Stream<Item = Result<(u64, usize), BenchError>>,
{
    let mut elapsed = Duration::ZERO;
    for (count, measured) in [((messages / 10).max(1), false), (messages, true)] {
        let started = Instant::now();
        let mut stream = std::pin::pin!(open(count).await?);
        let mut got = 0u64;
        while let Some(chunk) = stream.next().await {
            let (index, len) = chunk?;
            if index != got || len != size {
                let problem = format!("chunk {index} of {len} bytes arrived as number {got}");
                return Err(BenchError::failed("streaming", problem));
            }
            got += 1;
        }
        if got != count {
            return Err(BenchError::failed(
                "streaming",
                format!("{got} of {count} chunks"),
            ));
        }
        if measured {
            elapsed = started.elapsed();
        }
    }
    Ok(elapsed)
}

/// The tonic baseline: the same service, compiled by tonic-prost-build, over HTTP/2 on
/// 127.0.0.1.
pub fn run_tonic(size: usize, messages: u64) -> Result<StreamResult, BenchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::failed("creating the tokio runtime", e))?;
    runtime.block_on(tonic_streamer::serve_and_stream(size, messages))
}

mod tonic_streamer {
    use std::pin::Pin;

    use bytes::Bytes;
    use futures::{Stream, StreamExt};

    use super::{message_limit, StreamResult};
    use crate::error::BenchError;

    /// Code generated by tonic-prost-build from `proto/streaming.proto`.
    pub mod proto {
        tonic::include_proto!("rpc.streaming");
    }

    use proto::streamer_client::StreamerClient;
    use proto::streamer_server::{Streamer, StreamerServer};
    use proto::{Chunk, ConsumeSummary, ProduceRequest};

    type Chunks = Pin<Box<dyn Stream<Item = Result<Chunk, tonic::Status>> + Send>>;

    /// Produces chunks as [`super::BenchStreamer`] does (the other methods are not
    /// measured).
    #[derive(Debug, Default, Clone, Copy)]
    struct TonicStreamer;

    #[tonic::async_trait]
    impl Streamer for TonicStreamer {
        type ProduceStream = Chunks;
        type ChatStream = Chunks;

        async fn produce(
            &self,
            request: tonic::Request<ProduceRequest>,
        ) -> Result<tonic::Response<Chunks>, tonic::Status> {
            let ask = request.into_inner();
            let payload = Bytes::from(rpc_examples::bulk_pattern(ask.size as usize, 0));
            let chunks = futures::stream::iter(0..ask.count).map(move |index| {
                Ok(Chunk {
                    index,
                    payload: payload.clone(),
                })
            });
            Ok(tonic::Response::new(Box::pin(chunks)))
        }

        async fn consume(
            &self,
            _: tonic::Request<tonic::Streaming<Chunk>>,
        ) -> Result<tonic::Response<ConsumeSummary>, tonic::Status> {
            Err(tonic::Status::unimplemented("not measured"))
        }

        async fn chat(
            &self,
            _: tonic::Request<tonic::Streaming<Chunk>>,
        ) -> Result<tonic::Response<Chunks>, tonic::Status> {
            Err(tonic::Status::unimplemented("not measured"))
        }
    }

    pub(super) async fn serve_and_stream(
        size: usize,
        messages: u64,
    ) -> Result<StreamResult, BenchError> {
        let router = tonic::transport::Server::builder().add_service(
            StreamerServer::new(TonicStreamer)
                .max_decoding_message_size(message_limit(size))
                .max_encoding_message_size(message_limit(size)),
        );
        crate::tonic_echo::with_server(
            router,
            |url| async move { stream(&url, size, messages).await },
        )
        .await
    }

    async fn stream(url: &str, size: usize, messages: u64) -> Result<StreamResult, BenchError> {
        let client = StreamerClient::connect(url.to_owned())
            .await
            .map_err(|e| BenchError::failed(&format!("connecting to {url}"), e))?
            .max_decoding_message_size(message_limit(size))
            .max_encoding_message_size(message_limit(size));
        let elapsed = super::time_streams(size, messages, |count| {
            let mut client = client.clone();
            let request = ProduceRequest {
                count,
                size: size as u64,
                ..Default::default()
            };
            async move {
                let stream = client
                    .produce(request)
                    .await
                    .map_err(|s| BenchError::failed("opening the tonic stream", s))?
                    .into_inner();
                Ok(super::received(stream, "tonic streaming", |c| {
                    (c.index, c.payload.len())
                }))
            }
        })
        .await?;
        Ok(StreamResult::new("tonic", size, messages, elapsed))
    }
}
