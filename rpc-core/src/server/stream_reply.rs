//! The server's side of a streaming call once its handler runs: headers, messages within
//! the client's window, then the trailers, all under the call's deadline.

use std::future::poll_fn;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{AbortHandle, Abortable};
use futures::FutureExt;
use tracing::Instrument;

use super::dispatch::{Answer, ConnectionDispatch};
use super::service::ServerReply;
use super::HandlerFuture;
use crate::body::EmptyBody;
use crate::frame::{InboundFrame, OutgoingFrame};
use crate::header::{Flags, FrameKind, Header};
use crate::observe::trace::TraceContext;
use crate::observe::CallRecord;
use crate::server::streams::Routed;
use crate::stream::{Outgoing, StreamShared, Wakes};
use crate::MetadataMap;
use crate::Status;

/// How a streaming call's handler finished.
pub(crate) enum Finished {
    /// It answered with one message (client streaming).
    Unary(ServerReply),
    /// Its response stream ended.
    Stream,
}

/// Runs the reply of one streaming call.
pub(crate) struct StreamReply<'a> {
    conn: &'a Arc<ConnectionDispatch>,
    out: &'a mut Outgoing,
    /// The headers went out: the call ends with trailers from now on.
    headers_sent: bool,
    /// The trailers the handler's reply set, sent however its stream ends.
    trailers: MetadataMap,
}

impl<'a> StreamReply<'a> {
    pub(crate) fn new(conn: &'a Arc<ConnectionDispatch>, out: &'a mut Outgoing) -> Self {
        StreamReply {
            conn,
            out,
            headers_sent: false,
            trailers: MetadataMap::new(),
        }
    }

    /// Grants the client the configured window, runs the handler and sends its messages,
    /// all within `timeout`.
    pub(crate) async fn run(
        &mut self,
        handler: impl std::future::Future<Output = Result<ServerReply, Status>>,
        timeout: Option<Duration>,
        path: &'static str,
    ) -> Result<Finished, Status> {
        self.grant_window().await;
        let work = self.work(handler);
        match timeout {
            Some(t) => tokio::time::timeout(t, work).await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "{path} did not finish within its deadline of {t:?}"
                )))
            }),
            None => work.await,
        }
    }

    async fn grant_window(&mut self) {
        let Some(update) = self.out.shared().initial_update() else {
            return;
        };
        let call_id = self.out.call_id();
        let sink = self.conn.sink();
        let sent =
            poll_fn(|cx| update.with_frame(call_id, |frame| sink.poll_send(cx, frame))).await;
        if let Err(status) = sent {
            tracing::debug!(call_id, %status, "stream window not granted");
        }
    }

    async fn work(
        &mut self,
        handler: impl std::future::Future<Output = Result<ServerReply, Status>>,
    ) -> Result<Finished, Status> {
        let mut reply = handler.await?;
        let Some(mut messages) = reply.messages.take() else {
            return Ok(Finished::Unary(reply));
        };
        self.trailers = std::mem::take(&mut reply.trailers);
        reply
            .metadata
            .checked_encoded_len()
            .map_err(|e| Status::internal(format!("response {e}")))?;
        let mut header = Header::new(FrameKind::Response, self.out.call_id());
        header.flags = Flags::STREAM;
        let sink = self.conn.sink();
        poll_fn(|cx| {
            let mut frame = OutgoingFrame::new(header, &reply.metadata, &EmptyBody)
                .map_err(|e| Status::internal(e.to_string()))?;
            sink.poll_send(cx, &mut frame)
        })
        .await?;
        self.headers_sent = true;
        let out = &mut *self.out;
        // Held by `&mut`: a handler's stream need not be `Sync`.
        let messages = &mut *messages;
        let mut polled = false;
        poll_fn(|cx| out.poll_send_all(cx, messages, &mut polled)).await?;
        Ok(Finished::Stream)
    }

    /// Ends the call: the unary answer, the trailers, or (before the headers) a response
    /// with the status.
    pub(crate) async fn finish(self, method_id: u32, result: Result<Finished, Status>) {
        let call_id = self.out.call_id();
        let mut answer = match result {
            Ok(Finished::Unary(reply)) => Answer::Reply(reply),
            Err(status) if !self.headers_sent => Answer::Status(status),
            ended => {
                let status = ended
                    .err()
                    .unwrap_or_else(|| Status::new(crate::Code::Ok, ""));
                let out = &mut *self.out;
                let trailers = &self.trailers;
                if let Err(e) = poll_fn(|cx| out.poll_trailers(cx, &status, trailers)).await {
                    tracing::debug!(call_id, %e, "trailers not sent: connection gone");
                }
                return;
            }
        };
        let conn = self.conn;
        poll_fn(|cx| conn.poll_answer(cx, call_id, method_id, &mut answer)).await;
        answer.sent();
    }
}

