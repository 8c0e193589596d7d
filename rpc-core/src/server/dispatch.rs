//! Turns request frames into handler runs and handler results into response frames.
//!
//! Transports own the sockets or queue pairs; for each connection they create a
//! [`ConnectionDispatch`] and feed it every frame they receive.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::future::{AbortHandle, Abortable};
use futures::FutureExt;
use parking_lot::Mutex;
use tracing::Instrument;

use crate::auth::Peer;
use crate::error::Error;
use crate::frame::InboundFrame;
use crate::header::{Flags, FrameKind, Header};
use crate::observe::trace::TraceContext;
use crate::observe::CallRecord;
pub(crate) use crate::server::answer::Answer;
use crate::server::calls::Calls;
pub use crate::server::config::{
    ServerConfig, DEFAULT_MAX_CALLS, DEFAULT_MAX_CALLS_PER_CONNECTION,
};
use crate::server::in_flight::InFlight;
use crate::server::layer::Layers;
use crate::server::router::Router;
use crate::server::service::{InboundStream, MethodDescriptor, ServerCall};
pub use crate::server::sink::ReplySink;
use crate::server::streams::Streams;
use crate::stream::Outgoing;
use crate::stream::{is_stream_frame, Link, StreamShared, Wakes};
use crate::{Code, Status};

pub(super) enum RuntimeSlot {
    Owned(Option<tokio::runtime::Runtime>),
    Shared(tokio::runtime::Handle),
}

impl RuntimeSlot {
    pub(super) fn handle(&self) -> &tokio::runtime::Handle {
        match self {
            RuntimeSlot::Owned(Some(rt)) => rt.handle(),
            RuntimeSlot::Shared(handle) => handle,
            RuntimeSlot::Owned(None) => unreachable!("runtime taken only in drop"),
        }
    }
}

impl Drop for RuntimeSlot {
    fn drop(&mut self) {
        if let RuntimeSlot::Owned(rt) = self {
            // Dropping a runtime inside another runtime's context panics; background
            // shutdown never blocks.
            if let Some(rt) = rt.take() {
                rt.shutdown_background();
            }
        }
    }
}

/// Leaves [`InFlight`] and its connection's count when a spawned handler run or answer
/// ends, however it ends.
pub(super) struct InFlightGuard(Arc<ConnectionDispatch>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
        self.0.dispatcher.in_flight.exit();
    }
}

/// The transport-independent server: routing, limits, the handler runtime.
pub struct Dispatcher {
    router: Arc<Router>,
    /// The tower layers every call passes through, if the server has any.
    layers: Option<Layers>,
    config: ServerConfig,
    pub(super) runtime: RuntimeSlot,
    in_flight: InFlight,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("config", &self.config)
            .field("in_flight", &self.in_flight.count())
            .finish()
    }
}

impl Dispatcher {
    pub(crate) fn new(
        router: Arc<Router>,
        layers: Option<Layers>,
        config: ServerConfig,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<Dispatcher, Error> {
        let runtime = match runtime.or_else(|| tokio::runtime::Handle::try_current().ok()) {
            Some(handle) => RuntimeSlot::Shared(handle),
            None => RuntimeSlot::Owned(Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(config.worker_threads.max(1))
                    .thread_name("rpc-handler")
                    .enable_time()
                    .build()?,
            )),
        };
        Ok(Dispatcher {
            router,
            layers,
            config,
            runtime,
            in_flight: InFlight::default(),
        })
    }

    /// The server's settings.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The method this server serves at `path` (`/package.Service/Method`), if any.
    pub fn method(&self, path: &str) -> Option<MethodDescriptor> {
        self.router.by_path(path)
    }

    /// Handler runs in progress.
    pub fn in_flight(&self) -> usize {
        self.in_flight.count()
    }

    /// Waits until no handler is running or `timeout` passes; returns whether it is idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let in_flight = &self.in_flight;
        let until = Instant::now() + timeout;
        in_flight.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = in_flight.lock.lock();
        let idle = loop {
            if in_flight.count() == 0 {
                break true;
            }
            if in_flight.idle.wait_until(&mut guard, until).timed_out() {
                break in_flight.count() == 0;
            }
        };
        drop(guard);
        in_flight.waiters.fetch_sub(1, Ordering::SeqCst);
        idle
    }
}

/// The server side of one connection: runs its requests and cancels them.
pub struct ConnectionDispatch {
    pub(super) dispatcher: Arc<Dispatcher>,
    /// Who is on the other end, for handlers ([`crate::Request::peer`]).
    peer: Arc<Peer>,
    pub(super) sink: Arc<dyn ReplySink>,
    pub(super) running: Mutex<Calls>,
    /// Streaming calls running, for their stream frames, and the frames that came before
    /// their requests.
    pub(super) streams: Mutex<Streams>,
    /// Spawned handler runs and answers of this connection not finished yet.
    in_progress: AtomicUsize,
    /// New requests are refused (the server is shutting down); running ones finish.
    draining: AtomicBool,
    /// The connection is gone: frames still in flight inside the transport are ignored.
    closed: AtomicBool,
}

