//! An in-memory RC fabric for two [`Connection`]s, modelled on quinn-proto's test pair.
//!
//! What it models precisely, and checks on every step:
//! * Posted RECVs, in post order: an arriving SEND consumes the oldest posted RECV (as an RC
//!   receive queue does). Arriving with none posted is an RNR: the test fails.
//! * The wire: SENDs arrive in post order (RC is FIFO per direction). Their bytes are read
//!   from the sender's memory at arrival, like a late DMA, so reusing a slot too early
//!   corrupts the frame.
//! * The send queue: a WR's entry is free only once a signaled completion at or after it has
//!   been polled; posting or writing into a buffer whose WR is still there fails the test,
//!   and so does exceeding the negotiated SQ depth.
//! * Completion queues: send completions (signaled only) appear when the frame arrives;
//!   receive completions when it lands. Each CQ is FIFO, but the test decides when each
//!   side polls which CQ, so send vs. receive completions, and the two sides, interleave
//!   arbitrarily.
//! * The driver: actions are collected from the connection after every call and executed
//!   later, in order, whenever the test says so.
//! * The upper layer: holds delivered slots and releases them in any order; each side sends
//!   numbered messages whose payload is a pattern of the call id, verified on delivery and
//!   again on release.

use std::collections::VecDeque;

use rpc_core::{FrameKind, Header, HEADER_LEN};

use crate::protocol::{
    Action, Config, Connection, Geometry, Received, SendError, SendReservation, SendTarget,
    CREDITS_OFFSET,
};

/// A SEND on the wire.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    target: SendTarget,
    len: u32,
    signaled: bool,
    credits: u32,
}

/// A receive completion waiting to be polled.
#[derive(Debug, Clone, Copy)]
struct RecvCqe {
    slot: u32,
    len: u32,
    credits: u32,
}

/// A reservation the application has written but not committed.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) reservation: SendReservation,
    pub(crate) header: Header,
}

/// One side: a connection, its memory, its QP and CQs, its driver and its application.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) conn: Connection,
    pub(crate) geom: Geometry,
    send_mem: Vec<u8>,
    recv_mem: Vec<u8>,
    /// Actions taken from the connection, not yet executed.
    pending: VecDeque<Action>,
    rq: VecDeque<u32>,
    wire: VecDeque<InFlight>,
    sq: VecDeque<(SendTarget, bool)>,
    send_cq: VecDeque<SendTarget>,
    recv_cq: VecDeque<RecvCqe>,
    /// Frames the upper layer holds.
    pub(crate) held: Vec<Received>,
    /// Written, uncommitted reservations, oldest first.
    pub(crate) written: VecDeque<Written>,
    next_call: u64,
    /// Call ids committed, in reservation order once sorted.
    pub(crate) committed: Vec<u64>,
    /// Call ids received from the peer, in delivery order.
    pub(crate) delivered: Vec<u64>,
    /// A reservation hit WouldBlock and no Writable has been seen since.
    pub(crate) blocked: bool,
    pub(crate) writable_events: u64,
    pub(crate) dropped: Vec<u64>,
    /// Messages the application still wants to send (used by [`Pair::run_to_idle`]).
    pub(crate) quota: u64,
}

/// Payload byte `i` of call `call_id`.
fn pattern(call_id: u64, i: usize) -> u8 {
    (call_id as u8).wrapping_mul(31).wrapping_add(i as u8)
}

impl Endpoint {
    /// Posts the receive ring (as the driver does before connecting), then creates the
    /// connection from the negotiated geometry.
    fn new(config: &Config, geom: Geometry) -> Self {
        let mut ep = Endpoint {
            conn: Connection::new(geom),
            geom,
            send_mem: vec![0; geom.send_region_len()],
            recv_mem: vec![0; geom.recv_region_len()],
            pending: VecDeque::new(),
            rq: config.initial_recv_posts().collect(),
            wire: VecDeque::new(),
            sq: VecDeque::new(),
            send_cq: VecDeque::new(),
            recv_cq: VecDeque::new(),
            held: Vec::new(),
            written: VecDeque::new(),
            next_call: 1,
            committed: Vec::new(),
            delivered: Vec::new(),
            blocked: false,
            writable_events: 0,
            dropped: Vec::new(),
            quota: 0,
        };
        ep.absorb();
        ep
    }

