//! The server's view of a run: `GET /stats` on the admin port, reduced to the
//! counters the report needs, and the sampler thread that polls it every
//! [`SAMPLE_PERIOD`] for the per-shard rate plot and prints the live progress
//! line once a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::bench::BenchError;
use crate::bench::producer::Shared;
use crate::bench::report::{format_count, format_rate};
use crate::bench::subscriber::SubscriberShared;

/// How often the sampler reads `/stats`.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(200);
/// Samples between two progress lines (one second).
pub const SAMPLES_PER_PROGRESS_LINE: usize = 5;
/// Most samples kept (55 hours at 200 ms); later ones are not recorded.
pub const SAMPLE_COUNT_MAX: usize = 1_000_000;
/// Timeout of one admin request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One shard's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardCounters {
    pub shard: u64,
    pub events_total: u64,
    pub events_ingested: u64,
    pub credit_stalls: u64,
    pub credit_stall_seconds: f64,
    pub subscribers_open: u64,
}

/// The parts of one `/stats` answer a bench uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsSnapshot {
    pub shards: Vec<ShardCounters>,
    /// `totals.events_stored`.
    pub events_stored: u64,
    pub shard_count: Option<u64>,
    pub partition_count: Option<u64>,
    /// `totals.migrations_completed` (absent in older servers).
    pub migrations_completed: Option<u64>,
}

impl StatsSnapshot {
    pub fn subscribers_open(&self) -> u64 {
        self.shards.iter().map(|shard| shard.subscribers_open).sum()
    }

    pub fn credit_stalls(&self) -> u64 {
        self.shards.iter().map(|shard| shard.credit_stalls).sum()
    }

    pub fn credit_stall_seconds(&self) -> f64 {
        self.shards.iter().map(|shard| shard.credit_stall_seconds).sum()
    }
}

/// Parses a `/stats` document.
pub fn parse_stats(text: &str) -> Result<StatsSnapshot, BenchError> {
    let document: Value =
        serde_json::from_str(text).map_err(|error| BenchError::StatsJson { detail: error.to_string() })?;
    let field = |value: &Value, name: &'static str| {
        value.get(name).and_then(Value::as_u64).ok_or(BenchError::StatsField { field: name })
    };
    let shards = document
        .get("shards")
        .and_then(Value::as_array)
        .ok_or(BenchError::StatsField { field: "shards" })?
        .iter()
        .map(|shard| {
            Ok(ShardCounters {
                shard: field(shard, "shard")?,
                events_total: field(shard, "events_total")?,
                events_ingested: field(shard, "events_ingested")?,
                credit_stalls: field(shard, "credit_stalls")?,
                credit_stall_seconds: shard
                    .get("credit_stall_seconds")
                    .and_then(Value::as_f64)
                    .ok_or(BenchError::StatsField { field: "credit_stall_seconds" })?,
                subscribers_open: shard.get("subscribers_open").and_then(Value::as_u64).unwrap_or(0),
            })
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    let totals = document.get("totals").ok_or(BenchError::StatsField { field: "totals" })?;
    let config = document.get("config");
    Ok(StatsSnapshot {
        shards,
        events_stored: field(totals, "events_stored")?,
        shard_count: config.and_then(|config| config.get("shards")).and_then(Value::as_u64),
        partition_count: config.and_then(|config| config.get("partitions")).and_then(Value::as_u64),
        migrations_completed: totals.get("migrations_completed").and_then(Value::as_u64),
    })
}

/// A blocking client of the admin port.
#[derive(Clone)]
pub struct AdminClient {
    agent: ureq::Agent,
    stats_url: String,
}

impl AdminClient {
    pub fn new(admin_addr: &str) -> AdminClient {
        let agent = ureq::Agent::config_builder().timeout_global(Some(REQUEST_TIMEOUT)).build().into();
        AdminClient { agent, stats_url: format!("http://{admin_addr}/stats") }
    }

    pub fn stats(&self) -> Result<StatsSnapshot, BenchError> {
        let admin_error =
            |error: ureq::Error| BenchError::Admin { url: self.stats_url.clone(), detail: error.to_string() };
        let mut response = self.agent.get(&self.stats_url).call().map_err(admin_error)?;
        let text = response.body_mut().read_to_string().map_err(admin_error)?;
        parse_stats(&text)
    }
}

/// Per-shard `events_total` at one moment of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressSample {
    pub elapsed_s: f64,
    pub events_total: Vec<u64>,
}

/// What the sampler reads besides `/stats`.
pub struct SamplerInputs {
    /// `None` for a server without `/stats` (NATS): progress lines only.
    pub admin: Option<AdminClient>,
    pub before: StatsSnapshot,
    pub producers: Arc<Shared>,
    pub subscriber: Option<Arc<SubscriberShared>>,
    pub start_ns: u64,
    /// Seconds from the start that are not timed (the p99 shown is 0 until then).
    pub warmup_s: f64,
    pub stop: Arc<AtomicBool>,
}

