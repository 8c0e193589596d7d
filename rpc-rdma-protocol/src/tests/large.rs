//! Large bodies over the in-memory fabric: the rendezvous, chunked WRITEs that let small
//! frames pass, cancellation at every stage, refusals, the grant limit, and late WRITEs.

use rpc_wire::Code;

use super::fabric::{Pair, Side};
use crate::{Config, LargeConfig};

pub(super) const CHUNK: u32 = 4096;

pub(super) fn cfg(large: LargeConfig) -> Config {
    Config {
        send_slots: 8,
        send_slot_size: 256,
        recv_slots: 8,
        recv_slot_size: 256,
        large,
        ..Config::default()
    }
}

pub(super) fn large(max_grants: u32, max_message: u64) -> LargeConfig {
    LargeConfig {
        chunk_size: CHUNK,
        write_window: 2,
        max_grants,
        max_queued: 256,
        max_message,
    }
}

pub(crate) fn pair() -> Pair {
    Pair::symmetric(cfg(large(16, 1 << 20)))
}

/// One round of everything, on both sides; true if anything happened.
fn step(p: &mut Pair) -> bool {
    p.round(16)
}

/// Runs the fabric one operation at a time (driver actions first, then one work request
/// per direction, then completions) until `done` holds.
pub(crate) fn run_until(p: &mut Pair, done: impl Fn(&Pair) -> bool) {
    for _ in 0..100_000 {
        if done(p) {
            return;
        }
        let mut progress = false;
        for side in [Side::A, Side::B] {
            if p.side(side).exec() {
                progress = true;
                p.check();
            }
        }
        if !progress {
            progress = p.transmit(Side::A) | p.transmit(Side::B);
        }
        if !progress {
            for side in [Side::A, Side::B] {
                let ep = p.side(side);
                progress |= ep.poll_send() | ep.poll_recv();
                while ep.release(0) {
                    progress = true;
                }
            }
        }
        assert!(progress, "stalled before the condition held");
    }
    panic!("condition never held");
}

pub(super) fn settle(p: &mut Pair) {
    p.run_to_idle(16);
    for side in [Side::A, Side::B] {
        let ep = p.side(side);
        let stats = ep.conn.stats();
        assert_eq!(
            (stats.large_transfers, stats.large_grants),
            (0, 0),
            "large-body state left behind: {stats:?}"
        );
        assert!(ep.large.mem.is_empty(), "registered buffers leaked");
        assert!(ep.conn.large_idle(), "large-body bookkeeping left behind");
        assert_eq!(ep.large.access_errors, 0);
    }
}

#[test]
fn large_bodies_arrive_intact_and_no_longer_writable() {
    let mut p = pair();
    let sizes = [
        300,
        u64::from(CHUNK),
        u64::from(CHUNK) + 1,
        3 * u64::from(CHUNK) + 5,
    ];
    let calls: Vec<u64> = sizes
        .iter()
        .map(|&len| p.a.send_large(len).expect("start"))
        .collect();
    settle(&mut p);
    let expected: Vec<(u64, u64)> = calls.into_iter().zip(sizes).collect();
    let mut got = p.b.large.delivered.clone();
    got.sort_unstable();
    assert_eq!(got, expected);
    assert_eq!(p.a.large.done, 4);
}

#[test]
fn small_frames_overtake_a_large_body_between_its_chunks() {
    let mut p = pair();
    p.a.send_large(16 * u64::from(CHUNK)).expect("start");
    // Until the grant is back and the first chunks are out.
    run_until(&mut p, |p| p.a.wire_shape().contains('W'));
    p.a.send(10).expect("small send");
    let small = *p.a.committed.last().expect("committed");
    run_until(&mut p, |p| p.b.delivered.contains(&small));
    assert!(
        p.b.large.delivered.is_empty(),
        "the small frame waited for the whole large body"
    );
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 1);
}

#[test]
fn cancel_before_the_grant_revokes_it_at_the_receiver() {
    let mut p = pair();
    let call = p.a.send_large(3 * u64::from(CHUNK)).expect("start");
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert!(p.b.large.delivered.is_empty());
    // Granted and then revoked, or refused when the Cancel came before the grant.
    assert!(p.b.large.released <= 1);
    assert!(
        p.a.large.failed.is_empty(),
        "a cancelled call is not failed twice"
    );
    assert_eq!(p.a.large.done, 1);
}

