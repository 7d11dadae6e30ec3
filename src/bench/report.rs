//! The run's report: how it was run ([`RunInfo`], printed first), what it
//! measured ([`Report`]), as a table for people and JSON for scripts
//! (`scripts/bench-compare` reads `events_per_s` and `mb_per_s`).

use std::fmt::Write;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::bench::stats::StatsSnapshot;

/// Printed with every report: the generator is not isolated from the server.
pub const SHARED_CPU_NOTE: &str = "the load generator runs on the same CPUs as the server (not isolated): \
its CPU time is taken from the server's";
/// What closed-loop latency means.
pub const CLOSED_LOOP_LATENCY_NOTE: &str = "closed loop (max rate): latency includes queueing behind the \
producers' own backlog in socket buffers and server queues; use --rate for service latency";
/// What open-loop latency means.
pub const OPEN_LOOP_LATENCY_NOTE: &str = "open loop: latency from each event's intended send time on the \
schedule to its arrival at the subscriber (coordinated-omission-correct)";

/// The machine a run happened on.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Machine {
    pub nproc: usize,
    pub kernel: String,
    pub cpu_model: String,
    pub note: &'static str,
}

impl Machine {
    pub fn detect() -> Machine {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|line| {
                line.strip_prefix("model name").map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_default();
        let nproc = std::thread::available_parallelism().map_or(0, usize::from);
        Machine { nproc, kernel, cpu_model, note: SHARED_CPU_NOTE }
    }
}

/// The server a run drove.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerInfo {
    /// `spate 0.1.0`, `nats-server 2.9.10`.
    pub name: String,
    /// Started by this bench (`--start-server`) or already running.
    pub started: bool,
    pub command_line: Option<String>,
    /// Where the producers connect (spate's ingest port, or nats-server).
    pub ingest: String,
    /// Whose `/proc/<pid>/stat` gave the server's CPU, and how it was found.
    pub pid: Option<u32>,
    pub pid_source: Option<String>,
    pub shards: Option<u64>,
    pub partitions: Option<u64>,
}

/// How a run was run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunInfo {
    pub command_line: String,
    /// `spate` or `nats`.
    pub target: &'static str,
    /// `closed-loop` or `open-loop`.
    pub mode: &'static str,
    pub rate_per_s: Option<f64>,
    pub connections: usize,
    pub events_requested: Option<u64>,
    /// The whole run, warm-up included.
    pub duration_s_requested: Option<f64>,
    /// Sent and received but not timed, and not in the CPU per event.
    pub warmup_s: f64,
    pub payload_bytes: usize,
    pub line_bytes: usize,
    pub keys: u32,
    /// The distribution with its parameters, e.g. `zipf(s=1.1)`.
    pub key_dist: String,
    pub subscriber: Option<&'static str>,
    pub write_bytes: usize,
    pub tick_us: Option<u64>,
    /// Open loop: threads pacing the connections.
    pub pacer_threads: Option<usize>,
    pub server: ServerInfo,
    pub machine: Machine,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct LatencyUs {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
    pub count: u64,
}

impl LatencyUs {
    pub fn from_histogram(latency_ns: &Histogram<u64>) -> Option<LatencyUs> {
        if latency_ns.is_empty() {
            return None;
        }
        let at = |quantile| latency_ns.value_at_quantile(quantile) as f64 / 1e3;
        Some(LatencyUs {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: latency_ns.max() as f64 / 1e3,
            mean: latency_ns.mean() / 1e3,
            count: latency_ns.len(),
        })
    }
}

/// What the subscriber counted.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SubscriberCounts {
    pub events_received: u64,
    /// From the first byte sent to the last event received: the end-to-end
    /// rate (below `events_per_s` when the subscriber falls behind ingest).
    pub seconds: f64,
    pub events_per_s: f64,
    /// Events sent that the subscriber did not see before the drain timeout.
    pub events_missing: u64,
    pub foreign_lines: u64,
    pub truncated_notices: u64,
    /// Events the notices said were skipped (fell out of retention unread).
    pub events_truncated: u64,
}

