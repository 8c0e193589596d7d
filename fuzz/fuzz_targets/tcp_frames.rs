//! The TCP frame reader: a byte stream cut into arbitrary reads yields frames, a wait for
//! more, or a named error; never a panic, and never a frame beyond the payload limit.
#![no_main]

use arbitrary::Arbitrary;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rpc_core::stream::batch::payload_limit;
use rpc_transport_tcp::codec::FrameDecoder;

#[derive(Debug, Arbitrary)]
struct Input {
    max_payload: u16,
    /// Where the stream is cut into reads.
    cuts: Vec<u8>,
    stream: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let max_payload = usize::from(input.max_payload);
    let mut decoder = FrameDecoder::new(max_payload);
    let mut buf = BytesMut::new();
    let mut rest = &input.stream[..];
    let mut cuts = input.cuts.iter().map(|&c| usize::from(c) + 1).cycle();
    while !rest.is_empty() {
        let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(inbound)) => {
                    if let rpc_transport_tcp::codec::Decoded::Frame(frame) = inbound {
                        let limit = payload_limit(frame.header.kind, max_payload);
                        assert!(frame.payload.len() <= limit);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
