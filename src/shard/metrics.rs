//! Per-shard metrics, each declared once.
//!
//! [`shard_metrics!`] below is the only list: every entry names a field, its
//! kind, its Prometheus family (and label, for families split by reason) and
//! its help text. From it come the shard's live cells ([`ShardMetrics`],
//! plain `Cell`s owned by one thread), the snapshot the control plane reads
//! ([`Counters`], which is also the per-shard `/stats` JSON) and the
//! Prometheus families ([`FAMILIES`]). Gauges that are computed from other
//! state (partitions owned, bytes buffered) are set into their cells right
//! before a snapshot ([`crate::shard::control`]).

use std::cell::Cell;

/// How a metric behaves, for Prometheus and for `/stats` totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows; the total is the sum over shards.
    Counter,
    /// Goes up and down; the total is the sum over shards.
    Gauge,
    /// A gauge whose total is the largest shard's value (a maximum, not a
    /// quantity: e.g. the hottest partition's rate).
    Peak,
}

/// One Prometheus sample family entry of a per-shard metric.
pub struct Family {
    pub name: &'static str,
    /// `reason="..."`-style label, for families split by reason.
    pub label: Option<(&'static str, &'static str)>,
    pub help: &'static str,
    pub kind: Kind,
    pub field: &'static str,
    pub read: fn(&Counters) -> f64,
}

/// A value a metric cell holds.
pub trait MetricValue: Copy + Default {
    fn to_f64(self) -> f64;
}

