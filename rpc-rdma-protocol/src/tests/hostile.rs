//! Hostile input: forged, malformed and impossible frames and completions. Each must produce
//! a named [`ProtocolViolation`] and close the connection, never a panic.

use proptest::prelude::*;
use rpc_wire::{FrameKind, Header, HeaderError};

use crate::{
    Action, BodyId, CloseReason, Config, Connection, Geometry, ProtocolViolation, SendError,
    SendTarget,
};

const SLOT: usize = 256;

fn conn() -> Connection {
    let c = Config {
        send_slots: 4,
        send_slot_size: SLOT as u32,
        recv_slots: 4,
        recv_slot_size: SLOT as u32,
        ..Config::default()
    };
    let mut conn = Connection::new(Geometry::negotiate(&c, &c.connect_params()).unwrap());
    assert_eq!(
        conn.poll_action(),
        None,
        "the receive ring is posted by the driver"
    );
    conn
}

/// The body of a request or response of `call_id`.
fn unary(call_id: u64) -> BodyId {
    BodyId { call_id, seq: 0 }
}

fn frame(h: &Header) -> Vec<u8> {
    let mut buf = vec![0u8; SLOT];
    h.encode(&mut buf);
    buf
}

/// A request in the full (64-byte) header form: it carries a deadline.
fn request(payload_len: u32, credits: u32) -> Header {
    let mut h = Header::new(FrameKind::Request, 1);
    h.payload_len = payload_len;
    h.credits = credits;
    h.timeout_us = 1_000;
    h
}

/// Feeds one receive completion and checks the violation closed the connection for good.
fn expect_violation(
    mut c: Connection,
    slot: u32,
    byte_len: u32,
    buf: &[u8],
    expected: ProtocolViolation,
) {
    assert_eq!(
        c.on_recv_complete(slot, byte_len, buf),
        Err(expected.clone())
    );
    assert_closed_by(&mut c, expected);
}

fn assert_closed_by(c: &mut Connection, expected: ProtocolViolation) {
    assert_eq!(c.close_reason(), Some(&CloseReason::Violation(expected)));
    assert_eq!(c.reserve_send(64).unwrap_err(), SendError::Closed);
    while let Some(action) = c.poll_action() {
        assert!(
            matches!(action, Action::SendDropped { .. }),
            "{action:?} after a violation"
        );
    }
}

#[test]
fn malformed_header() {
    let mut buf = frame(&request(0, 0));
    buf[0] = 0;
    expect_violation(
        conn(),
        0,
        64,
        &buf,
        ProtocolViolation::BadHeader {
            slot: 0,
            source: HeaderError::BadMagic(0x5200),
        },
    );
    let mut cancel = frame(&Header::new(FrameKind::Cancel, 1));
    cancel[24] = 1; // payload_len on a Cancel
    expect_violation(
        conn(),
        1,
        65,
        &cancel,
        ProtocolViolation::BadHeader {
            slot: 1,
            source: HeaderError::UnexpectedBody {
                kind: FrameKind::Cancel,
            },
        },
    );
    expect_violation(
        conn(),
        2,
        20,
        &frame(&request(0, 0)),
        ProtocolViolation::BadHeader {
            slot: 2,
            source: HeaderError::Truncated { len: 20, need: 32 },
        },
    );
}

#[test]
fn lengths_beyond_slot_or_completion() {
    let buf = frame(&request(SLOT as u32 - 63, 0));
    expect_violation(
        conn(),
        0,
        SLOT as u32,
        &buf,
        ProtocolViolation::FrameExceedsSlot {
            slot: 0,
            declared: SLOT as u64 + 1,
            slot_size: SLOT as u32,
        },
    );
    expect_violation(
        conn(),
        0,
        SLOT as u32 + 1,
        &[0u8; 2 * SLOT],
        ProtocolViolation::CompletionExceedsSlot {
            slot: 0,
            byte_len: SLOT as u32 + 1,
            slot_size: SLOT as u32,
        },
    );
    expect_violation(
        conn(),
        0,
        100,
        &frame(&request(100, 0)),
        ProtocolViolation::LengthMismatch {
            slot: 0,
            declared: 164,
            byte_len: 100,
        },
    );
    expect_violation(
        conn(),
        0,
        80,
        &frame(&request(0, 0)),
        ProtocolViolation::LengthMismatch {
            slot: 0,
            declared: 64,
            byte_len: 80,
        },
    );
    let mut c = conn();
    assert_eq!(
        c.on_recv_complete(0, 64, &[0u8; 10]),
        Err(ProtocolViolation::RecvBufferTooShort {
            slot: 0,
            len: 10,
            byte_len: 64
        })
    );
    // Exactly the slot size is fine.
    let mut c = conn();
    let rx = c.on_recv_complete(0, SLOT as u32, &frame(&request(SLOT as u32 - 64, 0)));
    assert_eq!(rx.unwrap().unwrap().payload_range(), 64..SLOT);
}

