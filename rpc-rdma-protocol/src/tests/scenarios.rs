//! Scripted scenarios over the in-memory fabric.

use rpc_wire::{FrameKind, Header, HEADER_LEN};

use super::fabric::{Pair, Side};
use crate::{CloseReason, Config, SendError, WorkId};

fn cfg(send_slots: u32, recv_slots: u32, slot_size: u32) -> Config {
    Config {
        send_slots,
        send_slot_size: slot_size,
        recv_slots,
        recv_slot_size: slot_size,
        ..Config::default()
    }
}

/// Executes, transmits and polls everything on both sides, without releasing held frames.
fn pump(p: &mut Pair) {
    loop {
        let mut progress = false;
        for side in [Side::A, Side::B] {
            while p.side(side).exec() {
                progress = true;
                p.check();
            }
        }
        p.check();
        while p.transmit(Side::A) | p.transmit(Side::B) {
            progress = true;
        }
        for side in [Side::A, Side::B] {
            let ep = p.side(side);
            while ep.poll_send() | ep.poll_recv() {
                progress = true;
            }
        }
        p.check();
        if !progress {
            return;
        }
    }
}

#[test]
fn request_and_response_round_trip() {
    let mut p = Pair::symmetric(cfg(8, 8, 256));
    p.a.send(10).unwrap();
    pump(&mut p);
    assert_eq!(p.b.delivered, [1]);
    p.b.send(20).unwrap();
    pump(&mut p);
    assert_eq!(p.a.delivered, [1]);
    p.run_to_idle(0);
}

#[test]
fn frames_at_the_slot_boundary() {
    // a may send at most min(own 512, b's receive 200) = 200 bytes per frame.
    let mut p = Pair::new(
        Config {
            send_slot_size: 512,
            ..cfg(8, 8, 256)
        },
        Config {
            recv_slot_size: 200,
            ..cfg(8, 8, 512)
        },
    );
    assert_eq!(p.a.geom.max_send_frame, 200);
    assert_eq!(p.b.geom.max_send_frame, 256);
    assert_eq!(
        p.a.conn.reserve_send(201).unwrap_err(),
        SendError::TooLarge { len: 201, max: 200 }
    );
    assert_eq!(
        p.a.conn.reserve_send(31).unwrap_err(),
        SendError::TooShort { len: 31 }
    );
    p.a.send(200 - HEADER_LEN as u32).unwrap();
    p.a.send(199 - HEADER_LEN as u32).unwrap();
    p.a.send(0).unwrap();
    p.b.send(256 - HEADER_LEN as u32).unwrap();
    assert!(matches!(
        p.b.conn.reserve_send(257),
        Err(SendError::TooLarge { .. })
    ));

    // A header declaring more than the reservation holds is refused and the slot returned.
    let free = p.a.conn.stats().send_free;
    let r = p.a.conn.reserve_send(64).unwrap();
    let mut h = Header::new(FrameKind::Request, 99);
    h.payload_len = 137;
    h.timeout_us = 1; // the full header form: 64 + 137 bytes
    assert_eq!(
        p.a.conn.commit_send(r, &h),
        Err(SendError::TooLarge { len: 201, max: 200 })
    );
    assert_eq!(p.a.conn.stats().send_free, free);
    p.run_to_idle(0);
    assert_eq!(p.b.delivered, [1, 2, 3]);
}

#[test]
fn caller_headers_are_validated_before_they_reach_the_wire() {
    let mut p = Pair::symmetric(cfg(8, 8, 256));
    let r = p.a.conn.reserve_send(64).unwrap();
    let credit_only = Header::new(FrameKind::CreditOnly, 0);
    assert_eq!(
        p.a.conn.commit_send(r, &credit_only),
        Err(SendError::ReservedKind(FrameKind::CreditOnly))
    );
    let r = p.a.conn.reserve_send(64).unwrap();
    let mut cancel = Header::new(FrameKind::Cancel, 1);
    cancel.payload_len = 3;
    assert!(matches!(
        p.a.conn.commit_send(r, &cancel),
        Err(SendError::InvalidHeader(_))
    ));
    assert_eq!(p.a.conn.stats().send_free, 8);
    p.run_to_idle(0);
}

