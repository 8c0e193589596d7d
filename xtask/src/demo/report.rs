//! The demo's figures side by side, as a table and as JSON.

use serde::Serialize;

use super::{BenchJson, FleetJson};
use crate::count::Counts;
use crate::perftest::{value_of as figure, Figure};

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
    /// 2 × `ucx_perftest -t ucp_am_lat` p50 (one-way, like perftest), where measured.
    pub ucx_round_trip_us: Option<f64>,
    /// ours_p50_us / ucx_round_trip_us.
    pub ucx_ratio: Option<f64>,
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
    /// `ucx_perftest -t ucp_am_bw` overall bandwidth (MB/s, 2^20 bytes), where measured.
    pub ucp_am_bw: Option<f64>,
    /// ours_mib_s / ucp_am_bw.
    pub ucx_ratio: Option<f64>,
}

/// 32 B calls at some calls in flight and polling mode, next to `ib_send_bw -s 32`.
#[derive(Debug, Clone, Serialize)]
pub struct InFlightPoint {
    pub poll: String,
    pub concurrency: u32,
    pub p50_us: f64,
    pub calls_per_sec: f64,
    /// Calls/s over the same mode's calls/s with one call in flight.
    pub speedup: Option<f64>,
    /// RPC messages per second (2 × calls/s) over `ib_send_bw -s 32`'s best message rate.
    pub msg_rate_ratio: Option<f64>,
}

/// Everything the demo measured.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub perftest: Vec<Figure>,
    /// `ucx_perftest` figures (`ucp_am_lat`, `ucp_am_bw`), empty if UCX did not run.
    pub ucx: Vec<Figure>,
    pub rdma: Vec<BenchJson>,
    pub latency: Vec<BenchPoint>,
    pub goodput: Vec<GoodputPoint>,
    pub in_flight: Vec<InFlightPoint>,
    /// `ib_send_bw -s 32`, best message rate of its runs, msg/s.
    pub send_bw_32_msg_rate: Option<f64>,
    pub fleet: Option<FleetJson>,
    pub tcp_compare: Option<serde_json::Value>,
    /// Instructions and allocations per round trip over the in-memory verbs provider.
    pub counts: Option<Counts>,
}

impl DemoReport {
    pub fn new(
        perftest: Vec<Figure>,
        ucx: Vec<Figure>,
        rdma: Vec<BenchJson>,
        fleet: Option<FleetJson>,
        tcp_compare: Option<serde_json::Value>,
    ) -> DemoReport {
        let send_lat =
            |size: u64| figure(&perftest, "ib_send_lat", size, "t_typical").map(|v| 2.0 * v);
        let ucx_lat = |size: u64| figure(&ucx, "ucp_am_lat", size, "t_typical").map(|v| 2.0 * v);
        // The size sweep: one call at a time, its polling mode chosen per size.
        let sweep = |r: &&BenchJson| r.concurrency == 1 && !r.async_stubs;
        let latency = rdma
            .iter()
            .filter(sweep)
            .map(|r| {
                let round_trip = send_lat(r.size);
                let ucx_round_trip = ucx_lat(r.size);
                BenchPoint {
                    size: r.size,
                    ours_p50_us: r.p50_us,
                    ours_p99_us: r.p99_us,
                    perftest_round_trip_us: round_trip,
                    ratio: round_trip.map(|rt| r.p50_us / rt),
                    ucx_round_trip_us: ucx_round_trip,
                    ucx_ratio: ucx_round_trip.map(|rt| r.p50_us / rt),
                }
            })
            .collect();
        let write_bw = |size: u64| figure(&perftest, "ib_write_bw", size, "bw_avg");
        let am_bw = |size: u64| figure(&ucx, "ucp_am_bw", size, "bw_avg");
        let goodput = rdma
            .iter()
            .filter(|r| r.size == super::GOODPUT_SIZE)
            .map(|r| {
                let bw = write_bw(r.size);
                let ucx_bw = am_bw(r.size);
                GoodputPoint {
                    size: r.size,
                    concurrency: r.concurrency,
                    ours_mib_s: r.goodput_mib_s,
                    ib_write_bw: bw,
                    ratio: bw.map(|bw| r.goodput_mib_s / bw),
                    ucp_am_bw: ucx_bw,
                    ucx_ratio: ucx_bw.map(|bw| r.goodput_mib_s / bw),
                }
            })
            .collect();
        let send_bw_32_msg_rate = perftest
            .iter()
            .filter(|f| f.test == "ib_send_bw" && f.size == 32 && f.figure == "msg_rate")
            .map(|f| f.value)
            .reduce(f64::max);
        let in_flight = in_flight(&rdma, send_bw_32_msg_rate);
        DemoReport {
            perftest,
            ucx,
            rdma,
            latency,
            goodput,
            in_flight,
            send_bw_32_msg_rate,
            fleet,
            tcp_compare,
            counts: None,
        }
    }

