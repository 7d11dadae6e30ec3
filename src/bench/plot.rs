//! `--plot-dir`: two SVGs (plotters, SVG backend only: text is left to the
//! viewer's fonts, nothing is rasterised here).
//!
//! * `latency.svg`: latency against percentile on a "nines" axis
//!   (x = -log10(1 - p): 90 % at 1, 99 % at 2, 99.9 % at 3), log µs on y, the
//!   usual way to show a tail without hiding it.
//! * `shards.svg`: each shard's stored events/s over time, from the 200 ms
//!   `/stats` samples, so load moving between shards (a shifting hot set, a
//!   partition migration) is visible.
//! * `latency-vs-rate.svg` (`--sweep`) and `latency-vs-rate-compare.svg`
//!   (`--compare`): p50, p99 and p99.9 against offered rate, log on both
//!   axes, with the goals (p99 1 ms, p99.9 5 ms) drawn in; below, the
//!   server's CPU per event against the same rate (goal: 1 µs).

use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::bench::BenchError;
use crate::bench::stats::ProgressSample;
use crate::bench::sweep::{PointFigures, SweepSummary};

/// Pixels of each plot.
const PLOT_SIZE: (u32, u32) = (1000, 600);
/// Most nines the latency axis shows (99.9999 %).
const NINES_MAX: f64 = 6.0;
/// Points per nine on the latency curve.
const POINTS_PER_NINE: u32 = 40;

/// Pixels above the chart for the title and the subtitle.
const TITLE_HEIGHT: u32 = 60;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A chart with log scales on both axes.
type LogChart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<LogCoord<f64>, LogCoord<f64>>>;

/// Fills the plot white, writes a title and a smaller subtitle line (SVG
/// text has no line breaks) and returns the area below them.
fn titled<'a>(root: &Area<'a>, title: &str, subtitle: &str) -> Result<Area<'a>, String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, body) = root.split_vertically(TITLE_HEIGHT);
    let centre = (PLOT_SIZE.0 / 2) as i32;
    let style = |size| TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    top.draw(&Text::new(title, (centre, 8), style(22))).map_err(|e| e.to_string())?;
    top.draw(&Text::new(subtitle, (centre, 36), style(15))).map_err(|e| e.to_string())?;
    Ok(body)
}

fn plot_error(path: &Path) -> impl Fn(String) -> BenchError + '_ {
    move |detail| BenchError::Plot { path: path.to_path_buf(), detail }
}

/// `1 - 10^-nines` as a percentage label: 0 → `0%`, 2 → `99%`, 3 → `99.9%`.
pub fn nines_label(nines: f64) -> String {
    let percent = 100.0 * (1.0 - 10f64.powf(-nines));
    let decimals = (nines.ceil() as i32 - 2).clamp(0, 6) as usize;
    format!("{percent:.decimals$}%")
}

/// Percentile points `(nines, µs)` of a histogram, up to the nines its count
/// supports (no extrapolating past the last sample).
pub fn latency_points(latency_ns: &Histogram<u64>) -> Vec<(f64, f64)> {
    let count = latency_ns.len().max(1) as f64;
    let nines_max = count.log10().clamp(1.0, NINES_MAX);
    let point_count = (nines_max * f64::from(POINTS_PER_NINE)).ceil() as u32;
    (0..=point_count)
        .map(|index| {
            let nines = (f64::from(index) / f64::from(POINTS_PER_NINE)).min(nines_max);
            let quantile = 1.0 - 10f64.powf(-nines);
            (nines, latency_ns.value_at_quantile(quantile) as f64 / 1e3)
        })
        .collect()
}

/// Writes `latency.svg`; returns its path.
pub fn latency_plot(dir: &Path, latency_ns: &Histogram<u64>, subtitle: &str) -> Result<PathBuf, BenchError> {
    let path = dir.join("latency.svg");
    draw_latency(&path, latency_ns, subtitle)?;
    Ok(path)
}