#[test]
fn slow_receiver_back_pressures_the_sender_without_rnr() {
    // b posts 4 receive slots and does not release them.
    let mut p = Pair::new(cfg(8, 8, 256), cfg(8, 4, 256));
    let mut sent = 0;
    loop {
        match p.a.send(16) {
            Ok(()) => sent += 1,
            Err(SendError::WouldBlock) => break,
            Err(e) => panic!("{e}"),
        }
        pump(&mut p);
        assert!(sent < 100, "never back-pressured");
    }
    pump(&mut p);
    // Data may use every credit but the reserved one.
    assert_eq!(p.b.delivered, [1, 2, 3]);
    let stats = p.a.conn.stats();
    assert_eq!(stats.send_credits, 1);
    assert_eq!(stats.send_unposted as usize, sent - 3);
    assert!(p.a.blocked);
    assert_eq!(
        p.a.conn.reserve_send(64).unwrap_err(),
        SendError::WouldBlock,
        "still full"
    );
    assert_eq!(p.b.conn.stats().credit_only_sent, 0);

    // One release is below the threshold of 2: the credit waits.
    p.b.release(0);
    pump(&mut p);
    assert_eq!(p.b.conn.stats().pending_credit_return, 1);
    assert_eq!(p.b.delivered.len(), 3);
    // The second triggers a credit-only frame; two more frames flow.
    p.b.release(0);
    pump(&mut p);
    assert_eq!(p.b.conn.stats().credit_only_sent, 1);
    assert_eq!(p.b.delivered.len(), 5);
    assert!(
        !p.a.blocked && p.a.writable_events == 1,
        "Writable after capacity freed"
    );
    p.run_to_idle(0);
    assert_eq!(p.b.delivered.len(), sent);
}

#[test]
fn simultaneous_credit_exhaustion_recovers_through_the_reserved_credit() {
    let mut p = Pair::symmetric(cfg(8, 4, 256));
    for _ in 0..6 {
        p.a.send(8).unwrap();
        p.b.send(8).unwrap();
    }
    pump(&mut p);
    for ep in [&p.a, &p.b] {
        let s = ep.conn.stats();
        assert_eq!((s.send_credits, s.send_unposted), (1, 3), "{s:?}");
        assert_eq!(ep.held.len(), 3);
    }
    // Both upper layers release; neither has a data credit to piggyback on.
    while p.a.release(0) | p.b.release(0) {}
    for ep in [&mut p.a, &mut p.b] {
        let s = ep.conn.stats();
        assert_eq!(
            (s.credit_only_sent, s.send_credits),
            (1, 0),
            "reserve spent on credits: {s:?}"
        );
    }
    p.run_to_idle(0);
    assert_eq!(p.a.delivered.len(), 6);
    assert_eq!(p.b.delivered.len(), 6);
}

#[test]
fn both_sides_at_full_rate_always_progress() {
    let configs = [
        cfg(3, 3, 64),
        cfg(3, 3, 128),
        Config {
            signal_interval: Some(3),
            max_queued: Some(1),
            ..cfg(3, 3, 96)
        },
        Config {
            signal_interval: Some(1),
            credit_return_threshold: Some(4),
            ..cfg(4, 5, 256)
        },
        cfg(16, 64, 1024),
    ];
    for a in configs {
        for b in configs {
            let mut p = Pair::new(a, b);
            p.a.quota = 300;
            p.b.quota = 300;
            p.run_to_idle(u32::MAX);
            assert_eq!(p.a.delivered.len(), 300);
            assert_eq!(p.b.delivered.len(), 300);
        }
    }
}

#[test]
fn one_way_traffic_returns_credits_without_a_credit_storm() {
    let mut p = Pair::symmetric(cfg(8, 8, 256));
    p.a.quota = 1000;
    p.run_to_idle(32);
    let (a, b) = (p.a.conn.stats(), p.b.conn.stats());
    assert_eq!(p.b.delivered.len(), 1000);
    // b returns credits only in credit-only frames, at least 4 (threshold) at a time; a
    // piggybacks the slots those consumed on its requests instead of answering in kind.
    assert!(b.credit_only_sent <= 1000 / 4 + 1, "{b:?}");
    assert!(a.credit_only_sent <= 1, "credit-only ping-pong: {a:?}");
    // Idle really is idle.
    assert!(!p.round(0));
}

#[test]
fn sends_are_signaled_selectively() {
    let mut p = Pair::symmetric(Config {
        signal_interval: Some(4),
        ..cfg(16, 64, 256)
    });
    for _ in 0..64 {
        p.a.send(0).unwrap();
        pump(&mut p);
        while p.b.release(0) {}
    }
    p.run_to_idle(0);
    let s = p.a.conn.stats();
    assert_eq!(s.signaled_sends - s.credit_only_sent, 16, "{s:?}");
}

#[test]
fn reservations_post_in_reservation_order() {
    let mut p = Pair::symmetric(cfg(8, 8, 256));
    p.a.write(1).unwrap();
    p.a.write(2).unwrap();
    p.a.write(3).unwrap();
    assert!(p.a.commit(true)); // call 3 waits for 1 and 2
    pump(&mut p);
    assert!(p.b.delivered.is_empty());
    assert!(p.a.abort(true)); // call 2 becomes a hole
    assert!(p.a.commit(false)); // call 1 unblocks 3
    pump(&mut p);
    assert_eq!(p.b.delivered, [1, 3]);
    p.run_to_idle(0);
}

