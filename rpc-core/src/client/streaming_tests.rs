//! A client's streaming calls against a scripted transport.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::frame::{FrameSender, InboundFrame, OutgoingFrame};
use crate::header::{Flags, FrameKind, Header};
use crate::{CallTable, Channel, ChannelConfig, ClientTransport, Request, Status};

/// A server that answers a streaming request with its headers at once, and a connection
/// that has no room for the next frame the first time a window update is sent.
struct AnswersAtOnce {
    calls: Arc<CallTable>,
    update_refused: AtomicBool,
}

impl FrameSender for AnswersAtOnce {
    /// Control frames (the half-close) come this way.
    fn send(&self, _: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        Ok(())
    }

    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> Poll<Result<(), Status>> {
        let header = *frame.header();
        match header.kind {
            FrameKind::Request => {
                let mut headers = Header::new(FrameKind::Response, header.call_id);
                headers.flags = Flags::STREAM;
                let answer = InboundFrame {
                    header: headers,
                    metadata: Bytes::new(),
                    payload: Bytes::new(),
                };
                self.calls.complete(header.call_id, Ok(answer));
            }
            FrameKind::WindowUpdate if !self.update_refused.swap(true, Ordering::SeqCst) => {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            _ => {}
        }
        Poll::Ready(Ok(()))
    }
}

impl ClientTransport for AnswersAtOnce {
    fn peer(&self) -> &str {
        "scripted"
    }

    fn close(&self) {
        self.calls.close(Status::unavailable("closed"));
    }
}

/// The opening's window update waits for room after the server already answered: the
/// answer belongs to the request that went out, not to a request "never sent".
#[test]
fn headers_that_overtake_the_opening_window_update_open_the_stream() {
    let calls = Arc::new(CallTable::new());
    let transport = AnswersAtOnce {
        calls: Arc::clone(&calls),
        update_refused: AtomicBool::new(false),
    };
    let channel = Channel::new(calls, Arc::new(transport), ChannelConfig::default());
    let request = Request::new(futures::stream::empty::<()>());
    let opened = futures::executor::block_on(channel.streaming::<_, (), ()>(1, request));
    assert!(opened.is_ok(), "{:?}", opened.err());
}

/// Streaming calls pass the channel's interceptors too, async and blocking: one that
/// refuses fails the call with its status before anything is sent.
#[test]
fn streaming_calls_pass_the_channels_interceptors() {
    let calls = Arc::new(CallTable::new());
    let transport = AnswersAtOnce {
        calls: Arc::clone(&calls),
        update_refused: AtomicBool::new(true),
    };
    let channel = Channel::new(calls, Arc::new(transport), ChannelConfig::default())
        .with_interceptor(|_: Request<()>| Err(Status::permission_denied("no streams today")));
    let request = Request::new(futures::stream::empty::<()>());
    let refused = futures::executor::block_on(channel.streaming::<_, (), ()>(1, request));
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(crate::Code::PermissionDenied)
    );
    let refused = channel.server_streaming_blocking::<(), ()>(1, Request::new(()));
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(crate::Code::PermissionDenied)
    );
    let refused = channel.client_streaming_blocking::<_, (), ()>(1, Request::new(vec![()]));
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(crate::Code::PermissionDenied)
    );
    assert_eq!(channel.in_flight(), 0, "nothing was registered");
}
