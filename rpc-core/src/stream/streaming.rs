//! [`Streaming`]: the messages of a stream as a `futures::Stream`, and its blocking form.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use prost::Message;

use super::flow::{take_single, Item, Single};
use super::shared::{Next, StreamEnd, StreamShared};
use super::{Link, WindowUpdate};
use crate::transport::Drive;
use crate::MetadataMap;
use crate::{Code, Status};

/// Dropped when a [`Streaming`] ends or is dropped: a client's guard, which detaches the
/// stream and cancels the call unless the server ended it.
pub(crate) type OnDrop = Box<dyn std::any::Any + Send + Sync>;

/// Work a stream does while it is read: the request side of a client's bidirectional call
/// when no runtime was there to run it.
pub(crate) type Pump = BoxFuture<'static, ()>;

/// The messages of a stream: a `futures::Stream` of `Result<T, Status>`, as in tonic.
///
/// It ends with `None` when the peer ends the stream with an OK status; a failed call
/// yields its status once (after the messages that preceded it), then `None`. Dropping it
/// before the end cancels the call on a client.
#[must_use = "streams do nothing unless polled"]
pub struct Streaming<T> {
    shared: Arc<StreamShared>,
    link: Link,
    call_id: u64,
    /// Room consumed and not yet returned because the link had none for the update.
    unsent: Option<WindowUpdate>,
    /// Items taken from the shared state in one batch, not yet read.
    batch: VecDeque<Item<StreamEnd>>,
    /// Messages and bytes read from earlier batches, not yet reported as used.
    taken: (u64, u64),
    /// The stream ended (end or failure taken).
    done: bool,
    trailers: Option<MetadataMap>,
    /// A client task driving the transport's completions while it waits.
    driving: bool,
    pump: Option<Pump>,
    on_drop: Option<OnDrop>,
    _message: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Streaming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming")
            .field("call_id", &self.call_id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<T> Streaming<T> {
    pub(crate) fn new(
        shared: Arc<StreamShared>,
        link: Link,
        call_id: u64,
        on_drop: Option<OnDrop>,
    ) -> Self {
        Streaming {
            shared,
            link,
            call_id,
            unsent: None,
            batch: VecDeque::new(),
            taken: (0, 0),
            done: false,
            trailers: None,
            driving: false,
            pump: None,
            on_drop,
            _message: PhantomData,
        }
    }

    /// The same stream, its messages read as `U`: for one that went through a tower service
    /// type-erased.
    pub(crate) fn retype<U>(mut self) -> Streaming<U> {
        let retyped = Streaming {
            shared: self.shared.clone(),
            link: self.link.clone(),
            call_id: self.call_id,
            unsent: self.unsent.take(),
            batch: std::mem::take(&mut self.batch),
            taken: std::mem::take(&mut self.taken),
            done: self.done,
            trailers: self.trailers.take(),
            driving: std::mem::take(&mut self.driving),
            pump: self.pump.take(),
            on_drop: self.on_drop.take(),
            _message: PhantomData,
        };
        // What is left of this one ends quietly: the new one reads on.
        self.done = true;
        retyped
    }

    /// Also drives `pump` whenever the stream is polled.
    pub(crate) fn with_pump(mut self, pump: Pump) -> Self {
        self.pump = Some(pump);
        self
    }

    /// The trailing metadata, once the stream ended with trailers.
    pub fn trailers(&self) -> Option<&MetadataMap> {
        self.trailers.as_ref()
    }

    /// Sends the room consumed so far (`update`, and what is still unsent) back to the
    /// peer; without room on the link it stays due and goes on a later poll.
    fn return_room(&mut self, cx: &mut Context<'_>, update: Option<WindowUpdate>) {
        if let Some(update) = update {
            let unsent = self.unsent.get_or_insert_with(WindowUpdate::default);
            unsent.messages += update.messages;
            unsent.bytes += update.bytes;
        }
        let Some(update) = self.unsent else {
            return;
        };
        let link = &self.link;
        match update.with_frame(self.call_id, |frame| link.poll_send(cx, frame)) {
            Poll::Pending => {}
            // A failed send means the connection is gone: the stream fails on its own.
            Poll::Ready(_) => self.unsent = None,
        }
    }

    /// The next item of the batch taken from the shared state, if it holds one; messages
    /// read count as taken.
    fn read_batched(&mut self) -> Option<Option<Result<T, Status>>>
    where
        T: Message + Default,
    {
        let next = match take_single(&mut self.batch, |batch| batch.pop_with(|buf| decode(buf)))? {
            Single::Read((message, len)) => {
                self.taken.0 += 1;
                self.taken.1 += len as u64;
                return Some(Some(message));
            }
            Single::Message(payload) => {
                self.taken.0 += 1;
                self.taken.1 += payload.len() as u64;
                Next::Message(payload)
            }
            Single::End(end) => Next::End(end),
        };
        Some(self.item(next))
    }

    /// Turns what the shared state handed out into the stream's item.
    fn item(&mut self, next: Next) -> Option<Result<T, Status>>
    where
        T: Message + Default,
    {
        match next {
            Next::Message(payload) => Some(decode(payload)),
            Next::End(end) => {
                self.done = true;
                match end {
                    StreamEnd::HalfClose => None,
                    StreamEnd::Trailers { status, metadata } => {
                        self.trailers = Some(metadata);
                        (status.code() != Code::Ok).then_some(Err(status))
                    }
                }
            }
            Next::Failed(status) => {
                self.done = true;
                Some(Err(status))
            }
        }
    }

    fn finish(&mut self) {
        self.link.stop_driving(&mut self.driving);
        self.pump = None;
        if self.done {
            self.on_drop = None;
        }
    }
}

impl<T: Message + Default> Streaming<T> {
    /// The next message: `Ok(None)` at the end of the stream, the status if the call
    /// failed (as tonic's `Streaming::message`).
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        match poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await {
            Some(Ok(message)) => Ok(Some(message)),
            Some(Err(status)) => Err(status),
            None => Ok(None),
        }
    }

    /// The blocking form: an iterator that waits on the calling thread.
    pub fn into_blocking(self) -> BlockingStreaming<T> {
        BlockingStreaming(self)
    }
}

impl<T: Message + Default> Stream for Streaming<T> {
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(pump) = &mut this.pump {
            if pump.poll_unpin(cx).is_ready() {
                this.pump = None;
            }
        }
        loop {
            if let Some(item) = this.read_batched() {
                if this.done {
                    this.finish();
                }
                return Poll::Ready(item);
            }
            let taken = std::mem::take(&mut this.taken);
            let (next, update) = this.shared.poll_batch(cx, taken, &mut this.batch);
            this.return_room(cx, update);
            match next {
                Poll::Ready(None) => continue,
                Poll::Ready(Some(failed)) => {
                    let item = this.item(Next::Failed(failed));
                    this.finish();
                    return Poll::Ready(item);
                }
                Poll::Pending => {}
            }
            match this.link.drive(cx, &mut this.driving) {
                Drive::Received => continue,
                Drive::Spin => cx.waker().wake_by_ref(),
                Drive::Wait => {}
            }
            return Poll::Pending;
        }
    }
}