#[test]
fn completion_error_closes_and_fails_queued_sends() {
    let mut p = Pair::new(cfg(8, 8, 256), cfg(8, 4, 256));
    for _ in 0..6 {
        p.a.send(4).unwrap();
    }
    p.a.write(4).unwrap();
    pump(&mut p);
    assert_eq!(
        p.a.conn.stats().send_unposted,
        4,
        "3 queued + 1 uncommitted"
    );
    p.a.conn
        .on_completion_error(WorkId::Send(0), "remote access error");
    p.a.conn
        .on_completion_error(WorkId::Send(1), "work request flushed");
    p.a.absorb();
    while p.a.exec() {}
    assert_eq!(p.a.dropped, [4, 5, 6]);
    assert_eq!(
        p.a.conn.close_reason(),
        Some(&CloseReason::CompletionError {
            work: WorkId::Send(0),
            status: "remote access error".into()
        }),
        "the first error is the reason, not the flushes after it"
    );
    let w = p.a.written.pop_front().unwrap();
    assert_eq!(
        p.a.conn.commit_send(w.reservation, &w.header),
        Err(SendError::Closed)
    );
    assert_eq!(p.a.conn.reserve_send(64).unwrap_err(), SendError::Closed);
    // Late completions and releases after close are harmless no-ops.
    assert_eq!(p.a.conn.release_recv(0), Ok(()));
    assert_eq!(
        p.a.conn.on_send_complete(crate::SendTarget::Control),
        Ok(())
    );
    assert_eq!(p.a.conn.on_recv_complete(0, 0, &[]), Ok(None));
    assert_eq!(p.a.conn.poll_action(), None);
}

#[test]
fn close_turns_unexecuted_sends_into_drops() {
    let mut p = Pair::symmetric(cfg(8, 8, 256));
    // Committed and posted by the state machine, but the driver has not executed the
    // PostSend yet: it never reaches the wire, so its call is reported dropped.
    let r = p.a.conn.reserve_send(64).unwrap();
    p.a.conn
        .commit_send(r, &Header::new(FrameKind::Request, 42))
        .unwrap();
    p.a.conn.close();
    assert_eq!(
        p.a.conn.poll_action(),
        Some(crate::Action::SendDropped {
            slot: 0,
            kind: FrameKind::Request,
            call_id: 42
        })
    );
    assert_eq!(p.a.conn.poll_action(), None);
    assert_eq!(p.a.conn.close_reason(), Some(&CloseReason::Local));
}

#[test]
fn close_wakes_a_blocked_sender() {
    let mut p = Pair::new(cfg(4, 4, 256), cfg(4, 3, 256));
    while p.a.send(0).is_ok() {
        pump(&mut p);
    }
    assert!(p.a.blocked);
    p.a.conn.close();
    p.a.absorb();
    while p.a.exec() {}
    assert!(!p.a.blocked, "Writable after close");
    assert_eq!(p.a.conn.reserve_send(64).unwrap_err(), SendError::Closed);
}

#[test]
fn a_peer_that_uses_up_the_window_gets_it_doubled() {
    let a = Config {
        recv_window: Some(4),
        ..cfg(16, 16, 256)
    };
    let mut p = Pair::new(a, cfg(16, 16, 256));
    assert_eq!(p.b.conn.stats().send_credits, 4);
    for _ in 0..5 {
        p.b.send(8).unwrap();
    }
    pump(&mut p);
    // Three data credits: two frames left b with two usable credits, the third with one.
    assert_eq!(p.a.delivered, [1, 2, 3]);
    assert_eq!(p.a.conn.window_wanted(), 4);
    assert!(p.a.grow(u32::MAX));
    assert_eq!(p.a.conn.window_wanted(), 0);
    assert_eq!(p.a.conn.stats().recv_window, 8);
    pump(&mut p);
    // The new credits travel (credit-only frame: a has nothing to send) and the queue drains.
    assert_eq!(p.a.delivered, [1, 2, 3, 4, 5]);
    assert_eq!(p.b.conn.stats().send_unposted, 0);
    // Released slots keep their credits: the window stays grown, never beyond the ring.
    while p.a.release(0) {}
    for _ in 0..40 {
        p.b.send(8).unwrap_or(());
        pump(&mut p);
        while p.a.release(0) {}
        p.a.grow(u32::MAX);
    }
    assert!(p.a.conn.stats().recv_window <= 16);
    p.run_to_idle(0);
}
