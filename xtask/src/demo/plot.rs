//! The demo's figures as one SVG, three panels: latency against size (p50 with p99
//! whiskers, perftest and UCX beside it), the ratios to both, and calls/s against calls in
//! flight per polling mode. Human units throughout.

use std::path::Path;

use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::DemoReport;

const WIDTH: u32 = 900;
const PANEL_HEIGHT: u32 = 420;
/// Colors of the polling modes, in the demo's order (busy, adaptive, event).
const MODE_COLORS: [RGBColor; 3] = [BLUE, RGBColor(0, 150, 0), MAGENTA];
/// Color of UCX's figures.
const UCX_COLOR: RGBColor = RGBColor(230, 130, 0);

type Panel<'a> = DrawingArea<SVGBackend<'a>, Shift>;

pub fn figures_svg(report: &DemoReport, path: &Path) -> Result<(), String> {
    if report.latency.is_empty() {
        return Err("no latency figures to plot".into());
    }
    let root = SVGBackend::new(path, (WIDTH, 3 * PANEL_HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((3, 1));
    latency_panel(report, &panels[0])?;
    ratio_panel(report, &panels[1])?;
    in_flight_panel(report, &panels[2])?;
    root.present().map_err(|e| e.to_string())
}

/// p50 round trip against size, p99 as a whisker above it, 2 × `ib_send_lat` and
/// 2 × `ucp_am_lat` beside it.
fn latency_panel(report: &DemoReport, area: &Panel<'_>) -> Result<(), String> {
    let points = &report.latency;
    let perf: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| p.perftest_round_trip_us.map(|v| (p.size as f64, v)))
        .collect();
    let ucx: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| p.ucx_round_trip_us.map(|v| (p.size as f64, v)))
        .collect();
    let ys = points
        .iter()
        .flat_map(|p| [p.ours_p50_us, p.ours_p99_us])
        .chain(perf.iter().chain(&ucx).map(|&(_, y)| y));
    let (min_y, max_y) = bounds(ys);
    let mut chart = panel(
        area,
        "RDMA round trip, one call at a time: p50, whisker to p99",
    )
    .build_cartesian_2d(size_axis(report), (min_y / 1.5..max_y * 1.5).log_scale())
    .map_err(|e| e.to_string())?;
    axes(
        &mut chart,
        ("message size", &|x| human_bytes(*x)),
        ("round trip", &|y| human_time_us(*y)),
    )?;
    let ours: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.size as f64, p.ours_p50_us))
        .collect();
    let whiskers = points.iter().map(|p| {
        let x = p.size as f64;
        PathElement::new(vec![(x, p.ours_p50_us), (x, p.ours_p99_us)], BLUE)
    });
    chart.draw_series(whiskers).map_err(|e| e.to_string())?;
    line_with_points(
        &mut chart,
        &ours,
        BLUE,
        "rdma-rpc p50 (generated blocking stub)",
    )?;
    line_with_points(
        &mut chart,
        &perf,
        RED,
        "2 × ib_send_lat (perftest, same boot)",
    )?;
    if !ucx.is_empty() {
        line_with_points(
            &mut chart,
            &ucx,
            UCX_COLOR,
            "2 × ucp_am_lat (UCX active messages, same boot)",
        )?;
    }
    legend(&mut chart)
}

/// Our p50 over perftest's round trip and over UCX's, with 1× marked.
fn ratio_panel(report: &DemoReport, area: &Panel<'_>) -> Result<(), String> {
    let ratios: Vec<(f64, f64)> = report
        .latency
        .iter()
        .filter_map(|p| p.ratio.map(|r| (p.size as f64, r)))
        .collect();
    let ucx_ratios: Vec<(f64, f64)> = report
        .latency
        .iter()
        .filter_map(|p| p.ucx_ratio.map(|r| (p.size as f64, r)))
        .collect();
    let (_, max_y) = bounds(ratios.iter().chain(&ucx_ratios).map(|&(_, r)| r));
    let mut chart = panel(
        area,
        "Round trip over 2 × ib_send_lat and over UCX's (same boot)",
    )
    .build_cartesian_2d(size_axis(report), 0.0..(max_y * 1.2).max(1.5))
    .map_err(|e| e.to_string())?;
    axes(
        &mut chart,
        ("message size", &|x| human_bytes(*x)),
        ("ratio", &|y| format!("{y:.1}×")),
    )?;
    let range = chart.x_range();
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(range.start, 1.0), (range.end, 1.0)],
            BLACK.mix(0.5),
        )))
        .map_err(|e| e.to_string())?
        .label("1× = perftest")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    line_with_points(&mut chart, &ratios, BLUE, "rdma-rpc p50 ÷ 2 × ib_send_lat")?;
    if !ucx_ratios.is_empty() {
        line_with_points(
            &mut chart,
            &ucx_ratios,
            UCX_COLOR,
            "rdma-rpc p50 ÷ 2 × ucp_am_lat",
        )?;
    }
    legend(&mut chart)
}

