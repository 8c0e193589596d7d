//! Hostile stream frames from a raw TCP peer. Each breaks one stream rule: the server fails
//! only the call that broke it, with a status naming the rule, drops frames of calls it does
//! not know, keeps serving the connection, and other connections never notice.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use prost::Message;
use rdma_rpc::body::RawBody;
use rdma_rpc::frame::OutgoingFrame;
use rdma_rpc::prelude::*;
use rdma_rpc::{Code, Flags, FrameKind, Header, MetadataMap, ServerHandle};
use rpc_examples::streaming::streamer_client::StreamerClient;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::streaming::{Chunk, ConsumeSummary, ProduceRequest};
use rpc_examples::Streamer;

const CONSUME: u32 = rdma_rpc::method_id("/rpc.streaming.Streamer/Consume");
/// How long a raw peer waits for an answer before the test fails.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

fn server() -> ServerHandle {
    Server::builder()
        .add_service(StreamerServer::new(Streamer::default()))
        .start("tcp://127.0.0.1:0")
        .expect("server starts")
}

fn encode(header: Header, payload: &[u8]) -> Vec<u8> {
    let metadata = MetadataMap::new();
    let body = RawBody(payload);
    let frame = OutgoingFrame::new(header, &metadata, &body).unwrap();
    let mut out = vec![0; frame.len()];
    frame.write_to(&mut out);
    out
}

/// The opening of a `Consume` (client-streaming) call.
fn open_consume(call_id: u64) -> Vec<u8> {
    let mut header = Header::new(FrameKind::Request, call_id);
    header.method_id = CONSUME;
    header.flags = Flags::STREAM;
    encode(header, &[])
}

fn chunk(index: u64) -> Vec<u8> {
    Chunk {
        index,
        payload: rpc_examples::bulk_pattern(16, 0).into(),
    }
    .encode_to_vec()
}

fn message(call_id: u64, seq: u32, index: u64) -> Vec<u8> {
    encode(
        Header::stream(FrameKind::Message, call_id, seq),
        &chunk(index),
    )
}

/// A `Messages` frame of the chunks `indexes`, the first at `seq`.
fn messages(call_id: u64, seq: u32, indexes: std::ops::Range<u64>) -> Vec<u8> {
    let mut payload = Vec::new();
    for index in indexes {
        let chunk = chunk(index);
        payload.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        payload.extend_from_slice(&chunk);
    }
    encode(Header::stream(FrameKind::Messages, call_id, seq), &payload)
}

