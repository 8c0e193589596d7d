//! Micro-benchmarks of the per-call hot path: the 64-byte header, the RDMA credit state
//! machine, send-slot reservation, message encoding into a slot, the TCP frame writer, and a
//! channel's own work per unary call (over a transport that answers at once).
//!
//! `cargo bench -p rpc-bench --bench hot_path`

use std::collections::VecDeque;
use std::hint::black_box;
use std::io::{self, Write};
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rdma_rpc::body::EncodeBody;
use rdma_rpc::frame::{FrameSender, InboundFrame, OutgoingFrame};
use rdma_rpc::{
    CallTable, Channel, ChannelConfig, ClientTransport, FrameKind, Header, MetadataMap, Method,
    Request, Response, Status, HEADER_LEN,
};
use rpc_examples::echo::{EchoReply, EchoRequest};
use rpc_transport_rdma::protocol::{Action, Config, Connection, Geometry};
use rpc_transport_tcp::codec::FrameWriter;

/// A request header as the client writes it.
fn request_header() -> Header {
    let mut header = Header::new(FrameKind::Request, 42);
    header.method_id = rdma_rpc::method_id("/echo.Echo/Echo");
    header.payload_len = 36;
    header.timeout_us = 1_000_000;
    header
}

fn header(c: &mut Criterion) {
    let mut group = c.benchmark_group("header");
    let header = request_header();
    let mut buf = [0u8; HEADER_LEN];
    group.bench_function("encode", |b| {
        b.iter(|| black_box(&header).encode(black_box(&mut buf)))
    });
    let bytes = header.to_bytes();
    group.bench_function("decode", |b| {
        b.iter(|| Header::decode(black_box(&bytes)).expect("valid header"))
    });
    group.finish();
}

/// One side of an in-memory connection: the state machine, its send and receive memory,
/// and the receive slots posted in order (an RC receive queue).
struct Side {
    conn: Connection,
    geometry: Geometry,
    send_mem: Vec<u8>,
    recv_mem: Vec<u8>,
    posted: VecDeque<u32>,
}

impl Side {
    fn new(config: &Config, peer: &Config) -> Side {
        let geometry = Geometry::negotiate(config, &peer.connect_params()).expect("geometry");
        let mut side = Side {
            conn: Connection::new(geometry),
            geometry,
            send_mem: vec![0; geometry.send_region_len()],
            recv_mem: vec![0; geometry.recv_region_len()],
            posted: config.initial_recv_posts().collect(),
        };
        assert!(side.conn.poll_action().is_none());
        side.posted.make_contiguous();
        side
    }
}

/// Two connected sides; frames move between them by copying slot memory.
struct Pair {
    a: Side,
    b: Side,
}

impl Pair {
    fn new() -> Pair {
        let config = Config::default();
        Pair {
            a: Side::new(&config, &config),
            b: Side::new(&config, &config),
        }
    }

    /// Writes a frame of `kind` with `payload` bytes on `from` and carries out every action
    /// until both sides are quiet: SENDs land in the peer's oldest posted RECV, signaled
    /// sends complete, the receiver releases what it got at once.
    fn exchange(from: &mut Side, to: &mut Side, kind: FrameKind, call_id: u64, payload: u32) {
        let mut header = Header::new(kind, call_id);
        header.payload_len = payload;
        let header_len = header.encoded_len();
        let len = header_len + payload as usize;
        let reservation = from.conn.reserve_send(len).expect("free slot");
        let off = from.geometry.send_offset(reservation.target());
        header.encode(&mut from.send_mem[off..off + header_len]);
        from.conn.commit_send(reservation, &header).expect("commit");
        while Self::drive(from, to) | Self::drive(to, from) {}
    }

    /// Executes `from`'s pending actions; true if there were any.
    fn drive(from: &mut Side, to: &mut Side) -> bool {
        let mut any = false;
        while let Some(action) = from.conn.poll_action() {
            any = true;
            match action {
                Action::PostRecv { slot } => from.posted.push_back(slot),
                Action::PostSend(work) => {
                    let off = from.geometry.send_offset(work.target);
                    let len = work.len as usize;
                    work.prepare(&mut from.send_mem[off..off + len]);
                    let slot = to
                        .posted
                        .pop_front()
                        .expect("credit protocol: a RECV is posted");
                    let dst = to.geometry.recv_offset(slot);
                    to.recv_mem[dst..dst + len].copy_from_slice(&from.send_mem[off..off + len]);
                    if work.signaled {
                        from.conn
                            .on_send_complete(work.target)
                            .expect("send completion");
                    }
                    let received = to
                        .conn
                        .on_recv_complete(slot, work.len, &to.recv_mem[dst..])
                        .expect("recv completion");
                    if let Some(rx) = received {
                        to.conn.release_recv(rx.slot).expect("release");
                    }
                }
                Action::Writable | Action::PostProbe => {}
                Action::SendDropped { .. } => panic!("connection closed"),
                other => panic!("no large bodies in this benchmark: {other:?}"),
            }
        }
        any
    }
}

