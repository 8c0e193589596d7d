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

use rpc_wire::{FrameKind, Header, HEADER_LEN};

mod advertise;
mod checks;
mod large;
mod pair;
mod recv_side;
mod wire;

pub(crate) use large::LargeSide;
pub(crate) use pair::{Pair, Side};
pub(crate) use recv_side::{RecvSide, SharedRq, Srq};
use wire::{transmit, InFlight, Wire};

use crate::{
    Action, Config, Connection, Geometry, Received, SendError, SendReservation, SendTarget, WorkId,
};

/// A receive completion waiting to be polled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvCqe {
    /// The ring slot, or with a shared receive queue the buffer.
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
    pub(crate) recv: RecvSide,
    /// Actions taken from the connection, not yet executed.
    pending: VecDeque<Action>,
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
    delivered_kinds: Vec<(u64, FrameKind)>,
    /// A reservation hit WouldBlock and no Writable has been seen since.
    pub(crate) blocked: bool,
    pub(crate) writable_events: u64,
    pub(crate) dropped: Vec<u64>,
    /// Messages the application still wants to send (used by [`Pair::run_to_idle`]).
    pub(crate) quota: u64,
    /// The driver honours [`Received::lend`] for an application that keeps every frame: a
    /// lent frame stays held forever, any other is copied out and its slot released at once.
    pub(crate) hoard: bool,
    /// Frames copied out instead of lent (with `hoard`).
    pub(crate) copied: u64,
    /// Released slots are gathered and handed back this many at a time, as the driver
    /// does ([`Connection::release_batch`]); `None`: each at once.
    pub(crate) gather: Option<u32>,
    gathered: Vec<u32>,
}

/// Payload byte `i` of call `call_id`.
fn pattern(call_id: u64, i: usize) -> u8 {
    (call_id as u8).wrapping_mul(31).wrapping_add(i as u8)
}

