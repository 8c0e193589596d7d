//! A shared receive queue under many connections: one server whose connections all take
//! their receives from one SRQ, each facing its own client, over the in-memory fabric.
//!
//! Checked on every step, beyond what each pair checks: no RNR over the whole queue (posted
//! buffers ≥ every credit and frame any client may still use), and the pool's books
//! (posted + landed-unpolled = spare + committed). Checked at the end: every connection
//! drains, whatever the pool granted, refused or took back. Hostile clients overrun their
//! windows; the slack keeps the honest ones whole.

use proptest::prelude::*;
use rpc_wire::{FrameKind, Header};

use super::fabric::{Pair, SharedRq, Side, Srq};
use super::random::{apply, config, op, Op};
use crate::{Admission, CloseReason, Config, PoolConfig, ProtocolViolation};

/// One server process: connections sharing one receive queue.
struct Server {
    srq: SharedRq,
    pairs: Vec<Pair>,
    refused: u32,
}

impl Server {
    fn new(pool: PoolConfig) -> Server {
        Server {
            srq: Srq::new(pool),
            pairs: Vec::new(),
            refused: 0,
        }
    }

    /// A client connects; the server admits its window from the pool, or refuses.
    fn connect(&mut self, client: Config, server: Config) -> bool {
        let server = Config {
            shared_recv: true,
            recv_slot_size: self.srq.borrow().pool.config().buffer_size,
            ..server
        };
        match self.srq.borrow_mut().admit(server.window()) {
            Admission::Admitted => {}
            Admission::Refused { window, .. } => {
                assert_eq!(window, server.window());
                self.refused += 1;
                return false;
            }
            Admission::NeedBuffers(_) => unreachable!("admit registers"),
        }
        let pair = Pair::with_srq(client, server, self.srq.clone());
        self.pairs.push(pair);
        true
    }

    /// The server's QP of connection `i` is gone: held frames are released, the posted
    /// slots' commitments go back to the pool.
    fn destroy(&mut self, i: usize) {
        let mut pair = self.pairs.remove(i);
        pair.b.conn.close();
        while pair.b.release(0) {}
        let posted = pair.b.conn.recv_posted();
        self.srq.borrow_mut().pool.give_back(posted);
    }

    fn check(&self) {
        let srq = self.srq.borrow();
        let mut claimed = 0;
        let mut landed = 0;
        let mut committed = 0;
        for p in &self.pairs {
            p.check();
            landed += p.b.landed() as u64;
            committed += u64::from(p.b.conn.recv_posted());
            if !p.b.conn.is_closed() && !p.raw {
                claimed += Pair::claimed(&p.a, &p.b);
            }
        }
        let posted = srq.posted() as u64;
        assert!(
            posted >= claimed,
            "RNR possible on the SRQ: {posted} buffers posted, {claimed} claimed"
        );
        assert_eq!(
            posted + landed,
            u64::from(srq.pool.spare()) + committed,
            "pool books: posted + landed != spare + committed"
        );
        assert!(srq.pool.spare() <= srq.pool.buffers());
        assert!(
            srq.pool.buffers() == 0 || srq.pool.spare() >= srq.pool.config().slack,
            "the slack was committed"
        );
    }

    /// Rounds over every pair until nothing happens; then every pair must be drained.
    fn run_to_idle(&mut self) {
        for round in 0.. {
            assert!(round < 100_000, "no quiescence: livelock");
            let mut progress = false;
            for i in 0..self.pairs.len() {
                progress |= self.pairs[i].round(u32::MAX);
                self.check();
            }
            if !progress {
                break;
            }
        }
        for p in &self.pairs {
            p.assert_drained();
        }
    }
}

/// A small pool: two chunks of 8 buffers at most, a slack of 2, so windows compete.
fn pool() -> PoolConfig {
    PoolConfig {
        buffer_size: 160,
        chunk: 8,
        max_buffers: 24,
        slack: 2,
    }
}

#[derive(Debug, Clone)]
enum Step {
    Connect(Config, Config),
    On(u8, Op),
}

