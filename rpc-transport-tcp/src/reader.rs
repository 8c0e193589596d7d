//! The receiving side of a connection: the bytes read and not yet handed up, the frame
//! decoder, and the run of stream messages being gathered.
//!
//! One thread at a time holds it (the connection's `reader` lock) and reads the socket:
//! the event loop's reader task, or, on a client, a blocking caller waiting for its answer
//! (`Conn::read_for_caller`), which then needs no wake-up from the event loop. Nothing here
//! waits: the task does its waiting (readiness, deadlines, room in the output queue)
//! between turns, without the lock.

use std::io;

use bytes::BytesMut;
use rpc_core::frame::InboundFrame;
use rpc_core::stream::{is_message_frame, Wakes};
use rpc_core::{Inbound, Status};
use tokio::time::Instant;

use crate::codec::{Decoded, FrameDecoder};

/// Most bytes one read asks for: frames smaller than this arrive in one read, larger ones
/// grow their buffer with the bytes that arrive.
const READ_CHUNK: usize = 64 * 1024;
/// Fewest bytes a read asks for (a header and a small message). A reader whose reads fill
/// what they asked for asks for twice as much next time, up to [`READ_CHUNK`], and for
/// half as much again when a read brings less than a quarter: busy connections take a
/// burst of small frames in one system call, idle ones keep small buffers.
const MIN_READ: usize = 4 * 1024;
/// Room a quiet connection's read makes do with when the buffer cannot be reclaimed for
/// more.
const MIN_ROOM: usize = 512;
/// Frames the reader task delivers (running inline handlers) before it lets the other
/// tasks of its thread run; a run of stream messages counts as one.
pub(crate) const FRAMES_PER_TURN: u32 = 16;
/// Most messages of one stream handed up at once (one lookup of the stream and one hold of
/// its lock for the run): long enough to amortize both, short enough that the stream's
/// reader never waits long for the lock.
const MAX_RUN: usize = 64;

/// Why a turn of handing up frames stopped.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Every whole frame read so far is handed up; `delivered` says how many deliveries
    /// that took.
    Drained { delivered: u32 },
    /// [`FRAMES_PER_TURN`] deliveries were made; more frames may be buffered.
    Yield,
    /// The output queue has no room (servers pause reading then): nothing more is handed
    /// up until it has.
    Full,
    /// The connection is over: why, and whether the peer broke a limit (it is reset then).
    End(Status, bool),
}

/// See the module documentation.
pub(crate) struct Reader {
    decoder: FrameDecoder,
    buf: BytesMut,
    /// Consecutive messages of one stream, handed up together.
    run: Run,
    read_size: usize,
    /// Frames decoded since the last read.
    decoded: u32,
    /// When the frame being received started to arrive.
    pub(crate) frame_started: Option<Instant>,
    /// When the last bytes arrived (or the idle clock was last restarted).
    pub(crate) last_heard: Instant,
    /// The connection ended under a caller's read: the reader task, told so, reports it.
    pub(crate) ended: Option<(Status, bool)>,
    /// Deliveries made so far, by whoever held the reader.
    pub(crate) deliveries: u64,
}

impl Reader {
    /// A reader accepting payloads up to `max_payload` bytes.
    pub(crate) fn new(max_payload: usize) -> Reader {
        Reader {
            decoder: FrameDecoder::new(max_payload),
            buf: BytesMut::new(),
            run: Run::default(),
            read_size: MIN_READ,
            decoded: 0,
            frame_started: None,
            last_heard: Instant::now(),
            ended: None,
            deliveries: 0,
        }
    }

    /// Takes `first` as read already (the start of the first frame, read by a handshake).
    pub(crate) fn prime(&mut self, first: &[u8]) {
        self.buf.extend_from_slice(first);
    }

