//! Offered bodies read only once their notice came ([`Connection::read_after_notice`]):
//! the driver is asked for memory knowing the call's method; an offer whose notice has not
//! come holds nothing, is answered on a `Cancel`, and is bounded.

use rpc_wire::{Code, Flags, FrameKind, Header};

use super::fabric::Pair;
use super::large::{cfg, large, CHUNK};
use super::read::{closed_by, conn, feed, reads_intact, source};
use crate::{Action, BodyId, Connection, Geometry, LocalBuffer, ProtocolViolation};

const METHOD: u32 = 0x5eed;

fn reader(max_queued: u32) -> Connection {
    let mut config = large(16, 1 << 20);
    config.max_queued = max_queued;
    let c = cfg(config);
    let mut conn = Connection::new(Geometry::negotiate(&c, &c.connect_params()).expect("geometry"));
    conn.read_after_notice();
    conn
}

/// The request announcing an offered body of `len` bytes.
fn notice(call_id: u64, len: u32) -> Header {
    let mut h = Header::new(FrameKind::Request, call_id);
    h.flags = Flags::LARGE_PAYLOAD;
    h.method_id = METHOD;
    h.payload_len = len;
    h
}

fn actions(c: &mut Connection) -> Vec<Action> {
    std::iter::from_fn(|| c.poll_action()).collect()
}

fn asked(actions: &[Action]) -> Vec<(BodyId, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ReadNeeded { body, len } => Some((*body, *len)),
            _ => None,
        })
        .collect()
}

const BODY: BodyId = BodyId { call_id: 3, seq: 0 };

#[test]
fn memory_is_asked_for_once_the_notice_names_the_method() {
    let mut c = reader(256);
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    assert_eq!(asked(&actions(&mut c)), [], "asked before the notice");
    assert_eq!(c.offered_method(BODY), None);
    assert_eq!(c.stats().large_grants, 0, "an offer alone holds nothing");
    feed(&mut c, 1, &notice(3, 5000)).expect("notice");
    assert_eq!(asked(&actions(&mut c)), [(BODY, 5000)]);
    assert_eq!(c.offered_method(BODY), Some(METHOD));
    let local = LocalBuffer {
        addr: 0x2000,
        lkey: 1,
    };
    assert!(c.read_into(BODY, local, 5000).is_some());
    let posted = actions(&mut c);
    assert!(
        posted.iter().any(|a| matches!(a, Action::PostRead(_))),
        "{posted:?}"
    );
    assert_eq!(c.offered_method(BODY), None, "lent: no longer asked");
}

#[test]
fn a_cancel_before_the_notice_answers_the_offer() {
    let mut c = reader(256);
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    feed(&mut c, 1, &Header::new(FrameKind::Cancel, 3)).expect("cancel");
    let answers: Vec<Header> = actions(&mut c)
        .into_iter()
        .filter_map(|a| match a {
            Action::PostSend(work) => work.frame,
            _ => None,
        })
        .filter(|h| h.kind == FrameKind::LargeSourceDone)
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(
        (answers[0].call_id, answers[0].status),
        (3, Code::Cancelled)
    );
    assert_eq!(c.offered_method(BODY), None);
    assert!(!c.is_closed());
    assert!(c.large_idle(), "the offer is forgotten");
}

#[test]
fn offers_without_their_notice_cannot_pile_up() {
    let mut c = reader(3);
    for call in 1..=3u64 {
        feed(&mut c, call as u32, &source(call, 5000)).expect("offer");
    }
    let expected = ProtocolViolation::OffersUnannounced { offers: 3 };
    assert_eq!(feed(&mut c, 4, &source(4, 5000)), Err(expected.clone()));
    closed_by(&c, expected);
}

#[test]
fn a_body_too_large_is_refused_when_its_notice_comes() {
    let mut c = reader(256);
    feed(&mut c, 0, &source(3, 2 << 20)).expect("offer");
    feed(&mut c, 1, &notice(3, 2 << 20)).expect("notice");
    let sent = actions(&mut c);
    assert_eq!(asked(&sent), []);
    let refusal = sent.iter().find_map(|a| match a {
        Action::PostSend(work) => work.frame.filter(|h| h.kind == FrameKind::LargeSourceDone),
        _ => None,
    });
    assert_eq!(refusal.map(|h| h.status), Some(Code::ResourceExhausted));
}

#[test]
fn offered_bodies_are_read_intact_after_their_notice() {
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(16, 1 << 20)));
    p.a.large.offer_requests = true;
    p.b.conn.read_after_notice();
    reads_intact(&mut p, &[300, u64::from(CHUNK) + 1, 3 * u64::from(CHUNK)]);
}

/// `max_queued` 0 lets no buffer request wait, but a notice is always a moment behind its
/// offer: the bounds on offers without their notice allow one.
#[test]
fn no_queue_still_lets_an_offer_wait_for_its_notice() {
    let mut c = reader(0);
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    feed(&mut c, 1, &notice(3, 5000)).expect("notice");
    assert_eq!(asked(&actions(&mut c)), [(BODY, 5000)]);
    // Without `read_after_notice` too.
    let mut config = large(16, 1 << 20);
    config.max_queued = 0;
    let c = cfg(config);
    let mut c = Connection::new(Geometry::negotiate(&c, &c.connect_params()).expect("geometry"));
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    assert_eq!(asked(&actions(&mut c)), [(BODY, 5000)]);
}

/// An offer that arrived before reading after the notice was set is asked for once.
#[test]
fn an_offer_asked_for_on_arrival_is_not_asked_for_again() {
    let mut c = conn();
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    let mut wanted = asked(&actions(&mut c));
    c.read_after_notice();
    feed(&mut c, 1, &notice(3, 5000)).expect("notice");
    wanted.extend(asked(&actions(&mut c)));
    assert_eq!(wanted, [(BODY, 5000)]);
}

#[test]
fn a_second_notice_or_one_past_the_offer_is_a_violation() {
    let mut c = reader(256);
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    feed(&mut c, 1, &notice(3, 5000)).expect("notice");
    let expected = ProtocolViolation::PlacedWithoutGrant { body: BODY };
    assert_eq!(feed(&mut c, 2, &notice(3, 5000)), Err(expected.clone()));
    closed_by(&c, expected);

    let mut c = reader(256);
    feed(&mut c, 0, &source(3, 5000)).expect("offer");
    let expected = ProtocolViolation::PlacedBeyondGrant {
        body: BODY,
        len: 5001,
        granted: 5000,
    };
    assert_eq!(feed(&mut c, 1, &notice(3, 5001)), Err(expected.clone()));
    closed_by(&c, expected);
}