/// Small pools of every shape: chunks of 6 to 12, any slack a chunk allows, one to three
/// chunks in all.
fn pools() -> impl Strategy<Value = PoolConfig> {
    (6u32..12, 1u32..4).prop_flat_map(|(chunk, chunks)| {
        (0..=chunk - 3).prop_map(move |slack| PoolConfig {
            buffer_size: 160,
            chunk,
            max_buffers: chunk * chunks,
            slack,
        })
    })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (config(), config()).prop_map(|(c, s)| Step::Connect(c, s)),
        30 => (any::<u8>(), op()).prop_map(|(i, op)| Step::On(i, op)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn connections_sharing_a_receive_queue_never_rnr_and_all_drain(
        pool in pools(),
        steps in proptest::collection::vec(step(), 1..400),
        hoarders in any::<u8>(),
        tail in 0u64..30,
    ) {
        let mut s = Server::new(pool);
        for step in steps {
            match step {
                Step::Connect(c, srv) => {
                    if s.connect(c, srv) {
                        let i = s.pairs.len() - 1;
                        s.pairs[i].b.hoard = hoarders & (1 << (i % 8)) != 0;
                    }
                }
                Step::On(_, _) if s.pairs.is_empty() => {}
                Step::On(i, op) => {
                    let i = usize::from(i) % s.pairs.len();
                    apply(&mut s.pairs[i], op);
                }
            }
            s.check();
        }
        for p in &mut s.pairs {
            for side in [Side::A, Side::B] {
                while p.side(side).commit(false) {}
            }
            p.a.quota = tail;
            p.b.quota = tail;
            // Hoarders keep what was lent until now and let go at the end.
            p.b.hoard = false;
        }
        s.run_to_idle();
    }
}

/// A frame `call_id` landing at the server of `pair` without the client's state machine:
/// what a hostile client's raw SEND does.
fn inject(pair: &mut Pair, call_id: u64) {
    let mut frame = vec![0u8; 64];
    let len = Header::new(FrameKind::Request, call_id).encode(&mut frame);
    frame.truncate(len);
    pair.b.land_raw(&frame);
}

#[test]
fn a_client_overrunning_its_window_is_closed_and_the_slack_keeps_others_whole() {
    let mut s = Server::new(pool());
    let window = Config {
        recv_window: Some(4),
        ..Config {
            recv_slots: 8,
            send_slots: 8,
            ..Config::default()
        }
    };
    let client = Config {
        send_slot_size: 160,
        ..window
    };
    assert!(s.connect(client, window));
    assert!(s.connect(client, window));
    s.pairs[1].raw = true;
    // The honest client (0) keeps its whole window in flight; the server holds it all.
    s.pairs[0].b.hoard = true;
    s.pairs[0].a.quota = 3;
    s.pairs[0].round(0);
    // The hostile client (1) spends its four credits, then sends two more frames: as many
    // as the slack, before the server polls any of them.
    for call in 1..=6 {
        inject(&mut s.pairs[1], call);
    }
    s.check();
    for _ in 0..4 {
        assert!(s.pairs[1].b.poll_recv_raw().is_ok());
    }
    assert_eq!(
        s.pairs[1].b.poll_recv_raw(),
        Err(ProtocolViolation::RecvWithoutCredit)
    );
    assert_eq!(
        s.pairs[1].b.conn.close_reason(),
        Some(&CloseReason::Violation(
            ProtocolViolation::RecvWithoutCredit
        ))
    );
    assert_eq!(
        s.pairs[1].b.poll_recv_raw(),
        Ok(false),
        "late frames are dropped"
    );
    s.destroy(1);
    s.check();
    // The honest connection never noticed: it drains, with its window grown if it asked.
    s.pairs[0].b.hoard = false;
    s.pairs[0].a.quota = 20;
    s.pairs[0].b.quota = 20;
    s.run_to_idle();
    assert_eq!(s.pairs[0].b.delivered.len(), 23);
    let srq = s.srq.borrow();
    assert_eq!(
        srq.pool.spare() + s.pairs[0].b.conn.stats().recv_window,
        srq.pool.buffers(),
        "only the honest window is committed"
    );
}

#[test]
fn a_full_pool_refuses_connections_and_shrinks_grown_windows_back() {
    let mut s = Server::new(pool());
    let server = Config {
        recv_window: Some(4),
        recv_slots: 16,
        send_slots: 8,
        ..Config::default()
    };
    let client = Config {
        send_slot_size: 160,
        send_slots: 16,
        ..server
    };
    let windows =
        |s: &Server| -> u32 { s.pairs.iter().map(|p| p.b.conn.stats().recv_window).sum() };
    let busy = |s: &mut Server| {
        for p in &mut s.pairs {
            p.a.quota = 60;
        }
        s.run_to_idle();
    };
    // Two busy clients: their windows grow, and the pool registers buffers up to its bound.
    assert!(s.connect(client, server));
    assert!(s.connect(client, server));
    busy(&mut s);
    let grown = windows(&s);
    assert!(grown > 8, "windows did not grow: {grown}");
    assert_eq!(s.srq.borrow().pool.buffers(), 24);
    // More clients until the pool refuses one, by name.
    while s.connect(client, server) {}
    assert_eq!(s.refused, 1);
    assert!(s.srq.borrow().pool.shrinking());
    // Under pressure, released slots above the initial windows leave them ...
    busy(&mut s);
    assert!(windows(&s) < grown + 4 * (s.pairs.len() as u32 - 2));
    assert!(!s.srq.borrow().pool.shrinking());
    // ... so that the next client gets in.
    assert!(s.connect(client, server));
    busy(&mut s);
    assert!(windows(&s) + 2 <= 24, "windows beyond the pool");
}
