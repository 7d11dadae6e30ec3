//! Rendering of admin responses: Prometheus text and JSON.

use std::fmt::Write;

use serde_json::json;

use crate::admin::{AdminState, process_rss_bytes};
use crate::shard::PartitionInfo;
use crate::shard::metrics::ShardStats;

enum Kind {
    Counter,
    Gauge,
}

/// One per-shard metric family: name, help, kind, and how to read it.
type Family = (&'static str, &'static str, Kind, fn(&ShardStats) -> f64);

const SHARD_FAMILIES: &[Family] = &[
    ("spate_events_ingested_total", "Events parsed from this shard's ingest connections.", Kind::Counter, |s| {
        s.events_ingested as f64
    }),
    ("spate_ingest_bytes_total", "Line bytes (with LF) of events parsed on this shard.", Kind::Counter, |s| {
        s.bytes_ingested as f64
    }),
    ("spate_events_stored_total", "Events appended to partition logs this shard owns.", Kind::Counter, |s| {
        s.events_stored as f64
    }),
    ("spate_stored_bytes_total", "Record bytes appended to partition logs this shard owns.", Kind::Counter, |s| {
        s.bytes_stored as f64
    }),
    ("spate_partitions_owned", "Partitions this shard owns.", Kind::Gauge, |s| f64::from(s.partitions_owned)),
    ("spate_log_bytes", "Memory held by this shard's partition logs.", Kind::Gauge, |s| s.log_bytes as f64),
    ("spate_connections_accepted_total", "Ingest connections accepted.", Kind::Counter, |s| {
        s.connections_accepted as f64
    }),
    ("spate_connections_refused_total", "Ingest connections refused at the connection limit.", Kind::Counter, |s| {
        s.connections_refused as f64
    }),
    ("spate_connections_open", "Ingest connections open.", Kind::Gauge, |s| s.connections_open as f64),
    ("spate_control_lines_total", "Control lines (#...) received.", Kind::Counter, |s| s.control_lines as f64),
    ("spate_batches_sent_total", "Batches this shard sent to owners (itself included).", Kind::Counter, |s| {
        s.batches_sent as f64
    }),
    ("spate_batches_applied_total", "Batches this shard applied as owner.", Kind::Counter, |s| {
        s.batches_applied as f64
    }),
    ("spate_credit_stalls_total", "Times a connection stopped reading for lack of credits.", Kind::Counter, |s| {
        s.credit_stalls as f64
    }),
    ("spate_credit_stall_seconds_total", "Time connections spent stalled on credits.", Kind::Counter, |s| {
        s.credit_stall_seconds
    }),
    ("spate_credits_outstanding_bytes", "Credit bytes spent by this shard and not yet returned.", Kind::Gauge, |s| {
        s.credits_outstanding_bytes as f64
    }),
    ("spate_read_buffer_bytes", "Bytes held by ingest connections' read buffers.", Kind::Gauge, |s| {
        s.read_buffer_bytes as f64
    }),
    ("spate_batch_buffered_bytes", "Bytes in open, unsent batches.", Kind::Gauge, |s| s.batch_buffered_bytes as f64),
    ("spate_apply_queue_bytes", "Bytes in the local apply queue.", Kind::Gauge, |s| s.apply_queue_bytes as f64),
    ("spate_mesh_overflow_frames_total", "Frames queued behind a full mesh ring.", Kind::Counter, |s| {
        s.mesh_overflow_frames as f64
    }),
    ("spate_mesh_queued_frames", "Frames waiting behind a full mesh ring now.", Kind::Gauge, |s| {
        s.mesh_queued_frames as f64
    }),
    ("spate_subscribers_open", "Subscriber connections open.", Kind::Gauge, |s| s.subscribers_open as f64),
    ("spate_subscribers_refused_total", "Subscribers refused at the limit.", Kind::Counter, |s| {
        s.subscribers_refused as f64
    }),
    ("spate_events_delivered_total", "Event lines written to subscribers.", Kind::Counter, |s| {
        s.events_delivered as f64
    }),
    ("spate_delivered_bytes_total", "Bytes written to subscribers.", Kind::Counter, |s| s.bytes_delivered as f64),
    ("spate_truncation_notices_total", "TRUNCATED notices sent to subscribers behind retention.", Kind::Counter, |s| {
        s.truncation_notices as f64
    }),
    (
        "spate_load_events_per_second",
        "Stored events/s, averaged over the balancer half-life (the balancer's load).",
        Kind::Gauge,
        |s| s.load_events_per_s,
    ),
    (
        "spate_load_bytes_per_second",
        "Stored payload bytes/s, averaged over the balancer half-life.",
        Kind::Gauge,
        |s| s.load_bytes_per_s,
    ),
    ("spate_hottest_partition_events_per_second", "Rate of this shard's hottest partition.", Kind::Gauge, |s| {
        s.hottest_partition_events_per_s
    }),
    ("spate_steal_requests_sent_total", "Steal requests this shard sent as a thief.", Kind::Counter, |s| {
        s.steal_requests_sent as f64
    }),
    ("spate_migrations_refused_total", "Steal requests this shard refused as an owner.", Kind::Counter, |s| {
        s.steal_refusals_sent as f64
    }),
    ("spate_migrations_started_total", "Migrations this shard started as the owner.", Kind::Counter, |s| {
        s.migrations_started as f64
    }),
    ("spate_migrations_completed_total", "Migrations completed into this shard.", Kind::Counter, |s| {
        s.migrations_completed as f64
    }),
    ("spate_migration_pending_bytes", "Events buffered for partitions migrating to this shard.", Kind::Gauge, |s| {
        s.migration_pending_bytes as f64
    }),
    (
        "spate_events_misrouted_total",
        "Events that reached a shard that does not own their partition.",
        Kind::Counter,
        |s| s.events_misrouted as f64,
    ),
];

