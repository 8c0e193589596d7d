//! The peer disconnected: process what arrived before, then close.
//!
//! A disconnect moves the queue pair to the error state; frames the peer sent before it
//! may still wait in the completion queue, and a large body that arrived still has its
//! rkey to invalidate before it may be handed up. The driver calls
//! [`Connection::on_peer_disconnected`] once it moved the queue pair to the error state; the
//! connection then asks for a probe ([`Action::PostProbe`]) as a marker: it completes,
//! flushed, after every completion queued before it. Meanwhile flushed work is expected and
//! does not close the connection; a flushed invalidation counts as done, since a queue
//! pair in the error state executes nothing the peer sends, so the window can no longer be
//! written through. When the marker comes back with invalidations still outstanding (posted
//! for bodies found after the marker), another marker goes behind them; otherwise the
//! connection closes with [`CloseReason::PeerDisconnected`].

use super::{Action, CloseReason, Connection};
use crate::WorkId;

impl Connection {
    /// The peer disconnected and the driver moved the queue pair to the error state: the
    /// connection drains (see the module documentation) and closes once it is done.
    pub fn on_peer_disconnected(&mut self) {
        if self.is_closed() || self.draining {
            return;
        }
        self.draining = true;
        // A probe in flight already is the marker.
        if !self.probing {
            self.probing = true;
            self.actions.push_back(Action::PostProbe);
        }
    }

    /// Draining after the peer's disconnect.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// A work request failed while draining: expected, and never a reason to close.
    pub(super) fn on_drain_error(&mut self, work: WorkId) {
        match work {
            WorkId::Invalidate(grant) => {
                // Only fails for a grant it does not know: nothing to hand up then.
                let _ = self.large.on_invalidated(grant, &mut self.actions);
            }
            WorkId::Read(grant) => self.large.on_read_flushed(grant, &mut self.actions),
            // A queue pair in the error state serves no READ: the window is as good as gone.
            WorkId::InvalidateSource(transfer) => {
                let _ = self
                    .large
                    .on_source_invalidated(transfer, &mut self.actions);
            }
            WorkId::Probe => self.marker_returned(),
            _ => {}
        }
    }

    /// The marker probe completed (flushed, or not).
    pub(super) fn marker_returned(&mut self) {
        self.probing = false;
        if self.large.invalidating() {
            self.probing = true;
            self.actions.push_back(Action::PostProbe);
        } else {
            self.close_with(CloseReason::PeerDisconnected);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::fabric::{Pair, Side};
    use crate::tests::large::{pair, run_until};
    use crate::{CloseReason, Config, WorkId};

    #[test]
    fn frames_before_the_disconnect_are_delivered_then_it_closes() {
        let mut p = Pair::symmetric(Config::default());
        p.a.send(10).unwrap();
        p.a.send(20).unwrap();
        while p.a.exec() {}
        while p.transmit(Side::A) {}
        // B learns of the disconnect before it polled the two frames.
        p.b.conn.on_peer_disconnected();
        p.b.absorb();
        assert!(p.b.exec(), "a marker probe is posted");
        assert!(!p.b.conn.is_closed());
        p.b.conn.on_completion_error(WorkId::Recv(5), "flushed");
        assert!(!p.b.conn.is_closed(), "flushes are expected while draining");
        assert!(
            p.b.poll_recv() && p.b.poll_recv(),
            "both frames are delivered"
        );
        p.b.conn.on_completion_error(WorkId::Probe, "flushed");
        assert_eq!(
            p.b.conn.close_reason(),
            Some(&CloseReason::PeerDisconnected)
        );
        assert_eq!(p.b.delivered.len(), 2);
    }

    /// A large body arrived at B, whose invalidation is posted; then the peer disconnected:
    /// B's marker is posted and its queue pair in the error state. The body's grant.
    fn disconnected_with_a_body_to_invalidate() -> (Pair, u32) {
        let mut p = pair();
        p.a.send_large(3 * 4096).unwrap();
        run_until(&mut p, |p| p.b.invalidating_grant().is_some());
        let grant = p.b.invalidating_grant().expect("the body's grant");
        p.b.conn.on_peer_disconnected();
        p.b.absorb();
        assert!(p.b.exec(), "the marker is posted");
        p.b.qp_error();
        (p, grant)
    }

    /// The invalidation's flush and the marker's come in one batch: the close the marker
    /// brings must not discard the hand-up the invalidation decided.
    #[test]
    fn a_body_invalidated_in_the_closing_batch_is_still_handed_up() {
        let (mut p, grant) = disconnected_with_a_body_to_invalidate();
        p.b.conn
            .on_completion_error(WorkId::Invalidate(grant), "flushed");
        p.b.conn.on_completion_error(WorkId::Probe, "flushed");
        assert_eq!(
            p.b.conn.close_reason(),
            Some(&CloseReason::PeerDisconnected)
        );
        p.b.absorb();
        while p.b.exec() {}
        assert_eq!(p.b.large_delivered(), 1, "the body was handed up");
    }

    #[test]
    fn a_large_body_found_after_the_disconnect_is_handed_up() {
        let (mut p, grant) = disconnected_with_a_body_to_invalidate();
        // The marker comes back first (it was posted before the invalidation completed).
        p.b.conn.on_completion_error(WorkId::Probe, "flushed");
        assert!(!p.b.conn.is_closed(), "an invalidation is outstanding");
        p.b.absorb();
        assert!(p.b.exec(), "so another marker goes behind it");
        p.b.conn
            .on_completion_error(WorkId::Invalidate(grant), "flushed");
        p.b.absorb();
        while p.b.exec() {}
        assert_eq!(p.b.large_delivered(), 1, "the body was handed up");
        p.b.conn.on_completion_error(WorkId::Probe, "flushed");
        assert_eq!(
            p.b.conn.close_reason(),
            Some(&CloseReason::PeerDisconnected)
        );
    }
}