#[test]
fn forged_credits() {
    // Before we have sent anything the peer cannot have re-posted a single slot.
    expect_violation(
        conn(),
        0,
        64,
        &frame(&request(0, 1)),
        ProtocolViolation::CreditOverflow {
            held: 4,
            granted: 1,
            ring: 4,
        },
    );
    expect_violation(
        conn(),
        0,
        64,
        &frame(&request(0, u32::MAX)),
        ProtocolViolation::CreditOverflow {
            held: 4,
            granted: u32::MAX,
            ring: 4,
        },
    );
    // After one send, exactly one credit may come back.
    let mut c = conn();
    let r = c.reserve_send(64).unwrap();
    c.commit_send(r, &Header::new(FrameKind::Request, 1))
        .unwrap();
    assert!(matches!(c.poll_action(), Some(Action::PostSend(_))));
    assert_eq!(
        c.on_recv_complete(0, 64, &frame(&request(0, 1)))
            .map(|r| r.is_some()),
        Ok(true)
    );
    assert_eq!(c.stats().send_credits, 4);
    expect_violation(
        c,
        1,
        64,
        &frame(&request(0, 1)),
        ProtocolViolation::CreditOverflow {
            held: 4,
            granted: 1,
            ring: 4,
        },
    );
    // A credit-only frame must return something.
    let mut empty = Header::new(FrameKind::CreditOnly, 0);
    empty.credits = 0;
    expect_violation(
        conn(),
        0,
        32,
        &frame(&empty),
        ProtocolViolation::EmptyCreditOnly,
    );
}

#[test]
fn completions_that_cannot_happen() {
    expect_violation(
        conn(),
        4,
        64,
        &frame(&request(0, 0)),
        ProtocolViolation::RecvSlotOutOfRange { slot: 4, slots: 4 },
    );
    let mut c = conn();
    c.on_recv_complete(2, 64, &frame(&request(0, 0))).unwrap();
    expect_violation(
        c,
        2,
        64,
        &frame(&request(0, 0)),
        ProtocolViolation::RecvSlotNotPosted { slot: 2 },
    );

    let mut c = conn();
    let v = ProtocolViolation::UnexpectedSendCompletion {
        slot: 0,
        expected: None,
    };
    assert_eq!(c.on_send_complete(SendTarget::Ring(0)), Err(v.clone()));
    assert_closed_by(&mut c, v);

    let mut c = conn();
    let v = ProtocolViolation::UnexpectedControlCompletion;
    assert_eq!(c.on_send_complete(SendTarget::Control), Err(v.clone()));
    assert_closed_by(&mut c, v);

    let mut c = conn();
    let v = ProtocolViolation::RecvSlotNotHeld { slot: 1 };
    assert_eq!(c.release_recv(1), Err(v.clone()));
    assert_closed_by(&mut c, v);
}

#[test]
fn violation_drops_queued_sends() {
    let mut c = conn();
    // 3 data credits; the fourth frame queues.
    for id in 1..=4 {
        let r = c.reserve_send(64).unwrap();
        c.commit_send(r, &Header::new(FrameKind::Request, id))
            .unwrap();
    }
    let posted = std::iter::from_fn(|| c.poll_action()).count();
    assert_eq!(posted, 3);
    let v = ProtocolViolation::EmptyCreditOnly;
    assert_eq!(
        c.on_recv_complete(0, 32, &frame(&Header::new(FrameKind::CreditOnly, 0))),
        Err(v)
    );
    let dropped: Vec<_> = std::iter::from_fn(|| c.poll_action()).collect();
    assert_eq!(
        dropped,
        [Action::SendDropped {
            slot: 3,
            kind: FrameKind::Request,
            call_id: 4
        }]
    );
}

