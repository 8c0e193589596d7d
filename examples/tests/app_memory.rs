//! Large requests sent from the application's registered memory ([`RegisteredBuffer`]): over
//! real verbs the bytes go by RDMA WRITE from where they lie, uncopied (run in the
//! soft-RoCE VM by `cargo xtask test`); over `tcp://` the same code works, copying.
//!
//! A binary of its own: the copy counters it reads are the process's.

mod common;

use std::time::{Duration, Instant};

use rdma_rpc::prelude::*;
use rdma_rpc::{
    large_body_bytes, Landing, LargeBodyBytes, RdmaConfig, RegisteredBuffer, ServerHandle,
};
use std::sync::{Arc, Mutex};

use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::{self, EchoServer};
use rpc_examples::echo::{EchoReply, EchoRequest};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::BulkRequest;
use rpc_examples::{blob, bulk_pattern, EchoService, Tester};
use rpc_transport_rdma::process_usage;
use rpc_transport_rdma::verbs::test_support::require_device;

const MIB: usize = 1 << 20;

/// The copy counters are the process's: its tests run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn builder() -> rdma_rpc::ServerBuilder {
    Server::builder()
        .max_message_size(256 * MIB)
        .add_service(TesterServer::new(Tester::default()))
        .add_service(EchoServer::new(EchoService))
}

fn connect(server: &ServerHandle) -> Channel {
    rdma_rpc::client()
        .max_message_size(256 * MIB)
        .connect_blocking(server.local_url())
        .expect("client connects")
}

/// A buffer of `len` bytes of pattern `seed`.
fn filled(len: usize, seed: u64) -> RegisteredBuffer {
    let mut buffer = RegisteredBuffer::new(len).expect("a registered buffer");
    buffer
        .get_mut()
        .expect("nothing else holds a new buffer")
        .copy_from_slice(&bulk_pattern(len, seed));
    buffer
}

/// Sends `payload` in a bulk request that asks for a small answer, and checks the server
/// received it intact.
fn send(client: &TesterClient, payload: bytes::Bytes, seed: u64) {
    let len = payload.len();
    let reply = client
        .bulk_blocking(BulkRequest {
            reply_len: 8,
            seed,
            payload,
            delay: None,
        })
        .expect("bulk call")
        .into_inner();
    assert_eq!(reply.received, len as u64);
    assert!(reply.matched, "a request of {len} bytes arrived corrupted");
}

