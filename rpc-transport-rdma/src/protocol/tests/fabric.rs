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

use std::collections::{HashMap, VecDeque};

use rpc_core::{Code, FrameKind, Header, HEADER_LEN};

use crate::protocol::{
    Action, Config, Connection, Geometry, LocalBuffer, Received, SendError, SendReservation,
    SendTarget, WorkId, WriteWork, CREDITS_OFFSET,
};

/// A SEND on the wire.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    target: SendTarget,
    len: u32,
    signaled: bool,
    credits: u32,
}

/// A work request on the wire, in send-queue order (RC executes a send queue in order).
#[derive(Debug, Clone, Copy)]
enum Wire {
    Send(InFlight),
    Write(WriteWork),
    /// A local operation (window bind or invalidation): takes effect in queue order.
    Local(WorkId, Option<u32>),
}

/// A memory window at the receiver: the range its current rkey grants, while valid.
#[derive(Debug, Clone, Copy)]
struct Window {
    addr: u64,
    len: u64,
    valid: bool,
}

/// The large-body side of an endpoint: registered buffers, windows, and what the upper
/// layer saw.
#[derive(Debug, Default)]
pub(crate) struct LargeSide {
    /// Registered buffers by base address.
    pub(crate) mem: HashMap<u64, Vec<u8>>,
    next_addr: u64,
    /// Source buffers of our transfers.
    sources: HashMap<u32, u64>,
    /// Granted buffers: grant id -> (addr, rkey).
    grants: HashMap<u32, (u64, u32)>,
    windows: HashMap<u32, Window>,
    next_rkey: u32,
    /// Grants refused once this many bytes are lent.
    pub(crate) budget: Option<u64>,
    lent: u64,
    /// Call ids whose large body was handed up, with their lengths.
    pub(crate) delivered: Vec<(u64, u64)>,
    /// Grants revoked by a cancel.
    pub(crate) released: u32,
    /// Transfers the peer refused: (call, status).
    pub(crate) failed: Vec<(u64, Code)>,
    /// Calls whose transfers finished (source returned).
    pub(crate) done: u32,
    /// Remote access errors seen (WRITEs that found no valid window).
    pub(crate) access_errors: u32,
    /// The last WRITE posted, for replaying it late.
    last_write: Option<WriteWork>,
}

impl LargeSide {
    fn alloc(&mut self, len: u64) -> u64 {
        self.next_addr += 0x1_0000_0000;
        self.mem.insert(self.next_addr, vec![0; len as usize]);
        self.next_addr
    }
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
    wire: VecDeque<Wire>,
    sq: VecDeque<(WorkId, bool)>,
    send_cq: VecDeque<WorkId>,
    pub(crate) large: LargeSide,
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
            large: LargeSide::default(),
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

    /// Largest payload a single frame can carry in either header form.
    pub(crate) fn max_payload(&self) -> u32 {
        self.geom.max_send_frame - HEADER_LEN as u32
    }

    fn in_sq(&self, target: SendTarget) -> bool {
        let id = match target {
            SendTarget::Ring(slot) => WorkId::Send(slot),
            SendTarget::Control => WorkId::Control,
        };
        self.sq.iter().any(|&(t, _)| t == id)
    }

    fn push_sq(&mut self, id: WorkId, signaled: bool) {
        assert!(
            self.sq.len() < self.geom.sq_depth() as usize,
            "send queue overflow: depth {}",
            self.geom.sq_depth()
        );
        self.sq.push_back((id, signaled));
    }

    /// Encodes a request of `len` payload bytes into a fresh registered buffer and starts
    /// sending it by the large-body path. Returns its call id.
    pub(crate) fn send_large(&mut self, len: u64) -> Result<u64, SendError> {
        let call_id = self.next_call;
        self.next_call += 1;
        let addr = self.large.alloc(len);
        let buf = self.large.mem.get_mut(&addr).expect("just allocated");
        for (i, b) in buf.iter_mut().enumerate() {
            *b = pattern(call_id, i);
        }
        let mut notice = Header::new(FrameKind::Request, call_id);
        notice.method_id = 7;
        notice.payload_len = u32::try_from(len).expect("test bodies fit u32");
        match self
            .conn
            .start_large(&notice, LocalBuffer { addr, lkey: 1 })
        {
            Ok(transfer) => {
                self.large.sources.insert(transfer, addr);
                self.absorb();
                Ok(call_id)
            }
            Err(e) => {
                self.large.mem.remove(&addr);
                Err(e)
            }
        }
    }

    /// Puts a copy of the last WRITE on the wire again, as a late or forged WRITE would
    /// arrive (from a fresh source buffer full of 0xEE).
    pub(crate) fn replay_last_write(&mut self) {
        let w = self.large.last_write.expect("a WRITE was posted");
        let addr = self.large.alloc(u64::from(w.len));
        self.large.mem.get_mut(&addr).expect("allocated").fill(0xEE);
        self.large.sources.insert(u32::MAX, addr);
        self.wire.push_back(Wire::Write(WriteWork {
            transfer: u32::MAX,
            local_addr: addr,
            ..w
        }));
    }

