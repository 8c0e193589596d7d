//! `rpc-bench --json` results as the VM steps print them, shared by the benchmarks that run
//! `rpc-bench` in a plan ([`crate::demo`], [`crate::large_bodies`]).

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use crate::vm::{StepOutcome, VmError};

/// Minimal view of `rpc-bench loopback --json` output (the full type lives in the
/// `rpc-bench` crate).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct BenchJson {
    pub transport: String,
    pub size: u64,
    pub iters: u64,
    pub concurrency: u32,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub calls_per_sec: f64,
    pub goodput_mib_s: f64,
    #[serde(default)]
    pub poll: Option<String>,
    #[serde(default)]
    pub async_stubs: bool,
}

impl BenchJson {
    /// A result of one call at a time whose every percentile is `p50_us`, for tests.
    #[cfg(test)]
    pub(crate) fn sample(size: u64, p50_us: f64, goodput_mib_s: f64) -> BenchJson {
        BenchJson {
            transport: "rdma".into(),
            size,
            iters: 1000,
            concurrency: 1,
            p50_us,
            p90_us: p50_us,
            p99_us: p50_us,
            p999_us: p50_us,
            max_us: p50_us,
            calls_per_sec: 1e6 / p50_us,
            goodput_mib_s,
            poll: Some("busy".into()),
            async_stubs: false,
        }
    }
}

/// The last line of a step's output that parses as `T` (a `--json` result).
pub fn parse_json_line<T: serde::de::DeserializeOwned>(outcome: &StepOutcome) -> Result<T, String> {
    if !outcome.success() {
        return Err(format!(
            "exit {}: {}",
            outcome.exit_code,
            outcome.output.join("\n")
        ));
    }
    outcome
        .output
        .iter()
        .rev()
        .find_map(|line| serde_json::from_str::<T>(line.trim()).ok())
        .ok_or_else(|| format!("no JSON result in: {}", outcome.output.join("\n")))
}

/// `cargo build --release` of `packages` in the workspace at `root`.
pub fn build_release(root: &Path, packages: &[&str]) -> Result<(), VmError> {
    eprintln!("[xtask] building release binaries: {}", packages.join(", "));
    let mut command = Command::new(crate::workspace::cargo());
    command.args(["build", "--release"]);
    for package in packages {
        command.args(["-p", package]);
    }
    let status = command
        .current_dir(root)
        .status()
        .map_err(|e| VmError::io("running cargo build", e))?;
    if status.success() {
        Ok(())
    } else {
        Err(VmError::Command {
            what: "cargo build --release".into(),
            detail: status.to_string(),
        })
    }
}
