//! Random interleavings of large requests and responses: requests offered for reading or
//! written by the rendezvous, read before or after their notice, some advertising a buffer
//! for their response; responses of any size into that buffer or by the rendezvous;
//! cancelled at any moment, refused for the receiver's budget or a full queue, over few
//! grants and tiny rings; with small frames and every driver and upper-layer step of
//! [`super::random`] between them.
//!
//! Checked at the end, once both sides are idle and every request handed up has its
//! answer: every large request and response ended exactly once (handed up whole, or failed
//! at its writer) unless its call was cancelled, in which case at most once; no READ or
//! WRITE found its window gone; nothing is left under way in either role (grants, offers,
//! advertised buffers, windows, queued requests, refused offers).

use proptest::prelude::*;
use rpc_wire::Code;

use super::fabric::{LargeSide, Pair, Side};
use super::large::{large, CHUNK};
use super::random::{apply, config, op, Op};
use crate::Config;

#[derive(Debug, Clone)]
enum LargeOp {
    /// The client starts a large request of this many bytes.
    Send(u32),
    /// The same, advertising a buffer of this many bytes for its response.
    SendAdvertising(u32, u32),
    /// The server answers one of the large requests it was handed (by index) with a large
    /// response of this many bytes: into the advertised buffer, or by the rendezvous.
    Respond(u8, u32),
    /// The client cancels one of its large requests (by index, in any state; later than the
    /// last it cancelled, as frames of one kind go in call order).
    Cancel(u8),
    /// Anything else either side may do.
    Other(Op),
}

fn large_op() -> impl Strategy<Value = LargeOp> {
    prop_oneof![
        2 => (300u32..3 * CHUNK).prop_map(LargeOp::Send),
        1 => (300u32..3 * CHUNK, 300u32..3 * CHUNK)
            .prop_map(|(len, buffer)| LargeOp::SendAdvertising(len, buffer)),
        1 => (any::<u8>(), 300u32..3 * CHUNK).prop_map(|(i, len)| LargeOp::Respond(i, len)),
        1 => any::<u8>().prop_map(LargeOp::Cancel),
        12 => op().prop_map(LargeOp::Other),
    ]
}

/// One random run: the receiver's large-body limits, how requests go, both geometries,
/// and the steps.
#[derive(Debug, Clone)]
struct Case {
    max_grants: u32,
    max_queued: u32,
    offer: bool,
    after_notice: bool,
    budget: Option<u64>,
    writer: Config,
    reader: Config,
    ops: Vec<LargeOp>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1u32..4, 0u32..4, any::<bool>(), any::<bool>()),
        proptest::option::of(1000u64..(4 * u64::from(CHUNK))),
        // Small rings, few credits: an offer may go while its notice waits for room.
        config(),
        config(),
        proptest::collection::vec(large_op(), 1..300),
    )
        .prop_map(
            |((max_grants, max_queued, offer, after_notice), budget, writer, reader, ops)| Case {
                max_grants,
                max_queued,
                offer,
                after_notice,
                budget,
                writer,
                reader,
                ops,
            },
        )
}

fn run(case: Case) -> Result<(), TestCaseError> {
    let mut receiver = large(case.max_grants, 1 << 20);
    receiver.max_queued = case.max_queued;
    let writer = Config {
        large: large(case.max_grants, 1 << 20),
        ..case.writer
    };
    let reader = Config {
        large: receiver,
        ..case.reader
    };
    let mut p = Pair::new(writer, reader);
    p.a.large.offer_requests = case.offer;
    p.b.large.budget = case.budget;
    if case.after_notice {
        p.b.conn.read_after_notice();
    }
    let mut calls: Vec<(u64, u64)> = Vec::new();
    let mut cancelled = std::collections::BTreeSet::new();
    let mut responses: Vec<(u64, u64)> = Vec::new();
    for op in case.ops {
        match op {
            LargeOp::Send(len) => {
                if let Ok(call) = p.a.send_large(u64::from(len)) {
                    calls.push((call, u64::from(len)));
                }
            }
            LargeOp::Cancel(i) if !calls.is_empty() => {
                // In call order, as the fabric expects frames of one kind.
                let (call, _) = calls[usize::from(i) % calls.len()];
                let later = cancelled.last().is_none_or(|&last| call > last);
                if later && p.a.cancel(call).is_ok() {
                    cancelled.insert(call);
                }
            }
            LargeOp::Cancel(_) => {}
            LargeOp::SendAdvertising(len, buffer) => {
                let started =
                    p.a.try_send_large_advertising(u64::from(len), u64::from(buffer));
                calls.extend(started.map(|call| (call, u64::from(len))));
            }
            LargeOp::Respond(i, len) => {
                let unanswered = unanswered(&p, &responses);
                if !unanswered.is_empty() {
                    let call = unanswered[usize::from(i) % unanswered.len()];
                    if p.b.respond_large(call, u64::from(len)).is_ok() {
                        responses.push((call, u64::from(len)));
                    }
                }
            }
            LargeOp::Other(op) => apply(&mut p, op),
        }
        p.check();
    }
    for side in [Side::A, Side::B] {
        while p.side(side).commit(false) {}
    }
    p.a.quota = 0;
    p.b.quota = 0;
    p.run_to_idle(u32::MAX);
    // Every request handed up gets its answer, so no response buffer stays advertised.
    loop {
        let unanswered = unanswered(&p, &responses);
        if unanswered.is_empty() {
            break;
        }
        for call in unanswered {
            p.b.respond_large(call, 300).expect("an answer starts");
            responses.push((call, 300));
        }
        p.run_to_idle(u32::MAX);
    }
    for &(call, len) in &calls {
        let cancelled = cancelled.contains(&call);
        ended_once("request", call, len, cancelled, &p.b.large, &p.a.large)?;
    }
    for &(call, len) in &responses {
        let cancelled = cancelled.contains(&call);
        ended_once("response", call, len, cancelled, &p.a.large, &p.b.large)?;
    }
    prop_assert_eq!(p.a.large.access_errors + p.b.large.access_errors, 0);
    prop_assert!(
        p.a.conn.large_idle(),
        "the writer has work left: {:?}",
        p.a.conn.stats()
    );
    prop_assert!(
        p.b.conn.large_idle(),
        "the receiver has work left: {:?}",
        p.b.conn.stats()
    );
    Ok(())
}

