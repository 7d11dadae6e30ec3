//! Per-shard counters: plain cells, owned by one thread, read by the control
//! plane through a [`ShardStats`] snapshot.

use std::cell::Cell;

/// Counters of one shard. Monotonic unless named as a gauge.
#[derive(Default)]
pub struct ShardMetrics {
    pub events_ingested: Cell<u64>,
    pub bytes_ingested: Cell<u64>,
    pub events_stored: Cell<u64>,
    pub bytes_stored: Cell<u64>,
    pub connections_accepted: Cell<u64>,
    pub connections_refused: Cell<u64>,
    /// Gauge.
    pub connections_open: Cell<u64>,
    pub lines_rejected_key_empty: Cell<u64>,
    pub lines_rejected_key_too_long: Cell<u64>,
    pub lines_rejected_line_too_long: Cell<u64>,
    pub lines_rejected_unterminated: Cell<u64>,
    pub control_lines: Cell<u64>,
    pub batches_sent: Cell<u64>,
    pub batches_applied: Cell<u64>,
    pub credit_stalls: Cell<u64>,
    pub credit_stall_ns: Cell<u64>,
    pub mesh_overflow_frames: Cell<u64>,
    /// Gauge: bytes held by ingest connections' read buffers.
    pub read_buffer_bytes: Cell<u64>,
    /// Gauge.
    pub subscribers_open: Cell<u64>,
    pub subscribers_refused: Cell<u64>,
    pub events_delivered: Cell<u64>,
    pub bytes_delivered: Cell<u64>,
    pub truncation_notices: Cell<u64>,
    pub events_misrouted: Cell<u64>,
}

impl ShardMetrics {
    #[inline]
    pub fn add(cell: &Cell<u64>, value: u64) {
        cell.set(cell.get() + value);
    }
}

/// A snapshot of one shard, sent to the control plane.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ShardStats {
    pub shard: u16,
    pub events_ingested: u64,
    pub bytes_ingested: u64,
    pub events_stored: u64,
    pub bytes_stored: u64,
    pub partitions_owned: u32,
    pub log_bytes: u64,
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_open: u64,
    pub lines_rejected_key_empty: u64,
    pub lines_rejected_key_too_long: u64,
    pub lines_rejected_line_too_long: u64,
    pub lines_rejected_unterminated: u64,
    pub control_lines: u64,
    pub batches_sent: u64,
    pub batches_applied: u64,
    pub credit_stalls: u64,
    pub credit_stall_seconds: f64,
    pub credits_outstanding_bytes: u64,
    pub batch_buffered_bytes: u64,
    pub apply_queue_bytes: u64,
    pub mesh_overflow_frames: u64,
    pub mesh_queued_frames: u64,
    pub read_buffer_bytes: u64,
    pub subscribers_open: u64,
    pub subscribers_refused: u64,
    pub events_delivered: u64,
    pub bytes_delivered: u64,
    pub truncation_notices: u64,
    pub events_misrouted: u64,
    /// Stored events/s over the balancer's half-life (the balancer's load).
    pub load_events_per_s: f64,
    pub load_bytes_per_s: f64,
    pub hottest_partition_events_per_s: f64,
    pub steal_requests_sent: u64,
    pub steal_refusals_sent: u64,
    pub steal_refusals_received: u64,
    pub migrations_started: u64,
    pub migrations_completed: u64,
    /// Events buffered at this shard for partitions migrating here.
    pub migration_pending_bytes: u64,
}

impl ShardMetrics {
    /// Copies the counters; the caller fills in the fields owned elsewhere.
    pub fn snapshot(&self, shard: u16) -> ShardStats {
        ShardStats {
            shard,
            events_ingested: self.events_ingested.get(),
            bytes_ingested: self.bytes_ingested.get(),
            events_stored: self.events_stored.get(),
            bytes_stored: self.bytes_stored.get(),
            connections_accepted: self.connections_accepted.get(),
            connections_refused: self.connections_refused.get(),
            connections_open: self.connections_open.get(),
            lines_rejected_key_empty: self.lines_rejected_key_empty.get(),
            lines_rejected_key_too_long: self.lines_rejected_key_too_long.get(),
            lines_rejected_line_too_long: self.lines_rejected_line_too_long.get(),
            lines_rejected_unterminated: self.lines_rejected_unterminated.get(),
            control_lines: self.control_lines.get(),
            batches_sent: self.batches_sent.get(),
            batches_applied: self.batches_applied.get(),
            credit_stalls: self.credit_stalls.get(),
            credit_stall_seconds: self.credit_stall_ns.get() as f64 / 1e9,
            mesh_overflow_frames: self.mesh_overflow_frames.get(),
            read_buffer_bytes: self.read_buffer_bytes.get(),
            subscribers_open: self.subscribers_open.get(),
            subscribers_refused: self.subscribers_refused.get(),
            events_delivered: self.events_delivered.get(),
            bytes_delivered: self.bytes_delivered.get(),
            truncation_notices: self.truncation_notices.get(),
            events_misrouted: self.events_misrouted.get(),
            ..ShardStats::default()
        }
    }
}
