//! What every call records, on both sides, with no setup beyond installing a recorder and
//! a subscriber:
//!
//! * **Metrics** through the [`metrics`] facade, once the application turns them on with
//!   [`enable_metrics`] after installing its recorder (Prometheus, say). They are named as
//!   grpc-ecosystem's `go-grpc-prometheus` names them and labelled `grpc_service`,
//!   `grpc_method`: `grpc_{server,client}_started_total`,
//!   `grpc_{server,client}_handled_total` (also labelled `grpc_code`),
//!   `grpc_{server,client}_handling_seconds` (a histogram) and
//!   `grpc_{server,client}_in_flight`. Off, a call reads no clock for them: where reading
//!   the clock is slow (an emulated machine's clock source) that is most of their cost.
//! * **A tracing span** per call, `rpc.client` or `rpc.server` (INFO), with the method,
//!   the peer, the status code (`rpc.code`) and the W3C trace id (`trace_id`) once known;
//!   its time is the call's. The trace crosses calls in the `traceparent` metadata
//!   ([`trace`]).
//!
//! Transports add their own counters ([`transport`]): bytes sent and received, sends that
//! waited for room.
//!
//! A call counts from its start (before the client's interceptors; on the server, once its
//! request is routed) to its status; a call given up (its future dropped, its connection
//! gone) ends `CANCELLED`.

mod method;
mod metrics;
pub mod trace;
pub mod transport;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tracing::field::{display, Empty};

pub(crate) use self::metrics::MethodMetrics;
pub use method::{called, Method, MethodKind, MethodRef};
use trace::{TraceContext, TRACEPARENT};

use crate::MetadataMap;
use crate::{Code, Status};

static METRICS: AtomicBool = AtomicBool::new(false);

/// Turns on the metrics of calls and transports for the whole process. Call it after
/// installing the recorder: each method's handles (and each transport's) are registered
/// with the recorder installed when they are first needed after this.
pub fn enable_metrics() {
    METRICS.store(true, Ordering::Release);
}

/// Whether [`enable_metrics`] was called.
#[inline]
pub fn metrics_enabled() -> bool {
    METRICS.load(Ordering::Relaxed)
}

/// Which end of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Side {
    Client,
    Server,
}

/// One call being observed: counted as started and in flight until it ends ([`CallRecord::end`],
/// or dropped: `CANCELLED`), inside its span.
#[derive(Debug)]
pub(crate) struct CallRecord {
    /// With metrics on: the method's, and when the call started.
    metrics: Option<(&'static MethodMetrics, Instant)>,
    span: tracing::Span,
    trace: Option<TraceContext>,
    ended: bool,
}

impl CallRecord {
    /// A client call of `method` to `peer` starts. Its trace context goes into `metadata`
    /// unless one is there already: the current handler's, continued, or a new trace if
    /// this call's span is recorded.
    pub(crate) fn client(method: MethodRef, peer: &str, metadata: &mut MetadataMap) -> CallRecord {
        method.note();
        let span = tracing::info_span!(
            "rpc.client",
            rpc.method = method.path(),
            rpc.peer = peer,
            rpc.code = Empty,
            trace_id = Empty,
        );
        let trace = TraceContext::from_metadata(metadata).or_else(|| {
            let context = match TraceContext::current() {
                Some(parent) => parent.child(),
                None if !span.is_disabled() => TraceContext::new_root(),
                None => return None,
            };
            // No room left in the metadata: the call goes untraced.
            metadata.insert(TRACEPARENT, context.to_string()).ok()?;
            Some(context)
        });
        let metrics = metrics_enabled().then(|| method.client_metrics());
        CallRecord::start(metrics, span, trace)
    }

    /// A server call of `path` from `peer` starts, in the trace its caller sent; `metrics`
    /// gives the method's, when metrics are on.
    pub(crate) fn server(
        metrics: impl FnOnce() -> &'static MethodMetrics,
        path: &'static str,
        peer: &str,
        metadata: &MetadataMap,
    ) -> CallRecord {
        let span = tracing::info_span!(
            "rpc.server",
            rpc.method = path,
            rpc.peer = peer,
            rpc.code = Empty,
            trace_id = Empty,
        );
        let metrics = metrics_enabled().then(metrics);
        CallRecord::start(metrics, span, TraceContext::from_metadata(metadata))
    }

    fn start(
        metrics: Option<&'static MethodMetrics>,
        span: tracing::Span,
        trace: Option<TraceContext>,
    ) -> CallRecord {
        if let Some(metrics) = metrics {
            metrics.started.increment(1);
            metrics.in_flight.increment(1.0);
        }
        if let (Some(trace), false) = (&trace, span.is_disabled()) {
            span.record(
                "trace_id",
                display(format_args!("{:032x}", trace.trace_id())),
            );
        }
        CallRecord {
            metrics: metrics.map(|metrics| (metrics, Instant::now())),
            span,
            trace,
            ended: false,
        }
    }

    /// The call's span.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The trace the call belongs to, if any.
    pub(crate) fn trace(&self) -> Option<TraceContext> {
        self.trace
    }

    /// The call ended with `outcome`'s status.
    pub(crate) fn end<T>(mut self, outcome: &Result<T, Status>) {
        self.finish(outcome.as_ref().map_or_else(Status::code, |_| Code::Ok));
    }

    /// The call ended with `code`.
    pub(crate) fn end_with(mut self, code: Code) {
        self.finish(code);
    }

    fn finish(&mut self, code: Code) {
        self.ended = true;
        if let Some((metrics, started)) = self.metrics {
            metrics.in_flight.decrement(1.0);
            metrics.handled(code).increment(1);
            metrics.seconds.record(started.elapsed().as_secs_f64());
        }
        if !self.span.is_disabled() {
            self.span.record("rpc.code", code.as_str());
        }
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        if !self.ended {
            self.finish(Code::Cancelled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_metrics_off_a_call_reads_no_clock_for_them() {
        // No test of this crate turns metrics on.
        assert!(!metrics_enabled());
        static ECHO: Method = Method::new("/echo.Echo/Echo");
        let record = CallRecord::client(MethodRef::Named(&ECHO), "peer", &mut MetadataMap::new());
        assert!(record.metrics.is_none());
        record.end_with(Code::Ok);
        assert!(ECHO.metrics.get().is_none(), "no handles were registered");
    }
}
