//! Request bodies read by RDMA READ over the in-memory fabric: no rendezvous, chunked
//! READs that let small frames pass, exactly one answer per offer, cancellation at every
//! stage, refusals, the grant limit, a response buffer advertised alongside, a disconnect
//! mid-READ, and an offer the peer revoked.

use rpc_wire::{Code, FrameKind, Header, RemoteBuffer};

use super::fabric::{Pair, Side};
use super::large::{cfg, large, pair, run_until, settle, CHUNK};
use crate::{Action, BodyId, CloseReason, Connection, Geometry, ProtocolViolation, WorkId};

/// A pair whose `a` sends its request bodies by offering them for reading.
fn reading_pair() -> Pair {
    let mut p = pair();
    p.a.large.offer_requests = true;
    p
}

/// Sends bodies of `sizes` from `a` to `b` and checks each was read intact, and its
/// source freed.
pub(super) fn reads_intact(p: &mut Pair, sizes: &[u64]) {
    let calls: Vec<u64> = sizes
        .iter()
        .map(|&len| p.a.send_large(len).expect("start"))
        .collect();
    settle(p);
    let mut got = p.b.large.delivered.clone();
    got.sort_unstable();
    assert_eq!(
        got,
        calls
            .into_iter()
            .zip(sizes.iter().copied())
            .collect::<Vec<_>>()
    );
    let n = u32::try_from(sizes.len()).expect("few");
    assert_eq!(p.b.large.read, n);
    assert_eq!(p.a.large.done, n, "every source freed after its window");
}

#[test]
fn offered_bodies_are_read_intact_without_a_rendezvous() {
    let mut p = reading_pair();
    let sizes = [
        300,
        u64::from(CHUNK),
        u64::from(CHUNK) + 1,
        5 * u64::from(CHUNK) + 5,
    ];
    reads_intact(&mut p, &sizes);
    let (a, b) = (p.a.conn.stats(), p.b.conn.stats());
    assert_eq!((a.large_rendezvous, a.large_sourced), (0, 4));
    assert_eq!(b.large_read, 4);
}

#[test]
fn the_body_moves_without_waiting_for_an_answer() {
    let mut p = reading_pair();
    p.a.send_large(2 * u64::from(CHUNK)).expect("start");
    // The offer and the notice go at once, one behind the other: no grant is waited for.
    while p.a.exec() {}
    assert_eq!(p.a.wire_shape(), "LSS", "bind, offer, notice");
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 1);
}

#[test]
fn small_frames_pass_a_body_being_read() {
    let mut p = reading_pair();
    p.a.send_large(16 * u64::from(CHUNK)).expect("start");
    run_until(&mut p, |p| p.b.wire_shape().contains('R'));
    p.b.send(10).expect("small send");
    let small = *p.b.committed.last().expect("committed");
    run_until(&mut p, |p| p.a.delivered.contains(&small));
    assert!(p.b.large.delivered.is_empty(), "the small frame waited");
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 1);
}

#[test]
fn a_cancel_before_the_offer_went_revokes_the_window_at_home() {
    let mut p = reading_pair();
    let call = p.a.send_large(3 * u64::from(CHUNK)).expect("start");
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert!(p.b.large.delivered.is_empty());
    assert_eq!((p.a.large.done, p.a.large.failed.len()), (1, 0));
}

#[test]
fn a_cancel_while_reading_waits_for_the_reads_then_answers() {
    let mut p = reading_pair();
    let call = p.a.send_large(16 * u64::from(CHUNK)).expect("start");
    run_until(&mut p, |p| p.b.wire_shape().contains('R'));
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert!(p.b.large.delivered.is_empty());
    assert_eq!(p.b.large.released, 1);
    assert_eq!((p.a.large.done, p.a.large.failed.len()), (1, 0));
    assert_eq!(p.a.large.access_errors + p.b.large.access_errors, 0);
}

#[test]
fn a_cancel_after_the_body_was_read_changes_nothing() {
    let mut p = reading_pair();
    let call = p.a.send_large(2 * u64::from(CHUNK)).expect("start");
    run_until(&mut p, |p| p.b.large.read == 1);
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 1);
    assert_eq!(p.b.large.released, 0);
}