/// The `what` of `call`, `len` bytes, was handed up whole at its `receiver` or failed at
/// its `writer`, once; at most once if its call was `cancelled`.
fn ended_once(
    what: &str,
    call: u64,
    len: u64,
    cancelled: bool,
    receiver: &LargeSide,
    writer: &LargeSide,
) -> Result<(), TestCaseError> {
    let delivered: Vec<u64> = receiver
        .delivered
        .iter()
        .filter(|(c, _)| *c == call)
        .map(|&(_, l)| l)
        .collect();
    let failed: Vec<Code> = writer
        .failed
        .iter()
        .filter(|(c, _)| *c == call)
        .map(|&(_, code)| code)
        .collect();
    prop_assert!(
        delivered.iter().all(|&l| l == len),
        "{} {} handed up {:?}",
        what,
        call,
        delivered
    );
    let ends = delivered.len() + failed.len();
    if cancelled {
        prop_assert!(
            ends <= 1,
            "{} of cancelled call {} ended {} times",
            what,
            call,
            ends
        );
    } else {
        prop_assert_eq!(
            ends,
            1,
            "{} of call {}: handed up {:?}, failed {:?}",
            what,
            call,
            delivered,
            failed
        );
    }
    Ok(())
}

/// The requests the server was handed and has not answered.
fn unanswered(p: &Pair, responses: &[(u64, u64)]) -> Vec<u64> {
    p.b.large
        .delivered
        .iter()
        .map(|&(call, _)| call)
        .filter(|call| !responses.iter().any(|(c, _)| c == call))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_large_request_ends_once_and_nothing_stays_lent(case in case()) {
        run(case)?;
    }
}

/// Tiny rings (one send in flight) for the cases found by the random runs.
fn tiny(recv_slots: u32, signal: u32) -> Config {
    Config {
        send_slots: 3,
        send_window: Some(1),
        send_slot_size: 64,
        recv_slots,
        recv_slot_size: 64,
        recv_window: Some(3),
        signal_interval: Some(signal),
        max_queued: Some(1),
        ..Config::default()
    }
}

/// Found by the random runs: a refusal queued while the ring held as many unposted frames
/// as it may stayed queued when the credits that posted them came, with a slot free, until
/// an event that never came (the call hung).
#[test]
fn refusals_of_requests_behind_a_cancelled_one_all_come_back() {
    use Op::{Exec, PollRecv, Send, Transmit};
    let mut ops = vec![
        LargeOp::Send(300),
        LargeOp::Other(Exec(Side::A, 1)),
        LargeOp::Other(Transmit(Side::A, 1)),
        LargeOp::Other(Send(Side::B, 0)),
        LargeOp::Cancel(0),
        LargeOp::Other(PollRecv(Side::B)),
    ];
    ops.extend(std::iter::repeat_n(LargeOp::Send(300), 8));
    run(Case {
        max_grants: 1,
        max_queued: 0,
        offer: false,
        after_notice: false,
        budget: None,
        writer: tiny(3, 2),
        reader: tiny(4, 3),
        ops,
    })
    .unwrap();
}
