//! `demo`, the README's main job: in one soft-RoCE VM boot (or on the host when it has an
//! RDMA device), the echo demo, perftest, and `rpc-bench` over a size and a concurrency
//! sweep; then a table of our figures next to perftest's, a JSON file and an SVG plot.
//! The TCP comparison with tonic and a raw socket, and the instruction and allocation
//! counts over the in-memory verbs provider ([`crate::count`]), run on the host in the
//! same job.

mod plot;
mod report;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use crate::perftest::{self, Baseline, Figure, Perftest};
use crate::ucx::UcxPerftest;
use crate::vm::{self, GuestCommand, GuestPlan, Step, StepOutcome, VmError, VmOptions};

pub use crate::rpc_bench::BenchJson;
pub use report::{BenchPoint, DemoReport};

use crate::rpc_bench::{build_release, parse_json_line};

/// Payload sizes of the latency sweep. Up to 32 KiB a message fits one 64 KiB ring slot
/// (SEND); larger ones go by RDMA WRITE into a granted buffer.
pub const SIZES: &[u64] = &[32, 512, 4096, 32768, 262_144, 1 << 20, 4 << 20];
/// Size of the goodput comparison with `ib_write_bw` (request and response both this big).
pub const GOODPUT_SIZE: u64 = 1 << 20;
/// Calls in flight in the concurrency sweep (32 B, async stubs, one call included).
pub const CONCURRENCY: &[u32] = &[1, 4, 16, 64];
/// Sizes at which UCX's active-message latency is measured next to ours.
pub const UCX_LATENCY_SIZES: &[u64] = &[32, 512];
/// Polling modes of the concurrency sweep.
pub const POLL_MODES: &[&str] = &["busy", "adaptive", "event"];
/// Runs of `ib_send_bw -s 32`; the best message rate is the reference of the sweep.
const SEND_BW_RUNS: usize = 3;
/// Client connections of the fleet step, all to one server process.
pub const FLEET: usize = 1000;
const FLEET_PORT: u16 = 7472;
/// Ring slot size of the benchmark connections.
const SLOT_SIZE: u32 = 65536;
const DEMO_PORT: u16 = 7471;

/// Minimal view of `rpc-bench connections --json` output.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct FleetJson {
    pub connections: usize,
    pub connect_secs: f64,
    pub server_threads: u64,
    pub server_vm_pin_kib: u64,
    pub server_rss_kib: u64,
    pub server_idle_cpu: f64,
    pub idle_secs: f64,
}

fn perftest_suite() -> Vec<Perftest> {
    let mut suite: Vec<Perftest> = SIZES
        .iter()
        .map(|&size| Perftest::new("ib_send_lat", size, iterations(size, 2000)))
        .collect();
    suite.push(Perftest::new("ib_send_bw", 65536, 500));
    suite.extend((0..SEND_BW_RUNS).map(|_| Perftest::new("ib_send_bw", 32, 20000)));
    suite.push(Perftest::new("ib_write_bw", 1 << 20, 100));
    suite
}

/// UCX active messages: latency where the sweep starts (small messages by SEND), bandwidth
/// at the goodput size.
fn ucx_suite() -> Vec<UcxPerftest> {
    let mut suite: Vec<UcxPerftest> = UCX_LATENCY_SIZES
        .iter()
        .map(|&size| UcxPerftest::new("ucp_am_lat", size, 2000))
        .collect();
    suite.push(UcxPerftest::new("ucp_am_bw", GOODPUT_SIZE, 100));
    suite
}

/// Iterations for `size`-byte messages: `base` for small ones, fewer as they grow, so that
/// each step takes seconds, not minutes, under emulation.
fn iterations(size: u64, base: u32) -> u32 {
    match size {
        0..=4096 => base,
        4097..=65536 => base / 2,
        65537..=1_048_576 => 100,
        _ => 30,
    }
}

/// One `rpc-bench loopback` run of the demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Point {
    size: u64,
    concurrency: u32,
    poll: &'static str,
    /// Through the async stubs even at one call in flight.
    async_stubs: bool,
}

