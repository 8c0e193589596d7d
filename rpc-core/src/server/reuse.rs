//! The two heap blocks a unary call's handler run needs, reused by the thread that runs it.
//!
//! A handler's future is type-erased behind [`Service`](super::Service), and so is its
//! reply message: each needs a heap block. A handler run gives its block back to the thread
//! that polled it when it finishes, and a reply's once it is sent; a call answered inline
//! (its handler finished at its first poll, on the transport's receive thread) so hands
//! both blocks back to that thread, and the next call of the same method takes them again:
//! a steady stream of calls allocates nothing. Each thread keeps at most [`SPARE_FUTURES`]
//! future blocks (a handler run inside another, as an interceptor's, takes the second: the
//! last handed back is the first taken) and one reply block, so what is kept is bounded by
//! the largest handler futures and reply message; a block of the wrong size or type is
//! simply replaced. A handler that waits finishes on the runtime, whose thread keeps its
//! block, and the next call on the receive thread allocates anew.
//!
//! Neither block keeps what it held: a handler's future is dropped as soon as it finishes
//! (its allocation stays), and a reply is reset to its default once sent.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;
use tokio_util::sync::ReusableBoxFuture;

use crate::body::EncodeBody;
use crate::server::ServerReply;
use crate::Status;

type Output = Result<ServerReply, Status>;

/// Most handler future blocks a thread keeps for reuse.
pub const SPARE_FUTURES: usize = 4;

thread_local! {
    /// The blocks of the last handler futures that finished on this thread, the last one
    /// last.
    static SPARE_FUTURE: RefCell<Vec<ReusableBoxFuture<'static, Output>>> =
        const { RefCell::new(Vec::new()) };
    /// The block of the last reply sent from this thread, reset to its type's default.
    static SPARE_REPLY: Cell<Option<Box<dyn Any + Send>>> = const { Cell::new(None) };
}

/// A handler run: what [`Service::call`](super::Service::call) returns. It runs the future
/// it is made from, in a heap block the thread reuses from call to call: when the future
/// finishes, its block goes back to the thread that polled it last.
pub struct HandlerFuture(Option<ReusableBoxFuture<'static, Output>>);

impl HandlerFuture {
    /// A handler run of `future`, in the block the thread's last finished run left if it
    /// fits (else in a new one).
    pub fn new<F>(future: F) -> HandlerFuture
    where
        F: Future<Output = Output> + Send + 'static,
    {
        // Fused: the future is dropped when it finishes, not when its block is next reused.
        let future = future.fuse();
        match SPARE_FUTURE.with_borrow_mut(Vec::pop) {
            Some(mut block) => {
                block.set(future);
                HandlerFuture(Some(block))
            }
            None => HandlerFuture(Some(ReusableBoxFuture::new(future))),
        }
    }

    /// Where the future lives.
    #[cfg(test)]
    fn block(&mut self) -> *const u8 {
        let block = self.0.as_mut().expect("the run has not finished");
        &*block.get_pin() as *const (dyn Future<Output = Output> + Send) as *const u8
    }
}

/// The block of a run that finished goes back to this thread.
fn give_back(block: ReusableBoxFuture<'static, Output>) {
    SPARE_FUTURE.with_borrow_mut(|spare| {
        if spare.len() < SPARE_FUTURES {
            spare.push(block);
        }
    });
}

impl Future for HandlerFuture {
    type Output = Output;

    /// Panics if polled after it returned `Ready`.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output> {
        let block = self
            .0
            .as_mut()
            .expect("a HandlerFuture polled after it finished");
        let output = std::task::ready!(block.poll(cx));
        if let Some(block) = self.0.take() {
            give_back(block);
        }
        Poll::Ready(output)
    }
}

impl std::fmt::Debug for HandlerFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerFuture").finish_non_exhaustive()
    }
}

/// A reply body whose heap block the server reuses: every prost message.
pub trait ReplyBody: EncodeBody + 'static {
    /// The reply was sent: empties it and hands its block to the thread's next reply.
    fn recycle(self: Box<Self>);
}

impl<M: prost::Message + Default + 'static> ReplyBody for M {
    fn recycle(mut self: Box<Self>) {
        if std::mem::size_of::<M>() == 0 {
            // A zero-sized box owns no block: the spare one is worth more.
            return;
        }
        // What the reply held (a view of a receive buffer, say) is let go now.
        *self = M::default();
        SPARE_REPLY.set(Some(self));
    }
}

/// A reply body of any type (a pre-encoded message, a shared one): its block is not reused.
pub(crate) struct AnyBody(pub(crate) Box<dyn EncodeBody>);