    /// Hands up the whole frames read so far, in order, until they are all handed up, a
    /// turn's deliveries are made (with `yield_every`), or `room` says the output queue is
    /// full. Wake-ups of streams' readers gather in `wakes` (woken by the caller, once it
    /// dropped the lock). `peer` names the connection in errors.
    pub(crate) fn deliver(
        &mut self,
        inbound: &dyn Inbound,
        wakes: &mut Wakes,
        yield_every: Option<u32>,
        room: impl Fn() -> bool,
        peer: &str,
    ) -> Turn {
        // This turn's deliveries, counted in `deliveries` whichever way the turn stops.
        let start = self.deliveries;
        let delivered = |reader: &Reader| (reader.deliveries - start) as u32;
        loop {
            if !room() {
                // Between frames, so that a burst of requests read at once stops at the
                // first whose answer would find the queue full.
                self.hand_up_run(inbound, wakes);
                return Turn::Full;
            }
            let before = delivered(self);
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(Decoded::Frame(frame))) if is_message_frame(frame.header.kind) => {
                    if let Some(frame) = self.run.push(frame) {
                        self.hand_up_run(inbound, wakes);
                        self.run.push(frame);
                    }
                    if self.run.frames.len() >= MAX_RUN {
                        self.hand_up_run(inbound, wakes);
                    }
                }
                Ok(Some(Decoded::Frame(frame))) => {
                    self.hand_up_run(inbound, wakes);
                    self.deliveries += 1;
                    if let Err(status) = inbound.on_frame(frame, wakes) {
                        return Turn::End(status, false);
                    }
                }
                Ok(Some(Decoded::Oversized { header, declared })) => {
                    self.hand_up_run(inbound, wakes);
                    self.deliveries += 1;
                    inbound.on_oversized(&header, declared);
                }
                Ok(None) => break,
                Err(e) => {
                    let status = Status::unavailable(format!("{peer} sent garbage: {e}"));
                    return Turn::End(status, true);
                }
            }
            self.decoded += 1;
            if let Some(every) = yield_every {
                let now = delivered(self);
                if now > before && now.is_multiple_of(every) {
                    // Inline handlers ran: the task lets the other connections of its
                    // thread in.
                    return Turn::Yield;
                }
            }
        }
        self.hand_up_run(inbound, wakes);
        if !self.decoder.mid_frame(&self.buf) {
            self.frame_started = None;
        } else if self.decoded > 0 || self.frame_started.is_none() {
            // A new frame began in the bytes of the last read.
            self.frame_started = Some(self.last_heard);
        }
        self.decoded = 0;
        Turn::Drained {
            delivered: delivered(self),
        }
    }

    /// Hands up the run of stream messages gathered, counting it in `deliveries`.
    fn hand_up_run(&mut self, inbound: &dyn Inbound, wakes: &mut Wakes) {
        self.deliveries += u64::from(self.run.hand_up(inbound, wakes));
    }

    /// Reads what the socket holds with `recv` (into the buffer's spare capacity, returning
    /// the bytes it put there), asking for as much as the frame being received still
    /// needs, within the adaptive read size.
    pub(crate) fn read(
        &mut self,
        recv: impl FnOnce(&mut BytesMut) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let want = self
            .decoder
            .missing(&self.buf)
            .clamp(self.read_size, READ_CHUNK);
        // Frames handed up may still hold the buffer (an answer its caller is reading): a
        // quiet connection (reads at their smallest) reads into the room left while it
        // holds a header and a small message and the frame being received fits, rather
        // than taking a new buffer for every read meanwhile. A busy one takes a new buffer
        // of the full read size.
        let room = self.buf.capacity() - self.buf.len();
        let make_do = self.read_size == MIN_READ
            && room >= MIN_ROOM
            && self.decoder.missing(&self.buf) <= room;
        if room < want && !self.buf.try_reclaim(want) && !make_do {
            self.buf.reserve(want);
        }
        let room = self.buf.capacity() - self.buf.len();
        let read = recv(&mut self.buf);
        if let Ok(n) = read {
            // A read into less room than it asked for says nothing of the read size.
            if n == room && room >= want {
                self.read_size = (self.read_size * 2).min(READ_CHUNK);
            } else if n < self.read_size / 4 {
                self.read_size = (self.read_size / 2).max(MIN_READ);
            }
            if n > 0 {
                self.last_heard = Instant::now();
            }
        }
        read
    }

    /// Why the connection ended when the peer closed it: whether it cut a frame short.
    pub(crate) fn end_of_stream(&self, peer: &str) -> Status {
        let how = if self.decoder.mid_frame(&self.buf) {
            "closed the connection mid-frame"
        } else {
            "closed the connection"
        };
        Status::unavailable(format!("{peer} {how}"))
    }
}

/// Consecutive `Message` and `Messages` frames of one stream, read and not yet handed up.
#[derive(Debug, Default)]
pub(crate) struct Run {
    frames: Vec<InboundFrame>,
}

impl Run {
    /// Adds `frame` to the run; gives it back if it belongs to another stream than the run.
    fn push(&mut self, frame: InboundFrame) -> Option<InboundFrame> {
        match self.frames.last() {
            Some(last) if last.header.call_id != frame.header.call_id => Some(frame),
            _ => {
                self.frames.push(frame);
                None
            }
        }
    }

