//! The client side: a [`Channel`] over any transport, and the unary call machinery that
//! generated stubs use.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prost::Message;

use crate::call_table::CallTable;
use crate::frame::{FrameSender, InboundFrame, OutgoingFrame};
use crate::header::{FrameKind, Header};
use crate::message::{Request, Response};
use crate::metadata::MetadataMap;
use crate::status::{Code, Status};
use crate::stream::{Window, DEFAULT_STREAM_WINDOW};
use crate::timer::{DeadlineTimer, TimerKey};

/// Default limit on encoded request and response sizes (the gRPC default).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// What a transport provides to the client side of a connection: sending frames
/// ([`FrameSender`]) and the rest below.
///
/// The transport delivers every response frame it receives to the [`CallTable`] it was
/// given at connect time ([`CallTable::complete`]) and closes the table when the connection
/// dies ([`CallTable::close`]).
pub trait ClientTransport: FrameSender {
    /// Sends a header-only frame (a `Cancel`) without ever blocking, from any context,
    /// `Drop` included: a transport with no room now queues it within a bound, or drops it
    /// (the call was given up on; its late answer is ignored). The default calls `send`.
    fn send_control(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        self.send(frame)
    }

    /// Lets a blocked caller make progress on its own thread (run-to-completion): poll the
    /// transport's completions for a while. Returns true as soon as anything was received
    /// (by this thread or another), false if nothing was and the caller should park. The
    /// default does nothing and the caller parks until the receive path unparks it.
    fn poll_progress(&self) -> bool {
        false
    }

    /// Lets an async call waiting for its response drive the transport's completions on
    /// its own task (run-to-completion for async callers): one look at them, and the
    /// transport's advice on what the task does next ([`Drive`]). `driving` is the caller's
    /// lease: the transport sets it when it lets this caller spin and clears it when it
    /// takes the lease back; a caller that ends while holding it calls
    /// [`ClientTransport::stop_driving`]. The default never drives: the caller waits to be
    /// woken by the receive path.
    fn drive(&self, _cx: &mut Context<'_>, _driving: &mut bool) -> Drive {
        Drive::Wait
    }

    /// Gives back the lease of a caller that ended while [`ClientTransport::drive`] let it
    /// spin (its call completed, failed or was dropped), so another waiting caller, or the
    /// transport's own thread, drives the completions from now on. Never blocks.
    fn stop_driving(&self) {}

    /// Where the connection goes, for messages.
    fn peer(&self) -> &str;

    /// Closes the connection; pending calls fail with `Unavailable`.
    fn close(&self);
}

/// What an async call waiting for its response does after [`ClientTransport::drive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    /// Something was received: look at the call again.
    Received,
    /// Nothing yet, and this caller drives the completions: be polled again soon (the task
    /// wakes itself and yields to the others on its executor).
    Spin,
    /// Wait to be woken: another caller, or the transport's own thread, drives them.
    Wait,
}

/// Client settings shared by every call on a channel.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Largest encoded request sent and response accepted.
    pub max_message_size: usize,
    /// Time budget for calls that set none.
    pub default_timeout: Option<Duration>,
    /// What a server may send on one stream before this client reads it (never less than
    /// [`crate::stream::INITIAL_WINDOW`]): per stream, at most `bytes` plus
    /// `max_message_size` are buffered.
    pub stream_window: Window,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            default_timeout: None,
            stream_window: DEFAULT_STREAM_WINDOW,
        }
    }
}

struct ChannelInner {
    calls: Arc<CallTable>,
    transport: Arc<dyn ClientTransport>,
    config: ChannelConfig,
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        self.transport.close();
    }
}

/// A connection to a server, shared by any number of stubs, threads and tasks.
///
/// `Channel` is cheap to clone, `Send + Sync`, and keeps many calls in flight at once.
/// It is created by a transport (for example `rdma_rpc::connect("tcp://host:port")`).
#[derive(Clone)]
pub struct Channel {
    inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("peer", &self.inner.transport.peer())
            .field("in_flight", &self.inner.calls.in_flight())
            .finish()
    }
}

impl Channel {
    /// Wraps a connected transport that completes calls in `calls`.
    pub fn new(
        calls: Arc<CallTable>,
        transport: Arc<dyn ClientTransport>,
        config: ChannelConfig,
    ) -> Channel {
        Channel {
            inner: Arc::new(ChannelInner {
                calls,
                transport,
                config,
            }),
        }
    }

    /// The channel's settings.
    pub fn config(&self) -> &ChannelConfig {
        &self.inner.config
    }

    /// Calls still in flight.
    pub fn in_flight(&self) -> usize {
        self.inner.calls.in_flight()
    }

    /// The table the transport completes this channel's calls in.
    pub(crate) fn calls(&self) -> &Arc<CallTable> {
        &self.inner.calls
    }