/// 32 B calls/s against calls in flight, a line per polling mode, and the rate of calls
/// (two messages each) `ib_send_bw -s 32` would carry.
fn in_flight_panel(report: &DemoReport, area: &Panel<'_>) -> Result<(), String> {
    let points = &report.in_flight;
    let ceiling = report.send_bw_32_msg_rate.map(|rate| rate / 2.0);
    let (_, max_y) = bounds(
        points
            .iter()
            .map(|p| p.calls_per_sec)
            .chain(ceiling)
            .chain([1.0]),
    );
    let mut chart = panel(
        area,
        "32 B calls on one connection (async stubs): calls/s against calls in flight",
    )
    // Headroom for the legend above the highest line.
    .build_cartesian_2d(in_flight_axis(points), 0.0..max_y * 1.5)
    .map_err(|e| e.to_string())?;
    axes(
        &mut chart,
        ("calls in flight", &|x| format!("{x:.0}")),
        ("calls/s", &|y| human_count(*y)),
    )?;
    if let Some(ceiling) = ceiling {
        let range = chart.x_range();
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(range.start, ceiling), (range.end, ceiling)],
                RED,
            )))
            .map_err(|e| e.to_string())?
            .label("ib_send_bw -s 32 ÷ 2 (two messages a call)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    for (mode, color) in super::POLL_MODES.iter().zip(MODE_COLORS) {
        let line: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.poll == *mode)
            .map(|p| (f64::from(p.concurrency), p.calls_per_sec))
            .collect();
        line_with_points(&mut chart, &line, color, &format!("{mode} polling"))?;
    }
    legend(&mut chart)
}

/// A panel's chart builder: its caption, margins and room for the labels.
fn panel<'a, 'b>(area: &'a Panel<'b>, caption: &str) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70);
    builder
}

/// An axis: its name and how its values read.
type Axis<'f> = (&'f str, &'f dyn Fn(&f64) -> String);

/// Draws the grid and both axes, `x` and `y` naming them and formatting their labels.
fn axes<'a, 'b: 'a, X, Y>(
    chart: &mut Chart<'a, 'b, X, Y>,
    x: Axis<'_>,
    y: Axis<'_>,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x.0)
        .y_desc(y.0)
        .x_label_formatter(x.1)
        .y_label_formatter(y.1)
        .draw()
        .map_err(|e| e.to_string())
}

type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

fn line_with_points<'a, 'b: 'a, X, Y>(
    chart: &mut Chart<'a, 'b, X, Y>,
    points: &[(f64, f64)],
    color: RGBColor,
    label: &str,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    if points.is_empty() {
        return Ok(());
    }
    chart
        .draw_series(LineSeries::new(points.to_vec(), color))
        .map_err(|e| e.to_string())?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn legend<'a, 'b: 'a, X, Y>(chart: &mut Chart<'a, 'b, X, Y>) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// The sizes' axis, log scale with room on both sides, a tick at each measured size.
fn size_axis(report: &DemoReport) -> WithKeyPoints<LogCoord<f64>> {
    let sizes: Vec<f64> = report.latency.iter().map(|p| p.size as f64).collect();
    let (min_x, max_x) = bounds(sizes.iter().copied());
    let axis: LogCoord<f64> = (min_x / 1.5..max_x * 1.5).log_scale().into();
    axis.with_key_points(sizes)
}

/// The calls-in-flight axis, log scale, a tick at each measured count.
fn in_flight_axis(points: &[super::report::InFlightPoint]) -> WithKeyPoints<LogCoord<f64>> {
    let mut counts: Vec<f64> = points.iter().map(|p| f64::from(p.concurrency)).collect();
    counts.sort_by(f64::total_cmp);
    counts.dedup();
    let (min_x, max_x) = bounds(counts.iter().copied());
    let axis: LogCoord<f64> = (min_x / 1.25..max_x * 1.25).log_scale().into();
    axis.with_key_points(counts)
}

/// Least and greatest of `values` (both 1.0 for none; the least at least 0.001, for log
/// axes).
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    // A value that is no number would make a log axis endless.
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        (1.0, 1.0)
    } else {
        (lo.max(1e-3), hi)
    }
}

