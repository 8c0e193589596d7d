//! The demo's figures side by side, as a table and as JSON.

use serde::Serialize;

use super::BenchJson;
use crate::perftest::Figure;

/// Our latency at one size next to perftest's round trip at the same size.
#[derive(Debug, Clone, Serialize)]
pub struct BenchPoint {
    pub size: u64,
    pub ours_p50_us: f64,
    pub ours_p99_us: f64,
    /// 2 × `ib_send_lat` t_typical (perftest reports one-way latency).
    pub perftest_round_trip_us: Option<f64>,
    /// ours_p50_us / perftest_round_trip_us.
    pub ratio: Option<f64>,
}

/// Large-message goodput next to `ib_write_bw` at the same size.
#[derive(Debug, Clone, Serialize)]
pub struct GoodputPoint {
    pub size: u64,
    pub concurrency: u32,
    /// Request plus response payload bytes per second, MiB/s.
    pub ours_mib_s: f64,
    /// `ib_write_bw` average, as perftest reports it (MB/s, 2^20 bytes).
    pub ib_write_bw: Option<f64>,
    /// ours_mib_s / ib_write_bw.
    pub ratio: Option<f64>,
}

/// Everything the demo measured.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub perftest: Vec<Figure>,
    pub rdma: Vec<BenchJson>,
    pub latency: Vec<BenchPoint>,
    pub goodput: Vec<GoodputPoint>,
    pub tcp_compare: Option<serde_json::Value>,
}

impl DemoReport {
    pub fn new(
        perftest: Vec<Figure>,
        rdma: Vec<BenchJson>,
        tcp_compare: Option<serde_json::Value>,
    ) -> DemoReport {
        let send_lat = |size: u64| {
            perftest
                .iter()
                .find(|f| f.test == "ib_send_lat" && f.size == size && f.figure == "t_typical")
                .map(|f| 2.0 * f.value)
        };
        let latency = rdma
            .iter()
            .filter(|r| r.concurrency == 1)
            .map(|r| {
                let round_trip = send_lat(r.size);
                BenchPoint {
                    size: r.size,
                    ours_p50_us: r.p50_us,
                    ours_p99_us: r.p99_us,
                    perftest_round_trip_us: round_trip,
                    ratio: round_trip.map(|rt| r.p50_us / rt),
                }
            })
            .collect();
        let write_bw = |size: u64| {
            perftest
                .iter()
                .find(|f| f.test == "ib_write_bw" && f.size == size && f.figure == "bw_avg")
                .map(|f| f.value)
        };
        let goodput = rdma
            .iter()
            .filter(|r| r.size == super::GOODPUT_SIZE)
            .map(|r| {
                let bw = write_bw(r.size);
                GoodputPoint {
                    size: r.size,
                    concurrency: r.concurrency,
                    ours_mib_s: r.goodput_mib_s,
                    ib_write_bw: bw,
                    ratio: bw.map(|bw| r.goodput_mib_s / bw),
                }
            })
            .collect();
        DemoReport {
            perftest,
            rdma,
            latency,
            goodput,
            tcp_compare,
        }
    }

    /// The table printed at the end of the demo.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "\n== RDMA round trip, one call at a time (busy polling up to a slot, adaptive beyond) vs perftest, same boot ==\n",
        );
        out.push_str(&format!(
            "{:>8}  {:>12}  {:>12}  {:>16}  {:>7}\n",
            "size B", "ours p50 µs", "ours p99 µs", "2×ib_send_lat µs", "ratio"
        ));
        for p in &self.latency {
            out.push_str(&format!(
                "{:>8}  {:>12.1}  {:>12.1}  {:>16}  {:>7}\n",
                p.size,
                p.ours_p50_us,
                p.ours_p99_us,
                p.perftest_round_trip_us
                    .map_or("-".into(), |v| format!("{v:.1}")),
                p.ratio.map_or("-".into(), |v| format!("{v:.2}×")),
            ));
        }
        out.push_str("\n== concurrency sweep, 32 B (async calls, adaptive polling) ==\n");
        out.push_str(&format!(
            "{:>11}  {:>10}  {:>10}  {:>10}\n",
            "in flight", "p50 µs", "p99 µs", "calls/s"
        ));
        for r in self.rdma.iter().filter(|r| r.size == 32) {
            out.push_str(&format!(
                "{:>11}  {:>10.1}  {:>10.1}  {:>10.0}\n",
                r.concurrency, r.p50_us, r.p99_us, r.calls_per_sec
            ));
        }
        out.push_str("\n== bandwidth ==\n");
        for f in self.perftest.iter().filter(|f| f.figure == "bw_avg") {
            out.push_str(&format!(
                "  {:<12} {:>8} B  {:>9.1} MB/s\n",
                f.test, f.size, f.value
            ));
        }
        for g in &self.goodput {
            out.push_str(&format!(
                "  rdma-rpc     {:>8} B  {:>9.1} MiB/s request+response goodput, x{} in flight: {} of ib_write_bw\n",
                g.size,
                g.ours_mib_s,
                g.concurrency,
                g.ratio.map_or("-".into(), |v| format!("{v:.2}×")),
            ));
        }
        if let Some(tcp) = &self.tcp_compare {
            let p50 = |k: &str| tcp[k]["p50_us"].as_f64().unwrap_or(f64::NAN);
            let rate = |k: &str| tcp[k]["calls_per_sec"].as_f64().unwrap_or(f64::NAN);
            out.push_str("\n== TCP loopback on the host, 32 B, one call at a time ==\n");
            out.push_str(&format!(
                "{:<34}  {:>8}  {:>9}  {:>10}\n",
                "", "p50 µs", "calls/s", "p50/floor"
            ));
            for (key, name) in [
                ("floor", "raw TcpStream ping-pong (floor)"),
                ("ours", "rdma-rpc over tcp://"),
                ("tonic", "tonic (HTTP/2)"),
            ] {
                out.push_str(&format!(
                    "{:<34}  {:>8.1}  {:>9.0}  {:>9.2}×\n",
                    name,
                    p50(key),
                    rate(key),
                    p50(key) / p50("floor")
                ));
            }
        }
        out.push_str(
            "\nVM figures come from software emulation: only the ratios within one boot mean \
             anything.\n",
        );
        out
    }
}