    /// Moves the connection's actions into the driver's queue.
    pub(crate) fn absorb(&mut self) {
        while let Some(action) = self.conn.poll_action() {
            self.pending.push_back(action);
        }
    }

    /// Largest payload a single frame can carry.
    pub(crate) fn max_payload(&self) -> u32 {
        self.geom.max_send_frame - HEADER_LEN as u32
    }

    fn in_sq(&self, target: SendTarget) -> bool {
        self.sq.iter().any(|&(t, _)| t == target)
    }

    /// Reserves a slot and writes a numbered request with `payload` bytes into it.
    pub(crate) fn write(&mut self, payload: u32) -> Result<(), SendError> {
        let len = HEADER_LEN + payload as usize;
        let reservation = match self.conn.reserve_send(len) {
            Ok(r) => r,
            Err(e) => {
                if e == SendError::WouldBlock {
                    self.blocked = true;
                }
                self.absorb();
                return Err(e);
            }
        };
        assert!(len <= reservation.capacity());
        assert!(
            !self.in_sq(reservation.target()),
            "slot {} handed out while its SEND is still outstanding",
            reservation.slot()
        );
        let call_id = self.next_call;
        self.next_call += 1;
        let mut header = Header::new(FrameKind::Request, call_id);
        header.payload_len = payload;
        header.method_id = 7;
        let off = self.geom.send_offset(reservation.target());
        let slot = &mut self.send_mem[off..off + len];
        header.encode(slot);
        for (i, b) in slot[HEADER_LEN..].iter_mut().enumerate() {
            *b = pattern(call_id, i);
        }
        self.written.push_back(Written {
            reservation,
            header,
        });
        Ok(())
    }

    /// Commits a written reservation (oldest or newest).
    pub(crate) fn commit(&mut self, newest: bool) -> bool {
        let Some(w) = (if newest {
            self.written.pop_back()
        } else {
            self.written.pop_front()
        }) else {
            return false;
        };
        let call_id = w.header.call_id;
        self.conn
            .commit_send(w.reservation, &w.header)
            .expect("commit");
        self.committed.push(call_id);
        self.absorb();
        true
    }

    /// Aborts a written reservation (oldest or newest).
    pub(crate) fn abort(&mut self, newest: bool) -> bool {
        let Some(w) = (if newest {
            self.written.pop_back()
        } else {
            self.written.pop_front()
        }) else {
            return false;
        };
        self.conn.abort_send(w.reservation);
        self.absorb();
        true
    }

    /// Writes and commits one message.
    pub(crate) fn send(&mut self, payload: u32) -> Result<(), SendError> {
        self.write(payload)?;
        assert!(self.commit(true));
        Ok(())
    }

    /// Executes the next driver action.
    pub(crate) fn exec(&mut self) -> bool {
        let Some(action) = self.pending.pop_front() else {
            return false;
        };
        match action {
            Action::PostRecv { slot } => {
                assert!(slot < self.geom.recv_slots);
                assert!(
                    !self.rq.contains(&slot),
                    "RECV for slot {slot} posted twice"
                );
                self.rq.push_back(slot);
            }
            Action::PostSend(work) => {
                assert!(
                    self.sq.len() < self.geom.sq_depth() as usize,
                    "send queue overflow: depth {}",
                    self.geom.sq_depth()
                );
                assert!(
                    !self.in_sq(work.target),
                    "{:?} re-posted while outstanding",
                    work.target
                );
                let cap = match work.target {
                    SendTarget::Ring(_) => self.geom.send_slot_size,
                    SendTarget::Control => crate::protocol::CONTROL_BUF_LEN as u32,
                };
                assert!(work.len <= cap && work.len <= self.geom.max_send_frame);
                let off = self.geom.send_offset(work.target);
                work.prepare(&mut self.send_mem[off..off + cap as usize]);
                self.sq.push_back((work.target, work.signaled));
                self.wire.push_back(InFlight {
                    target: work.target,
                    len: work.len,
                    signaled: work.signaled,
                    credits: work.credits,
                });
            }
            Action::Writable => {
                self.blocked = false;
                self.writable_events += 1;
            }
            Action::SendDropped { call_id, .. } => self.dropped.push(call_id),
        }
        true
    }

