//! `--sweep`: latency and CPU against offered rate, and `--compare`: sweeps
//! of different servers side by side.
//!
//! A sweep runs one open-loop point per rate against one server (started
//! once, or already running), each with its own subscriber and run tag, so a
//! late event of one point is never taken for the next one's. Each point
//! sends for `--warmup-s` + `--duration-s`; latency and CPU count only what
//! comes after the warm-up. The point's full [`Report`] is kept in the JSON;
//! the table and the plot show, per rate: what was offered and achieved, the
//! latency percentiles, events missing, and the server's and the bench's CPU.
//!
//! `--compare a.json,b.json` reads sweeps written by `--sweep --json` (of
//! spate and of NATS, say), lines their points up by offered rate, and
//! prints each one's figures with the p99 ratio against the first: the
//! number spate's latency goal is stated in ("never worse than NATS core's
//! p99 at the same rate", README, Benchmarks).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bench::args::{BenchArgs, COMPARE_FILE_COUNT_MAX, Plan, Target};
use crate::bench::report::{LatencyUs, Report, RunInfo, SecondLatency, format_rate};
use crate::bench::session::Session;
use crate::bench::{BenchError, measure, plot, write_json};

/// Two offered rates within this relative distance are the same point.
const SAME_RATE_TOLERANCE: f64 = 0.01;

/// The figures of one sweep point: what the table, the plot and `--compare` read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PointFigures {
    pub rate_offered_per_s: f64,
    /// Events sent over the run (first byte to last sync): below the offer
    /// when the server pushed back so long the run ended behind schedule.
    pub rate_sent_per_s: f64,
    /// Events the subscriber received over its run (first byte to last
    /// event): end to end. Without a subscriber, the sent rate.
    pub rate_achieved_per_s: f64,
    pub events_sent: u64,
    pub events_missing: Option<u64>,
    /// After the warm-up.
    pub latency_us: Option<LatencyUs>,
    /// The highest p99 of any one second after the warm-up.
    pub worst_second_p99_us: Option<f64>,
    pub server_cpu_us_per_event: Option<f64>,
    pub server_cores: Option<f64>,
    pub bench_cpu_us_per_event: f64,
    pub bench_cores: f64,
    /// spate's credit stalls (0 for NATS).
    pub credit_stalls: u64,
}

impl PointFigures {
    pub fn from_report(rate_offered_per_s: f64, report: &Report) -> PointFigures {
        let cpu = &report.cpu;
        PointFigures {
            rate_offered_per_s,
            rate_sent_per_s: report.events_per_s,
            rate_achieved_per_s: report.subscriber.map_or(report.events_per_s, |subscriber| subscriber.events_per_s),
            events_sent: report.events,
            events_missing: report.subscriber.map(|subscriber| subscriber.events_missing),
            latency_us: report.latency_us,
            worst_second_p99_us: SecondLatency::worst(&report.latency_by_second).map(|second| second.p99_us),
            server_cpu_us_per_event: cpu.server_ns_per_event.map(|ns| ns / 1e3),
            server_cores: cpu.server_cores,
            bench_cpu_us_per_event: cpu.bench_ns_per_event / 1e3,
            bench_cores: cpu.bench_cores,
            credit_stalls: report.credit_stalls,
        }
    }
}

/// One point: its figures, and the full report of its run.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    #[serde(flatten)]
    pub figures: PointFigures,
    pub report: Report,
}

/// A whole sweep, as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    /// Names the sweep in tables and plots (`--label`, or the server's name).
    pub label: String,
    pub target: &'static str,
    /// `spate 0.1.0`, `nats-server 2.9.10`.
    pub server: String,
    pub warmup_s: f64,
    /// Measured seconds per point (after the warm-up).
    pub duration_s: Option<f64>,
    /// How the first point was run (the others differ only in rate).
    pub run: Option<RunInfo>,
    pub points: Vec<SweepPoint>,
}

/// A sweep as `--compare` reads it back: the figures, not the reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SweepSummary {
    pub label: String,
    pub target: String,
    pub server: String,
    pub points: Vec<PointFigures>,
}

impl SweepReport {
    fn summary(&self) -> SweepSummary {
        SweepSummary {
            label: self.label.clone(),
            target: self.target.to_string(),
            server: self.server.clone(),
            points: self.points.iter().map(|point| point.figures.clone()).collect(),
        }
    }
}

