//! The `rpc-bench` command line.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use rdma_rpc::{Endpoint, PollMode, RdmaConfig, Receives, SharedRecvConfig, TransportKind};

/// Default warm-up calls before measuring.
pub const DEFAULT_WARMUP: u64 = 1000;

/// `rpc-bench`: latency and throughput of the echo service over rdma-rpc.
#[derive(Debug, Parser)]
#[command(
    name = "rpc-bench",
    version,
    about = "Latency and throughput of the echo service over rdma-rpc (tcp:// and rdma://)"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the echo service until killed; the first line on stdout is `listening on <url>`.
    Server(ServerArgs),
    /// Measure calls against a running `rpc-bench server`.
    Client(ClientArgs),
    /// Start the server in this process on --url (port 0 picks a free port) and measure
    /// calls against it.
    Loopback(ClientArgs),
    /// On TCP loopback: rdma-rpc (tcp://) vs tonic vs a raw length-prefixed ping-pong, one
    /// call at a time.
    TcpCompare(CompareArgs),
    /// Start the streaming service in this process on --url and stream --messages chunks of
    /// --size bytes from one server-streaming call; with --tonic, also tonic on 127.0.0.1.
    Stream(StreamArgs),
    /// Open many connections to a running `rpc-bench server` (one call each), let them sit
    /// idle, and report the server process's threads, pinned memory and idle CPU.
    Connections(ConnectionsArgs),
    /// Ask a server's standard health service (`grpc.health.v1.Health/Check`) whether
    /// --service is serving, as an orchestrator's probe does: prints the status, exits 0 if
    /// SERVING and 1 otherwise (including NOT_FOUND, an unreachable server or the deadline).
    Health(HealthArgs),
}

/// Arguments of `rpc-bench health`.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Server URL.
    #[arg(long, value_parser = parse_url)]
    pub url: Endpoint,
    /// Fully qualified service name; empty: the server as a whole.
    #[arg(long, default_value = "")]
    pub service: String,
    /// Deadline of the check, connecting included, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub timeout_ms: u64,
    /// RDMA settings.
    #[command(flatten)]
    pub rdma: RdmaArgs,
}

/// Arguments of `rpc-bench connections`.
#[derive(Debug, Args)]
pub struct ConnectionsArgs {
    /// Server URL (a running `rpc-bench server`).
    #[arg(long, value_parser = parse_url)]
    pub url: Endpoint,
    /// Connections to open.
    #[arg(long, default_value_t = 200, value_parser = positive_usize)]
    pub count: usize,
    /// Process id of the server, whose /proc entry is read.
    #[arg(long)]
    pub server_pid: u32,
    /// Seconds every connection sits idle while the server's CPU time is measured.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// Print exactly one JSON object on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// RDMA settings.
    #[command(flatten)]
    pub rdma: RdmaArgs,
}

/// Arguments of `rpc-bench stream`.
#[derive(Debug, Args)]
pub struct StreamArgs {
    /// Where to serve: tcp://host:port or rdma://host:port (port 0 picks one).
    #[arg(long, value_parser = parse_url, default_value = "tcp://127.0.0.1:0")]
    pub url: Endpoint,
    /// Payload bytes per message.
    #[arg(long, value_name = "BYTES", default_value_t = 32)]
    pub size: usize,
    /// Messages in the measured stream.
    #[arg(long, value_name = "N", default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub messages: u64,
    /// The client's stream window in bytes (default: the library's, 2 MiB): how much the
    /// server may send ahead of the reader. Bulk streams of large messages want several
    /// messages' worth, so that transfers overlap.
    #[arg(long, value_name = "BYTES")]
    pub window_bytes: Option<u64>,
    /// Also stream through tonic over TCP loopback and print the ratio.
    #[arg(long)]
    pub tonic: bool,
    /// Print one JSON object per run on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// RDMA settings.
    #[command(flatten)]
    pub rdma: RdmaArgs,
}

/// Arguments of `rpc-bench server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Where to listen: tcp://host:port or rdma://host:port (port 0 picks one).
    #[arg(long, value_parser = parse_url)]
    pub url: Endpoint,
    /// RDMA settings.
    #[command(flatten)]
    pub rdma: RdmaArgs,
}

