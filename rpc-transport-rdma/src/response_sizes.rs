//! What a client expects each method to answer with, so that it can advertise a response
//! buffer with the request when the answer will not fit a receive slot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rpc_core::client::Responses;
use rpc_core::frame::InboundFrame;
use rpc_core::stream::Wakes;
use rpc_core::{FrameKind, Header, Inbound, Status};

/// Methods remembered at most; a peer echoing endless method ids cannot grow the table.
const MAX_METHODS: usize = 1024;

/// The size of the last large response of each method, learnt from the responses (which
/// echo their request's method id).
///
/// A method whose last response was large gets a response buffer of that size advertised
/// with its next request; a small response forgets it again. A wrong guess costs a window
/// bind and its invalidation, never correctness: a response that does not fit takes the
/// rendezvous.
#[derive(Debug)]
pub(crate) struct ResponseSizes {
    /// Bodies up to this many bytes arrive in a receive slot.
    slot_body: u64,
    /// The table is not empty: the check small responses pay is one load.
    any: AtomicBool,
    sizes: Mutex<HashMap<u32, u64>>,
}

impl ResponseSizes {
    /// A table for a connection whose receive slots carry bodies of up to `slot_body` bytes.
    pub(crate) fn new(slot_body: u64) -> Self {
        ResponseSizes {
            slot_body,
            any: AtomicBool::new(false),
            sizes: Mutex::new(HashMap::new()),
        }
    }

    /// A response of `len` body bytes arrived for `method_id`.
    pub(crate) fn observe(&self, method_id: u32, len: u64) {
        if len <= self.slot_body {
            if self.any.load(Ordering::Relaxed) {
                let mut sizes = self.sizes.lock();
                sizes.remove(&method_id);
                self.any.store(!sizes.is_empty(), Ordering::Relaxed);
            }
            return;
        }
        let mut sizes = self.sizes.lock();
        if sizes.len() < MAX_METHODS || sizes.contains_key(&method_id) {
            sizes.insert(method_id, len);
            self.any.store(true, Ordering::Relaxed);
        }
    }

    /// The response buffer to advertise with a request for `method_id`, if any.
    pub(crate) fn predict(&self, method_id: u32) -> Option<u64> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.sizes.lock().get(&method_id).copied()
    }
}

/// A client connection's inbound side: core's [`Responses`] complete the calls, and each
/// response's size is learnt on its way to them.
pub(crate) struct SizedResponses {
    pub(crate) responses: Responses,
    pub(crate) sizes: Arc<ResponseSizes>,
}

impl Inbound for SizedResponses {
    fn on_frame(&self, frame: InboundFrame, wakes: &mut Wakes) -> Result<(), Status> {
        let header = &frame.header;
        // Call id 0 is the connection's, not a method's.
        if header.kind == FrameKind::Response && header.call_id != 0 {
            let len = frame.metadata.len() + frame.payload.len();
            self.sizes.observe(header.method_id, len as u64);
        }
        self.responses.on_frame(frame, wakes)
    }

    fn on_messages(&self, call_id: u64, run: &mut Vec<InboundFrame>, wakes: &mut Wakes) {
        self.responses.on_messages(call_id, run, wakes);
    }

    fn on_oversized(&self, header: &Header, declared: u64) {
        self.responses.on_oversized(header, declared);
    }

    fn on_dropped(&self, call_id: u64, kind: FrameKind) {
        self.responses.on_dropped(call_id, kind);
    }

    fn on_transfer_failed(&self, call_id: u64, kind: FrameKind, status: Status) {
        self.responses.on_transfer_failed(call_id, kind, status);
    }

    fn idle(&self) -> bool {
        self.responses.idle()
    }

    fn on_closed(&self, status: Status) {
        self.responses.on_closed(status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_responses_are_remembered_until_a_small_one_comes() {
        let sizes = ResponseSizes::new(1000);
        assert_eq!(sizes.predict(7), None);
        sizes.observe(7, 1000);
        assert_eq!(sizes.predict(7), None, "a slot-sized body needs no buffer");
        sizes.observe(7, 5000);
        sizes.observe(8, 1 << 20);
        assert_eq!(sizes.predict(7), Some(5000));
        sizes.observe(7, 3000);
        assert_eq!(sizes.predict(7), Some(3000), "the last size counts");
        sizes.observe(7, 10);
        assert_eq!(sizes.predict(7), None);
        assert_eq!(sizes.predict(8), Some(1 << 20));
        sizes.observe(8, 10);
        assert!(!sizes.any.load(Ordering::Relaxed));
    }

    #[test]
    fn the_table_is_bounded() {
        let sizes = ResponseSizes::new(10);
        for method in 0..(MAX_METHODS as u32 + 50) {
            sizes.observe(method, 100);
        }
        assert_eq!(sizes.sizes.lock().len(), MAX_METHODS);
        assert_eq!(sizes.predict(MAX_METHODS as u32 + 1), None);
        sizes.observe(0, 200);
        assert_eq!(sizes.predict(0), Some(200), "known methods still update");
    }
}
