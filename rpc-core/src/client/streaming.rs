//! Streaming calls on a [`Channel`]: server, client and bidirectional streams.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::{FutureExt, Stream, StreamExt};
use prost::Message;
use tracing::Instrument;

use super::{decode_response, encoded_response, Channel, Connection, PendingCall};
use crate::body::EncodeBody;
use crate::frame::{InboundFrame, OutgoingFrame};
use crate::header::{Flags, FrameKind, Header};
use crate::message::{Request, Response};
use crate::observe::{CallRecord, MethodRef};
use crate::stream::{
    BlockingStreaming, Link, Outgoing, Pump, StreamShared, Streaming, TypedMessages,
};
use crate::timer::{DeadlineTimer, TimerKey};
use crate::MetadataMap;
use crate::{Code, Status};

/// A streaming call between its start and its headers.
struct Opening {
    call: PendingCall,
    out: Outgoing,
    guard: StreamGuard,
}

/// Ends a client's streaming call when dropped: stops its deadline, detaches its stream
/// and, unless the server ended it (or answered), cancels it at the server. Held by the
/// call until its headers, then by its [`Streaming`].
struct StreamGuard {
    conn: Arc<Connection>,
    id: u64,
    timer: Option<TimerKey>,
    shared: Arc<StreamShared>,
    /// The server answered: nothing to cancel.
    quiet: bool,
    /// The call's metrics and span, from its headers on: it ends as its stream does.
    record: Option<CallRecord>,
}

impl StreamGuard {
    /// The call got its unary response (client streaming): nothing more to send or read,
    /// and nothing to cancel.
    fn finish_quietly(mut self) {
        self.quiet = true;
    }
}

impl StreamGuard {
    /// How the call ended: its stream's failure or trailers, its connection's end, or given
    /// up (`CANCELLED`).
    fn outcome(&self) -> Code {
        if let Some(code) = self.shared.outcome() {
            return code;
        }
        match self.conn.calls.closed_status() {
            Some(status) => status.code(),
            None => Code::Cancelled,
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(key) = self.timer.take() {
            DeadlineTimer::global().cancel(key);
        }
        if let Some(record) = self.record.take() {
            record.end_with(self.outcome());
        }
        let calls = &self.conn.calls;
        calls.detach_stream(self.id);
        let ended_by_server = self.shared.is_over() && self.shared.failed().is_none();
        if self.quiet || ended_by_server || calls.closed_status().is_some() {
            return;
        }
        let mut frame = OutgoingFrame::control(Header::new(FrameKind::Cancel, self.id));
        if let Err(status) = self.conn.transport.send_control(&mut frame) {
            tracing::debug!(call_id = self.id, %status, "could not cancel a stream");
        }
    }
}

impl Channel {
    /// Registers a streaming call on `conn` and returns it with its request frame's header.
    fn open_stream(
        &self,
        conn: &Arc<Connection>,
        method_id: u32,
        metadata: &MetadataMap,
        deadline: Option<Instant>,
    ) -> Result<(Opening, Header), Status> {
        let (call, mut header) = conn.register_call(method_id, metadata, deadline)?;
        header.flags = header.flags.with(Flags::STREAM);
        let config = self.config();
        let shared = Arc::new(StreamShared::new(
            config.stream_window,
            config.max_message_size,
        ));
        let id = call.id;
        conn.calls.attach_stream(id, shared.clone());
        // The deadline covers the whole call, not just the wait for the headers.
        let timer = deadline.map(|at| DeadlineTimer::global().schedule(at, &conn.calls, id));
        let out = Outgoing::new(
            shared.clone(),
            Link::client(conn.transport.clone()),
            id,
            config.max_message_size,
        );
        let guard = StreamGuard {
            conn: conn.clone(),
            id,
            timer,
            shared,
            quiet: false,
            record: None,
        };
        Ok((Opening { call, out, guard }, header))
    }

    /// [`Channel::open_stream`] on the connection a blocking call goes over.
    fn open_stream_blocking(
        &self,
        method_id: u32,
        metadata: &MetadataMap,
        timeout: Option<std::time::Duration>,
    ) -> Result<(Opening, Header), Status> {
        let deadline = self.deadline(timeout);
        let conn = self.connection_blocking(deadline)?;
        self.open_stream(&conn, method_id, metadata, deadline)
    }

