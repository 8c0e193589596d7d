//! Local ring configuration and the geometry negotiated with the peer.
//!
//! Negotiation rule: each side announces its receive ring ([`ConnectParams`]). A side's
//! largest outgoing frame is `min(own send slot size, peer receive slot size)`; its initial
//! credits are the peer's receive slot count (one of which is the reserved credit, see
//! [`crate::RESERVED_CREDITS`]). Everything else (send ring size, signaling
//! interval, credit-return threshold, queue bound) is local policy and never on the wire.

use super::action::SendTarget;
use super::credits::{RESERVED_CREDITS, UNLENT_SLOTS};
use super::error::ParamsError;
use super::large::LargeConfig;
use super::params::{in_range, validate_ring, validate_window, ConnectParams, TRANSPORT_VERSION};

/// Bytes of the per-connection control buffer that carries credit-only frames. It sits right
/// after the send ring in the same registered region. A credit-only frame is a bare header,
/// always in the compact form.
pub const CONTROL_BUF_LEN: usize = rpc_wire::COMPACT_HEADER_LEN;

/// Local configuration of one connection: ring sizes plus tuning knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Slots in the send ring, at most.
    pub send_slots: u32,
    /// Slots the send ring starts with (`1..=send_slots`); `None`: all of them. A ring found
    /// full doubles, up to `send_slots`, once the driver has memory for it
    /// ([`crate::Connection::send_slots_wanted`]).
    pub send_window: Option<u32>,
    /// Bytes per send slot.
    pub send_slot_size: u32,
    /// Slots in the receive ring: the most credits ever granted to the peer at once.
    pub recv_slots: u32,
    /// Bytes per receive slot.
    pub recv_slot_size: u32,
    /// Receive slots backed by a posted receive at start, the peer's initial credits
    /// (`3..=recv_slots`); `None`: every slot. The window grows towards `recv_slots` while
    /// the peer uses it up ([`crate::Connection::window_wanted`]).
    pub recv_window: Option<u32>,
    /// Receives come from a shared receive queue ([`crate::SharedPool`]) instead of a ring
    /// of this connection's own: the connection emits no `PostRecv`, and its slots are
    /// credits, not memory.
    pub shared_recv: bool,
    /// Signal every Nth ring send (`1..=send_slots`); `None`: `max(1, send_slots / 4)`.
    pub signal_interval: Option<u32>,
    /// Send a credit-only frame once this many received slots have been re-posted and
    /// nothing carries their credits (`2..=window - 1`); `None`: half the initial window.
    pub credit_return_threshold: Option<u32>,
    /// Most frames that may wait for credits or for an earlier reservation
    /// (`1..=send_slots`); `None`: `send_slots`.
    pub max_queued: Option<u32>,
    /// Receive slots the upper layer may hold at once as zero-copy views
    /// (`0..=window - 3`, see [`crate::credits::UNLENT_SLOTS`]); `None`: a quarter
    /// of the initial window. The credit-return threshold is lowered to
    /// `window - lend_limit - 1` if it is above, so slots held for long cannot keep the
    /// peer's credits from coming back. A frame that arrives while
    /// this many are held is handed up as a copy and its slot released once handed up (see
    /// [`crate::Received::lend`]), so an application that keeps what it received
    /// never starves the ring of receives and the peer of credits.
    pub lend_limit: Option<u32>,
    /// Largest send the QP accepts with `IBV_SEND_INLINE` (the `max_inline_data` the QP was
    /// created with); 0 disables inline hints.
    pub max_inline: u32,
    /// The large-body path (RDMA WRITE rendezvous).
    pub large: LargeConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            send_slots: 64,
            send_window: None,
            send_slot_size: 8192,
            recv_slots: 64,
            recv_slot_size: 8192,
            recv_window: None,
            shared_recv: false,
            signal_interval: None,
            credit_return_threshold: None,
            max_queued: None,
            lend_limit: None,
            max_inline: 0,
            large: LargeConfig::default(),
        }
    }
}

impl Config {
    /// Receive slots to post (a RECV each, at [`Geometry::recv_offset`]-style offsets
    /// `slot × recv_slot_size`) before `rdma_connect` or `rdma_accept`: the peer's initial
    /// credits count all of them. They depend only on the local configuration, so the client
    /// can post them before it knows the server's parameters. None with a shared receive
    /// queue: its pool backs the window instead ([`crate::SharedPool::admit`]).
    pub fn initial_recv_posts(&self) -> std::ops::Range<u32> {
        if self.shared_recv {
            0..0
        } else {
            0..self.window()
        }
    }

    /// The initial receive window.
    pub fn window(&self) -> u32 {
        self.recv_window.unwrap_or(self.recv_slots)
    }

