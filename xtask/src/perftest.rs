//! perftest (`ib_send_lat`, `ib_write_bw`, ...) as plan steps, and a parser for its figures.
//!
//! Figures from the emulated VM are only meaningful relative to each other: run the
//! [`baseline_suite`] in the same boot as the code being measured and compare ratios.
//! A benchmark does that by appending its own steps to the same [`GuestPlan`](crate::vm::GuestPlan):
//!
//! ```no_run
//! use xtask::perftest::{baseline_suite, figures};
//! use xtask::vm::{self, GuestCommand, GuestPlan, Step, VmOptions};
//!
//! let suite = baseline_suite();
//! let mut plan = GuestPlan::new("/work/main");
//! plan.steps.extend(suite.iter().map(|t| t.step()));
//! plan.steps.push(Step::run("my bench", GuestCommand::new(["target/release/my-bench"])));
//! let report = vm::run(&plan, &VmOptions::default())?;
//! let baseline = figures(&suite, &report.steps)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use serde::Serialize;

use crate::vm::{GuestCommand, Ready, Step, StepOutcome, GUEST_ADDR, GUEST_DEVICE};

/// TCP port perftest uses to exchange connection data.
pub const PERFTEST_PORT: u16 = 18515;

/// One perftest run: a tool at one message size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Perftest {
    /// `ib_send_lat`, `ib_send_bw`, `ib_write_lat`, `ib_write_bw`, `ib_read_lat`, ...
    pub tool: String,
    /// Message size in bytes.
    pub size: u64,
    /// Iterations (`-n`).
    pub iterations: u32,
}

/// One figure of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    pub test: String,
    pub size: u64,
    pub figure: &'static str,
    pub value: f64,
    pub unit: &'static str,
}

impl Figure {
    pub fn new(
        test: &str,
        size: u64,
        figure: &'static str,
        value: f64,
        unit: &'static str,
    ) -> Self {
        Figure {
            test: test.to_string(),
            size,
            figure,
            value,
            unit,
        }
    }
}

/// A tool's printed output as the lines a step's outcome holds.
#[cfg(test)]
pub(crate) fn output_lines(text: &str) -> Vec<String> {
    text.lines().map(String::from).collect()
}

/// Latency at 32 B with 1000 round trips; bandwidth at 64 KiB and 1 MiB with few iterations
/// (under emulation `ib_write_bw` moves a few tens of MB/s).
pub fn baseline_suite() -> Vec<Perftest> {
    let mut suite = Vec::new();
    for tool in ["ib_send_lat", "ib_write_lat"] {
        suite.push(Perftest::new(tool, 32, 1000));
    }
    for tool in ["ib_send_bw", "ib_write_bw"] {
        suite.push(Perftest::new(tool, 64 * 1024, 500));
        suite.push(Perftest::new(tool, 1024 * 1024, 100));
    }
    suite
}

impl Perftest {
    /// A run of `tool` with `size`-byte messages, `iterations` times.
    pub fn new(tool: &str, size: u64, iterations: u32) -> Self {
        Perftest {
            tool: tool.to_string(),
            size,
            iterations,
        }
    }

    /// Whether the tool measures latency (`*_lat`) rather than bandwidth.
    pub fn is_latency(&self) -> bool {
        self.tool.ends_with("_lat")
    }

    /// The plan step in the guest: server and client both on `rxe0`, the client connecting
    /// to the guest address once the server listens on [`PERFTEST_PORT`].
    pub fn step(&self) -> Step {
        self.step_on(GUEST_DEVICE, GUEST_ADDR)
    }
}

/// A tool run as one server/client step whose client prints figures: perftest, or
/// [`crate::ucx::UcxPerftest`].
pub trait Baseline {
    /// A label for reports.
    fn label(&self) -> String;
    /// The command line on `device`: the server without an address, the client with `addr`.
    fn command(&self, device: &str, client: Option<&str>) -> GuestCommand;
    /// The TCP port the server listens on for the exchange of connection data.
    fn port(&self) -> u16;
    /// The figures in the client's output.
    fn parse(&self, output: &[String]) -> Result<Vec<Figure>, String>;

    /// The plan step: server and client both on `device`, the client connecting to `addr`
    /// once the server listens on [`Baseline::port`].
    fn step_on(&self, device: &str, addr: &str) -> Step {
        Step::client_server(
            self.label(),
            self.command(device, None),
            self.command(device, Some(addr)),
            Ready::TcpPort(self.port()),
        )
        .with_timeout(Duration::from_secs(240))
    }
}

impl Baseline for Perftest {
    /// A label such as `ib_send_bw 65536 B`.
    fn label(&self) -> String {
        format!("{} {} B", self.tool, self.size)
    }

    /// The command line on `device`: the server without an address, the client with `addr`.
    fn command(&self, device: &str, client: Option<&str>) -> GuestCommand {
        let mut argv = vec![self.tool.clone(), "-d".into(), device.into()];
        for (flag, value) in [("-s", self.size), ("-n", u64::from(self.iterations))] {
            argv.push(flag.into());
            argv.push(value.to_string());
        }
        argv.push("-F".into());
        argv.extend(client.map(str::to_string));
        GuestCommand::new(argv)
    }

    fn port(&self) -> u16 {
        PERFTEST_PORT
    }

