//! Calls the echo service and checks every answer.
//!
//! ```text
//! echo-client tcp://127.0.0.1:50051 --message hello
//! echo-client rdma://192.168.77.1:7471 --count 1000 --size 4096
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;

#[derive(Parser, Debug)]
#[command(about = "Call the echo service")]
struct Args {
    /// Server URL: tcp://host:port or rdma://host:port.
    #[arg(default_value = "tcp://127.0.0.1:50051")]
    url: String,
    /// Text to send (ignored when --size is given).
    #[arg(long, default_value = "hello over rdma-rpc")]
    message: String,
    /// Send a payload of this many bytes instead of the message.
    #[arg(long)]
    size: Option<usize>,
    /// Number of calls.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo-client: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let client = EchoClient::new(rdma_rpc::connect_blocking(&args.url)?);
    let payload = match args.size {
        Some(n) => (0..n).map(|i| (i % 251) as u8).collect(),
        None => args.message.clone().into_bytes(),
    };
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(args.count as usize);
    for seq in 0..args.count {
        let call_started = Instant::now();
        let reply = client
            .echo_blocking(EchoRequest {
                payload: payload.clone().into(),
                seq,
            })?
            .into_inner();
        latencies.push(call_started.elapsed());
        if reply.seq != seq || reply.payload != payload {
            return Err(format!("call {seq}: the echo does not match the request").into());
        }
    }
    latencies.sort_unstable();
    let percentile = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    let elapsed = started.elapsed();
    if args.count == 1 && args.size.is_none() {
        println!("{}", String::from_utf8_lossy(&payload));
    }
    println!(
        "{} call(s) of {} bytes to {} in {:.3?} ({:.1} µs/call; p50 {:.1?}, p99 {:.1?})",
        args.count,
        payload.len(),
        args.url,
        elapsed,
        elapsed.as_secs_f64() * 1e6 / args.count.max(1) as f64,
        percentile(0.5),
        percentile(0.99),
    );
    Ok(())
}
