//! `rpc-bench`: serve the echo service, measure calls against it, or compare transports.
//!
//! ```text
//! rpc-bench server   --url rdma://192.168.77.1:7471 [--poll busy|event|adaptive]
//! rpc-bench client   --url rdma://192.168.77.1:7471 --size 4096 --iters 100000 --json
//! rpc-bench loopback --url tcp://127.0.0.1:0 --size 64 --iters 10000 --concurrency 8
//! rpc-bench tcp-compare --size 32 --iters 20000
//! rpc-bench stream --url rdma://192.168.77.1:0 --size 32 --messages 200000 [--tonic]
//! rpc-bench connections --url rdma://192.168.77.1:7471 --count 1000 --server-pid 4242
//! rpc-bench health --url rdma://192.168.77.1:7471 [--service echo.Echo]
//! ```
//!
//! Exit codes: 0 success, 1 a failure while running (connect, call, reply mismatch),
//! 2 bad arguments or URL.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use rpc_bench::cli::{
    Cli, ClientArgs, Command, CompareArgs, ConnectionsArgs, HealthArgs, ServerArgs, StreamArgs,
};
use rpc_bench::ours::{self, ClientPlan};
use rpc_bench::{compare, BenchError, BenchResult};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => serve(&args),
        Command::Client(args) => client(&args, None),
        Command::Loopback(args) => loopback(&args),
        Command::TcpCompare(args) => tcp_compare(&args),
        Command::Stream(args) => stream(&args),
        Command::Connections(args) => connections(&args),
        Command::Health(args) => health(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpc-bench: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn stream(args: &StreamArgs) -> Result<(), BenchError> {
    use rpc_bench::streaming;
    let ours = streaming::run_ours(
        &args.url,
        args.rdma.config(),
        args.size,
        args.messages,
        args.window_bytes,
    )?;
    let tonic = if args.tonic {
        Some(streaming::run_tonic(args.size, args.messages)?)
    } else {
        None
    };
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        std::iter::once(&ours)
            .chain(tonic.as_ref())
            .try_for_each(|r| writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default()))
    } else {
        writeln!(out, "{}", ours.line()).and_then(|()| match &tonic {
            Some(tonic) => writeln!(
                out,
                "{}\nours/tonic messages/s = {:.2}x",
                tonic.line(),
                ours.messages_per_sec / tonic.messages_per_sec
            ),
            None => Ok(()),
        })
    };
    written.map_err(|e| BenchError::failed("writing to stdout", e))
}

fn health(args: &HealthArgs) -> Result<(), BenchError> {
    use rdma_rpc::health::pb::{health_client::HealthClient, HealthCheckRequest};
    use rdma_rpc::health::ServingStatus;
    let timeout = std::time::Duration::from_millis(args.timeout_ms);
    let url = args.url.to_string();
    let channel = rdma_rpc::client()
        .rdma_config(args.rdma.config())
        .connect_timeout(timeout)
        .connect_blocking(&url)
        .map_err(|e| BenchError::failed(&format!("connecting to {url}"), e))?;
    let mut request = rdma_rpc::Request::new(HealthCheckRequest {
        service: args.service.clone(),
    });
    request.set_timeout(timeout);
    let status = HealthClient::new(channel)
        .check_blocking(request)
        .map_err(|e| BenchError::failed(&format!("checking {:?}", args.service), e))?
        .into_inner()
        .status();
    println!("{}", status.as_str_name());
    if status == ServingStatus::Serving {
        Ok(())
    } else {
        Err(BenchError::failed(
            &format!("{:?}", args.service),
            "not serving",
        ))
    }
}

fn serve(args: &ServerArgs) -> Result<(), BenchError> {
    let server = ours::start_server(&args.url, args.rdma.config())?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {}", server.local_url())
        .and_then(|()| stdout.flush())
        .map_err(|e| BenchError::failed("writing to stdout", e))?;
    drop(stdout);
    loop {
        std::thread::park();
    }
}

fn plan(args: &ClientArgs) -> ClientPlan {
    ClientPlan {
        size: args.run.size,
        iters: args.run.iters,
        warmup: args.run.warmup,
        concurrency: args.concurrency,
        async_stubs: args.async_stubs,
        registered: args.registered,
        rdma: args.rdma.config(),
        poll: args.rdma.poll_name(&args.url),
        tls: None,
    }
}

/// Runs the client against `url` (default: `--url`) and prints the result.
fn client(args: &ClientArgs, url: Option<&str>) -> Result<(), BenchError> {
    let default_url = args.url.to_string();
    let result = ours::run_client(url.unwrap_or(&default_url), &plan(args))?;
    print_result(&result, args.json)
}

fn loopback(args: &ClientArgs) -> Result<(), BenchError> {
    let server = ours::start_server(&args.url, args.rdma.config())?;
    let outcome = client(args, Some(server.local_url()));
    server.shutdown_blocking(std::time::Duration::from_secs(1));
    outcome
}

fn connections(args: &ConnectionsArgs) -> Result<(), BenchError> {
    let report = rpc_bench::fleet::run(
        &args.url,
        args.count,
        args.server_pid,
        std::time::Duration::from_secs(args.idle_secs),
        args.rdma.config(),
    )?;
    let text = if args.json {
        serde_json::to_string(&report).map_err(|e| BenchError::failed("encoding JSON", e))? + "\n"
    } else {
        report.text()
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| BenchError::failed("writing to stdout", e))
}

fn tcp_compare(args: &CompareArgs) -> Result<(), BenchError> {
    let report = compare::run(
        args.run.size,
        args.run.iters,
        args.run.warmup,
        args.in_flight as usize,
    )?;
    let text = if args.json {
        serde_json::to_string(&report).map_err(|e| BenchError::failed("encoding JSON", e))?
    } else {
        report.table()
    };
    println!("{}", text.trim_end());
    Ok(())
}

fn print_result(result: &BenchResult, json: bool) -> Result<(), BenchError> {
    if json {
        let text =
            serde_json::to_string(result).map_err(|e| BenchError::failed("encoding JSON", e))?;
        println!("{text}");
    } else {
        println!("{}", result.summary_line());
    }
    Ok(())
}