/// One shard's counters over the run.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct ShardDelta {
    pub shard: u64,
    pub events_total: u64,
    pub events_ingested: u64,
    pub events_per_s: f64,
    pub credit_stalls: u64,
    pub credit_stall_seconds: f64,
}

/// CPU used over the measured window: from the end of the warm-up (the
/// start without one) until every producer's sync was answered.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct CpuUse {
    pub window_s: f64,
    /// Events sent in the window (the per-event figures divide by this).
    pub events: u64,
    pub bench_cpu_s: f64,
    pub server_cpu_s: Option<f64>,
    pub bench_ns_per_event: f64,
    pub server_ns_per_event: Option<f64>,
    /// CPU seconds per second of the window: 1.0 is one core kept busy.
    pub bench_cores: f64,
    pub server_cores: Option<f64>,
}

impl CpuUse {
    pub fn new(window_s: f64, events: u64, bench_cpu_s: f64, server_cpu_s: Option<f64>) -> CpuUse {
        let per_event = |cpu_s: f64| if events > 0 { cpu_s * 1e9 / events as f64 } else { 0.0 };
        let cores = |cpu_s: f64| if window_s > 0.0 { cpu_s / window_s } else { 0.0 };
        CpuUse {
            window_s,
            events,
            bench_cpu_s,
            server_cpu_s,
            bench_ns_per_event: per_event(bench_cpu_s),
            server_ns_per_event: server_cpu_s.map(per_event),
            bench_cores: cores(bench_cpu_s),
            server_cores: server_cpu_s.map(cores),
        }
    }
}

/// Latency of the events intended to be sent in one second of the run
/// (counted from the end of the warm-up).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SecondLatency {
    pub second: u32,
    pub events: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl SecondLatency {
    pub fn series(by_second_ns: &[Histogram<u32>]) -> Vec<SecondLatency> {
        let us = |ns: u64| ns as f64 / 1e3;
        (0u32..)
            .zip(by_second_ns)
            .map(|(second, histogram)| SecondLatency {
                second,
                events: histogram.len(),
                p50_us: us(histogram.value_at_quantile(0.5)),
                p99_us: us(histogram.value_at_quantile(0.99)),
                max_us: us(histogram.max()),
            })
            .collect()
    }

    /// The second with the highest p99.
    pub fn worst(series: &[SecondLatency]) -> Option<SecondLatency> {
        series.iter().copied().filter(|second| second.events > 0).max_by(|a, b| a.p99_us.total_cmp(&b.p99_us))
    }
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub run: RunInfo,
    /// Events acknowledged by the producers' `#SYNC`s (stored and visible).
    pub events: u64,
    /// `totals.events_stored` after minus before: confirms `events` (more if
    /// another producer used the server meanwhile). `None` for NATS.
    pub events_stored_delta: Option<u64>,
    /// From the first byte sent to the last `OK` to `#SYNC`.
    pub seconds: f64,
    pub events_per_s: f64,
    /// Payload MB/s (10^6 bytes), as the peers in scripts/bench-compare count.
    pub mb_per_s: f64,
    /// Line MB/s: every byte on the wire (key, separators, LF).
    pub line_mb_per_s: f64,
    /// Latency of the events after the warm-up.
    pub latency_us: Option<LatencyUs>,
    pub latency_note: Option<&'static str>,
    /// The same, second by second of intended send time.
    pub latency_by_second: Vec<SecondLatency>,
    pub subscriber: Option<SubscriberCounts>,
    pub per_shard: Vec<ShardDelta>,
    /// Most-loaded shard's stored events over the mean (1.0 is perfect balance).
    pub imbalance: Option<f64>,
    pub credit_stalls: u64,
    pub credit_stall_seconds: f64,
    /// Partition migrations completed during the run (spate's `/stats`).
    pub migrations_completed: Option<u64>,
    /// `ERR` lines the server sent the producers (0 expected).
    pub error_lines: u64,
    /// Producer `write` calls, and line bytes per call.
    pub writes: u64,
    pub bytes_per_write: f64,
    pub cpu: CpuUse,
}