    /// Hands the run up, if there is one: before any other frame, so that frames reach the
    /// upper layer in the order they came.
    /// Returns the deliveries made (0 or 1).
    fn hand_up(&mut self, inbound: &dyn Inbound, wakes: &mut Wakes) -> u32 {
        let Some(first) = self.frames.first() else {
            return 0;
        };
        inbound.on_messages(first.header.call_id, &mut self.frames, wakes);
        self.frames.clear();
        1
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use parking_lot::Mutex;
    use rpc_core::{FrameKind, Header};

    /// Records what it is handed: `(call id, seqs)` per delivery.
    #[derive(Default)]
    pub(crate) struct Recorder(pub(crate) Mutex<Vec<(u64, Vec<u32>)>>);

    impl Inbound for Recorder {
        fn on_frame(&self, frame: InboundFrame, _: &mut Wakes) -> Result<(), Status> {
            let seq = frame.header.seq();
            self.0.lock().push((frame.header.call_id, vec![seq]));
            Ok(())
        }
        fn on_messages(&self, call_id: u64, run: &mut Vec<InboundFrame>, _: &mut Wakes) {
            let seqs = run.drain(..).map(|f| f.header.seq()).collect();
            self.0.lock().push((call_id, seqs));
        }
        fn on_oversized(&self, _: &Header, _: u64) {}
        fn on_dropped(&self, _: u64, _: FrameKind) {}
        fn on_transfer_failed(&self, _: u64, _: FrameKind, _: Status) {}
        fn idle(&self) -> bool {
            true
        }
        fn on_closed(&self, _: Status) {}
    }

    fn frame(kind: FrameKind, call_id: u64, seq: u32) -> InboundFrame {
        InboundFrame {
            header: Header::stream(kind, call_id, seq),
            metadata: Default::default(),
            payload: Default::default(),
        }
    }

    /// Messages of one stream that follow each other go up as one run; a message of
    /// another stream, or any other frame, ends the run first, so every frame reaches the
    /// upper layer in the order it came.
    #[test]
    fn runs_of_one_streams_messages_go_up_together_and_in_order() {
        let inbound = Recorder::default();
        let mut wakes = Wakes::new();
        let mut run = Run::default();
        let mut delivered = 0;
        for (call, seq) in [(1, 1), (1, 2), (1, 3), (2, 1), (1, 4)] {
            if let Some(frame) = run.push(frame(FrameKind::Message, call, seq)) {
                delivered += run.hand_up(&inbound, &mut wakes);
                assert!(run.push(frame).is_none(), "an empty run takes any stream");
            }
        }
        delivered += run.hand_up(&inbound, &mut wakes);
        inbound
            .on_frame(frame(FrameKind::Trailers, 1, 5), &mut wakes)
            .unwrap();
        assert_eq!(
            run.hand_up(&inbound, &mut wakes),
            0,
            "nothing left to hand up"
        );
        assert_eq!(delivered, 3);
        assert_eq!(
            *inbound.0.lock(),
            [(1, vec![1, 2, 3]), (2, vec![1]), (1, vec![4]), (1, vec![5]),]
        );
    }

    /// Bytes of a request frame with `payload`.
    fn encoded(payload: &[u8]) -> Vec<u8> {
        let mut header = Header::new(FrameKind::Request, 1);
        header.payload_len = payload.len() as u32;
        let mut bytes = vec![0u8; rpc_core::HEADER_LEN];
        let len = header.encode(&mut bytes);
        bytes.truncate(len);
        bytes.extend_from_slice(payload);
        bytes
    }

    /// A read while the last frame is still held (an answer its caller reads) goes into the
    /// room the buffer has left, not into a new buffer; one with less room than
    /// [`MIN_ROOM`] left takes a new one.
    #[test]
    fn a_held_frame_costs_no_new_buffer_while_room_is_left() {
        let mut reader = Reader::new(1 << 20);
        let first = encoded(&[1; 32]);
        let read = |bytes: &[u8]| {
            let bytes = bytes.to_vec();
            move |buf: &mut BytesMut| {
                buf.extend_from_slice(&bytes);
                Ok(bytes.len())
            }
        };
        reader.read(read(&first)).unwrap();
        let Ok(Some(Decoded::Frame(held))) = reader.decoder.decode(&mut reader.buf) else {
            panic!("a whole frame was read");
        };
        let next = reader.buf.as_ptr();
        reader.read(read(&encoded(&[2; 32]))).unwrap();
        assert_eq!(
            reader.buf.as_ptr(),
            next,
            "the read took a new buffer though the held one had room"
        );
        // Fill the buffer up to less than MIN_ROOM: then a new buffer is taken.
        let room = reader.buf.capacity() - reader.buf.len();
        let filler = encoded(&vec![3; room - rpc_core::COMPACT_HEADER_LEN - MIN_ROOM / 2]);
        let filler_len = filler.len();
        reader
            .read(move |buf: &mut BytesMut| {
                buf.extend_from_slice(&filler);
                Ok(filler_len)
            })
            .unwrap();
        assert!(reader.buf.capacity() - reader.buf.len() < MIN_ROOM);
        let before = reader.buf.as_ptr();
        reader.read(|_: &mut BytesMut| Ok(0)).unwrap();
        assert_ne!(
            reader.buf.as_ptr(),
            before,
            "no room left, and none reclaimed"
        );
        drop(held);
    }
}
