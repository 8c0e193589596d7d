//! Per-call latency recording, the progress line, and the summary.

use std::io::Write as _;
use std::time::Duration;

// Timed with the cycle counter, as perftest times (see `clock`): a clock read must not cost
// more than the thing measured, and under emulation the kernel's clock costs microseconds.
use crate::clock::Instant;

use hdrhistogram::Histogram;

use crate::result::BenchResult;

/// Highest latency the histogram tracks precisely (larger values are clamped): one hour.
const MAX_TRACKED_NS: u64 = 3_600 * 1_000_000_000;
/// How often a long run reports progress on stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What a run measured, apart from the latencies (copied into the [`BenchResult`]).
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// `tcp`, `rdma`, `tonic`, `raw-tcp`.
    pub transport: String,
    /// Where the server was.
    pub url: String,
    /// Payload bytes per request.
    pub size: usize,
    /// Warm-up calls made before measuring.
    pub warmup: u64,
    /// Calls kept in flight.
    pub concurrency: usize,
    /// RDMA polling mode, if any.
    pub poll: Option<String>,
    /// One call in flight went through the async stubs (more always do).
    pub async_stubs: bool,
}

/// Records the latency of every measured call (in nanoseconds) and prints a progress line
/// on stderr about once per second.
#[derive(Debug)]
pub struct Recorder {
    histogram: Histogram<u64>,
    total: u64,
    started: Instant,
    next_progress: Instant,
    label: String,
}

impl Recorder {
    /// A recorder for `total` measured calls; `label` starts the progress lines.
    pub fn new(total: u64, label: impl Into<String>) -> Self {
        let now = Instant::now();
        Recorder {
            histogram: Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3)
                .expect("valid histogram bounds"),
            total,
            started: now,
            next_progress: now + PROGRESS_EVERY,
            label: label.into(),
        }
    }

    /// Starts the wall clock (call after the warm-up).
    pub fn start(&mut self) {
        self.started = Instant::now();
        self.next_progress = self.started + PROGRESS_EVERY;
    }

    /// Records one call of `latency` that finished at `now`.
    #[inline]
    pub fn record(&mut self, latency: Duration, now: Instant) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(ns.max(1));
        if now >= self.next_progress {
            self.progress(now);
        }
    }

    /// Measured calls so far.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    #[cold]
    fn progress(&mut self, now: Instant) {
        let done = self.histogram.len();
        let secs = (now - self.started).as_secs_f64();
        let _ = writeln!(
            std::io::stderr(),
            "[{}] {done}/{} calls, {:.0} calls/s, p50 {:.1} µs",
            self.label,
            self.total,
            done as f64 / secs.max(1e-9),
            self.histogram.value_at_quantile(0.5) as f64 / 1e3,
        );
        self.next_progress = now + PROGRESS_EVERY;
    }

    /// The summary, with the wall clock stopped now.
    pub fn finish(self, info: RunInfo) -> BenchResult {
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let h = &self.histogram;
        let us = |ns: u64| ns as f64 / 1e3;
        let q = |quantile: f64| us(h.value_at_quantile(quantile));
        let calls = h.len();
        let bytes = 2.0 * info.size as f64 * calls as f64;
        BenchResult {
            transport: info.transport,
            url: info.url,
            size: info.size,
            iters: calls,
            warmup: info.warmup,
            concurrency: info.concurrency,
            poll: info.poll,
            async_stubs: info.async_stubs || info.concurrency > 1,
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: us(h.max()),
            min_us: us(h.min()),
            mean_us: h.mean() / 1e3,
            elapsed_s: elapsed,
            calls_per_sec: calls as f64 / elapsed,
            goodput_mib_s: bytes / elapsed / (1024.0 * 1024.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarizes_recorded_latencies() {
        let mut r = Recorder::new(100, "test");
        r.start();
        for i in 1..=100u64 {
            r.record(Duration::from_micros(i), Instant::now());
        }
        let info = RunInfo {
            transport: "tcp".into(),
            url: "tcp://x:1".into(),
            size: 1024,
            warmup: 0,
            concurrency: 1,
            poll: None,
            async_stubs: false,
        };
        let s = r.finish(info);
        assert_eq!(s.iters, 100);
        assert!((s.p50_us - 50.0).abs() < 0.5, "{}", s.p50_us);
        assert!((s.max_us - 100.0).abs() < 0.5, "{}", s.max_us);
        assert!(s.calls_per_sec > 0.0 && s.goodput_mib_s > 0.0);
    }
}