/// Runs one point per rate against the session's server, then prints the
/// table and writes the JSON and the plot.
pub fn run(args: &BenchArgs, plan: &Plan, session: &mut Session, rates: &[f64]) -> Result<SweepReport, BenchError> {
    let measured_s = match plan.stop {
        crate::bench::args::Stop::Duration(duration) => Some((duration - plan.warmup).as_secs_f64()),
        crate::bench::args::Stop::Events(_) => None,
    };
    let mut sweep = SweepReport {
        label: String::new(),
        target: plan.target.as_str(),
        server: String::new(),
        warmup_s: plan.warmup.as_secs_f64(),
        duration_s: measured_s,
        run: None,
        points: Vec::with_capacity(rates.len()),
    };
    for (index, &rate) in rates.iter().enumerate() {
        // The previous point's subscriber has closed, but spate notices only
        // when it next writes to it, i.e. once this point's events flow. So
        // the count of subscribers is steady while the next one subscribes,
        // and "one more than before" still recognises it.
        eprintln!("spate bench: sweep point {} of {}: {}/s", index + 1, rates.len(), format_rate(rate));
        let point = match measure(args, &plan.at_rate(rate), session, index == 0) {
            Ok(point) => point,
            Err(error) => {
                if !sweep.points.is_empty() {
                    print!("{}", render_sweep(&sweep.summary(), "the sweep so far (it failed at the next point)"));
                }
                return Err(error);
            }
        };
        if index == 0 {
            println!(
                "  sweep:    {}",
                rates.iter().map(|rate| format!("{}/s", format_rate(*rate))).collect::<Vec<_>>().join(", ")
            );
        }
        let figures = PointFigures::from_report(rate, &point.report);
        eprintln!("spate bench: {}", render_row(&figures).trim());
        sweep.run.get_or_insert_with(|| point.report.run.clone());
        sweep.points.push(SweepPoint { figures, report: point.report });
    }
    sweep.server = session.server_name();
    sweep.label = args.label.clone().unwrap_or_else(|| default_label(session, sweep.run.as_ref()));
    let summary = sweep.summary();
    print!("{}", render_sweep(&summary, &sweep_heading(&sweep)));
    if let Some(path) = &args.json {
        write_json(path, &sweep)?;
    }
    if let Some(dir) = &args.plot_dir {
        let path = plot::sweep_plot(dir, "latency-vs-rate.svg", &[summary], &sweep_heading(&sweep))?;
        println!("  plot                   {}", path.display());
    }
    Ok(sweep)
}

fn default_label(session: &Session, run: Option<&RunInfo>) -> String {
    match (session.target, run.and_then(|run| run.server.shards)) {
        (Target::Spate | Target::Kafka, Some(shards)) => format!("{} ({shards} shards)", session.server_name()),
        _ => session.server_name(),
    }
}

fn sweep_heading(sweep: &SweepReport) -> String {
    let per_point = match sweep.duration_s {
        Some(seconds) => format!("{} s warm-up + {seconds} s per point", sweep.warmup_s),
        None => format!("{} s warm-up per point", sweep.warmup_s),
    };
    match &sweep.run {
        Some(run) => format!(
            "{}: open loop, {} connections, {} B payloads, {per_point}",
            sweep.label, run.connections, run.payload_bytes
        ),
        None => format!("{}: {per_point}", sweep.label),
    }
}

/// Latency in milliseconds, with the digits that matter at its size.
pub fn format_ms(us: f64) -> String {
    let ms = us / 1e3;
    match ms {
        ms if ms < 1.0 => format!("{ms:.3}"),
        ms if ms < 10.0 => format!("{ms:.2}"),
        ms if ms < 1000.0 => format!("{ms:.1}"),
        ms => format!("{ms:.0}"),
    }
}

fn or_dash<T>(value: Option<T>, format: impl Fn(T) -> String) -> String {
    value.map_or_else(|| "-".to_string(), format)
}

const SWEEP_HEADER: &str = "  offered  achieved   p50 ms   p90 ms   p99 ms  p999 ms   max ms  worst-s p99  missing  \
server µs/ev  server cores  bench cores";

/// One row of the sweep table.
pub fn render_row(point: &PointFigures) -> String {
    let latency = point.latency_us;
    let ms = |pick: fn(&LatencyUs) -> f64| or_dash(latency.as_ref(), |latency| format_ms(pick(latency)));
    format!(
        "  {:>7}  {:>8}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {:>11}  {:>7}  {:>12}  {:>12}  {:>11}",
        format_rate(point.rate_offered_per_s),
        format_rate(point.rate_achieved_per_s),
        ms(|latency| latency.p50),
        ms(|latency| latency.p90),
        ms(|latency| latency.p99),
        ms(|latency| latency.p999),
        ms(|latency| latency.max),
        or_dash(point.worst_second_p99_us, format_ms),
        or_dash(point.events_missing, |missing| missing.to_string()),
        or_dash(point.server_cpu_us_per_event, |us| format!("{us:.2}")),
        or_dash(point.server_cores, |cores| format!("{cores:.2}")),
        format!("{:.2}", point.bench_cores),
    )
}

