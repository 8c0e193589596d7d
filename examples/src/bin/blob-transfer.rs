//! Moves a large buffer (a file's contents, or a pattern) to a server and back without the
//! framework copying it, and prints how the bytes went: sent in place, copied, landed in the
//! application's memory; the fastest round trip, and the memory the process pinned.
//!
//! ```text
//! blob-transfer rdma://192.168.77.1:0 --size 1GiB
//! blob-transfer rdma://192.168.77.1:0 --file /var/tmp/image.raw --rounds 3
//! blob-transfer tcp://127.0.0.1:0 --size 64MiB     # the same code, copying
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rpc_examples::blob::{self, Transferred};

#[derive(Parser, Debug)]
#[command(about = "Move a large buffer to a server and back, uncopied")]
struct Args {
    /// Where the server listens (port 0 picks one): rdma://host:port or tcp://host:port.
    url: String,
    /// Bytes to move (a number, optionally with KiB, MiB or GiB); ignored with --file.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    size: usize,
    /// Move this file's contents instead of a pattern.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Round trips.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

/// Registered memory left for the transport's pools beyond the buffers.
const POOLS: u64 = 512 << 20;
/// Largest buffer this program moves (its three buffers are registered memory).
const MAX_SIZE: usize = 1 << 40;

fn parse_size(text: &str) -> Result<usize, String> {
    let (digits, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |at| text.split_at(at));
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        other => return Err(format!("unknown unit {other:?}: use KiB, MiB or GiB")),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{text:?}: expected a number of bytes, e.g. 64MiB"))?;
    match n.checked_shl(shift).filter(|bytes| bytes >> shift == n) {
        Some(0) => Err("a size of 0 bytes".to_owned()),
        Some(bytes) if bytes <= MAX_SIZE => Ok(bytes),
        _ => Err(format!("{text:?}: more than this program moves (1 TiB)")),
    }
}

fn main() -> ExitCode {
    rpc_examples::init_tracing();
    let args = Args::parse();
    let len = match &args.file {
        Some(path) => match std::fs::metadata(path).map(|meta| meta.len()) {
            Ok(0) => return fail(&format!("{}: empty", path.display())),
            Ok(len) if len <= MAX_SIZE as u64 => len as usize,
            Ok(_) => return fail(&format!("{}: more than 1 TiB", path.display())),
            Err(e) => return fail(&format!("{}: {e}", path.display())),
        },
        None => args.size,
    };
    // The three buffers are registered memory, which the process's limit (by default half
    // the machine's) must hold on top of what the transport's pools take.
    let limits = rdma_rpc::process_limits();
    let wanted = blob::registered_for(len) + POOLS;
    if wanted > limits.registered_bytes {
        rdma_rpc::set_process_limits(rdma_rpc::ProcessLimits {
            registered_bytes: wanted,
            ..limits
        });
    }
    let result = blob::transfer(&args.url, len, args.file.as_deref(), args.rounds);
    match result {
        Ok(done) => {
            report(&done);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e.to_string()),
    }
}

fn report(done: &Transferred) {
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    println!(
        "{} round trips of {:.1} MiB: the fastest {:.1?}, {:.1} MiB/s both ways counted",
        done.rounds,
        mib(done.len as u64),
        done.best,
        done.goodput() / f64::from(1 << 20),
    );
    let b = &done.bodies;
    println!(
        "large bodies: {} B sent in place, {} B copied, {} B landed in the application's buffers",
        b.in_place, b.copied, b.landed
    );
    println!(
        "every response a view of the buffer offered for it: {}",
        done.landed_in_place
    );
    if let Some((before, after)) = done.pinned {
        println!(
            "pinned: {:.1} MiB more than before the buffers were made (the three buffers, \
             registered with a device, hold {:.1} MiB; the transport's pools the rest)",
            mib(after.saturating_sub(before)),
            mib(done.buffers),
        );
    }
}

fn fail(why: &str) -> ExitCode {
    eprintln!("blob-transfer: {why}");
    ExitCode::FAILURE
}