/// Per-shard differences between two `/stats` snapshots, matched by shard id.
pub fn shard_deltas(before: &StatsSnapshot, after: &StatsSnapshot, seconds: f64) -> Vec<ShardDelta> {
    after
        .shards
        .iter()
        .map(|now| {
            let then = before.shards.iter().find(|shard| shard.shard == now.shard).cloned().unwrap_or_default();
            let events_total = now.events_total.saturating_sub(then.events_total);
            ShardDelta {
                shard: now.shard,
                events_total,
                events_ingested: now.events_ingested.saturating_sub(then.events_ingested),
                events_per_s: if seconds > 0.0 { events_total as f64 / seconds } else { 0.0 },
                credit_stalls: now.credit_stalls.saturating_sub(then.credit_stalls),
                credit_stall_seconds: (now.credit_stall_seconds - then.credit_stall_seconds).max(0.0),
            }
        })
        .collect()
}

/// Max over mean of the shards' stored events; `None` if nothing was stored.
pub fn imbalance(per_shard: &[ShardDelta]) -> Option<f64> {
    let total: u64 = per_shard.iter().map(|shard| shard.events_total).sum();
    let max = per_shard.iter().map(|shard| shard.events_total).max()?;
    (total > 0).then(|| max as f64 * per_shard.len() as f64 / total as f64)
}

/// `12345678` as `12,345,678`.
pub fn format_count(count: u64) -> String {
    let digits = count.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A rate with an SI suffix: `12.35 M`.
pub fn format_rate(per_s: f64) -> String {
    match per_s {
        rate if rate >= 1e6 => format!("{:.2} M", rate / 1e6),
        rate if rate >= 1e3 => format!("{:.1} k", rate / 1e3),
        rate => format!("{rate:.0}"),
    }
}

/// "How it was run", printed before the run starts.
pub fn render_run_info(run: &RunInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "spate bench: {}", run.command_line);
    let stop = match (run.events_requested, run.duration_s_requested) {
        (Some(events), _) => format!("{} events", format_count(events)),
        (None, Some(seconds)) => format!("{seconds} s"),
        (None, None) => "?".into(),
    };
    let mode = match run.rate_per_s {
        Some(rate) => format!(
            "open loop at {}/s (tick {} µs, {} pacer threads)",
            format_rate(rate),
            run.tick_us.unwrap_or(0),
            run.pacer_threads.unwrap_or(1)
        ),
        None => "closed loop (max rate)".into(),
    };
    let warmup = if run.warmup_s > 0.0 { format!(" (the first {} s not timed)", run.warmup_s) } else { String::new() };
    let _ = writeln!(
        out,
        "  load:     {mode}, {} connections, {stop}{warmup}, {} B writes",
        run.connections, run.write_bytes
    );
    let keys = if run.target == "nats" {
        format!("PUB to one subject ({})", crate::bench::nats::SUBJECT)
    } else {
        format!("{} keys, {}", format_count(u64::from(run.keys)), run.key_dist)
    };
    let _ = writeln!(out, "  events:   {}-byte payloads ({}-byte lines), {keys}", run.payload_bytes, run.line_bytes);
    let subscriber = run.subscriber.map_or("none (pure ingest)".into(), |from| format!("one, SUB * {from}"));
    let _ = writeln!(out, "  latency:  subscriber {subscriber}");
    let server = &run.server;
    let shards = server.shards.map_or("?".into(), |shards| shards.to_string());
    let partitions = server.partitions.map_or("?".into(), |partitions| partitions.to_string());
    let origin = if server.started { "started by the bench" } else { "already running" };
    if run.target == "nats" {
        let _ = writeln!(out, "  server:   {} at {} ({origin})", server.name, server.ingest);
    } else {
        let _ = writeln!(
            out,
            "  server:   {} at {} ({origin}), {shards} shards, {partitions} partitions",
            server.name, server.ingest
        );
    }
    if let Some(command_line) = &server.command_line {
        let _ = writeln!(out, "            {command_line}");
    }
    let pid = match (server.pid, &server.pid_source) {
        (Some(pid), Some(source)) => format!("pid {pid} ({source})"),
        _ => "not measured (no pid: give --server-pid)".into(),
    };
    let _ = writeln!(out, "  cpu:      server {pid}; bench: this process");
    let machine = &run.machine;
    let _ = writeln!(out, "  machine:  nproc {}, kernel {}, {}", machine.nproc, machine.kernel, machine.cpu_model);
    let _ = writeln!(out, "  note:     {}", machine.note);
    out
}