/// The transfer lets go of the buffer once its WRITEs completed, which may be just after
/// the answer came: then it can be written again.
fn writable_again(buffer: &mut RegisteredBuffer) -> &mut [u8] {
    let until = Instant::now() + Duration::from_secs(30);
    while buffer.get_mut().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    buffer
        .get_mut()
        .expect("the finished send let go of the buffer")
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_large_request_goes_from_registered_memory_uncopied() {
    let _one = one_at_a_time();
    if require_device().is_none() {
        return;
    }
    // Made before any connection: registered when the first connection sets its device up.
    let early = filled(16 * MIB + 3, 1);
    let server = common::start_rdma(builder(), RdmaConfig::default());
    let channel = connect(&server);
    let client = TesterClient::new(channel.clone());
    // Made while a connection uses the device: registered at once.
    let mut late = filled(64 * MIB, 2);

    for (buffer, seed) in [(&early, 1), (&late, 2)] {
        let before = large_body_bytes();
        send(&client, buffer.slice(..), seed);
        let after = large_body_bytes();
        let in_place = after.in_place - before.in_place;
        let copied = after.copied - before.copied;
        eprintln!(
            "{} bytes: {in_place} in place, {copied} copied",
            buffer.len()
        );
        assert_eq!(in_place, buffer.len() as u64, "the payload went in place");
        // The field's tag and length, and the other fields (9 bytes here).
        assert!(copied < 64, "{copied} bytes copied");
    }

    // A part of a buffer (the pattern's start is the shorter pattern), and the buffer
    // written again once the send let go of it.
    send(&client, late.slice(..3 * MIB + 7), 2);
    let bytes = writable_again(&mut late);
    bytes[..4 * MIB].copy_from_slice(&bulk_pattern(4 * MIB, 5));
    let before = large_body_bytes();
    send(&client, late.slice(..4 * MIB), 5);
    assert_eq!(
        large_body_bytes().in_place - before.in_place,
        4 * MIB as u64
    );

    // An echo: the request goes from the buffer, and the server sends the body back from the
    // buffer it arrived in.
    let echo = EchoClient::new(channel);
    let len = 16 * MIB as u64;
    let before = large_body_bytes();
    let reply = echo
        .echo_blocking(EchoRequest {
            payload: late.slice(..len as usize),
            seq: 7,
        })
        .expect("echo")
        .into_inner();
    assert!(
        reply.payload == late.slice(..len as usize),
        "the echo came back intact"
    );
    assert_eq!(reply.seq, 7);
    let after = large_body_bytes();
    eprintln!(
        "16 MiB echo: {} in place, {} copied",
        after.in_place - before.in_place,
        after.copied - before.copied
    );
    assert_eq!(
        after.in_place - before.in_place,
        2 * len,
        "both ways in place"
    );
    assert!(
        after.copied - before.copied < 512,
        "{after:?} after {before:?}"
    );

    // Memory that is not registered is copied.
    let before = large_body_bytes();
    send(&client, bulk_pattern(2 * MIB, 6).into(), 6);
    let after = large_body_bytes();
    assert_eq!(after.in_place, before.in_place);
    assert!(after.copied - before.copied >= 2 * MIB as u64);

    // Registered with the devices the connections use; let go when their engines retire,
    // and registered again by the next connection.
    assert!(
        process_usage().registered_bytes >= (early.len() + late.len()) as u64,
        "{:?}",
        process_usage()
    );
    // (The echo's reply holds the buffer it arrived in, and that its connection's pool.)
    drop((reply, echo, client));
    server.shutdown_blocking(Duration::ZERO);
    let until = Instant::now() + Duration::from_secs(90);
    while process_usage().registered_bytes > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        process_usage().registered_bytes,
        0,
        "registrations outlived the connections' engines: {:?}",
        process_usage()
    );
    let server = common::start_rdma(builder(), RdmaConfig::default());
    let client = TesterClient::new(connect(&server));
    assert!(process_usage().registered_bytes >= (early.len() + late.len()) as u64);
    let before = large_body_bytes();
    send(&client, early.slice(..), 1);
    assert_eq!(
        large_body_bytes().in_place - before.in_place,
        early.len() as u64
    );
}

/// Asks for a bulk reply of `len` bytes of pattern `seed`, offering `landing` for it.
fn bulk_into(
    client: &TesterClient,
    landing: Option<&Landing>,
    len: usize,
    seed: u64,
) -> bytes::Bytes {
    let mut request = Request::new(BulkRequest {
        reply_len: len as u64,
        seed,
        payload: bytes::Bytes::new(),
        delay: None,
    });
    if let Some(landing) = landing {
        request.receive_into(landing.clone());
    }
    let reply = client
        .bulk_blocking(request)
        .expect("bulk call")
        .into_inner();
    assert!(
        reply.payload == bulk_pattern(len, seed),
        "a response of {len} bytes arrived corrupted"
    );
    reply.payload
}

/// The addresses of the buffer `landing` holds.
fn addresses(landing: &Landing) -> std::ops::Range<usize> {
    blob::landing_range(landing).expect("the landing holds its buffer")
}

/// The buffer `landing` holds, once it is back and nothing views it (within 30 s).
fn back(landing: &Landing) -> RegisteredBuffer {
    free(landing);
    landing.take().expect("the landing holds its buffer")
}

