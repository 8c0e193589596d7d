//! The large-body side of the fabric: registered buffers, memory windows with their
//! validity, RDMA WRITEs checked against them, and what the upper layer saw.

use std::collections::HashMap;

use rpc_wire::{Code, FrameKind, Header};

use super::{pattern, Endpoint, Wire};
use crate::{Action, BodyStart, LocalBuffer, ReadWork, SendError, WorkId, WriteWork};

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
    /// Buffers bodies are read into: grant id -> addr.
    read_grants: HashMap<u32, u64>,
    /// Windows over the bodies of our transfers offered for reading: transfer -> rkey.
    source_windows: HashMap<u32, u32>,
    /// Requests go by the peer's READ instead of the rendezvous.
    pub(crate) offer_requests: bool,
    windows: HashMap<u32, Window>,
    next_rkey: u32,
    /// Grants refused once this many bytes are lent.
    pub(crate) budget: Option<u64>,
    lent: u64,
    /// Call ids whose large body was handed up, with their lengths.
    pub(crate) delivered: Vec<(u64, u64)>,
    /// Stream messages among them: (call, sequence number, length).
    pub(crate) messages: Vec<(u64, u32, u64)>,
    /// Grants revoked by a cancel.
    pub(crate) released: u32,
    /// Transfers the peer refused: (call, status).
    pub(crate) failed: Vec<(u64, Code)>,
    /// Calls whose transfers finished (source returned).
    pub(crate) done: u32,
    /// Bodies read from the peer.
    pub(crate) read: u32,
    /// Remote access errors seen (WRITEs or READs that found no valid window).
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

    /// A fresh buffer and the rkey its window will get when bound.
    pub(super) fn new_window(&mut self, len: u64) -> (u64, u32) {
        let addr = self.alloc(len);
        (addr, self.new_rkey())
    }

    fn new_rkey(&mut self) -> u32 {
        self.next_rkey += 0x101;
        self.next_rkey
    }

    /// The connection made grant `grant` over the buffer: its window is bound next.
    pub(super) fn lend(&mut self, grant: u32, addr: u64, rkey: u32, len: u64) {
        self.lent += len;
        self.grants.insert(grant, (addr, rkey));
        self.windows.insert(
            rkey,
            Window {
                addr,
                len,
                valid: false,
            },
        );
    }

    /// Every window of this side stops granting access, behind the protocol's back.
    pub(crate) fn revoke_all_windows(&mut self) {
        for window in self.windows.values_mut() {
            window.valid = false;
        }
    }

    /// The buffer was not lent after all.
    pub(super) fn forget_window(&mut self, addr: u64, rkey: u32) {
        self.mem.remove(&addr);
        self.windows.remove(&rkey);
    }
}

impl Endpoint {
    /// Encodes a request of `len` payload bytes into a fresh registered buffer and starts
    /// sending it by the large-body path. Returns its call id.
    pub(crate) fn send_large(&mut self, len: u64) -> Result<u64, SendError> {
        let call_id = self.next_call;
        self.next_call += 1;
        let mut notice = Header::new(FrameKind::Request, call_id);
        notice.method_id = 7;
        notice.payload_len = u32::try_from(len).expect("test bodies fit u32");
        self.start_body(&notice)?;
        Ok(call_id)
    }

    /// As [`Endpoint::send_large`], the request advertising a `buffer`-byte response buffer.
    pub(crate) fn send_large_advertising(&mut self, len: u64, buffer: u64) -> u64 {
        self.try_send_large_advertising(len, buffer)
            .expect("advertised and started")
    }

