use super::*;
use proptest::prelude::*;
use rpc_core::body::RawBody;
use rpc_core::{FrameKind, MetadataMap};

fn encode_request(call_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut md = MetadataMap::new();
    md.insert("k", "v").unwrap();
    let body = RawBody(payload);
    let frame = OutgoingFrame::new(Header::new(FrameKind::Request, call_id), &md, &body).unwrap();
    let mut out = BytesMut::new();
    frame.encode_to(&mut out);
    out.to_vec()
}

/// Feeds `wire` to a decoder in chunks of the given sizes (cycled); returns what came out.
fn decode_chunked(wire: &[u8], chunks: &[usize], limit: usize) -> Vec<Decoded> {
    let mut decoder = FrameDecoder::new(limit);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut at = 0;
    for &chunk in chunks.iter().cycle() {
        let end = (at + chunk.max(1)).min(wire.len());
        buf.extend_from_slice(&wire[at..end]);
        at = end;
        while let Some(inbound) = decoder.decode(&mut buf).unwrap() {
            out.push(inbound);
        }
        if at == wire.len() {
            break;
        }
    }
    assert!(
        !decoder.mid_frame(&buf),
        "bytes left over after the last frame"
    );
    out
}

fn frame(inbound: &Decoded) -> &InboundFrame {
    match inbound {
        Decoded::Frame(frame) => frame,
        other => panic!("frame expected, got {other:?}"),
    }
}

#[test]
fn decodes_back_to_back_frames() {
    let mut wire = encode_request(1, b"hello");
    wire.extend(encode_request(2, &[7u8; 100_000]));
    let out = decode_chunked(&wire, &[wire.len()], 1 << 20);
    assert_eq!(out.len(), 2);
    let (a, b) = (frame(&out[0]), frame(&out[1]));
    assert_eq!((a.header.call_id, &a.payload[..]), (1, &b"hello"[..]));
    assert_eq!(a.decode_metadata().unwrap().get("k"), Some(&b"v"[..]));
    assert_eq!(b.payload.len(), 100_000);
}

#[test]
fn oversized_payloads_are_reported_at_the_header_and_skipped() {
    let mut wire = encode_request(1, &[1u8; 5000]);
    wire.extend(encode_request(2, b"ok"));
    let mut decoder = FrameDecoder::new(4096);
    let mut buf = BytesMut::from(&wire[..100]);
    match decoder.decode(&mut buf).unwrap() {
        Some(Decoded::Oversized { header, declared }) => {
            assert_eq!((header.call_id, declared), (1, 5000));
        }
        other => panic!("expected oversized, got {other:?}"),
    }
    assert!(buf.is_empty(), "the refused frame's bytes are not kept");
    assert!(decoder.mid_frame(&buf), "still skipping");
    buf.extend_from_slice(&wire[100..]);
    let ok = decoder
        .decode(&mut buf)
        .unwrap()
        .expect("frame after the skip");
    assert_eq!(&frame(&ok).payload[..], b"ok");
}

/// A stream frame of `kind` for call 1 with `len` bytes of payload (its content is not
/// the decoder's business).
fn stream_frame(kind: FrameKind, len: usize) -> Vec<u8> {
    let payload = vec![0u8; len];
    let body = RawBody(&payload);
    let header = Header::stream(kind, 1, 1);
    let metadata = MetadataMap::new();
    let frame = OutgoingFrame::new(header, &metadata, &body).unwrap();
    let mut out = BytesMut::new();
    frame.encode_to(&mut out);
    out.to_vec()
}

