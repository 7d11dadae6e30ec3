//! Rendering of admin responses: Prometheus text and JSON.

use std::fmt::Write;

use serde_json::json;

use crate::admin::{AdminState, process_rss_bytes};
use crate::shard::control::PartitionInfo;
use crate::shard::groups::GroupInfo;
use crate::shard::metrics::{Counters, FAMILIES, Kind, ShardStats};

/// Prometheus text exposition (version 0.0.4).
pub fn prometheus(state: &AdminState, stats: &[ShardStats]) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let mut previous_name = "";
    for family in FAMILIES {
        // A family split by a label is declared as consecutive entries.
        if family.name != previous_name {
            let kind = if family.kind == Kind::Counter { "counter" } else { "gauge" };
            let _ = writeln!(out, "# HELP {} {}\n# TYPE {} {kind}", family.name, family.help, family.name);
            previous_name = family.name;
        }
        for shard in stats {
            let value = (family.read)(&shard.counters);
            match family.label {
                Some((label, label_value)) => {
                    let _ =
                        writeln!(out, "{}{{shard=\"{}\",{label}=\"{label_value}\"}} {value}", family.name, shard.shard);
                }
                None => {
                    let _ = writeln!(out, "{}{{shard=\"{}\"}} {value}", family.name, shard.shard);
                }
            }
        }
    }
    let (imbalance, imbalance_bound) = imbalance(stats);
    let (rss, rss_peak) = process_rss_bytes();
    let counters = &state.counters;
    let admin_open = counters.connections_open.load(std::sync::atomic::Ordering::Relaxed) as f64;
    let admin_errors = counters.accept_errors.load(std::sync::atomic::Ordering::Relaxed) as f64;
    let catalog_unsaved = f64::from(u8::from(state.catalog_unsaved.reason().is_some()));
    let process: [(&str, &str, f64); 9] = [
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
        ("spate_admin_connections_open", "Admin HTTP connections open.", admin_open),
        (
            "spate_catalog_unsaved",
            "1 while the stream catalog created at start-up waits for disk space to be saved.",
            catalog_unsaved,
        ),
        (
            "spate_admin_accept_errors_total",
            "Admin HTTP accepts that failed (e.g. out of file descriptors).",
            admin_errors,
        ),
    ];
    for (name, help, value) in process {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
    out
}

/// `(max / mean shard load, max(hottest partition, mean) / mean)`; 1.0
/// when idle. One key lives in one partition, so no balancer can go below
/// the second number.
pub fn imbalance(stats: &[ShardStats]) -> (f64, f64) {
    let loads: Vec<f64> = stats.iter().map(|shard| shard.counters.load_events_per_s).collect();
    let mean = loads.iter().sum::<f64>() / loads.len().max(1) as f64;
    if mean <= 0.0 {
        return (1.0, 1.0);
    }
    let max = loads.iter().copied().fold(0.0, f64::max);
    let hottest = stats.iter().map(|shard| shard.counters.hottest_partition_events_per_s).fold(0.0, f64::max);
    (max / mean, hottest.max(mean) / mean)
}

/// A metric's value as `/stats` prints it: whole numbers as integers
/// (counts), others as floats.
struct Number(f64);

impl serde::Serialize for Number {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Number(value) = *self;
        if value.fract() == 0.0 && value.abs() < 9e15 {
            serializer.serialize_i64(value as i64)
        } else {
            serializer.serialize_f64(value)
        }
    }
}

fn lines_rejected(counters: &Counters) -> u64 {
    counters.lines_rejected_key_empty
        + counters.lines_rejected_key_too_long
        + counters.lines_rejected_line_too_long
        + counters.lines_rejected_unterminated
        + counters.lines_rejected_unknown_stream
}

/// `/stats`' `totals`: every metric summed over shards (the largest value
/// for a [`Kind::Peak`]) under its field name, then the figures made of
/// several. Written straight to the output, as the rest of `/stats`: built
/// as a `serde_json::Value` first, it spent most of the admin thread's time
/// per request in map inserts and key compares (`perf`, 2026-12-07).
struct Totals<'a>(&'a [ShardStats]);