    /// Sends a Cancel for `call_id` (a plain frame through the ring).
    pub(crate) fn cancel(&mut self, call_id: u64) -> Result<(), SendError> {
        let reservation = self.conn.reserve_send(HEADER_LEN)?;
        let header = Header::new(FrameKind::Cancel, call_id);
        let off = self.geom.send_offset(reservation.target());
        header.encode(&mut self.send_mem[off..off + HEADER_LEN]);
        self.conn.commit_send(reservation, &header)?;
        self.committed.push(call_id);
        self.absorb();
        Ok(())
    }

    /// Reserves a slot and writes a numbered request with `payload` bytes into it. Odd calls
    /// carry a deadline, so both header forms (full and compact) travel.
    pub(crate) fn write(&mut self, payload: u32) -> Result<(), SendError> {
        let call_id = self.next_call;
        let mut header = Header::new(FrameKind::Request, call_id);
        header.payload_len = payload;
        header.method_id = 7;
        header.timeout_us = call_id % 2;
        let header_len = header.encoded_len();
        let len = header_len + payload as usize;
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
        self.next_call += 1;
        let off = self.geom.send_offset(reservation.target());
        let slot = &mut self.send_mem[off..off + len];
        assert_eq!(header.encode(slot), header_len);
        for (i, b) in slot[header_len..].iter_mut().enumerate() {
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
                self.push_sq(work.work_id(), work.signaled);
                self.wire.push_back(Wire::Send(InFlight {
                    target: work.target,
                    len: work.len,
                    signaled: work.signaled,
                    credits: work.credits,
                }));
            }
            Action::PostWrite(w) => {
                let base = self.large.sources[&w.transfer];
                let src = &self.large.mem[&base];
                let start = w.local_addr - base;
                assert!(
                    start + u64::from(w.len) <= src.len() as u64,
                    "WRITE source outside its buffer"
                );
                self.push_sq(WorkId::Write(w.transfer), true);
                self.wire.push_back(Wire::Write(w));
                self.large.last_write = Some(w);
            }
            Action::TransferDone { transfer } => {
                let addr = self
                    .large
                    .sources
                    .remove(&transfer)
                    .expect("known transfer");
                assert!(
                    !self.sq.iter().any(|&(id, _)| id == WorkId::Write(transfer)),
                    "source buffer returned while a WRITE still reads it"
                );
                self.large.mem.remove(&addr);
                self.large.done += 1;
            }
            Action::TransferFailed {
                transfer,
                call_id,
                status,
                ..
            } => {
                let addr = self
                    .large
                    .sources
                    .remove(&transfer)
                    .expect("known transfer");
                self.large.mem.remove(&addr);
                self.large.failed.push((call_id, status));
            }
            Action::GrantNeeded { call_id, len } => {
                if self.large.budget.is_some_and(|b| self.large.lent + len > b) {
                    let budget = self.large.budget.unwrap_or(0);
                    self.conn.refuse(call_id, Code::ResourceExhausted, budget);
                } else {
                    let addr = self.large.alloc(len);
                    self.large.next_rkey += 0x101;
                    let rkey = self.large.next_rkey;
                    match self.conn.grant(call_id, addr, rkey, len) {
                        Some(grant) => {
                            self.large.lent += len;
                            self.large.grants.insert(grant, (addr, rkey));
                            self.large.windows.insert(
                                rkey,
                                Window {
                                    addr,
                                    len,
                                    valid: false,
                                },
                            );
                        }
                        None => {
                            self.large.mem.remove(&addr);
                        }
                    }
                }
                // Actions the answer produced run after the ones already queued.
                while let Some(action) = self.conn.poll_action() {
                    self.pending.push_back(action);
                }
            }
            Action::BindWindow { grant } => {
                let (_, rkey) = self.large.grants[&grant];
                self.push_sq(WorkId::Bind(grant), true);
                self.wire
                    .push_back(Wire::Local(WorkId::Bind(grant), Some(rkey)));
            }
            Action::Invalidate { grant, rkey } => {
                assert_eq!(self.large.grants[&grant].1, rkey);
                self.push_sq(WorkId::Invalidate(grant), true);
                self.wire
                    .push_back(Wire::Local(WorkId::Invalidate(grant), Some(rkey)));
            }
            Action::DeliverLarge { grant, header } => {
                let (addr, rkey) = self.large.grants.remove(&grant).expect("known grant");
                assert!(
                    !self.large.windows[&rkey].valid,
                    "body handed up while still remotely writable"
                );
                let buf = self.large.mem.remove(&addr).expect("granted buffer");
                let len = header.message_len();
                assert_eq!(header.kind, FrameKind::Request);
                for (i, &b) in buf[..len as usize].iter().enumerate() {
                    assert_eq!(b, pattern(header.call_id, i), "large body corrupted");
                }
                self.large.lent -= buf.len() as u64;
                self.large.delivered.push((header.call_id, len));
            }
            Action::ReleaseGrant { grant } => {
                let (addr, rkey) = self.large.grants.remove(&grant).expect("known grant");
                assert!(
                    !self.large.windows[&rkey].valid,
                    "buffer reused while still remotely writable"
                );
                let buf = self.large.mem.remove(&addr).expect("granted buffer");
                self.large.lent -= buf.len() as u64;
                self.large.released += 1;
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
        let Some(id) = self.send_cq.pop_front() else {
            return false;
        };
        // Everything up to and including this WR left the send queue.
        loop {
            let (t, signaled) = self
                .sq
                .pop_front()
                .expect("completion for a WR not in the SQ");
            if t == id {
                assert!(signaled);
                break;
            }
        }
        let outcome = match id {
            WorkId::Send(slot) => self.conn.on_send_complete(SendTarget::Ring(slot)),
            WorkId::Control => self.conn.on_send_complete(SendTarget::Control),
            WorkId::Write(transfer) => self.conn.on_write_complete(transfer),
            WorkId::Bind(grant) => self.conn.on_bind_complete(grant),
            WorkId::Invalidate(grant) => self.conn.on_invalidated(grant),
            WorkId::Recv(_) => unreachable!("receives complete on the receive CQ"),
        };
        outcome.expect("send-queue completion");
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
        assert!(matches!(
            rx.header.kind,
            FrameKind::Request | FrameKind::Cancel
        ));
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

    fn wire_sends(&self) -> impl Iterator<Item = &InFlight> {
        self.wire.iter().filter_map(|w| match w {
            Wire::Send(f) => Some(f),
            _ => None,
        })
    }

    /// Kinds of the work requests on the wire, oldest first ("S" send, "W" write, "L" local).
    pub(crate) fn wire_shape(&self) -> String {
        self.wire
            .iter()
            .map(|w| match w {
                Wire::Send(_) => 'S',
                Wire::Write(_) => 'W',
                Wire::Local(..) => 'L',
            })
            .collect()
    }
}

/// Executes the oldest work request on `from`'s wire: a SEND lands in `to`'s oldest posted
/// RECV, a WRITE in `to`'s memory through a valid window, a local operation on `from`.
fn transmit(from: &mut Endpoint, to: &mut Endpoint) -> bool {
    let Some(wr) = from.wire.pop_front() else {
        return false;
    };
    let frame = match wr {
        Wire::Send(frame) => frame,
        Wire::Write(w) => {
            let window = to.large.windows.get(&w.rkey).copied();
            let fits = window.is_some_and(|win| {
                win.valid
                    && w.remote_addr >= win.addr
                    && w.remote_addr + u64::from(w.len) <= win.addr + win.len
            });
            if !fits {
                // A real responder NAKs and both QPs go to the error state.
                to.large.access_errors += 1;
                return true;
            }
            let win = window.expect("checked");
            let base = from.large.sources[&w.transfer];
            let src_at = (w.local_addr - base) as usize;
            let data = from.large.mem[&base][src_at..src_at + w.len as usize].to_vec();
            let dst = to
                .large
                .mem
                .get_mut(&win.addr)
                .expect("window over a live buffer");
            let dst_at = (w.remote_addr - win.addr) as usize;
            dst[dst_at..dst_at + data.len()].copy_from_slice(&data);
            from.send_cq.push_back(WorkId::Write(w.transfer));
            return true;
        }
        Wire::Local(id, rkey) => {
            let window = rkey.and_then(|k| from.large.windows.get_mut(&k));
            let window = window.expect("local operation on a known window");
            window.valid = matches!(id, WorkId::Bind(_));
            from.send_cq.push_back(id);
            return true;
        }
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
        from.send_cq.push_back(match frame.target {
            SendTarget::Ring(slot) => WorkId::Send(slot),
            SendTarget::Control => WorkId::Control,
        });
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
        let grants_sent = rx.wire_sends().map(|f| u64::from(f.credits)).sum::<u64>()
            + tx.recv_cq.iter().map(|c| u64::from(c.credits)).sum::<u64>();
        let frames_coming = (tx.pending_sends().count() + tx.wire_sends().count()) as u64;
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
            + rx.wire_sends().map(|f| u64::from(f.credits)).sum::<u64>()
            + tx.recv_cq.iter().map(|c| u64::from(c.credits)).sum::<u64>();
        let frames_in_flight =
            (tx.pending_sends().count() + tx.wire_sends().count() + rx.recv_cq.len()) as u64;
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
