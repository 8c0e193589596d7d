//! `large-bodies`: large requests read by the server (RDMA READ) against written into a
//! buffer it grants (the rendezvous), per size, next to perftest and UCX in the same boot.
//!
//! One soft-RoCE boot runs `ib_send_lat` at each size, `ib_write_bw` and `ib_read_bw` at
//! 1 MiB, UCX's `ucp_am_lat` at 256 KiB and `ucp_am_bw` at 1 MiB; then `rpc-bench loopback`
//! (an echo, one call at a time: request and response both `size` bytes) at each size with
//! the request read (`--read-from 0`, the default) and written (`--read-from never`), back
//! to back, `rounds` times. It prints each round's p50s and their ratios: read ÷ written,
//! each ÷ 2 × `ib_send_lat` (perftest's round trip), read ÷ 2 × `ucp_am_lat` where UCX ran,
//! and the 1 MiB echo's goodput ÷ `ib_write_bw` and ÷ `ucp_am_bw`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::perftest::{self, value_of, Baseline, Figure, Perftest, Versus};
use crate::rpc_bench::{build_release, parse_json_line, BenchJson};
use crate::ucx::UcxPerftest;
use crate::vm::{self, GuestCommand, GuestPlan, Step, VmError, VmOptions};

/// Payload sizes: all too large for a 64 KiB ring slot, so every body moves one-sided.
pub const SIZES: &[u64] = &[64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Where UCX's active-message latency is measured next to ours.
pub const UCX_LATENCY_SIZE: u64 = 256 << 10;
/// Where goodput is compared with `ib_write_bw` and `ucp_am_bw`.
pub const GOODPUT_SIZE: u64 = 1 << 20;

/// How the request's body reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Way {
    /// Offered by the client, read by the server (`LargeSource`).
    Read,
    /// Asked for, granted, written by the client (`LargeRequest`, `LargeGrant`).
    Written,
}

impl Way {
    const BOTH: [Way; 2] = [Way::Read, Way::Written];

    /// `rpc-bench --read-from`.
    fn read_from(self) -> &'static str {
        match self {
            Way::Read => "0",
            Way::Written => "never",
        }
    }
}

/// One `rpc-bench loopback` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub round: u32,
    pub size: u64,
    pub way: Way,
}

/// Iterations and warm-up calls for `size`: seconds per run under emulation, not minutes.
fn iterations(size: u64) -> (u32, u32) {
    match size {
        0..=65536 => (200, 20),
        65537..=262_144 => (100, 10),
        262_145..=1_048_576 => (40, 5),
        _ => (12, 2),
    }
}

fn perftest_suite() -> Vec<Perftest> {
    let mut suite: Vec<Perftest> = SIZES
        .iter()
        .map(|&size| Perftest::new("ib_send_lat", size, iterations(size).0))
        .collect();
    suite.push(Perftest::new("ib_write_bw", GOODPUT_SIZE, 100));
    suite.push(Perftest::new("ib_read_bw", GOODPUT_SIZE, 100));
    suite
}

fn ucx_suite() -> Vec<UcxPerftest> {
    vec![
        UcxPerftest::new(
            "ucp_am_lat",
            UCX_LATENCY_SIZE,
            iterations(UCX_LATENCY_SIZE).0,
        ),
        UcxPerftest::new("ucp_am_bw", GOODPUT_SIZE, 100),
    ]
}

/// Every size read and written, back to back, `rounds` times.
fn runs(rounds: u32) -> Vec<Run> {
    let mut runs = Vec::new();
    for round in 1..=rounds {
        for &size in SIZES {
            runs.extend(Way::BOTH.map(|way| Run { round, size, way }));
        }
    }
    runs
}

fn bench_argv(bin: &Path, run: Run, addr: &str) -> Vec<String> {
    let (iters, warmup) = iterations(run.size);
    [
        bin.display().to_string(),
        "loopback".into(),
        "--url".into(),
        format!("rdma://{addr}:0"),
        "--size".into(),
        run.size.to_string(),
        "--iters".into(),
        iters.to_string(),
        "--warmup".into(),
        warmup.to_string(),
        "--read-from".into(),
        run.way.read_from().into(),
        "--json".into(),
    ]
    .into()
}