    /// Polls one send completion.
    pub(crate) fn poll_send(&mut self) -> bool {
        let Some(target) = self.send_cq.pop_front() else {
            return false;
        };
        // Everything up to and including this WR left the send queue.
        loop {
            let (t, signaled) = self
                .sq
                .pop_front()
                .expect("completion for a WR not in the SQ");
            if t == target {
                assert!(signaled);
                break;
            }
        }
        self.conn.on_send_complete(target).expect("send completion");
        self.absorb();
        true
    }

    /// Polls one receive completion and hands the frame to the upper layer.
    pub(crate) fn poll_recv(&mut self) -> bool {
        let Some(cqe) = self.recv_cq.pop_front() else {
            return false;
        };
        let off = self.geom.recv_offset(cqe.slot);
        let buf = &self.recv_mem[off..off + self.geom.recv_slot_size as usize];
        let rx = self
            .conn
            .on_recv_complete(cqe.slot, cqe.len, buf)
            .expect("receive completion");
        self.absorb();
        if let Some(rx) = rx {
            self.verify(&rx);
            let call_id = rx.header.call_id;
            if let Some(&last) = self.delivered.last() {
                assert!(
                    call_id > last,
                    "call {call_id} delivered after {last}: reordered or duplicated"
                );
            }
            self.delivered.push(call_id);
            self.held.push(rx);
        }
        true
    }

    fn verify(&self, rx: &Received) {
        let off = self.geom.recv_offset(rx.slot);
        let frame = &self.recv_mem[off..off + rx.len as usize];
        let header = Header::decode(frame).expect("held frame still decodes");
        assert_eq!(
            header.call_id, rx.header.call_id,
            "slot {} overwritten while held",
            rx.slot
        );
        assert_eq!(rx.header.kind, FrameKind::Request);
        assert_eq!(rx.payload_range().len(), rx.header.payload_len as usize);
        for (i, &b) in frame[rx.payload_range()].iter().enumerate() {
            assert_eq!(
                b,
                pattern(rx.header.call_id, i),
                "payload of call {} corrupted",
                rx.header.call_id
            );
        }
    }

    /// The upper layer releases the held frame at `idx` (modulo the number held).
    pub(crate) fn release(&mut self, idx: usize) -> bool {
        if self.held.is_empty() {
            return false;
        }
        let rx = self.held.swap_remove(idx % self.held.len());
        self.verify(&rx);
        self.conn.release_recv(rx.slot).expect("release");
        self.absorb();
        true
    }

    fn pending_sends(&self) -> impl Iterator<Item = &crate::protocol::SendWork> {
        self.pending.iter().filter_map(|a| match a {
            Action::PostSend(w) => Some(w),
            _ => None,
        })
    }
}

