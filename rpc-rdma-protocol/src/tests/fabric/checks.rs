//! The fabric's invariants: credit conservation, no possible RNR, and a clean quiescent
//! state.

use super::{Endpoint, Pair};

impl Pair {
    /// Checks both connections' internal invariants and the credit conservation law of both
    /// directions: every receive slot of the receiver is accounted for exactly once.
    pub(crate) fn check(&self) {
        self.a.conn.assert_invariants();
        self.b.conn.assert_invariants();
        if self.raw || self.a.conn.is_closed() || self.b.conn.is_closed() {
            return;
        }
        Self::conservation(&self.a, &self.b);
        Self::conservation(&self.b, &self.a);
        Self::rnr_free(&self.a, &self.b);
        Self::rnr_free(&self.b, &self.a);
    }

    /// The no-RNR invariant, stated on the QP rather than on the state machine's belief:
    /// every credit that has left `rx` (held by `tx`, or on its way there) and every frame
    /// `tx` has committed to the wire is backed by a RECV actually posted in `rx`'s receive
    /// queue. Granting a credit before its RECV is posted breaks this at once, even if no
    /// schedule happens to turn it into an RNR. A shared receive queue is checked over all
    /// its connections ([`Pair::claimed`]).
    fn rnr_free(tx: &Endpoint, rx: &Endpoint) {
        if rx.recv.is_shared() {
            return;
        }
        let claimed = Self::claimed(tx, rx);
        assert!(
            rx.recv.posted() as u64 >= claimed,
            "RNR possible: {} RECVs posted, {claimed} claimed by credits and frames",
            rx.recv.posted()
        );
    }

    /// Receives `tx` may still consume at `rx`: its credits, grants on their way to it, and
    /// frames it has committed to the wire.
    pub(crate) fn claimed(tx: &Endpoint, rx: &Endpoint) -> u64 {
        let grants_sent = rx.wire_sends().map(|f| u64::from(f.credits)).sum::<u64>()
            + tx.recv_cq.iter().map(|c| u64::from(c.credits)).sum::<u64>();
        let frames_coming = (tx.pending_sends().count() + tx.wire_sends().count()) as u64;
        u64::from(tx.conn.stats().send_credits) + grants_sent + frames_coming
    }

    /// Slots in `rx`'s receive window = credits `tx` holds + grants on their way to `tx` +
    /// credits `rx` has yet to return + frames on their way to `rx` + frames `rx` holds.
    fn conservation(tx: &Endpoint, rx: &Endpoint) {
        let grants_in_flight: u64 = rx
            .pending_sends()
            .map(|w| u64::from(w.credits))
            .sum::<u64>()
            + rx.wire_sends().map(|f| u64::from(f.credits)).sum::<u64>()
            + tx.recv_cq.iter().map(|c| u64::from(c.credits)).sum::<u64>();
        let frames_in_flight =
            (tx.pending_sends().count() + tx.wire_sends().count() + rx.recv_cq.len()) as u64;
        let stats_tx = tx.conn.stats();
        let stats_rx = rx.conn.stats();
        // Slots gathered for release are still the upper layer's, to the protocol.
        let held = rx.held.len() + rx.gathered.len();
        assert_eq!(stats_rx.recv_held as usize, held);
        let total = u64::from(stats_tx.send_credits)
            + grants_in_flight
            + u64::from(stats_rx.pending_credit_return)
            + frames_in_flight
            + held as u64;
        assert_eq!(
            total,
            u64::from(stats_rx.recv_window),
            "credit conservation broken: tx {stats_tx:?}, rx {stats_rx:?}"
        );
        assert!(stats_rx.recv_window <= rx.geom.recv_slots);
        assert!(
            stats_tx.send_credits <= rx.geom.recv_slots,
            "credit overflow"
        );
    }

    /// After quiescence: nothing in flight, nothing queued, every committed message
    /// delivered exactly once and in order, and all credits back home.
    pub(crate) fn assert_drained(&self) {
        for (name, ep, peer) in [("a", &self.a, &self.b), ("b", &self.b, &self.a)] {
            assert!(
                ep.written.is_empty(),
                "{name}: uncommitted reservations left"
            );
            assert_eq!(
                ep.quota, 0,
                "{name}: deadlock, {} messages never sent",
                ep.quota
            );
            assert!(
                ep.pending.is_empty() && ep.wire.is_empty(),
                "{name}: work left"
            );
            assert!(
                ep.send_cq.is_empty() && ep.recv_cq.is_empty(),
                "{name}: completions left"
            );
            assert!(ep.held.is_empty(), "{name}: frames held");
            let stats = ep.conn.stats();
            assert_eq!(
                stats.send_unposted, 0,
                "{name}: deadlock, frames still queued: {stats:?}"
            );
            // As sets: the order within each kind is checked as frames arrive, and a Cancel
            // may follow frames of later calls.
            let mut sent = ep.committed.clone();
            sent.sort_unstable();
            let mut delivered = peer.delivered.clone();
            delivered.sort_unstable();
            assert_eq!(sent, delivered, "{name}: sent vs. delivered at the peer");
            assert_eq!(
                stats.send_credits + peer.conn.stats().pending_credit_return,
                peer.conn.stats().recv_window,
                "{name}: credits not all home: {stats:?} peer {:?} peer pending {:?} peer held {}",
                peer.conn.stats(),
                peer.pending,
                peer.held.len()
            );
            assert!(!ep.blocked, "{name}: WouldBlock never followed by Writable");
        }
    }
}