/// `bytes` as B, KiB, MiB or GiB.
pub(super) fn human_bytes(bytes: f64) -> String {
    const KIB: f64 = 1024.0;
    in_units(
        bytes,
        &[(KIB * KIB * KIB, "GiB"), (KIB * KIB, "MiB"), (KIB, "KiB")],
        "B",
    )
}

/// `us` microseconds as µs, ms or s.
pub(super) fn human_time_us(us: f64) -> String {
    in_units(us, &[(1e6, "s"), (1e3, "ms")], "µs")
}

/// A count, with k or M.
pub(super) fn human_count(n: f64) -> String {
    in_units(n, &[(1e6, "M"), (1e3, "k")], "")
}

/// `value` in the largest of `units` (factor, name; largest first) it reaches, else in
/// `base`.
fn in_units(value: f64, units: &[(f64, &str)], base: &str) -> String {
    units
        .iter()
        .find(|&&(factor, _)| value >= factor)
        .map_or_else(
            || trimmed(value, base),
            |&(f, name)| trimmed(value / f, name),
        )
}

/// `value` with at most one decimal, none if it is whole, then `unit`.
fn trimmed(value: f64, unit: &str) -> String {
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    let space = if matches!(unit, "" | "k" | "M") {
        ""
    } else {
        " "
    };
    format!("{text}{space}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{BenchJson, DemoReport};
    use crate::perftest::Figure;

    #[test]
    fn units_are_human() {
        assert_eq!(human_bytes(32.0), "32 B");
        assert_eq!(human_bytes(4096.0), "4 KiB");
        assert_eq!(human_bytes(262_144.0), "256 KiB");
        assert_eq!(human_bytes(1_572_864.0), "1.5 MiB");
        assert_eq!(human_time_us(45.24), "45.2 µs");
        assert_eq!(human_time_us(1_170.0), "1.2 ms");
        assert_eq!(human_time_us(2_000_000.0), "2 s");
        assert_eq!(human_count(950.0), "950");
        assert_eq!(human_count(24_433.0), "24.4k");
    }

    fn run(size: u64, concurrency: u32, poll: &str, p50: f64, rate: f64) -> BenchJson {
        BenchJson {
            transport: "rdma".into(),
            size,
            iters: 1000,
            concurrency,
            p50_us: p50,
            p90_us: p50 * 1.2,
            p99_us: p50 * 2.0,
            p999_us: p50 * 3.0,
            max_us: p50 * 4.0,
            calls_per_sec: rate,
            goodput_mib_s: 0.0,
            poll: Some(poll.into()),
            async_stubs: concurrency > 1 || poll != "busy",
        }
    }

    fn figure(test: &str, size: u64, figure: &'static str, value: f64) -> Figure {
        Figure::new(test, size, figure, value, "us")
    }

    /// The three panels, each with its units, from a report like the demo's.
    #[test]
    fn the_plot_has_three_panels_in_human_units() {
        let mut rdma = vec![
            BenchJson {
                async_stubs: false,
                ..run(32, 1, "busy", 48.0, 20_000.0)
            },
            BenchJson {
                async_stubs: false,
                ..run(1 << 20, 1, "adaptive", 38_000.0, 26.0)
            },
        ];
        for (k, mode) in ["busy", "adaptive", "event"].into_iter().enumerate() {
            for n in [1, 4, 16, 64] {
                rdma.push(run(
                    32,
                    n,
                    mode,
                    50.0 * f64::from(n),
                    5_000.0 * f64::from(n) / (k + 1) as f64,
                ));
            }
        }
        let perftest = vec![
            figure("ib_send_lat", 32, "t_typical", 10.0),
            figure("ib_send_lat", 1 << 20, "t_typical", 17_000.0),
            figure("ib_send_bw", 32, "msg_rate", 60_000.0),
        ];
        let ucx = vec![figure("ucp_am_lat", 32, "t_typical", 11.0)];
        let report = DemoReport::new(perftest, ucx, rdma, None, None);
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("figures.svg");
        figures_svg(&report, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for text in [
            "p50, whisker to p99",
            "Round trip over 2 × ib_send_lat",
            "2 × ucp_am_lat (UCX",
            "÷ 2 × ucp_am_lat",
            "calls/s against calls in flight",
            "32 B",
            "1 MiB",
            " ms",
            "µs",
            "1.0×",
            "busy polling",
            "event polling",
            "ib_send_bw -s 32 ÷ 2",
        ] {
            assert!(svg.contains(text), "no {text:?} in the plot");
        }
    }

    #[test]
    fn bounds_ignore_what_is_no_number() {
        let values = [3.0, f64::INFINITY, 40.0, f64::NAN];
        assert_eq!(bounds(values.into_iter()), (3.0, 40.0));
    }
}