fn draw_latency(path: &Path, latency_ns: &Histogram<u64>, subtitle: &str) -> Result<(), BenchError> {
    let error = plot_error(path);
    let points = latency_points(latency_ns);
    let nines_max = points.last().map_or(1.0, |point| point.0);
    let y_min = points.iter().map(|point| point.1).fold(f64::INFINITY, f64::min).max(0.1) / 1.5;
    let y_max = (latency_ns.max() as f64 / 1e3).max(y_min * 10.0) * 1.5;
    let root = SVGBackend::new(path, PLOT_SIZE).into_drawing_area();
    let body = titled(&root, "spate bench: end-to-end latency by percentile", subtitle).map_err(&error)?;
    let mut chart = ChartBuilder::on(&body)
        .margin(20)
        .margin_right(60)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..nines_max, (y_min..y_max).log_scale())
        .map_err(|e| error(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (µs, log scale)")
        .x_labels(nines_max as usize + 1)
        .x_label_formatter(&|nines| nines_label(*nines))
        .y_label_formatter(&|us| format!("{us:.0}"))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| error(e.to_string()))?;
    chart.draw_series(LineSeries::new(points, BLUE.stroke_width(2))).map_err(|e| error(e.to_string()))?;
    let marks = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];
    let marks = marks.iter().map(|&(name, quantile)| (name, -(1.0f64 - quantile).log10(), quantile));
    let marks = marks.filter(|mark| mark.1 <= nines_max + 1e-9).map(|(name, nines, quantile)| {
        let us = latency_ns.value_at_quantile(quantile) as f64 / 1e3;
        EmptyElement::at((nines, us))
            + Circle::new((0, 0), 4, RED.filled())
            + Text::new(format!("{name} {us:.0} µs"), (6, -18), ("sans-serif", 14))
    });
    chart.draw_series(marks).map_err(|e| error(e.to_string()))?;
    root.present().map_err(|e| error(e.to_string()))
}

/// Per-shard events/s between consecutive samples: `(seconds, rate)` lines.
pub fn shard_rates(samples: &[ProgressSample]) -> Vec<Vec<(f64, f64)>> {
    let shard_count = samples.iter().map(|sample| sample.events_total.len()).min().unwrap_or(0);
    let mut lines = vec![Vec::with_capacity(samples.len()); shard_count];
    for pair in samples.windows(2) {
        let seconds = pair[1].elapsed_s - pair[0].elapsed_s;
        if seconds <= 0.0 {
            continue;
        }
        for (shard, line) in lines.iter_mut().enumerate() {
            let events = pair[1].events_total[shard].saturating_sub(pair[0].events_total[shard]);
            line.push((pair[1].elapsed_s, events as f64 / seconds));
        }
    }
    lines
}

/// Writes `shards.svg`; returns its path.
/// Samples after `run_seconds` (the subscriber draining, the last partial
/// interval) are left out.
pub fn shard_plot(
    dir: &Path,
    samples: &[ProgressSample],
    run_seconds: f64,
    subtitle: &str,
) -> Result<PathBuf, BenchError> {
    let path = dir.join("shards.svg");
    let kept = samples.iter().take_while(|sample| sample.elapsed_s <= run_seconds).count();
    draw_shards(&path, &samples[..kept.max(2).min(samples.len())], subtitle)?;
    Ok(path)
}