impl Point {
    /// A point of the size sweep. Busy polling only where it wins: one call at a time,
    /// small enough for SEND/RECV. Bodies that move by RDMA WRITE keep soft-RoCE busy for
    /// milliseconds, and its kernel threads share the VM's two vCPUs with our pollers:
    /// spinning there starves the very transfer it waits for (1 MiB x1: busy 0.42x of
    /// ib_write_bw, adaptive 0.70x).
    fn sized(size: u64, concurrency: u32) -> Point {
        let poll = if concurrency == 1 && size < u64::from(SLOT_SIZE) {
            "busy"
        } else {
            "adaptive"
        };
        Point {
            size,
            concurrency,
            poll,
            async_stubs: false,
        }
    }
}

fn bench_args(bin: &Path, point: Point, addr: &str) -> Vec<String> {
    let Point {
        size,
        concurrency,
        poll,
        async_stubs,
    } = point;
    let iters = iterations(size, if size >= 4096 { 2000 } else { 5000 });
    let warmup = (iters / 10).clamp(3, 500);
    let mut args: Vec<String> = [
        bin.display().to_string(),
        "loopback".into(),
        "--url".into(),
        format!("rdma://{addr}:0"),
        "--size".into(),
        size.to_string(),
        "--iters".into(),
        iters.to_string(),
        "--warmup".into(),
        warmup.to_string(),
        "--concurrency".into(),
        concurrency.to_string(),
        "--poll".into(),
        poll.into(),
        "--slot-size".into(),
        SLOT_SIZE.to_string(),
        "--json".into(),
    ]
    .into();
    if async_stubs {
        args.push("--async-stubs".into());
    }
    args
}

fn bench_points() -> Vec<Point> {
    let mut points: Vec<Point> = SIZES.iter().map(|&s| Point::sized(s, 1)).collect();
    // Two large calls in flight: one's request and the other's response overlap.
    points.push(Point::sized(GOODPUT_SIZE, 2));
    for &poll in POLL_MODES {
        for &concurrency in CONCURRENCY {
            points.push(Point {
                size: 32,
                concurrency,
                poll,
                async_stubs: true,
            });
        }
    }
    points
}

/// One shell command: an `rpc-bench server` process, and `rpc-bench connections` opening
/// [`FLEET`] connections to it and measuring it.
fn fleet_step(bin: &Path, addr: &str) -> Vec<String> {
    let url = format!("rdma://{addr}:{FLEET_PORT}");
    let script = format!(
        "ulimit -n 65536; {bin} server --url {url} >/dev/null & s=$!; sleep 2;          {bin} connections --url {url} --count {FLEET} --server-pid $s --idle-secs 10 --json;          rc=$?; kill $s; wait $s; exit $rc",
        bin = bin.display(),
    );
    vec!["sh".into(), "-c".into(), script]
}