/// Streaming calls of a connection: their frames and their runs.
impl ConnectionDispatch {
    /// Feeds a frame of a running streaming call to its stream. Frames of calls not running
    /// are held for their request ([`super::early`]); one that breaks the stream's rules
    /// fails the stream, and the call ends with that status.
    pub(super) fn on_stream_frame(&self, frame: InboundFrame, wakes: &mut Wakes) {
        let call_id = frame.header.call_id;
        let kind = frame.header.kind;
        let routed = self
            .streams
            .lock()
            .route(frame, kind != FrameKind::Trailers);
        match routed {
            Routed::Running(stream, _) if kind == FrameKind::Trailers => {
                stream.fail(Status::internal(
                    "stream protocol violation: the client sent trailers",
                ));
            }
            Routed::Running(stream, frame) => {
                if let Err(status) = stream.on_frame(frame, wakes) {
                    tracing::debug!(call_id, %status, "stream failed");
                }
            }
            Routed::Held => tracing::trace!(call_id, ?kind, "stream frame before its request"),
            Routed::Dropped => tracing::debug!(call_id, ?kind, "stream frame for no running call"),
        }
    }

    /// Feeds a run of `Message` and `Messages` frames of call `call_id` to its stream (in order; one
    /// lookup and one stream lock for the run). As [`Self::on_stream_frame`], messages of
    /// calls not running are held for their request, and one that breaks the stream's
    /// rules fails it.
    pub fn on_stream_messages(
        &self,
        call_id: u64,
        frames: impl IntoIterator<Item = InboundFrame>,
        wakes: &mut Wakes,
    ) {
        let stream = {
            let mut streams = self.streams.lock();
            match streams.get(call_id) {
                Some(stream) => stream,
                // Under the same lock: the stream cannot open before the run is held.
                None => return frames.into_iter().for_each(|frame| streams.hold(frame)),
            }
        };
        if let Err(status) = stream.on_messages(frames, wakes) {
            tracing::debug!(call_id, %status, "stream failed");
        }
    }

    /// Feeds `stream` the frames of `call_id` that came before its request.
    pub(super) fn feed_early(&self, call_id: u64, stream: &StreamShared, early: Vec<InboundFrame>) {
        if early.is_empty() {
            return;
        }
        tracing::debug!(
            call_id,
            frames = early.len(),
            "stream frames that came before their request"
        );
        let mut wakes = Wakes::new();
        for frame in early {
            if let Err(status) = stream.on_frame(frame, &mut wakes) {
                return tracing::debug!(call_id, %status, "stream failed");
            }
        }
    }

    /// Runs a streaming call on the runtime: the handler, then its messages, then the
    /// trailers, all within the call's deadline.
    pub(super) fn spawn_stream(
        self: &Arc<Self>,
        header: &Header,
        path: &'static str,
        handler: HandlerFuture,
        out: Outgoing,
        record: CallRecord,
    ) {
        let (call_id, method_id) = (header.call_id, header.method_id);
        let timeout = super::dispatch::call_timeout(header);
        let handler = AssertUnwindSafe(TraceContext::scope(record.trace(), handler))
            .catch_unwind()
            .map(move |outcome| {
                outcome.unwrap_or_else(|_| Err(Status::internal(format!("{path} panicked"))))
            });
        let guard = self.enter();
        let conn = self.clone();
        let span = record.span().clone();
        let run = async move {
            let mut out = out;
            let mut sender = StreamReply::new(&conn, &mut out);
            let reply = sender.run(handler, timeout, path).await;
            record.end(&reply);
            sender.finish(method_id, reply).await;
            drop(guard);
        }
        .instrument(span);
        let (abort, registration) = AbortHandle::new_pair();
        let conn = self.clone();
        let task = Abortable::new(run, registration).map(move |_| {
            conn.running.lock().finish(call_id);
            let stream = conn.streams.lock().remove(call_id);
            drop(stream);
        });
        self.running.lock().start(call_id, abort);
        self.dispatcher.runtime.handle().spawn(task);
    }
}