    /// Opens a streaming call for `request`'s messages: sends the opening, and returns the
    /// call, the future that sends the messages and the half-close, and the guard.
    async fn start_stream<S, Req>(
        &self,
        method_id: u32,
        request: Request<S>,
    ) -> Result<(PendingCall, Sending, StreamGuard), Status>
    where
        S: Stream<Item = Req> + Send + 'static,
        Req: EncodeBody + 'static,
    {
        let (metadata, messages, timeout) = self.intercept(request).await?.into_parts();
        let deadline = self.deadline(timeout);
        let conn = self.connection(deadline).await?;
        let (mut opening, header) = self.open_stream(&conn, method_id, &metadata, deadline)?;
        opening.send_opening(header, &metadata).await?;
        let Opening { call, out, guard } = opening;
        Ok((call, pump(out, messages), guard))
    }

    /// Calls a server-streaming method: sends `request`, then resolves to the server's
    /// headers and the stream of its messages. The deadline covers the whole stream;
    /// dropping the stream before its end cancels the call.
    pub fn server_streaming<Req, Resp>(
        &self,
        method: impl Into<MethodRef>,
        mut request: Request<Req>,
    ) -> impl Future<Output = Result<Response<Streaming<Resp>>, Status>> + Send + 'static
    where
        Req: EncodeBody + 'static,
    {
        let channel = self.clone();
        let method = method.into();
        let record = CallRecord::client(method, self.peer(), request.metadata_mut());
        let span = record.span().clone();
        async move {
            let request = request.map(|message| futures::stream::iter(Some(message)));
            let headers = async {
                let (mut call, sending, guard) = channel.start_stream(method.id(), request).await?;
                let headers = await_headers(&mut call, &mut Some(sending)).await?;
                Ok::<_, Status>((headers, call.id, guard))
            }
            .instrument(span)
            .await;
            streaming_response(headers, None, record)
        }
    }

    /// Calls a client-streaming method: sends every message of `request`'s stream, then a
    /// half-close, and resolves to the server's response (which may come before the stream
    /// ends: sending then stops).
    pub fn client_streaming<S, Req, Resp>(
        &self,
        method: impl Into<MethodRef>,
        request: Request<S>,
    ) -> impl Future<Output = Result<Response<Resp>, Status>> + Send + 'static
    where
        S: Stream<Item = Req> + Send + 'static,
        Req: EncodeBody + 'static,
        Resp: Message + Default + Send + 'static,
    {
        self.client_streaming_with(method, request, decode_response)
    }

    /// [`Channel::client_streaming`] whose response message is left encoded (for a tower
    /// service).
    pub(crate) fn client_streaming_encoded<S, Req>(
        &self,
        method: impl Into<MethodRef>,
        request: Request<S>,
    ) -> impl Future<Output = Result<Response<Bytes>, Status>> + Send + 'static
    where
        S: Stream<Item = Req> + Send + 'static,
        Req: EncodeBody + 'static,
    {
        self.client_streaming_with(method, request, encoded_response)
    }

    /// A client-streaming call whose response frame `finish` turns into its answer.
    fn client_streaming_with<S, Req, T>(
        &self,
        method: impl Into<MethodRef>,
        mut request: Request<S>,
        finish: fn(InboundFrame) -> Result<Response<T>, Status>,
    ) -> impl Future<Output = Result<Response<T>, Status>> + Send + 'static
    where
        S: Stream<Item = Req> + Send + 'static,
        Req: EncodeBody + 'static,
        T: Send + 'static,
    {
        let channel = self.clone();
        let method = method.into();
        let record = CallRecord::client(method, self.peer(), request.metadata_mut());
        let span = record.span().clone();
        async move {
            let response = async {
                let (mut call, sending, guard) = channel.start_stream(method.id(), request).await?;
                let frame = await_headers(&mut call, &mut Some(sending)).await;
                guard.finish_quietly();
                let frame = frame?;
                if frame.header.flags.contains(Flags::STREAM) {
                    // Headers of a stream: the transport took the method for one that
                    // streams its responses (a gRPC peer's answer, for a `Method` that did
                    // not say it is client streaming).
                    return Err(Status::internal(format!(
                        "{} answered a client-streaming call as a stream: declare its Method \
                         with MethodKind::ClientStreaming",
                        method.path()
                    )));
                }
                finish(frame)
            }
            .instrument(span)
            .await;
            record.end(&response);
            response
        }
    }