/// Arguments of `rpc-bench client` and `rpc-bench loopback`.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Server URL: tcp://host:port or rdma://host:port (for loopback: where to start it).
    #[arg(long, value_parser = parse_url)]
    pub url: Endpoint,
    /// Size and number of calls.
    #[command(flatten)]
    pub run: RunArgs,
    /// Calls kept in flight: 1 runs the blocking stub on this thread; more run async calls
    /// on a single-threaded tokio runtime.
    #[arg(long, default_value_t = 1, value_parser = positive_usize)]
    pub concurrency: usize,
    /// Run even one call in flight through the async stubs (on the single-threaded tokio
    /// runtime) instead of the blocking stub.
    #[arg(long)]
    pub async_stubs: bool,
    /// Send each request's payload from a `RegisteredBuffer` (one call at a time, blocking
    /// stub): large requests go by RDMA WRITE from it, uncopied.
    #[arg(long)]
    pub registered: bool,
    /// Print exactly one JSON object (a `BenchResult`) on stdout instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// RDMA settings.
    #[command(flatten)]
    pub rdma: RdmaArgs,
}

/// Payload size and call counts.
#[derive(Debug, Clone, Copy, Args)]
pub struct RunArgs {
    /// Payload bytes per request (the reply carries as many).
    #[arg(long, value_name = "BYTES", default_value_t = 32)]
    pub size: usize,
    /// Measured calls (at least 1).
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,
    /// Calls made before measuring.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WARMUP)]
    pub warmup: u64,
}

/// Arguments of `rpc-bench tcp-compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Size and number of calls (each of the three runs makes them all).
    #[command(flatten)]
    pub run: RunArgs,
    /// Calls in flight on one connection in the throughput runs (ours and tonic).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub in_flight: u64,
    /// Print exactly one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// How RDMA completions are polled (`--poll`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PollArg {
    /// Spin on the completion queue: lowest latency, one busy core per connection.
    Busy,
    /// Sleep on the completion channel: no idle CPU, a wake-up per message.
    Event,
    /// Spin for --spin-us after activity, then sleep (the library default).
    Adaptive,
}

/// RDMA settings; ignored for tcp:// URLs.
#[derive(Debug, Clone, Args)]
pub struct RdmaArgs {
    /// RDMA completion polling (default: adaptive with the library's spin time).
    #[arg(long, value_enum)]
    pub poll: Option<PollArg>,
    /// Spin time of --poll adaptive, µs.
    #[arg(long, value_name = "US", default_value_t = 100)]
    pub spin_us: u64,
    /// Slots in each RDMA ring (one credit per receive slot).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(3..=65536))]
    pub slots: Option<u32>,
    /// Bytes per RDMA ring slot: the largest frame sent inline by SEND.
    #[arg(long, value_name = "BYTES",
          value_parser = clap::value_parser!(u32).range(64..=16 * 1024 * 1024))]
    pub slot_size: Option<u32>,
    /// Where RDMA receives land: a ring per connection, or one shared receive queue per
    /// process (default: the library's).
    #[arg(long, value_enum)]
    pub recv: Option<RecvArg>,
    /// Empty looks at the CQs event polling takes after completions before it sleeps
    /// (default: the library's).
    #[arg(long, value_name = "N")]
    pub linger: Option<u32>,
    /// Receive slots posted at first, the peer's initial credits (default: the library's:
    /// the whole ring, or 4 on a shared receive queue).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(3..=65536))]
    pub recv_window: Option<u32>,
    /// Longest an RDMA connection may take to set up, ms (default: the library's; raise it
    /// to run under valgrind).
    #[arg(long, value_name = "MS")]
    pub connect_timeout_ms: Option<u64>,
    /// Bytes per RDMA WRITE of a large body (default: the library's, `LargeBodies::chunk`).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(4096..))]
    pub write_chunk: Option<u32>,
    /// RDMA WRITEs of large bodies outstanding per connection (default: the library's,
    /// `LargeBodies::write_window`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub write_window: Option<u32>,
    /// Request bodies of at least this many bytes are read by the server by RDMA READ
    /// (default: the library's, `LargeBodies::read_from`; `never` for the rendezvous only).
    #[arg(long, value_name = "BYTES|never", value_parser = parse_read_from)]
    pub read_from: Option<u64>,
}

