//! One call in flight on a [`Connection`]: its registration, its request's send, its wait
//! for the response (async or blocking), its deadline and its cancellation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::Connection;
use crate::frame::{InboundFrame, OutgoingFrame};
use crate::header::{FrameKind, Header};
use crate::timer::{DeadlineTimer, TimerKey};
use crate::transport::progress::{self, Drive};
use crate::{Code, Status};

/// A call registered in the table; once sent, resolves to the response frame. Dropping it
/// after its request was sent and before completion cancels the call at the server.
pub(crate) struct PendingCall {
    conn: Arc<Connection>,
    pub(crate) id: u64,
    pub(crate) deadline: Option<Instant>,
    timer: Option<TimerKey>,
    /// The request went to the transport: the server may be running the call.
    sent: bool,
    finished: bool,
    /// The transport lets this call drive its completions ([`super::Progress::drive`]).
    driving: bool,
}

impl PendingCall {
    pub(crate) fn new(conn: Arc<Connection>, id: u64, deadline: Option<Instant>) -> PendingCall {
        PendingCall {
            conn,
            id,
            deadline,
            timer: None,
            sent: false,
            finished: false,
            driving: false,
        }
    }

    /// Fails the call with `DeadlineExceeded` at its deadline even while nothing polls it
    /// (async calls; a blocking caller parks with a timeout instead).
    pub(crate) fn schedule_deadline(&mut self) {
        if let Some(at) = self.deadline {
            self.timer = Some(DeadlineTimer::global().schedule(at, &self.conn.calls, self.id));
        }
    }

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
        let inner = &*self.conn;
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
        self.conn.calls.remove(self.id);
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
        progress::release(self.conn.transport.progress(), &mut self.driving);
    }

    fn send_cancel(&self) {
        let inner = &*self.conn;
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
        let inner = &*self.conn;
        // Registered as the waiter only on the way to parking: a call that completes while
        // its thread polls (run-to-completion, the common case) needs no thread handle, no
        // waiter to store and no unpark.
        let mut me: Option<std::thread::Thread> = None;
        loop {
            if let Some(result) = inner.calls.take(self.id) {
                return result;
            }
            if progress::poll_progress(inner.transport.progress(), self.deadline) {
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
        let inner = &*this.conn;
        if let Poll::Ready(result) = inner.calls.poll_call(this.id, cx) {
            return Poll::Ready(this.finish(result));
        }
        match progress::drive(inner.transport.progress(), cx, &mut this.driving) {
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
        if self.conn.calls.remove(self.id) && self.sent {
            self.send_cancel();
        }
    }
}