    /// The table printed at the end of the demo.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "\n== RDMA round trip, one call at a time (busy polling up to a slot, adaptive beyond) \
             vs perftest and UCX active messages, same boot ==\n",
        );
        out.push_str(&format!(
            "{:>8}  {:>12}  {:>12}  {:>16}  {:>7}  {:>15}  {:>7}\n",
            "size B",
            "ours p50 µs",
            "ours p99 µs",
            "2×ib_send_lat µs",
            "ratio",
            "2×ucp_am_lat µs",
            "vs UCX"
        ));
        for p in &self.latency {
            out.push_str(&format!(
                "{:>8}  {:>12.1}  {:>12.1}  {:>16}  {:>7}  {:>15}  {:>7}\n",
                p.size,
                p.ours_p50_us,
                p.ours_p99_us,
                or_dash(p.perftest_round_trip_us, |v| format!("{v:.1}")),
                or_dash(p.ratio, times),
                or_dash(p.ucx_round_trip_us, |v| format!("{v:.1}")),
                or_dash(p.ucx_ratio, times),
            ));
        }
        out.push_str(&format!(
            "\n== calls in flight, 32 B, one connection, async stubs, vs \
             ib_send_bw -s 32 (best of its runs: {} msg/s), same boot ==\n",
            self.send_bw_32_msg_rate
                .map_or("-".into(), |v| format!("{v:.0}"))
        ));
        out.push_str(&format!(
            "{:<9}  {:>9}  {:>10}  {:>10}  {:>8}  {:>14}\n",
            "polling", "in flight", "p50 µs", "calls/s", "vs x1", "2×calls/s / bw"
        ));
        for p in &self.in_flight {
            out.push_str(&format!(
                "{:<9}  {:>9}  {:>10.1}  {:>10.0}  {:>8}  {:>14}\n",
                p.poll,
                p.concurrency,
                p.p50_us,
                p.calls_per_sec,
                or_dash(p.speedup, times),
                or_dash(p.msg_rate_ratio, times),
            ));
        }
        if let Some(f) = &self.fleet {
            out.push_str(&format!(
                "\n== {} client connections to one server process (default adaptive polling) ==\n  \
                 connected in {:.1} s; server: {} threads, VmPin {:.1} MiB, RSS {:.1} MiB, \
                 {:.2}% of a core over {:.0} s with every connection idle\n",
                f.connections,
                f.connect_secs,
                f.server_threads,
                f.server_vm_pin_kib as f64 / 1024.0,
                f.server_rss_kib as f64 / 1024.0,
                f.server_idle_cpu * 100.0,
                f.idle_secs,
            ));
        }
        out.push_str("\n== bandwidth ==\n");
        for f in self
            .perftest
            .iter()
            .chain(&self.ucx)
            .filter(|f| f.figure == "bw_avg")
        {
            out.push_str(&format!(
                "  {:<12} {:>8} B  {:>9.1} MB/s\n",
                f.test, f.size, f.value
            ));
        }
        for g in &self.goodput {
            out.push_str(&format!(
                "  rdma-rpc     {:>8} B  {:>9.1} MiB/s request+response goodput, x{} in flight: \
                 {} of ib_write_bw, {} of ucp_am_bw\n",
                g.size,
                g.ours_mib_s,
                g.concurrency,
                or_dash(g.ratio, times),
                or_dash(g.ucx_ratio, times),
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
            let in_flight = tcp["in_flight"].as_u64().unwrap_or(0);
            out.push_str(&format!(
                "{in_flight} calls in flight on one connection (async stubs)\n"
            ));
            for (key, name) in [
                ("ours_in_flight", "rdma-rpc over tcp://"),
                ("tonic_in_flight", "tonic (HTTP/2)"),
            ] {
                out.push_str(&format!(
                    "{:<34}  {:>8.1}  {:>9.0}\n",
                    name,
                    p50(key),
                    rate(key)
                ));
            }
            out.push_str(&format!(
                "ours/tonic calls/s at {in_flight} in flight: {:.2}×\n",
                rate("ours_in_flight") / rate("tonic_in_flight")
            ));
        }
        if let Some(counts) = &self.counts {
            out.push_str(&counts.table());
        }
        out.push_str(
            "\nVM figures come from software emulation: only the ratios within one boot mean \
             anything.\n",
        );
        out
    }
}

