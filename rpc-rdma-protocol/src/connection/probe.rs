//! Keepalive probes: how a connection learns that its queue pair, or its peer, is gone when
//! no completion says so.
//!
//! A probe is a zero-length RDMA WRITE. It touches no memory on either side (a zero-length
//! RDMA operation checks no rkey, IBTA C9-88), consumes no receive and no credit, and is
//! invisible to the peer's protocol; but its completion needs the peer's queue pair to
//! acknowledge it. It fails when the local queue pair is in the error state (flushed; a
//! queue pair on a shared receive queue has no receives that would show it), or when the
//! peer's queue pair no longer answers (retries exhausted: the peer died or its queue pair
//! went to error). Either failure closes the connection, as any failed work request does
//! ([`Connection::on_completion_error`]). The driver decides when to probe (an idle
//! connection, now and then); the protocol keeps one probe in flight at most, and the send
//! queue has an entry for it ([`crate::Config::sq_depth`]).
//!
//! A probe is also a fence for teardown. Completions of one send queue come back in the
//! order of its posts, so a probe that completes proves every work request posted before
//! it complete, unsignaled sends included (their slots are otherwise reclaimed only by a
//! later signaled send). A connection that is shutting down gracefully disconnects once
//! [`Connection::is_drained`]: everything it committed was posted and a probe posted after
//! the last of it completed. Disconnecting earlier moves the queue pair to the error state
//! and flushes sends and writes the peer would have received.

use super::Connection;

impl Connection {
    /// Whether the driver may post a probe now (as [`crate::WorkId::Probe`]): the
    /// connection is open and no probe is in flight. True marks one in flight.
    pub fn start_probe(&mut self) -> bool {
        if self.is_closed() || self.probing {
            return false;
        }
        self.probing = true;
        self.probe_fence = self.sq_posts;
        true
    }

    /// The probe completed: the queue pairs on both sides still work, and every work
    /// request posted before it is complete.
    pub fn on_probe_complete(&mut self) {
        self.probing = false;
        self.fenced = self.probe_fence;
        if self.draining && !self.is_closed() {
            self.marker_returned();
        }
    }

    /// Whether everything this side committed was posted and is complete (acknowledged by
    /// the peer's queue pair): a disconnect now loses nothing this side sent. On a closed
    /// connection: whether it was, when it closed.
    pub fn is_drained(&self) -> bool {
        self.send.unposted() == 0 && self.large.sending_idle() && self.fenced == self.sq_posts
    }

    /// Whether the driver should post a probe as a fence now (see the module
    /// documentation): everything is posted, some of it may not be complete, no probe is in
    /// flight. True marks one in flight, as [`Connection::start_probe`] does.
    pub fn start_drain(&mut self) -> bool {
        if self.is_drained() || self.send.unposted() != 0 || !self.large.sending_idle() {
            return false;
        }
        self.start_probe()
    }

    /// The driver could not post the probe it was allowed: the queue pair refused it.
    pub fn on_probe_refused(&mut self) {
        if self.draining {
            // No marker can go: nothing more will be learnt.
            self.close_with(super::CloseReason::PeerDisconnected);
            return;
        }
        self.on_completion_error(crate::WorkId::Probe, "the queue pair refused to post it");
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::fabric::{Pair, Side};
    use crate::{CloseReason, Config, WorkId};

    #[test]
    fn one_probe_in_flight_and_a_failed_one_closes() {
        let mut pair = Pair::symmetric(Config::default());
        assert!(pair.a.probe());
        assert!(!pair.a.probe(), "a second probe while one is in flight");
        assert!(pair.transmit(Side::A), "the probe goes on the wire");
        assert!(pair.a.poll_send(), "and completes");
        assert!(pair.a.probe(), "the next probe once the first completed");
        pair.a
            .conn
            .on_completion_error(WorkId::Probe, "transport retry counter exceeded");
        let reason = pair.a.conn.close_reason().expect("closed");
        assert_eq!(
            reason,
            &CloseReason::CompletionError {
                work: WorkId::Probe,
                status: "transport retry counter exceeded".into()
            }
        );
        assert!(
            reason
                .to_string()
                .contains("transport retry counter exceeded"),
            "{reason}"
        );
        assert!(
            !pair.a.conn.start_probe(),
            "no probe on a closed connection"
        );
    }

    #[test]
    fn a_probe_fences_unsignaled_sends_for_a_drain() {
        let config = Config {
            signal_interval: Some(16),
            ..Config::default()
        };
        let mut pair = Pair::symmetric(config);
        assert!(pair.a.conn.is_drained(), "nothing sent yet");
        assert!(!pair.a.conn.start_drain(), "no probe needed");
        for _ in 0..3 {
            pair.a.send(10).unwrap();
        }
        while pair.a.exec() {}
        assert!(
            !pair.a.conn.is_drained(),
            "three sends posted, none complete"
        );
        while pair.transmit(Side::A) {}
        assert!(!pair.a.poll_send(), "unsignaled: no completion comes");
        assert!(
            !pair.a.conn.is_drained(),
            "nothing proves the sends complete"
        );
        assert!(pair.a.conn.start_drain(), "a fence probe");
        pair.a.push_probe();
        assert!(!pair.a.conn.start_drain(), "one fence in flight");
        assert!(!pair.a.conn.is_drained(), "until it completes");
        while pair.transmit(Side::A) {}
        assert!(pair.a.poll_send(), "the probe completes");
        assert!(pair.a.conn.is_drained(), "and with it every send before it");
        pair.a.send(10).unwrap();
        while pair.a.exec() {}
        assert!(!pair.a.conn.is_drained(), "a send posted after the fence");
        assert!(pair.a.conn.start_drain(), "needs a fence of its own");
    }

    #[test]
    fn no_fence_while_frames_wait_for_credits() {
        let mut pair = Pair::symmetric(Config::default());
        while pair.a.send(10).is_ok() {}
        while pair.a.exec() {}
        assert!(
            pair.a.conn.stats().send_unposted > 0,
            "frames wait for credits"
        );
        assert!(!pair.a.conn.is_drained());
        assert!(
            !pair.a.conn.start_drain(),
            "a fence now would prove nothing"
        );
        while pair.round(10) {}
        assert!(pair.a.conn.stats().send_unposted == 0, "credits came back");
        assert!(pair.a.conn.start_drain(), "now a fence");
    }

    #[test]
    fn probes_pack_into_a_wr_id() {
        let wr_id = WorkId::Probe.to_wr_id(77);
        assert_eq!(WorkId::from_wr_id(wr_id), Some((77, WorkId::Probe)));
    }
}
