//! Two endpoints connected by the fabric, and the rounds that drive both.

use super::{transmit, Endpoint, SharedRq};
use crate::{Config, Geometry, SendError};

/// Which endpoint of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    A,
    B,
}

/// Two connected endpoints.
#[derive(Debug)]
pub(crate) struct Pair {
    pub(crate) a: Endpoint,
    pub(crate) b: Endpoint,
    /// Frames reach b outside a's state machine (a hostile client): the pair's own
    /// checks are off.
    pub(crate) raw: bool,
}

impl Pair {
    /// Negotiates both sides from their configurations, as rdma_cm private data would.
    pub(crate) fn new(a: Config, b: Config) -> Pair {
        Pair::connect(a, b, None)
    }

    /// A pair whose side b (the server) takes its receives from `srq`, which must have
    /// admitted b's window already.
    pub(crate) fn with_srq(a: Config, b: Config, srq: SharedRq) -> Pair {
        Pair::connect(a, b, Some(srq))
    }

    fn connect(a: Config, b: Config, srq: Option<SharedRq>) -> Pair {
        let pa = crate::ConnectParams::decode(&a.connect_params().encode()).expect("a params");
        let pb = crate::ConnectParams::decode(&b.connect_params().encode()).expect("b params");
        let ga = Geometry::negotiate(&a, &pb).expect("a negotiates");
        let gb = Geometry::negotiate(&b, &pa).expect("b negotiates");
        Pair {
            a: Endpoint::new(&a, ga, None),
            b: Endpoint::new(&b, gb, srq),
            raw: false,
        }
    }

    /// A symmetric pair.
    pub(crate) fn symmetric(config: Config) -> Pair {
        Pair::new(config, config)
    }

    pub(crate) fn side(&mut self, side: Side) -> &mut Endpoint {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Delivers the oldest SEND from `side` to its peer.
    pub(crate) fn transmit(&mut self, side: Side) -> bool {
        match side {
            Side::A => transmit(&mut self.a, &mut self.b),
            Side::B => transmit(&mut self.b, &mut self.a),
        }
    }

    /// One round of everything the driver and the upper layer may do, on both sides.
    /// Applications send up to their quota. Returns whether anything happened.
    pub(crate) fn round(&mut self, payload: u32) -> bool {
        let mut progress = false;
        for side in [Side::A, Side::B] {
            let mut ep = self.side(side);
            while ep.quota > 0 && !ep.blocked {
                let p = payload.min(ep.max_payload());
                match ep.send(p) {
                    Ok(()) => {
                        ep.quota -= 1;
                        progress = true;
                    }
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("send failed: {e}"),
                }
            }
            while ep.exec() {
                progress = true;
                // Checked per action: the window between two actions matters.
                self.check();
                ep = self.side(side);
            }
        }
        self.check();
        while self.transmit(Side::A) | self.transmit(Side::B) {
            progress = true;
        }
        for side in [Side::A, Side::B] {
            let ep = self.side(side);
            while ep.poll_send() | ep.poll_recv() {
                progress = true;
            }
            while !ep.hoard && ep.release(0) {
                progress = true;
            }
            progress |= ep.grow(u32::MAX);
        }
        self.check();
        progress
    }

    /// Runs rounds until nothing happens any more; fails if that takes absurdly long
    /// (livelock) or ends with work left (deadlock).
    pub(crate) fn run_to_idle(&mut self, payload: u32) {
        let limit = 100_000;
        let mut rounds = 0;
        while self.round(payload) {
            rounds += 1;
            assert!(
                rounds < limit,
                "no quiescence after {limit} rounds: livelock"
            );
        }
        self.assert_drained();
    }
}
