//! Random interleavings of everything both endpoints, their drivers and their upper layers
//! may do, over random (often minimal, often asymmetric) geometries.
//!
//! Checked on every step by the fabric: no RNR, no buffer reuse before completion, no SQ
//! overflow, in-order exactly-once delivery with intact payloads, credit conservation in
//! both directions (never negative, never above the ring). Checked at the end: from any
//! reachable state, both sides sending at full rate drain completely (no deadlock, no
//! livelock, every committed message delivered, credits all home, WouldBlock always
//! followed by Writable).

use proptest::prelude::*;

use super::fabric::{Pair, Side};
use crate::{Config, SendError};

#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    /// Write and commit one message.
    Send(Side, u16),
    /// Write into a reservation, commit later.
    Write(Side, u16),
    /// Commit the newest (true) or oldest written reservation.
    Commit(Side, bool),
    /// Abort the newest (true) or oldest written reservation.
    Abort(Side, bool),
    /// The driver executes up to n actions.
    Exec(Side, u8),
    /// Up to n SENDs arrive at the peer.
    Transmit(Side, u8),
    /// The driver polls one send completion.
    PollSend(Side),
    /// The driver polls one receive completion.
    PollRecv(Side),
    /// The upper layer releases one held frame (chosen by index: out of order).
    Release(Side, u8),
    /// The driver grows the receive window by up to n of the slots wanted.
    Grow(Side, u8),
    /// The driver posts a keepalive probe, if one may go.
    Probe(Side),
}

pub(super) fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(Side::A), Just(Side::B)]
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (side(), any::<u16>()).prop_map(|(s, p)| Op::Send(s, p)),
        1 => (side(), any::<u16>()).prop_map(|(s, p)| Op::Write(s, p)),
        1 => (side(), any::<bool>()).prop_map(|(s, n)| Op::Commit(s, n)),
        1 => (side(), any::<bool>()).prop_map(|(s, n)| Op::Abort(s, n)),
        4 => (side(), 1u8..4).prop_map(|(s, n)| Op::Exec(s, n)),
        4 => (side(), 1u8..3).prop_map(|(s, n)| Op::Transmit(s, n)),
        3 => side().prop_map(Op::PollSend),
        3 => side().prop_map(Op::PollRecv),
        3 => (side(), any::<u8>()).prop_map(|(s, i)| Op::Release(s, i)),
        1 => (side(), 1u8..4).prop_map(|(s, n)| Op::Grow(s, n)),
        1 => side().prop_map(Op::Probe),
    ]
}

/// Small rings (down to the minimum), windows from the minimum to the ring, with every
/// policy knob drawn from its valid range.
pub(super) fn config() -> impl Strategy<Value = Config> {
    (3u32..7, 3u32..9, 64u32..160, 64u32..160)
        .prop_flat_map(|(send_slots, recv_slots, send_slot_size, recv_slot_size)| {
            (3..=recv_slots).prop_flat_map(move |window| {
                (
                    Just(Config {
                        send_slots,
                        send_slot_size,
                        recv_slots,
                        recv_slot_size,
                        recv_window: Some(window),
                        ..Config::default()
                    }),
                    1..=send_slots,
                    // None: the threshold follows the window as it grows.
                    proptest::option::of(2..window),
                    1..=send_slots,
                    prop_oneof![Just(0u32), Just(64), Just(128)],
                    1..=send_slots,
                )
            })
        })
        .prop_map(
            |(base, signal, threshold, queued, max_inline, send)| Config {
                send_window: Some(send),
                signal_interval: Some(signal),
                credit_return_threshold: threshold,
                max_queued: Some(queued),
                max_inline,
                ..base
            },
        )
}

pub(super) fn apply(p: &mut Pair, op: Op) {
    match op {
        Op::Send(s, payload) | Op::Write(s, payload) => {
            let ep = p.side(s);
            let payload = u32::from(payload) % (ep.max_payload() + 1);
            match ep.write(payload) {
                Ok(()) if matches!(op, Op::Send(..)) => assert!(ep.commit(true)),
                Ok(()) | Err(SendError::WouldBlock) => {}
                Err(e) => panic!("unexpected send error: {e}"),
            }
        }
        Op::Commit(s, newest) => {
            p.side(s).commit(newest);
        }
        Op::Abort(s, newest) => {
            p.side(s).abort(newest);
        }
        Op::Exec(s, n) => {
            for _ in 0..n {
                p.side(s).exec();
                p.check();
            }
        }
        Op::Transmit(s, n) => {
            for _ in 0..n {
                p.transmit(s);
            }
        }
        Op::PollSend(s) => {
            p.side(s).poll_send();
        }
        Op::PollRecv(s) => {
            p.side(s).poll_recv();
        }
        Op::Release(s, idx) => {
            p.side(s).release(usize::from(idx));
        }
        Op::Grow(s, n) => {
            p.side(s).grow(u32::from(n));
        }
        Op::Probe(s) => {
            p.side(s).probe();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_every_invariant(
        a in config(),
        b in config(),
        ops in proptest::collection::vec(op(), 1..400),
        tail in 0u64..40,
    ) {
        let mut p = Pair::new(a, b);
        for op in ops {
            apply(&mut p, op);
            p.check();
        }
        for side in [Side::A, Side::B] {
            while p.side(side).commit(false) {}
        }
        p.a.quota = tail;
        p.b.quota = tail;
        p.run_to_idle(u32::MAX);
    }
}
