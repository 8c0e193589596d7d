//! Latency against size, ours against perftest, as SVG.

use std::path::Path;

use plotters::prelude::*;

use super::DemoReport;

pub fn latency_svg(report: &DemoReport, path: &Path) -> Result<(), String> {
    let ours: Vec<(f64, f64)> = report
        .latency
        .iter()
        .map(|p| (p.size as f64, p.ours_p50_us))
        .collect();
    let perf: Vec<(f64, f64)> = report
        .latency
        .iter()
        .filter_map(|p| p.perftest_round_trip_us.map(|v| (p.size as f64, v)))
        .collect();
    if ours.is_empty() {
        return Err("no latency figures to plot".into());
    }
    let max_y = ours
        .iter()
        .chain(&perf)
        .map(|&(_, y)| y)
        .fold(1.0, f64::max)
        * 1.5;
    let min_y = ours
        .iter()
        .chain(&perf)
        .map(|&(_, y)| y)
        .fold(f64::MAX, f64::min)
        .max(0.1)
        / 1.5;
    let min_x = ours.iter().map(|&(x, _)| x).fold(f64::MAX, f64::min);
    let max_x = ours.iter().map(|&(x, _)| x).fold(1.0, f64::max);
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "RDMA round-trip latency (p50) vs message size",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((min_x..max_x * 1.5).log_scale(), (min_y..max_y).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes, log scale)")
        .y_desc("µs (log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(ours.clone(), &BLUE))
        .map_err(|e| e.to_string())?
        .label("rdma-rpc p50 (generated stub, blocking)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(ours.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(perf.clone(), &RED))
        .map_err(|e| e.to_string())?
        .label("2 × ib_send_lat (perftest, same boot)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .draw_series(perf.iter().map(|&p| Circle::new(p, 3, RED.filled())))
        .map_err(|e| e.to_string())?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