    /// The connection.
    pub(crate) fn transport(&self) -> &Arc<dyn ClientTransport> {
        &self.inner.transport
    }

    /// Calls `method_id` (see [`crate::method_id`]) with `request` and awaits the response.
    ///
    /// The future works on any executor. Dropping it before it completes cancels the call at
    /// the server.
    pub fn unary<Req, Resp>(
        &self,
        method_id: u32,
        request: Request<Req>,
    ) -> impl Future<Output = Result<Response<Resp>, Status>> + Send + 'static
    where
        Req: Message + Send + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let channel = self.clone();
        async move {
            let (mut call, header) = channel.prepare_call(method_id, &request)?;
            let mut frame = request_frame(header, &request)?;
            // The deadline runs from the start: waiting for room to send counts against it.
            if let Some(at) = call.deadline {
                call.timer =
                    Some(DeadlineTimer::global().schedule(at, &channel.inner.calls, call.id));
            }
            poll_fn(|cx| call.poll_send(cx, &mut frame)).await?;
            decode_response(call.await?)
        }
    }

    /// The blocking form of [`Channel::unary`], for synchronous code. The calling thread
    /// waits on its own call (and may drive the transport itself while it does).
    pub fn unary_blocking<Req, Resp>(
        &self,
        method_id: u32,
        request: Request<Req>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Message,
        Resp: Message + Default,
    {
        // A blocking caller may block in `send` itself when the transport is full.
        let (mut call, header) = self.prepare_call(method_id, &request)?;
        let mut frame = request_frame(header, &request)?;
        let sent = self.inner.transport.send(&mut frame);
        call.sent(sent)?;
        decode_response(call.wait_blocking()?)
    }

    /// Checks the request against the limits, registers a call for it and returns the call
    /// with the header of its request frame.
    fn prepare_call<Req: Message>(
        &self,
        method_id: u32,
        request: &Request<Req>,
    ) -> Result<(PendingCall, Header), Status> {
        let limit = self.inner.config.max_message_size;
        let size = Message::encoded_len(request.get_ref());
        if size > limit {
            return Err(Status::message_too_large(
                "request",
                size as u64,
                limit as u64,
            ));
        }
        self.register_call(method_id, request.metadata(), request.timeout())
    }

    /// Registers a call of `method_id` with `metadata` and the time budget `timeout` (or
    /// the channel's default) and returns it with the header of its request frame.
    pub(crate) fn register_call(
        &self,
        method_id: u32,
        metadata: &MetadataMap,
        timeout: Option<Duration>,
    ) -> Result<(PendingCall, Header), Status> {
        metadata.checked_encoded_len().map_err(Status::from)?;
        let timeout = timeout.or(self.inner.config.default_timeout);
        // A budget too large to add to the clock is no deadline at all.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));

        let id = self.inner.calls.register()?;
        let call = PendingCall {
            channel: self.clone(),
            id,
            deadline,
            timer: None,
            sent: false,
            finished: false,
            driving: false,
        };
        let mut header = Header::new(FrameKind::Request, id);
        header.method_id = method_id;
        header.timeout_us = timeout.map_or(0, |t| t.as_micros().clamp(1, u64::MAX as u128) as u64);
        Ok((call, header))
    }
}

/// The frame of a request: `header`, then the request's metadata and message.
fn request_frame<'a, Req: Message>(
    header: Header,
    request: &'a Request<Req>,
) -> Result<OutgoingFrame<'a>, Status> {
    let metadata: &MetadataMap = request.metadata();
    OutgoingFrame::new(header, metadata, request.get_ref())
        .map_err(|e| Status::resource_exhausted(e.to_string()))
}

pub(crate) fn decode_response<Resp: Message + Default>(
    frame: InboundFrame,
) -> Result<Response<Resp>, Status> {
    let status = frame.header.status;
    if status != Code::Ok {
        return Err(Status::new(
            status,
            String::from_utf8_lossy(&frame.payload).into_owned(),
        ));
    }
    let metadata = frame
        .decode_metadata()
        .map_err(|e| Status::internal(format!("response {e}")))?;
    let message = Resp::decode(frame.payload)
        .map_err(|e| Status::internal(format!("failed to decode the response message: {e}")))?;
    Ok(Response::from_parts(metadata, message))
}

/// A call registered in the table; once sent, resolves to the response frame. Dropping it
/// after its request was sent and before completion cancels the call at the server.
pub(crate) struct PendingCall {
    channel: Channel,
    pub(crate) id: u64,
    pub(crate) deadline: Option<Instant>,
    timer: Option<TimerKey>,
    /// The request went to the transport: the server may be running the call.
    sent: bool,
    finished: bool,
    /// The transport lets this call drive its completions ([`ClientTransport::drive`]).
    driving: bool,
}

