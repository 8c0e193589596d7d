//! The JSON result of one benchmark run.

use serde::{Deserialize, Serialize};

/// Summary of one run: what was measured and the latency distribution of the measured calls
/// (warm-up calls excluded). `rpc-bench client|loopback --json` prints exactly one of these.
///
/// Latencies are per call, from just before the request is handed to the stub until the
/// reply is back, in microseconds. `goodput_mib_s` counts request and response payload
/// bytes (not headers or protobuf framing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// What carried the calls: `tcp` or `rdma` (rdma-rpc), `tonic`, `raw-tcp`.
    pub transport: String,
    /// Where the server was (URL or `host:port`).
    #[serde(default)]
    pub url: String,
    /// Payload bytes per request (the reply carries as many).
    pub size: usize,
    /// Measured calls.
    pub iters: u64,
    /// Calls made before measuring.
    #[serde(default)]
    pub warmup: u64,
    /// Calls kept in flight at once.
    pub concurrency: usize,
    /// RDMA completion polling (`busy`, `event`, `adaptive`); absent for TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<String>,
    /// The calls went through the async stubs (false: the blocking stub, one at a time).
    #[serde(default)]
    pub async_stubs: bool,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 90th percentile latency, µs.
    pub p90_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// 99.9th percentile latency, µs.
    pub p999_us: f64,
    /// Largest latency, µs.
    pub max_us: f64,
    /// Smallest latency, µs.
    #[serde(default)]
    pub min_us: f64,
    /// Mean latency, µs.
    #[serde(default)]
    pub mean_us: f64,
    /// Wall-clock time of the measured calls, seconds.
    #[serde(default)]
    pub elapsed_s: f64,
    /// Measured calls per second of wall-clock time.
    pub calls_per_sec: f64,
    /// Request plus response payload, MiB per second of wall-clock time.
    pub goodput_mib_s: f64,
}

impl BenchResult {
    /// One human-readable line: transport, size, concurrency, percentiles and rates.
    pub fn summary_line(&self) -> String {
        format!(
            "{transport} {size} B x{conc}: p50 {p50:.1} µs  p90 {p90:.1}  p99 {p99:.1}  \
             p99.9 {p999:.1}  max {max:.1}  |  {cps:.0} calls/s  {gp:.2} MiB/s",
            transport = self.transport,
            size = self.size,
            conc = self.concurrency,
            p50 = self.p50_us,
            p90 = self.p90_us,
            p99 = self.p99_us,
            p999 = self.p999_us,
            max = self.max_us,
            cps = self.calls_per_sec,
            gp = self.goodput_mib_s,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_json_parses_with_defaults() {
        let json = r#"{"transport":"tcp","size":64,"iters":10,"concurrency":1,
            "p50_us":1.0,"p90_us":2.0,"p99_us":3.0,"p999_us":4.0,"max_us":5.0,
            "calls_per_sec":100.0,"goodput_mib_s":0.5}"#;
        let r: BenchResult = serde_json::from_str(json).unwrap();
        assert_eq!((r.iters, r.warmup, r.poll.as_deref()), (10, 0, None));
        let back: BenchResult = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