impl MetricValue for u64 {
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl MetricValue for f64 {
    fn to_f64(self) -> f64 {
        self
    }
}

macro_rules! shard_metrics {
    ($( $kind:ident $field:ident : $type:ty => $name:literal $([$label:literal = $value:literal])? , $help:literal ;)*) => {
        /// The live metrics of one shard.
        #[derive(Default)]
        pub struct ShardMetrics {
            $( #[doc = $help] pub $field: Cell<$type>, )*
        }

        /// A snapshot of one shard's metrics (the per-shard `/stats` JSON).
        #[derive(Debug, Clone, Default, serde::Serialize)]
        pub struct Counters {
            $( #[doc = $help] pub $field: $type, )*
        }

        impl ShardMetrics {
            pub fn snapshot(&self) -> Counters {
                Counters { $( $field: self.$field.get(), )* }
            }
        }

        /// Every per-shard metric, in declaration order.
        pub const FAMILIES: &[Family] = &[
            $( Family {
                name: $name,
                label: shard_metrics!(@label $($label = $value)?),
                help: $help,
                kind: Kind::$kind,
                field: stringify!($field),
                read: |counters| MetricValue::to_f64(counters.$field),
            }, )*
        ];
    };
    (@label) => { None };
    (@label $label:literal = $value:literal) => { Some(($label, $value)) };
}

shard_metrics! {
    Counter events_ingested: u64 => "spate_events_ingested_total", "Events parsed from this shard's ingest connections.";
    Counter bytes_ingested: u64 => "spate_ingest_bytes_total", "Line bytes (with LF) of events parsed on this shard.";
    Counter events_stored: u64 => "spate_events_stored_total", "Events appended to partition logs this shard owns.";
    Counter bytes_stored: u64 => "spate_stored_bytes_total", "Log record bytes appended to partition logs this shard owns.";
    Gauge partitions_owned: u64 => "spate_partitions_owned", "Partitions this shard owns.";
    Gauge log_bytes: u64 => "spate_log_bytes", "Memory held by this shard's partition logs.";
    Counter connections_accepted: u64 => "spate_connections_accepted_total", "Ingest connections accepted.";
    Counter connections_handed_over: u64 => "spate_connections_handed_over_total", "Ingest and subscribe connections this shard handed over to the shard that owns the partitions while the process is gathered (subscribe connections before their first line).";
    Counter connections_adopted: u64 => "spate_connections_adopted_total", "Ingest and subscribe connections other shards handed over to this one.";
    Counter connections_refused: u64 => "spate_connections_refused_total", "Ingest connections refused at the connection limit.";
    Gauge connections_open: u64 => "spate_connections_open", "Ingest connections open.";
    Counter accept_errors_fd_exhausted: u64 => "spate_accept_errors_total" ["reason" = "fd_exhausted"], "Accepts that failed, by reason: fd_exhausted (no file descriptor or socket memory: the shard backs off and sheds) or other.";
    Counter accept_errors_other: u64 => "spate_accept_errors_total" ["reason" = "other"], "Accepts that failed, by reason: fd_exhausted (no file descriptor or socket memory: the shard backs off and sheds) or other.";
    Counter connections_shed: u64 => "spate_connections_shed_total", "Idle or pre-SUB connections closed to free a file descriptor.";
    Counter connections_timed_out_idle: u64 => "spate_connections_timed_out_total" ["reason" = "idle"], "Connections closed by a timeout: idle (an ingest connection sent no line within --idle-timeout-ms), request (a subscribe connection sent no SUB or GROUP line within --subscribe-request-timeout-ms) or line (a line incomplete for --line-timeout-ms).";
    Counter connections_timed_out_request: u64 => "spate_connections_timed_out_total" ["reason" = "request"], "Connections closed by a timeout: idle (an ingest connection sent no line within --idle-timeout-ms), request (a subscribe connection sent no SUB or GROUP line within --subscribe-request-timeout-ms) or line (a line incomplete for --line-timeout-ms).";
    Counter connections_timed_out_line: u64 => "spate_connections_timed_out_total" ["reason" = "line"], "Connections closed by a timeout: idle (an ingest connection sent no line within --idle-timeout-ms), request (a subscribe connection sent no SUB or GROUP line within --subscribe-request-timeout-ms) or line (a line incomplete for --line-timeout-ms).";
    Counter connections_cut_at_deadline: u64 => "spate_connections_cut_at_shutdown_total", "Connections still open at the shutdown deadline, cut.";
    Counter lines_rejected_key_empty: u64 => "spate_lines_rejected_total" ["reason" = "key_empty"], "Ingest lines rejected, by reason.";
    Counter lines_rejected_key_too_long: u64 => "spate_lines_rejected_total" ["reason" = "key_too_long"], "Ingest lines rejected, by reason.";
    Counter lines_rejected_line_too_long: u64 => "spate_lines_rejected_total" ["reason" = "line_too_long"], "Ingest lines rejected, by reason.";
    Counter lines_rejected_unterminated: u64 => "spate_lines_rejected_total" ["reason" = "unterminated_line"], "Ingest lines rejected, by reason.";
    Counter lines_rejected_unknown_stream: u64 => "spate_lines_rejected_total" ["reason" = "unknown_stream"], "Ingest lines rejected, by reason.";
    Counter lines_rejected_invalid_json: u64 => "spate_lines_rejected_total" ["reason" = "invalid_json"], "Ingest lines rejected, by reason.";
    Counter lines_rejected_json_key: u64 => "spate_lines_rejected_total" ["reason" = "json_key"], "Ingest lines rejected, by reason.";
    Counter lines_rejected_invalid_ilp: u64 => "spate_lines_rejected_total" ["reason" = "invalid_ilp"], "Ingest lines rejected, by reason.";
    Counter kafka_requests: u64 => "spate_kafka_requests_total", "Kafka requests answered (or taken, for Produce with acks=0).";
    Counter kafka_records_produced: u64 => "spate_kafka_records_produced_total", "Records taken from Kafka Produce requests (also counted in spate_events_ingested_total).";
    Counter kafka_duplicate_batches: u64 => "spate_kafka_duplicate_batches_total", "Batches of idempotent Kafka producers recognised as retries of batches already stored, and not stored again.";
    Counter kafka_errors_frame_too_large: u64 => "spate_kafka_errors_total" ["reason" = "frame_too_large"], "Kafka requests refused, by reason: frame_too_large (size over --kafka-request-size-max: the connection closes), malformed (a request that does not decode: the connection closes), unsupported (an API key or version spate does not serve), corrupt_batch (a Produce batch with a bad CRC or framing), partition (a Produce to an unknown topic or partition, or refused records).";
    Counter kafka_errors_malformed: u64 => "spate_kafka_errors_total" ["reason" = "malformed"], "Kafka requests refused, by reason: frame_too_large (size over --kafka-request-size-max: the connection closes), malformed (a request that does not decode: the connection closes), unsupported (an API key or version spate does not serve), corrupt_batch (a Produce batch with a bad CRC or framing), partition (a Produce to an unknown topic or partition, or refused records).";
    Counter kafka_errors_unsupported: u64 => "spate_kafka_errors_total" ["reason" = "unsupported"], "Kafka requests refused, by reason: frame_too_large (size over --kafka-request-size-max: the connection closes), malformed (a request that does not decode: the connection closes), unsupported (an API key or version spate does not serve), corrupt_batch (a Produce batch with a bad CRC or framing), partition (a Produce to an unknown topic or partition, or refused records).";
    Counter kafka_errors_corrupt_batch: u64 => "spate_kafka_errors_total" ["reason" = "corrupt_batch"], "Kafka requests refused, by reason: frame_too_large (size over --kafka-request-size-max: the connection closes), malformed (a request that does not decode: the connection closes), unsupported (an API key or version spate does not serve), corrupt_batch (a Produce batch with a bad CRC or framing), partition (a Produce to an unknown topic or partition, or refused records).";
    Counter kafka_errors_partition: u64 => "spate_kafka_errors_total" ["reason" = "partition"], "Kafka requests refused, by reason: frame_too_large (size over --kafka-request-size-max: the connection closes), malformed (a request that does not decode: the connection closes), unsupported (an API key or version spate does not serve), corrupt_batch (a Produce batch with a bad CRC or framing), partition (a Produce to an unknown topic or partition, or refused records).";
    Counter replies_dropped: u64 => "spate_replies_dropped_total", "Reply lines dropped on ILP connections whose client does not read them.";
    Counter control_lines: u64 => "spate_control_lines_total", "Control lines (#...) received.";
    Counter control_tokens_too_long: u64 => "spate_control_tokens_too_long_total", "#SYNC/#PING lines refused because their token is over the limit.";
    Counter control_lines_unknown: u64 => "spate_control_lines_unknown_total", "Control lines with an unknown command (answered with ERR; not events, so not counted as rejected lines).";
    Counter batches_sent: u64 => "spate_batches_sent_total", "Batches this shard sent to owners (itself included).";
    Counter events_discarded_deleted_stream: u64 => "spate_events_discarded_deleted_stream_total", "Events that reached their owner after their stream was deleted (dropped with it).";
    Counter aggregate_windows_emitted: u64 => "spate_aggregate_windows_emitted_total", "Closed aggregate windows routed to their output stream.";
    Counter aggregate_windows_dropped: u64 => "spate_aggregate_windows_dropped_total", "Closed aggregate windows dropped because their output stream does not exist.";
    Counter aggregate_late_events_dropped: u64 => "spate_aggregate_late_events_total", "Events whose every window had closed (beyond the allowed lateness), skipped by an aggregate; summed over the partitions this shard owns.";
    Counter aggregate_values_malformed: u64 => "spate_aggregate_values_malformed_total", "Events whose value or event time was missing or not a number for an aggregate (the event is stored; the aggregate skips it).";
    Counter aggregate_keys_refused: u64 => "spate_aggregate_keys_refused_total", "Events of a new key skipped by an aggregate at --aggregate-keys-max.";
    Counter aggregate_windows_closed: u64 => "spate_aggregate_windows_closed_total", "Windows closed by the aggregates of the partitions this shard owns.";
    Gauge aggregate_keys: u64 => "spate_aggregate_keys", "Keys held by the aggregates of the partitions this shard owns.";
    Gauge aggregate_memory_bytes: u64 => "spate_aggregate_memory_bytes", "Estimated heap bytes of the aggregate state of the partitions this shard owns.";
    Gauge aggregate_emit_queue_bytes: u64 => "spate_aggregate_emit_queue_bytes", "Closed windows waiting to be routed to their output stream.";
    Counter aggregate_emit_waits: u64 => "spate_aggregate_emit_waits_total", "Times the applier paused because the emit queue was over its limit.";
    Counter aggregate_checkpoints_written: u64 => "spate_aggregate_checkpoints_written_total", "Aggregate checkpoints written next to partition logs.";
    Counter aggregate_checkpoint_errors: u64 => "spate_aggregate_checkpoint_errors_total", "Aggregate checkpoints that failed to write (the previous one stays).";
    Counter batches_applied: u64 => "spate_batches_applied_total", "Batches this shard applied as owner.";
    Counter replication_refusals: u64 => "spate_replication_refusals_total", "Proposals of replicated records refused and made again (no leader yet, a leadership transfer, out of order, timed out).";
    Gauge replication_inflight_batches: u64 => "spate_replication_inflight_batches", "Batches with replicated records proposed and not yet applied (they wait for their commits).";
    Counter credit_stalls: u64 => "spate_credit_stalls_total", "Times a connection stopped reading for lack of credits.";
    Counter credit_stall_seconds: f64 => "spate_credit_stall_seconds_total", "Time connections spent stalled on credits.";
    Gauge credits_outstanding_bytes: u64 => "spate_credits_outstanding_bytes", "Credit bytes spent by this shard and not yet returned.";
    Gauge batch_buffered_bytes: u64 => "spate_batch_buffered_bytes", "Bytes in open, unsent batches.";
    Gauge apply_queue_bytes: u64 => "spate_apply_queue_bytes", "Bytes in the local apply queue.";
    Gauge segment_pool_bytes: u64 => "spate_segment_pool_bytes", "Log segments this shard keeps ready for growing logs (--log-prefault-bytes).";
    Gauge grants_held_batches: u64 => "spate_grants_held_batches", "Applied batches whose credit grants this shard holds, to send several to their source in one frame.";
    Counter mesh_overflow_frames: u64 => "spate_mesh_overflow_frames_total", "Frames queued behind a full mesh ring.";
    Counter mesh_frames_data: u64 => "spate_mesh_frames_sent_total" ["kind" = "data"], "Frames this shard sent to other shards, by kind: data (event batches), credit (grants), fetch (subscriber requests, window credits and wake-ups), fetch_reply (events for a subscriber) or other (gossip, migration, groups). A frame to a parked shard wakes it.";
    Counter mesh_frames_credit: u64 => "spate_mesh_frames_sent_total" ["kind" = "credit"], "Frames this shard sent to other shards, by kind: data (event batches), credit (grants), fetch (subscriber requests, window credits and wake-ups), fetch_reply (events for a subscriber) or other (gossip, migration, groups). A frame to a parked shard wakes it.";
    Counter mesh_frames_fetch: u64 => "spate_mesh_frames_sent_total" ["kind" = "fetch"], "Frames this shard sent to other shards, by kind: data (event batches), credit (grants), fetch (subscriber requests, window credits and wake-ups), fetch_reply (events for a subscriber) or other (gossip, migration, groups). A frame to a parked shard wakes it.";
    Counter mesh_frames_fetch_reply: u64 => "spate_mesh_frames_sent_total" ["kind" = "fetch_reply"], "Frames this shard sent to other shards, by kind: data (event batches), credit (grants), fetch (subscriber requests, window credits and wake-ups), fetch_reply (events for a subscriber) or other (gossip, migration, groups). A frame to a parked shard wakes it.";
    Counter mesh_frames_other: u64 => "spate_mesh_frames_sent_total" ["kind" = "other"], "Frames this shard sent to other shards, by kind: data (event batches), credit (grants), fetch (subscriber requests, window credits and wake-ups), fetch_reply (events for a subscriber) or other (gossip, migration, groups). A frame to a parked shard wakes it.";
    Gauge mesh_queued_frames: u64 => "spate_mesh_queued_frames", "Frames waiting behind a full mesh ring now.";
    Gauge read_buffer_bytes: u64 => "spate_read_buffer_bytes", "Bytes held by ingest connections' read buffers.";
    Gauge subscribers_open: u64 => "spate_subscribers_open", "Subscriptions open (SUB accepted).";
    Gauge subscriber_connections_open: u64 => "spate_subscriber_connections_open", "Connections on the subscribe port, from accept (pre-SUB included): what the subscriber limit counts, plus those shed at the limit that are still closing.";
    Counter group_offsets_past_end: u64 => "spate_group_offsets_past_end_total", "Group partitions whose committed offset was past the partition's end (the log lost events the group had read); reading resumed at the end.";
    Counter subscribe_offsets_out_of_range: u64 => "spate_subscribe_offsets_out_of_range_total", "SUB requests refused because the offset is past a partition's end.";
    Counter closing_notices: u64 => "spate_closing_notices_total", "CLOSING notices written to subscribers at shutdown.";
    Counter subscribers_refused: u64 => "spate_subscribers_refused_total", "Subscribers refused at the limit.";
    Counter subscribers_shed: u64 => "spate_subscribers_shed_total", "Subscribe connections that had not sent their SUB or GROUP line, shed at the limit so a newcomer could take their slot (counted by the newcomer's shard).";
    Counter events_delivered: u64 => "spate_events_delivered_total", "Event lines written to subscribers.";
    Counter bytes_delivered: u64 => "spate_delivered_bytes_total", "Bytes written to subscribers.";
    Counter truncation_notices: u64 => "spate_truncation_notices_total", "TRUNCATED notices sent to subscribers behind retention.";
    Gauge load_events_per_s: f64 => "spate_load_events_per_second", "Stored events/s, averaged over the balancer half-life (the balancer's load).";
    Gauge load_bytes_per_s: f64 => "spate_load_bytes_per_second", "Stored payload bytes/s, averaged over the balancer half-life.";
    Peak hottest_partition_events_per_s: f64 => "spate_hottest_partition_events_per_second", "Rate of this shard's hottest partition.";
    Gauge busy_ratio: f64 => "spate_busy_ratio", "Share of the last gossip interval this shard's executor spent running tasks.";
    Counter steal_requests_sent: u64 => "spate_steal_requests_sent_total", "Steal requests this shard sent as a thief.";
    Counter steal_refusals_sent: u64 => "spate_migrations_refused_total", "Steal requests this shard refused as an owner.";
    Counter steal_refusals_received: u64 => "spate_steal_refusals_received_total", "Refusals this shard received as a thief.";
    Counter migrations_started: u64 => "spate_migrations_started_total", "Migrations this shard started as the owner.";
    Counter migrations_completed: u64 => "spate_migrations_completed_total", "Migrations completed into this shard.";
    Gauge consolidation_kept_shards: u64 => "spate_consolidation_kept_shards", "Shards that own partitions by this shard's consolidation decision: fewer than the shard count while the process is gathered at low load, the shard count while spread.";
    Counter consolidation_moves: u64 => "spate_consolidation_moves_total", "Partitions this shard handed over to gather the process onto fewer shards, or to send them home after it spread.";
    Counter consolidation_batches: u64 => "spate_consolidation_batches_total", "Batches those partitions moved in: one placement switch, marker round and handoff round for up to 256 partitions to one shard.";
    Gauge migration_pending_bytes: u64 => "spate_migration_pending_bytes", "Events buffered for partitions migrating to this shard.";
    Gauge disk_bytes: u64 => "spate_disk_bytes", "Bytes of segment files of the partitions this shard owns.";
    Gauge disk_segments: u64 => "spate_disk_segments", "Segment files of the partitions this shard owns.";
    Counter commit_rounds: u64 => "spate_commit_rounds_total", "Group commits (write rounds) to the partitions' files.";
    Counter commit_seconds: f64 => "spate_commit_seconds_total", "Time spent in group commits (write and fdatasync).";
    Counter commit_sync_seconds: f64 => "spate_commit_sync_seconds_total", "The part of spate_commit_seconds_total spent making written records durable: the fdatasync of the log or the segments, or a filesystem sync with the flushes and the checkpoint it takes.";
    Counter fsync_rounds: u64 => "spate_fsync_rounds_total", "Group commits that ended with an fdatasync of every written partition.";
    Counter wal_written_bytes: u64 => "spate_wal_written_bytes_total", "Bytes written to this shard's write-ahead log (whole blocks, rewritten partial blocks included).";
    Counter wal_allocated_bytes: u64 => "spate_wal_allocated_bytes_total", "Zero bytes written ahead of this shard's write-ahead log during its first lap, so rounds write into allocated blocks.";
    Counter wal_checkpoints: u64 => "spate_wal_checkpoints_total", "Write-ahead log checkpoints: segment files synced in bulk, the log behind them freed.";
    Counter wal_direct_syncs: u64 => "spate_wal_direct_syncs_total", "Rounds that found the write-ahead log full and synced the segment files directly (checkpoints did not keep up).";
    Counter wal_bypassed_rounds: u64 => "spate_wal_bypassed_rounds_total", "Rounds that wrote their frames to the segment files instead of the write-ahead log (under --fsync interval each partition took a block or more; a round that must sync, every round under always, 4 MiB or more): under interval their bytes reach the log only if a #SYNC asks before the next filesystem sync.";
    Counter wal_unlogged_rounds: u64 => "spate_wal_unlogged_rounds_total", "Rounds that bypassed the write-ahead log without copying their frames into its memory (decided before encoding; a sync then goes through the filesystem until one has).";
    Counter wal_filesystem_syncs: u64 => "spate_wal_filesystem_syncs_total", "Filesystem syncs (syncfs) that made every written segment durable at once and freed the write-ahead log behind them, in place of writing the log (--fsync interval or always).";
    Counter wal_replayed_frames: u64 => "spate_wal_replayed_frames_total", "Frames appended to segments from the write-ahead logs at start-up.";
    Counter storage_written_bytes: u64 => "spate_storage_written_bytes_total", "Bytes written to segment files (whole blocks).";
    Counter storage_read_bytes: u64 => "spate_storage_read_bytes_total", "Bytes read from segment files for subscribers behind the tail cache.";
    Counter storage_errors: u64 => "spate_storage_errors_total", "Failed group commits (disk full or I/O error; retried, nothing released meanwhile).";
    Gauge storage_failing: u64 => "spate_storage_failing", "1 while a storage error is being retried (ingest into this shard's partitions paused).";
    Gauge storage_read_only: u64 => "spate_storage_read_only", "1 while this shard is read-only: writes its partitions' open deferred because the disk was full wait for space (ingest paused, subscribers served).";
    Counter storage_read_errors: u64 => "spate_storage_read_errors_total", "Failed reads of segment files for subscribers.";
    Counter segments_rolled: u64 => "spate_segments_rolled_total", "Segments sealed because they were full.";
    Counter segment_files_deleted: u64 => "spate_segment_files_deleted_total", "Segment and index files deleted by retention.";
    Counter recovery_truncations: u64 => "spate_recovery_truncations_total", "Partitions whose last segment had a torn or corrupt tail cut at start.";
    Counter recovery_discarded_bytes: u64 => "spate_recovery_discarded_bytes_total", "Bytes cut from the end of last segments at start (torn or corrupt tails).";
    Gauge group_members: u64 => "spate_group_members", "Consumer-group members whose connection this shard holds.";
    Counter group_joins: u64 => "spate_group_joins_total", "Members that joined a consumer group coordinated by this shard.";
    Counter group_rebalances: u64 => "spate_group_rebalances_total", "Rebalances (new generations) of groups coordinated by this shard.";
    Counter group_commits: u64 => "spate_group_commits_total", "Commits acknowledged (durable) by this shard as a coordinator.";
    Counter group_commits_refused: u64 => "spate_group_commits_refused_total", "Commits refused (partition not held, or past what was delivered).";
    Counter group_members_expelled: u64 => "spate_group_members_expelled_total", "Members cut for a session or revoke timeout.";
    Counter group_offset_write_errors: u64 => "spate_group_offset_write_errors_total", "Failed writes of committed offsets (retried; commits wait).";
    Gauge group_held_partitions: u64 => "spate_group_held_partitions", "Partitions this shard owns that a lagging hold group holds now.";
    Counter group_holds: u64 => "spate_group_holds_total", "Times this shard, as owner, held a partition for a lagging hold group.";
    Counter group_hold_stalls: u64 => "spate_group_hold_stalls_total", "Times a connection stopped reading because its next event's partition is held.";
    Counter group_hold_stall_seconds: f64 => "spate_group_hold_stall_seconds_total", "Time connections spent stalled on held partitions.";
}

impl ShardMetrics {
    #[inline]
    pub fn add<T: MetricValue + std::ops::Add<Output = T>>(cell: &Cell<T>, value: T) {
        cell.set(cell.get() + value);
    }
}

/// One shard's snapshot as the control plane gets it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardStats {
    pub shard: u16,
    #[serde(flatten)]
    pub counters: Counters,
    /// Why the shard is read-only (the disk was full when its partitions
    /// were opened), while it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family has a Prometheus-legal name, counters end in `_total`,
    /// and a name split by label is declared as one family kind and help.
    #[test]
    fn families_are_well_formed() {
        for family in FAMILIES {
            assert!(family.name.starts_with("spate_"), "{}", family.name);
            assert!(family.name.bytes().all(|byte| byte.is_ascii_lowercase() || byte == b'_'));
            assert_eq!(family.kind == Kind::Counter, family.name.ends_with("_total"), "{}", family.name);
            for other in FAMILIES.iter().filter(|other| other.name == family.name) {
                assert_eq!((other.kind, other.help), (family.kind, family.help), "{}", family.name);
                assert!(other.label.is_some() || std::ptr::eq(other, family), "{} declared twice", family.name);
            }
        }
    }

    /// A snapshot reads what the cells hold, and FAMILIES read the snapshot.
    #[test]
    fn snapshot_and_families_agree() {
        let metrics = ShardMetrics::default();
        ShardMetrics::add(&metrics.events_stored, 5);
        ShardMetrics::add(&metrics.credit_stall_seconds, 0.5);
        let counters = metrics.snapshot();
        let read = |field: &str| (FAMILIES.iter().find(|family| family.field == field).unwrap().read)(&counters);
        assert_eq!(read("events_stored"), 5.0);
        assert_eq!(read("credit_stall_seconds"), 0.5);
        let json = serde_json::to_value(ShardStats { shard: 3, counters, read_only_reason: None }).unwrap();
        assert_eq!(json["shard"], 3);
        assert_eq!(json["events_stored"], 5);
    }
}