impl std::fmt::Debug for ConnectionDispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionDispatch")
            .field("running", &self.running.lock().len())
            .finish()
    }
}

impl ConnectionDispatch {
    /// Dispatch for a new connection with `peer`, whose responses go to `sink`.
    pub fn new(dispatcher: Arc<Dispatcher>, sink: Arc<dyn ReplySink>, peer: Peer) -> Arc<Self> {
        let early_limit = dispatcher.config.early_stream_frames;
        Arc::new(ConnectionDispatch {
            dispatcher,
            peer: Arc::new(peer),
            sink,
            running: Mutex::new(Calls::default()),
            streams: Mutex::new(Streams::new(early_limit)),
            in_progress: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        })
    }

    /// Where this connection's frames go.
    pub(crate) fn sink(&self) -> &Arc<dyn ReplySink> {
        &self.sink
    }

    /// The server's settings (transports read the message size limit here).
    pub fn config(&self) -> &ServerConfig {
        &self.dispatcher.config
    }

    /// Handles one frame from the client; wakeups of streams' readers and writers are held
    /// in `wakes` until the transport's batch of frames ends.
    pub fn on_frame(self: &Arc<Self>, frame: InboundFrame, wakes: &mut Wakes) {
        match frame.header.kind {
            FrameKind::Request => self.on_request(frame),
            FrameKind::Cancel => self.on_cancel(frame.header.call_id),
            kind if is_stream_frame(kind) => self.on_stream_frame(frame, wakes),
            kind => tracing::debug!(?kind, "ignoring a frame kind servers do not act on"),
        }
    }

    /// Answers a request the transport refused to read because its declared size exceeds
    /// the limit.
    pub fn reject_oversized(self: &Arc<Self>, header: &Header, declared: u64) {
        let limit = self.dispatcher.config.max_message_size;
        let (what, limit) = crate::stream::batch::oversized(header.kind, limit, "request");
        self.fail_call(
            header.call_id,
            &Status::message_too_large(what, declared, limit),
        );
    }

    /// Answers `call_id` with an error status in place of a response the transport could
    /// not deliver (a large body the client refused a buffer for, say). A streaming call
    /// fails its stream instead: its handler sees the status, and the call ends with it.
    pub fn fail_call(self: &Arc<Self>, call_id: u64, status: &Status) {
        let stream = self.streams.lock().get(call_id);
        match stream {
            Some(stream) => stream.fail(status.clone()),
            None => self.send_status(call_id, status),
        }
    }

    /// Handlers of this connection running or waiting to send their answer.
    pub fn calls_running(&self) -> usize {
        self.running.lock().len()
    }