/// Runs the main job; returns whether every step succeeded.
pub fn run(opts: &VmOptions, out_dir: &Path) -> Result<bool, VmError> {
    vm::packages::ensure(vm::packages::BUILD_PACKAGES)?;
    let root = crate::workspace::root();
    build_release(&root, &["rpc-examples", "rpc-bench"])?;
    let bin_dir = crate::workspace::target_dir()?.join("release");
    let rpc_bench = bin_dir.join("rpc-bench");

    let baselines = Baselines {
        perftest: perftest_suite(),
        ucx: ucx_suite(),
    };
    let points = bench_points();
    let outcomes = if host_has_rdma_device() {
        eprintln!("[xtask demo] the host has an RDMA device: running on the host");
        run_on_host(&baselines, &points, &bin_dir)?
    } else {
        eprintln!("[xtask demo] no RDMA device on the host: running in the soft-RoCE VM");
        run_in_vm(opts, &baselines, &points, &bin_dir, &root)?
    };
    let suite = &baselines.perftest;
    let (echo, rest) = outcomes
        .split_first()
        .ok_or_else(|| VmError::Parse("no steps ran".into()))?;
    println!("== echo demo over rdma:// ==");
    for line in &echo.output {
        println!("  {line}");
    }
    let (perf_outcomes, rest) = rest.split_at(suite.len());
    let (ucx_outcomes, rest) = rest.split_at(baselines.ucx.len());
    let (bench_outcomes, fleet_outcome) = rest.split_at(points.len());
    let figures: Vec<Figure> = match perftest::figures(suite, perf_outcomes) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(false);
        }
    };
    // UCX is a peer we compare with, not part of the job: without it, its columns are empty.
    let ucx_figures = perftest::figures(&baselines.ucx, ucx_outcomes).unwrap_or_else(|e| {
        eprintln!("warning: no UCX figures: {e}");
        Vec::new()
    });
    let mut ok = echo.success();
    let mut results = Vec::new();
    for (point, outcome) in points.iter().zip(bench_outcomes) {
        match parse_json_line::<BenchJson>(outcome) {
            Ok(result) => results.push(result),
            Err(e) => {
                ok = false;
                eprintln!(
                    "error: rpc-bench {} B x{} {}: {e}",
                    point.size, point.concurrency, point.poll
                );
            }
        }
    }
    let fleet =
        fleet_outcome
            .first()
            .and_then(|outcome| match parse_json_line::<FleetJson>(outcome) {
                Ok(fleet) => Some(fleet),
                Err(e) => {
                    ok = false;
                    eprintln!("error: rpc-bench connections: {e}");
                    None
                }
            });
    let tcp = run_tcp_compare(&rpc_bench);
    let counts = crate::count::run(crate::count::DEFAULT_CALLS, "event", None)
        .map_err(|e| eprintln!("warning: no instruction counts: {e}"))
        .ok();
    let mut report = DemoReport::new(figures, ucx_figures, results, fleet, tcp);
    report.counts = counts;
    print!("{}", report.table());
    std::fs::create_dir_all(out_dir).map_err(|e| VmError::io("creating the output folder", e))?;
    let json_path = out_dir.join("results.json");
    crate::workspace::write_json(&json_path, &report)?;
    let svg_path = out_dir.join("figures.svg");
    if let Err(e) = plot::figures_svg(&report, &svg_path) {
        eprintln!("warning: could not draw the plot: {e}");
    }
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(ok)
}

fn host_has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// One shell command: start the echo server, call it, stop it (SIGTERM), keep the client's
/// exit code.
fn echo_demo(bin_dir: &Path, addr: &str) -> Vec<String> {
    let url = format!("rdma://{addr}:{DEMO_PORT}");
    let server = bin_dir.join("echo-server");
    let client = bin_dir.join("echo-client");
    let script = format!(
        "{server} {url} >/dev/null & s=$!; sleep 2; \
         {client} {url} --message 'hello over RDMA' && {client} {url} --count 2000 --size 32; \
         rc=$?; kill $s; wait $s; exit $rc",
        server = server.display(),
        client = client.display(),
    );
    vec!["sh".into(), "-c".into(), script]
}

/// The baselines run in the same boot as our benchmark, in this order.
struct Baselines {
    perftest: Vec<Perftest>,
    ucx: Vec<UcxPerftest>,
}

fn run_in_vm(
    opts: &VmOptions,
    baselines: &Baselines,
    points: &[Point],
    bin_dir: &Path,
    root: &Path,
) -> Result<Vec<StepOutcome>, VmError> {
    let addr = vm::GUEST_ADDR;
    let mut plan = GuestPlan::new(root);
    plan.steps.push(
        Step::run("echo demo", GuestCommand::new(echo_demo(bin_dir, addr)))
            .with_timeout(Duration::from_secs(120)),
    );
    plan.steps
        .extend(baselines.perftest.iter().map(Perftest::step));
    plan.steps.extend(
        baselines
            .ucx
            .iter()
            .map(|test| test.step_on(vm::GUEST_DEVICE, addr)),
    );
    for &point in points {
        let argv = bench_args(&bin_dir.join("rpc-bench"), point, addr);
        plan.steps.push(
            Step::run(
                format!(
                    "rpc-bench {} B x{} {}",
                    point.size, point.concurrency, point.poll
                ),
                GuestCommand::new(argv),
            )
            .with_timeout(Duration::from_secs(300)),
        );
    }
    plan.steps.push(
        Step::run(
            format!("rpc-bench connections x{FLEET}"),
            GuestCommand::new(fleet_step(&bin_dir.join("rpc-bench"), addr)),
        )
        .with_timeout(Duration::from_secs(600)),
    );
    let mut opts = opts.clone();
    opts.echo = false;
    let report = vm::run(&plan, &opts)?;
    eprintln!(
        "[xtask demo] VM boot {:.1} s, total {:.1} s",
        report.boot_time.as_secs_f64(),
        report.total_time.as_secs_f64()
    );
    Ok(report.steps)
}

