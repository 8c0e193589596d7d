//! The sans-IO RDMA connection fed arbitrary completions: frames a hostile peer could put
//! in a receive slot (raw bytes, or headers valid enough to reach the deeper checks), and
//! send, WRITE, bind, invalidate and error completions whether or not their work request
//! exists, mixed with what the driver and the upper layer do. Every step either works or
//! closes the connection with a named violation; nothing panics or overflows.
use arbitrary::Arbitrary;
use rpc_core::{Code, Flags, FrameKind, Header, RemoteBuffer, HEADER_LEN};
use rpc_rdma_protocol::{BodyId, Config, Connection, Geometry, LocalBuffer, SendTarget, WorkId};

const SLOTS: u32 = 4;
const SLOT: usize = 256;

#[derive(Debug, Arbitrary)]
enum Kind {
    Request,
    Response,
    Cancel,
    CreditOnly,
    LargeRequest,
    LargeGrant,
    Message,
    Messages,
    LargeSource,
    LargeSourceDone,
}

#[derive(Debug, Arbitrary)]
struct Fields {
    kind: Kind,
    call_id: u8,
    /// The method id, or a stream frame's sequence number.
    seq: u8,
    large_payload: bool,
    response_buffer: bool,
    credits: u8,
    metadata_len: u16,
    payload_len: u32,
    status: u8,
    timeout: bool,
    addr: u64,
    rkey: u32,
    generation: u32,
    len: u64,
}

#[derive(Debug, Arbitrary)]
enum Step {
    /// Raw bytes land in a slot.
    Raw {
        slot: u8,
        byte_len: u16,
        bytes: Vec<u8>,
    },
    /// A header, then `tail` bytes of body, land in a slot.
    Frame {
        slot: u8,
        fields: Fields,
        tail: u8,
    },
    SendComplete {
        slot: u8,
        control: bool,
    },
    WriteComplete(u8),
    BindComplete(u8),
    Invalidated(u8),
    ProbeComplete,
    CompletionError(u8),
    Release(u8),
    Grant {
        call_id: u8,
        seq: u8,
        len: u32,
    },
    Refuse {
        call_id: u8,
        seq: u8,
    },
    Send {
        payload_len: u8,
        call_id: u8,
    },
    StartLarge {
        payload_len: u32,
        call_id: u8,
        /// A stream message's sequence number; 0 sends a request.
        seq: u8,
    },
    Advertise {
        call_id: u8,
        len: u32,
    },
    Probe,
    Grow(u8),
    /// A graceful leave: a fence probe if the protocol wants one.
    Drain,
    /// The peer disconnected: drain behind a marker.
    PeerDisconnected,
    ReadComplete(u8),
    SourceInvalidated(u8),
    ReadInto {
        call_id: u8,
        seq: u8,
        len: u32,
    },
    StartSource {
        payload_len: u32,
        call_id: u8,
    },
}

fn body(call_id: u8, seq: u8) -> BodyId {
    BodyId {
        call_id: u64::from(call_id),
        seq: u32::from(seq),
    }
}

fn header(f: &Fields) -> Header {
    let kind = match f.kind {
        Kind::Request => FrameKind::Request,
        Kind::Response => FrameKind::Response,
        Kind::Cancel => FrameKind::Cancel,
        Kind::CreditOnly => FrameKind::CreditOnly,
        Kind::LargeRequest => FrameKind::LargeRequest,
        Kind::LargeGrant => FrameKind::LargeGrant,
        Kind::Message => FrameKind::Message,
        Kind::Messages => FrameKind::Messages,
        Kind::LargeSource => FrameKind::LargeSource,
        Kind::LargeSourceDone => FrameKind::LargeSourceDone,
    };
    let mut h = Header::stream(kind, u64::from(f.call_id), u32::from(f.seq));
    let mut flags = Flags::NONE;
    if f.large_payload {
        flags = flags.with(Flags::LARGE_PAYLOAD);
    }
    if f.response_buffer {
        flags = flags.with(Flags::RESPONSE_BUFFER);
    }
    h.flags = flags;
    h.credits = u32::from(f.credits % 8);
    h.metadata_len = u32::from(f.metadata_len % 512);
    h.payload_len = f.payload_len;
    h.status = Code::from_wire(u16::from(f.status % 17)).unwrap_or(Code::Ok);
    if f.timeout {
        h.timeout_us = 1000;
    }
    h.remote = RemoteBuffer {
        addr: f.addr,
        rkey: f.rkey,
        generation: f.generation,
        len: f.len,
    };
    h
}

