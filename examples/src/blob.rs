//! A large buffer to a server and back without the framework copying it (`blob-transfer`).
//!
//! The application registers its buffer once ([`RegisteredBuffer`]) and sends views of it.
//! Over `rdma://` the request's body goes by RDMA WRITE from where it lies into a buffer the
//! server registered for request bodies (`land_requests_in`); the echo handler sends the body
//! back from there, and the response lands in a buffer the client offered for it
//! ([`Request::receive_into`]). The reply's `payload` is a view of that buffer. Over `tcp://`
//! the same code works, and copies.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rdma_rpc::prelude::*;
use rdma_rpc::{large_body_bytes, Landing, LargeBodyBytes, RegisteredBuffer, ServeExt};

use crate::echo::echo_client::EchoClient;
use crate::echo::echo_server::EchoServer;
use crate::echo::EchoRequest;
use crate::EchoService;

/// How much larger than its body a message may be (its other fields and their framing): a
/// landing holds the whole encoded message, so each is this much larger than the buffer.
const FRAMING: usize = 64;

/// How the transfers went.
#[derive(Debug, Clone, Default)]
pub struct Transferred {
    /// Bytes of the buffer.
    pub len: usize,
    /// Round trips made (each sends the buffer and receives it back).
    pub rounds: u32,
    /// The fastest round trip.
    pub best: Duration,
    /// The large-body counters' growth over all rounds (the process's, both sides).
    pub bodies: LargeBodyBytes,
    /// Whether every response was a view of the buffer the client offered for it.
    pub landed_in_place: bool,
    /// This process's pinned memory before the buffers were made and after the transfers,
    /// in bytes (`VmPin`; `None` where the system does not report it). Memory other work of
    /// the process lets go of meanwhile counts against the growth.
    pub pinned: Option<(u64, u64)>,
    /// Bytes the three buffers (the source, the server's landing, the client's landing)
    /// hold.
    pub buffers: u64,
}

impl Transferred {
    /// Bytes per second moved by the fastest round trip, both ways counted.
    pub fn goodput(&self) -> f64 {
        2.0 * self.len as f64 / self.best.as_secs_f64()
    }
}

/// Sends a registered buffer of `len` bytes (`file`'s, or a pattern without one) to an
/// echo server started on `url` (port 0 picks one) and back, `rounds` times, into a buffer
/// offered for the response, and checks every answer is what was sent.
pub fn transfer(
    url: &str,
    len: usize,
    file: Option<&std::path::Path>,
    rounds: u32,
) -> Result<Transferred, Box<dyn std::error::Error>> {
    let framed = len
        .checked_add(FRAMING)
        .ok_or("a buffer larger than the address space")?;
    let pinned_before = pinned_bytes();
    let source = source(len, file)?;
    let server_landing = Landing::new(RegisteredBuffer::new(framed)?);
    let server = Server::builder()
        .max_message_size(framed)
        .land_requests_in([server_landing.clone()])
        .add_service(EchoServer::new(EchoService))
        .start(url)?;
    let channel = rdma_rpc::client()
        .max_message_size(framed)
        .connect_blocking(server.local_url())?;
    let client = EchoClient::new(channel);
    let landing = Landing::new(RegisteredBuffer::new(framed)?);
    let range = landing_range(&landing)?;

    let mut done = Transferred {
        len,
        rounds,
        best: Duration::MAX,
        landed_in_place: true,
        buffers: registered_for(len),
        ..Transferred::default()
    };
    let before = large_body_bytes();
    for seq in 0..u64::from(rounds) {
        let mut request = Request::new(EchoRequest {
            payload: source.slice(..),
            seq,
        });
        request.receive_into(landing.clone());
        let started = Instant::now();
        let reply = client.echo_blocking(request)?.into_inner();
        done.best = done.best.min(started.elapsed());
        if reply.payload != source.slice(..) || reply.seq != seq {
            return Err(format!("round {seq}: the buffer came back changed").into());
        }
        let start = reply.payload.as_ptr() as usize;
        done.landed_in_place &= range.contains(&start) && start + len <= range.end;
        drop(reply);
        // Both landings are free again once their memory windows are invalidated, which
        // may complete just after the call returned.
        wait_free(&landing)?;
        wait_free(&server_landing)?;
    }
    done.bodies = large_body_bytes().since(&before);
    done.pinned = pinned_before.zip(pinned_bytes());
    server.shutdown_blocking(Duration::from_secs(1));
    Ok(done)
}

/// Bytes of the buffers [`transfer`] registers for a buffer of `len` bytes, with it: the
/// source and the two landings.
pub fn registered_for(len: usize) -> u64 {
    (len as u64)
        .saturating_mul(3)
        .saturating_add(2 * FRAMING as u64)
}

/// A registered buffer of `len` bytes read from `file`, or of a pattern without one.
fn source(
    len: usize,
    file: Option<&std::path::Path>,
) -> Result<RegisteredBuffer, Box<dyn std::error::Error>> {
    let mut buffer = RegisteredBuffer::new(len)?;
    let bytes = buffer.get_mut().ok_or("a new buffer is held elsewhere")?;
    match file {
        Some(path) => {
            use std::io::Read;
            std::fs::File::open(path)?.read_exact(bytes)?;
        }
        None => bytes.copy_from_slice(&crate::bulk_pattern(len, 1)),
    }
    Ok(buffer)
}

/// The addresses of the [`RegisteredBuffer`] `landing` holds.
pub fn landing_range(
    landing: &Landing,
) -> Result<std::ops::Range<usize>, Box<dyn std::error::Error>> {
    let buffer = landing
        .take::<RegisteredBuffer>()
        .ok_or("the landing holds no buffer")?;
    let view: Bytes = buffer.slice(..);
    let range = view.as_ptr() as usize..view.as_ptr() as usize + view.len();
    drop(view);
    landing
        .put(buffer)
        .map_err(|_| "the landing was filled meanwhile")?;
    Ok(range)
}

/// Waits (at most 30 s) until `landing` holds its buffer again with nothing viewing it: the
/// response's memory window is invalidated just after the call may have returned.
pub fn wait_free(landing: &Landing) -> Result<(), Box<dyn std::error::Error>> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(mut buffer) = landing.take::<RegisteredBuffer>() {
            let free = buffer.get_mut().is_some();
            landing
                .put(buffer)
                .map_err(|_| "the landing was filled meanwhile")?;
            if free {
                return Ok(());
            }
        }
        if Instant::now() > until {
            return Err("the response's buffer did not come back to its landing".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// This process's pinned memory (`VmPin`), in bytes, where Linux reports it.
pub fn pinned_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmPin:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}
