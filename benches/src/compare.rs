//! `rpc-bench tcp-compare`: rdma-rpc over TCP vs tonic vs the raw-TCP floor, same payload,
//! same call count, one call at a time, on 127.0.0.1; then rdma-rpc vs tonic with several
//! calls in flight on one connection (async stubs); tonic's client against our `grpc://`
//! server beside tonic's own; and ours over `tcps://` (TLS) beside `tcp://`.

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::ours::{self, ClientPlan};
use crate::result::BenchResult;
use crate::tls::RunCertificate;
use crate::{floor, tonic_echo};

/// What `tcp-compare` aims for (not asserted): our p50 at most this multiple of the floor's.
pub const TARGET_P50_OVER_FLOOR: f64 = 1.3;

/// The three runs of `tcp-compare` and their ratios to the floor (`--json` prints this).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    /// Payload bytes per request.
    pub size: usize,
    /// Measured calls of each run.
    pub iters: u64,
    /// The raw length-prefixed ping-pong.
    pub floor: BenchResult,
    /// rdma-rpc over `tcp://`, blocking stub.
    pub ours: BenchResult,
    /// tonic over HTTP/2.
    pub tonic: BenchResult,
    /// Calls in flight of the throughput runs.
    pub in_flight: usize,
    /// rdma-rpc over `tcp://`, async stubs, `in_flight` calls on one connection.
    pub ours_in_flight: BenchResult,
    /// tonic, `in_flight` calls on one HTTP/2 connection.
    pub tonic_in_flight: BenchResult,
    /// `ours_in_flight.calls_per_sec / tonic_in_flight.calls_per_sec`.
    pub ours_over_tonic_in_flight: f64,
    /// tonic's client against our `grpc://` server, one call at a time.
    pub grpc: BenchResult,
    /// tonic's client against our `grpc://` server, `in_flight` calls on one connection.
    pub grpc_in_flight: BenchResult,
    /// `grpc.p50_us / tonic.p50_us`: our gRPC server's latency against tonic's, same client.
    pub grpc_p50_over_tonic: f64,
    /// `grpc_in_flight.calls_per_sec / tonic_in_flight.calls_per_sec`.
    pub grpc_over_tonic_in_flight: f64,
    /// Our client over `grpc://` against tonic's server, one call at a time (blocking
    /// stub).
    pub grpc_client: BenchResult,
    /// Our client over `grpc://` against tonic's server, `in_flight` calls (async stubs).
    pub grpc_client_in_flight: BenchResult,
    /// `grpc_client.p50_us / tonic.p50_us`: our gRPC client's latency against tonic's,
    /// same tonic server.
    pub grpc_client_p50_over_tonic: f64,
    /// `grpc_client_in_flight.calls_per_sec / tonic_in_flight.calls_per_sec`.
    pub grpc_client_over_tonic_in_flight: f64,
    /// rdma-rpc over `tcps://` (TLS), blocking stub.
    pub tls: BenchResult,
    /// rdma-rpc over `tcps://`, async stubs, `in_flight` calls on one connection.
    pub tls_in_flight: BenchResult,
    /// `tls.p50_us / ours.p50_us`: what TLS adds to a call's latency.
    pub tls_p50_over_ours: f64,
    /// `tls_in_flight.calls_per_sec / ours_in_flight.calls_per_sec`.
    pub tls_over_ours_in_flight: f64,
    /// `ours.p50_us / floor.p50_us`.
    pub ours_p50_over_floor: f64,
    /// `tonic.p50_us / floor.p50_us`.
    pub tonic_p50_over_floor: f64,
    /// `ours.calls_per_sec / floor.calls_per_sec`.
    pub ours_rate_over_floor: f64,
    /// `tonic.calls_per_sec / floor.calls_per_sec`.
    pub tonic_rate_over_floor: f64,
}