    /// As [`Endpoint::send_large_advertising`]; `None` if no buffer may be advertised
    /// (windows at their limit) or the body cannot start (the buffer is withdrawn).
    pub(crate) fn try_send_large_advertising(&mut self, len: u64, buffer: u64) -> Option<u64> {
        let call_id = self.next_call;
        let mut notice = Header::new(FrameKind::Request, call_id);
        notice.method_id = 7;
        notice.payload_len = u32::try_from(len).expect("test bodies fit u32");
        let (addr, rkey) = self.large.new_window(buffer);
        let Some(descriptor) = self.conn.advertise(call_id, addr, rkey, buffer) else {
            self.large.forget_window(addr, rkey);
            return None;
        };
        self.next_call += 1;
        self.large
            .lend(descriptor.generation, addr, rkey, descriptor.len);
        notice.flags = rpc_wire::Flags::RESPONSE_BUFFER;
        notice.remote = descriptor;
        self.absorb();
        if self.start_body(&notice).is_err() {
            self.conn.withdraw_advertisement(call_id);
            self.absorb();
            return None;
        }
        Some(call_id)
    }

    /// Sends message `seq` of `call_id`'s stream, `len` bytes, by the large-body path.
    pub(crate) fn send_large_message(
        &mut self,
        call_id: u64,
        seq: u32,
        len: u64,
    ) -> Result<(), SendError> {
        let mut notice = Header::stream(FrameKind::Message, call_id, seq);
        notice.payload_len = u32::try_from(len).expect("test bodies fit u32");
        self.start_body(&notice)
    }

    /// Answers the peer's `call_id` with a response of `len` payload bytes by the
    /// large-body path (into its advertised buffer, or by rendezvous).
    pub(crate) fn respond_large(&mut self, call_id: u64, len: u64) -> Result<(), SendError> {
        let mut notice = Header::new(FrameKind::Response, call_id);
        notice.payload_len = u32::try_from(len).expect("test bodies fit u32");
        self.start_body(&notice)
    }