/// A rejection reason and how to read its counter.
type Rejection = (&'static str, fn(&ShardStats) -> u64);

const REJECTIONS: &[Rejection] = &[
    ("key_empty", |s| s.lines_rejected_key_empty),
    ("key_too_long", |s| s.lines_rejected_key_too_long),
    ("line_too_long", |s| s.lines_rejected_line_too_long),
    ("unterminated_line", |s| s.lines_rejected_unterminated),
];

/// Prometheus text exposition (version 0.0.4).
pub fn prometheus(state: &AdminState, stats: &[ShardStats]) -> String {
    let mut out = String::with_capacity(16 * 1024);
    for (name, help, kind, read) in SHARD_FAMILIES {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for shard in stats {
            let _ = writeln!(out, "{name}{{shard=\"{}\"}} {}", shard.shard, read(shard));
        }
    }
    let name = "spate_lines_rejected_total";
    let _ = writeln!(out, "# HELP {name} Ingest lines rejected, by reason.\n# TYPE {name} counter");
    for shard in stats {
        for (reason, read) in REJECTIONS {
            let _ = writeln!(out, "{name}{{shard=\"{}\",reason=\"{reason}\"}} {}", shard.shard, read(shard));
        }
    }
    let (imbalance, imbalance_bound) = imbalance(stats);
    let (rss, rss_peak) = process_rss_bytes();
    let process: [(&str, &str, f64); 6] = [
        ("spate_imbalance_ratio", "Max shard load / mean shard load, over the balancer half-life.", imbalance),
        (
            "spate_imbalance_bound_ratio",
            "The imbalance the hottest partition forces: max(hottest, mean) / mean.",
            imbalance_bound,
        ),
        ("spate_process_resident_bytes", "Resident set size of the server process.", rss as f64),
        ("spate_process_resident_peak_bytes", "Peak resident set size of the server process.", rss_peak as f64),
        (
            "spate_memory_bound_bytes",
            "Peak-memory formula for this configuration (see README).",
            state.memory_bound.total as f64,
        ),
        ("spate_uptime_seconds", "Seconds since the server started.", state.started.elapsed().as_secs_f64()),
    ];
    for (name, help, value) in process {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
    }
    out
}

/// `(max / mean shard load, max(hottest partition, mean) / mean)`; 1.0
/// when idle. One key lives in one partition, so no balancer can go below
/// the second number.
pub fn imbalance(stats: &[ShardStats]) -> (f64, f64) {
    let loads: Vec<f64> = stats.iter().map(|s| s.load_events_per_s).collect();
    let mean = loads.iter().sum::<f64>() / loads.len().max(1) as f64;
    if mean <= 0.0 {
        return (1.0, 1.0);
    }
    let max = loads.iter().copied().fold(0.0, f64::max);
    let hottest = stats.iter().map(|s| s.hottest_partition_events_per_s).fold(0.0, f64::max);
    (max / mean, hottest.max(mean) / mean)
}

fn sum(stats: &[ShardStats], read: impl Fn(&ShardStats) -> u64) -> u64 {
    stats.iter().map(read).sum()
}

/// `/stats`: every shard's counters and the totals.
pub fn stats_json(state: &AdminState, stats: &[ShardStats]) -> String {
    let (rss, rss_peak) = process_rss_bytes();
    let rejected = sum(stats, |s| {
        s.lines_rejected_key_empty
            + s.lines_rejected_key_too_long
            + s.lines_rejected_line_too_long
            + s.lines_rejected_unterminated
    });
    let (imbalance_ratio, imbalance_bound_ratio) = imbalance(stats);
    let totals = json!({
        "events_ingested": sum(stats, |s| s.events_ingested),
        "bytes_ingested": sum(stats, |s| s.bytes_ingested),
        "events_stored": sum(stats, |s| s.events_stored),
        "bytes_stored": sum(stats, |s| s.bytes_stored),
        "events_total": sum(stats, |s| s.events_stored),
        "bytes_total": sum(stats, |s| s.bytes_stored),
        "partitions_owned": sum(stats, |s| u64::from(s.partitions_owned)),
        "lines_rejected": rejected,
        "connections_open": sum(stats, |s| s.connections_open),
        "credit_stalls": sum(stats, |s| s.credit_stalls),
        "credit_stall_seconds": stats.iter().map(|s| s.credit_stall_seconds).sum::<f64>(),
        "events_delivered": sum(stats, |s| s.events_delivered),
        "log_bytes": sum(stats, |s| s.log_bytes),
        "load_events_per_s": stats.iter().map(|s| s.load_events_per_s).sum::<f64>(),
        "imbalance_ratio": imbalance_ratio,
        "imbalance_bound_ratio": imbalance_bound_ratio,
        "migrations_started": sum(stats, |s| s.migrations_started),
        "migrations_completed": sum(stats, |s| s.migrations_completed),
        "migrations_refused": sum(stats, |s| s.steal_refusals_sent),
    });
    let shards: Vec<_> = stats
        .iter()
        .map(|s| {
            let mut value = serde_json::to_value(s).expect("stats serialize");
            value["events_total"] = json!(s.events_stored);
            value["bytes_total"] = json!(s.bytes_stored);
            value
        })
        .collect();
    let document = json!({
        "shards": shards,
        "totals": totals,
        "config": {
            "shards": state.controls.len(),
            "partitions": state.config.partitions,
            "rebalance": state.config.rebalance == crate::config::Rebalance::On,
        },
        "process": { "rss_bytes": rss, "rss_peak_bytes": rss_peak, "uptime_seconds": state.started.elapsed().as_secs_f64() },
        "memory_bound": state.memory_bound,
    });
    serde_json::to_string_pretty(&document).expect("json serializes")
}

/// `/partitions`: the placement table with each partition's offsets.
pub fn partitions_json(partitions: &[PartitionInfo]) -> String {
    serde_json::to_string_pretty(&json!({ "partitions": partitions })).expect("json serializes")
}
