//! Messages that arrive by HTTP/2, handed to the upper side as its stream window has room:
//! a server's request messages, a client's response messages.

use bytes::Bytes;
use http_body::Body;
use rpc_core::stream::MESSAGES_PER_POLL;
use rpc_core::{FrameKind, Status};

use crate::codec::MessageReader;
use crate::conn::{stream_frame, GrpcConn};

/// How a [`pump`] ended.
#[derive(Debug)]
pub(crate) enum Ending {
    /// The body ended; the sequence number of the end (one past the last message).
    Ended(u32),
    /// The call is over (ended, cancelled, failed) before the body ended.
    Over,
    /// What arrived was bad: the call fails with this status, after the messages before
    /// sequence number `seq`.
    Failed(Status, u32),
}

/// Hands call `id`'s messages from `reader` to the upper side as `Message` frames, each
/// once the upper side's window has room, until the body or the call ends.
pub(crate) async fn pump<B>(conn: &GrpcConn, id: u64, reader: &mut MessageReader<B>) -> Ending
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut seq: u32 = 1;
    loop {
        if (seq as usize).is_multiple_of(MESSAGES_PER_POLL) {
            // A peer whose messages are always there must not hold the event loop.
            tokio::task::yield_now().await;
        }
        let next = std::future::poll_fn(|cx| match conn.poll_room(id, cx) {
            std::task::Poll::Ready(false) => std::task::Poll::Ready(None),
            std::task::Poll::Pending => std::task::Poll::Pending,
            std::task::Poll::Ready(true) => reader.poll_next(cx).map(Some),
        })
        .await;
        match next {
            None => return Ending::Over,
            Some(Ok(Some(message))) => {
                if seq == u32::MAX {
                    let status = Status::resource_exhausted(
                        "the stream is longer than a stream carries (2^32 - 2 messages)",
                    );
                    return Ending::Failed(status, seq);
                }
                conn.take_room(id, message.len());
                conn.deliver(stream_frame(FrameKind::Message, id, seq, message));
                seq += 1;
            }
            Some(Ok(None)) => return Ending::Ended(seq),
            Some(Err(status)) => return Ending::Failed(status, seq),
        }
    }
}
