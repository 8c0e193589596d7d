//! Running the built `rpc-bench` binary.

#![allow(dead_code)]

use std::process::{Command, Output};

use rpc_bench::BenchResult;

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_rpc-bench");

/// A command line split at whitespace.
pub fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs `rpc-bench args...` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("rpc-bench starts")
}

/// Runs `rpc-bench args...`, expects success and exactly one JSON object on stdout.
pub fn run_json(args: &[&str]) -> BenchResult {
    let out = run(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rpc-bench {args:?} failed ({}):\n{stderr}",
        out.status
    );
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "one JSON line expected:\n{stdout}"
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Checks a result for internal consistency (no timing thresholds).
pub fn assert_sane(r: &BenchResult, transport: &str, size: usize, iters: u64, concurrency: usize) {
    assert_eq!(r.transport, transport);
    assert_eq!((r.size, r.iters, r.concurrency), (size, iters, concurrency));
    let percentiles = [r.min_us, r.p50_us, r.p90_us, r.p99_us, r.p999_us, r.max_us];
    assert!(percentiles[0] > 0.0, "{r:?}");
    assert!(
        percentiles.windows(2).all(|w| w[0] <= w[1]),
        "percentiles out of order: {r:?}"
    );
    assert!(
        r.calls_per_sec > 0.0 && r.calls_per_sec.is_finite(),
        "{r:?}"
    );
    assert!(
        r.goodput_mib_s > 0.0 && r.goodput_mib_s.is_finite(),
        "{r:?}"
    );
    let expected = r.calls_per_sec * 2.0 * size as f64 / (1024.0 * 1024.0);
    assert!(
        (r.goodput_mib_s - expected).abs() <= expected * 1e-6,
        "{r:?}"
    );
}