proptest! {
    /// Whatever lands in a slot, and whatever the completion claims, the connection either
    /// accepts a valid frame or reports a violation; it never panics or corrupts itself.
    #[test]
    fn arbitrary_completions_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2 * SLOT),
        header_seed in proptest::option::of((0u8..8, any::<u32>(), any::<u32>(), 0u32..4)),
        byte_len in prop_oneof![0u32..600, any::<u32>()],
        slot in 0u32..6,
    ) {
        let mut bytes = bytes;
        if let Some((kind, payload_len, credits, metadata_len)) = header_seed {
            // Mostly-valid headers reach the deeper checks.
            if bytes.len() >= 64 {
                let mut h = request(payload_len % 300, credits % 6);
                h.metadata_len = metadata_len;
                h.encode(&mut bytes);
                bytes[3] = kind;
            }
        }
        let mut c = conn();
        match c.on_recv_complete(slot, byte_len, &bytes) {
            Ok(_) => prop_assert!(!c.is_closed()),
            Err(v) => prop_assert_eq!(c.close_reason(), Some(&CloseReason::Violation(v))),
        }
        c.assert_invariants();
    }
}

/// Feeds `h` into receive slot `slot` as a header-only frame and returns the outcome.
fn feed(c: &mut Connection, slot: u32, h: &Header) -> Result<(), ProtocolViolation> {
    c.on_recv_complete(slot, 64, &frame(h)).map(|_| ())
}

/// Feeds `h` and checks that it is the violation `expected`, which closed the connection.
fn expect_feed_violation(c: &mut Connection, slot: u32, h: &Header, expected: ProtocolViolation) {
    assert_eq!(feed(c, slot, h), Err(expected.clone()));
    assert_closed_by(c, expected);
}

fn ask(call_id: u64, len: u64) -> Header {
    let mut h = Header::new(FrameKind::LargeRequest, call_id);
    h.remote.len = len;
    h
}

fn placed(call_id: u64, payload_len: u32) -> Header {
    let mut h = Header::new(FrameKind::Request, call_id);
    h.flags = rpc_wire::Flags::LARGE_PAYLOAD;
    h.payload_len = payload_len;
    h
}

fn grant_of(call_id: u64, len: u64) -> Header {
    let mut h = Header::new(FrameKind::LargeGrant, call_id);
    h.remote = rpc_wire::RemoteBuffer {
        addr: 0x10_0000,
        rkey: 0x1234,
        generation: 1,
        len,
    };
    h
}

#[test]
fn a_body_placed_without_a_grant_is_a_violation() {
    let mut c = conn();
    let expected = ProtocolViolation::PlacedWithoutGrant { body: unary(9) };
    expect_feed_violation(&mut c, 0, &placed(9, 1000), expected);
}

#[test]
fn a_body_larger_than_its_grant_is_a_violation() {
    let mut c = conn();
    feed(&mut c, 0, &ask(3, 1000)).expect("buffer request");
    assert_eq!(
        c.poll_action(),
        Some(Action::GrantNeeded {
            body: unary(3),
            len: 1000
        })
    );
    c.grant(unary(3), 0x10_0000, 0x77, 1000).expect("granted");
    while c.poll_action().is_some() {}
    let expected = ProtocolViolation::PlacedBeyondGrant {
        body: unary(3),
        len: 1001,
        granted: 1000,
    };
    expect_feed_violation(&mut c, 1, &placed(3, 1001), expected);
}

#[test]
fn a_second_buffer_request_for_a_call_is_a_violation() {
    let mut c = conn();
    feed(&mut c, 0, &ask(5, 1000)).expect("buffer request");
    let expected = ProtocolViolation::DuplicateBufferRequest { body: unary(5) };
    expect_feed_violation(&mut c, 1, &ask(5, 1000), expected);
}

#[test]
fn each_message_of_a_stream_has_its_own_buffer_request_and_grant() {
    let mut c = conn();
    let message = |seq| BodyId { call_id: 7, seq };
    let mut first = ask(7, 1000);
    first.method_id = 1;
    let mut second = ask(7, 2000);
    second.method_id = 2;
    feed(&mut c, 0, &first).expect("buffer request for message 1");
    feed(&mut c, 1, &second).expect("message 2 asks separately");
    let asked: Vec<Action> = std::iter::from_fn(|| c.poll_action())
        .filter(|a| matches!(a, Action::GrantNeeded { .. }))
        .collect();
    assert_eq!(
        asked,
        [
            Action::GrantNeeded {
                body: message(1),
                len: 1000
            },
            Action::GrantNeeded {
                body: message(2),
                len: 2000
            },
        ]
    );
    c.grant(message(1), 0x10_0000, 0x77, 1000).expect("granted");
    while c.poll_action().is_some() {}
    // Message 2 claims the buffer granted to message 1.
    let mut wrong = placed(7, 900);
    wrong.kind = FrameKind::Message;
    wrong.method_id = 2;
    let expected = ProtocolViolation::PlacedWithoutGrant { body: message(2) };
    expect_feed_violation(&mut c, 2, &wrong, expected);

    let mut c = conn();
    feed(&mut c, 0, &second).expect("buffer request");
    let expected = ProtocolViolation::DuplicateBufferRequest { body: message(2) };
    expect_feed_violation(&mut c, 1, &second, expected);
}

