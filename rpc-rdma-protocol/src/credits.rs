//! Credit accounting of one connection, both directions.
//!
//! * Send credits: one per receive slot the peer has posted and granted to us. Request and
//!   response frames may only use credits above [`RESERVED_CREDITS`]; the last credit is
//!   kept for a credit-only frame, so credits can always be returned even when both sides
//!   have exhausted their data credits at the same time.
//! * Returnable credits: our receive slots that have been re-posted (after the upper layer
//!   released them, or at once for credit-only frames) but whose credit has not yet been
//!   sent to the peer. Every outgoing header carries all of them.

use super::error::ProtocolViolation;

/// Credits held back from request/response frames for credit-only frames.
pub const RESERVED_CREDITS: u32 = 1;

/// Receive slots that stay posted however many the upper layer holds (see
/// [`crate::Config::lend_limit`]): the peer's reserved credit and at least two
/// credits to return in a credit-only frame (which must return more than the one it costs).
pub const UNLENT_SLOTS: u32 = RESERVED_CREDITS + 2;

/// Both credit counters of a connection. All operations are O(1).
#[derive(Debug, Clone)]
pub(crate) struct Credits {
    /// Credits we hold for the peer's receive ring (reserved one included).
    available: u32,
    /// Receive slots the peer announced: the most credits we can ever hold.
    peer_ring: u32,
    /// Our re-posted receive slots whose credit the peer has not been sent yet.
    returnable: u32,
    /// Our receive slots.
    own_ring: u32,
    /// `returnable` at which a credit-only frame is due.
    threshold: u32,
}

impl Credits {
    /// Initial state: the peer's initial window is ours; nothing to return.
    pub(crate) fn new(peer_window: u32, peer_ring: u32, own_ring: u32, threshold: u32) -> Self {
        Credits {
            available: peer_window,
            peer_ring,
            returnable: 0,
            own_ring,
            threshold,
        }
    }

    /// Credits held, reserved one included.
    pub(crate) fn available(&self) -> u32 {
        self.available
    }

    /// Credits waiting to be returned to the peer.
    pub(crate) fn returnable(&self) -> u32 {
        self.returnable
    }

    /// Whether a request/response frame may be posted now.
    pub(crate) fn can_send_data(&self) -> bool {
        self.available > RESERVED_CREDITS
    }

    /// Whether a credit-only frame may be posted now.
    pub(crate) fn can_send_control(&self) -> bool {
        self.available > 0
    }

    /// Takes one credit for a frame about to be posted. The caller checked
    /// [`Self::can_send_data`] or [`Self::can_send_control`]; posting without a credit is the
    /// RNR this whole module exists to prevent, so debug builds check it here as well.
    pub(crate) fn consume(&mut self) {
        debug_assert!(
            self.available > 0,
            "SEND posted without a credit (would RNR)"
        );
        self.available = self.available.saturating_sub(1);
    }

    /// Applies a grant from a received header. A peer can only grant re-posted slots, so
    /// holding more credits than it has slots means it lied.
    pub(crate) fn grant(&mut self, granted: u32) -> Result<(), ProtocolViolation> {
        let total = u64::from(self.available) + u64::from(granted);
        if total > u64::from(self.peer_ring) {
            return Err(ProtocolViolation::CreditOverflow {
                held: self.available,
                granted,
                ring: self.peer_ring,
            });
        }
        self.available += granted;
        Ok(())
    }

    /// One of our receive slots was re-posted; its credit becomes returnable.
    pub(crate) fn on_reposted(&mut self) {
        debug_assert!(
            self.returnable < self.own_ring,
            "more re-posts than ring slots"
        );
        self.returnable = (self.returnable + 1).min(self.own_ring);
    }

    /// Takes every returnable credit for the header being posted.
    pub(crate) fn take_returnable(&mut self) -> u32 {
        std::mem::take(&mut self.returnable)
    }

    /// A credit-only frame is due once `threshold` credits are returnable.
    pub(crate) fn set_threshold(&mut self, threshold: u32) {
        self.threshold = threshold;
    }

    /// Returnable credits at which a credit-only frame is due.
    pub(crate) fn threshold(&self) -> u32 {
        self.threshold
    }

    /// Whether enough credits are returnable to justify a credit-only frame.
    pub(crate) fn return_due(&self) -> bool {
        self.returnable >= self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_never_takes_the_reserved_credit() {
        let mut c = Credits::new(3, 3, 8, 2);
        assert!(c.can_send_data());
        c.consume();
        assert!(c.can_send_data());
        c.consume();
        assert!(!c.can_send_data());
        assert!(c.can_send_control());
        c.consume();
        assert!(!c.can_send_control());
    }

    #[test]
    fn grant_beyond_peer_ring_is_overflow() {
        let mut c = Credits::new(4, 4, 8, 2);
        c.consume();
        c.consume();
        assert_eq!(c.grant(2), Ok(()));
        assert_eq!(c.available(), 4);
        assert_eq!(
            c.grant(1),
            Err(ProtocolViolation::CreditOverflow {
                held: 4,
                granted: 1,
                ring: 4
            })
        );
        assert!(matches!(
            c.grant(u32::MAX),
            Err(ProtocolViolation::CreditOverflow { .. })
        ));
        assert_eq!(c.available(), 4, "a rejected grant changes nothing");
    }

    #[test]
    fn returnable_accumulates_until_taken() {
        let mut c = Credits::new(4, 4, 4, 2);
        c.on_reposted();
        assert!(!c.return_due());
        c.on_reposted();
        assert!(c.return_due());
        assert_eq!(c.take_returnable(), 2);
        assert_eq!(c.returnable(), 0);
    }
}
