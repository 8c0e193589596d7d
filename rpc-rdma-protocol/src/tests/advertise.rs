//! Response buffers advertised with requests: a large response fitting the buffer spends
//! no rendezvous; every other answer (a larger or small response, a cancel) ends the
//! advertisement, and no answer lands in memory that is no longer the call's.

use super::fabric::Pair;
use super::large::{cfg, large, pair, run_until, settle, CHUNK};

const BUFFER: u64 = 4 * CHUNK as u64;

/// `a` sends a request advertising a `BUFFER`-byte response buffer; runs until `b` holds it.
fn advertised_call(p: &mut Pair) -> u64 {
    let (call, advertised) = p.a.send_advertising(10, BUFFER).expect("send");
    assert!(advertised);
    run_until(p, |p| p.b.delivered.contains(&call));
    call
}

#[test]
fn a_response_that_fits_goes_straight_into_the_advertised_buffer() {
    let mut p = pair();
    let call = advertised_call(&mut p);
    p.b.respond_large(call, BUFFER - 7).expect("respond");
    settle(&mut p);
    assert_eq!(p.a.large.delivered, [(call, BUFFER - 7)]);
    let stats = p.b.conn.stats();
    assert_eq!(
        (stats.large_into_advertised, stats.large_rendezvous),
        (1, 0),
        "the response took a rendezvous it did not need"
    );
    assert_eq!(p.a.large.released, 0);
    let stats = p.a.conn.stats();
    assert_eq!(
        (
            stats.response_buffers_advertised,
            stats.response_buffers_filled
        ),
        (1, 1)
    );
}

#[test]
fn a_response_larger_than_the_buffer_takes_the_rendezvous_and_ends_the_offer() {
    let mut p = pair();
    let call = advertised_call(&mut p);
    p.b.respond_large(call, BUFFER + 1).expect("respond");
    settle(&mut p);
    assert_eq!(p.a.large.delivered, [(call, BUFFER + 1)]);
    assert_eq!(
        p.a.large.released, 1,
        "the advertised buffer was not revoked"
    );
    let stats = p.b.conn.stats();
    assert_eq!(
        (stats.large_into_advertised, stats.large_rendezvous),
        (0, 1)
    );
}

#[test]
fn a_response_in_a_slot_ends_the_offer() {
    let mut p = pair();
    let call = advertised_call(&mut p);
    p.b.respond(call, 12).expect("respond");
    settle(&mut p);
    assert!(p.a.delivered.contains(&call));
    assert!(p.a.large.delivered.is_empty());
    assert_eq!(
        p.a.large.released, 1,
        "the advertised buffer was not revoked"
    );
}

#[test]
fn a_cancel_before_the_answer_is_released_by_the_server() {
    let mut p = pair();
    let call = advertised_call(&mut p);
    p.a.cancel(call).expect("cancel");
    // The server's handler is gone: it never answers. Its connection releases the offer
    // on its own, and `settle` proves nothing is left open on either side.
    settle(&mut p);
    assert_eq!(p.a.large.released, 1);
    assert!(
        p.a.delivered.contains(&call),
        "the release is a Cancel frame"
    );
}

#[test]
fn a_cancel_while_the_response_is_written_keeps_the_buffer_until_it_lands() {
    let mut p = pair();
    let call = advertised_call(&mut p);
    p.b.respond_large(call, BUFFER).expect("respond");
    run_until(&mut p, |p| p.b.wire_shape().contains('W'));
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    // The body lands whole (its call is gone, so the upper layer would drop it); no WRITE
    // met a revoked window.
    assert_eq!(p.a.large.delivered, [(call, BUFFER)]);
    assert_eq!(p.a.large.access_errors, 0);
}

#[test]
fn a_response_after_the_release_still_finds_its_way() {
    // The handler finished in the instant between the Cancel's arrival and its abort.
    let mut p = pair();
    let call = advertised_call(&mut p);
    p.a.cancel(call).expect("cancel");
    // Request and Cancel both reached the server.
    run_until(&mut p, |p| {
        p.b.delivered.iter().filter(|&&c| c == call).count() == 2
    });
    p.b.respond_large(call, BUFFER).expect("respond");
    settle(&mut p);
    assert_eq!(p.a.large.released, 1);
    assert_eq!(p.a.large.delivered, [(call, BUFFER)]);
    assert_eq!(p.b.conn.stats().large_rendezvous, 1);
}

#[test]
fn advertisements_count_against_the_grant_limit() {
    let mut p = Pair::new(cfg(large(2, 1 << 20)), cfg(large(16, 1 << 20)));
    let advertised: Vec<bool> = (0..3)
        .map(|_| p.a.send_advertising(10, BUFFER).expect("send").1)
        .collect();
    assert_eq!(advertised, [true, true, false]);
    settle_answering(&mut p);
}

#[test]
fn a_request_cannot_carry_a_buffer_it_did_not_advertise() {
    let mut p = pair();
    let mut header = rpc_wire::Header::new(rpc_wire::FrameKind::Request, 99);
    header.flags = rpc_wire::Flags::RESPONSE_BUFFER;
    header.remote.len = BUFFER;
    header.remote.rkey = 5;
    p.a.write_frame(header).expect("reserve");
    let w = p.a.written.pop_back().expect("written");
    assert_eq!(
        p.a.conn.commit_send(w.reservation, &w.header),
        Err(crate::SendError::NotAdvertised { call_id: 99 })
    );
    assert_eq!(p.a.conn.stats().send_unposted, 0, "the slot was given back");
}

/// A large request whose rendezvous is refused never reaches the server, and neither does
/// the response buffer its notice advertised: the client revokes it.
#[test]
fn a_large_request_refused_takes_its_offer_back() {
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(16, 1000)));
    p.a.send_large_advertising(4000, BUFFER);
    // `settle` finds no grant left open and no registered buffer leaked.
    settle(&mut p);
    assert_eq!(
        p.a.large.released, 1,
        "the advertised buffer was not revoked"
    );
}

/// A large request cancelled before its notice went: the offer goes with it.
#[test]
fn a_large_request_cancelled_before_its_notice_takes_its_offer_back() {
    for written in [false, true] {
        let mut p = pair();
        let call = p.a.send_large_advertising(3 * u64::from(CHUNK), BUFFER);
        if written {
            // Granted, and writing.
            run_until(&mut p, |p| p.a.wire_shape().contains('W'));
        }
        p.a.cancel(call).expect("cancel");
        settle(&mut p);
        assert_eq!(
            p.a.large.released, 1,
            "the advertised buffer was not revoked"
        );
    }
}

/// Answers every request `b` holds with a small response, then settles.
fn settle_answering(p: &mut Pair) {
    p.run_to_idle(16);
    let calls = p.b.delivered.clone();
    for call in calls {
        p.b.respond(call, 4).expect("respond");
    }
    settle(p);
    assert_eq!(p.a.large.released, 2);
}