/// Polls `/stats` until `stop`, printing a progress line on stderr each
/// second; returns the samples (the first is `before`, at 0 s).
pub fn run_sampler(inputs: SamplerInputs) -> Vec<ProgressSample> {
    let clock = inputs.producers.clock;
    let totals = |snapshot: &StatsSnapshot| snapshot.shards.iter().map(|shard| shard.events_total).collect();
    let mut samples = vec![ProgressSample { elapsed_s: 0.0, events_total: totals(&inputs.before) }];
    let mut line = ProgressLine { at_s: 0.0, sent: 0, line_bytes: 0, stored: inputs.before.events_stored, received: 0 };
    let mut next_ns = inputs.start_ns;
    let mut latest = inputs.before.clone();
    let mut sample_index = 0usize;
    while !inputs.stop.load(Ordering::Relaxed) {
        next_ns += SAMPLE_PERIOD.as_nanos() as u64;
        let now_ns = clock.now_ns();
        if next_ns > now_ns {
            std::thread::sleep(Duration::from_nanos(next_ns - now_ns));
        }
        // A failed poll leaves a gap in the plot; the run goes on.
        if let Some(Ok(snapshot)) = inputs.admin.as_ref().map(AdminClient::stats) {
            latest = snapshot;
        }
        let elapsed_s = clock.now_ns().saturating_sub(inputs.start_ns) as f64 / 1e9;
        if samples.len() < SAMPLE_COUNT_MAX {
            samples.push(ProgressSample { elapsed_s, events_total: totals(&latest) });
        }
        sample_index += 1;
        if sample_index.is_multiple_of(SAMPLES_PER_PROGRESS_LINE) {
            line = line.print_next(elapsed_s, &inputs, &latest);
        }
    }
    samples
}

/// Counters at the last progress line, to print rates since then.
struct ProgressLine {
    at_s: f64,
    sent: u64,
    line_bytes: u64,
    stored: u64,
    received: u64,
}

impl ProgressLine {
    fn print_next(self, at_s: f64, inputs: &SamplerInputs, latest: &StatsSnapshot) -> ProgressLine {
        let producers = &inputs.producers;
        let sent = producers.events_sent.load(Ordering::Relaxed);
        let line_bytes = producers.line_bytes_sent.load(Ordering::Relaxed);
        let received = inputs.subscriber.as_ref().map_or(0, |shared| shared.events_received.load(Ordering::Relaxed));
        let seconds = (at_s - self.at_s).max(1e-9);
        let per_s = |now: u64, then: u64| now.saturating_sub(then) as f64 / seconds;
        let mut text = format!(
            "[{at_s:6.1} s] sent {}/s (total {}, {:.0} MB/s)",
            format_rate(per_s(sent, self.sent)),
            format_count(sent),
            per_s(line_bytes, self.line_bytes) / 1e6,
        );
        if inputs.admin.is_some() {
            text += &format!("  stored {}/s", format_rate(per_s(latest.events_stored, self.stored)));
        }
        if let Some(subscriber) = &inputs.subscriber {
            let p99_us = subscriber.latency_p99_ns.load(Ordering::Relaxed) as f64 / 1e3;
            let p99 = if at_s <= inputs.warmup_s { "(warm-up)".to_string() } else { format!("{p99_us:.0} µs") };
            text += &format!("  received {}/s  p99 {p99}", format_rate(per_s(received, self.received)));
        }
        if inputs.admin.is_some() {
            let stalls = latest.credit_stalls().saturating_sub(inputs.before.credit_stalls());
            let stall_seconds = latest.credit_stall_seconds() - inputs.before.credit_stall_seconds();
            text += &format!("  credit stalls {stalls} ({stall_seconds:.2} s)");
        }
        eprintln!("{text}");
        ProgressLine { at_s, sent, line_bytes, stored: latest.events_stored, received }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields the report needs are read from a real-shaped document.
    #[test]
    fn stats_document_parses() {
        let text = r#"{
            "shards": [
                {"shard": 0, "events_total": 10, "events_ingested": 12, "credit_stalls": 1,
                 "credit_stall_seconds": 0.5, "subscribers_open": 1},
                {"shard": 1, "events_total": 20, "events_ingested": 18, "credit_stalls": 0,
                 "credit_stall_seconds": 0.0, "subscribers_open": 0}
            ],
            "totals": {"events_stored": 30, "migrations_completed": 3},
            "config": {"shards": 2, "partitions": 256}
        }"#;
        let snapshot = parse_stats(text).unwrap();
        assert_eq!(snapshot.shards.len(), 2);
        assert_eq!(snapshot.shards[1].events_total, 20);
        assert_eq!(snapshot.events_stored, 30);
        assert_eq!(snapshot.credit_stalls(), 1);
        assert_eq!(snapshot.credit_stall_seconds(), 0.5);
        assert_eq!(snapshot.subscribers_open(), 1);
        assert_eq!(snapshot.shard_count, Some(2));
        assert_eq!(snapshot.partition_count, Some(256));
        assert_eq!(snapshot.migrations_completed, Some(3));
    }

    /// A document without a needed field is an error that names it.
    #[test]
    fn missing_fields_are_named() {
        let error = parse_stats(r#"{"shards": [], "config": {}}"#).unwrap_err();
        assert!(matches!(error, BenchError::StatsField { field: "totals" }), "{error:?}");
        let error = parse_stats(r#"{"shards": [{"shard": 0}], "totals": {"events_stored": 0}}"#).unwrap_err();
        assert!(matches!(error, BenchError::StatsField { field: "events_total" }), "{error:?}");
        assert!(matches!(parse_stats("not json"), Err(BenchError::StatsJson { .. })));
    }
}