    /// What to announce to the peer in rdma_cm private data.
    pub fn connect_params(&self) -> ConnectParams {
        ConnectParams::new(self.recv_slots, self.recv_slot_size).with_window(self.window())
    }

    /// Checks ring sizes and tuning knobs.
    pub fn validate(&self) -> Result<(), ParamsError> {
        self.resolve().map(|_| ())
    }

    /// Send-queue depth the QP needs: every ring slot and the control buffer, the WRITEs,
    /// window binds and invalidations of the large-body path (all signaled), and one
    /// keepalive probe.
    pub fn sq_depth(&self) -> u32 {
        sq_depth(self.send_slots, &self.large)
    }

    /// Completion-queue depth for one QP on one CQ: the send queue plus every receive.
    pub fn cq_depth(&self) -> u32 {
        self.sq_depth() + self.recv_slots
    }

    /// Receive-queue depth the QP needs (none with a shared receive queue).
    pub fn rq_depth(&self) -> u32 {
        if self.shared_recv {
            0
        } else {
            self.recv_slots
        }
    }

    /// Validates the knobs and resolves their defaults.
    fn resolve(&self) -> Result<Policy, ParamsError> {
        validate_ring("local send ring", self.send_slots, self.send_slot_size)?;
        validate_ring("local receive ring", self.recv_slots, self.recv_slot_size)?;
        let knob = |what, value: Option<u32>, default: u32, min: u32, max: u32| {
            in_range(what, value.unwrap_or(default), min, max)
        };
        let s = self.send_slots;
        knob("send_window", self.send_window, s, 1, s)?;
        let r = self.window();
        validate_window("local receive window", r, self.recv_slots)?;
        let signal = knob(
            "signal_interval",
            self.signal_interval,
            (s / 4).max(1),
            1,
            s,
        )?;
        let threshold = knob(
            "credit_return_threshold",
            self.credit_return_threshold,
            default_threshold(r),
            2,
            r - 1,
        )?;
        let max_queued = knob("max_queued", self.max_queued, s, 1, s)?;
        let lend_max = r - UNLENT_SLOTS;
        let lend_limit = knob("lend_limit", self.lend_limit, r / 4, 0, lend_max)?;
        // A peer down to its reserved credit has left `r - held - 1` slots returnable (the
        // window never shrinks below `r`), and
        // the upper layer holds at most `lend_limit` for long: the threshold must be within
        // reach, or the credits would wait for a release that may never come.
        let threshold = threshold.min(r - lend_limit - RESERVED_CREDITS);
        let large = &self.large;
        knob("large.chunk_size", Some(large.chunk_size), 0, 4096, 1 << 30)?;
        knob("large.write_window", Some(large.write_window), 0, 1, 64)?;
        knob("large.max_grants", Some(large.max_grants), 0, 1, 1024)?;
        knob("large.max_queued", Some(large.max_queued), 0, 0, 1 << 16)?;
        Ok(Policy {
            signal_interval: signal,
            credit_return_threshold: threshold,
            max_queued,
            lend_limit,
        })
    }
}

/// The local knobs of a [`Config`], validated, defaults resolved.
struct Policy {
    signal_interval: u32,
    credit_return_threshold: u32,
    max_queued: u32,
    lend_limit: u32,
}

/// The negotiated geometry and policy of one connection; input to
/// [`crate::Connection::new`], and the driver's guide to sizing its memory regions
/// and queues. Only [`Geometry::negotiate`] makes one, so its fields are always consistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Geometry {
    /// Transport protocol version in use.
    pub version: u8,
    /// Slots in the local send ring, at most (the stride of its memory is the slot size).
    pub send_slots: u32,
    /// Slots the local send ring starts with.
    pub send_window: u32,
    /// Bytes per local send slot (stride of the send ring).
    pub send_slot_size: u32,
    /// Largest frame (header included) this side may send.
    pub max_send_frame: u32,
    /// Slots in the local receive ring: the most credits the peer may hold.
    pub recv_slots: u32,
    /// Bytes per local receive slot (stride of the receive ring).
    pub recv_slot_size: u32,
    /// Receive slots backed at start: the peer's initial credits. The window never shrinks
    /// below it.
    pub recv_window: u32,
    /// Receives come from a shared receive queue (see [`Config::shared_recv`]).
    pub shared_recv: bool,
    /// Receive slots of the peer: the most credits this side may hold.
    pub peer_recv_slots: u32,
    /// The peer's initial window: this side's initial credits, reserved one included.
    pub peer_recv_window: u32,
    /// Every Nth ring send is signaled.
    pub signal_interval: u32,
    /// Re-posted receive slots that trigger a credit-only frame (in the initial window).
    pub credit_return_threshold: u32,
    /// The threshold was not configured: it follows the window as it grows and shrinks
    /// ([`Geometry::credit_threshold_for`]).
    pub threshold_follows_window: bool,
    /// Bound of the queue of frames waiting to be posted.
    pub max_queued: u32,
    /// Receive slots the upper layer may hold as zero-copy views (see [`Config::lend_limit`]).
    pub lend_limit: u32,
    /// Largest send posted with an inline hint.
    pub max_inline: u32,
    /// The large-body path.
    pub large: LargeConfig,
}