fn run_on_host(
    baselines: &Baselines,
    points: &[Point],
    bin_dir: &Path,
) -> Result<Vec<StepOutcome>, VmError> {
    let addr = std::env::var("RDMA_RPC_TEST_ADDR").map_err(|_| {
        VmError::Parse("set RDMA_RPC_TEST_ADDR to the IP address of the host's RDMA device".into())
    })?;
    let device = std::env::var("RDMA_RPC_DEVICE").unwrap_or_else(|_| first_device());
    let mut outcomes = Vec::new();
    outcomes.push(host::run("echo demo", &echo_demo(bin_dir, &addr)));
    let baseline = |test: &dyn Baseline| {
        host::client_server(
            &test.label(),
            &test.command(&device, None),
            &test.command(&device, Some(&addr)),
            Duration::from_secs(1),
        )
    };
    outcomes.extend(baselines.perftest.iter().map(|t| baseline(t)));
    outcomes.extend(baselines.ucx.iter().map(|t| baseline(t)));
    for &point in points {
        let argv = bench_args(&bin_dir.join("rpc-bench"), point, &addr);
        outcomes.push(host::run(
            &format!(
                "rpc-bench {} B x{} {}",
                point.size, point.concurrency, point.poll
            ),
            &argv,
        ));
    }
    outcomes.push(host::run(
        &format!("rpc-bench connections x{FLEET}"),
        &fleet_step(&bin_dir.join("rpc-bench"), &addr),
    ));
    Ok(outcomes)
}

fn first_device() -> String {
    std::fs::read_dir("/sys/class/infiniband")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map_or_else(
            || "mlx5_0".into(),
            |e| e.file_name().to_string_lossy().into_owned(),
        )
}

mod host {
    //! Running plan-like steps directly on a host that has an RDMA device.

    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use crate::vm::{GuestCommand, StepOutcome};

    fn outcome(
        label: &str,
        started: Instant,
        result: std::io::Result<std::process::Output>,
    ) -> StepOutcome {
        let (exit_code, output) = match result {
            Ok(out) => (
                out.status.code().unwrap_or(1),
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .chain(String::from_utf8_lossy(&out.stderr).lines())
                    .map(String::from)
                    .collect(),
            ),
            Err(e) => (127, vec![e.to_string()]),
        };
        StepOutcome {
            label: label.into(),
            exit_code,
            elapsed: started.elapsed(),
            output,
            server_output: None,
        }
    }

    pub(super) fn run(label: &str, argv: &[String]) -> StepOutcome {
        let started = Instant::now();
        outcome(
            label,
            started,
            Command::new(&argv[0]).args(&argv[1..]).output(),
        )
    }

    fn command(cmd: &GuestCommand) -> Command {
        let mut command = Command::new(&cmd.argv[0]);
        command.args(&cmd.argv[1..]).envs(cmd.env.iter().cloned());
        command
    }

    pub(super) fn client_server(
        label: &str,
        server: &GuestCommand,
        client: &GuestCommand,
        delay: Duration,
    ) -> StepOutcome {
        let started = Instant::now();
        let mut srv = match command(server)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => return outcome(label, started, Err(e)),
        };
        std::thread::sleep(delay);
        let result = command(client).output();
        let _ = srv.kill();
        let _ = srv.wait();
        outcome(label, started, result)
    }
}

fn run_tcp_compare(rpc_bench: &PathBuf) -> Option<serde_json::Value> {
    eprintln!("[xtask demo] TCP loopback on the host: ours vs tonic vs raw socket");
    let output = Command::new(rpc_bench)
        .args(["tcp-compare", "--size", "32", "--iters", "20000", "--json"])
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "warning: tcp-compare failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    serde_json::from_slice(&output.stdout).ok()
}
