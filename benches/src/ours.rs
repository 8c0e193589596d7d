//! The echo service over rdma-rpc: the server, and the blocking (concurrency 1) and
//! concurrent (async on a single-threaded tokio runtime) clients.

use crate::clock::Instant;

use bytes::BytesMut;
use futures::StreamExt as _;
use rdma_rpc::prelude::*;
use rdma_rpc::{Endpoint, RdmaConfig, ServeOptions, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::echo::EchoRequest;
use rpc_examples::EchoService;

use crate::error::BenchError;
use crate::payload::Payloads;
use crate::recorder::{Recorder, RunInfo};
use crate::result::BenchResult;
use rdma_rpc::RegisteredBuffer;

/// Largest message the benchmark server accepts: any size a client may ask for.
pub const SERVER_MAX_MESSAGE: usize = 1 << 30;
/// Room for protobuf framing (tags, lengths, the `seq` field) around a payload.
const PROTOBUF_OVERHEAD: usize = 64;

/// What a client run does.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// Payload bytes per request.
    pub size: usize,
    /// Measured calls.
    pub iters: u64,
    /// Calls before measuring.
    pub warmup: u64,
    /// Calls in flight at once (1: blocking stub, unless `async_stubs`).
    pub concurrency: usize,
    /// Make even one call at a time through the async stubs.
    pub async_stubs: bool,
    /// Requests' payloads from a `RegisteredBuffer` (blocking stub only).
    pub registered: bool,
    /// RDMA settings (rdma:// only).
    pub rdma: RdmaConfig,
    /// RDMA polling mode's name for the result.
    pub poll: Option<String>,
    /// The authority to trust (tcps:// and grpcs:// only).
    pub tls: Option<rdma_rpc::ClientTls>,
}

/// The transport name of an endpoint for results: `tcp`, `rdma` or `grpc`.
pub fn transport_name(endpoint: &Endpoint) -> &'static str {
    endpoint.kind().name()
}

/// Starts the echo server on `url` in the background. Call it outside any tokio runtime, so
/// that handlers run on the server's own threads.
/// It also serves the standard health service, reporting the echo service serving.
pub fn start_server(url: &Endpoint, rdma: RdmaConfig) -> Result<ServerHandle, BenchError> {
    let options = ServeOptions {
        rdma,
        ..Default::default()
    };
    start_server_with(url, options)
}

/// [`start_server`] with every transport setting.
pub fn start_server_with(
    url: &Endpoint,
    options: ServeOptions,
) -> Result<ServerHandle, BenchError> {
    let (reporter, health) = rdma_rpc::health::health_reporter();
    reporter.set_serving::<EchoServer<EchoService>>();
    Server::builder()
        .max_message_size(SERVER_MAX_MESSAGE)
        .add_service(health)
        .add_service(EchoServer::new(EchoService))
        .start_with(&url.to_string(), options)
        .map_err(|e| match e {
            rdma_rpc::Error::InvalidUrl { .. } => BenchError::from(e),
            other => BenchError::failed(&format!("starting the server on {url}"), other),
        })
}

/// Connects to `url` and runs `plan`.
pub fn run_client(url: &str, plan: &ClientPlan) -> Result<BenchResult, BenchError> {
    let endpoint: Endpoint = url.parse()?;
    if plan.registered && (plan.concurrency > 1 || plan.async_stubs) {
        return Err(BenchError::failed(
            "--registered",
            "it sends one call at a time through the blocking stub: drop --concurrency \
             and --async-stubs",
        ));
    }
    let limit = (plan.size + PROTOBUF_OVERHEAD).max(rdma_rpc::client::DEFAULT_MAX_MESSAGE_SIZE);
    let mut client = rdma_rpc::client()
        .rdma_config(plan.rdma.clone())
        .max_message_size(limit);
    if let Some(tls) = &plan.tls {
        client = client.tls(tls.clone());
    }
    let channel = client
        .connect_blocking(url)
        .map_err(|e| BenchError::failed(&format!("connecting to {url}"), e))?;
    let client = EchoClient::new(channel);
    let info = RunInfo {
        transport: transport_name(&endpoint).to_owned(),
        url: url.to_owned(),
        size: plan.size,
        warmup: plan.warmup,
        concurrency: plan.concurrency,
        poll: plan.poll.clone(),
        async_stubs: plan.async_stubs,
    };
    let payloads = Payloads::new(plan.size);
    let mut recorder = Recorder::new(plan.iters, format!("{} {url}", info.transport));
    if plan.concurrency <= 1 && !plan.async_stubs {
        run_blocking(&client, &payloads, plan, &mut recorder)?;
    } else {
        run_concurrent(&client, &payloads, plan, &mut recorder)?;
    }
    Ok(recorder.finish(info))
}