impl Geometry {
    /// Applies the negotiation rule to the local configuration and the peer's parameters.
    pub fn negotiate(local: &Config, peer: &ConnectParams) -> Result<Geometry, ParamsError> {
        let Policy {
            signal_interval,
            credit_return_threshold,
            max_queued,
            lend_limit,
        } = local.resolve()?;
        peer.validate()?;
        let version = local.connect_params().common_version(peer)?;
        debug_assert_eq!(version, TRANSPORT_VERSION);
        Ok(Geometry {
            version,
            send_slots: local.send_slots,
            send_window: local.send_window.unwrap_or(local.send_slots),
            send_slot_size: local.send_slot_size,
            max_send_frame: local.send_slot_size.min(peer.recv_slot_size),
            recv_slots: local.recv_slots,
            recv_slot_size: local.recv_slot_size,
            recv_window: local.window(),
            shared_recv: local.shared_recv,
            peer_recv_slots: peer.recv_slots,
            peer_recv_window: peer.recv_window,
            signal_interval,
            credit_return_threshold,
            threshold_follows_window: local.credit_return_threshold.is_none(),
            max_queued,
            lend_limit,
            max_inline: local.max_inline,
            large: local.large,
        })
    }

    /// Credits usable by request/response frames at start: the peer's initial window minus
    /// the reserved credit.
    pub fn initial_data_credits(&self) -> u32 {
        self.peer_recv_window.saturating_sub(RESERVED_CREDITS)
    }

    /// Bytes of the send region to register: the send ring followed by the control buffer.
    pub fn send_region_len(&self) -> usize {
        self.send_slots as usize * self.send_slot_size as usize + CONTROL_BUF_LEN
    }

    /// Offset of a send buffer within the send region.
    pub fn send_offset(&self, target: SendTarget) -> usize {
        let slot = match target {
            SendTarget::Ring(slot) => slot,
            SendTarget::Control => self.send_slots,
        };
        slot as usize * self.send_slot_size as usize
    }

    /// Bytes of the receive region to register (none with a shared receive queue).
    pub fn recv_region_len(&self) -> usize {
        if self.shared_recv {
            0
        } else {
            self.recv_slots as usize * self.recv_slot_size as usize
        }
    }

    /// Offset of a receive slot within the receive region.
    pub fn recv_offset(&self, slot: u32) -> usize {
        slot as usize * self.recv_slot_size as usize
    }

    /// The credit-return threshold while `window` receive slots are backed (the window
    /// grows from [`Geometry::recv_window`] and never shrinks below it): the configured one,
    /// or half the window, kept within reach of a peer down to its reserved credit while the
    /// upper layer holds `lend_limit` slots (as [`Config::lend_limit`] explains). A grown
    /// window then returns its credits in as few frames as the initial one, relative to its
    /// size.
    pub fn credit_threshold_for(&self, window: u32) -> u32 {
        if !self.threshold_follows_window || window <= self.recv_window {
            return self.credit_return_threshold;
        }
        default_threshold(window)
            .min(window - self.lend_limit - RESERVED_CREDITS)
            .max(self.credit_return_threshold)
    }

    /// Send-queue depth the QP needs (see [`Config::sq_depth`]).
    pub fn sq_depth(&self) -> u32 {
        sq_depth(self.send_slots, &self.large)
    }

    /// Receive-queue depth the QP needs (none with a shared receive queue).
    pub fn rq_depth(&self) -> u32 {
        if self.shared_recv {
            0
        } else {
            self.recv_slots
        }
    }
}

/// The credit-return threshold of a window of `window` slots when none is configured: half
/// the window, at least 2 and below the window.
fn default_threshold(window: u32) -> u32 {
    (window / 2).clamp(2, window - 1)
}