/// Waits until `landing` holds its buffer and nothing views it.
fn free(landing: &Landing) {
    blob::wait_free(landing).expect("the buffer came back to its landing, free");
}

/// A large response lands where the application offered it ([`Landing`]): the
/// server writes it into the registered buffer, and the decoded reply's `bytes` field is a
/// view of that buffer. A landing serves one call at a time, and falls back to the pool
/// when it cannot serve (too small, still viewed); the buffer comes back to be reused.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_large_response_lands_in_the_applications_buffer() {
    let _one = one_at_a_time();
    if require_device().is_none() {
        return;
    }
    let server = common::start_rdma(builder(), RdmaConfig::default());
    let client = TesterClient::new(connect(&server));
    let landing = Landing::new(RegisteredBuffer::new(64 * MIB).expect("a buffer"));
    let range = addresses(&landing);
    let inside = |bytes: &bytes::Bytes| {
        let start = bytes.as_ptr() as usize;
        range.contains(&start) && start + bytes.len() <= range.end
    };

    for (len, seed) in [(16 * MIB, 3), (64 * MIB - 4096, 4), (3 * MIB + 5, 5)] {
        let before = large_body_bytes().landed;
        let payload = bulk_into(&client, Some(&landing), len, seed);
        assert!(
            inside(&payload),
            "a response of {len} bytes landed elsewhere"
        );
        let landed = large_body_bytes().landed - before;
        assert!(
            landed >= len as u64 && landed < len as u64 + 64,
            "{landed} bytes landed for a response of {len}"
        );
        // The landing is still viewed by this reply: another call's response goes to a
        // pooled buffer meanwhile, intact.
        let before = large_body_bytes().landed;
        let other = bulk_into(&client, Some(&landing), 2 * MIB, 6);
        assert!(!inside(&other), "two responses landed in one buffer");
        assert_eq!(large_body_bytes().landed, before);
    }

    // A landing too small for the response: it takes the rendezvous, intact.
    let small = Landing::new(RegisteredBuffer::new(MIB).expect("a buffer"));
    let small_range = addresses(&small);
    let before = large_body_bytes().landed;
    let payload = bulk_into(&client, Some(&small), 2 * MIB, 7);
    assert!(!small_range.contains(&(payload.as_ptr() as usize)));
    // A response small enough for a slot leaves the buffer untouched.
    let payload = bulk_into(&client, Some(&landing), 100, 8);
    assert!(!inside(&payload));
    assert_eq!(large_body_bytes().landed, before, "nothing landed");

    // The buffers come back (once their windows are invalidated, which may complete just
    // after the call), and may be written once nothing views them.
    drop(payload);
    let mut buffer = back(&landing);
    assert!(
        buffer.get_mut().is_some(),
        "nothing views the buffer any more"
    );
    let mut buffer = back(&small);
    assert!(buffer.get_mut().is_some());

    // Both ways uncopied: an echo of 256 MiB sent from a registered buffer, sent back by
    // the server from the buffer it arrived in, lands in the buffer offered for it.
    let len = 256 * MIB - 64 * 1024;
    let request = filled(len, 9);
    let landing = Landing::new(RegisteredBuffer::new(256 * MIB).expect("a buffer"));
    let range = addresses(&landing);
    let mut call = Request::new(EchoRequest {
        payload: request.slice(..),
        seq: 9,
    });
    call.receive_into(landing.clone());
    let echo = EchoClient::new(connect(&server));
    let before = large_body_bytes();
    let reply = echo.echo_blocking(call).expect("echo").into_inner();
    let after = large_body_bytes();
    let (in_place, copied) = (
        after.in_place - before.in_place,
        after.copied - before.copied,
    );
    eprintln!("{len} B echo into a landing: {in_place} in place, {copied} copied");
    assert!(
        reply.payload == request.slice(..),
        "the echo came back intact"
    );
    let start = reply.payload.as_ptr() as usize;
    assert!(
        range.contains(&start) && start + len <= range.end,
        "the echo landed elsewhere"
    );
    assert_eq!(in_place, 2 * len as u64, "both ways in place");
    assert!(copied < 512, "{copied} bytes copied");
    assert!(
        after.landed - before.landed >= len as u64,
        "the echo landed"
    );
}