fn draw_shards(path: &Path, samples: &[ProgressSample], subtitle: &str) -> Result<(), BenchError> {
    let error = plot_error(path);
    let lines = shard_rates(samples);
    let total: Vec<(f64, f64)> = match lines.first() {
        Some(first) => {
            (0..first.len()).map(|index| (first[index].0, lines.iter().map(|line| line[index].1).sum())).collect()
        }
        None => Vec::new(),
    };
    let x_max = samples.last().map_or(1.0, |sample| sample.elapsed_s).max(0.2);
    let y_max = total.iter().map(|point| point.1 / 1e6).fold(0.0, f64::max).max(0.001) * 1.15;
    let root = SVGBackend::new(path, PLOT_SIZE).into_drawing_area();
    let title = "spate bench: stored events/s per shard (from /stats every 200 ms)";
    let body = titled(&root, title, subtitle).map_err(&error)?;
    let mut chart = ChartBuilder::on(&body)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| error(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first byte")
        .y_desc("stored events/s (millions)")
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| error(e.to_string()))?;
    for (shard, line) in lines.into_iter().enumerate() {
        let color = Palette99::pick(shard).to_rgba();
        let points = line.into_iter().map(|(seconds, rate)| (seconds, rate / 1e6));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| error(e.to_string()))?
            .label(format!("shard {shard}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    let points = total.into_iter().map(|(seconds, rate)| (seconds, rate / 1e6));
    chart
        .draw_series(LineSeries::new(points, BLACK.stroke_width(1)))
        .map_err(|e| error(e.to_string()))?
        .label("all shards")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(|e| error(e.to_string()))?;
    root.present().map_err(|e| error(e.to_string()))
}

/// The latency goals drawn on the sweep plot (the latency goals of
/// the README's Benchmarks section): p99 and p99.9 in µs.
const GOAL_P99_US: f64 = 1_000.0;
const GOAL_P999_US: f64 = 5_000.0;
/// The server CPU goal at moderate rates, µs per event.
const GOAL_CPU_US_PER_EVENT: f64 = 1.0;
/// Labels on a sweep plot's rate axis (plotters picks round values).
const SWEEP_AXIS_LABELS: usize = 8;
/// Labels on the CPU axis (fewer: the panel is short).
const SWEEP_CPU_AXIS_LABELS: usize = 6;
/// Light grid lines between two labelled ones.
const SWEEP_LIGHT_LINES: usize = 1;
/// Share of the sweep plot's height the latency panel takes.
const LATENCY_PANEL_SHARE: f64 = 0.62;

/// The percentiles a sweep plot draws: name, pick, stroke width, dashed.
type Percentile = (&'static str, fn(&crate::bench::report::LatencyUs) -> f64, u32, bool);
const SWEEP_PERCENTILES: [Percentile; 3] = [
    ("p50", |latency| latency.p50, 1, false),
    ("p99", |latency| latency.p99, 3, false),
    ("p99.9", |latency| latency.p999, 2, true),
];

/// Log-axis range that holds `values` (positive ones), padded.
fn log_range(values: impl Iterator<Item = f64>, floor: f64) -> std::ops::Range<f64> {
    let (low, high) = values
        .filter(|value| value.is_finite() && *value > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(low, high), value| (low.min(value), high.max(value)));
    if !low.is_finite() {
        return floor..floor * 10.0;
    }
    let low = (low / 1.5).max(floor);
    low..(high * 1.5).max(low * 10.0)
}

/// The colour of a line: by percentile when one sweep is drawn, by sweep
/// when several are.
fn sweep_colour(sweep_count: usize, sweep_index: usize, percentile_index: usize) -> RGBAColor {
    let index = if sweep_count == 1 { percentile_index } else { sweep_index };
    Palette99::pick(index).to_rgba()
}

/// Writes a sweep plot named `file_name`; returns its path.
pub fn sweep_plot(dir: &Path, file_name: &str, sweeps: &[SweepSummary], subtitle: &str) -> Result<PathBuf, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::WriteReport { path: dir.to_path_buf(), source })?;
    let path = dir.join(file_name);
    draw_sweep(&path, sweeps, subtitle).map_err(plot_error(&path))?;
    Ok(path)
}

fn draw_sweep(path: &Path, sweeps: &[SweepSummary], subtitle: &str) -> Result<(), String> {
    let points = || sweeps.iter().flat_map(|sweep| sweep.points.iter());
    let x_range = log_range(points().map(|point| point.rate_offered_per_s), 1.0);
    let latencies = points().filter_map(|point| point.latency_us).flat_map(|latency| [latency.p50, latency.p999]);
    let y_range = log_range(latencies.chain([GOAL_P99_US, GOAL_P999_US]), 1.0);
    let root = SVGBackend::new(path, (PLOT_SIZE.0, PLOT_SIZE.1 * 3 / 2)).into_drawing_area();
    let body = titled(&root, "end-to-end latency and server CPU against offered rate (open loop)", subtitle)?;
    let split_at = (f64::from(body.dim_in_pixel().1) * LATENCY_PANEL_SHARE) as u32;
    let (top, bottom) = body.split_vertically(split_at);
    draw_sweep_latency(&top, sweeps, x_range.clone(), y_range)?;
    draw_sweep_cpu(&bottom, sweeps, x_range)?;
    root.present().map_err(|e| e.to_string())
}

/// The upper panel: latency percentiles against offered rate, with the goals
/// and a legend.
fn draw_sweep_latency(
    area: &Area<'_>,
    sweeps: &[SweepSummary],
    x_range: std::ops::Range<f64>,
    y_range: std::ops::Range<f64>,
) -> Result<(), String> {
    let mut chart = ChartBuilder::on(area)
        .margin(20)
        .margin_right(40)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range.clone().log_scale(), y_range.log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .y_desc("latency (log scale)")
        .x_labels(SWEEP_AXIS_LABELS)
        .max_light_lines(SWEEP_LIGHT_LINES)
        .x_label_formatter(&|rate| format_axis_rate(*rate))
        .y_label_formatter(&|us| format_axis_latency(*us))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| e.to_string())?;
    draw_latency_goals(&mut chart, &x_range)?;
    for (sweep_index, sweep) in sweeps.iter().enumerate() {
        draw_sweep_percentiles(&mut chart, sweeps.len(), sweep_index, sweep)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| e.to_string())
}

