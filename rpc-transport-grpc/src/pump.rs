//! Messages that arrive by HTTP/2, handed to the upper side as its stream window has room:
//! a server's request messages, a client's response messages.

use bytes::Bytes;
use http_body::Body;
use rpc_core::stream::MESSAGES_PER_POLL;
use rpc_core::{FrameKind, Status};

use crate::codec::MessageReader;
use crate::conn::{stream_frame, GrpcConn};

/// Hands call `id`'s messages from `reader` to the upper side as `Message` frames, each
/// once the upper side's window has room; returns the sequence number of the end (one past
/// the last message) once the body ended, or `None` if the call ended first or failed (its
/// reply then says why).
pub(crate) async fn pump<B>(conn: &GrpcConn, id: u64, reader: &mut MessageReader<B>) -> Option<u32>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
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
        match next? {
            Ok(Some(message)) => {
                if seq == u32::MAX {
                    let status = Status::resource_exhausted(
                        "the stream is longer than a stream carries (2^32 - 2 messages)",
                    );
                    conn.fail_call(id, status);
                    return None;
                }
                conn.take_room(id, message.len());
                conn.deliver(stream_frame(FrameKind::Message, id, seq, message));
                seq += 1;
            }
            Ok(None) => return Some(seq),
            Err(status) => {
                conn.fail_call(id, status);
                return None;
            }
        }
    }
}