impl<T> Drop for Streaming<T> {
    fn drop(&mut self) {
        self.finish();
        if !self.done {
            self.shared.reader_gone();
        }
        // The guard goes after the reader: it decides whether to cancel from the state.
        self.on_drop = None;
    }
}

/// A [`Streaming`] read by blocking the calling thread: an iterator of messages.
#[derive(Debug)]
pub struct BlockingStreaming<T>(Streaming<T>);

impl<T> BlockingStreaming<T> {
    /// The trailing metadata, once the stream ended with trailers.
    pub fn trailers(&self) -> Option<&MetadataMap> {
        self.0.trailers()
    }
}

impl<T: Message + Default> Iterator for BlockingStreaming<T> {
    type Item = Result<T, Status>;

    fn next(&mut self) -> Option<Self::Item> {
        let s = &mut self.0;
        if s.done {
            return None;
        }
        let me = std::thread::current();
        loop {
            let (next, update) = s.shared.next_or_park_on(&me);
            if let Some(update) = update {
                send_update_blocking(&s.link, s.call_id, update);
            }
            if let Some(next) = next {
                return s.item(next);
            }
            if !s.link.poll_progress() {
                std::thread::park();
            }
        }
    }
}

/// Decodes one stream message.
fn decode<T: Message + Default>(buf: impl bytes::Buf) -> Result<T, Status> {
    T::decode(buf).map_err(|e| Status::internal(format!("failed to decode a stream message: {e}")))
}

fn send_update_blocking(link: &Link, call_id: u64, update: WindowUpdate) {
    // A failed send means the connection is gone: the stream fails on its own.
    let _ = update.with_frame(call_id, |frame| link.send(frame));
}