#[test]
fn a_messages_frame_has_its_own_payload_limit() {
    use rpc_core::stream::batch::MESSAGES_FRAME_LIMIT;
    let decoded = |kind, len| {
        let wire = stream_frame(kind, len);
        let out = decode_chunked(&wire, &[wire.len()], 100);
        match &out[..] {
            [Decoded::Frame(frame)] => Ok(frame.payload.len()),
            [Decoded::Oversized { declared, .. }] => Err(*declared),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(decoded(FrameKind::Message, 100), Ok(100));
    assert_eq!(decoded(FrameKind::Message, 101), Err(101));
    let limit = MESSAGES_FRAME_LIMIT;
    assert_eq!(decoded(FrameKind::Messages, limit), Ok(limit));
    assert_eq!(
        decoded(FrameKind::Messages, limit + 1),
        Err(limit as u64 + 1)
    );
}

#[test]
fn a_header_claiming_a_large_frame_buffers_only_what_arrived() {
    let mut header = Header::new(FrameKind::Request, 1);
    header.payload_len = 4 << 20;
    let mut buf = BytesMut::from(&header.to_bytes()[..header.encoded_len()]);
    buf.extend_from_slice(b"x");
    let mut decoder = FrameDecoder::new(8 << 20);
    assert!(decoder.decode(&mut buf).unwrap().is_none());
    assert_eq!(buf.len(), header.encoded_len() + 1);
    assert!(buf.capacity() < 64 * 1024, "{}", buf.capacity());
    assert_eq!(decoder.missing(&buf), (4 << 20) - 1);
    assert!(decoder.mid_frame(&buf));
}

#[test]
fn garbage_and_rdma_only_frames_are_errors_not_panics() {
    let mut decoder = FrameDecoder::new(1 << 20);
    let mut garbage = BytesMut::from(&[0xABu8; 200][..]);
    assert!(matches!(
        decoder.decode(&mut garbage),
        Err(ReadError::Header(_))
    ));
    let mut placed = Header::new(FrameKind::Request, 1);
    placed.flags = rpc_core::Flags::LARGE_PAYLOAD;
    placed.payload_len = 1 << 20;
    let mut wire = BytesMut::from(&placed.to_bytes()[..]);
    assert!(matches!(
        FrameDecoder::new(1 << 30).decode(&mut wire),
        Err(ReadError::RdmaOnly {
            kind: FrameKind::Request,
            flags: 1
        })
    ));
}

#[test]
fn frame_writer_writes_what_the_decoder_reads() {
    let mut out = Vec::new();
    let body = RawBody(b"abc");
    let md = MetadataMap::new();
    let frame = OutgoingFrame::new(Header::new(FrameKind::Response, 9), &md, &body).unwrap();
    FrameWriter::new(&mut out).write(&frame).unwrap();
    let got = decode_chunked(&out, &[1], 1 << 20);
    assert_eq!(&frame_of(&got).payload[..], b"abc");
}

fn frame_of(out: &[Decoded]) -> &InboundFrame {
    assert_eq!(out.len(), 1);
    frame(&out[0])
}

proptest! {
    /// However the bytes are cut into reads, the same frames come out, refused ones
    /// included, and the decoder ends between frames.
    #[test]
    fn any_chunking_yields_the_same_frames(
        sizes in prop::collection::vec(0usize..3000, 1..8),
        chunks in prop::collection::vec(1usize..700, 1..6),
    ) {
        let limit = 2000;
        let mut wire = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            wire.extend(encode_request(i as u64 + 1, &vec![i as u8; size]));
        }
        let out = decode_chunked(&wire, &chunks, limit);
        prop_assert_eq!(out.len(), sizes.len());
        for (i, (inbound, &size)) in out.iter().zip(&sizes).enumerate() {
            match inbound {
                Decoded::Frame(f) => {
                    prop_assert!(size <= limit);
                    prop_assert_eq!(f.header.call_id, i as u64 + 1);
                    prop_assert_eq!(&f.payload[..], &vec![i as u8; size][..]);
                }
                Decoded::Oversized { header, declared } => {
                    prop_assert!(size > limit);
                    prop_assert_eq!(header.call_id, i as u64 + 1);
                    prop_assert_eq!(*declared, size as u64);
                }
            }
        }
    }
}