#[test]
fn refused_offers_fail_their_call_and_their_notice_goes_nowhere() {
    // By the receiver's budget (the driver refuses) ...
    let mut p = reading_pair();
    p.b.large.budget = Some(1000);
    let call = p.a.send_large(5000).expect("start");
    settle(&mut p);
    assert_eq!(p.a.large.failed, [(call, Code::ResourceExhausted)]);
    assert!(!p.b.delivered.contains(&call), "the notice was handed up");
    // ... and by the receiver's configured maximum (the protocol refuses).
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(16, 4000)));
    p.a.large.offer_requests = true;
    let call = p.a.send_large(5000).expect("start");
    let ok = p.a.send_large(3000).expect("start");
    settle(&mut p);
    assert_eq!(p.a.large.failed, [(call, Code::ResourceExhausted)]);
    assert_eq!(p.b.large.delivered, [(ok, 3000)]);
}

#[test]
fn offers_beyond_the_grant_limit_wait_their_turn() {
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(1, 1 << 20)));
    p.a.large.offer_requests = true;
    for _ in 0..4 {
        p.a.send_large(3 * u64::from(CHUNK)).expect("start");
    }
    while p.round(16) {
        assert!(p.b.conn.stats().large_grants <= 1, "grant limit exceeded");
    }
    settle(&mut p);
    assert_eq!(p.b.large.read, 4);
}

/// The writer's own windows are bounded too: offers beyond its `max_grants` go by the
/// rendezvous, so binds and invalidations never outgrow the send queue sized for them.
#[test]
fn offers_beyond_the_writers_grant_limit_take_the_rendezvous() {
    let mut p = Pair::new(cfg(large(2, 1 << 20)), cfg(large(16, 1 << 20)));
    p.a.large.offer_requests = true;
    for _ in 0..5 {
        p.a.send_large(3 * u64::from(CHUNK)).expect("start");
    }
    let a = p.a.conn.stats();
    assert_eq!((a.large_sourced, a.large_rendezvous), (2, 3));
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 5);
    assert_eq!(p.b.large.read, 2);
    // Answered and invalidated, the windows count no more.
    for _ in 0..2 {
        p.a.send_large(3 * u64::from(CHUNK)).expect("start");
    }
    assert_eq!(p.a.conn.stats().large_sourced, 4);
    settle(&mut p);
    assert_eq!(p.b.large.delivered.len(), 7);
}

#[test]
fn a_read_request_still_advertises_its_response_buffer() {
    let mut p = reading_pair();
    let call =
        p.a.send_large_advertising(3 * u64::from(CHUNK), 4 * u64::from(CHUNK));
    run_until(&mut p, |p| p.b.large.delivered.len() == 1);
    p.b.respond_large(call, 4 * u64::from(CHUNK))
        .expect("respond");
    settle(&mut p);
    assert_eq!(p.a.large.delivered, [(call, 4 * u64::from(CHUNK))]);
    let (a, b) = (p.a.conn.stats(), p.b.conn.stats());
    assert_eq!((a.large_sourced, b.large_into_advertised), (1, 1));
    assert_eq!(a.large_rendezvous + b.large_rendezvous, 0);
}

#[test]
fn a_refused_read_request_withdraws_its_response_buffer() {
    let mut p = reading_pair();
    p.b.large.budget = Some(1000);
    let call = p.a.send_large_advertising(5000, 4 * u64::from(CHUNK));
    settle(&mut p);
    assert_eq!(p.a.large.failed, [(call, Code::ResourceExhausted)]);
    assert_eq!(p.a.large.released, 1, "the advertised buffer stayed open");
}

#[test]
fn a_disconnect_mid_read_gives_the_buffer_back_and_hands_nothing_up() {
    let mut p = reading_pair();
    p.a.send_large(16 * u64::from(CHUNK)).expect("start");
    run_until(&mut p, |p| p.b.wire_shape().contains('R'));
    p.b.conn.on_peer_disconnected();
    p.b.absorb();
    // Every action is executed: the marker and the READs are posted.
    while p.b.exec() {}
    let reads = p.b.reading_grants();
    assert!(!reads.is_empty(), "a READ is posted");
    p.b.qp_error();
    p.b.conn.on_completion_error(WorkId::Probe, "flushed");
    assert!(!p.b.conn.is_closed(), "a READ is outstanding");
    for grant in reads {
        p.b.conn.on_completion_error(WorkId::Read(grant), "flushed");
    }
    p.b.absorb();
    while p.b.exec() {}
    assert_eq!(p.b.large.released, 1, "the buffer was given back");
    assert!(
        p.b.large.delivered.is_empty(),
        "a partial body was handed up"
    );
}