/// The final table.
pub fn render_report(report: &Report) -> String {
    let mut out = String::new();
    out.push_str("result\n");
    render_throughput(&mut out, report);
    render_latency(&mut out, report);
    render_subscriber(&mut out, report);
    render_shards(&mut out, report);
    render_counts(&mut out, report);
    render_cpu(&mut out, report);
    out
}

/// One row of the table: a name column, then the value.
fn row(out: &mut String, name: &str, value: String) {
    let _ = writeln!(out, "  {name:<22} {value}");
}

/// Events (checked against the server's count), seconds, events/s and MB/s.
fn render_throughput(out: &mut String, report: &Report) {
    let events = match report.events_stored_delta {
        Some(stored) => {
            let confirm = if stored == report.events { "matches" } else { "DIFFERS" };
            format!("{} (stored per /stats: {}, {confirm})", format_count(report.events), format_count(stored))
        }
        None => format!("{} (answered PING with PONG; NATS stores nothing)", format_count(report.events)),
    };
    row(out, "events", events);
    row(out, "seconds", format!("{:.3} (first byte to last SYNC OK)", report.seconds));
    row(out, "events/s", format_count(report.events_per_s.round() as u64));
    row(out, "MB/s", format!("{:.1} payload, {:.1} line", report.mb_per_s, report.line_mb_per_s));
}

/// Latency percentiles, what they mean, and the worst second.
fn render_latency(out: &mut String, report: &Report) {
    match &report.latency_us {
        Some(latency) => {
            row(
                out,
                "latency µs",
                format!(
                    "p50 {:.0}  p90 {:.0}  p99 {:.0}  p999 {:.0}  max {:.0}  (mean {:.0}, n {})",
                    latency.p50,
                    latency.p90,
                    latency.p99,
                    latency.p999,
                    latency.max,
                    latency.mean,
                    format_count(latency.count)
                ),
            );
        }
        None => row(out, "latency µs", "not measured (no subscriber)".into()),
    }
    if let Some(note) = report.latency_note {
        row(out, "", format!("({note})"));
    }
    if let Some(worst) = SecondLatency::worst(&report.latency_by_second) {
        row(
            out,
            "worst second",
            format!(
                "p99 {:.0} µs, max {:.0} µs in second {} of {} (by intended send time after the warm-up)",
                worst.p99_us,
                worst.max_us,
                worst.second,
                report.latency_by_second.len()
            ),
        );
    }
}

/// What the subscriber received, missed and was told was truncated.
fn render_subscriber(out: &mut String, report: &Report) {
    let Some(subscriber) = &report.subscriber else { return };
    row(
        out,
        "subscriber",
        format!(
            "received {} in {:.3} s ({}/s), missing {}, foreign lines {}, TRUNCATED notices {} ({} events skipped)",
            format_count(subscriber.events_received),
            subscriber.seconds,
            format_rate(subscriber.events_per_s),
            format_count(subscriber.events_missing),
            format_count(subscriber.foreign_lines),
            subscriber.truncated_notices,
            format_count(subscriber.events_truncated)
        ),
    );
}