#[test]
fn a_second_response_buffer_for_a_call_is_a_violation() {
    let mut c = conn();
    let mut offer = Header::new(FrameKind::Request, 6);
    offer.flags = rpc_wire::Flags::RESPONSE_BUFFER;
    offer.remote = grant_of(6, 1 << 20).remote;
    feed(&mut c, 0, &offer).expect("a request with a response buffer");
    let expected = ProtocolViolation::DuplicateResponseBuffer { call_id: 6 };
    expect_feed_violation(&mut c, 1, &offer, expected);
}

#[test]
fn a_response_placed_beyond_the_advertised_buffer_is_a_violation() {
    let mut c = conn();
    let buffer = c.advertise(8, 0x20_0000, 0x99, 1000).expect("advertised");
    assert_eq!(buffer.len, 1000);
    let mut response = placed(8, 1001);
    response.kind = FrameKind::Response;
    let expected = ProtocolViolation::PlacedBeyondGrant {
        body: unary(8),
        len: 1001,
        granted: 1000,
    };
    expect_feed_violation(&mut c, 0, &response, expected);
}

/// An offer is no larger than a body this side takes: a peer may write what it is offered.
#[test]
fn a_response_buffer_is_offered_up_to_the_largest_body_taken() {
    let mut c = conn();
    let max = crate::LargeConfig::default().max_message;
    let buffer = c
        .advertise(8, 0x20_0000, 0x99, max + 4096)
        .expect("advertised");
    assert_eq!(buffer.len, max);
    let mut response = placed(8, u32::try_from(max + 1).expect("fits"));
    response.kind = FrameKind::Response;
    let expected = ProtocolViolation::PlacedBeyondGrant {
        body: unary(8),
        len: max + 1,
        granted: max,
    };
    expect_feed_violation(&mut c, 0, &response, expected);
}

#[test]
fn grants_nobody_asked_for_or_too_small_are_violations() {
    let mut c = conn();
    let expected = ProtocolViolation::UnexpectedGrant { body: unary(4) };
    expect_feed_violation(&mut c, 0, &grant_of(4, 1000), expected);

    let mut c = conn();
    let mut notice = Header::new(FrameKind::Request, 4);
    notice.payload_len = 5000;
    c.start_large(
        &notice,
        crate::LocalBuffer {
            addr: 0x1000,
            lkey: 1,
        },
    )
    .expect("start");
    let expected = ProtocolViolation::GrantTooSmall {
        body: unary(4),
        granted: 100,
        needed: 5000,
    };
    expect_feed_violation(&mut c, 0, &grant_of(4, 100), expected);
}

#[test]
fn callers_cannot_send_protocol_owned_frames() {
    let mut c = conn();
    for h in [ask(1, 10), grant_of(1, 10), placed(1, 10)] {
        let r = c.reserve_send(64).expect("slot");
        assert_eq!(c.commit_send(r, &h), Err(SendError::ReservedKind(h.kind)));
    }
}

/// A grant or an advertised buffer whose range wraps past `u64::MAX`: the offset of a later
/// chunk would overflow (a panic in a debug build) if the range were not checked on receipt.
#[test]
fn buffers_that_wrap_the_address_space_are_violations() {
    let mut c = conn();
    let mut notice = Header::new(FrameKind::Request, 4);
    notice.payload_len = 5000;
    let local = crate::LocalBuffer {
        addr: 0x1000,
        lkey: 1,
    };
    c.start_large(&notice, local).expect("start");
    let mut grant = grant_of(4, 5000);
    grant.remote.addr = u64::MAX - 100;
    let expected = ProtocolViolation::BufferOutOfRange {
        call_id: 4,
        addr: u64::MAX - 100,
        len: 5000,
    };
    expect_feed_violation(&mut c, 0, &grant, expected);

    let mut c = conn();
    let mut offer = Header::new(FrameKind::Request, 6);
    offer.flags = rpc_wire::Flags::RESPONSE_BUFFER;
    offer.remote = grant_of(6, 1 << 20).remote;
    offer.remote.addr = u64::MAX - (1 << 19);
    let expected = ProtocolViolation::BufferOutOfRange {
        call_id: 6,
        addr: u64::MAX - (1 << 19),
        len: 1 << 20,
    };
    expect_feed_violation(&mut c, 0, &offer, expected);
}
