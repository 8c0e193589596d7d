//! UCX's `ucx_perftest` (active messages over `rc_verbs`) as plan steps, and a parser for
//! its figures: the peer a user would otherwise pick, measured in the same boot as perftest
//! and our benchmark.
//!
//! `ucp_am_lat` is UCP's active-message ping-pong; like perftest it reports one-way latency
//! (half the round trip). `ucp_am_bw` streams active messages one way. Both run with
//! `-f -v`, which prints one CSV line of final figures.

use crate::perftest::{Baseline, Figure};
use crate::vm::GuestCommand;

/// TCP port `ucx_perftest` uses to exchange connection data (its default).
pub const UCX_PORT: u16 = 13337;

/// One `ucx_perftest` run: a UCP test at one message size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UcxPerftest {
    /// `ucp_am_lat` or `ucp_am_bw`.
    pub test: String,
    /// Message size in bytes.
    pub size: u64,
    /// Measured iterations (`-n`).
    pub iterations: u32,
    /// Warm-up iterations (`-w`), not measured.
    pub warmup: u32,
}

impl UcxPerftest {
    /// A run of `test` with `size`-byte messages; a tenth as many warm-up iterations.
    pub fn new(test: &str, size: u64, iterations: u32) -> Self {
        UcxPerftest {
            test: test.to_string(),
            size,
            iterations,
            warmup: (iterations / 10).max(1),
        }
    }

    /// Whether the test measures latency (`*_lat`) rather than bandwidth.
    pub fn is_latency(&self) -> bool {
        self.test.ends_with("_lat")
    }
}

impl Baseline for UcxPerftest {
    /// A label such as `ucx_perftest ucp_am_lat 32 B`.
    fn label(&self) -> String {
        format!("ucx_perftest {} {} B", self.test, self.size)
    }

    /// The command line: the server without an address, the client with `addr`.
    fn command(&self, device: &str, client: Option<&str>) -> GuestCommand {
        let mut argv = vec!["ucx_perftest".to_string()];
        argv.extend(client.map(str::to_string));
        for (flag, value) in [
            ("-t", self.test.clone()),
            ("-s", self.size.to_string()),
            ("-n", self.iterations.to_string()),
            ("-w", self.warmup.to_string()),
            ("-p", UCX_PORT.to_string()),
        ] {
            argv.push(flag.into());
            argv.push(value);
        }
        argv.extend(["-f".into(), "-v".into()]);
        transport_env()
            .iter()
            .fold(GuestCommand::new(argv), |cmd, (key, value)| {
                cmd.env(*key, value.replace("{device}", device))
            })
    }

    fn port(&self) -> u16 {
        UCX_PORT
    }

    /// Parses the client's CSV line (the line under the `iterations,...` header).
    fn parse(&self, output: &[String]) -> Result<Vec<Figure>, String> {
        let header = output
            .iter()
            .rposition(|l| l.trim_start().starts_with("iterations,"))
            .ok_or_else(|| format!("{}: no `iterations,` header in its output", self.label()))?;
        let names: Vec<&str> = output[header].trim().split(',').collect();
        let values: Vec<f64> = output
            .get(header + 1)
            .map(|l| l.split(',').filter_map(|v| v.trim().parse().ok()).collect())
            .unwrap_or_default();
        if values.len() != names.len() {
            return Err(format!(
                "{}: its result line does not match the header {:?}",
                self.label(),
                output[header]
            ));
        }
        let figure = |column: &str, name: &'static str, unit: &'static str| {
            let index = names
                .iter()
                .position(|n| *n == column)
                .ok_or_else(|| format!("{}: no `{column}` column", self.label()))?;
            Ok::<_, String>(Figure::new(
                &self.test,
                self.size,
                name,
                values[index],
                unit,
            ))
        };
        if self.is_latency() {
            Ok(vec![
                figure("50.0_percentile_lat", "t_typical", "us")?,
                figure("avg_lat", "t_avg", "us")?,
            ])
        } else {
            Ok(vec![
                figure("overall_bw", "bw_avg", "MB/s")?,
                figure("overall_mr", "msg_rate", "msg/s")?,
            ])
        }
    }
}

/// UCX's environment for one soft-RoCE (or hardware) port: reliable-connected verbs for
/// the messages, unreliable datagrams for wire-up, GID 0 (RoCE v2 on rxe's IPv4 address).
/// `{device}` stands for the device name.
pub fn transport_env() -> &'static [(&'static str, &'static str)] {
    &[
        ("UCX_NET_DEVICES", "{device}:1"),
        ("UCX_TLS", "rc_verbs,ud_verbs,self"),
        ("UCX_IB_GID_INDEX", "0"),
        ("UCX_WARN_UNUSED_ENV_VARS", "n"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perftest::output_lines as lines;

    #[test]
    fn parses_latency() {
        let out = lines(
            "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n\
             2000,35.500,39.199,39.199,0.78,0.78,25511,25511\n",
        );
        let figs = UcxPerftest::new("ucp_am_lat", 32, 2000)
            .parse(&out)
            .unwrap();
        assert_eq!(figs[0].figure, "t_typical");
        assert!((figs[0].value - 35.5).abs() < 1e-9);
        assert!((figs[1].value - 39.199).abs() < 1e-9);
    }

    #[test]
    fn parses_bandwidth() {
        let out = lines(
            "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n \
             100,58.000,31357.459,43744.090,31.89,22.86,32,23\n",
        );
        let figs = UcxPerftest::new("ucp_am_bw", 1 << 20, 100)
            .parse(&out)
            .unwrap();
        assert_eq!(figs[0].figure, "bw_avg");
        assert!((figs[0].value - 22.86).abs() < 1e-9);
        assert!((figs[1].value - 23.0).abs() < 1e-9);
    }

    #[test]
    fn a_short_result_line_is_an_error() {
        let out = lines("iterations,50.0_percentile_lat,avg_lat\n2000,35.5\n");
        let err = UcxPerftest::new("ucp_am_lat", 32, 2000)
            .parse(&out)
            .unwrap_err();
        assert!(err.contains("does not match"), "{err}");
    }

    #[test]
    fn missing_header_is_an_error() {
        assert!(UcxPerftest::new("ucp_am_lat", 32, 1)
            .parse(&lines("Waiting for connection..."))
            .is_err());
    }

    #[test]
    fn both_ends_get_the_transport_environment() {
        let t = UcxPerftest::new("ucp_am_lat", 32, 100);
        let server = t.command("rxe0", None);
        let client = t.command("rxe0", Some("192.168.77.1"));
        assert_eq!(client.argv[1], "192.168.77.1");
        assert_eq!(server.argv[1], "-t");
        for cmd in [server, client] {
            assert!(cmd
                .env
                .contains(&("UCX_NET_DEVICES".into(), "rxe0:1".into())));
        }
    }
}
