//! Where an endpoint's frames land: its own receive ring and receive queue, or a shared
//! receive queue (SRQ) that several endpoints draw from, with the pool's accounting.
//!
//! The SRQ is modelled as the hardware behaves: one FIFO of posted buffers for all its
//! QPs; an arriving SEND takes the oldest, whatever its connection; none posted is an RNR.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use crate::{Admission, PoolConfig, SharedPool};

/// A shared receive queue: registered buffers, the posted ones in queue order, the pool.
#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) pool: SharedPool,
    posted: VecDeque<u32>,
    mem: Vec<u8>,
    buffer_size: usize,
}

/// A shared receive queue several endpoints hold.
pub(crate) type SharedRq = Rc<RefCell<Srq>>;

impl Srq {
    pub(crate) fn new(config: PoolConfig) -> SharedRq {
        Rc::new(RefCell::new(Srq {
            pool: SharedPool::new(config).expect("pool config"),
            posted: VecDeque::new(),
            mem: Vec::new(),
            buffer_size: config.buffer_size as usize,
        }))
    }

    /// Registers and posts `n` more buffers.
    fn register(&mut self, n: u32) {
        let first = self.pool.buffers();
        self.mem
            .resize(self.mem.len() + n as usize * self.buffer_size, 0);
        self.posted.extend(first..first + n);
        self.pool.add_buffers(n);
    }

    /// Admits a window as the driver does: registering chunks while the pool asks.
    pub(crate) fn admit(&mut self, window: u32) -> Admission {
        loop {
            match self.pool.admit(window) {
                Admission::NeedBuffers(n) => self.register(n),
                answer => return answer,
            }
        }
    }

    /// Commits up to `n` buffers to a growing window, registering more if the pool asks.
    fn grow(&mut self, n: u32) -> u32 {
        let granted = self.pool.grow(n);
        match self.pool.wants_buffers() {
            0 => {}
            more => self.register(more),
        }
        granted
    }

    /// Buffers posted now.
    pub(crate) fn posted(&self) -> usize {
        self.posted.len()
    }

    /// An arriving SEND takes the oldest posted buffer.
    fn take(&mut self) -> Option<u32> {
        self.posted.pop_front()
    }

    fn repost(&mut self, buf: u32) {
        assert!(!self.posted.contains(&buf), "buffer {buf} posted twice");
        self.posted.push_back(buf);
    }

    fn range(&self, buf: u32, len: usize) -> std::ops::Range<usize> {
        assert!(len <= self.buffer_size);
        let at = buf as usize * self.buffer_size;
        at..at + len
    }
}

/// An endpoint's receive side.
#[derive(Debug)]
pub(crate) enum RecvSide {
    /// Its own ring: slot `s` at `s × slot size`, its own receive queue of posted slots.
    Ring { rq: VecDeque<u32>, mem: Vec<u8> },
    /// A shared receive queue; `buf_of[slot]` is the buffer backing a held slot.
    Shared { srq: SharedRq, buf_of: Vec<u32> },
}

impl RecvSide {
    /// Receive queue entries (ring slots or SRQ buffers) an arriving SEND may take: the
    /// endpoint's own, or the whole SRQ's.
    pub(crate) fn posted(&self) -> usize {
        match self {
            RecvSide::Ring { rq, .. } => rq.len(),
            RecvSide::Shared { srq, .. } => srq.borrow().posted(),
        }
    }

    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, RecvSide::Shared { .. })
    }

    /// A `PostRecv` for a ring slot.
    pub(crate) fn post(&mut self, slot: u32) {
        let RecvSide::Ring { rq, .. } = self else {
            panic!("PostRecv {slot} with a shared receive queue");
        };
        assert!(!rq.contains(&slot), "RECV for slot {slot} posted twice");
        rq.push_back(slot);
    }

    /// A SEND of `frame` arrives: it lands in the oldest posted entry, which is returned.
    pub(crate) fn land(&mut self, frame: &[u8], slot_size: u32) -> Option<u32> {
        match self {
            RecvSide::Ring { rq, mem } => {
                let slot = rq.pop_front()?;
                let at = slot as usize * slot_size as usize;
                mem[at..at + frame.len()].copy_from_slice(frame);
                Some(slot)
            }
            RecvSide::Shared { srq, .. } => {
                let mut srq = srq.borrow_mut();
                let buf = srq.take()?;
                let range = srq.range(buf, frame.len());
                srq.mem[range].copy_from_slice(frame);
                Some(buf)
            }
        }
    }

    /// `len` bytes of the entry a completion named (ring slot or SRQ buffer).
    pub(crate) fn entry(&self, entry: u32, len: usize, slot_size: u32) -> Vec<u8> {
        match self {
            RecvSide::Ring { mem, .. } => {
                let at = entry as usize * slot_size as usize;
                mem[at..at + len].to_vec()
            }
            RecvSide::Shared { srq, .. } => {
                let srq = srq.borrow();
                srq.mem[srq.range(entry, len)].to_vec()
            }
        }
    }

    /// The bytes of a held slot.
    pub(crate) fn held(&self, slot: u32, len: usize, slot_size: u32) -> Vec<u8> {
        match self {
            RecvSide::Ring { .. } => self.entry(slot, len, slot_size),
            RecvSide::Shared { buf_of, .. } => self.entry(buf_of[slot as usize], len, slot_size),
        }
    }

    /// The connection took SRQ buffer `buf` as `slot` (it is held now).
    pub(crate) fn hold(&mut self, slot: u32, buf: u32) {
        if let RecvSide::Shared { buf_of, .. } = self {
            buf_of[slot as usize] = buf;
        }
    }

    /// The driver puts an SRQ buffer straight back (a frame the protocol consumed, or one it
    /// refused).
    pub(crate) fn repost(&mut self, buf: u32) {
        if let RecvSide::Shared { srq, .. } = self {
            srq.borrow_mut().repost(buf);
        }
    }

    /// The upper layer released `slot`: with an SRQ its buffer is re-posted first; returns
    /// whether the pool is short (the connection should shrink).
    pub(crate) fn release(&mut self, slot: u32) -> bool {
        match self {
            RecvSide::Ring { .. } => false,
            RecvSide::Shared { srq, buf_of } => {
                let mut srq = srq.borrow_mut();
                srq.repost(buf_of[slot as usize]);
                srq.pool.shrinking()
            }
        }
    }

    /// Commitments that ended go back to the pool.
    pub(crate) fn give_back(&mut self, n: u32) {
        if let RecvSide::Shared { srq, .. } = self {
            srq.borrow_mut().pool.give_back(n);
        }
    }

    /// How many of `n` wanted slots the driver can back: all with a ring (its memory is
    /// registered), what the pool grants with an SRQ.
    pub(crate) fn back(&mut self, n: u32) -> u32 {
        match self {
            RecvSide::Ring { .. } => n,
            RecvSide::Shared { srq, .. } => srq.borrow_mut().grow(n),
        }
    }
}