/// An echo handler that records where each request's payload lies, and answers small.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<(usize, usize)>>>);

impl echo_server::Echo for Recording {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let EchoRequest { payload, seq } = request.into_inner();
        assert!(
            payload == bulk_pattern(payload.len(), seq),
            "a request of {} bytes arrived corrupted",
            payload.len()
        );
        self.0
            .lock()
            .unwrap()
            .push((payload.as_ptr() as usize, payload.len()));
        Ok(Response::new(EchoReply {
            payload: bytes::Bytes::new(),
            seq,
        }))
    }
}

/// A large request lands where the server offered ([`Server::builder`]'s
/// `land_requests_in`): in the first landing whose buffer is free and large enough, and
/// the handler's `bytes` field is a view of it; a body no landing fits goes to the pool.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_large_request_lands_in_the_servers_buffer() {
    let _one = one_at_a_time();
    if require_device().is_none() {
        return;
    }
    let sizes = [16 * MIB, 64 * MIB];
    let landings = sizes.map(|len| Landing::new(RegisteredBuffer::new(len).expect("a buffer")));
    let ranges: Vec<_> = landings.iter().map(addresses).collect();
    let seen = Recording::default();
    let builder = Server::builder()
        .max_message_size(256 * MIB)
        .land_requests_in(landings.clone())
        .add_service(EchoServer::new(seen.clone()));
    let server = common::start_rdma(builder, RdmaConfig::default());
    let echo = EchoClient::new(connect(&server));
    for (len, into) in [
        (8 * MIB, Some(0)),
        (40 * MIB, Some(1)),
        (8 * MIB + 1, Some(0)),
        (100 * MIB, None),
    ] {
        // The last request's views may be let go just after its answer.
        landings.iter().for_each(free);
        let before = large_body_bytes().landed;
        let payload = bulk_pattern(len, len as u64).into();
        echo.echo_blocking(EchoRequest {
            payload,
            seq: len as u64,
        })
        .expect("echo");
        let (start, got) = seen.0.lock().unwrap().pop().expect("the handler ran");
        assert_eq!(got, len);
        let landed_in = ranges
            .iter()
            .position(|r| r.contains(&start) && start + got <= r.end);
        assert_eq!(landed_in, into, "a request of {len} bytes");
        let landed = large_body_bytes().landed - before;
        match into {
            Some(_) => assert!(landed >= len as u64 && landed < len as u64 + 64, "{landed}"),
            None => assert_eq!(landed, 0),
        }
    }
    // The handler let go of its views: the buffers are back, writable.
    for landing in &landings {
        assert!(back(landing).get_mut().is_some());
    }
}