    /// Calls a bidirectional-streaming method: sends `request`'s stream while the server
    /// answers, and resolves to the server's headers and the stream of its messages. The
    /// request stream keeps going after the headers (on the current tokio runtime if there
    /// is one, else whenever the response stream is polled).
    pub fn streaming<S, Req, Resp>(
        &self,
        method: impl Into<MethodRef>,
        mut request: Request<S>,
    ) -> impl Future<Output = Result<Response<Streaming<Resp>>, Status>> + Send + 'static
    where
        S: Stream<Item = Req> + Send + 'static,
        Req: EncodeBody + 'static,
    {
        let channel = self.clone();
        let method = method.into();
        let record = CallRecord::client(method, self.peer(), request.metadata_mut());
        let span = record.span().clone();
        async move {
            let opened = async {
                let (mut call, sending, guard) = channel.start_stream(method.id(), request).await?;
                let mut sending = Some(sending);
                let headers = await_headers(&mut call, &mut sending).await?;
                Ok::<_, Status>((headers, call.id, guard, sending))
            }
            .instrument(span)
            .await;
            let (headers, id, guard, sending) = match opened {
                Ok(opened) => opened,
                Err(status) => {
                    record.end_with(status.code());
                    return Err(status);
                }
            };
            // The requests still unsent go on after the headers; a failure to send them
            // fails the call. A pump that finished before the headers is gone: nothing polls
            // it again.
            let failed = guard.shared.clone();
            let rest = sending.map(|sending| {
                async move {
                    if let Err(status) = sending.await {
                        failed.fail(status);
                    }
                }
                .boxed()
            });
            let pump = match (rest, tokio::runtime::Handle::try_current()) {
                (Some(rest), Ok(runtime)) => {
                    runtime.spawn(rest);
                    None
                }
                (rest, _) => rest,
            };
            streaming_response(Ok((headers, id, guard)), pump, record)
        }
    }

    /// The blocking form of [`Channel::server_streaming`]: the messages are read by
    /// iterating on the calling thread.
    pub fn server_streaming_blocking<Req, Resp>(
        &self,
        method: impl Into<MethodRef>,
        mut request: Request<Req>,
    ) -> Result<Response<BlockingStreaming<Resp>>, Status>
    where
        Req: EncodeBody + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let method = method.into();
        let record = CallRecord::client(method, self.peer(), request.metadata_mut());
        let headers = record.span().in_scope(|| {
            let (metadata, message, timeout) = self.intercept_blocking(request)?.into_parts();
            let (mut opening, header) =
                self.open_stream_blocking(method.id(), &metadata, timeout)?;
            opening.send_opening_blocking(header, &metadata)?;
            opening.out.send_blocking(&message)?;
            opening
                .out
                .send_control_blocking(opening.out.half_close())?;
            let Opening { call, guard, .. } = opening;
            let id = call.id;
            Ok((call.wait_blocking()?, id, guard))
        });
        let (metadata, stream) = streaming_response(headers, None, record)?.into_parts();
        Ok(Response::from_parts(metadata, stream.into_blocking()))
    }

    /// The blocking form of [`Channel::client_streaming`]: sends every message of
    /// `messages` from the calling thread, then waits for the response.
    pub fn client_streaming_blocking<I, Req, Resp>(
        &self,
        method: impl Into<MethodRef>,
        mut request: Request<I>,
    ) -> Result<Response<Resp>, Status>
    where
        I: IntoIterator<Item = Req>,
        Req: Message,
        Resp: Message + Default,
    {
        let method = method.into();
        let record = CallRecord::client(method, self.peer(), request.metadata_mut());
        let response = record
            .span()
            .in_scope(|| self.client_streaming_call_blocking(method.id(), request));
        record.end(&response);
        response
    }

    fn client_streaming_call_blocking<I, Req, Resp>(
        &self,
        method_id: u32,
        request: Request<I>,
    ) -> Result<Response<Resp>, Status>
    where
        I: IntoIterator<Item = Req>,
        Req: Message,
        Resp: Message + Default,
    {
        let (metadata, messages, timeout) = self.intercept_blocking(request)?.into_parts();
        let (mut opening, header) = self.open_stream_blocking(method_id, &metadata, timeout)?;
        opening.send_opening_blocking(header, &metadata)?;
        for message in messages {
            // A server that answered early reads no more (the stream failed with a note of
            // it): its answer counts.
            if let Err(status) = opening.out.send_blocking(&message) {
                if opening.out.shared().is_over() {
                    break;
                }
                return Err(status);
            }
        }
        if !opening.out.shared().is_over() {
            opening
                .out
                .send_control_blocking(opening.out.half_close())?;
        }
        let Opening { call, guard, .. } = opening;
        let frame = call.wait_blocking();
        guard.finish_quietly();
        decode_response(frame?)
    }
}

impl Opening {
    /// Sends the request frame (metadata only) and the window beyond the initial one.
    async fn send_opening(&mut self, header: Header, metadata: &MetadataMap) -> Result<(), Status> {
        let empty = crate::body::EmptyBody;
        let mut frame = OutgoingFrame::new(header, metadata, &empty)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        poll_fn(|cx| self.call.poll_send(cx, &mut frame)).await?;
        if let Some(update) = self.out.shared().initial_update() {
            // Straight to the transport, as the blocking form does: the request is out, so
            // the server may already have answered; that must not count as an answer to a
            // request never sent.
            let id = self.call.id;
            let transport = &self.guard.conn.transport;
            poll_fn(|cx| update.with_frame(id, |frame| transport.poll_send(cx, frame))).await?;
        }
        Ok(())
    }