/// Runs the floor, ours and tonic in turn one call at a time, then ours and tonic with
/// `in_flight` calls in flight (each run with its own server, stopped before the next starts).
pub fn run(
    size: usize,
    iters: u64,
    warmup: u64,
    in_flight: usize,
) -> Result<CompareReport, BenchError> {
    let floor = floor::run(size, iters, warmup)?;
    let ours = run_ours(size, iters, warmup, 1)?;
    let tonic = tonic_echo::run(size, iters, warmup, 1)?;
    let ours_in_flight = run_ours(size, iters, warmup, in_flight)?;
    let tonic_in_flight = tonic_echo::run(size, iters, warmup, in_flight)?;
    let grpc = tonic_echo::run_against_grpc(size, iters, warmup, 1)?;
    let grpc_in_flight = tonic_echo::run_against_grpc(size, iters, warmup, in_flight)?;
    let grpc_client = tonic_echo::run_ours_against_tonic(&plan(size, iters, warmup, 1))?;
    let grpc_client_in_flight =
        tonic_echo::run_ours_against_tonic(&plan(size, iters, warmup, in_flight))?;
    let certificate = RunCertificate::new()?;
    let tls = run_ours_tls(&certificate, &plan(size, iters, warmup, 1))?;
    let tls_in_flight = run_ours_tls(&certificate, &plan(size, iters, warmup, in_flight))?;
    Ok(CompareReport {
        tls_p50_over_ours: tls.p50_us / ours.p50_us,
        tls_over_ours_in_flight: tls_in_flight.calls_per_sec / ours_in_flight.calls_per_sec,
        tls,
        tls_in_flight,
        grpc_client_p50_over_tonic: grpc_client.p50_us / tonic.p50_us,
        grpc_client_over_tonic_in_flight: grpc_client_in_flight.calls_per_sec
            / tonic_in_flight.calls_per_sec,
        grpc_client,
        grpc_client_in_flight,
        grpc_p50_over_tonic: grpc.p50_us / tonic.p50_us,
        grpc_over_tonic_in_flight: grpc_in_flight.calls_per_sec / tonic_in_flight.calls_per_sec,
        grpc,
        grpc_in_flight,
        in_flight,
        ours_over_tonic_in_flight: ours_in_flight.calls_per_sec / tonic_in_flight.calls_per_sec,
        ours_in_flight,
        tonic_in_flight,
        size,
        iters,
        ours_p50_over_floor: ours.p50_us / floor.p50_us,
        tonic_p50_over_floor: tonic.p50_us / floor.p50_us,
        ours_rate_over_floor: ours.calls_per_sec / floor.calls_per_sec,
        tonic_rate_over_floor: tonic.calls_per_sec / floor.calls_per_sec,
        floor,
        ours,
        tonic,
    })
}

/// `iters` echo calls of `size` bytes after `warmup`, `concurrency` in flight (the blocking
/// stub when one at a time).
fn plan(size: usize, iters: u64, warmup: u64, concurrency: usize) -> ClientPlan {
    ClientPlan {
        size,
        iters,
        warmup,
        concurrency,
        async_stubs: false,
        registered: false,
        rdma: rdma_rpc::RdmaConfig::default(),
        poll: None,
        tls: None,
    }
}

fn run_ours(
    size: usize,
    iters: u64,
    warmup: u64,
    concurrency: usize,
) -> Result<BenchResult, BenchError> {
    let url = "tcp://127.0.0.1:0".parse()?;
    let server = ours::start_server(&url, rdma_rpc::RdmaConfig::default())?;
    let result = ours::run_client(server.local_url(), &plan(size, iters, warmup, concurrency));
    server.shutdown_blocking(std::time::Duration::from_secs(1));
    result
}