/// Moves the oldest SEND on `from`'s wire into `to`'s oldest posted RECV.
fn transmit(from: &mut Endpoint, to: &mut Endpoint) -> bool {
    let Some(frame) = from.wire.pop_front() else {
        return false;
    };
    let Some(slot) = to.rq.pop_front() else {
        panic!("RNR: {frame:?} arrived but the peer has no RECV posted");
    };
    assert!(
        frame.len <= to.geom.recv_slot_size,
        "local length error at the receiver"
    );
    let src = from.geom.send_offset(frame.target);
    let dst = to.geom.recv_offset(slot);
    let len = frame.len as usize;
    to.recv_mem[dst..dst + len].copy_from_slice(&from.send_mem[src..src + len]);
    let wire_credits = &to.recv_mem[dst + CREDITS_OFFSET..dst + CREDITS_OFFSET + 4];
    assert_eq!(
        wire_credits,
        frame.credits.to_le_bytes(),
        "credits not written by prepare"
    );
    to.recv_cq.push_back(RecvCqe {
        slot,
        len: frame.len,
        credits: frame.credits,
    });
    if frame.signaled {
        from.send_cq.push_back(frame.target);
    }
    true
}

/// Which endpoint of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    A,
    B,
}

/// Two connected endpoints.
#[derive(Debug)]
pub(crate) struct Pair {
    pub(crate) a: Endpoint,
    pub(crate) b: Endpoint,
}

impl Pair {
    /// Negotiates both sides from their configurations, as rdma_cm private data would.
    pub(crate) fn new(a: Config, b: Config) -> Pair {
        let pa =
            crate::protocol::ConnectParams::decode(&a.connect_params().encode()).expect("a params");
        let pb =
            crate::protocol::ConnectParams::decode(&b.connect_params().encode()).expect("b params");
        let ga = Geometry::negotiate(&a, &pb).expect("a negotiates");
        let gb = Geometry::negotiate(&b, &pa).expect("b negotiates");
        Pair {
            a: Endpoint::new(&a, ga),
            b: Endpoint::new(&b, gb),
        }
    }

    /// A symmetric pair.
    pub(crate) fn symmetric(config: Config) -> Pair {
        Pair::new(config, config)
    }