#[test]
fn cancel_while_writing_stops_the_writes_and_revokes_the_grant() {
    let mut p = pair();
    let call = p.a.send_large(16 * u64::from(CHUNK)).expect("start");
    run_until(&mut p, |p| p.a.wire_shape().contains('W'));
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert!(p.b.large.delivered.is_empty());
    assert_eq!(p.b.large.released, 1);
    assert_eq!(p.a.large.done, 1);
}

#[test]
fn a_cancel_after_the_body_was_announced_changes_nothing() {
    let mut p = pair();
    let call = p.a.send_large(2 * u64::from(CHUNK)).expect("start");
    // Run until the notice is posted right behind the last chunk, then cancel.
    run_until(&mut p, |p| p.a.wire_shape().contains("WS"));
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert_eq!(
        p.b.large.delivered.len(),
        1,
        "the complete body is delivered"
    );
    assert_eq!(p.b.large.released, 0);
}

#[test]
fn refusals_fail_the_transfer_and_free_its_buffer() {
    // By the receiver's budget (the driver refuses) ...
    let mut p = pair();
    p.b.large.budget = Some(1000);
    let call = p.a.send_large(5000).expect("start");
    settle(&mut p);
    assert_eq!(p.a.large.failed, [(call, Code::ResourceExhausted)]);
    // ... and by the receiver's configured maximum (the protocol refuses).
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(16, 4000)));
    let call = p.a.send_large(5000).expect("start");
    let ok = p.a.send_large(3000).expect("start");
    settle(&mut p);
    assert_eq!(p.a.large.failed, [(call, Code::ResourceExhausted)]);
    assert_eq!(p.b.large.delivered, [(ok, 3000)]);
}

#[test]
fn buffer_requests_beyond_the_grant_limit_wait_their_turn() {
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(1, 1 << 20)));
    for _ in 0..4 {
        p.a.send_large(2 * u64::from(CHUNK)).expect("start");
    }
    while step(&mut p) {
        assert!(p.b.conn.stats().large_grants <= 1, "grant limit exceeded");
    }
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 4);
}

#[test]
fn buffer_requests_beyond_the_queue_bound_are_refused() {
    let mut queued = large(1, 1 << 20);
    queued.max_queued = 2;
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(queued));
    let calls: Vec<u64> = (0..6)
        .map(|_| p.a.send_large(2 * u64::from(CHUNK)).expect("start"))
        .collect();
    settle(&mut p);
    // All six asks arrive before the receiver's driver lends the first buffer: one is
    // asked for, two wait, three are refused.
    let refused: Vec<(u64, Code)> = calls[3..]
        .iter()
        .map(|&c| (c, Code::ResourceExhausted))
        .collect();
    assert_eq!(p.a.large.failed, refused);
    assert_eq!(p.b.large.delivered.len(), 3);
    assert_eq!(p.b.conn.stats().large_queue_refusals, 3);
}

#[test]
fn a_late_write_with_a_revoked_rkey_never_lands() {
    let mut p = pair();
    p.a.send_large(2 * u64::from(CHUNK)).expect("start");
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 1);
    // Replay the last chunk after the body was handed up: the window is gone.
    p.a.replay_last_write();
    while p.transmit(Side::A) {}
    assert_eq!(p.b.large.access_errors, 1);
}

#[test]
fn large_and_small_traffic_in_both_directions_settles() {
    let mut p = pair();
    p.a.quota = 40;
    p.b.quota = 40;
    for i in 0..6 {
        p.a.send_large(u64::from(CHUNK) * (i + 1) + i)
            .expect("start a");
        p.b.send_large(u64::from(CHUNK) * (6 - i) + 3)
            .expect("start b");
    }
    settle(&mut p);
    assert_eq!(p.a.large.delivered.len(), 6);
    assert_eq!(p.b.large.delivered.len(), 6);
}

#[test]
fn cancel_crossing_the_grant_revokes_it() {
    let mut p = pair();
    let call = p.a.send_large(3 * u64::from(CHUNK)).expect("start");
    // The receiver has bound the window and sent the grant; the writer has not seen it.
    run_until(&mut p, |p| p.b.wire_shape().contains("LS"));
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert!(p.b.large.delivered.is_empty());
    assert_eq!(p.b.large.released, 1, "the open grant was not revoked");
}