/// Landings offered for one method's requests (`land_method_requests_in`) take its
/// bodies before the landings for every method, and take no other method's: each
/// handler's bodies arrive where it asked.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn a_methods_requests_land_in_the_buffers_offered_for_it() {
    let _one = one_at_a_time();
    if require_device().is_none() {
        return;
    }
    let any = Landing::new(RegisteredBuffer::new(16 * MIB).expect("a buffer"));
    let echo_only = Landing::new(RegisteredBuffer::new(16 * MIB).expect("a buffer"));
    let echo_range = addresses(&echo_only);
    let seen = Recording::default();
    let builder = Server::builder()
        .max_message_size(256 * MIB)
        .land_requests_in([any.clone()])
        .land_method_requests_in("/echo.Echo/Echo", [echo_only.clone()])
        .add_service(EchoServer::new(seen.clone()))
        .add_service(TesterServer::new(Tester::default()));
    let server = common::start_rdma(builder, RdmaConfig::default());
    let channel = connect(&server);
    // The echo's body: into its method's landing, though the one for any method is free
    // and was offered first.
    let len = 8 * MIB;
    EchoClient::new(channel.clone())
        .echo_blocking(EchoRequest {
            payload: bulk_pattern(len, 5).into(),
            seq: 5,
        })
        .expect("echo");
    let (start, got) = seen.0.lock().unwrap().pop().expect("the handler ran");
    assert!(
        echo_range.contains(&start) && start + got <= echo_range.end,
        "the echo's body landed elsewhere"
    );
    // Another method's body: into the landing for any method, not the echo's.
    free(&echo_only);
    let before = large_body_bytes().landed;
    send(
        &TesterClient::new(channel),
        bulk_pattern(6 * MIB, 6).into(),
        6,
    );
    let landed = large_body_bytes().landed - before;
    assert!(
        (6 * MIB as u64..6 * MIB as u64 + 64).contains(&landed),
        "{landed}"
    );
    let mut any = back(&any);
    let any = any.get_mut().expect("nothing views it");
    assert!(
        any[..6 * MIB].iter().any(|&b| b != 0),
        "the bulk body is not in it"
    );
    let mut echo_only = back(&echo_only);
    let at = start - echo_range.start;
    assert!(
        echo_only.get_mut().expect("nothing views it")[at..at + len] == bulk_pattern(len, 5),
        "another method's body landed in the echo's buffer"
    );
}

/// The same code over `tcp://`: the bytes are copied, and arrive.
#[test]
fn registered_memory_works_over_tcp() {
    let _one = one_at_a_time();
    let offered = Landing::new(RegisteredBuffer::new(16 * MIB).expect("a buffer"));
    let server: ServerHandle = builder()
        .land_requests_in([offered.clone()])
        .start("tcp://127.0.0.1:0")
        .expect("tcp server");
    let client = TesterClient::new(connect(&server));
    let buffer = filled(8 * MIB, 3);
    send(&client, buffer.slice(..), 3);
    send(&client, buffer.slice(..2 * MIB + 1), 3);
    // A landing offered for a response is left alone: the response arrives as without it.
    let landing = Landing::new(buffer);
    let before = large_body_bytes().landed;
    bulk_into(&client, Some(&landing), 4 * MIB, 4);
    assert!(landing.take::<RegisteredBuffer>().is_some());
    assert!(
        offered.take::<RegisteredBuffer>().is_some(),
        "a landing tcp:// left alone"
    );
    assert_eq!(large_body_bytes().landed, before);
}

/// The `blob-transfer` example: its buffer goes to the server and back with only the
/// messages' framing copied, the response landing in the buffer offered for it.
#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn the_blob_example_moves_its_buffer_uncopied() {
    let _one = one_at_a_time();
    if require_device().is_none() {
        return;
    }
    let len = 32 * MIB + 5;
    let url = format!(
        "rdma://{}:0",
        rpc_transport_rdma::verbs::test_support::test_addr()
    );
    let done = blob::transfer(&url, len, None, 2).expect("the transfers");
    eprintln!("{done:?}");
    let moved = 2 * len as u64 * u64::from(done.rounds);
    assert_eq!(done.bodies.in_place, moved, "both ways from where they lay");
    assert!(done.bodies.copied < 512, "{:?}", done.bodies);
    assert!(done.bodies.landed >= moved, "{:?}", done.bodies);
    assert!(done.landed_in_place, "the responses landed elsewhere");
}

/// The same example over `tcp://`: the same code, copying.
#[test]
fn the_blob_example_works_over_tcp() {
    let _one = one_at_a_time();
    let done = blob::transfer("tcp://127.0.0.1:0", 4 * MIB + 1, None, 2).expect("the transfers");
    assert_eq!(done.rounds, 2);
    assert_eq!(done.bodies, LargeBodyBytes::default(), "no RDMA body");
}