    /// Encodes the body `notice` describes (a pattern of its call) into a fresh registered
    /// buffer and starts sending it.
    fn start_body(&mut self, notice: &Header) -> Result<(), SendError> {
        let seed = pattern_seed(notice);
        let len = notice.message_len();
        let addr = self.large.alloc(len);
        let buf = self.large.mem.get_mut(&addr).expect("just allocated");
        for (i, b) in buf.iter_mut().enumerate() {
            *b = pattern(seed, i);
        }
        let local = LocalBuffer { addr, lkey: 1 };
        let offer = self.large.offer_requests && notice.kind == FrameKind::Request;
        let started = if offer {
            let rkey = self.large.new_rkey();
            self.large.windows.insert(
                rkey,
                Window {
                    addr,
                    len,
                    valid: false,
                },
            );
            let started = self.conn.start_source(notice, local, rkey);
            match started {
                Ok(BodyStart::Offered(transfer)) => {
                    self.large.source_windows.insert(transfer, rkey);
                }
                _ => {
                    self.large.windows.remove(&rkey);
                }
            }
            started.map(BodyStart::transfer)
        } else {
            self.conn.start_large(notice, local)
        };
        match started {
            Ok(transfer) => {
                self.large.sources.insert(transfer, addr);
                self.absorb();
                Ok(())
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

    fn free_source(&mut self, transfer: u32) {
        if let Some(rkey) = self.large.source_windows.remove(&transfer) {
            let window = self.large.windows.remove(&rkey).expect("source window");
            assert!(
                !window.valid,
                "source buffer returned while still remotely readable"
            );
        }
        let addr = self
            .large
            .sources
            .remove(&transfer)
            .expect("known transfer");
        self.large.mem.remove(&addr);
    }

    /// The grant whose invalidation is in the send queue, if any.
    pub(crate) fn invalidating_grant(&self) -> Option<u32> {
        self.sq.iter().find_map(|&(id, _)| match id {
            WorkId::Invalidate(grant) => Some(grant),
            _ => None,
        })
    }

    fn assert_no_read(&self, grant: u32) {
        assert!(
            !self.sq.iter().any(|&(id, _)| id == WorkId::Read(grant)),
            "buffer handed on while a READ still writes it"
        );
    }

    /// The grants the READs in the send queue land in, one entry per READ.
    pub(crate) fn reading_grants(&self) -> Vec<u32> {
        self.sq
            .iter()
            .filter_map(|&(id, _)| match id {
                WorkId::Read(grant) => Some(grant),
                _ => None,
            })
            .collect()
    }

    /// Large bodies handed up.
    pub(crate) fn large_delivered(&self) -> usize {
        self.large.delivered.len()
    }

    /// The queue pair went to the error state: posted work requests will complete only as
    /// the test says (flushed), nothing is in flight on the wire, and no window can be
    /// written through any more.
    pub(crate) fn qp_error(&mut self) {
        self.sq.clear();
        self.wire.clear();
        self.send_cq.clear();
        self.large.revoke_all_windows();
    }

    /// Executes an action of the large-body path.
    pub(super) fn exec_large(&mut self, action: Action) {
        match action {
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
                assert!(
                    !self.sq.iter().any(|&(id, _)| id == WorkId::Write(transfer)),
                    "source buffer returned while a WRITE still reads it"
                );
                assert!(
                    !self
                        .sq
                        .iter()
                        .any(|&(id, _)| id == WorkId::InvalidateSource(transfer)),
                    "source buffer returned while its window is being invalidated"
                );
                self.free_source(transfer);
                self.large.done += 1;
            }
            Action::TransferFailed {
                transfer,
                call_id,
                status,
                ..
            } => {
                self.free_source(transfer);
                self.large.failed.push((call_id, status));
            }
            Action::GrantNeeded { body, len } => {
                if self.large.budget.is_some_and(|b| self.large.lent + len > b) {
                    let budget = self.large.budget.unwrap_or(0);
                    self.conn.refuse(body, Code::ResourceExhausted, budget);
                } else {
                    let (addr, rkey) = self.large.new_window(len);
                    match self.conn.grant(body, addr, rkey, len) {
                        Some(grant) => self.large.lend(grant, addr, rkey, len),
                        None => self.large.forget_window(addr, rkey),
                    }
                }
                // Actions the answer produced run after the ones already queued.
                self.absorb();
            }
            Action::ReadNeeded { body, len } => {
                if self.large.budget.is_some_and(|b| self.large.lent + len > b) {
                    let budget = self.large.budget.unwrap_or(0);
                    self.conn.refuse(body, Code::ResourceExhausted, budget);
                } else {
                    let addr = self.large.alloc(len);
                    match self
                        .conn
                        .read_into(body, LocalBuffer { addr, lkey: 1 }, len)
                    {
                        Some(grant) => {
                            self.large.lent += len;
                            self.large.read_grants.insert(grant, addr);
                        }
                        None => {
                            self.large.mem.remove(&addr);
                        }
                    }
                }
                self.absorb();
            }
            Action::PostRead(r) => {
                let base = self.large.read_grants[&r.grant];
                let dst = &self.large.mem[&base];
                assert!(
                    r.local_addr - base + u64::from(r.len) <= dst.len() as u64,
                    "READ destination outside its buffer"
                );
                self.push_sq(WorkId::Read(r.grant), true);
                self.wire.push_back(Wire::Read(r));
            }
            Action::BindSource { transfer, len } => {
                let rkey = self.large.source_windows[&transfer];
                assert_eq!(self.large.windows[&rkey].len, len);
                self.push_sq(WorkId::BindSource(transfer), true);
                self.wire
                    .push_back(Wire::Local(WorkId::BindSource(transfer), Some(rkey)));
            }
            Action::InvalidateSource { transfer, rkey } => {
                assert_eq!(self.large.source_windows[&transfer], rkey);
                self.push_sq(WorkId::InvalidateSource(transfer), true);
                self.wire
                    .push_back(Wire::Local(WorkId::InvalidateSource(transfer), Some(rkey)));
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
                let addr = match self.large.read_grants.remove(&grant) {
                    Some(addr) => {
                        self.assert_no_read(grant);
                        self.large.read += 1;
                        addr
                    }
                    None => {
                        let (addr, rkey) = self.large.grants.remove(&grant).expect("known grant");
                        assert!(
                            !self.large.windows[&rkey].valid,
                            "body handed up while still remotely writable"
                        );
                        addr
                    }
                };
                let buf = self.large.mem.remove(&addr).expect("granted buffer");
                let len = header.message_len();
                assert!(matches!(
                    header.kind,
                    FrameKind::Request | FrameKind::Response | FrameKind::Message
                ));
                let seed = pattern_seed(&header);
                for (i, &b) in buf[..len as usize].iter().enumerate() {
                    assert_eq!(b, pattern(seed, i), "large body corrupted");
                }
                self.large.lent -= buf.len() as u64;
                self.large.delivered.push((header.call_id, len));
                if header.kind == FrameKind::Message {
                    self.large
                        .messages
                        .push((header.call_id, header.seq(), len));
                }
            }
            Action::ReleaseGrant { grant } => {
                let addr = match self.large.read_grants.remove(&grant) {
                    Some(addr) => {
                        self.assert_no_read(grant);
                        addr
                    }
                    None => {
                        let (addr, rkey) = self.large.grants.remove(&grant).expect("known grant");
                        assert!(
                            !self.large.windows[&rkey].valid,
                            "buffer reused while still remotely writable"
                        );
                        addr
                    }
                };
                let buf = self.large.mem.remove(&addr).expect("granted buffer");
                self.large.lent -= buf.len() as u64;
                self.large.released += 1;
            }
            other => unreachable!("not a large-body action: {other:?}"),
        }
    }
}

/// What a body's bytes are derived from: its call, and a stream message's place, so that a
/// message written into another message's buffer is caught.
fn pattern_seed(notice: &Header) -> u64 {
    match notice.kind {
        FrameKind::Message => notice.call_id + 77 * u64::from(notice.seq()),
        _ => notice.call_id,
    }
}

/// A WRITE arrives at `to`: it lands only through a valid window, in its range.
pub(super) fn transmit_write(from: &mut Endpoint, to: &mut Endpoint, w: WriteWork) {
    let window = to.large.windows.get(&w.rkey).copied();
    let fits = window.is_some_and(|win| {
        win.valid
            && w.remote_addr >= win.addr
            && w.remote_addr + u64::from(w.len) <= win.addr + win.len
    });
    if !fits {
        // A real responder NAKs and both QPs go to the error state.
        to.large.access_errors += 1;
        return;
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
}

/// A READ of `from` executes at `to`: it reads only through a valid window, in its range.
pub(super) fn transmit_read(from: &mut Endpoint, to: &mut Endpoint, r: ReadWork) {
    let window = to.large.windows.get(&r.rkey).copied();
    let fits = window.is_some_and(|win| {
        win.valid
            && r.remote_addr >= win.addr
            && r.remote_addr + u64::from(r.len) <= win.addr + win.len
    });
    if !fits {
        from.large.access_errors += 1;
        return;
    }
    let win = window.expect("checked");
    let src_at = (r.remote_addr - win.addr) as usize;
    let data = to.large.mem[&win.addr][src_at..src_at + r.len as usize].to_vec();
    let base = from.large.read_grants[&r.grant];
    let dst = from.large.mem.get_mut(&base).expect("read buffer");
    let dst_at = (r.local_addr - base) as usize;
    dst[dst_at..dst_at + data.len()].copy_from_slice(&data);
    from.send_cq.push_back(WorkId::Read(r.grant));
}

/// A local operation (bind or invalidation) of `from` takes effect and completes.
pub(super) fn finish_local(from: &mut Endpoint, id: WorkId, rkey: Option<u32>) {
    let window = rkey.and_then(|k| from.large.windows.get_mut(&k));
    let window = window.expect("local operation on a known window");
    window.valid = matches!(id, WorkId::Bind(_) | WorkId::BindSource(_));
    from.send_cq.push_back(id);
}