impl serde::Serialize for Totals<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let stats = self.0;
        let (imbalance_ratio, imbalance_bound_ratio) = imbalance(stats);
        let sum = |read: fn(&Counters) -> u64| -> u64 { stats.iter().map(|shard| read(&shard.counters)).sum() };
        let mut map = serializer.serialize_map(Some(FAMILIES.len() + 6))?;
        for family in FAMILIES {
            let values = stats.iter().map(|shard| (family.read)(&shard.counters));
            let total = if family.kind == Kind::Peak { values.fold(0.0, f64::max) } else { values.sum() };
            map.serialize_entry(family.field, &Number(total))?;
        }
        map.serialize_entry("events_total", &sum(|counters| counters.events_stored))?;
        map.serialize_entry("bytes_total", &sum(|counters| counters.bytes_stored))?;
        map.serialize_entry("lines_rejected", &sum(lines_rejected))?;
        map.serialize_entry("migrations_refused", &sum(|counters| counters.steal_refusals_sent))?;
        map.serialize_entry("imbalance_ratio", &imbalance_ratio)?;
        map.serialize_entry("imbalance_bound_ratio", &imbalance_bound_ratio)?;
        map.end()
    }
}

/// One shard in `/stats`: its metrics, and `events_total` / `bytes_total`
/// (the names the totals use for what it stored).
#[derive(serde::Serialize)]
struct ShardJson<'a> {
    #[serde(flatten)]
    stats: &'a ShardStats,
    events_total: u64,
    bytes_total: u64,
}

#[derive(serde::Serialize)]
struct StatsDocument<'a> {
    shards: Vec<ShardJson<'a>>,
    totals: Totals<'a>,
    config: serde_json::Value,
    process: serde_json::Value,
    storage: serde_json::Value,
    memory_bound: &'a crate::config::MemoryBound,
}

/// `/stats`: every shard's metrics and their totals.
pub fn stats_json(state: &AdminState, stats: &[ShardStats]) -> String {
    let (rss, rss_peak) = process_rss_bytes();
    let shards = stats
        .iter()
        .map(|shard| ShardJson {
            stats: shard,
            events_total: shard.counters.events_stored,
            bytes_total: shard.counters.bytes_stored,
        })
        .collect();
    let document = StatsDocument {
        shards,
        totals: Totals(stats),
        config: json!({
            "shards": state.controls.len(),
            "partitions": state.config.partitions,
            "rebalance": state.config.rebalance == crate::config::Rebalance::On,
        }),
        process: json!({
            "rss_bytes": rss,
            "rss_peak_bytes": rss_peak,
            "uptime_seconds": state.started.elapsed().as_secs_f64(),
        }),
        storage: storage_json(state, stats),
        memory_bound: &state.memory_bound,
    };
    serde_json::to_string_pretty(&document).expect("json serializes")
}

/// `/stats`' `storage` section: whether writes wait for disk space since
/// start-up (read-only), why, and where.
fn storage_json(state: &AdminState, stats: &[ShardStats]) -> serde_json::Value {
    let read_only_shards: Vec<u16> =
        stats.iter().filter(|shard| shard.read_only_reason.is_some()).map(|shard| shard.shard).collect();
    let catalog_unsaved = state.catalog_unsaved.reason();
    let reason = stats.iter().find_map(|shard| shard.read_only_reason.clone()).or_else(|| catalog_unsaved.clone());
    json!({
        "read_only": reason.is_some(),
        "read_only_reason": reason,
        "read_only_shards": read_only_shards,
        "catalog_unsaved": catalog_unsaved.is_some(),
        "failing_shards": stats.iter().filter(|shard| shard.counters.storage_failing > 0).count(),
    })
}

/// `/partitions`: the placement table with each partition's offsets.
pub fn partitions_json(partitions: &[PartitionInfo]) -> String {
    serde_json::to_string_pretty(&json!({ "partitions": partitions })).expect("json serializes")
}

