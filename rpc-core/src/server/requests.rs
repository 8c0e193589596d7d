//! [`Requests`]: a server connection's side of [`Inbound`], for every transport.

use std::sync::Arc;

use parking_lot::Mutex;

use super::ConnectionDispatch;
use crate::frame::InboundFrame;
use crate::header::{FrameKind, Header};
use crate::stream::Wakes;
use crate::transport::Inbound;
use crate::Status;

/// What a transport does once a server connection ended (forget it, say), run once.
pub type OnClosed = Box<dyn FnOnce() + Send>;

/// Runs the requests a server connection receives, through its [`ConnectionDispatch`].
pub struct Requests {
    dispatch: Arc<ConnectionDispatch>,
    on_closed: Mutex<Option<OnClosed>>,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("dispatch", &self.dispatch)
            .finish_non_exhaustive()
    }
}

impl Requests {
    /// Hands what arrives to `dispatch`.
    pub fn new(dispatch: Arc<ConnectionDispatch>) -> Requests {
        Requests {
            dispatch,
            on_closed: Mutex::new(None),
        }
    }

    /// Runs `then` once the connection ended, after its handlers were stopped.
    pub fn on_closed_then(self, then: OnClosed) -> Requests {
        *self.on_closed.lock() = Some(then);
        self
    }
}

impl Inbound for Requests {
    fn on_frame(&self, frame: InboundFrame, wakes: &mut Wakes) -> Result<(), Status> {
        self.dispatch.on_frame(frame, wakes);
        Ok(())
    }

    fn on_messages(&self, call_id: u64, run: &mut Vec<InboundFrame>, wakes: &mut Wakes) {
        self.dispatch
            .on_stream_messages(call_id, run.drain(..), wakes);
    }

    fn on_oversized(&self, header: &Header, declared: u64) {
        self.dispatch.reject_oversized(header, declared);
    }

    /// An answer that never left: its client hears of the connection's end instead.
    fn on_dropped(&self, _call_id: u64, _kind: FrameKind) {}

    fn on_transfer_failed(&self, call_id: u64, kind: FrameKind, status: Status) {
        if matches!(kind, FrameKind::Response | FrameKind::Message) {
            self.dispatch.fail_call(call_id, &status);
        }
    }

    fn idle(&self) -> bool {
        self.dispatch.calls_running() == 0
    }

    fn landings(&self) -> &[crate::Landing] {
        &self.dispatch.config().request_landings
    }

    fn method_landings(&self) -> &[(u32, crate::Landing)] {
        &self.dispatch.config().method_landings
    }

    fn on_closed(&self, status: Status) {
        tracing::debug!(%status, "server connection ended");
        self.dispatch.close();
        let then = self.on_closed.lock().take();
        if let Some(then) = then {
            then();
        }
    }
}
