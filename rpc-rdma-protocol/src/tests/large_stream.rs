//! Large stream messages over the in-memory fabric: each message of a stream has its own
//! rendezvous (named by call and sequence number), so a stream pipelines its transfers, and
//! one `Cancel` ends all of them at both ends.

use rpc_wire::Code;

use super::fabric::Pair;
use super::large::{cfg, large, pair, run_until, settle, CHUNK};
use crate::{BodyId, SendError};

#[test]
fn the_messages_of_one_stream_pipeline_their_transfers() {
    let mut p = pair();
    let call = 5;
    let sizes = [
        3 * u64::from(CHUNK),
        300,
        u64::from(CHUNK) + 1,
        2 * u64::from(CHUNK),
    ];
    for (seq, &len) in (1..).zip(&sizes) {
        p.a.send_large_message(call, seq, len).expect("start");
    }
    assert_eq!(
        p.a.conn.stats().large_transfers,
        4,
        "all four under way at once"
    );
    // All four buffer requests are out before the first body lands.
    run_until(&mut p, |p| p.b.conn.stats().large_grants == 4);
    assert!(p.b.large.messages.is_empty());
    settle(&mut p);
    let mut got = p.b.large.messages.clone();
    got.sort_unstable();
    let expected: Vec<(u64, u32, u64)> = (1..).zip(sizes).map(|(s, l)| (call, s, l)).collect();
    assert_eq!(got, expected);
    assert_eq!(p.a.large.done, 4);
}

#[test]
fn a_message_cannot_start_twice() {
    let mut p = pair();
    p.a.send_large_message(5, 1, 5000).expect("start");
    let again = p.a.send_large_message(5, 1, 5000);
    assert_eq!(
        again,
        Err(SendError::DuplicateTransfer {
            body: BodyId { call_id: 5, seq: 1 }
        })
    );
    settle(&mut p);
    assert_eq!(p.b.large.messages, [(5, 1, 5000)]);
}

#[test]
fn a_cancel_ends_every_transfer_and_grant_of_its_stream() {
    // Grant limit 2 at the receiver: of six messages, two are granted (or being written),
    // four wait for a grant when the Cancel comes.
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(2, 1 << 20)));
    let call = 9;
    for seq in 1..=6 {
        p.a.send_large_message(call, seq, 8 * u64::from(CHUNK))
            .expect("start");
    }
    let other = p.a.send_large(2 * u64::from(CHUNK)).expect("another call");
    run_until(&mut p, |p| p.a.wire_shape().contains('W'));
    p.a.cancel(call).expect("cancel");
    settle(&mut p);
    assert!(
        p.b.large.messages.is_empty(),
        "no message of the cancelled stream lands"
    );
    assert_eq!(
        p.b.large.delivered,
        [(other, 2 * u64::from(CHUNK))],
        "the other call is not disturbed"
    );
    assert!(
        p.a.large.failed.is_empty(),
        "a cancelled stream is not failed again"
    );
    assert_eq!(p.a.large.done, 7, "every source buffer came back");
}

#[test]
fn a_refused_message_fails_only_its_own_transfer() {
    let mut p = Pair::new(cfg(large(16, 1 << 20)), cfg(large(16, 4000)));
    p.a.send_large_message(4, 1, 3000).expect("start");
    p.a.send_large_message(4, 2, 5000).expect("start");
    p.a.send_large_message(4, 3, 3500).expect("start");
    settle(&mut p);
    assert_eq!(p.a.large.failed, [(4, Code::ResourceExhausted)]);
    let mut got = p.b.large.messages.clone();
    got.sort_unstable();
    assert_eq!(got, [(4, 1, 3000), (4, 3, 3500)]);
}
