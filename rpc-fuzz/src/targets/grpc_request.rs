//! What a gRPC peer's bytes reach on our `grpc://` side, without HTTP/2 around them: a
//! request body's messages, read as they arrive in any chunking, and a request's headers,
//! read as metadata and a deadline. Each reads or fails with a status naming the problem,
//! never a panic; the messages read are exactly the body's (prefix, then message, each at
//! most the limit), and metadata read from headers survives being sent back as headers.
//!
//! Input: a byte choosing the message size limit, a byte choosing the chunk size, a byte
//! saying where the body ends, then the body, then the headers (`name`, 0, `value`, 10,
//! repeated).

use bytes::Bytes;
use rpc_core::Code;
use rpc_transport_grpc::fuzzing;

const PREFIX: usize = 5;

pub(crate) fn run(data: &[u8]) {
    let [limit, chunk, split, rest @ ..] = data else {
        return;
    };
    let limit = usize::from(*limit) * 4;
    let chunk = usize::from(*chunk).max(1);
    let at = (usize::from(*split) * rest.len() / 255).min(rest.len());
    let (body, header_bytes) = rest.split_at(at);
    messages(body, limit, chunk);
    headers(header_bytes);
}

fn messages(body: &[u8], limit: usize, chunk: usize) {
    let chunks: Vec<Bytes> = body.chunks(chunk).map(Bytes::copy_from_slice).collect();
    let (messages, ended) = fuzzing::read_messages(chunks, limit);
    // What was read is the body's start, message by message.
    let mut at = 0;
    for message in &messages {
        assert!(message.len() <= limit, "a message over the limit");
        let header = &body[at..at + PREFIX];
        assert_eq!(header[0], 0, "a compressed message was taken");
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        assert_eq!(len, message.len());
        assert_eq!(&body[at + PREFIX..at + PREFIX + len], &message[..]);
        at += PREFIX + len;
    }
    match ended {
        None => assert_eq!(at, body.len(), "the body ended whole but bytes were left"),
        Some(status) => assert!(
            matches!(status.code(), Code::Internal | Code::ResourceExhausted),
            "{status}"
        ),
    }
}

fn headers(bytes: &[u8]) {
    let pairs: Vec<(&[u8], &[u8])> = bytes
        .split(|b| *b == b'\n')
        .filter_map(|line| {
            let zero = line.iter().position(|b| *b == 0)?;
            Some((&line[..zero], &line[zero + 1..]))
        })
        .collect();
    let headers = fuzzing::headers(&pairs);
    let (metadata, timeout) = fuzzing::request_metadata(&headers);
    if let Err(status) = &timeout {
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    match metadata {
        Ok(metadata) => {
            // What came in as headers goes back out as the same headers.
            let back = fuzzing::round_trip(&metadata).expect("our own metadata reads back");
            assert_eq!(back, metadata);
        }
        Err(status) => assert_eq!(status.code(), Code::InvalidArgument),
    }
}

/// Valid inputs: two messages (one empty) in small chunks, and headers with binary
/// metadata and a deadline.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let mut body = Vec::new();
    for message in [&b"hello"[..], b""] {
        body.push(0);
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
    }
    let headers = b"grpc-timeout\x0025m\nx-token\x00abc\nx-raw-bin\x00AP4H\n";
    let split = (body.len() * 255).div_ceil(body.len() + headers.len()) as u8;
    let mut input = vec![64, 3, split];
    input.extend_from_slice(&body);
    input.extend_from_slice(headers);
    vec![input]
}
