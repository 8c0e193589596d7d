//! The floor of `tcp-compare`: a blocking ping-pong of length-prefixed frames over a plain
//! `std::net::TcpStream` with `TCP_NODELAY`, against a thread that echoes them. No RPC
//! layer at all: what the kernel's loopback costs.

use crate::clock::Instant;
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;

use crate::error::BenchError;
use crate::payload::Payloads;
use crate::recorder::{Recorder, RunInfo};
use crate::result::BenchResult;

/// Bytes of the length prefix (little-endian u32) before each frame's payload.
const PREFIX: usize = 4;
/// Read buffer size: a whole small frame arrives with one `read`.
const READ_BUFFER: usize = 64 * 1024;

/// Runs `warmup + iters` ping-pongs of `size`-byte payloads on 127.0.0.1.
pub fn run(size: usize, iters: u64, warmup: u64) -> Result<BenchResult, BenchError> {
    let len = u32::try_from(size)
        .map_err(|_| BenchError::Usage(format!("--size {size} does not fit a u32 prefix")))?;
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::failed("binding the raw TCP echo server", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| BenchError::failed("raw TCP echo server address", e))?;
    let server = spawn_echo(listener)?;
    let stream = TcpStream::connect(addr)
        .and_then(|s| s.set_nodelay(true).map(|()| s))
        .map_err(|e| BenchError::failed(&format!("connecting to {addr}"), e))?;
    let result = ping_pong(stream, len, iters, warmup, &addr.to_string());
    // The client's stream is closed by now: the echo thread sees end of stream and exits.
    let _ = server.join();
    result
}

fn ping_pong(
    stream: TcpStream,
    len: u32,
    iters: u64,
    warmup: u64,
    addr: &str,
) -> Result<BenchResult, BenchError> {
    let size = len as usize;
    let payloads = Payloads::new(size);
    let mut writer = stream
        .try_clone()
        .map_err(|e| BenchError::failed("cloning the client socket", e))?;
    let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
    let mut frame = Vec::with_capacity(PREFIX + size);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&payloads.request(0));
    let mut reply = vec![0u8; size];
    let mut recorder = Recorder::new(iters, format!("raw-tcp {addr}"));
    let io_error = |seq: u64, e: io::Error| BenchError::failed(&format!("ping {seq}"), e);
    for seq in 0..warmup + iters {
        if seq == warmup {
            recorder.start();
        }
        payloads.restamp(&mut frame[PREFIX..], seq);
        let started = Instant::now();
        writer.write_all(&frame).map_err(|e| io_error(seq, e))?;
        let mut prefix = [0u8; PREFIX];
        reader
            .read_exact(&mut prefix)
            .and_then(|()| reader.read_exact(&mut reply))
            .map_err(|e| io_error(seq, e))?;
        let done = Instant::now();
        if u32::from_le_bytes(prefix) != len {
            return Err(BenchError::Mismatch {
                seq,
                what: format!("length prefix {}", u32::from_le_bytes(prefix)),
            });
        }
        // The raw frames carry no seq field: the stamp inside the payload stands in for it.
        payloads.verify(seq, seq, &reply)?;
        if seq >= warmup {
            recorder.record(done - started, done);
        }
    }
    Ok(recorder.finish(RunInfo {
        transport: "raw-tcp".to_owned(),
        url: addr.to_owned(),
        size,
        warmup,
        concurrency: 1,
        poll: None,
        async_stubs: false,
    }))
}

/// Accepts one connection and echoes its frames until end of stream.
fn spawn_echo(listener: TcpListener) -> Result<JoinHandle<()>, BenchError> {
    std::thread::Builder::new()
        .name("raw-tcp-echo".into())
        .spawn(move || {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            if let Err(e) = echo(stream) {
                eprintln!("raw TCP echo server: {e}");
            }
        })
        .map_err(|e| BenchError::failed("spawning the raw TCP echo server", e))
}

fn echo(stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
    let mut frame = Vec::new();
    loop {
        let mut prefix = [0u8; PREFIX];
        match reader.read_exact(&mut prefix) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let len = u32::from_le_bytes(prefix) as usize;
        frame.clear();
        frame.extend_from_slice(&prefix);
        frame.resize(PREFIX + len, 0);
        reader.read_exact(&mut frame[PREFIX..])?;
        writer.write_all(&frame)?;
    }
}
