//! The streaming calls of one connection, and the stream frames that came before their
//! requests.
//!
//! A transport may hand a connection's frames up from more than one thread (an RDMA poller
//! and a caller spinning on the same completion queue), so a client's first messages, its
//! half-close or its window update can reach the dispatcher before the `Request` that opens
//! their stream. Such frames are held, and fed to the stream when it opens. Holding is
//! bounded by [`crate::server::ServerConfig::early_stream_frames`] per connection (frames,
//! whatever the messages each carries, and payload bytes, like a window; one frame may
//! overshoot the bytes of an empty hold, as a message may overshoot a window): past it the frames of the call that began holding
//! first are dropped, whole, until the new frame fits. Frames of calls that already ended
//! are held the same way (they cannot be told apart from early ones) and age out; since a
//! client's call ids only grow, they never reach a later call.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::frame::InboundFrame;
use crate::stream::{StreamShared, Window};

/// Keyed by peer-chosen call ids: std's randomly keyed hasher.
pub(crate) struct Streams {
    running: HashMap<u64, Arc<StreamShared>>,
    early: EarlyFrames,
}

impl Streams {
    pub(crate) fn new(early_limit: Window) -> Self {
        Streams {
            running: HashMap::new(),
            early: EarlyFrames::new(early_limit),
        }
    }

    /// The stream of `call_id` if it runs; else `frame` is held for its request (or dropped,
    /// if it cannot be early: `held` says which).
    pub(crate) fn route(&mut self, frame: InboundFrame, held: bool) -> Routed {
        match self.running.get(&frame.header.call_id) {
            Some(stream) => Routed::Running(stream.clone(), frame),
            None if held => {
                self.early.hold(frame);
                Routed::Held
            }
            None => Routed::Dropped,
        }
    }

    /// Holds `frame` for its request: the caller found no stream for it under this lock.
    pub(crate) fn hold(&mut self, frame: InboundFrame) {
        self.early.hold(frame);
    }

    pub(crate) fn get(&self, call_id: u64) -> Option<Arc<StreamShared>> {
        self.running.get(&call_id).cloned()
    }

    /// Registers the stream of a call whose request arrived; returns the frames of it that
    /// came first, in arrival order.
    pub(crate) fn open(&mut self, call_id: u64, stream: Arc<StreamShared>) -> Vec<InboundFrame> {
        self.running.insert(call_id, stream);
        self.early.take(call_id)
    }

    pub(crate) fn remove(&mut self, call_id: u64) -> Option<Arc<StreamShared>> {
        self.running.remove(&call_id)
    }

    /// Drops what is held for `call_id` (its request will not run: cancelled or refused).
    pub(crate) fn forget(&mut self, call_id: u64) {
        drop(self.early.take(call_id));
    }

    /// The connection closed: nothing held will be asked for.
    pub(crate) fn clear_early(&mut self) {
        self.early = EarlyFrames::new(self.early.limit);
    }

    #[cfg(test)]
    pub(crate) fn early_held(&self) -> Window {
        self.early.held
    }
}

/// Where [`Streams::route`] put a frame.
pub(crate) enum Routed {
    Running(Arc<StreamShared>, InboundFrame),
    Held,
    Dropped,
}

/// Frames held for calls whose request has not arrived, oldest call first.
struct EarlyFrames {
    limit: Window,
    held: Window,
    by_call: HashMap<u64, Vec<InboundFrame>>,
    /// Calls in the order they began holding; may name calls taken since (skipped).
    order: VecDeque<u64>,
}

