//! Frame reading and writing over a byte stream.

use std::io::{self, Read, Write};

use bytes::{Bytes, BytesMut};
use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::{Header, HeaderError, COMPACT_HEADER_LEN, MAX_METADATA_LEN};

/// Initial capacity of the read and write buffers.
const READ_CHUNK: usize = 64 * 1024;
/// Size of the scratch buffer small reads go through, so small frames arrive in few
/// syscalls without zero-filling fresh memory for every read.
const SCRATCH: usize = 16 * 1024;
/// A write buffer grown beyond this by a large message is shrunk back afterwards.
const WRITE_BUFFER_KEEP: usize = 1024 * 1024;

/// Why reading a frame stopped the connection.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The socket failed or closed mid-frame.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer sent a header that fails validation: it is not speaking our protocol.
    #[error("protocol violation: {0}")]
    Header(#[from] HeaderError),
    /// The peer sent a frame only the RDMA transport defines (rendezvous, placed body).
    #[error("protocol violation: {kind:?} frame with flags 0x{flags:04x} is RDMA-only")]
    RdmaOnly {
        /// Kind of the frame.
        kind: rpc_core::FrameKind,
        /// Its flag bits.
        flags: u16,
    },
    /// The peer declared more metadata than any peer may send.
    #[error("protocol violation: {len} bytes of metadata (limit {MAX_METADATA_LEN})")]
    MetadataTooLarge {
        /// Declared metadata length.
        len: u32,
    },
}

/// What one read produced.
#[derive(Debug)]
pub enum Inbound {
    /// A complete frame.
    Frame(InboundFrame),
    /// A frame whose payload exceeded the limit; its bytes were skipped.
    Oversized {
        /// The frame's header.
        header: Header,
        /// Its declared payload size.
        declared: u64,
    },
}

/// Reads frames from a stream into shared buffers: each frame's metadata and payload are
/// `Bytes` views of one read buffer, so a frame costs no copy after the socket read.
#[derive(Debug)]
pub struct FrameReader<R> {
    stream: R,
    buf: BytesMut,
    scratch: Box<[u8]>,
    max_payload: usize,
}

impl<R: Read> FrameReader<R> {
    /// A reader accepting payloads up to `max_payload` bytes.
    pub fn new(stream: R, max_payload: usize) -> Self {
        FrameReader {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
            scratch: vec![0; SCRATCH].into_boxed_slice(),
            max_payload,
        }
    }

    /// The next frame, or `None` on a clean end of stream between frames.
    pub fn read(&mut self) -> Result<Option<Inbound>, ReadError> {
        // Every header starts with the compact form's 32 bytes, which tell its length.
        if !self.fill(COMPACT_HEADER_LEN)? {
            return Ok(None);
        }
        let header_len = Header::wire_len(&self.buf)?;
        if !self.fill(header_len)? {
            return Err(unexpected_eof().into());
        }
        let header = Header::decode(&self.buf[..header_len])?;
        if header.is_rdma_only() {
            return Err(ReadError::RdmaOnly {
                kind: header.kind,
                flags: header.flags.bits(),
            });
        }
        if header.metadata_len as usize > MAX_METADATA_LEN {
            return Err(ReadError::MetadataTooLarge {
                len: header.metadata_len,
            });
        }
        let meta_len = header.metadata_len as usize;
        let payload_len = header.payload_len as usize;
        if payload_len > self.max_payload {
            self.skip(header_len + meta_len + payload_len)?;
            return Ok(Some(Inbound::Oversized {
                header,
                declared: payload_len as u64,
            }));
        }
        let total = header_len + meta_len + payload_len;
        if !self.fill(total)? {
            return Err(unexpected_eof().into());
        }
        let mut frame = self.buf.split_to(total);
        let _header_bytes = frame.split_to(header_len);
        let metadata = frame.split_to(meta_len).freeze();
        let payload: Bytes = frame.freeze();
        Ok(Some(Inbound::Frame(InboundFrame {
            header,
            metadata,
            payload,
        })))
    }

    /// Reads until `want` bytes are buffered. False on end of stream before any byte.
    fn fill(&mut self, want: usize) -> Result<bool, ReadError> {
        while self.buf.len() < want {
            let had = self.buf.len();
            let n = if want - had >= SCRATCH {
                // A large payload: read straight into its place. The zero-fill is as large as
                // the data, and it avoids a second copy.
                self.buf.resize(want, 0);
                let n = read_retrying(&mut self.stream, &mut self.buf[had..])
                    .inspect_err(|_| self.buf.truncate(had))?;
                self.buf.truncate(had + n);
                n
            } else {
                // Small reads go through the initialized scratch buffer: one copy of the bytes
                // that arrived instead of zeroing a fresh chunk per read.
                let n = read_retrying(&mut self.stream, &mut self.scratch)?;
                self.buf.extend_from_slice(&self.scratch[..n]);
                n
            };
            if n == 0 {
                if had == 0 {
                    return Ok(false);
                }
                return Err(unexpected_eof().into());
            }
        }
        Ok(true)
    }