    pub(crate) fn side(&mut self, side: Side) -> &mut Endpoint {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Delivers the oldest SEND from `side` to its peer.
    pub(crate) fn transmit(&mut self, side: Side) -> bool {
        match side {
            Side::A => transmit(&mut self.a, &mut self.b),
            Side::B => transmit(&mut self.b, &mut self.a),
        }
    }

    /// Checks both connections' internal invariants and the credit conservation law of both
    /// directions: every receive slot of the receiver is accounted for exactly once.
    pub(crate) fn check(&self) {
        self.a.conn.assert_invariants();
        self.b.conn.assert_invariants();
        if self.a.conn.is_closed() || self.b.conn.is_closed() {
            return;
        }
        Self::conservation(&self.a, &self.b);
        Self::conservation(&self.b, &self.a);
        Self::rnr_free(&self.a, &self.b);
        Self::rnr_free(&self.b, &self.a);
    }

    /// The no-RNR invariant, stated on the QP rather than on the state machine's belief:
    /// every credit that has left `rx` (held by `tx`, or on its way there) and every frame
    /// `tx` has committed to the wire is backed by a RECV actually posted in `rx`'s receive
    /// queue. Granting a credit before its RECV is posted breaks this at once, even if no
    /// schedule happens to turn it into an RNR.
    fn rnr_free(tx: &Endpoint, rx: &Endpoint) {
        let grants_sent = rx.wire.iter().map(|f| u64::from(f.credits)).sum::<u64>()
            + tx.recv_cq.iter().map(|c| u64::from(c.credits)).sum::<u64>();
        let frames_coming = (tx.pending_sends().count() + tx.wire.len()) as u64;
        let claimed = u64::from(tx.conn.stats().send_credits) + grants_sent + frames_coming;
        assert!(
            rx.rq.len() as u64 >= claimed,
            "RNR possible: {} RECVs posted, {claimed} claimed by credits and frames",
            rx.rq.len()
        );
    }

    /// Slots of `rx`'s receive ring = credits `tx` holds + grants on their way to `tx` +
    /// credits `rx` has yet to return + frames on their way to `rx` + frames `rx` holds.
    fn conservation(tx: &Endpoint, rx: &Endpoint) {
        let grants_in_flight: u64 = rx
            .pending_sends()
            .map(|w| u64::from(w.credits))
            .sum::<u64>()
            + rx.wire.iter().map(|f| u64::from(f.credits)).sum::<u64>()
            + tx.recv_cq.iter().map(|c| u64::from(c.credits)).sum::<u64>();
        let frames_in_flight =
            (tx.pending_sends().count() + tx.wire.len() + rx.recv_cq.len()) as u64;
        let stats_tx = tx.conn.stats();
        let stats_rx = rx.conn.stats();
        assert_eq!(stats_rx.recv_held as usize, rx.held.len());
        let total = u64::from(stats_tx.send_credits)
            + grants_in_flight
            + u64::from(stats_rx.pending_credit_return)
            + frames_in_flight
            + rx.held.len() as u64;
        assert_eq!(
            total,
            u64::from(rx.geom.recv_slots),
            "credit conservation broken: tx {stats_tx:?}, rx {stats_rx:?}"
        );
        assert!(
            stats_tx.send_credits <= rx.geom.recv_slots,
            "credit overflow"
        );
    }

    /// One round of everything the driver and the upper layer may do, on both sides.
    /// Applications send up to their quota. Returns whether anything happened.
    pub(crate) fn round(&mut self, payload: u32) -> bool {
        let mut progress = false;
        for side in [Side::A, Side::B] {
            let mut ep = self.side(side);
            while ep.quota > 0 && !ep.blocked {
                let p = payload.min(ep.max_payload());
                match ep.send(p) {
                    Ok(()) => {
                        ep.quota -= 1;
                        progress = true;
                    }
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("send failed: {e}"),
                }
            }
            while ep.exec() {
                progress = true;
                // Checked per action: the window between two actions matters.
                self.check();
                ep = self.side(side);
            }
        }
        self.check();
        while self.transmit(Side::A) | self.transmit(Side::B) {
            progress = true;
        }
        for side in [Side::A, Side::B] {
            let ep = self.side(side);
            while ep.poll_send() | ep.poll_recv() {
                progress = true;
            }
            while ep.release(0) {
                progress = true;
            }
        }
        self.check();
        progress
    }

    /// Runs rounds until nothing happens any more; fails if that takes absurdly long
    /// (livelock) or ends with work left (deadlock).
    pub(crate) fn run_to_idle(&mut self, payload: u32) {
        let limit = 100_000;
        let mut rounds = 0;
        while self.round(payload) {
            rounds += 1;
            assert!(
                rounds < limit,
                "no quiescence after {limit} rounds: livelock"
            );
        }
        self.assert_drained();
    }

    /// After quiescence: nothing in flight, nothing queued, every committed message
    /// delivered exactly once and in order, and all credits back home.
    pub(crate) fn assert_drained(&self) {
        for (name, ep, peer) in [("a", &self.a, &self.b), ("b", &self.b, &self.a)] {
            assert!(
                ep.written.is_empty(),
                "{name}: uncommitted reservations left"
            );
            assert_eq!(
                ep.quota, 0,
                "{name}: deadlock, {} messages never sent",
                ep.quota
            );
            assert!(
                ep.pending.is_empty() && ep.wire.is_empty(),
                "{name}: work left"
            );
            assert!(
                ep.send_cq.is_empty() && ep.recv_cq.is_empty(),
                "{name}: completions left"
            );
            assert!(ep.held.is_empty(), "{name}: frames held");
            let stats = ep.conn.stats();
            assert_eq!(
                stats.send_unposted, 0,
                "{name}: deadlock, frames still queued: {stats:?}"
            );
            let mut sent = ep.committed.clone();
            sent.sort_unstable();
            assert_eq!(
                sent, peer.delivered,
                "{name}: sent vs. delivered at the peer"
            );
            assert_eq!(
                stats.send_credits + peer.conn.stats().pending_credit_return,
                peer.geom.recv_slots,
                "{name}: credits not all home"
            );
            assert!(!ep.blocked, "{name}: WouldBlock never followed by Writable");
        }
    }
}