/// A peer speaking the wire protocol by hand.
struct Peer {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Peer {
    fn connect(server: &ServerHandle) -> Peer {
        let endpoint: rdma_rpc::Endpoint = server.local_url().parse().unwrap();
        let stream = TcpStream::connect(endpoint.authority()).expect("connects");
        stream.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
        Peer {
            stream,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, frames: &[Vec<u8>]) {
        for frame in frames {
            self.stream.write_all(frame).expect("the server reads");
        }
    }

    /// The next frame the server sends: its header and payload.
    fn next_frame(&mut self) -> (Header, Vec<u8>) {
        let started = Instant::now();
        loop {
            if self.buf.len() >= rdma_rpc::COMPACT_HEADER_LEN {
                let header_len = Header::wire_len(&self.buf).expect("a valid header");
                if self.buf.len() >= header_len {
                    let header = Header::decode(&self.buf[..header_len]).expect("valid");
                    let meta = header.metadata_len as usize;
                    let total = header_len + meta + header.payload_len as usize;
                    if self.buf.len() >= total {
                        let payload = self.buf[header_len + meta..total].to_vec();
                        self.buf.drain(..total);
                        return (header, payload);
                    }
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).expect("the server answers");
            assert!(n > 0, "the server closed the connection");
            assert!(started.elapsed() < ANSWER_WITHIN, "no answer");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The answer to `call_id` (skipping window updates and other calls' frames): its
    /// status code, and its status message or summary.
    fn answer(&mut self, call_id: u64) -> (Code, Vec<u8>) {
        loop {
            let (header, payload) = self.next_frame();
            if header.call_id == call_id && header.kind == FrameKind::Response {
                return (header.status, payload);
            }
        }
    }
}

fn failed_naming(answer: (Code, Vec<u8>), rule: &str) {
    let (code, payload) = answer;
    let message = String::from_utf8_lossy(&payload);
    assert_eq!(code, Code::Internal, "{message}");
    assert!(message.contains(rule), "{message:?} does not name {rule:?}");
}

/// Broken stream rules fail their own call by name; a message for a call never opened is
/// dropped; the same connection then completes a well-formed stream, and another client
/// streams meanwhile as if nothing happened.
#[test]
fn hostile_stream_frames_fail_only_their_call() {
    let server = server();
    let mut peer = Peer::connect(&server);

    // Sequence numbers start at 1.
    peer.send(&[open_consume(1), message(1, 0, 0)]);
    failed_naming(peer.answer(1), "sequence number 0");

    // A message twice.
    peer.send(&[open_consume(3), message(3, 1, 0), message(3, 1, 0)]);
    failed_naming(peer.answer(3), "arrived twice");

    // A `Messages` frame whose payload ends inside a length, and one overlapping a message
    // that arrived.
    let mut cut = messages(11, 1, 0..2);
    cut.truncate(cut.len() - 2);
    let declared = (cut.len() - rdma_rpc::COMPACT_HEADER_LEN) as u32;
    cut[24..28].copy_from_slice(&declared.to_le_bytes());
    peer.send(&[open_consume(11), cut]);
    failed_naming(peer.answer(11), "bad Messages frame");
    peer.send(&[open_consume(13), message(13, 2, 0), messages(13, 1, 0..3)]);
    failed_naming(peer.answer(13), "arrived twice");

    // Trailers are the server's to send.
    let trailers = encode(Header::stream(FrameKind::Trailers, 5, 1), b"");
    peer.send(&[open_consume(5), trailers]);
    failed_naming(peer.answer(5), "the client sent trailers");

    // A window update that returns more than 2^48.
    let update = rdma_rpc::stream::WindowUpdate {
        messages: 1,
        bytes: u64::MAX,
    };
    let update = encode(
        Header::stream(FrameKind::WindowUpdate, 9, 0),
        &update.encode(),
    );
    peer.send(&[open_consume(9), update]);
    failed_naming(peer.answer(9), "bad window update");

    // Messages and a half-close for a call never opened: dropped.
    let stray_end = encode(Header::stream(FrameKind::HalfClose, 99, 2), b"");
    peer.send(&[message(99, 1, 0), stray_end]);

    // The connection still serves: a well-formed stream of six chunks, one by one and
    // several to a frame.
    let half_close = encode(Header::stream(FrameKind::HalfClose, 7, 7), b"");
    peer.send(&[
        open_consume(7),
        message(7, 1, 0),
        messages(7, 2, 1..4),
        message(7, 5, 4),
        messages(7, 6, 5..6),
        half_close,
    ]);
    let (code, payload) = peer.answer(7);
    assert_eq!(code, Code::Ok, "{}", String::from_utf8_lossy(&payload));
    let summary = ConsumeSummary::decode(&payload[..]).expect("a summary");
    assert_eq!((summary.chunks, summary.in_order), (6, true));

    // Another connection never noticed.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = server.local_url().to_owned();
    let got = runtime.block_on(async move {
        let channel = rdma_rpc::client().connect(&url).await.expect("connects");
        let request = ProduceRequest {
            count: 1000,
            size: 32,
            ..Default::default()
        };
        let mut stream = StreamerClient::new(channel)
            .produce(request)
            .await
            .expect("opens")
            .into_inner();
        let mut got = 0;
        while let Some(chunk) = stream.message().await.expect("streams") {
            assert_eq!(chunk.index, got);
            got += 1;
        }
        got
    });
    assert_eq!(got, 1000);
}

/// A `Messages` frame may exceed the receiver's message size limit up to
/// `MESSAGES_FRAME_LIMIT` (each message in it is checked against the limit); beyond that it
/// is refused as an oversized message is.
#[test]
fn a_messages_frame_is_bounded_by_its_own_limit() {
    let server = Server::builder()
        .max_message_size(256)
        .add_service(StreamerServer::new(Streamer::default()))
        .start("tcp://127.0.0.1:0")
        .expect("server starts");
    let mut peer = Peer::connect(&server);
    let half_close = encode(Header::stream(FrameKind::HalfClose, 1, 61), b"");
    let frame = messages(1, 1, 0..60);
    assert!(frame.len() > 1024, "well over the message limit");
    peer.send(&[open_consume(1), frame, half_close]);
    let (code, payload) = peer.answer(1);
    assert_eq!(code, Code::Ok, "{}", String::from_utf8_lossy(&payload));
    let summary = ConsumeSummary::decode(&payload[..]).expect("a summary");
    assert_eq!((summary.chunks, summary.in_order), (60, true));

    let limit = rdma_rpc::stream::batch::MESSAGES_FRAME_LIMIT;
    let too_many = messages(3, 1, 0..(limit as u64 / 20));
    assert!(too_many.len() > limit + rdma_rpc::COMPACT_HEADER_LEN);
    peer.send(&[open_consume(3), too_many]);
    let (code, payload) = peer.answer(3);
    let message = String::from_utf8_lossy(&payload);
    assert_eq!(code, Code::ResourceExhausted, "{message}");
    assert!(message.contains("stream message"), "{message}");
}