    fn send_opening_blocking(
        &mut self,
        header: Header,
        metadata: &MetadataMap,
    ) -> Result<(), Status> {
        let empty = crate::body::EmptyBody;
        let mut frame = OutgoingFrame::new(header, metadata, &empty)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let sent = self.channel_send(&mut frame);
        self.call.sent(sent)?;
        if let Some(update) = self.out.shared().initial_update() {
            update.with_frame(self.call.id, |frame| self.channel_send(frame))?;
        }
        Ok(())
    }

    fn channel_send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.guard.conn.transport.send(frame)
    }
}

/// The future sending a client's messages and its half-close.
type Sending = futures::future::BoxFuture<'static, Result<(), Status>>;

/// Sends every message of `messages`, then the half-close; stops early (successfully) if
/// the call ended meanwhile. Like a server's stream, it lets other tasks run every
/// [`crate::stream::MESSAGES_PER_POLL`] messages: a stream that is always ready must not hold its
/// thread (or, before the headers, the caller's poll) for ever.
fn pump<S, Req>(
    mut out: Outgoing,
    messages: S,
) -> futures::future::BoxFuture<'static, Result<(), Status>>
where
    S: Stream<Item = Req> + Send + 'static,
    Req: EncodeBody + 'static,
{
    async move {
        let mut messages = TypedMessages::new(messages.map(Ok::<Req, Status>));
        let mut polled = false;
        poll_fn(|cx| out.poll_send_all(cx, &mut messages, &mut polled)).await?;
        let half_close = out.half_close();
        poll_fn(|cx| out.poll_control(cx, half_close)).await
    }
    .boxed()
}

/// Waits for the call's headers (or its response) while `sending` sends its requests. A
/// failure to send ends the call with that status; the end of sending does not. A pump that
/// finished is taken out of `sending`, so nothing polls it again: what is left there (if
/// anything) still has requests to send.
async fn await_headers(
    call: &mut PendingCall,
    sending: &mut Option<Sending>,
) -> Result<InboundFrame, Status> {
    poll_fn(|cx: &mut Context<'_>| {
        if let Poll::Ready(result) = Pin::new(&mut *call).poll(cx) {
            return Poll::Ready(result);
        }
        let Some(pump) = sending.as_mut() else {
            return Poll::Pending;
        };
        match pump.poll_unpin(cx) {
            Poll::Ready(Ok(())) => *sending = None,
            Poll::Ready(Err(status)) => {
                *sending = None;
                // An answer fails the stream (the server reads no more) just before it
                // completes the call, under the call table's lock: if it came since the
                // call was polled, the answer counts, not the stream it cut short.
                return match Pin::new(&mut *call).poll(cx) {
                    Poll::Ready(result) => Poll::Ready(result),
                    Poll::Pending => Poll::Ready(Err(status)),
                };
            }
            Poll::Pending => {}
        }
        Poll::Pending
    })
    .await
}

/// The server's headers: a streaming response with its metadata, or the call's status.
fn headers_of(frame: InboundFrame) -> Result<Response<()>, Status> {
    if !frame.header.flags.contains(Flags::STREAM) {
        // A failed call answers with a plain response carrying its status.
        decode_response::<()>(frame)?;
        return Err(Status::internal(
            "the server answered a streaming call with a unary response",
        ));
    }
    let metadata = frame
        .decode_metadata()
        .map_err(|e| Status::internal(format!("response {e}")))?;
    Ok(Response::from_parts(metadata, ()))
}

/// The stream of a call whose headers came (`headers`: the frame, the call's id and its
/// guard), recorded until it ends; or the call's status, recorded now.
fn streaming_response<Resp>(
    headers: Result<(InboundFrame, u64, StreamGuard), Status>,
    pump: Option<Pump>,
    record: CallRecord,
) -> Result<Response<Streaming<Resp>>, Status> {
    let (frame, id, mut guard) = match headers {
        Ok(headers) => headers,
        Err(status) => {
            record.end_with(status.code());
            return Err(status);
        }
    };
    let metadata = match headers_of(frame) {
        Ok(headers) => headers.into_parts().0,
        Err(status) => {
            record.end_with(status.code());
            return Err(status);
        }
    };
    guard.record = Some(record);
    let link = Link::client(guard.conn.transport.clone());
    let shared = guard.shared.clone();
    let mut stream = Streaming::new(shared, link, id, Some(Box::new(guard)));
    if let Some(pump) = pump {
        stream = stream.with_pump(pump);
    }
    Ok(Response::from_parts(metadata, stream))
}