pub(crate) fn run(data: &[u8]) {
    let Some(steps) = crate::arbitrary_input::<Vec<Step>>(data) else {
        return;
    };
    let config = Config {
        send_slots: SLOTS,
        send_slot_size: SLOT as u32,
        recv_slots: SLOTS,
        recv_slot_size: SLOT as u32,
        ..Config::default()
    };
    let Ok(geometry) = Geometry::negotiate(&config, &config.connect_params()) else {
        return;
    };
    let mut c = Connection::new(geometry);
    let mut slot_buf = [0u8; SLOT];
    for step in steps.iter().take(256) {
        let slot_of = |s: u8| u32::from(s) % (SLOTS + 2);
        let outcome = match step {
            Step::Raw {
                slot,
                byte_len,
                bytes,
            } => {
                let n = bytes.len().min(SLOT);
                slot_buf[..n].copy_from_slice(&bytes[..n]);
                let byte_len = u32::from(*byte_len).min(SLOT as u32);
                c.on_recv_complete(slot_of(*slot), byte_len, &slot_buf)
                    .map(drop)
            }
            Step::Frame { slot, fields, tail } => {
                let h = header(fields);
                let len = h.encode(&mut slot_buf[..HEADER_LEN.min(SLOT)]);
                let byte_len = (len + usize::from(*tail)).min(SLOT) as u32;
                c.on_recv_complete(slot_of(*slot), byte_len, &slot_buf)
                    .map(drop)
            }
            Step::SendComplete { slot, control } => {
                let target = if *control {
                    SendTarget::Control
                } else {
                    SendTarget::Ring(slot_of(*slot))
                };
                c.on_send_complete(target)
            }
            Step::WriteComplete(id) => c.on_write_complete(u32::from(*id)),
            Step::BindComplete(id) => c.on_bind_complete(u32::from(*id)),
            Step::Invalidated(id) => c.on_invalidated(u32::from(*id)),
            Step::ProbeComplete => {
                c.on_probe_complete();
                Ok(())
            }
            Step::CompletionError(kind) => {
                let id = u32::from(*kind / 7);
                let work = match kind % 7 {
                    0 => WorkId::Send(0),
                    1 => WorkId::Recv(1),
                    2 => WorkId::Write(0),
                    3 => WorkId::Invalidate(id),
                    4 => WorkId::Read(id),
                    5 => WorkId::InvalidateSource(id),
                    _ => WorkId::Probe,
                };
                c.on_completion_error(work, "fuzzed");
                Ok(())
            }
            Step::Release(slot) => c.release_recv(slot_of(*slot)),
            Step::Grant { call_id, seq, len } => {
                c.grant(body(*call_id, *seq), 0x10_0000, 7, u64::from(*len));
                Ok(())
            }
            Step::Refuse { call_id, seq } => {
                c.refuse(body(*call_id, *seq), Code::ResourceExhausted, 0);
                Ok(())
            }
            Step::Send {
                payload_len,
                call_id,
            } => {
                let mut h = Header::new(FrameKind::Request, u64::from(*call_id));
                h.payload_len = u32::from(*payload_len);
                if let Ok(r) = c.reserve_send(h.encoded_len() + usize::from(*payload_len)) {
                    let _ = c.commit_send(r, &h);
                }
                Ok(())
            }
            Step::StartLarge {
                payload_len,
                call_id,
                seq,
            } => {
                let kind = match seq {
                    0 => FrameKind::Request,
                    _ => FrameKind::Message,
                };
                let mut h = Header::stream(kind, u64::from(*call_id), u32::from(*seq));
                h.payload_len = *payload_len;
                let local = LocalBuffer {
                    addr: 0x1000,
                    lkey: 1,
                };
                let _ = c.start_large(&h, local);
                Ok(())
            }
            Step::Advertise { call_id, len } => {
                let _ = c.advertise(u64::from(*call_id), 0x20_0000, 9, u64::from(*len));
                Ok(())
            }
            Step::Probe => {
                c.start_probe();
                Ok(())
            }
            Step::Grow(n) => {
                c.grow_window(u32::from(*n));
                Ok(())
            }
            Step::Drain => {
                let drained = c.is_drained();
                assert!(
                    !(c.start_drain() && drained),
                    "a fence for a drained connection"
                );
                Ok(())
            }
            Step::PeerDisconnected => {
                c.on_peer_disconnected();
                Ok(())
            }
            Step::ReadComplete(id) => c.on_read_complete(u32::from(*id)),
            Step::SourceInvalidated(id) => c.on_source_invalidated(u32::from(*id)),
            Step::ReadInto { call_id, seq, len } => {
                let local = LocalBuffer {
                    addr: 0x30_0000,
                    lkey: 3,
                };
                c.read_into(body(*call_id, *seq), local, u64::from(*len));
                Ok(())
            }
            Step::StartSource {
                payload_len,
                call_id,
            } => {
                let mut h = Header::new(FrameKind::Request, u64::from(*call_id));
                h.payload_len = *payload_len;
                let local = LocalBuffer {
                    addr: 0x1000,
                    lkey: 1,
                };
                let _ = c.start_source(&h, local, 11);
                Ok(())
            }
        };
        if outcome.is_err() {
            assert!(c.is_closed(), "a violation closes the connection");
        }
        while c.poll_action().is_some() {}
        let _ = c.stats();
    }
}