    /// Refuses new requests with `UNAVAILABLE` from now on; running handlers still answer.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// The connection is gone: stop every handler still running for it.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.running.lock().abort_all();
        self.streams.lock().clear_early();
    }

    /// A client's cancel: stops its call, or, if its request has not arrived, keeps that
    /// from running and drops the stream frames that came before it.
    fn on_cancel(&self, call_id: u64) {
        self.running.lock().cancel(call_id);
        self.streams.lock().forget(call_id);
    }

    /// Counts a spawned handler run or answer until the guard drops.
    pub(super) fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        self.dispatcher.in_flight.enter();
        InFlightGuard(self.clone())
    }

    /// Why a new request cannot start now, if it cannot: a call limit is reached.
    fn over_limit(&self) -> Option<Status> {
        let config = &self.dispatcher.config;
        let here = self.in_progress.load(Ordering::Acquire);
        if here >= config.max_calls_per_connection {
            return Some(Status::resource_exhausted(format!(
                "this connection has {here} calls in progress, the server's limit per \
                 connection (max_calls_per_connection {})",
                config.max_calls_per_connection
            )));
        }
        let all = self.dispatcher.in_flight.count();
        if all >= config.max_calls {
            return Some(Status::resource_exhausted(format!(
                "the server has {all} calls in progress, its limit (max_calls {})",
                config.max_calls
            )));
        }
        None
    }

    fn on_request(self: &Arc<Self>, frame: InboundFrame) {
        let header = frame.header;
        self.start(frame);
        if header.flags.contains(Flags::STREAM) {
            let mut streams = self.streams.lock();
            if streams.get(header.call_id).is_none() {
                // Refused (or already over): what came before the request is of no use.
                streams.forget(header.call_id);
            }
        }
    }

    /// Starts the call `frame` requests, or answers why not.
    fn start(self: &Arc<Self>, frame: InboundFrame) {
        let header = frame.header;
        let call_id = header.call_id;
        let method_id = header.method_id;
        let dispatcher = &self.dispatcher;
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        if self.draining.load(Ordering::Acquire) {
            return self.send_status(call_id, &Status::unavailable("the server is shutting down"));
        }
        {
            let mut calls = self.running.lock();
            if calls.take_cancelled(call_id) {
                return tracing::debug!(call_id, "request cancelled before it arrived");
            }
            if calls.contains(call_id) {
                drop(calls);
                return self.send_status(
                    call_id,
                    &Status::already_exists(format!("call id {call_id} is already running")),
                );
            }
        }
        let Some(route) = dispatcher.router.get(header.method_id) else {
            return self.send_status(
                call_id,
                &Status::unimplemented(format!(
                    "unknown method id {:#010x}: this server does not serve it",
                    header.method_id
                )),
            );
        };
        let metadata = match frame.decode_metadata() {
            Ok(m) => m,
            Err(e) => {
                return self.send_status(call_id, &Status::invalid_argument(format!("request {e}")))
            }
        };
        let record = CallRecord::server(|| route.metrics(), route.path, &self.peer.addr, &metadata);
        if let Some(status) = self.over_limit() {
            record.end_with(status.code());
            // Sent if there is room now, else dropped: a refusal must not queue a task
            // either, and a peer that leaves us no room holds the credits that would carry
            // it.
            return self.refuse(call_id, status);
        }
        let limit = dispatcher.config.max_message_size;
        if frame.payload.len() > limit {
            record.end_with(Code::ResourceExhausted);
            return self.reject_oversized(&header, frame.payload.len() as u64);
        }
        let timeout = call_timeout(&header);
        let streaming = header.flags.contains(Flags::STREAM);
        let stream = streaming.then(|| {
            let shared = Arc::new(StreamShared::new(dispatcher.config.stream_window, limit));
            let early = self.streams.lock().open(call_id, shared.clone());
            self.feed_early(call_id, &shared, early);
            InboundStream {
                shared,
                link: Link::server(self.sink.clone()),
                call_id,
            }
        });
        let outgoing = stream
            .as_ref()
            .map(|s| Outgoing::new(s.shared.clone(), s.link.clone(), call_id, limit));
        let path = route.path;
        let call = ServerCall {
            metadata,
            payload: frame.payload,
            timeout,
            peer: Some(self.peer.clone()),
            method: Some(route.method),
            stream,
        };
        let mut handler = match &dispatcher.layers {
            None => route.service.call(header.method_id, call),
            Some(layers) => layers.call(call),
        };
        let panicked = move || Err(Status::internal(format!("{path} panicked")));

        if let Some(out) = outgoing {
            return self.spawn_stream(&header, path, handler, out, record);
        }
        let trace = record.trace();

        // The fast path: poll the handler once right here. One that finishes without
        // waiting answers at once, with no task, no wrapper future, no abort handle. It
        // counts as in flight from its first poll, so a shutdown waits for its answer; one
        // that waits stays counted until its task's own count has begun.
        let mut polled_inline = None;
        if dispatcher.config.inline_handlers {
            let _runtime = dispatcher.runtime.handle().enter();
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            polled_inline = Some(dispatcher.in_flight.running());
            // A panicking handler answers INTERNAL instead of taking the connection down
            // with the thread it ran on (the transport's receive thread).
            let polled = record.span().in_scope(|| {
                TraceContext::scope_sync(trace, || {
                    std::panic::catch_unwind(AssertUnwindSafe(|| handler.poll_unpin(&mut cx)))
                })
            });
            // A handler that finished gave its block back; one that panicked is dropped.
            let done = match polled {
                Ok(Poll::Pending) => None,
                Ok(Poll::Ready(result)) => Some(result),
                Err(_) => Some(panicked()),
            };
            if let Some(result) = done {
                record.end(&result);
                self.answer(call_id, method_id, result.into());
                return;
            }
        }

        let handler = AssertUnwindSafe(TraceContext::scope(trace, handler))
            .catch_unwind()
            .map(move |outcome| outcome.unwrap_or_else(|_| panicked()));
        let guard = self.enter();
        drop(polled_inline);
        let conn = self.clone();
        let span = record.span().clone();
        let run = async move {
            let result = match timeout {
                Some(t) => tokio::time::timeout(t, handler).await.unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "{path} did not finish within its deadline of {t:?}"
                    )))
                }),
                None => handler.await,
            };
            record.end(&result);
            let mut answer = Answer::from(result);
            futures::future::poll_fn(|cx| conn.poll_answer(cx, call_id, method_id, &mut answer))
                .await;
            answer.sent();
            drop(guard);
        }
        .instrument(span);
        let (abort, registration) = AbortHandle::new_pair();
        let conn = self.clone();
        let task = Abortable::new(run, registration).map(move |_| {
            conn.running.lock().finish(call_id);
        });
        // Registered before spawning, so the task's own removal can never precede it.
        self.running.lock().start(call_id, abort);
        dispatcher.runtime.handle().spawn(task);
    }
}

/// The time budget a request carries.
pub(super) fn call_timeout(header: &Header) -> Option<Duration> {
    (header.timeout_us > 0).then(|| Duration::from_micros(header.timeout_us))
}