/// Send-queue entries for `send_slots` ring slots, the control buffer, the large-body
/// path's work requests and one keepalive probe.
fn sq_depth(send_slots: u32, large: &LargeConfig) -> u32 {
    send_slots + 1 + large.write_window + 2 * large.max_grants + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_frame_is_min_of_own_send_and_peer_recv() {
        let local = Config {
            send_slot_size: 4096,
            recv_slots: 16,
            ..Config::default()
        };
        let g = Geometry::negotiate(&local, &ConnectParams::new(32, 1024)).unwrap();
        assert_eq!(g.max_send_frame, 1024);
        assert_eq!(g.peer_recv_slots, 32);
        assert_eq!(g.initial_data_credits(), 31);
        assert_eq!(g.credit_return_threshold, 8);
        assert_eq!(g.signal_interval, 16);
        let g = Geometry::negotiate(&local, &ConnectParams::new(32, 1 << 20)).unwrap();
        assert_eq!(g.max_send_frame, 4096);
    }

    #[test]
    fn policy_follows_the_initial_window_and_credits_the_peers() {
        let local = Config {
            recv_window: Some(8),
            ..Config::default()
        };
        let peer = ConnectParams::new(32, 1024).with_window(5);
        let g = Geometry::negotiate(&local, &peer).unwrap();
        assert_eq!((g.recv_slots, g.recv_window), (64, 8));
        assert_eq!((g.peer_recv_slots, g.peer_recv_window), (32, 5));
        assert_eq!(g.initial_data_credits(), 4);
        assert_eq!((g.credit_return_threshold, g.lend_limit), (4, 2));
        // The threshold follows the window as it grows: half of it, within reach.
        let thresholds = [8, 9, 16, 64].map(|w| g.credit_threshold_for(w));
        assert_eq!(thresholds, [4, 4, 8, 32]);
        let fixed = Config {
            credit_return_threshold: Some(3),
            ..local
        };
        let g3 = Geometry::negotiate(&fixed, &peer).unwrap();
        assert_eq!(
            g3.credit_threshold_for(64),
            3,
            "a configured threshold stays"
        );
        assert_eq!(local.initial_recv_posts(), 0..8);
        assert_eq!(local.connect_params().recv_window, 8);
        let shared = Config {
            shared_recv: true,
            ..local
        };
        let g = Geometry::negotiate(&shared, &peer).unwrap();
        assert_eq!((g.recv_region_len(), g.rq_depth()), (0, 0));
        assert!(shared.initial_recv_posts().is_empty());
        for window in [2, 65] {
            let bad = Config {
                recv_window: Some(window),
                ..local
            };
            assert!(matches!(
                Geometry::negotiate(&bad, &peer),
                Err(ParamsError::WindowOutOfRange { .. })
            ));
        }
        // The lend limit is bounded by the window, not the ring.
        let lend = Config {
            lend_limit: Some(6),
            ..local
        };
        assert!(matches!(
            Geometry::negotiate(&lend, &peer),
            Err(ParamsError::PolicyOutOfRange { max: 5, .. })
        ));
    }

    #[test]
    fn layout_puts_control_buffer_after_send_ring() {
        let g =
            Geometry::negotiate(&Config::default(), &Config::default().connect_params()).unwrap();
        assert_eq!(g.send_offset(SendTarget::Ring(1)), 8192);
        assert_eq!(g.send_offset(SendTarget::Control), 64 * 8192);
        assert_eq!(g.send_region_len(), 64 * 8192 + CONTROL_BUF_LEN);
        assert_eq!(g.recv_offset(63) + 8192, g.recv_region_len());
        // Ring and control, 2 WRITEs, a bind and an invalidation per grant, one probe.
        assert_eq!(g.sq_depth(), 65 + 2 + 2 * 16 + 1);
    }

    #[test]
    fn rejects_bad_policy_and_bad_peer() {
        let bad = |c: Config| Geometry::negotiate(&c, &ConnectParams::new(8, 256));
        let base = Config {
            send_slots: 8,
            recv_slots: 8,
            ..Config::default()
        };
        for c in [
            Config {
                signal_interval: Some(0),
                ..base
            },
            Config {
                signal_interval: Some(9),
                ..base
            },
            Config {
                credit_return_threshold: Some(1),
                ..base
            },
            Config {
                credit_return_threshold: Some(8),
                ..base
            },
            Config {
                max_queued: Some(0),
                ..base
            },
        ] {
            assert!(
                matches!(bad(c), Err(ParamsError::PolicyOutOfRange { .. })),
                "{c:?}"
            );
        }
        assert!(matches!(
            Geometry::negotiate(&base, &ConnectParams::new(0, 256)),
            Err(ParamsError::SlotCountOutOfRange { count: 0, .. })
        ));
        // Smallest ring: threshold defaults to 2 = recv_slots - 1.
        let tiny = Config {
            recv_slots: 3,
            ..base
        };
        assert_eq!(bad(tiny).unwrap().credit_return_threshold, 2);
    }
}
