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

/// A receiver that gathers released slots as the driver does, `gather` at a time, while
/// the application keeps `lend_limit` frames for good: how many of 2,000 one-way frames
/// arrive before the sender runs out of credits.
fn delivered_when_gathering(lend_limit: u32, gather: Option<u32>) -> (usize, u32) {
    let mut p = Pair::symmetric(cfg(64, Some(lend_limit)));
    let batch = p.b.conn.release_batch();
    p.b.hoard = true;
    p.b.gather = Some(gather.unwrap_or(batch));
    p.a.quota = 2_000;
    run(&mut p, 100);
    (p.b.delivered.len(), batch)
}

#[test]
fn gathered_releases_never_starve_the_peer_of_credits() {
    // The defaults: an eighth of the window.
    assert_eq!(delivered_when_gathering(16, None), (2_000, 8));
    // A large lend limit leaves little room: the batch shrinks with it, and one more
    // gathered slot than it allows stalls the sender for good.
    assert_eq!(delivered_when_gathering(30, None), (2_000, 2));
    let (stalled, _) = delivered_when_gathering(30, Some(3));
    assert!(
        stalled < 2_000,
        "one past the batch should stall: {stalled}"
    );
    assert_eq!(delivered_when_gathering(40, None), (2_000, 1));
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