/// One call at a time on this thread through the blocking stub (run-to-completion: the
/// thread drives its own completions). Each request is written into the memory of the one
/// before, so the loop itself allocates nothing per call.
fn run_blocking(
    client: &EchoClient,
    payloads: &Payloads,
    plan: &ClientPlan,
    recorder: &mut Recorder,
) -> Result<(), BenchError> {
    let mut buf = BytesMut::new();
    let mut registered = match plan.registered {
        true => Some(
            RegisteredBuffer::new(plan.size.max(1))
                .map_err(|status| BenchError::failed("registering the payload buffer", status))?,
        ),
        false => None,
    };
    for seq in 0..plan.warmup + plan.iters {
        if seq == plan.warmup {
            recorder.start();
        }
        let payload = match &mut registered {
            Some(buffer) => payloads.request_registered(buffer, seq)?,
            None => payloads.request_in(&mut buf, seq),
        };
        let request = EchoRequest { payload, seq };
        let started = Instant::now();
        let reply = client.echo_blocking(request);
        let done = Instant::now();
        let reply = reply
            .map_err(|status| BenchError::failed(&format!("call {seq}"), status))?
            .into_inner();
        payloads.verify(seq, reply.seq, &reply.payload)?;
        if seq >= plan.warmup {
            recorder.record(done - started, done);
        }
    }
    Ok(())
}

/// `plan.concurrency` async calls in flight on a single-threaded tokio runtime.
fn run_concurrent(
    client: &EchoClient,
    payloads: &Payloads,
    plan: &ClientPlan,
    recorder: &mut Recorder,
) -> Result<(), BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::failed("creating the tokio runtime", e))?;
    runtime.block_on(async {
        let warmup = 0..plan.warmup;
        calls(client, payloads, warmup, plan.concurrency, |_, _| {}).await?;
        recorder.start();
        let measured = plan.warmup..plan.warmup + plan.iters;
        calls(
            client,
            payloads,
            measured,
            plan.concurrency,
            |latency, done| recorder.record(latency, done),
        )
        .await
    })
}

/// Makes the calls `seqs` with up to `concurrency` in flight, verifying every reply and
/// passing each call's latency and completion time to `record`.
async fn calls(
    client: &EchoClient,
    payloads: &Payloads,
    seqs: std::ops::Range<u64>,
    concurrency: usize,
    mut record: impl FnMut(std::time::Duration, Instant),
) -> Result<(), BenchError> {
    let mut replies = futures::stream::iter(seqs)
        .map(|seq| {
            let call = client.echo(EchoRequest {
                payload: payloads.request(seq).into(),
                seq,
            });
            async move {
                let started = Instant::now();
                let reply = call.await;
                (seq, started, Instant::now(), reply)
            }
        })
        .buffer_unordered(concurrency);
    while let Some((seq, started, done, reply)) = replies.next().await {
        let reply = reply
            .map_err(|status| BenchError::failed(&format!("call {seq}"), status))?
            .into_inner();
        payloads.verify(seq, reply.seq, &reply.payload)?;
        record(done - started, done);
    }
    Ok(())
}