/// The p99 and p99.9 goals as labelled dashed lines across the rate axis.
fn draw_latency_goals(chart: &mut LogChart<'_, '_>, x_range: &std::ops::Range<f64>) -> Result<(), String> {
    for (goal_us, name) in [(GOAL_P99_US, "p99 goal 1 ms"), (GOAL_P999_US, "p99.9 goal 5 ms")] {
        let line = [(x_range.start, goal_us), (x_range.end, goal_us)];
        chart
            .draw_series(DashedLineSeries::new(line, 4, 6, BLACK.mix(0.4).stroke_width(1)))
            .map_err(|e| e.to_string())?;
        let label = Text::new(
            name,
            (x_range.start * 1.05, goal_us * 1.08),
            ("sans-serif", 13).into_font().color(&BLACK.mix(0.6)),
        );
        chart.draw_series(std::iter::once(label)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One sweep's [`SWEEP_PERCENTILES`], each a line with a dot per point and
/// a legend entry; `sweep_index` of `sweep_count` picks the colours.
fn draw_sweep_percentiles(
    chart: &mut LogChart<'_, '_>,
    sweep_count: usize,
    sweep_index: usize,
    sweep: &SweepSummary,
) -> Result<(), String> {
    for (percentile_index, &(name, pick, width, dashed)) in SWEEP_PERCENTILES.iter().enumerate() {
        let colour = sweep_colour(sweep_count, sweep_index, percentile_index);
        let style = colour.stroke_width(width);
        let line: Vec<(f64, f64)> = sweep
            .points
            .iter()
            .filter_map(|point| point.latency_us.map(|latency| (point.rate_offered_per_s, pick(&latency))))
            .filter(|(_, us)| *us > 0.0)
            .collect();
        let label = format!("{} {name}", sweep.label);
        let legend = move |(x, y): (i32, i32)| PathElement::new(vec![(x, y), (x + 20, y)], style);
        if dashed {
            chart.draw_series(DashedLineSeries::new(line.clone(), 6, 4, style)).map_err(|e| e.to_string())?;
        } else {
            chart.draw_series(LineSeries::new(line.clone(), style)).map_err(|e| e.to_string())?;
        }
        chart
            .draw_series(line.into_iter().map(|point| Circle::new(point, 3, colour.filled())))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(legend);
    }
    Ok(())
}

/// The lower panel: server CPU µs per event against offered rate.
fn draw_sweep_cpu(area: &Area<'_>, sweeps: &[SweepSummary], x_range: std::ops::Range<f64>) -> Result<(), String> {
    let cpu = |point: &PointFigures| point.server_cpu_us_per_event;
    let values = sweeps.iter().flat_map(|sweep| sweep.points.iter()).filter_map(cpu);
    let y_range = log_range(values.chain([GOAL_CPU_US_PER_EVENT]), 0.001);
    let mut chart = ChartBuilder::on(area)
        .margin(20)
        .margin_right(40)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range.clone().log_scale(), y_range.log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("offered rate (events/s, log scale)")
        .y_desc("server CPU (µs/event, log)")
        .y_labels(SWEEP_CPU_AXIS_LABELS)
        .x_labels(SWEEP_AXIS_LABELS)
        .max_light_lines(SWEEP_LIGHT_LINES)
        .x_label_formatter(&|rate| format_axis_rate(*rate))
        .y_label_formatter(&|us| format!("{us}"))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| e.to_string())?;
    let goal = [(x_range.start, GOAL_CPU_US_PER_EVENT), (x_range.end, GOAL_CPU_US_PER_EVENT)];
    chart.draw_series(DashedLineSeries::new(goal, 4, 6, BLACK.mix(0.4).stroke_width(1))).map_err(|e| e.to_string())?;
    for (sweep_index, sweep) in sweeps.iter().enumerate() {
        let colour = if sweeps.len() == 1 { BLACK.to_rgba() } else { sweep_colour(sweeps.len(), sweep_index, 0) };
        let line: Vec<(f64, f64)> = sweep
            .points
            .iter()
            .filter_map(|point| cpu(point).map(|us| (point.rate_offered_per_s, us)))
            .filter(|(_, us)| *us > 0.0)
            .collect();
        chart.draw_series(LineSeries::new(line.clone(), colour.stroke_width(2))).map_err(|e| e.to_string())?;
        chart
            .draw_series(line.into_iter().map(|point| Circle::new(point, 3, colour.filled())))
            .map_err(|e| e.to_string())?
            .label(format!("{} server CPU", sweep.label))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Microseconds as `500 µs`, `2 ms`, `1.5 s`.
fn format_axis_latency(us: f64) -> String {
    match us {
        us if us >= 1e6 => format!("{} s", us / 1e6),
        us if us >= 1e3 => format!("{} ms", us / 1e3),
        us => format!("{us} µs"),
    }
}

/// `250000` as `250k`, `2000000` as `2M`.
fn format_axis_rate(rate: f64) -> String {
    match rate {
        rate if rate >= 1e6 => format!("{}M", rate / 1e6),
        rate if rate >= 1e3 => format!("{}k", rate / 1e3),
        rate => format!("{rate}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nines axis labels read as percentiles.
    #[test]
    fn nines_labels() {
        assert_eq!(nines_label(0.0), "0%");
        assert_eq!(nines_label(1.0), "90%");
        assert_eq!(nines_label(2.0), "99%");
        assert_eq!(nines_label(3.0), "99.9%");
        assert_eq!(nines_label(5.0), "99.999%");
    }

    /// Latency points rise with the percentile and stop where the data does.
    #[test]
    fn latency_points_follow_the_histogram() {
        let mut latency_ns = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
        for value in 1..=10_000u64 {
            latency_ns.record(value * 100).unwrap();
        }
        let points = latency_points(&latency_ns);
        assert_eq!(points.first().unwrap().0, 0.0);
        assert!((points.last().unwrap().0 - 4.0).abs() < 1e-9, "10 000 samples support 4 nines");
        assert!(points.windows(2).all(|pair| pair[1].1 >= pair[0].1));
        let p99 = points.iter().find(|point| (point.0 - 2.0).abs() < 1e-9).unwrap().1;
        assert!((p99 - 990.0).abs() < 2.0, "{p99}");
    }

    /// Log ranges hold every positive value with room, and survive no data.
    #[test]
    fn log_ranges() {
        let range = log_range([300.0, 0.0, 3000.0, f64::NAN].into_iter(), 1.0);
        assert!(range.start < 300.0 && range.end > 3000.0, "{range:?}");
        assert_eq!(log_range(std::iter::empty(), 2.0), 2.0..20.0);
        assert_eq!(format_axis_rate(250_000.0), "250k");
        assert_eq!(format_axis_rate(2_000_000.0), "2M");
        assert_eq!(format_axis_latency(500.0), "500 µs");
        assert_eq!(format_axis_latency(20_000.0), "20 ms");
        assert_eq!(format_axis_latency(1_500_000.0), "1.5 s");
    }

    /// Shard rates are deltas over the sample spacing.
    #[test]
    fn shard_rates_are_deltas() {
        let samples = [
            ProgressSample { elapsed_s: 0.0, events_total: vec![0, 0] },
            ProgressSample { elapsed_s: 0.5, events_total: vec![100, 50] },
            ProgressSample { elapsed_s: 1.0, events_total: vec![300, 50] },
        ];
        let lines = shard_rates(&samples);
        assert_eq!(lines, [vec![(0.5, 200.0), (1.0, 400.0)], vec![(0.5, 100.0), (1.0, 0.0)]]);
    }
}
