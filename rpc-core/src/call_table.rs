//! The client's table of calls in flight on one connection.
//!
//! Call ids are never reused on a connection, so a late response for a call that was
//! cancelled or timed out finds no entry and is dropped.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::Thread;

use parking_lot::Mutex;

use crate::frame::InboundFrame;
use crate::header::FrameKind;
use crate::stream::{StreamShared, Wakes};
use crate::Status;

type CallResult = Result<InboundFrame, Status>;

enum Waiter {
    None,
    Task(Waker),
    Thread(Thread),
}

struct Slot {
    result: Option<CallResult>,
    waiter: Waiter,
}

struct Inner {
    /// Ids are ours and sequential, so a fast non-keyed hash is safe here.
    calls: FxHashMap<u64, Slot>,
    /// Streaming calls, from their start until their `Streaming` is done with them; their
    /// frames after the headers go here.
    streams: FxHashMap<u64, Arc<StreamShared>>,
    closed: Option<Status>,
}

/// Calls in flight on one client connection, completed by the transport's receive path.
pub struct CallTable {
    next_id: AtomicU64,
    /// Set once by [`CallTable::close`]: a lock-free look for channels choosing a connection.
    closed: AtomicBool,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for CallTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallTable")
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Default for CallTable {
    fn default() -> Self {
        CallTable::new()
    }
}

impl CallTable {
    /// An empty, open table.
    pub fn new() -> Self {
        CallTable {
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                calls: FxHashMap::default(),
                streams: FxHashMap::default(),
                closed: None,
            }),
        }
    }

    /// Registers a new call and returns its id, or the status that closed the connection.
    pub fn register(&self) -> Result<u64, Status> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.lock();
        if let Some(status) = &inner.closed {
            return Err(status.clone());
        }
        inner.calls.insert(
            id,
            Slot {
                result: None,
                waiter: Waiter::None,
            },
        );
        Ok(id)
    }

    /// Attaches the stream of streaming call `id` (registered), which from now on receives
    /// the call's stream frames and fails with the call.
    pub(crate) fn attach_stream(&self, id: u64, stream: Arc<StreamShared>) {
        self.inner.lock().streams.insert(id, stream);
    }

    /// Forgets the stream of call `id`: frames for it are dropped from now on.
    pub(crate) fn detach_stream(&self, id: u64) {
        // Dropped after the lock: it may hold views into transport memory.
        let stream = self.inner.lock().streams.remove(&id);
        drop(stream);
    }

    /// Feeds a stream frame ([`crate::stream::is_stream_frame`]) to its call, holding the
    /// wakeup of its reader or writer in `wakes`. Frames for calls that ended are dropped; a
    /// frame that breaks the stream's rules fails the call.
    pub fn on_stream_frame(&self, frame: InboundFrame, wakes: &mut Wakes) {
        let id = frame.header.call_id;
        if crate::stream::is_message_frame(frame.header.kind) {
            return self.on_stream_messages(id, [frame], wakes);
        }
        let (stream, awaiting_headers) = {
            let inner = self.inner.lock();
            let Some(stream) = inner.streams.get(&id) else {
                return tracing::debug!(call_id = id, kind = ?frame.header.kind, "stream frame for no open stream");
            };
            (stream.clone(), inner.calls.contains_key(&id))
        };
        let header = frame.header;
        if header.kind == FrameKind::HalfClose {
            let status = Status::internal("stream protocol violation: the server half-closed");
            stream.fail(status.clone());
            self.complete(id, Err(status));
            return;
        }
        // Trailers may overtake the headers when a transport hands frames up from two
        // threads: they go to the stream, and the call waits for its headers, unless they
        // carry an error, which ends the call either way.
        let early_error = (header.kind == FrameKind::Trailers
            && awaiting_headers
            && header.status != crate::Code::Ok)
            .then(|| {
                Status::new(
                    header.status,
                    String::from_utf8_lossy(&frame.payload).into_owned(),
                )
            });
        if let Err(status) = stream.on_frame(frame, wakes) {
            self.complete(id, Err(status));
        } else if let Some(status) = early_error {
            self.complete(id, Err(status));
        }
    }

    /// Feeds a run of `Message` and `Messages` frames of call `id` (in order; one lookup and one stream
    /// lock for the run), holding its reader's wakeup in `wakes`. As
    /// [`CallTable::on_stream_frame`], messages for calls that ended are dropped, and one
    /// that breaks the stream's rules fails the call.
    pub fn on_stream_messages(
        &self,
        id: u64,
        frames: impl IntoIterator<Item = InboundFrame>,
        wakes: &mut Wakes,
    ) {
        let stream = self.inner.lock().streams.get(&id).cloned();
        let Some(stream) = stream else {
            return tracing::debug!(call_id = id, "stream messages for no open stream");
        };
        if let Err(status) = stream.on_messages(frames, wakes) {
            self.complete(id, Err(status));
        }
    }

    /// Completes call `id`. Returns false if the call is unknown (cancelled, timed out, or a
    /// peer answering a call never made) or already complete. An error also fails the call's
    /// stream, if it has one.
    pub fn complete(&self, id: u64, result: CallResult) -> bool {
        let waiter = {
            let mut inner = self.inner.lock();
            match (&result, inner.streams.get(&id)) {
                (Err(status), Some(stream)) => stream.fail(status.clone()),
                // A unary answer to a streaming call (client streaming): the server reads
                // no more, so its senders stop.
                (Ok(frame), Some(stream)) if !frame.header.flags.contains(crate::Flags::STREAM) => {
                    stream.fail(Status::cancelled(
                        "the server answered before the stream ended",
                    ))
                }
                _ => {}
            }
            let Some(slot) = inner.calls.get_mut(&id) else {
                return false;
            };
            if slot.result.is_some() {
                return false;
            }
            slot.result = Some(result);
            std::mem::replace(&mut slot.waiter, Waiter::None)
        };
        wake(waiter);
        true
    }

    /// Polls call `id` from an async task.
    pub fn poll_call(&self, id: u64, cx: &mut Context<'_>) -> Poll<CallResult> {
        let mut inner = self.inner.lock();
        let Some(slot) = inner.calls.get_mut(&id) else {
            return Poll::Ready(Err(Status::internal(format!(
                "call {id} is not registered"
            ))));
        };
        if let Some(result) = slot.result.take() {
            inner.calls.remove(&id);
            return Poll::Ready(result);
        }
        match &slot.waiter {
            Waiter::Task(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waiter = Waiter::Task(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Takes the result of call `id` if it is complete (the call is then forgotten).
    pub fn take(&self, id: u64) -> Option<CallResult> {
        let mut inner = self.inner.lock();
        let slot = inner.calls.get_mut(&id)?;
        let result = slot.result.take()?;
        inner.calls.remove(&id);
        Some(result)
    }

    /// Takes the result of call `id` if it is complete; otherwise records `thread` to be
    /// unparked on completion.
    pub fn take_or_park_on(&self, id: u64, thread: &Thread) -> Option<CallResult> {
        let mut inner = self.inner.lock();
        let slot = inner.calls.get_mut(&id)?;
        if let Some(result) = slot.result.take() {
            inner.calls.remove(&id);
            return Some(result);
        }
        if !matches!(slot.waiter, Waiter::Thread(_)) {
            slot.waiter = Waiter::Thread(thread.clone());
        }
        None
    }

    /// Forgets call `id`. Returns true if it was still waiting for its response, i.e. the
    /// peer may still be working on it and deserves a cancel.
    pub fn remove(&self, id: u64) -> bool {
        // The slot may hold a response whose buffers belong to the transport; it is dropped
        // after the lock is released, since releasing them may call back into this table.
        let slot = self.inner.lock().calls.remove(&id);
        slot.is_some_and(|slot| slot.result.is_none())
    }

    /// Ends call `id` at its deadline: its result if one arrived in time, else `None` (and
    /// the call is forgotten, so a late answer is dropped).
    pub fn expire(&self, id: u64) -> Option<CallResult> {
        let slot = self.inner.lock().calls.remove(&id);
        slot.and_then(|slot| slot.result)
    }

    /// Fails every pending call with `status` and refuses new ones: the connection is gone.
    pub fn close(&self, status: Status) {
        let waiters: Vec<Waiter> = {
            let mut inner = self.inner.lock();
            if inner.closed.is_none() {
                inner.closed = Some(status.clone());
                self.closed.store(true, Ordering::Release);
            }
            let waiters = inner
                .calls
                .values_mut()
                .filter(|slot| slot.result.is_none())
                .map(|slot| {
                    slot.result = Some(Err(status.clone()));
                    std::mem::replace(&mut slot.waiter, Waiter::None)
                })
                .collect();
            for stream in inner.streams.values() {
                stream.fail(status.clone());
            }
            waiters
        };
        waiters.into_iter().for_each(wake);
    }

    /// The status the table was closed with, if it was.
    pub fn closed_status(&self) -> Option<Status> {
        self.inner.lock().closed.clone()
    }

    /// The table was closed: the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Number of calls registered and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.inner.lock().calls.len()
    }
}

fn wake(waiter: Waiter) {
    match waiter {
        Waiter::None => {}
        Waiter::Task(waker) => waker.wake(),
        Waiter::Thread(thread) => thread.unpark(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{FrameKind, Header};
    use bytes::Bytes;
    use std::sync::Arc;

    fn frame(id: u64) -> InboundFrame {
        InboundFrame {
            header: Header::new(FrameKind::Response, id),
            metadata: Bytes::new(),
            payload: Bytes::from(id.to_le_bytes().to_vec()),
        }
    }

    #[test]
    fn completes_each_call_once_and_drops_late_answers() {
        let table = CallTable::new();
        let a = table.register().unwrap();
        let b = table.register().unwrap();
        assert_ne!(a, b);
        assert!(table.complete(b, Ok(frame(b))));
        assert!(
            !table.complete(b, Ok(frame(b))),
            "second completion ignored"
        );
        let me = std::thread::current();
        assert!(table.take(a).is_none(), "a is not complete");
        assert!(table.take_or_park_on(a, &me).is_none());
        let got = table.take_or_park_on(b, &me).unwrap().unwrap();
        assert_eq!(got.header.call_id, b);
        assert!(table.take(b).is_none(), "b was taken");
        assert!(table.remove(a), "a was pending");
        assert!(!table.complete(a, Ok(frame(a))), "late response dropped");
        assert_eq!(table.in_flight(), 0);
    }

    #[test]
    fn close_fails_pending_and_refuses_new_calls() {
        let table = Arc::new(CallTable::new());
        let id = table.register().unwrap();
        let waiter = {
            let table = table.clone();
            std::thread::spawn(move || loop {
                if let Some(r) = table.take_or_park_on(id, &std::thread::current()) {
                    return r;
                }
                std::thread::park();
            })
        };
        table.close(Status::unavailable("peer went away"));
        let err = waiter.join().unwrap().unwrap_err();
        assert_eq!(err.code(), crate::Code::Unavailable);
        assert_eq!(table.register().unwrap_err().message(), "peer went away");
    }
}
