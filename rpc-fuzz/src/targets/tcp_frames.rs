//! The TCP frame reader: a byte stream cut into arbitrary reads yields frames, a wait for
//! more, or a named error; never a panic, and never a frame beyond the payload limit.
//!
//! Input: the payload limit (2 bytes, little-endian), a byte that sets where the stream is
//! cut into reads, then the stream.

use bytes::BytesMut;
use rpc_core::body::RawBody;
use rpc_core::frame::OutgoingFrame;
use rpc_core::stream::batch::payload_limit;
use rpc_core::{FrameKind, Header, MetadataMap};
use rpc_transport_tcp::codec::{Decoded, FrameDecoder, FrameWriter};

pub(crate) fn run(data: &[u8]) {
    let [a, b, cut, stream @ ..] = data else {
        return;
    };
    let max_payload = usize::from(u16::from_le_bytes([*a, *b]));
    let mut decoder = FrameDecoder::new(max_payload);
    let mut buf = BytesMut::new();
    let mut rest = stream;
    // Reads of 1 to 64 bytes, in a pattern the cut byte picks.
    let mut state = u32::from(*cut) | 1;
    while !rest.is_empty() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let n = ((state >> 16) as usize % 64 + 1).min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(Decoded::Frame(frame))) => {
                    let limit = payload_limit(frame.header.kind, max_payload);
                    assert!(frame.payload.len() <= limit, "a frame beyond the limit");
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// A request, a response with metadata and a stream message, back to back.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let mut metadata = MetadataMap::new();
    metadata.insert("key", "value").expect("fits");
    let empty = MetadataMap::new();
    let frames = [
        (Header::new(FrameKind::Request, 1), &empty, &b"request"[..]),
        (
            Header::new(FrameKind::Response, 1),
            &metadata,
            &b"answer"[..],
        ),
        (
            Header::stream(FrameKind::Message, 3, 1),
            &empty,
            &[7u8; 40][..],
        ),
    ];
    let mut writer = FrameWriter::new(vec![0x00, 0x04, 0x2a]);
    for (header, metadata, payload) in frames {
        let body = RawBody(payload);
        let frame = OutgoingFrame::new(header, metadata, &body).expect("fits");
        writer.write(&frame).expect("a Vec takes every write");
    }
    vec![writer.into_inner()]
}
