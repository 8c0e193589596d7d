//! The client's table of calls in flight on one connection.
//!
//! A slab: a call's id carries the index of its slot in its low [`INDEX_BITS`] bits and a
//! sequence number in the rest, so finding a call is an index and a compare, and no id is
//! ever reused on a connection (ids only grow): a late response for a call that was
//! cancelled or timed out finds its slot free, or holding a later call, and is dropped.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::Thread;

use parking_lot::Mutex;

use crate::frame::InboundFrame;
use crate::header::FrameKind;
use crate::stream::{StreamShared, Wakes};
use crate::Status;

type CallResult = Result<InboundFrame, Status>;

/// Bits of a call id that index its slot: a connection has at most 2^20 (1,048,576) calls
/// in flight ([`MAX_CALLS_IN_FLIGHT`]).
const INDEX_BITS: u32 = 20;

/// Most calls one connection may have in flight; past it, a new call fails with
/// `RESOURCE_EXHAUSTED` until one ends (a server runs at most 1,024 per connection unless
/// configured otherwise: `ServerConfig::max_calls_per_connection`).
pub const MAX_CALLS_IN_FLIGHT: usize = 1 << INDEX_BITS;

/// Most calls a connection numbers in its life (2^44, over 17 trillion): then its ids are
/// spent, and the table closes (`UNAVAILABLE`), so that the channel opens a new connection.
const MAX_SEQUENCE: u64 = (1 << (64 - INDEX_BITS)) - 1;

enum Waiter {
    None,
    Task(Waker),
    Thread(Thread),
}

/// A slot of the slab: free while `id` is 0 (no call has id 0).
struct Slot {
    id: u64,
    result: Option<CallResult>,
    waiter: Waiter,
}

impl Slot {
    const FREE: Slot = Slot {
        id: 0,
        result: None,
        waiter: Waiter::None,
    };
}

struct Inner {
    slots: Vec<Slot>,
    /// Indices of free slots, the most recently freed last (reused first: warm in cache).
    free: Vec<u32>,
    /// The sequence number of the next call: ids grow with it.
    next_seq: u64,
    /// Most slots in use at once: [`MAX_CALLS_IN_FLIGHT`], lower in tests.
    capacity: usize,
    /// Streaming calls, from their start until their `Streaming` is done with them; their
    /// frames after the headers go here.
    streams: FxHashMap<u64, Arc<StreamShared>>,
    closed: Option<Status>,
}

/// The index of call `id`'s slot.
fn index_of(id: u64) -> usize {
    (id & (MAX_CALLS_IN_FLIGHT as u64 - 1)) as usize
}

impl Inner {
    /// Slots holding a call.
    fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The slot of call `id`, if that call is still in the table.
    fn slot(&mut self, id: u64) -> Option<&mut Slot> {
        let slot = self.slots.get_mut(index_of(id))?;
        (slot.id == id && id != 0).then_some(slot)
    }

    /// Frees the slot of call `id` (found by [`Inner::slot`]) and gives back its result and
    /// its waiter, to be dropped after the lock (a response may hold transport memory whose
    /// release calls back into this table).
    fn free(&mut self, id: u64) -> (Option<CallResult>, Waiter) {
        let index = index_of(id);
        self.free.push(index as u32);
        let slot = &mut self.slots[index];
        slot.id = 0;
        (
            slot.result.take(),
            std::mem::replace(&mut slot.waiter, Waiter::None),
        )
    }

    /// Takes call `id`'s result if it has one, freeing its slot (whose waiter went with the
    /// result: [`CallTable::complete`]).
    fn take(&mut self, id: u64) -> Option<CallResult> {
        self.slot(id)?.result.as_ref()?;
        self.free(id).0
    }
}