    /// Parses the client's result line (the line under the `#bytes` header).
    fn parse(&self, output: &[String]) -> Result<Vec<Figure>, String> {
        let header = output
            .iter()
            .position(|l| l.trim_start().starts_with("#bytes"))
            .ok_or_else(|| format!("{}: no `#bytes` header in its output", self.label()))?;
        let values: Vec<f64> = output[header + 1..]
            .iter()
            .map(|l| {
                l.split_whitespace()
                    .map_while(|w| w.parse::<f64>().ok())
                    .collect::<Vec<_>>()
            })
            .find(|v| v.first() == Some(&(self.size as f64)))
            .ok_or_else(|| format!("{}: no result line for size {}", self.label(), self.size))?;
        let figure =
            |name: &'static str, index: usize, unit: &'static str| -> Result<Figure, String> {
                let value = *values
                    .get(index)
                    .ok_or_else(|| format!("{}: result line too short", self.label()))?;
                Ok(Figure::new(&self.tool, self.size, name, value, unit))
            };
        let figures = if self.is_latency() {
            // #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
            vec![
                figure("t_typical", 4, "us")?,
                figure("t_avg", 5, "us")?,
                figure("t_p99", 7, "us")?,
            ]
        } else {
            // #bytes #iterations BW_peak BW_average MsgRate
            let mut rate = figure("msg_rate", 4, "msg/s")?;
            rate.value *= 1e6; // perftest prints Mpps
            vec![figure("bw_avg", 3, "MB/s")?, rate]
        };
        Ok(finite(&self.label(), figures))
    }
}

/// The figures that are numbers: perftest prints `inf` for a latency it failed to time (seen
/// for 1 MiB in a slow VM boot), which is no figure at all; it is left out with a note.
fn finite(label: &str, figures: Vec<Figure>) -> Vec<Figure> {
    figures
        .into_iter()
        .filter(|f| {
            let ok = f.value.is_finite();
            if !ok {
                eprintln!("{label}: {} printed as {}, left out", f.figure, f.value);
            }
            ok
        })
        .collect()
}

/// Figures of every run of `suite` from the matching outcomes (same order, as in a plan that
/// starts with the suite's steps); the first run that gave none is the error.
pub fn figures<T: Baseline>(suite: &[T], outcomes: &[StepOutcome]) -> Result<Vec<Figure>, String> {
    let (figures, mut errors) = figures_of_each(suite, outcomes);
    if errors.is_empty() {
        Ok(figures)
    } else {
        Err(errors.swap_remove(0))
    }
}

/// The figures of the runs of `suite` that gave them, and why each other one gave none.
pub fn figures_of_each<T: Baseline>(
    suite: &[T],
    outcomes: &[StepOutcome],
) -> (Vec<Figure>, Vec<String>) {
    let mut all = Vec::new();
    let mut errors = Vec::new();
    for (test, outcome) in suite.iter().zip(outcomes) {
        if !outcome.success() {
            errors.push(format!(
                "{} exited with {}; its output:\n{}\nserver:\n{}",
                test.label(),
                outcome.exit_code,
                outcome.output.join("\n"),
                outcome.server_output.as_deref().unwrap_or("")
            ));
            continue;
        }
        match test.parse(&outcome.output) {
            Ok(figures) => all.extend(figures),
            Err(e) => errors.push(e),
        }
    }
    (all, errors)
}

/// The value of one figure (`t_typical`, `bw_avg`, ...) of one tool's run at `size`.
pub fn value_of(figures: &[Figure], test: &str, size: u64, name: &str) -> Option<f64> {
    figures
        .iter()
        .find(|f| f.test == test && f.size == size && f.figure == name)
        .map(|f| f.value)
}

/// One of our figures next to the same figure of a baseline from the same boot.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Versus {
    pub ours: f64,
    /// The baseline's, where it ran.
    pub theirs: Option<f64>,
    /// `ours / theirs`.
    pub ratio: Option<f64>,
}

impl Versus {
    pub fn new(ours: f64, theirs: Option<f64>) -> Self {
        Versus {
            ours,
            theirs,
            ratio: theirs.map(|t| ours / t),
        }
    }
}

/// Renders figures as an aligned table.
pub fn table(figures: &[Figure]) -> String {
    let mut out = format!(
        "{:<14} {:>9}  {:<10} {:>12}  {}\n",
        "test", "size", "figure", "value", "unit"
    );
    for f in figures {
        out.push_str(&format!(
            "{:<14} {:>9}  {:<10} {:>12.3}  {}\n",
            f.test, f.size, f.figure, f.value, f.unit
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::output_lines as lines;
    use super::*;

    #[test]
    fn parses_latency() {
        let out = lines(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
             32       1000          40.12          310.55       47.06             49.10          10.20           90.00                  300.00\n",
        );
        let figs = Perftest::new("ib_send_lat", 32, 1000).parse(&out).unwrap();
        assert_eq!(figs[0].figure, "t_typical");
        assert!((figs[0].value - 47.06).abs() < 1e-9);
        assert!((figs[2].value - 90.0).abs() < 1e-9);
    }

    #[test]
    fn a_latency_printed_as_inf_is_left_out() {
        let out = lines(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
             1048576    100          40.12          310.55       inf             49.10          10.20           90.00                  300.00\n",
        );
        let figs = Perftest::new("ib_send_lat", 1 << 20, 100)
            .parse(&out)
            .unwrap();
        let names: Vec<_> = figs.iter().map(|f| f.figure).collect();
        assert_eq!(names, ["t_avg", "t_p99"]);
    }

    #[test]
    fn parses_bandwidth() {
        let out = lines(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n \
             65536      500              17.50              17.20               0.000275\n",
        );
        let figs = Perftest::new("ib_write_bw", 65536, 500)
            .parse(&out)
            .unwrap();
        assert_eq!(figs[0].figure, "bw_avg");
        assert!((figs[0].value - 17.2).abs() < 1e-9);
    }

    #[test]
    fn missing_header_is_an_error() {
        assert!(Perftest::new("ib_send_bw", 64, 1)
            .parse(&lines("Couldn't connect"))
            .is_err());
    }
}
