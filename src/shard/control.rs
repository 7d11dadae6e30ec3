//! The control plane, as a shard sees it.
//!
//! Non-shard threads (admin HTTP, the signal handler, `main`) talk to shards
//! only over flume: a [`ControlRequest`] in, a reply on the channel it
//! carries; shards report life-cycle [`ShardEvent`]s back to `main`.
//!
//! Shutdown is two-phase so that no event in flight is lost: on `Shutdown`
//! every shard stops accepting, lets its connections finish what they have
//! read, flushes and waits until all its events are applied (the owners keep
//! applying meanwhile), then reports `Drained`. Only when every shard has
//! drained does `main` send `Exit`.

use std::rc::Rc;

use crate::shard::Shard;
use crate::shard::metrics::{ShardMetrics, ShardStats};

/// Requests from the control plane to one shard.
pub enum ControlRequest {
    Stats(flume::Sender<ShardStats>),
    Partitions(flume::Sender<Vec<PartitionInfo>>),
    Shutdown,
    Exit,
}

/// Why a shard could not start.
#[derive(Debug)]
pub enum ShardFailure {
    /// The channel mesh between shards could not be joined.
    MeshJoin,
    /// A listener could not be bound.
    Bind { name: &'static str, address: std::net::SocketAddr, error: String },
    /// The partitions' files could not be opened or recovered.
    Storage { error: String },
}

impl std::fmt::Display for ShardFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardFailure::MeshJoin => write!(f, "could not join the channel mesh between shards"),
            ShardFailure::Bind { name, address, error } => write!(f, "bind {name} {address}: {error}"),
            ShardFailure::Storage { error } => write!(f, "storage: {error}"),
        }
    }
}

/// What a shard reports to `main`.
#[derive(Debug)]
pub enum ShardEvent {
    Started,
    Failed { shard: Option<u16>, failure: ShardFailure },
    Drained,
}

/// One partition as its owner sees it (for `/partitions`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PartitionInfo {
    pub partition: u32,
    pub owner: u16,
    pub epoch: u32,
    pub next_offset: u64,
    pub earliest_offset: u64,
    pub log_bytes: u64,
    /// Bytes of its segment files (0 in memory).
    pub disk_bytes: u64,
    /// The offset readers see up to (written or durable on disk).
    pub visible_offset: u64,
    pub events_total: u64,
}

/// Answers control requests until `Exit`; drains on `Shutdown`.
pub async fn serve_control(
    shard: &Rc<Shard>,
    control: &flume::Receiver<ControlRequest>,
    events: &flume::Sender<ShardEvent>,
) {
    while let Ok(request) = control.recv_async().await {
        match request {
            ControlRequest::Stats(reply) => {
                let _ = reply.send(stats(shard));
            }
            ControlRequest::Partitions(reply) => {
                let _ = reply.send(partition_infos(shard));
            }
            ControlRequest::Shutdown => {
                let shard = shard.clone();
                let events = events.clone();
                glommio::spawn_local(async move {
                    shard.lifecycle.request_shutdown();
                    shard.lifecycle.connections_closed().await;
                    shard.source.sync_barrier(0..shard.shard_count).await;
                    let _ = events.send(ShardEvent::Drained);
                })
                .detach();
            }
            ControlRequest::Exit => return,
        }
    }
}

/// Sets the computed gauges into their cells, then snapshots every metric.
pub fn stats(shard: &Shard) -> ShardStats {
    let metrics: &ShardMetrics = &shard.metrics;
    {
        let partitions = shard.partitions.borrow();
        metrics.partitions_owned.set(u64::from(partitions.owned_count()));
        metrics.log_bytes.set(partitions.iter().map(|(_, partition)| partition.log.cost_bytes() as u64).sum());
        metrics.disk_bytes.set(partitions.iter().map(|(_, partition)| partition.log.disk_bytes()).sum());
        let segments =
            partitions.iter().filter_map(|(_, partition)| partition.log.disk()).map(|disk| disk.segment_count());
        metrics.disk_segments.set(segments.sum::<usize>() as u64);
    }
    {
        let router = shard.source.router();
        metrics.credits_outstanding_bytes.set(router.credits_outstanding_bytes() as u64);
        metrics.batch_buffered_bytes.set(router.batch_buffered_bytes() as u64);
    }
    metrics.connections_open.set(shard.lifecycle.connections_open());
    metrics.apply_queue_bytes.set(shard.apply_queue.bytes() as u64);
    metrics.storage_failing.set(u64::from(shard.committer.as_ref().is_some_and(|committer| committer.is_failing())));
    metrics.mesh_queued_frames.set(shard.outbox.queued_frames() as u64);
    let pending_bytes: usize = shard.migrations.borrow().pending().map(|pending| pending.size_bytes()).sum();
    metrics.migration_pending_bytes.set(pending_bytes as u64);
    let balancer = shard.balancer.borrow();
    metrics.load_events_per_s.set(balancer.events_per_s);
    metrics.load_bytes_per_s.set(balancer.bytes_per_s);
    metrics.hottest_partition_events_per_s.set(balancer.hottest_events_per_s());
    metrics.busy_ratio.set(balancer.busy_ratio);
    let counters = balancer.counters;
    metrics.steal_requests_sent.set(counters.steal_requests_sent);
    metrics.steal_refusals_sent.set(counters.steal_refusals_sent);
    metrics.steal_refusals_received.set(counters.steal_refusals_received);
    metrics.migrations_started.set(counters.migrations_started);
    metrics.migrations_completed.set(counters.migrations_completed);
    ShardStats { shard: shard.id, counters: metrics.snapshot() }
}

fn partition_infos(shard: &Shard) -> Vec<PartitionInfo> {
    let placement = shard.placement.borrow();
    shard
        .partitions
        .borrow()
        .iter()
        .map(|(partition, value)| PartitionInfo {
            partition,
            owner: shard.id,
            epoch: placement.get(partition).epoch,
            next_offset: value.log.next_offset(),
            earliest_offset: value.log.earliest_offset(),
            log_bytes: value.log.cost_bytes() as u64,
            disk_bytes: value.log.disk_bytes(),
            visible_offset: value.log.visible_offset(),
            events_total: value.events_total,
        })
        .collect()
}
