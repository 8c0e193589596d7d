//! Frame decoding and encoding, with no I/O: bytes in, frames out.
//!
//! [`FrameDecoder`] takes whatever bytes arrived (any chunking) and yields whole frames; the
//! buffer it decodes from grows only with bytes that actually arrived, never with what a
//! header claims, and a frame over the payload limit is skipped as its bytes arrive instead
//! of being buffered.

use std::io::{self, Write};

use bytes::{Buf, Bytes, BytesMut};
use rpc_core::frame::{InboundFrame, OutgoingFrame};
use rpc_core::stream::batch::payload_limit;
use rpc_core::{Header, HeaderError, COMPACT_HEADER_LEN, MAX_METADATA_LEN};

/// Initial capacity of a write buffer.
const WRITE_CHUNK: usize = 64 * 1024;
/// A write buffer grown beyond this by a large message is shrunk back afterwards.
const WRITE_BUFFER_KEEP: usize = 1024 * 1024;

/// Why decoding stopped the connection: the peer is not speaking our protocol.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The socket failed or closed mid-frame.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer sent a header that fails validation.
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

/// What decoding produced.
#[derive(Debug)]
pub enum Decoded {
    /// A complete frame.
    Frame(InboundFrame),
    /// A frame whose payload exceeds the limit. Its header is all that was kept; the rest of
    /// its bytes are discarded as they arrive.
    Oversized {
        /// The frame's header.
        header: Header,
        /// Its declared payload size.
        declared: u64,
    },
}

/// Incremental frame decoder of one connection (sans-IO).
///
/// Frames are `Bytes` views of the read buffer, so a frame costs no copy after the socket
/// read.
#[derive(Debug)]
pub struct FrameDecoder {
    max_payload: usize,
    /// Bytes of a refused frame still to be discarded.
    skipping: u64,
    /// The header of the frame being assembled, once its bytes are in.
    pending: Option<(Header, usize)>,
}

impl FrameDecoder {
    /// A decoder accepting payloads up to `max_payload` bytes (and `Messages` frames up to
    /// [`rpc_core::stream::batch::MESSAGES_FRAME_LIMIT`] whatever `max_payload`).
    pub fn new(max_payload: usize) -> Self {
        FrameDecoder {
            max_payload,
            skipping: 0,
            pending: None,
        }
    }

    /// Takes the next frame out of `buf`. `Ok(None)`: `buf` holds no whole frame yet (what
    /// it holds stays for the next call).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Decoded>, ReadError> {
        if self.skipping > 0 {
            let n = (buf.len() as u64).min(self.skipping);
            buf.advance(n as usize);
            self.skipping -= n;
            if self.skipping > 0 {
                return Ok(None);
            }
        }
        let (header, header_len) = match self.pending {
            Some(pending) => pending,
            None => {
                // Every header starts with the compact form's 32 bytes, which tell its length.
                if buf.len() < COMPACT_HEADER_LEN {
                    return Ok(None);
                }
                let header_len = Header::wire_len(buf)?;
                if buf.len() < header_len {
                    return Ok(None);
                }
                let header = self.check(Header::decode(&buf[..header_len])?)?;
                let payload_len = header.payload_len as usize;
                if payload_len > payload_limit(header.kind, self.max_payload) {
                    let total = header_len as u64
                        + u64::from(header.metadata_len)
                        + u64::from(header.payload_len);
                    let n = (buf.len() as u64).min(total);
                    buf.advance(n as usize);
                    self.skipping = total - n;
                    return Ok(Some(Decoded::Oversized {
                        header,
                        declared: payload_len as u64,
                    }));
                }
                self.pending = Some((header, header_len));
                (header, header_len)
            }
        };
        let meta_len = header.metadata_len as usize;
        let total = header_len + meta_len + header.payload_len as usize;
        if buf.len() < total {
            return Ok(None);
        }
        self.pending = None;
        let mut frame = buf.split_to(total);
        frame.advance(header_len);
        // Most frames carry no metadata: no view (and no reference count) for it then.
        let metadata = match meta_len {
            0 => Bytes::new(),
            _ => frame.split_to(meta_len).freeze(),
        };
        let payload: Bytes = frame.freeze();
        Ok(Some(Decoded::Frame(InboundFrame {
            header,
            metadata,
            payload,
        })))
    }

    /// Bytes still missing before the next [`FrameDecoder::decode`] can make progress, given
    /// what `buf` holds: a sizing hint for the next read.
    pub fn missing(&self, buf: &BytesMut) -> usize {
        if self.skipping > 0 {
            return 0;
        }
        let need = match self.pending {
            Some((header, header_len)) => {
                header_len + header.metadata_len as usize + header.payload_len as usize
            }
            None => COMPACT_HEADER_LEN,
        };
        need.saturating_sub(buf.len())
    }

    /// Whether part of a frame has arrived (or is being skipped) but not all of it.
    pub fn mid_frame(&self, buf: &BytesMut) -> bool {
        self.skipping > 0 || !buf.is_empty()
    }

    fn check(&self, header: Header) -> Result<Header, ReadError> {
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
        Ok(header)
    }
}

/// Writes frames to a blocking stream through one reused buffer (raw peers in tests and
/// benchmarks; the transport itself never blocks on a socket).
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
            buf: Vec::with_capacity(WRITE_CHUNK),
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
            self.buf = Vec::with_capacity(WRITE_CHUNK);
        }
        result
    }

    /// The stream.
    pub fn into_inner(self) -> W {
        self.stream
    }
}

#[cfg(test)]
mod tests;
