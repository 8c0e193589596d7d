//! Metrics counted exactly and traces that cross calls, over TCP (host) and RDMA (soft-RoCE
//! VM): a client calls a relay server whose handler calls a second server; unary calls that
//! succeed and fail, a server stream that fails after three messages, an unknown method.
//! A debugging metrics recorder and a span-capturing subscriber see both sides.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use parking_lot::Mutex;
use rdma_rpc::observe::trace::TraceContext;
use rdma_rpc::prelude::*;
use rdma_rpc::{ServerBuilder, ServerHandle};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::{Echo, EchoServer};
use rpc_examples::echo::{EchoReply, EchoRequest};
use rpc_examples::streaming::streamer_client::StreamerClient;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::ProduceRequest;
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::FailRequest;
use rpc_examples::{Streamer, Tester};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

const CALLS: usize = 10;

/// A closed span: its name and fields.
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    fields: HashMap<String, String>,
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Keeps every span that closes.
struct Capture(Arc<Mutex<Vec<Captured>>>);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(fields) = ctx.span(id).unwrap().extensions_mut().get_mut::<Fields>() {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions_mut().remove::<Fields>().unwrap_or_default();
        self.0.lock().push(Captured {
            name: span.name(),
            fields: fields.0,
        });
    }
}

struct Observed {
    metrics: Snapshotter,
    spans: Arc<Mutex<Vec<Captured>>>,
    /// One scenario at a time: they share the recorder and the subscriber.
    one_at_a_time: tokio::sync::Mutex<()>,
}

/// The process's recorder and subscriber, installed before any call.
fn observed() -> &'static Observed {
    static OBSERVED: OnceLock<Observed> = OnceLock::new();
    OBSERVED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let metrics = recorder.snapshotter();
        recorder.install().unwrap();
        rdma_rpc::observe::enable_metrics();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Capture(spans.clone()));
        tracing::subscriber::set_global_default(subscriber).unwrap();
        Observed {
            metrics,
            spans,
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    })
}

/// What changed since the last snapshot (the recorder resets on each), by metric name and
/// labels (`key=value` pairs, sorted).
fn changes(metrics: &Snapshotter) -> HashMap<(String, Vec<String>), DebugValue> {
    metrics
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            ((key.key().name().to_owned(), labels), value)
        })
        .collect()
}

/// Relays echoes to a second server, as a microservice calling its backend does.
#[derive(Clone)]
struct Relay(TesterClient);

impl Echo for Relay {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        assert!(
            TraceContext::current().is_some(),
            "the handler runs in its caller's trace"
        );
        let reply = self.0.echo(request.into_inner()).await?.into_inner();
        Ok(Response::new(reply))
    }
}

fn backend() -> ServerBuilder {
    Server::builder()
        .add_service(TesterServer::new(Tester::default()))
        .add_service(StreamerServer::new(Streamer::default()))
}