/// The sweep table.
pub fn render_sweep(sweep: &SweepSummary, heading: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "sweep: {heading}");
    let _ = writeln!(out, "{SWEEP_HEADER}");
    for point in &sweep.points {
        let _ = writeln!(out, "{}", render_row(point));
    }
    let _ = writeln!(
        out,
        "  (events/s; latency end to end from intended send time, after the warm-up; worst-s p99: the worst \
         second's; CPU per event sent after the warm-up; cores: CPU s per s)"
    );
    out
}

/// Sweeps side by side, points lined up by offered rate.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub sweeps: Vec<SweepSummary>,
    pub rows: Vec<ComparisonRow>,
}

/// One offered rate across the compared sweeps.
#[derive(Debug, Clone, Serialize)]
pub struct ComparisonRow {
    pub rate_offered_per_s: f64,
    /// The point of each sweep at this rate, in the order of the files.
    pub points: Vec<Option<PointFigures>>,
    /// The first sweep's p99 over each other sweep's (in file order, the
    /// first omitted): below 1 means the first has the shorter tail.
    pub p99_ratios: Vec<Option<f64>>,
}

impl Comparison {
    pub fn new(sweeps: Vec<SweepSummary>) -> Comparison {
        let mut rates: Vec<f64> =
            sweeps.iter().flat_map(|sweep| sweep.points.iter()).map(|point| point.rate_offered_per_s).collect();
        rates.sort_by(f64::total_cmp);
        rates.dedup_by(|later, earlier| same_rate(*later, *earlier));
        let rows = rates
            .into_iter()
            .map(|rate| {
                let points: Vec<Option<PointFigures>> = sweeps
                    .iter()
                    .map(|sweep| sweep.points.iter().find(|point| same_rate(point.rate_offered_per_s, rate)).cloned())
                    .collect();
                let p99 = |point: &Option<PointFigures>| {
                    point.as_ref().and_then(|point| point.latency_us).map(|latency| latency.p99)
                };
                let first = p99(&points[0]);
                let p99_ratios = points[1..]
                    .iter()
                    .map(|other| {
                        first.zip(p99(other)).filter(|(_, other)| *other > 0.0).map(|(first, other)| first / other)
                    })
                    .collect();
                ComparisonRow { rate_offered_per_s: rate, points, p99_ratios }
            })
            .collect();
        Comparison { sweeps, rows }
    }
}

fn same_rate(a: f64, b: f64) -> bool {
    (a - b).abs() <= SAME_RATE_TOLERANCE * a.abs().max(b.abs())
}

/// The comparison table: per sweep p50/p99/p999, missing, server CPU; then p99 ratios.
pub fn render_comparison(comparison: &Comparison) -> String {
    let mut out = String::new();
    let sweeps = &comparison.sweeps;
    for (index, sweep) in sweeps.iter().enumerate() {
        let _ = writeln!(out, "  [{}] {} ({})", index + 1, sweep.label, sweep.server);
    }
    let mut header = format!("  {:>7}", "offered");
    for index in 1..=sweeps.len() {
        let _ = write!(
            header,
            " | [{index}] {:>6} {:>7} {:>7} {:>7} {:>7}",
            "p50 ms", "p99 ms", "p999 ms", "missing", "µs/ev"
        );
    }
    for index in 2..=sweeps.len() {
        let _ = write!(header, " | p99 [1]/[{index}]");
    }
    let _ = writeln!(out, "{header}");
    for row in &comparison.rows {
        let mut line = format!("  {:>7}", format_rate(row.rate_offered_per_s));
        for point in &row.points {
            let latency = point.as_ref().and_then(|point| point.latency_us);
            let ms = |pick: fn(&LatencyUs) -> f64| or_dash(latency.as_ref(), |latency| format_ms(pick(latency)));
            let _ = write!(
                line,
                " |     {:>6} {:>7} {:>7} {:>7} {:>7}",
                ms(|latency| latency.p50),
                ms(|latency| latency.p99),
                ms(|latency| latency.p999),
                or_dash(point.as_ref().and_then(|point| point.events_missing), |missing| missing.to_string()),
                or_dash(point.as_ref().and_then(|point| point.server_cpu_us_per_event), |us| format!("{us:.2}")),
            );
        }
        for ratio in &row.p99_ratios {
            let _ = write!(line, " | {:>11}", or_dash(*ratio, |ratio| format!("{ratio:.2}x")));
        }
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out, "  (µs/ev: the server's CPU per event; p99 [1]/[n] below 1: [1] has the shorter tail)");
    out
}

fn read_summary(path: &Path) -> Result<SweepSummary, BenchError> {
    let read_error = |detail: String| BenchError::ReadSweep { path: path.to_path_buf(), detail };
    let text = std::fs::read_to_string(path).map_err(|error| read_error(error.to_string()))?;
    serde_json::from_str(&text).map_err(|error| read_error(format!("not a --sweep --json file: {error}")))
}