/// One size in one round: both ways, and each against the baselines (2 × `ib_send_lat`,
/// 2 × `ucp_am_lat` where UCX ran at the size: round trips, as perftest's are one way).
#[derive(Debug, Clone, Serialize)]
pub struct SizeRow {
    pub round: u32,
    pub size: u64,
    /// Read p50 ÷ written p50.
    pub read_over_written: f64,
    /// p50, µs.
    pub read: Versus,
    pub written: Versus,
    pub read_vs_ucx: Versus,
}

/// The goodput-sized echo of one round, MiB/s of request and response, against
/// `ib_write_bw`, and the read one against `ucp_am_bw` (MB/s of 2^20 bytes, as both print).
#[derive(Debug, Clone, Serialize)]
pub struct GoodputRow {
    pub round: u32,
    pub read: Versus,
    pub written: Versus,
    pub read_vs_ucx: Versus,
}

/// Everything one boot measured.
#[derive(Debug, Clone, Serialize)]
pub struct LargeReport {
    pub perftest: Vec<Figure>,
    pub ucx: Vec<Figure>,
    pub sizes: Vec<SizeRow>,
    pub goodput: Vec<GoodputRow>,
}

impl LargeReport {
    /// Pairs each round's read and written run of a size; a size missing either way (its
    /// run failed) has no row.
    pub fn new(perftest: Vec<Figure>, ucx: Vec<Figure>, results: &[(Run, BenchJson)]) -> Self {
        let find = |round: u32, size: u64, way: Way| {
            results
                .iter()
                .find(|(run, _)| *run == Run { round, size, way })
                .map(|(_, json)| json)
        };
        let rounds = results.iter().map(|(run, _)| run.round).max().unwrap_or(0);
        let mut sizes = Vec::new();
        let mut goodput = Vec::new();
        for round in 1..=rounds {
            for &size in SIZES {
                let (Some(read), Some(written)) = (
                    find(round, size, Way::Read),
                    find(round, size, Way::Written),
                ) else {
                    continue;
                };
                let round_trip = |figures: &[Figure], test| {
                    value_of(figures, test, size, "t_typical").map(|v| 2.0 * v)
                };
                let send = round_trip(&perftest, "ib_send_lat");
                sizes.push(SizeRow {
                    round,
                    size,
                    read_over_written: read.p50_us / written.p50_us,
                    read: Versus::new(read.p50_us, send),
                    written: Versus::new(written.p50_us, send),
                    read_vs_ucx: Versus::new(read.p50_us, round_trip(&ucx, "ucp_am_lat")),
                });
                if size == GOODPUT_SIZE {
                    let write_bw = value_of(&perftest, "ib_write_bw", size, "bw_avg");
                    let am_bw = value_of(&ucx, "ucp_am_bw", size, "bw_avg");
                    goodput.push(GoodputRow {
                        round,
                        read: Versus::new(read.goodput_mib_s, write_bw),
                        written: Versus::new(written.goodput_mib_s, write_bw),
                        read_vs_ucx: Versus::new(read.goodput_mib_s, am_bw),
                    });
                }
            }
        }
        LargeReport {
            perftest,
            ucx,
            sizes,
            goodput,
        }
    }