fn or_dash(value: Option<f64>, show: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "-".into(), show)
}

fn times(ratio: f64) -> String {
    format!("{ratio:.2}×")
}

/// The concurrency sweep (32 B, every polling mode) next to `ib_send_bw -s 32`.
fn in_flight(rdma: &[BenchJson], send_bw: Option<f64>) -> Vec<InFlightPoint> {
    let points: Vec<&BenchJson> = rdma
        .iter()
        .filter(|r| r.size == 32 && r.poll.is_some() && r.async_stubs)
        .collect();
    let one = |poll: &str| {
        points
            .iter()
            .find(|r| r.concurrency == 1 && r.poll.as_deref() == Some(poll))
            .map(|r| r.calls_per_sec)
    };
    super::POLL_MODES
        .iter()
        .flat_map(|&mode| {
            points
                .iter()
                .filter(move |r| r.poll.as_deref().is_some_and(|p| p.starts_with(mode)))
                .map(move |r| InFlightPoint {
                    poll: mode.to_owned(),
                    concurrency: r.concurrency,
                    p50_us: r.p50_us,
                    calls_per_sec: r.calls_per_sec,
                    speedup: one(r.poll.as_deref().unwrap_or(mode)).map(|x1| r.calls_per_sec / x1),
                    msg_rate_ratio: send_bw.map(|bw| 2.0 * r.calls_per_sec / bw),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(test: &str, size: u64, figure: &'static str, value: f64) -> Figure {
        Figure::new(test, size, figure, value, "us")
    }

    #[test]
    fn ratios_to_ucx_use_its_round_trip_where_it_ran() {
        let perftest = vec![
            figure("ib_send_lat", 32, "t_typical", 10.0),
            figure("ib_send_lat", 4096, "t_typical", 20.0),
        ];
        let ucx = vec![
            figure("ucp_am_lat", 32, "t_typical", 12.5),
            figure("ucp_am_bw", 1 << 20, "bw_avg", 50.0),
        ];
        let rdma = vec![
            BenchJson::sample(32, 30.0, 0.0),
            BenchJson::sample(4096, 60.0, 0.0),
            BenchJson::sample(1 << 20, 9_000.0, 40.0),
        ];
        let report = DemoReport::new(perftest, ucx, rdma, None, None);
        let at = |size| report.latency.iter().find(|p| p.size == size).unwrap();
        assert_eq!(at(32).ucx_round_trip_us, Some(25.0));
        assert_eq!(at(32).ucx_ratio, Some(1.2));
        assert_eq!(at(32).ratio, Some(1.5));
        assert_eq!(at(4096).ucx_ratio, None, "UCX did not run at 4 KiB");
        assert_eq!(report.goodput[0].ucx_ratio, Some(0.8));
        let table = report.table();
        assert!(table.contains("2×ucp_am_lat µs"), "{table}");
        assert!(table.contains("1.20×"), "{table}");
        assert!(table.contains("ucp_am_bw"), "{table}");
    }
}
