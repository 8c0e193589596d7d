//! Answering calls: a reply or a status, sent when the transport has room.

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::frame::{poll_send_status, OutgoingFrame};
use crate::header::{FrameKind, Header};
use crate::server::dispatch::ConnectionDispatch;
use crate::server::service::ServerReply;
use crate::MetadataMap;
use crate::{Code, Status};

/// What a call is answered with.
pub(crate) enum Answer {
    /// The handler's reply.
    Reply(ServerReply),
    /// A status: the handler's error, or why its reply could not go.
    Status(Status),
}

impl Answer {
    /// The answer went (or its connection is gone): a reply's heap block is reused.
    pub(crate) fn sent(self) {
        if let Answer::Reply(reply) = self {
            reply.recycle();
        }
    }
}

impl From<Result<ServerReply, Status>> for Answer {
    fn from(result: Result<ServerReply, Status>) -> Self {
        match result {
            Ok(reply) => Answer::Reply(reply),
            Err(status) => Answer::Status(status),
        }
    }
}

impl ConnectionDispatch {
    /// Answers `call_id` from the thread that received its request: sends the answer at
    /// once if the transport has room, else finishes on the runtime, so the receive path
    /// never blocks on a peer that does not hand back credits.
    pub(super) fn answer(self: &Arc<Self>, call_id: u64, method_id: u32, answer: Answer) {
        let mut answer = answer;
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        if self
            .poll_answer(&mut cx, call_id, method_id, &mut answer)
            .is_ready()
        {
            return answer.sent();
        }
        let guard = self.enter();
        let conn = self.clone();
        self.dispatcher.runtime.handle().spawn(async move {
            futures::future::poll_fn(|cx| conn.poll_answer(cx, call_id, method_id, &mut answer))
                .await;
            answer.sent();
            drop(guard);
        });
    }

    /// Sends the answer of `call_id`; the response echoes `method_id`, so that clients can
    /// learn the size of each method's responses (RDMA clients advertise a response buffer
    /// from it). A reply that cannot go (too large, bad metadata, more than the transport
    /// carries) turns into a status naming the reason. `Pending` while the transport has no
    /// room; each poll starts the frame over.
    pub(crate) fn poll_answer(
        &self,
        cx: &mut Context<'_>,
        call_id: u64,
        method_id: u32,
        answer: &mut Answer,
    ) -> Poll<()> {
        let mut header = Header::new(FrameKind::Response, call_id);
        let failed = match answer {
            Answer::Reply(reply) => {
                header.method_id = method_id;
                let sent = match self.check_reply(reply) {
                    Err(status) => Err(status),
                    Ok(()) => {
                        let metadata = reply.wire_metadata();
                        match OutgoingFrame::new(header, &metadata, &*reply.body) {
                            Ok(mut frame) => match self.sink.poll_send(cx, &mut frame) {
                                Poll::Pending => return Poll::Pending,
                                // Too large for what the transport can carry (an RDMA slot,
                                // say): the call still gets an answer, with the reason.
                                Poll::Ready(Err(status))
                                    if status.code() == Code::ResourceExhausted =>
                                {
                                    Err(Status::resource_exhausted(format!(
                                        "response {}",
                                        status.message()
                                    )))
                                }
                                Poll::Ready(Err(status)) => {
                                    tracing::debug!(call_id, %status, "response not sent: connection gone");
                                    Ok(())
                                }
                                Poll::Ready(Ok(())) => Ok(()),
                            },
                            Err(e) => Err(Status::resource_exhausted(e.to_string())),
                        }
                    }
                };
                match sent {
                    Ok(()) => return Poll::Ready(()),
                    Err(status) => status,
                }
            }
            Answer::Status(status) => {
                header.status = if status.code() == Code::Ok {
                    Code::Unknown
                } else {
                    status.code()
                };
                let sent = poll_send_status(header, status, &MetadataMap::new(), |frame| {
                    self.sink.poll_send(cx, frame)
                });
                match sent {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(status)) => {
                        tracing::debug!(call_id, %status, "response not sent: connection gone");
                    }
                    Poll::Ready(Ok(())) => {}
                }
                return Poll::Ready(());
            }
        };
        *answer = Answer::Status(failed);
        self.poll_answer(cx, call_id, method_id, answer)
    }

    /// Why `reply` cannot be sent as it is, if it cannot.
    fn check_reply(&self, reply: &ServerReply) -> Result<(), Status> {
        let limit = self.dispatcher.config().max_message_size;
        let size = reply.body.encoded_len();
        if size > limit {
            return Err(Status::message_too_large(
                "response",
                size as u64,
                limit as u64,
            ));
        }
        reply
            .wire_metadata()
            .checked_encoded_len()
            .map(drop)
            .map_err(|e| Status::internal(format!("response {e}")))
    }

    pub(crate) fn send_status(self: &Arc<Self>, call_id: u64, status: &Status) {
        self.answer(call_id, 0, Answer::Status(status.clone()));
    }

    /// Answers `call_id` with `status` if the transport has room now, else drops it.
    pub(super) fn refuse(&self, call_id: u64, status: Status) {
        tracing::debug!(call_id, %status, "refusing a request");
        let mut answer = Answer::Status(status);
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        if self
            .poll_answer(&mut cx, call_id, 0, &mut answer)
            .is_pending()
        {
            tracing::debug!(call_id, "no room for the refusal; dropped");
        }
    }
}