/// Calls in flight on one client connection, completed by the transport's receive path.
pub struct CallTable {
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
        CallTable::with_capacity_limit(MAX_CALLS_IN_FLIGHT)
    }

    /// An empty table for at most `capacity` calls at once.
    fn with_capacity_limit(capacity: usize) -> Self {
        CallTable {
            closed: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                slots: Vec::new(),
                free: Vec::new(),
                next_seq: 1,
                capacity: capacity.min(MAX_CALLS_IN_FLIGHT),
                streams: FxHashMap::default(),
                closed: None,
            }),
        }
    }

    /// Registers a new call and returns its id, or the status that closed the connection
    /// (or `RESOURCE_EXHAUSTED`: [`MAX_CALLS_IN_FLIGHT`] calls are in flight).
    pub fn register(&self) -> Result<u64, Status> {
        let mut inner = self.inner.lock();
        if let Some(status) = &inner.closed {
            return Err(status.clone());
        }
        if inner.next_seq > MAX_SEQUENCE {
            drop(inner);
            let status = Status::unavailable(format!(
                "this connection numbered {MAX_SEQUENCE} calls, all the ids it has; \
                 a new connection takes the next calls"
            ));
            self.close(status.clone());
            return Err(status);
        }
        let index = match inner.free.pop() {
            Some(index) => index,
            None if inner.slots.len() < inner.capacity => {
                inner.slots.push(Slot::FREE);
                (inner.slots.len() - 1) as u32
            }
            None => {
                return Err(Status::resource_exhausted(format!(
                    "this connection has {} calls in flight, the most one connection numbers",
                    inner.live()
                )))
            }
        };
        let id = (inner.next_seq << INDEX_BITS) | u64::from(index);
        inner.next_seq += 1;
        inner.slots[index as usize].id = id;
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
            let mut inner = self.inner.lock();
            let Some(stream) = inner.streams.get(&id).cloned() else {
                return tracing::debug!(call_id = id, kind = ?frame.header.kind, "stream frame for no open stream");
            };
            (stream, inner.slot(id).is_some())
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
            .then(|| frame.status());
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
            let Some(slot) = inner.slot(id) else {
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
        if let Some(result) = inner.take(id) {
            return Poll::Ready(result);
        }
        let Some(slot) = inner.slot(id) else {
            return Poll::Ready(Err(Status::internal(format!(
                "call {id} is not registered"
            ))));
        };
        match &slot.waiter {
            Waiter::Task(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waiter = Waiter::Task(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Takes the result of call `id` if it is complete (the call is then forgotten).
    pub fn take(&self, id: u64) -> Option<CallResult> {
        self.inner.lock().take(id)
    }

    /// Takes the result of call `id` if it is complete; otherwise records `thread` to be
    /// unparked on completion.
    pub fn take_or_park_on(&self, id: u64, thread: &Thread) -> Option<CallResult> {
        let mut inner = self.inner.lock();
        if let Some(result) = inner.take(id) {
            return Some(result);
        }
        let slot = inner.slot(id)?;
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
        let (result, _waiter) = {
            let mut inner = self.inner.lock();
            if inner.slot(id).is_none() {
                return false;
            }
            inner.free(id)
        };
        result.is_none()
    }

    /// Ends call `id` at its deadline: its result if one arrived in time, else `None` (and
    /// the call is forgotten, so a late answer is dropped).
    pub fn expire(&self, id: u64) -> Option<CallResult> {
        let (result, _waiter) = {
            let mut inner = self.inner.lock();
            inner.slot(id)?;
            inner.free(id)
        };
        result
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
                .slots
                .iter_mut()
                .filter(|slot| slot.id != 0 && slot.result.is_none())
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
        self.inner.lock().live()
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
    fn ids_only_grow_and_an_answer_for_a_call_gone_never_reaches_the_call_in_its_slot() {
        let table = CallTable::new();
        let first = table.register().unwrap();
        assert!(table.remove(first), "first was pending");
        let second = table.register().unwrap();
        assert!(second > first, "ids grow");
        assert_eq!(
            first & (MAX_CALLS_IN_FLIGHT as u64 - 1),
            second & (MAX_CALLS_IN_FLIGHT as u64 - 1),
            "the freed slot is reused"
        );
        assert!(
            !table.complete(first, Ok(frame(first))),
            "late answer dropped"
        );
        assert!(table.take(second).is_none(), "the new call is not complete");
        assert!(table.complete(second, Ok(frame(second))));
        assert_eq!(table.take(second).unwrap().unwrap().header.call_id, second);
        assert!(!table.complete(0, Ok(frame(0))), "id 0 is no call's");
        assert_eq!(table.in_flight(), 0);
    }

    #[test]
    fn a_full_table_refuses_calls_until_one_ends() {
        let table = CallTable::with_capacity_limit(3);
        let ids: Vec<u64> = (0..3).map(|_| table.register().unwrap()).collect();
        let err = table.register().unwrap_err();
        assert_eq!(err.code(), crate::Code::ResourceExhausted);
        assert!(
            err.message().contains("3 calls in flight"),
            "{}",
            err.message()
        );
        assert!(!table.is_closed(), "the connection stays usable");
        assert!(table.complete(ids[1], Ok(frame(ids[1]))));
        assert!(table.take(ids[1]).is_some());
        let again = table.register().expect("a slot is free again");
        assert!(again > ids[2]);
        assert_eq!(table.in_flight(), 3);
    }

    #[test]
    fn a_connection_whose_ids_are_spent_closes() {
        let table = CallTable::new();
        table.inner.lock().next_seq = MAX_SEQUENCE;
        let last = table.register().expect("the last id");
        assert_eq!(last >> INDEX_BITS, MAX_SEQUENCE);
        let err = table.register().unwrap_err();
        assert_eq!(err.code(), crate::Code::Unavailable);
        assert!(table.is_closed());
        let pending = table.take(last).expect("failed by the close").unwrap_err();
        assert_eq!(pending.code(), crate::Code::Unavailable);
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