fn parse_read_from(arg: &str) -> Result<u64, String> {
    match arg {
        "never" => Ok(u64::MAX),
        bytes => bytes
            .parse()
            .map_err(|e| format!("{bytes}: a byte count or `never`: {e}")),
    }
}

/// Where RDMA receives land (`--recv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RecvArg {
    /// Servers share a receive queue, clients have rings (the library's default).
    Auto,
    /// A ring of receive slots registered and posted per connection.
    Ring,
    /// One shared receive queue, with the library's default bounds.
    Shared,
}

impl RdmaArgs {
    /// The RDMA configuration these arguments select.
    pub fn config(&self) -> RdmaConfig {
        let mut config = RdmaConfig::default();
        if let Some(poll) = self.poll {
            config.polling.mode = match poll {
                PollArg::Busy => PollMode::Busy,
                PollArg::Event => PollMode::Event,
                PollArg::Adaptive => PollMode::Adaptive {
                    spin: Duration::from_micros(self.spin_us),
                },
            };
        }
        if let Some(slots) = self.slots {
            config.rings.slots = slots;
        }
        if let Some(slot_size) = self.slot_size {
            config.rings.slot_size = slot_size;
        }
        if let Some(linger) = self.linger {
            config.polling.event_linger = linger;
        }
        if let Some(window) = self.recv_window {
            config.rings.recv_window = Some(window);
        }
        if let Some(ms) = self.connect_timeout_ms {
            config.liveness.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(chunk) = self.write_chunk {
            config.large.chunk = chunk;
        }
        if let Some(window) = self.write_window {
            config.large.write_window = window;
        }
        if let Some(from) = self.read_from {
            config.large.read_from = from;
        }
        match self.recv {
            Some(RecvArg::Ring) => config.rings.recv = Receives::Ring,
            Some(RecvArg::Shared) => {
                config.rings.recv = Receives::Shared(SharedRecvConfig::default())
            }
            Some(RecvArg::Auto) | None => {}
        }
        config
    }

    /// The polling mode's name for results, for rdma:// endpoints only.
    pub fn poll_name(&self, endpoint: &Endpoint) -> Option<String> {
        if endpoint.kind() != TransportKind::Rdma {
            return None;
        }
        Some(match self.config().polling.mode {
            PollMode::Busy => "busy".to_owned(),
            PollMode::Event => "event".to_owned(),
            PollMode::Adaptive { spin } => format!("adaptive({}us)", spin.as_micros()),
        })
    }
}

/// Parses a `tcp://` or `rdma://` URL; the error names the URL and the problem.
pub fn parse_url(text: &str) -> Result<Endpoint, String> {
    text.parse::<Endpoint>().map_err(|e| e.to_string())
}

fn positive_usize(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_a_loopback_run() {
        let cli = Cli::try_parse_from([
            "rpc-bench",
            "loopback",
            "--url",
            "rdma://10.0.0.1:0",
            "--size",
            "64",
            "--iters",
            "5",
            "--poll",
            "busy",
            "--slots",
            "16",
        ])
        .unwrap();
        let Command::Loopback(args) = cli.command else {
            panic!("loopback expected")
        };
        assert_eq!(
            (args.run.size, args.run.iters, args.concurrency),
            (64, 5, 1)
        );
        let config = args.rdma.config();
        assert_eq!(
            (config.polling.mode, config.rings.slots),
            (PollMode::Busy, 16)
        );
        assert_eq!(args.rdma.poll_name(&args.url).as_deref(), Some("busy"));
    }

    #[test]
    fn rejects_bad_values() {
        for bad in [
            &["rpc-bench", "client", "--url", "http://h:1"][..],
            &["rpc-bench", "client", "--url", "tcp://h:1", "--iters", "0"],
            &[
                "rpc-bench",
                "client",
                "--url",
                "tcp://h:1",
                "--concurrency",
                "0",
            ],
            &["rpc-bench", "server", "--url", "tcp://h:1", "--slots", "2"],
            &["rpc-bench", "client"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
