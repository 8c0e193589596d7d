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

use super::Connection;

impl Connection {
    /// Whether the driver may post a probe now (as [`crate::WorkId::Probe`]): the
    /// connection is open and no probe is in flight. True marks one in flight.
    pub fn start_probe(&mut self) -> bool {
        if self.is_closed() || self.probing {
            return false;
        }
        self.probing = true;
        true
    }

    /// The probe completed: the queue pairs on both sides still work.
    pub fn on_probe_complete(&mut self) {
        self.probing = false;
    }

    /// The driver could not post the probe it was allowed: the queue pair refused it.
    pub fn on_probe_refused(&mut self) {
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
    fn probes_pack_into_a_wr_id() {
        let wr_id = WorkId::Probe.to_wr_id(77);
        assert_eq!(WorkId::from_wr_id(wr_id), Some((77, WorkId::Probe)));
    }
}