    pub fn table(&self) -> String {
        let times = |r: Option<f64>| r.map_or_else(|| "-".into(), |r| format!("{r:.2}×"));
        let ms = |us: Option<f64>| us.map_or_else(|| "-".into(), |us| format!("{:.2}", us / 1e3));
        let mut out = String::from(
            "== large requests read (RDMA READ) or written (rendezvous): echo p50, one call at a time ==\n",
        );
        let _ = writeln!(
            out,
            "{:>5} {:>8} {:>9} {:>11} {:>9} {:>13} {:>13} {:>15} {:>13} {:>15}",
            "round",
            "size",
            "read ms",
            "written ms",
            "read÷wr",
            "2×send_lat ms",
            "read÷2×send",
            "written÷2×send",
            "2×am_lat ms",
            "read÷2×am_lat"
        );
        for row in &self.sizes {
            let _ = writeln!(
                out,
                "{:>5} {:>8} {:>9.2} {:>11.2} {:>9} {:>13} {:>13} {:>15} {:>13} {:>15}",
                row.round,
                size_name(row.size),
                row.read.ours / 1e3,
                row.written.ours / 1e3,
                times(Some(row.read_over_written)),
                ms(row.read.theirs),
                times(row.read.ratio),
                times(row.written.ratio),
                ms(row.read_vs_ucx.theirs),
                times(row.read_vs_ucx.ratio),
            );
        }
        let _ = writeln!(
            out,
            "== {} echo goodput, request + response (MiB/s) ==",
            size_name(GOODPUT_SIZE)
        );
        let mib = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
        let _ = writeln!(
            out,
            "{:>5} {:>9} {:>12} {:>10} {:>12} {:>12} {:>15} {:>10}",
            "round",
            "read",
            "÷write_bw",
            "÷am_bw",
            "written",
            "÷write_bw",
            "ib_write_bw",
            "ucp_am_bw"
        );
        for row in &self.goodput {
            let _ = writeln!(
                out,
                "{:>5} {:>9.1} {:>12} {:>10} {:>12.1} {:>12} {:>15} {:>10}",
                row.round,
                row.read.ours,
                times(row.read.ratio),
                times(row.read_vs_ucx.ratio),
                row.written.ours,
                times(row.written.ratio),
                mib(row.read.theirs),
                mib(row.read_vs_ucx.theirs),
            );
        }
        out
    }
}

/// `64 KiB`, `1 MiB`: the sizes of this benchmark.
fn size_name(size: u64) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