/// Ours over `tcps://` with `certificate`, `plan`'s calls.
fn run_ours_tls(
    certificate: &RunCertificate,
    plan: &ClientPlan,
) -> Result<BenchResult, BenchError> {
    let url = "tcps://127.0.0.1:0".parse()?;
    let options = rdma_rpc::ServeOptions {
        tcp: rdma_rpc::TcpServerConfig {
            tls: Some(certificate.server.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let server = ours::start_server_with(&url, options)?;
    let plan = ClientPlan {
        tls: Some(certificate.client.clone()),
        ..plan.clone()
    };
    let result = ours::run_client(server.local_url(), &plan);
    server.shutdown_blocking(std::time::Duration::from_secs(1));
    result
}

impl CompareReport {
    /// The table `tcp-compare` prints.
    pub fn table(&self) -> String {
        let mut out = format!(
            "tcp-compare: {} B payload, {} calls each (after {} warm-up), one at a time, 127.0.0.1\n",
            self.size, self.iters, self.floor.warmup
        );
        out += &format!(
            "{:<28} {:>9} {:>9} {:>10} {:>11} {:>13}\n",
            "", "p50 µs", "p99 µs", "calls/s", "p50/floor", "calls/s/floor"
        );
        let rows = [
            ("raw TCP ping-pong (floor)", &self.floor, 1.0, 1.0),
            (
                "rdma-rpc tcp:// (ours)",
                &self.ours,
                self.ours_p50_over_floor,
                self.ours_rate_over_floor,
            ),
            (
                "tonic (HTTP/2)",
                &self.tonic,
                self.tonic_p50_over_floor,
                self.tonic_rate_over_floor,
            ),
            (
                "tonic client, grpc:// (ours)",
                &self.grpc,
                self.grpc.p50_us / self.floor.p50_us,
                self.grpc.calls_per_sec / self.floor.calls_per_sec,
            ),
            (
                "grpc:// (ours), tonic server",
                &self.grpc_client,
                self.grpc_client.p50_us / self.floor.p50_us,
                self.grpc_client.calls_per_sec / self.floor.calls_per_sec,
            ),
            (
                "rdma-rpc tcps:// (ours, TLS)",
                &self.tls,
                self.tls.p50_us / self.floor.p50_us,
                self.tls.calls_per_sec / self.floor.calls_per_sec,
            ),
        ];
        for (name, r, p50_ratio, rate_ratio) in rows {
            out += &format!(
                "{name:<28} {:>9.1} {:>9.1} {:>10.0} {:>10.2}x {:>12.2}x\n",
                r.p50_us, r.p99_us, r.calls_per_sec, p50_ratio, rate_ratio
            );
        }
        let verdict = if self.ours_p50_over_floor <= TARGET_P50_OVER_FLOOR {
            "within"
        } else {
            "above"
        };
        out += &format!(
            "ours/floor p50 = {:.2}x ({verdict} the {TARGET_P50_OVER_FLOOR}x aim); tonic/floor p50 = {:.2}x\n",
            self.ours_p50_over_floor, self.tonic_p50_over_floor
        );
        out += &format!(
            "\n{} calls in flight on one connection (async stubs)\n{:<28} {:>9} {:>9} {:>10}\n",
            self.in_flight, "", "p50 µs", "p99 µs", "calls/s"
        );
        for (name, r) in [
            ("rdma-rpc tcp:// (ours)", &self.ours_in_flight),
            ("tonic (HTTP/2)", &self.tonic_in_flight),
            ("tonic client, grpc:// (ours)", &self.grpc_in_flight),
            ("grpc:// (ours), tonic server", &self.grpc_client_in_flight),
            ("rdma-rpc tcps:// (ours, TLS)", &self.tls_in_flight),
        ] {
            out += &format!(
                "{name:<28} {:>9.1} {:>9.1} {:>10.0}\n",
                r.p50_us, r.p99_us, r.calls_per_sec
            );
        }
        out += &format!(
            "ours/tonic calls/s at {} in flight = {:.2}x\n",
            self.in_flight, self.ours_over_tonic_in_flight
        );
        out += &format!(
            "our grpc:// server / tonic's, same tonic client: p50 {:.2}x one at a time, calls/s {:.2}x at {} in flight\n",
            self.grpc_p50_over_tonic, self.grpc_over_tonic_in_flight, self.in_flight
        );
        out += &format!(
            "our grpc:// client / tonic's, same tonic server: p50 {:.2}x one at a time, calls/s {:.2}x at {} in flight\n",
            self.grpc_client_p50_over_tonic, self.grpc_client_over_tonic_in_flight, self.in_flight
        );
        out += &format!(
            "ours over tcps:// / over tcp://: p50 {:.2}x one at a time, calls/s {:.2}x at {} in flight\n",
            self.tls_p50_over_ours, self.tls_over_ours_in_flight, self.in_flight
        );
        out
    }
}