impl PendingCall {
    /// Records the outcome of sending the request; a request never sent leaves nothing to
    /// cancel at the server.
    pub(crate) fn sent(&mut self, sent: Result<(), Status>) -> Result<(), Status> {
        match sent {
            Ok(()) => {
                self.sent = true;
                Ok(())
            }
            Err(status) => Err(self.abandon(status)),
        }
    }

    /// Sends the request from an async task, waiting (`Pending`) while the transport has no
    /// room. A call that ends meanwhile (its deadline, the connection closing) ends the wait.
    pub(crate) fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        let inner = &self.channel.inner;
        // The call first: one that ended while it waited (its deadline, a closed
        // connection) must not be sent after all.
        if let Poll::Ready(ended) = inner.calls.poll_call(self.id, cx) {
            // A "response" to a request never sent is a peer guessing call ids.
            let status = ended.err().unwrap_or_else(|| {
                Status::internal("the peer answered a call whose request was never sent")
            });
            return Poll::Ready(Err(self.abandon(status)));
        }
        inner
            .transport
            .poll_send(cx, frame)
            .map(|sent| self.sent(sent))
    }

    /// Gives up on a call whose request was not sent.
    fn abandon(&mut self, status: Status) -> Status {
        self.finished = true;
        if let Some(key) = self.timer.take() {
            DeadlineTimer::global().cancel(key);
        }
        self.channel.inner.calls.remove(self.id);
        status
    }

    fn finish(&mut self, result: Result<InboundFrame, Status>) -> Result<InboundFrame, Status> {
        self.finished = true;
        self.stop_driving();
        if let Some(key) = self.timer.take() {
            DeadlineTimer::global().cancel(key);
        }
        if matches!(&result, Err(s) if s.code() == Code::DeadlineExceeded) {
            self.send_cancel();
        }
        result
    }

    /// Hands the transport's completions back if this call drove them.
    fn stop_driving(&mut self) {
        if std::mem::take(&mut self.driving) {
            self.channel.inner.transport.stop_driving();
        }
    }

    fn send_cancel(&self) {
        let inner = &self.channel.inner;
        if inner.calls.closed_status().is_some() {
            return;
        }
        let mut frame = OutgoingFrame::control(Header::new(FrameKind::Cancel, self.id));
        if let Err(status) = inner.transport.send_control(&mut frame) {
            tracing::debug!(call_id = self.id, %status, "could not send cancel");
        }
    }

    pub(crate) fn wait_blocking(mut self) -> Result<InboundFrame, Status> {
        let result = self.wait_result();
        self.finish(result)
    }

    fn wait_result(&self) -> Result<InboundFrame, Status> {
        let inner = &*self.channel.inner;
        // Registered as the waiter only on the way to parking: a call that completes while
        // its thread polls (run-to-completion, the common case) needs no thread handle, no
        // waiter to store and no unpark.
        let mut me: Option<std::thread::Thread> = None;
        loop {
            if let Some(result) = inner.calls.take(self.id) {
                return result;
            }
            if inner.transport.poll_progress() {
                continue;
            }
            let me = me.get_or_insert_with(std::thread::current);
            // Checks again under the table's lock, so a completion after this point
            // unparks us.
            if let Some(result) = inner.calls.take_or_park_on(self.id, me) {
                return result;
            }
            match self.deadline {
                Some(at) => {
                    let now = Instant::now();
                    if now >= at {
                        // A response that won the race with the deadline still counts.
                        return inner.calls.expire(self.id).unwrap_or_else(|| {
                            Err(Status::deadline_exceeded(
                                "deadline exceeded before the response arrived",
                            ))
                        });
                    }
                    std::thread::park_timeout(at - now);
                }
                None => std::thread::park(),
            }
        }
    }
}

impl Future for PendingCall {
    type Output = Result<InboundFrame, Status>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let inner = &this.channel.inner;
        if let Poll::Ready(result) = inner.calls.poll_call(this.id, cx) {
            return Poll::Ready(this.finish(result));
        }
        match inner.transport.drive(cx, &mut this.driving) {
            Drive::Received => {
                // Our response may be in it; if not, the others on this executor go first
                // before we look at the completions again.
                if let Poll::Ready(result) = inner.calls.poll_call(this.id, cx) {
                    return Poll::Ready(this.finish(result));
                }
                cx.waker().wake_by_ref();
            }
            Drive::Spin => cx.waker().wake_by_ref(),
            Drive::Wait => {}
        }
        Poll::Pending
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.stop_driving();
        if let Some(key) = self.timer.take() {
            DeadlineTimer::global().cancel(key);
        }
        if self.channel.inner.calls.remove(self.id) && self.sent {
            self.send_cancel();
        }
    }
}