impl Endpoint {
    /// Posts the receive ring (as the driver does before connecting), or with a shared
    /// receive queue expects the pool to have admitted the window, then creates the
    /// connection from the negotiated geometry.
    fn new(config: &Config, geom: Geometry, srq: Option<SharedRq>) -> Self {
        let recv = match srq {
            None => RecvSide::Ring {
                rq: config.initial_recv_posts().collect(),
                mem: vec![0; geom.recv_region_len()],
            },
            Some(srq) => {
                assert!(config.shared_recv && config.initial_recv_posts().is_empty());
                RecvSide::Shared {
                    srq,
                    buf_of: vec![u32::MAX; geom.recv_slots as usize],
                }
            }
        };
        let mut ep = Endpoint {
            conn: Connection::new(geom),
            geom,
            send_mem: vec![0; geom.send_region_len()],
            recv,
            pending: VecDeque::new(),
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
            delivered_kinds: Vec::new(),
            blocked: false,
            writable_events: 0,
            dropped: Vec::new(),
            quota: 0,
            hoard: false,
            copied: 0,
            gather: None,
            gathered: Vec::new(),
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
        self.sq.iter().any(|&(t, _)| t == target.work_id())
    }

    fn push_sq(&mut self, id: WorkId, signaled: bool) {
        assert!(
            self.sq.len() < self.geom.sq_depth() as usize,
            "send queue overflow: depth {}",
            self.geom.sq_depth()
        );
        self.sq.push_back((id, signaled));
    }

    /// Posts a keepalive probe if the protocol lets one go; true if it did.
    pub(crate) fn probe(&mut self) -> bool {
        if !self.conn.start_probe() {
            return false;
        }
        self.push_probe();
        true
    }

    /// Posts the probe the protocol let go (`start_probe` or `start_drain`).
    pub(crate) fn push_probe(&mut self) {
        self.push_sq(WorkId::Probe, true);
        self.wire.push_back(Wire::Probe);
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
        self.write_frame(header)?;
        self.next_call += 1;
        Ok(())
    }

    /// Reserves a slot and writes `header` and a payload pattern of its call into it.
    pub(crate) fn write_frame(&mut self, header: Header) -> Result<(), SendError> {
        let call_id = header.call_id;
        let payload = header.payload_len;
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

    fn take_written(&mut self, newest: bool) -> Option<Written> {
        if newest {
            self.written.pop_back()
        } else {
            self.written.pop_front()
        }
    }

    /// Commits a written reservation (oldest or newest).
    pub(crate) fn commit(&mut self, newest: bool) -> bool {
        let Some(w) = self.take_written(newest) else {
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
        let Some(w) = self.take_written(newest) else {
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
                self.recv.post(slot);
            }
            Action::PostSend(work) => {
                assert!(
                    !self.in_sq(work.target),
                    "{:?} re-posted while outstanding",
                    work.target
                );
                let cap = match work.target {
                    SendTarget::Ring(_) => self.geom.send_slot_size,
                    SendTarget::Control => crate::CONTROL_BUF_LEN as u32,
                };
                assert!(work.len <= cap && work.len <= self.geom.max_send_frame);
                let off = self.geom.send_offset(work.target);
                work.prepare(&mut self.send_mem[off..off + cap as usize]);
                if work.kind == FrameKind::Cancel && work.frame.is_some() {
                    // The protocol releasing an advertised buffer: the peer's upper layer
                    // sees it like any Cancel.
                    self.committed.push(work.call_id);
                }
                self.push_sq(work.work_id(), work.signaled);
                self.wire.push_back(Wire::Send(InFlight {
                    target: work.target,
                    len: work.len,
                    signaled: work.signaled,
                    credits: work.credits,
                }));
            }
            large @ (Action::PostWrite(_)
            | Action::PostRead(_)
            | Action::BindSource { .. }
            | Action::InvalidateSource { .. }
            | Action::ReadNeeded { .. }
            | Action::TransferDone { .. }
            | Action::TransferFailed { .. }
            | Action::GrantNeeded { .. }
            | Action::BindWindow { .. }
            | Action::Invalidate { .. }
            | Action::DeliverLarge { .. }
            | Action::ReleaseGrant { .. }) => self.exec_large(large),
            Action::Writable => {
                self.blocked = false;
                self.writable_events += 1;
            }
            Action::SendDropped { call_id, .. } => self.dropped.push(call_id),
            Action::PostProbe => self.push_probe(),
        }
        true
    }

    /// The driver grows the receive window by what the connection wants, at most `n`, as
    /// far as it can back the slots.
    pub(crate) fn grow(&mut self, n: u32) -> bool {
        let send = self.conn.send_slots_wanted();
        let grew_send = send > 0;
        if grew_send {
            // Memory for the whole send ring is there: back what the ring asks for.
            self.conn.back_send_slots(send);
            self.absorb();
        }
        let n = self.recv.back(n.min(self.conn.window_wanted()));
        if n == 0 {
            return grew_send;
        }
        let grown = self.conn.grow_window(n);
        assert_eq!(grown, n, "a wanted window did not grow");
        self.absorb();
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
            WorkId::Read(grant) => self.conn.on_read_complete(grant),
            WorkId::BindSource(_) => Ok(()),
            WorkId::InvalidateSource(transfer) => self.conn.on_source_invalidated(transfer),
            WorkId::Probe => {
                self.conn.on_probe_complete();
                Ok(())
            }
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
        let rx = self.on_recv(&cqe).expect("receive completion");
        if let Some(rx) = rx {
            self.verify(&rx);
            let call_id = rx.header.call_id;
            // Frames of one kind go in call order; a Cancel or a response may name a call
            // whose request came before.
            if let Some(&(last, _)) = self
                .delivered_kinds
                .iter()
                .rev()
                .find(|(_, kind)| *kind == rx.header.kind)
            {
                assert!(
                    call_id > last,
                    "call {call_id} delivered after {last}: reordered or duplicated"
                );
            }
            self.delivered_kinds.push((call_id, rx.header.kind));
            self.delivered.push(call_id);
            if self.hoard && !rx.lend {
                self.copied += 1;
                self.release_slot(rx.slot);
            } else {
                self.held.push(rx);
            }
        }
        true
    }

    /// Receive completions waiting to be polled.
    pub(crate) fn landed(&self) -> usize {
        self.recv_cq.len()
    }

    /// A raw SEND of `frame` (no credit taken, no grant) lands here, as a hostile peer's
    /// would.
    pub(crate) fn land_raw(&mut self, frame: &[u8]) {
        let size = self.geom.recv_slot_size;
        let Some(slot) = self.recv.land(frame, size) else {
            panic!("RNR: a raw frame arrived with no RECV posted");
        };
        self.recv_cq.push_back(RecvCqe {
            slot,
            len: frame.len() as u32,
            credits: 0,
        });
    }

    /// Polls one receive completion of raw frames: whether a frame was handed up (and is
    /// now held), or the violation.
    pub(crate) fn poll_recv_raw(&mut self) -> Result<bool, crate::ProtocolViolation> {
        let cqe = self.recv_cq.pop_front().expect("a completion");
        let rx = self.on_recv(&cqe)?;
        Ok(rx.map(|rx| self.held.push(rx)).is_some())
    }

    /// Hands a receive completion to the connection, as the driver does: with an SRQ, a
    /// frame the protocol consumed or refused gives its buffer straight back.
    pub(crate) fn on_recv(
        &mut self,
        cqe: &RecvCqe,
    ) -> Result<Option<Received>, crate::ProtocolViolation> {
        let size = self.geom.recv_slot_size;
        let bytes = self.recv.entry(cqe.slot, cqe.len as usize, size);
        let rx = if self.recv.is_shared() {
            let rx = self.conn.on_shared_recv_complete(cqe.len, &bytes);
            match &rx {
                Ok(Some(rx)) => self.recv.hold(rx.slot, cqe.slot),
                Ok(None) | Err(_) => self.recv.repost(cqe.slot),
            }
            rx
        } else {
            self.conn.on_recv_complete(cqe.slot, cqe.len, &bytes)
        };
        self.absorb();
        rx
    }

    /// The upper layer is done with `slot`.
    fn release_slot(&mut self, slot: u32) {
        let Some(batch) = self.gather else {
            return self.hand_back(slot);
        };
        self.gathered.push(slot);
        if self.gathered.len() >= batch as usize {
            for slot in std::mem::take(&mut self.gathered) {
                self.hand_back(slot);
            }
        }
    }

    /// Gives `slot` back to the connection.
    fn hand_back(&mut self, slot: u32) {
        let given = if self.recv.is_shared() {
            let shrink = self.recv.release(slot);
            self.conn.release_shared(slot, shrink).expect("release")
        } else {
            self.conn.release_recv(slot).expect("release");
            false
        };
        if given {
            self.recv.give_back(1);
        }
        self.absorb();
    }

    fn verify(&self, rx: &Received) {
        let frame = &self
            .recv
            .held(rx.slot, rx.len as usize, self.geom.recv_slot_size)[..];
        let header = Header::decode(frame).expect("held frame still decodes");
        assert_eq!(
            header.call_id, rx.header.call_id,
            "slot {} overwritten while held",
            rx.slot
        );
        assert!(matches!(
            rx.header.kind,
            FrameKind::Request | FrameKind::Response | FrameKind::Cancel
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
        self.release_slot(rx.slot);
        true
    }

    fn pending_sends(&self) -> impl Iterator<Item = &crate::SendWork> {
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

    /// Kinds of the work requests on the wire, oldest first ("S" send, "W" write, "L" local,
    /// "P" probe).
    pub(crate) fn wire_shape(&self) -> String {
        self.wire
            .iter()
            .map(|w| match w {
                Wire::Send(_) => 'S',
                Wire::Write(_) => 'W',
                Wire::Read(_) => 'R',
                Wire::Local(..) => 'L',
                Wire::Probe => 'P',
            })
            .collect()
    }
}