async fn counted_and_traced(rdma: bool, start: impl Fn(ServerBuilder) -> ServerHandle) {
    let observed = observed();
    let _alone = observed.one_at_a_time.lock().await;
    changes(&observed.metrics);
    observed.spans.lock().clear();

    let backend = start(backend());
    let to_backend = rdma_rpc::connect(backend.local_url()).await.unwrap();
    let relay = start(
        Server::builder().add_service(EchoServer::new(Relay(TesterClient::new(
            to_backend.clone(),
        )))),
    );
    let client = EchoClient::new(rdma_rpc::connect(relay.local_url()).await.unwrap());
    let tester = TesterClient::new(to_backend.clone());
    let streamer = StreamerClient::new(to_backend.clone());

    for seq in 0..CALLS as u64 {
        let reply = client
            .echo(EchoRequest {
                payload: vec![1; 8].into(),
                seq,
            })
            .await
            .unwrap();
        assert_eq!(reply.get_ref().seq, seq);
    }
    for _ in 0..3 {
        let fail = FailRequest {
            code: Code::NotFound as u32,
            message: "no such thing".into(),
            ..Default::default()
        };
        assert_eq!(tester.fail(fail).await.unwrap_err().code(), Code::NotFound);
    }
    let produce = ProduceRequest {
        count: 5,
        size: 16,
        fail_code: Code::NotFound as u32,
        fail_after: 3,
        interval: None,
    };
    let mut stream = streamer.produce(produce).await.unwrap().into_inner();
    let mut read = 0;
    let end = loop {
        match stream.next().await {
            Some(Ok(_)) => read += 1,
            Some(Err(status)) => break status,
            None => panic!("the stream ends with its failure"),
        }
    };
    assert_eq!((read, end.code()), (3, Code::NotFound));
    drop(stream);
    let unknown = to_backend.unary::<(), ()>(0x1234, Request::new(())).await;
    assert_eq!(unknown.unwrap_err().code(), Code::Unimplemented);
    // A body too large for a slot: it goes by RDMA WRITE.
    let large = EchoRequest {
        payload: vec![3; 1 << 20].into(),
        seq: 0,
    };
    assert_eq!(
        tester.echo(large).await.unwrap().get_ref().payload.len(),
        1 << 20
    );

    // Servers count a call when they answer it; closing is when every count is in.
    drop((client, tester, streamer, to_backend));
    relay.shutdown(Duration::from_secs(5)).await;
    backend.shutdown(Duration::from_secs(5)).await;

    let metrics = changes(&observed.metrics);
    let count = |name: &str, labels: &[&str]| {
        let mut labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        labels.sort();
        match metrics.get(&(name.to_owned(), labels.clone())) {
            Some(DebugValue::Counter(n)) => *n as usize,
            Some(DebugValue::Histogram(samples)) => samples.len(),
            Some(DebugValue::Gauge(value)) => value.0 as usize,
            None => 0,
        }
    };
    let method = |path: &str| {
        let (service, method) = path.trim_start_matches('/').rsplit_once('/').unwrap();
        [
            format!("grpc_service={service}"),
            format!("grpc_method={method}"),
        ]
    };
    for side in ["client", "server"] {
        for (path, code, n) in [
            ("/echo.Echo/Echo", "OK", CALLS),
            ("/rpc.testing.Tester/Echo", "OK", CALLS + 1),
            ("/rpc.testing.Tester/Fail", "NOT_FOUND", 3),
            ("/rpc.streaming.Streamer/Produce", "NOT_FOUND", 1),
        ] {
            let [service, method] = method(path);
            let labels = [service.as_str(), method.as_str()];
            let started = format!("grpc_{side}_started_total");
            let handled = format!("grpc_{side}_handled_total");
            let seconds = format!("grpc_{side}_handling_seconds");
            let in_flight = format!("grpc_{side}_in_flight");
            let with_code = format!("grpc_code={code}");
            let coded = [service.as_str(), method.as_str(), with_code.as_str()];
            assert_eq!(count(&started, &labels), n, "{started} {path}");
            assert_eq!(count(&handled, &coded), n, "{handled} {path} {code}");
            assert_eq!(count(&seconds, &labels), n, "{seconds} {path}");
            assert_eq!(count(&in_flight, &labels), 0, "{in_flight} {path}");
        }
    }
    if rdma {
        // The transport's own counters (process-wide): frames both ways, and the large
        // bodies of the 1 MiB echo by RDMA WRITE, each way.
        let bytes = |name: &str, labels: &[&str]| count(name, labels);
        let (send, write) = (
            ["path=send", "transport=rdma"],
            ["path=write", "transport=rdma"],
        );
        assert!(bytes("rdma_rpc_sent_bytes_total", &send) > 0);
        assert!(bytes("rdma_rpc_received_bytes_total", &["transport=rdma"]) > 0);
        assert!(bytes("rdma_rpc_sent_bytes_total", &write) >= 2 << 20);
    } else {
        // Both ways, the 1 MiB echo among them.
        let sent = count(
            "rdma_rpc_sent_bytes_total",
            &["path=socket", "transport=tcp"],
        );
        let received = count("rdma_rpc_received_bytes_total", &["transport=tcp"]);
        assert!(sent >= 2 << 20 && received >= 2 << 20, "{sent} {received}");
    }
    let [service, method] = method("/unknown/0x00001234");
    let unimplemented = [service.as_str(), method.as_str(), "grpc_code=UNIMPLEMENTED"];
    assert_eq!(count("grpc_client_handled_total", &unimplemented), 1);

    // Every call's trace crosses the relay: the client's span, the relay's, the relay's
    // call to the backend and the backend's share a trace id, one per call.
    let spans = observed.spans.lock().clone();
    let traces = |name: &str, path: &str| -> HashSet<String> {
        let of_method: Vec<&Captured> = spans
            .iter()
            .filter(|s| {
                s.name == name && s.fields.get("rpc.method").map(String::as_str) == Some(path)
            })
            .collect();
        for span in &of_method {
            assert_eq!(
                span.fields.get("rpc.code").map(String::as_str),
                Some("OK"),
                "{span:?}"
            );
        }
        of_method
            .iter()
            .map(|s| s.fields.get("trace_id").cloned().expect("a trace id"))
            .collect()
    };
    let calls = traces("rpc.client", "/echo.Echo/Echo");
    assert_eq!(calls.len(), CALLS, "a trace per call");
    assert_eq!(traces("rpc.server", "/echo.Echo/Echo"), calls);
    // The backend's echoes: the relayed ones in their callers' traces, and the large one
    // in a trace of its own.
    for side in ["rpc.client", "rpc.server"] {
        let backend = traces(side, "/rpc.testing.Tester/Echo");
        assert!(backend.is_superset(&calls), "{side}");
        assert_eq!(backend.len(), CALLS + 1, "{side}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_metrics_counted_and_traces_cross_calls() {
    counted_and_traced(false, |builder| builder.start("tcp://127.0.0.1:0").unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
async fn rdma_metrics_counted_and_traces_cross_calls() {
    counted_and_traced(true, |builder| {
        common::start_rdma(builder, Default::default())
    })
    .await;
}