/// Builds `rpc-bench`, runs the benchmark in one VM boot, prints the table; writes `json` if
/// given. Returns whether every run succeeded.
pub fn run(opts: &VmOptions, rounds: u32, json: Option<&Path>) -> Result<bool, VmError> {
    vm::packages::ensure(vm::packages::BUILD_PACKAGES)?;
    let root = crate::workspace::root();
    build_release(&root, &["rpc-bench"])?;
    let bin = crate::workspace::target_dir()?
        .join("release")
        .join("rpc-bench");
    let perftest_suite = perftest_suite();
    let ucx_suite = ucx_suite();
    let runs = runs(rounds);
    let addr = vm::GUEST_ADDR;
    let mut plan = GuestPlan::new(&root);
    plan.steps.extend(perftest_suite.iter().map(Perftest::step));
    plan.steps.extend(
        ucx_suite
            .iter()
            .map(|test| test.step_on(vm::GUEST_DEVICE, addr)),
    );
    for &run in &runs {
        let label = format!(
            "round {}: rpc-bench {} B, request {:?}",
            run.round, run.size, run.way
        );
        plan.steps.push(
            Step::run(label, GuestCommand::new(bench_argv(&bin, run, addr)))
                .with_timeout(Duration::from_secs(300)),
        );
    }
    let mut opts = opts.clone();
    opts.echo = false;
    let report = vm::run(&plan, &opts)?;
    let (perf_outcomes, rest) = report
        .steps
        .split_at(perftest_suite.len().min(report.steps.len()));
    let (ucx_outcomes, bench_outcomes) = rest.split_at(ucx_suite.len().min(rest.len()));
    // A baseline that gave no figure leaves its ratios empty, not the rest of the boot.
    let (perftest_figures, perftest_errors) =
        perftest::figures_of_each(&perftest_suite, perf_outcomes);
    let (ucx_figures, ucx_errors) = perftest::figures_of_each(&ucx_suite, ucx_outcomes);
    for e in perftest_errors.iter().chain(&ucx_errors) {
        eprintln!("error: {e}");
    }
    // UCX is a peer we compare with: without it, the run still succeeds.
    let mut ok = perftest_errors.is_empty() && bench_outcomes.len() == runs.len();
    let mut results = Vec::new();
    for (&run, outcome) in runs.iter().zip(bench_outcomes) {
        match parse_json_line::<BenchJson>(outcome) {
            Ok(json) => results.push((run, json)),
            Err(e) => {
                ok = false;
                eprintln!("error: {}: {e}", outcome.label);
            }
        }
    }
    let large = LargeReport::new(perftest_figures, ucx_figures, &results);
    print!("{}", perftest::table(&large.perftest));
    print!("{}", perftest::table(&large.ucx));
    print!("{}", large.table());
    if let Some(path) = json {
        crate::workspace::write_json(path, &large)?;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(size: u64, way: Way) -> Run {
        Run {
            round: 1,
            size,
            way,
        }
    }

    #[test]
    fn ratios_pair_each_sizes_two_ways_against_the_same_boots_baselines() {
        let perftest = vec![
            Figure::new("ib_send_lat", 256 << 10, "t_typical", 10_000.0, "us"),
            Figure::new("ib_send_lat", 1 << 20, "t_typical", 40_000.0, "us"),
            Figure::new("ib_write_bw", 1 << 20, "bw_avg", 25.0, "MB/s"),
        ];
        let ucx = vec![
            Figure::new("ucp_am_lat", 256 << 10, "t_typical", 12_500.0, "us"),
            Figure::new("ucp_am_bw", 1 << 20, "bw_avg", 20.0, "MB/s"),
        ];
        let results = [
            (
                run(256 << 10, Way::Read),
                BenchJson::sample(256 << 10, 22_000.0, 0.0),
            ),
            (
                run(256 << 10, Way::Written),
                BenchJson::sample(256 << 10, 27_500.0, 0.0),
            ),
            (
                run(1 << 20, Way::Read),
                BenchJson::sample(1 << 20, 90_000.0, 24.0),
            ),
            (
                run(1 << 20, Way::Written),
                BenchJson::sample(1 << 20, 100_000.0, 22.0),
            ),
            // A size whose written run failed has no row.
            (
                run(64 << 10, Way::Read),
                BenchJson::sample(64 << 10, 5_000.0, 0.0),
            ),
        ];
        let report = LargeReport::new(perftest, ucx, &results);
        assert_eq!(report.sizes.len(), 2);
        let kib256 = &report.sizes[0];
        assert_eq!(kib256.size, 256 << 10);
        let close = |ratio: Option<f64>, want: f64| (ratio.unwrap() - want).abs() < 1e-9;
        assert!(close(Some(kib256.read_over_written), 0.8));
        assert!(close(kib256.read.ratio, 1.1));
        assert!(close(kib256.written.ratio, 1.375));
        assert!(close(kib256.read_vs_ucx.ratio, 0.88));
        let mib1 = &report.sizes[1];
        assert_eq!(mib1.read_vs_ucx.ratio, None, "UCX ran at 256 KiB only");
        let goodput = &report.goodput[0];
        assert!(close(goodput.read.ratio, 0.96));
        assert!(close(goodput.written.ratio, 0.88));
        assert!(close(goodput.read_vs_ucx.ratio, 1.2));
        let table = report.table();
        assert!(table.contains("256 KiB"), "{table}");
        assert!(table.contains("1.10×"), "{table}");
        assert!(table.contains("0.96×"), "{table}");
    }

    #[test]
    fn every_size_runs_both_ways_in_every_round() {
        let all = runs(2);
        assert_eq!(all.len(), 2 * SIZES.len() * 2);
        assert_eq!(all[0], run(SIZES[0], Way::Read));
        assert_eq!(all[1], run(SIZES[0], Way::Written));
        let argv = bench_argv(Path::new("rpc-bench"), all[1], "10.0.0.1");
        let at = argv.iter().position(|a| a == "--read-from").unwrap();
        assert_eq!(argv[at + 1], "never");
    }
}
