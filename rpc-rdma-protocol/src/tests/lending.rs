//! Bounded lending of receive slots: an application that keeps every frame it receives
//! (zero-copy views into the receive ring) never starves the ring of receives, because past
//! the lend limit frames are handed up as copies and their slots re-posted at once.

use proptest::prelude::*;

use super::fabric::{Pair, Side};
use crate::Config;

fn cfg(slots: u32, lend_limit: Option<u32>) -> Config {
    Config {
        send_slots: slots,
        send_slot_size: 256,
        recv_slots: slots,
        recv_slot_size: 256,
        lend_limit,
        ..Config::default()
    }
}

/// Runs rounds until nothing moves; fails on livelock.
fn run(p: &mut Pair, payload: u32) {
    let mut rounds = 0;
    while p.round(payload) {
        rounds += 1;
        assert!(rounds < 100_000, "livelock");
    }
}

#[test]
fn a_hoarding_receiver_keeps_lend_limit_slots_and_gets_copies_of_the_rest() {
    let mut p = Pair::symmetric(cfg(16, None));
    p.b.hoard = true;
    p.a.quota = 1_000;
    run(&mut p, 100);
    // Everything arrived although b released nothing itself.
    assert_eq!(p.a.quota, 0, "the sender stalled");
    assert_eq!(p.b.delivered.len(), 1_000);
    let limit = p.b.geom.lend_limit;
    assert_eq!(limit, 4, "default: a quarter of the receive ring");
    assert_eq!(p.b.held.len() as u32, limit);
    assert_eq!(p.b.copied, 1_000 - u64::from(limit));
    assert_eq!(p.b.conn.stats().recv_held, limit);
    // Once the application lets go, every credit comes home.
    p.b.hoard = false;
    p.run_to_idle(0);
}

#[test]
fn lend_limit_zero_copies_every_frame() {
    let mut p = Pair::symmetric(cfg(4, Some(0)));
    p.b.hoard = true;
    p.a.quota = 50;
    run(&mut p, 64);
    assert_eq!(
        (p.b.delivered.len(), p.b.held.len(), p.b.copied),
        (50, 0, 50)
    );
    p.b.hoard = false;
    p.run_to_idle(0);
}

#[test]
fn a_lend_limit_that_would_take_the_peers_last_credits_is_refused() {
    assert!(cfg(8, Some(5)).validate().is_ok());
    assert!(cfg(8, Some(6)).validate().is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Both sides send at once, over small random rings and lend limits, and each keeps
    /// whatever it may: both finish, no RNR, no frame lost or corrupted (the fabric checks).
    #[test]
    fn hoarding_on_both_sides_never_deadlocks(
        slots in 3u32..9,
        limit_a in 0u32..7,
        limit_b in 0u32..7,
        messages in 1u64..200,
        payload in 0u32..200,
    ) {
        let a = cfg(slots, Some(limit_a.min(slots - 3)));
        let b = cfg(slots, Some(limit_b.min(slots - 3)));
        let mut p = Pair::new(a, b);
        for side in [Side::A, Side::B] {
            let ep = p.side(side);
            ep.hoard = true;
            ep.quota = messages;
        }
        run(&mut p, payload);
        for side in [Side::A, Side::B] {
            let ep = p.side(side);
            prop_assert_eq!(ep.quota, 0);
            prop_assert!(ep.held.len() as u32 <= ep.geom.lend_limit);
        }
        prop_assert_eq!(p.a.delivered.len() as u64, messages);
        prop_assert_eq!(p.b.delivered.len() as u64, messages);
        p.a.hoard = false;
        p.b.hoard = false;
        p.run_to_idle(0);
    }
}