    /// Discards `len` bytes (a refused frame) without buffering them.
    fn skip(&mut self, len: usize) -> Result<(), ReadError> {
        let buffered = self.buf.len().min(len);
        let _ = self.buf.split_to(buffered);
        let rest = (len - buffered) as u64;
        let copied = io::copy(&mut (&mut self.stream).take(rest), &mut io::sink())?;
        if copied < rest {
            return Err(unexpected_eof().into());
        }
        Ok(())
    }
}

fn read_retrying(stream: &mut impl Read, into: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(into) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn unexpected_eof() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "peer closed the connection mid-frame",
    )
}

/// Writes frames through one reused buffer: the message encodes itself into the buffer the
/// socket write reads from.
#[derive(Debug)]
pub struct FrameWriter<W> {
    stream: W,
    buf: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    /// A writer on `stream`.
    pub fn new(stream: W) -> Self {
        FrameWriter {
            stream,
            buf: Vec::with_capacity(READ_CHUNK),
        }
    }

    /// Encodes and writes one frame.
    pub fn write(&mut self, frame: &OutgoingFrame<'_>) -> io::Result<()> {
        let len = frame.len();
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        frame.write_to(&mut self.buf[..len]);
        let result = self.stream.write_all(&self.buf[..len]);
        if self.buf.capacity() > WRITE_BUFFER_KEEP {
            self.buf = Vec::with_capacity(READ_CHUNK);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_core::body::RawBody;
    use rpc_core::{FrameKind, MetadataMap};

    fn encode(call_id: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut md = MetadataMap::new();
        md.insert("k", "v").unwrap();
        let body = RawBody(payload);
        let frame =
            OutgoingFrame::new(Header::new(FrameKind::Request, call_id), &md, &body).unwrap();
        FrameWriter::new(&mut out).write(&frame).unwrap();
        out
    }

    #[test]
    fn reads_back_to_back_frames() {
        let mut wire = encode(1, b"hello");
        wire.extend(encode(2, &[7u8; 100_000]));
        let mut reader = FrameReader::new(&wire[..], 1 << 20);
        let Some(Inbound::Frame(a)) = reader.read().unwrap() else {
            panic!("frame expected")
        };
        assert_eq!((a.header.call_id, &a.payload[..]), (1, &b"hello"[..]));
        assert_eq!(a.decode_metadata().unwrap().get("k"), Some(&b"v"[..]));
        let Some(Inbound::Frame(b)) = reader.read().unwrap() else {
            panic!("frame expected")
        };
        assert_eq!(b.payload.len(), 100_000);
        assert!(reader.read().unwrap().is_none(), "clean end of stream");
    }

    #[test]
    fn skips_oversized_payloads_and_stays_in_sync() {
        let mut wire = encode(1, &[1u8; 5000]);
        wire.extend(encode(2, b"ok"));
        let mut reader = FrameReader::new(&wire[..], 4096);
        match reader.read().unwrap() {
            Some(Inbound::Oversized { header, declared }) => {
                assert_eq!((header.call_id, declared), (1, 5000));
            }
            other => panic!("expected oversized, got {other:?}"),
        }
        let Some(Inbound::Frame(ok)) = reader.read().unwrap() else {
            panic!("frame expected")
        };
        assert_eq!(&ok.payload[..], b"ok");
    }

    #[test]
    fn truncated_and_garbage_input_are_errors_not_panics() {
        let wire = encode(1, b"hello");
        let mut reader = FrameReader::new(&wire[..wire.len() - 1], 1 << 20);
        assert!(matches!(reader.read(), Err(ReadError::Io(_))));
        let garbage = [0xABu8; 200];
        let mut reader = FrameReader::new(&garbage[..], 1 << 20);
        assert!(matches!(reader.read(), Err(ReadError::Header(_))));
    }

    #[test]
    fn rdma_only_frames_are_refused() {
        let mut placed = Header::new(FrameKind::Request, 1);
        placed.flags = rpc_core::Flags::LARGE_PAYLOAD;
        placed.payload_len = 1 << 20;
        let wire = placed.to_bytes();
        let mut reader = FrameReader::new(&wire[..], 1 << 30);
        assert!(matches!(
            reader.read(),
            Err(ReadError::RdmaOnly {
                kind: FrameKind::Request,
                flags: 1
            })
        ));
    }
}