/// Producer writes, partition migrations (spate only) and `ERR` lines (only
/// if there were any).
fn render_counts(out: &mut String, report: &Report) {
    row(out, "writes", format!("{} ({:.0} bytes each)", format_count(report.writes), report.bytes_per_write));
    if let Some(migrations) = report.migrations_completed {
        row(out, "migrations", format!("{migrations} partitions moved during the run"));
    }
    if report.error_lines > 0 {
        row(out, "ERR lines", report.error_lines.to_string());
    }
}

/// CPU of the server and of the bench over the measured window.
fn render_cpu(out: &mut String, report: &Report) {
    let cpu = &report.cpu;
    let server_cpu = match (cpu.server_cpu_s, cpu.server_ns_per_event, cpu.server_cores) {
        (Some(seconds), Some(per_event), Some(cores)) => {
            format!("server {seconds:.2} s ({per_event:.0} ns/event, {cores:.2} cores)")
        }
        _ => "server not measured".into(),
    };
    row(
        out,
        "cpu",
        format!(
            "{server_cpu}, bench {:.2} s ({:.0} ns/event, {:.2} cores), over {:.3} s and {} events{}",
            cpu.bench_cpu_s,
            cpu.bench_ns_per_event,
            cpu.bench_cores,
            cpu.window_s,
            format_count(cpu.events),
            if report.run.warmup_s > 0.0 { " after the warm-up" } else { "" }
        ),
    );
}