/// The partition with global id `global` in `partitions` (sorted by id, as
/// `collect_partitions` returns them).
fn partition_info(partitions: &[PartitionInfo], global: u32) -> Option<&PartitionInfo> {
    partitions.binary_search_by_key(&global, |info| info.partition).ok().map(|at| &partitions[at])
}

/// One group's lag on one partition: events between its commit and the
/// partition's end, and those events' payload bytes estimated from the
/// partition's mean payload size. A partition never committed lags by
/// nothing yet (its members start at `earliest` or `latest`).
fn group_lag(committed: Option<u64>, partition: Option<&PartitionInfo>) -> (u64, u64) {
    let (Some(committed), Some(partition)) = (committed, partition) else { return (0, 0) };
    let events = partition.next_offset.saturating_sub(committed);
    let mean = partition.payload_bytes_total.checked_div(partition.events_total).unwrap_or(0);
    (events, events.saturating_mul(mean))
}

/// `GET /groups`: every group with its members, generation, assignment,
/// committed offsets and lag per partition.
pub fn groups_json(groups: &[GroupInfo], partitions: &[PartitionInfo]) -> String {
    let by_id = |global: u32| partition_info(partitions, global);
    let list: Vec<serde_json::Value> = groups
        .iter()
        .map(|group| {
            let per_partition: Vec<serde_json::Value> = (0u32..)
                .zip(&group.committed)
                .map(|(local, committed)| {
                    let (lag, lag_bytes) = group_lag(*committed, by_id(group.base + local));
                    let member = group.members.iter().position(|(_, held)| held.contains(&local));
                    let end = by_id(group.base + local).map(|info| info.next_offset);
                    json!({
                        "partition": local,
                        "committed": committed,
                        "end": end,
                        // An inconsistency, never a lag of 0: the log lost
                        // events the group had read (see spate_group_offsets_past_end_total).
                        "committed_past_end": committed.zip(end).is_some_and(|(committed, end)| committed > end),
                        "lag": lag,
                        "lag_bytes": lag_bytes,
                        "member": member.map(|index| group.members[index].0),
                    })
                })
                .collect();
            let members: Vec<serde_json::Value> =
                group.members.iter().map(|(member, held)| json!({"member": member, "partitions": held})).collect();
            json!({
                "stream": group.stream,
                "group": group.group,
                "hold": group.hold,
                "protocol": if group.kafka { "kafka" } else { "spate" },
                "generation": group.generation,
                "rebalances": group.rebalances,
                "members": members,
                "partitions": per_partition,
            })
        })
        .collect();
    serde_json::to_string_pretty(&json!({ "groups": list })).expect("groups serialize")
}

/// Per-group families for `/metrics`: members, rebalances, lag summed and
/// at most, per (stream, group).
pub fn group_metrics(out: &mut String, groups: &[GroupInfo], partitions: &[PartitionInfo]) {
    let by_id = |global: u32| partition_info(partitions, global);
    let families: [(&str, &str, &str); 5] = [
        ("spate_group_members_live", "gauge", "Live members of each consumer group."),
        ("spate_group_generation", "gauge", "Each consumer group's generation (rebalances so far)."),
        ("spate_group_lag_events", "gauge", "Each group's lag, summed over its stream's partitions, in events."),
        ("spate_group_lag_max_events", "gauge", "Each group's largest lag on one partition, in events."),
        ("spate_group_lag_bytes", "gauge", "Each group's lag in payload bytes (estimated), summed over partitions."),
    ];
    for (index, (name, kind, help)) in families.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for group in groups {
            let lags: Vec<(u64, u64)> = (0u32..)
                .zip(&group.committed)
                .map(|(local, committed)| group_lag(*committed, by_id(group.base + local)))
                .collect();
            let value = match index {
                0 => group.members.len() as u64,
                1 => group.generation,
                2 => lags.iter().map(|lag| lag.0).sum(),
                3 => lags.iter().map(|lag| lag.0).max().unwrap_or(0),
                _ => lags.iter().map(|lag| lag.1).sum(),
            };
            let _ = writeln!(out, "{name}{{stream=\"{}\",group=\"{}\"}} {value}", group.stream, group.group);
        }
    }
}