/// `--compare`: reads the sweeps, prints them side by side, writes the
/// combined JSON and plot.
pub fn compare(args: &BenchArgs, files: &[PathBuf]) -> Result<Comparison, BenchError> {
    if !(2..=COMPARE_FILE_COUNT_MAX).contains(&files.len()) {
        return Err(BenchError::Invalid {
            flag: "--compare",
            value: files.len().to_string(),
            reason: "give between 2 and 8 sweep JSON files",
        });
    }
    let sweeps = files.iter().map(|path| read_summary(path)).collect::<Result<Vec<_>, _>>()?;
    let comparison = Comparison::new(sweeps);
    let labels: Vec<&str> = comparison.sweeps.iter().map(|sweep| sweep.label.as_str()).collect();
    println!("compare: {}", labels.join(" vs "));
    print!("{}", render_comparison(&comparison));
    if let Some(path) = &args.json {
        write_json(path, &comparison)?;
    }
    if let Some(dir) = &args.plot_dir {
        let subtitle = format!("{}: p50 (thin), p99 (thick), p99.9 (dashed)", labels.join(" vs "));
        let path = plot::sweep_plot(dir, "latency-vs-rate-compare.svg", &comparison.sweeps, &subtitle)?;
        println!("  plot                   {}", path.display());
    }
    Ok(comparison)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(rate: f64, p99_us: f64) -> PointFigures {
        PointFigures {
            rate_offered_per_s: rate,
            rate_sent_per_s: rate,
            rate_achieved_per_s: rate,
            events_sent: 1000,
            events_missing: Some(0),
            latency_us: Some(LatencyUs {
                p50: p99_us / 4.0,
                p90: p99_us / 2.0,
                p99: p99_us,
                p999: p99_us * 2.0,
                max: p99_us * 3.0,
                mean: p99_us / 4.0,
                count: 1000,
            }),
            worst_second_p99_us: Some(p99_us),
            server_cpu_us_per_event: Some(1.5),
            server_cores: Some(0.2),
            bench_cpu_us_per_event: 0.5,
            bench_cores: 0.1,
            credit_stalls: 0,
        }
    }

    fn summary(label: &str, points: Vec<PointFigures>) -> SweepSummary {
        SweepSummary { label: label.into(), target: "spate".into(), server: "x".into(), points }
    }

    /// Points line up by rate (within 1 %); the ratio is first over other;
    /// a rate one sweep lacks shows as a gap, not a wrong pairing.
    #[test]
    fn comparison_lines_points_up_by_rate() {
        let spate = summary("spate", vec![figures(1000.0, 800.0), figures(2000.0, 3000.0)]);
        let nats = summary("nats", vec![figures(1005.0, 400.0), figures(4000.0, 500.0)]);
        let comparison = Comparison::new(vec![spate, nats]);
        let rates: Vec<f64> = comparison.rows.iter().map(|row| row.rate_offered_per_s).collect();
        assert_eq!(rates, [1000.0, 2000.0, 4000.0]);
        assert_eq!(comparison.rows[0].p99_ratios, [Some(2.0)]);
        assert_eq!(comparison.rows[1].p99_ratios, [None]);
        assert!(comparison.rows[2].points[0].is_none());
        let table = render_comparison(&comparison);
        assert!(table.contains("2.00x"), "{table}");
        assert!(table.contains("[2] nats"), "{table}");
    }

    /// A sweep's JSON reads back as the summary `--compare` needs.
    #[test]
    fn summary_reads_back_from_the_sweep_json() {
        let point = figures(5000.0, 1234.0);
        let json = serde_json::json!({
            "label": "spate", "target": "spate", "server": "spate 0.1.0", "warmup_s": 1.0,
            "points": [serde_json::to_value(&point).unwrap()],
        });
        let summary: SweepSummary = serde_json::from_value(json).unwrap();
        assert_eq!(summary.points, [point]);
    }

    /// Milliseconds keep three significant digits or so at every size.
    #[test]
    fn milliseconds_are_readable() {
        assert_eq!(format_ms(412.0), "0.412");
        assert_eq!(format_ms(8_500.0), "8.50");
        assert_eq!(format_ms(44_000.0), "44.0");
        assert_eq!(format_ms(1_234_567.0), "1235");
    }

    /// The table has a row per point and dashes where nothing was measured.
    #[test]
    fn sweep_table_rows() {
        let mut unmeasured = figures(3000.0, 1.0);
        unmeasured.latency_us = None;
        unmeasured.server_cpu_us_per_event = None;
        let table = render_sweep(&summary("s", vec![figures(1000.0, 900.0), unmeasured]), "heading");
        assert_eq!(table.lines().count(), 5, "{table}");
        assert!(table.contains("0.900") && table.contains(" - "), "{table}");
    }
}