/// Per-shard rows (spate only: NATS has no `/stats`).
fn render_shards(out: &mut String, report: &Report) {
    if report.per_shard.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:<6} {:>14} {:>14} {:>7} {:>9} {:>9}",
        "shard", "events_total", "events/s", "share", "stalls", "stall s"
    );
    let total: u64 = report.per_shard.iter().map(|shard| shard.events_total).sum();
    for shard in &report.per_shard {
        let share = if total > 0 { 100.0 * shard.events_total as f64 / total as f64 } else { 0.0 };
        let _ = writeln!(
            out,
            "  {:<6} {:>14} {:>14} {:>6.1}% {:>9} {:>9.3}",
            shard.shard,
            format_count(shard.events_total),
            format_count(shard.events_per_s.round() as u64),
            share,
            shard.credit_stalls,
            shard.credit_stall_seconds
        );
    }
    let balance = report.imbalance.map_or("-".into(), |imbalance| format!("{imbalance:.3} (max/mean, 1 is even)"));
    row(out, "balance", balance);
    row(out, "credit stalls", format!("{} ({:.3} s stalled)", report.credit_stalls, report.credit_stall_seconds));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::ShardCounters;

    fn sample_report() -> Report {
        let mut latency_ns = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for value in 1..=1000u64 {
            latency_ns.record(value * 1000).unwrap();
        }
        let per_shard = vec![
            ShardDelta {
                shard: 0,
                events_total: 600,
                events_ingested: 500,
                events_per_s: 600.0,
                credit_stalls: 1,
                credit_stall_seconds: 0.1,
            },
            ShardDelta {
                shard: 1,
                events_total: 400,
                events_ingested: 500,
                events_per_s: 400.0,
                credit_stalls: 0,
                credit_stall_seconds: 0.0,
            },
        ];
        Report {
            run: RunInfo {
                command_line: "spate bench --events 1000".into(),
                target: "spate",
                mode: "closed-loop",
                rate_per_s: None,
                connections: 4,
                events_requested: Some(1000),
                duration_s_requested: None,
                warmup_s: 0.0,
                payload_bytes: 64,
                line_bytes: 72,
                keys: 100,
                key_dist: "uniform".into(),
                subscriber: Some("latest"),
                write_bytes: 262_144,
                tick_us: None,
                pacer_threads: None,
                server: ServerInfo {
                    name: "spate 0.1.0".into(),
                    started: true,
                    command_line: None,
                    ingest: "127.0.0.1:1".into(),
                    pid: Some(42),
                    pid_source: Some("started by the bench".into()),
                    shards: Some(2),
                    partitions: Some(256),
                },
                machine: Machine { nproc: 2, kernel: "6.1".into(), cpu_model: "cpu".into(), note: SHARED_CPU_NOTE },
            },
            events: 1000,
            events_stored_delta: Some(1000),
            seconds: 1.0,
            events_per_s: 1000.0,
            mb_per_s: 0.064,
            line_mb_per_s: 0.072,
            latency_us: LatencyUs::from_histogram(&latency_ns),
            latency_note: Some(CLOSED_LOOP_LATENCY_NOTE),
            latency_by_second: Vec::new(),
            subscriber: Some(SubscriberCounts {
                events_received: 1000,
                seconds: 1.0,
                events_per_s: 1000.0,
                events_missing: 0,
                foreign_lines: 0,
                truncated_notices: 0,
                events_truncated: 0,
            }),
            imbalance: imbalance(&per_shard),
            per_shard,
            credit_stalls: 1,
            credit_stall_seconds: 0.1,
            migrations_completed: Some(0),
            error_lines: 0,
            writes: 10,
            bytes_per_write: 7200.0,
            cpu: CpuUse::new(1.0, 1000, 0.5, Some(1.0)),
        }
    }

    /// The JSON carries every key scripts read, with numbers where they expect numbers.
    #[test]
    fn report_json_has_the_documented_keys() {
        let json = serde_json::to_value(sample_report()).unwrap();
        for key in ["events", "seconds", "events_per_s", "mb_per_s", "imbalance"] {
            assert!(json[key].is_number(), "{key}: {}", json[key]);
        }
        for key in ["p50", "p90", "p99", "p999", "max"] {
            assert!(json["latency_us"][key].is_number(), "latency_us.{key}");
        }
        // HDR reports the top of a value's bucket: within 0.1 % at 3 digits.
        let near = |key: &str, expected: f64| (json["latency_us"][key].as_f64().unwrap() / expected - 1.0).abs() < 1e-3;
        assert!(near("p50", 500.0), "{}", json["latency_us"]);
        assert!(near("max", 1000.0), "{}", json["latency_us"]);
        assert_eq!(json["per_shard"].as_array().unwrap().len(), 2);
        assert_eq!(json["per_shard"][0]["events_total"], 600);
        assert_eq!(json["run"]["machine"]["nproc"], 2);
    }

    /// Imbalance is max over mean; deltas subtract matching shards.
    #[test]
    fn imbalance_and_deltas() {
        let report = sample_report();
        assert_eq!(report.imbalance, Some(1.2));
        assert_eq!(imbalance(&[]), None);
        let shard = |shard, events_total| ShardCounters { shard, events_total, ..ShardCounters::default() };
        let before = StatsSnapshot { shards: vec![shard(0, 10), shard(1, 5)], ..StatsSnapshot::default() };
        let after = StatsSnapshot { shards: vec![shard(0, 30), shard(1, 15)], ..StatsSnapshot::default() };
        let deltas = shard_deltas(&before, &after, 2.0);
        assert_eq!(deltas.iter().map(|delta| delta.events_total).collect::<Vec<_>>(), [20, 10]);
        assert_eq!(deltas[0].events_per_s, 10.0);
    }

    /// The table names every figure a reader looks for.
    #[test]
    fn table_shows_the_figures() {
        let table = render_report(&sample_report());
        for needle in ["events/s", "1,000", "p99", "p999", "balance", "1.200", "credit stalls", "includes queueing"] {
            assert!(table.contains(needle), "{needle} missing from\n{table}");
        }
        assert_eq!(format_count(10_000_000), "10,000,000");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_rate(12_345_678.0), "12.35 M");
    }
}