#[test]
fn a_read_through_a_revoked_window_finds_nothing() {
    let mut p = reading_pair();
    p.a.send_large(2 * u64::from(CHUNK)).expect("start");
    // Everything up to the offer's arrival; then the writer's window is invalidated
    // behind the protocol's back, as a peer that revokes early would.
    run_until(&mut p, |p| p.b.wire_shape().contains('R'));
    p.a.large.revoke_all_windows();
    while p.transmit(Side::B) {}
    assert!(p.b.large.access_errors > 0, "a READ read revoked memory");
    assert!(p.b.large.delivered.is_empty());
}

// ---- hostile input, one connection fed frames by hand ----

pub(super) const SLOT: usize = 256;

pub(super) fn conn() -> Connection {
    let c = cfg(large(16, 1 << 20));
    Connection::new(Geometry::negotiate(&c, &c.connect_params()).expect("geometry"))
}

pub(super) fn feed(c: &mut Connection, slot: u32, h: &Header) -> Result<(), ProtocolViolation> {
    let mut buf = vec![0u8; SLOT];
    let len = h.encode(&mut buf);
    c.on_recv_complete(slot, len as u32, &buf).map(|_| ())
}

pub(super) fn source(call_id: u64, len: u64) -> Header {
    let mut h = Header::new(FrameKind::LargeSource, call_id);
    h.remote = RemoteBuffer {
        addr: 0x10_0000,
        rkey: 0x77,
        generation: 1,
        len,
    };
    h
}

pub(super) fn closed_by(c: &Connection, expected: ProtocolViolation) {
    assert_eq!(c.close_reason(), Some(&CloseReason::Violation(expected)));
}

#[test]
fn an_answer_to_an_offer_never_made_is_a_violation() {
    let mut c = conn();
    let done = Header::new(FrameKind::LargeSourceDone, 5);
    let expected = ProtocolViolation::UnexpectedSourceDone {
        body: BodyId { call_id: 5, seq: 0 },
    };
    assert_eq!(feed(&mut c, 0, &done), Err(expected.clone()));
    closed_by(&c, expected);
}

#[test]
fn a_second_offer_of_a_body_is_a_violation() {
    let mut c = conn();
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    let expected = ProtocolViolation::DuplicateBufferRequest {
        body: BodyId { call_id: 3, seq: 0 },
    };
    assert_eq!(feed(&mut c, 1, &source(3, 5000)), Err(expected.clone()));
    closed_by(&c, expected);
}

/// A driver that lends less than the offered body refuses it (naming what it lent) instead
/// of leaving the offer unanswered and its place taken.
#[test]
fn a_buffer_short_of_the_offer_refuses_it() {
    let mut c = conn();
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    let asked = std::iter::from_fn(|| c.poll_action()).find_map(|a| match a {
        Action::ReadNeeded { body, len } => Some((body, len)),
        _ => None,
    });
    let body = BodyId { call_id: 3, seq: 0 };
    assert_eq!(asked, Some((body, 5000)));
    let local = crate::LocalBuffer {
        addr: 0x2000,
        lkey: 1,
    };
    assert_eq!(c.read_into(body, local, 4999), None);
    assert_eq!(c.stats().large_grants, 0, "the offer's place is free again");
    assert!(!c.is_closed());
}

#[test]
fn an_offer_of_a_stream_message_is_a_violation() {
    let mut c = conn();
    let mut offer = source(3, 5000);
    offer.method_id = 2; // a stream message's sequence number
    let expected = ProtocolViolation::OfferedStreamMessage {
        body: BodyId { call_id: 3, seq: 2 },
    };
    assert_eq!(feed(&mut c, 0, &offer), Err(expected.clone()));
    closed_by(&c, expected);
}

#[test]
fn an_offer_past_the_end_of_memory_is_a_violation() {
    let mut c = conn();
    let mut h = source(3, 5000);
    h.remote.addr = u64::MAX - 10;
    assert!(matches!(
        feed(&mut c, 0, &h),
        Err(ProtocolViolation::BufferOutOfRange { call_id: 3, .. })
    ));
}

#[test]
fn refused_offers_without_their_notice_cannot_pile_up() {
    // Each offer is too large, so refused at once; a peer that never sends the notices
    // behind them is closed once a queue's worth is outstanding.
    let mut small = large(16, 1000);
    small.max_queued = 3;
    let c = cfg(small);
    let mut c = Connection::new(Geometry::negotiate(&c, &c.connect_params()).expect("geometry"));
    let mut outcome = Ok(());
    for call in 1..=8u64 {
        while c.poll_action().is_some() {}
        outcome = feed(&mut c, (call % 8) as u32, &source(call, 5000));
        if outcome.is_err() {
            break;
        }
    }
    assert_eq!(
        outcome,
        Err(ProtocolViolation::NoticesMissing { refused: 3 })
    );
}