impl EarlyFrames {
    fn new(limit: Window) -> Self {
        EarlyFrames {
            limit,
            held: Window {
                messages: 0,
                bytes: 0,
            },
            by_call: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn hold(&mut self, frame: InboundFrame) {
        let bytes = frame.payload.len() as u64 + frame.metadata.len() as u64;
        while !self.by_call.is_empty() && !self.fits(bytes) {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(dropped) = self.take(oldest).first() {
                tracing::debug!(
                    call_id = dropped.header.call_id,
                    "stream frames held for a request that did not come: dropped"
                );
            }
        }
        if self.limit.messages == 0 {
            return;
        }
        let call_id = frame.header.call_id;
        let frames = self.by_call.entry(call_id).or_default();
        if frames.is_empty() {
            self.order.push_back(call_id);
        }
        frames.push(frame);
        self.held.messages += 1;
        self.held.bytes += bytes;
    }

    fn fits(&self, bytes: u64) -> bool {
        self.held.messages < self.limit.messages && self.held.bytes + bytes <= self.limit.bytes
    }

    fn take(&mut self, call_id: u64) -> Vec<InboundFrame> {
        let Some(frames) = self.by_call.remove(&call_id) else {
            return Vec::new();
        };
        for frame in &frames {
            self.held.messages -= 1;
            self.held.bytes -= frame.payload.len() as u64 + frame.metadata.len() as u64;
        }
        if self.order.len() > 2 * self.by_call.len() + 16 {
            let by_call = &self.by_call;
            self.order.retain(|id| by_call.contains_key(id));
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::header::{FrameKind, Header};

    fn message(call_id: u64, seq: u32, len: usize) -> InboundFrame {
        let mut header = Header::new(FrameKind::Message, call_id);
        header.method_id = seq;
        InboundFrame {
            header,
            metadata: Bytes::new(),
            payload: Bytes::from(vec![0; len]),
        }
    }

    fn seqs(frames: &[InboundFrame]) -> Vec<u32> {
        frames.iter().map(|f| f.header.method_id).collect()
    }

    #[test]
    fn held_frames_reach_their_stream_in_arrival_order() {
        let mut streams = Streams::new(Window {
            messages: 8,
            bytes: 1024,
        });
        for seq in [2, 1, 3] {
            assert!(matches!(
                streams.route(message(5, seq, 10), true),
                Routed::Held
            ));
        }
        assert!(matches!(
            streams.route(message(6, 1, 10), true),
            Routed::Held
        ));
        let shared = Arc::new(StreamShared::new(crate::stream::INITIAL_WINDOW, 1 << 20));
        assert_eq!(seqs(&streams.open(5, shared)), [2, 1, 3]);
        assert!(matches!(
            streams.route(message(5, 4, 10), true),
            Routed::Running(..)
        ));
        assert_eq!(
            streams.early_held(),
            Window {
                messages: 1,
                bytes: 10
            },
            "call 6's frame is still held"
        );
        streams.forget(6);
        assert_eq!(streams.early_held().messages, 0);
    }

    #[test]
    fn past_the_limit_the_oldest_calls_frames_go_first() {
        let limit = Window {
            messages: 4,
            bytes: 100,
        };
        let mut streams = Streams::new(limit);
        streams.route(message(1, 1, 10), true);
        streams.route(message(2, 1, 10), true);
        streams.route(message(1, 2, 10), true);
        streams.route(message(3, 1, 10), true);
        // Full by count: call 1 (both its frames) goes for call 4.
        streams.route(message(4, 1, 10), true);
        assert!(streams.early.take(1).is_empty());
        assert_eq!(streams.early_held().messages, 3);
        // Full by bytes: 30 held, call 2 goes for 75 more.
        streams.route(message(5, 1, 75), true);
        assert!(streams.early.take(2).is_empty());
        assert_eq!(
            streams.early_held(),
            Window {
                messages: 3,
                bytes: 95
            }
        );
        // One frame larger than the limit overshoots an empty hold, as a message may
        // overshoot a window, and is dropped for the next.
        streams.route(message(6, 1, 500), true);
        assert_eq!(streams.early_held().bytes, 500);
        streams.route(message(7, 1, 1), true);
        assert_eq!(
            streams.early_held(),
            Window {
                messages: 1,
                bytes: 1
            }
        );
        assert_eq!(seqs(&streams.early.take(7)), [1]);
    }

    #[test]
    fn a_flood_of_frames_for_calls_that_never_open_stays_within_the_limit() {
        let limit = Window {
            messages: 64,
            bytes: 4096,
        };
        let mut streams = Streams::new(limit);
        for call_id in 0..100_000u64 {
            streams.route(message(call_id, 1, (call_id % 200) as usize), true);
            let held = streams.early_held();
            assert!(held.messages <= limit.messages && held.bytes <= limit.bytes);
        }
        assert!(streams.early.order.len() <= 2 * streams.early.by_call.len() + 17);
        assert!(matches!(
            streams.route(message(1, 1, 1), false),
            Routed::Dropped
        ));
    }

    #[test]
    fn no_limit_holds_nothing() {
        let mut streams = Streams::new(Window {
            messages: 0,
            bytes: 0,
        });
        streams.route(message(1, 1, 0), true);
        assert_eq!(streams.early_held().messages, 0);
        assert!(streams.early.order.is_empty());
    }
}