impl EncodeBody for AnyBody {
    fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }

    fn encode_into(&self, dst: &mut [u8]) {
        self.0.encode_into(dst);
    }

    fn encode_gathered(
        &self,
        dst: Option<&mut [u8]>,
        gather: &mut dyn crate::body::Gather,
    ) -> usize {
        self.0.encode_gathered(dst, gather)
    }
}

impl ReplyBody for AnyBody {
    fn recycle(self: Box<Self>) {}
}

/// `message` in a heap block: the thread's spare one if it holds this type, else a new one.
pub(crate) fn reply_box<M: ReplyBody + Send>(message: M) -> Box<dyn ReplyBody> {
    let spare = SPARE_REPLY.take();
    match spare.map(|block| block.downcast::<M>()) {
        Some(Ok(mut block)) => {
            *block = message;
            block
        }
        Some(Err(other)) => {
            SPARE_REPLY.set(Some(other));
            Box::new(message)
        }
        None => Box::new(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MetadataMap;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Note {
        #[prost(bytes = "bytes", tag = "1")]
        body: bytes::Bytes,
    }

    fn address(reply: &ServerReply) -> *const u8 {
        &*reply.body as *const dyn ReplyBody as *const u8
    }

    #[test]
    fn a_sent_reply_block_is_reused_and_lets_go_of_what_it_held() {
        let payload = bytes::Bytes::from(vec![7u8; 64]);
        let first = ServerReply::new(
            MetadataMap::new(),
            Note {
                body: payload.clone(),
            },
        );
        let block = address(&first);
        assert!(!payload.is_unique(), "the reply holds the payload");
        first.recycle();
        assert!(
            payload.is_unique(),
            "a recycled reply must not keep what it held"
        );
        let second = ServerReply::new(MetadataMap::new(), Note::default());
        assert_eq!(address(&second), block, "the block was not reused");
        // Another type cannot take the block, and does not lose it either.
        second.recycle();
        let other = ServerReply::new(MetadataMap::new(), ());
        assert_ne!(address(&other), block);
        let third = ServerReply::new(MetadataMap::new(), Note::default());
        assert_eq!(address(&third), block);
    }

    /// The same future type each time, holding `held` until it finishes.
    fn handler(held: std::sync::Arc<()>) -> HandlerFuture {
        HandlerFuture::new(async move {
            let _held = held;
            Err(Status::cancelled("done"))
        })
    }

    #[test]
    fn a_finished_handler_future_is_dropped_and_its_block_reused() {
        let held = std::sync::Arc::new(());
        let mut run = handler(held.clone());
        let block = run.block();
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(Pin::new(&mut run).poll(&mut cx).is_ready());
        assert_eq!(
            std::sync::Arc::strong_count(&held),
            1,
            "a finished future must not keep what it captured"
        );
        let mut again = handler(held.clone());
        assert_eq!(again.block(), block, "the block was not reused");
    }

    /// A reply of any body encodes it, and leaves the thread's spare block alone.
    #[test]
    fn a_reply_of_any_body_encodes_it_and_keeps_no_block() {
        use crate::body::SharedBody;
        let note = Note {
            body: bytes::Bytes::from_static(b"pre-encoded"),
        };
        let body = Box::new(SharedBody::new(note.clone()));
        let reply = ServerReply::from_body(MetadataMap::new(), body);
        let mut encoded = vec![0; reply.body().encoded_len()];
        reply.body().encode_into(&mut encoded);
        assert_eq!(encoded, prost::Message::encode_to_vec(&note));
        SPARE_REPLY.set(None);
        reply.recycle();
        assert!(
            SPARE_REPLY.take().is_none(),
            "a reply of any body keeps no block"
        );
    }

    /// A run nested in another (an interceptor's service around the handler's) finishes
    /// first and is made second: the last block handed back is the first taken, so each
    /// gets its own back.
    #[test]
    fn nested_runs_each_get_their_own_block_back() {
        let held = std::sync::Arc::new(());
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let outer_of =
            |held: std::sync::Arc<()>| HandlerFuture::new(async move { handler(held).await });
        let mut outer = outer_of(held.clone());
        let outer_block = outer.block();
        assert!(Pin::new(&mut outer).poll(&mut cx).is_ready());
        // Two blocks are kept now; the next nested pair takes both.
        assert_eq!(SPARE_FUTURE.with_borrow(|spare| spare.len()), 2);
        let mut outer = outer_of(held.clone());
        assert_eq!(outer.block(), outer_block, "the outer block was not reused");
        assert!(Pin::new(&mut outer).poll(&mut cx).is_ready());
        assert_eq!(SPARE_FUTURE.with_borrow(|spare| spare.len()), 2);
    }
}