fn credits(c: &mut Criterion) {
    let mut group = c.benchmark_group("credits");
    let mut pair = Pair::new();
    let mut call_id = 0u64;
    group.throughput(Throughput::Elements(1));
    group.bench_function("request_response_round_trip", |b| {
        b.iter(|| {
            call_id += 1;
            Pair::exchange(&mut pair.a, &mut pair.b, FrameKind::Request, call_id, 36);
            Pair::exchange(&mut pair.b, &mut pair.a, FrameKind::Response, call_id, 36);
        })
    });
    let stats = pair.a.conn.stats();
    assert!(stats.frames_sent > 0 && !pair.a.conn.is_closed());

    let mut side = Pair::new().a;
    group.bench_function("reserve_abort", |b| {
        b.iter(|| {
            let reservation = side.conn.reserve_send(black_box(128)).expect("free slot");
            side.conn.abort_send(reservation);
        })
    });
    let mut pair = Pair::new();
    group.bench_function("one_way_frame", |b| {
        // Requests only: the receiver's credits come back in credit-only frames.
        b.iter(|| {
            call_id += 1;
            Pair::exchange(&mut pair.a, &mut pair.b, FrameKind::Request, call_id, 36);
        })
    });
    group.finish();
}

fn encode(c: &mut Criterion) {
    const SLOT: usize = 4096;
    let mut group = c.benchmark_group("encode_into_slot");
    let mut slot = vec![0u8; SLOT];
    for size in [32usize, 1024, 3968] {
        let request = EchoRequest {
            payload: vec![0xA5; size].into(),
            seq: 123_456_789,
        };
        let len = EncodeBody::encoded_len(&request);
        assert!(
            HEADER_LEN + len <= SLOT,
            "{size}-byte payload does not fit the slot"
        );
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(format!("echo_request_{size}B"), |b| {
            b.iter(|| {
                let len = EncodeBody::encoded_len(black_box(&request));
                request.encode_into(&mut slot[HEADER_LEN..HEADER_LEN + len]);
            })
        });
    }
    group.finish();
}

/// A `Write` that keeps only the last write, like a socket whose kernel buffer drains at
/// once: the bytes are copied, the memory is reused.
struct LastWrite(Vec<u8>);

impl Write for LastWrite {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.clear();
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn tcp_frame(c: &mut Criterion) {
    let mut group = c.benchmark_group("tcp_frame_write");
    let metadata = MetadataMap::new();
    for size in [32usize, 4096] {
        let request = EchoRequest {
            payload: vec![0x5A; size].into(),
            seq: 7,
        };
        let mut writer = FrameWriter::new(LastWrite(Vec::with_capacity(64 * 1024)));
        let mut header = request_header();
        header.payload_len = 0;
        group.throughput(Throughput::Bytes((HEADER_LEN + size) as u64));
        group.bench_function(format!("echo_request_{size}B"), |b| {
            b.iter(|| {
                let frame = OutgoingFrame::new(header, &metadata, &request).expect("frame fits");
                writer.write(&frame).expect("write into memory");
            })
        });
    }
    group.finish();
}

/// A transport that answers every request at once, on the sending thread: what is left is
/// the channel's own work per call (interceptors, deadline, call table, metrics, span).
struct AnswersAtOnce {
    calls: Arc<CallTable>,
    reply: Bytes,
}

impl FrameSender for AnswersAtOnce {
    fn send(&self, frame: &mut OutgoingFrame<'_>) -> Result<(), Status> {
        let header = *frame.header();
        let mut answer = Header::new(FrameKind::Response, header.call_id);
        answer.method_id = header.method_id;
        let frame = InboundFrame {
            header: answer,
            metadata: Bytes::new(),
            payload: self.reply.clone(),
        };
        self.calls.complete(header.call_id, Ok(frame));
        Ok(())
    }

    fn poll_send(
        &self,
        _: &mut std::task::Context<'_>,
        frame: &mut OutgoingFrame<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        std::task::Poll::Ready(self.send(frame))
    }
}

impl ClientTransport for AnswersAtOnce {
    fn peer(&self) -> &str {
        "memory://answers"
    }

    fn close(&self) {}
}

fn channel(c: &mut Criterion) {
    static ECHO: Method = Method::new("/echo.Echo/Echo");
    let calls = Arc::new(CallTable::new());
    let reply = EchoReply {
        payload: vec![7; 32].into(),
        seq: 1,
    };
    let transport = Arc::new(AnswersAtOnce {
        calls: calls.clone(),
        reply: reply.encode_to_vec().into(),
    });
    let channel = Channel::new(calls, transport, ChannelConfig::default());
    let request = || {
        Request::new(EchoRequest {
            payload: vec![7; 32].into(),
            seq: 1,
        })
    };
    let mut group = c.benchmark_group("channel");
    group.bench_function("unary_blocking", |b| {
        b.iter(|| {
            let reply: Response<EchoReply> = channel.unary_blocking(&ECHO, request()).unwrap();
            black_box(reply)
        })
    });
    group.bench_function("unary_async", |b| {
        b.iter(|| {
            let call = channel.unary::<EchoRequest, EchoReply>(&ECHO, request());
            black_box(futures::executor::block_on(call).unwrap())
        })
    });
    group.finish();
}

criterion_group!(benches, header, credits, encode, tcp_frame, channel);
criterion_main!(benches);
