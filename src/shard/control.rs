//! The control plane, as a shard sees it.
//!
//! Non-shard threads (admin HTTP, the signal handler, `main`) talk to shards
//! only over flume: a [`ControlRequest`] in, a reply on the channel it
//! carries; shards report life-cycle [`ShardEvent`]s back to `main`.
//!
//! Shutdown is two-phase so that no event in flight is lost: on `Shutdown`
//! every shard stops accepting, lets its connections finish what they have
//! read (and its subscribers write what is ready and their `CLOSING`
//! notice), flushes and waits until all its events are applied (the owners
//! keep applying meanwhile), then reports `Drained`. Only when every shard
//! has drained does `main` send `Exit`. Both waits are bounded: connections
//! still open at the deadline are cut (the connection sweeper does it), and
//! the events they had read get [`SHUTDOWN_DRAIN_MARGIN_MS`] more to be
//! applied; `Drained` says whether everything finished in time.
//!
//! # Answered first
//!
//! A shard serves its control requests from a task queue of their own that
//! goes first whenever a request wakes it (`create_urgent_task_queue`, a
//! patch of the vendored glommio, `src/vendor/README.md` section 6), and a
//! wake-up from another thread ends the executor's pass at the next task or
//! `yield_if_needed` instead of when every runnable task has run. Before,
//! a query waited for the whole pass: under load each pass applied every
//! batch read since the last one (8 - 50 ms here), and the request then
//! queued behind the batches still waiting. Connections check for it after
//! each read (a full read completes at once, so a busy socket never let its
//! task go), the applier after each batch; the longer loops (a commit
//! round's partitions, closing a second's windows, emitting them) once per
//! [`crate::runtime::slice`].

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::runtime::log;
use crate::runtime::notify::{Either, first};
use crate::shard::Shard;
use crate::shard::metrics::{ShardMetrics, ShardStats};
use crate::stream::StreamSpec;

/// After the shutdown deadline, how long a shard still waits for the events
/// it has read to be applied (the connections themselves are cut at the
/// deadline), in ms.
const SHUTDOWN_DRAIN_MARGIN_MS: u64 = 500;

/// Requests from the control plane to one shard.
pub enum ControlRequest {
    Stats(flume::Sender<ShardStats>),
    Partitions(flume::Sender<Vec<PartitionInfo>>),
    /// The consumer groups this shard coordinates.
    Groups(flume::Sender<Vec<crate::shard::groups::GroupInfo>>),
    /// Stream lifecycle ([`crate::shard::streams`]): each answers once done.
    Stream(StreamChange),
    /// Keyed aggregates ([`crate::shard::aggregates`]).
    Aggregate(crate::shard::aggregates::AggregateRequest),
    /// Records a replicated partition's group committed, from the cluster
    /// thread ([`crate::shard::replicated::apply_committed`]).
    Committed(crate::replication::node::CommittedRecords),
    /// A peer's read of a partition's records for its gap, from the
    /// cluster thread ([`crate::shard::gap_read`]).
    GapRead(crate::replication::catchup::GapRead),
    /// The replicated partitions this node holds no replica of, and the
    /// mirrored ones caught up ([`crate::replication::mirror::MirrorView`]).
    MirrorView(std::sync::Arc<crate::replication::mirror::MirrorView>),
    /// Stop accepting and drain; connections still open at `deadline` are cut.
    Shutdown {
        deadline: Instant,
    },
    Exit,
}

/// Why a shard could not start.
#[derive(Debug)]
pub enum ShardFailure {
    /// The channel mesh between shards could not be joined.
    MeshJoin,
    /// A listener could not be bound.
    Bind { name: &'static str, address: std::net::SocketAddr, error: std::io::Error },
    /// The partitions' files could not be opened or recovered.
    Storage { error: crate::storage::segment::SegmentError },
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
    /// Serving; `read_only` says why its storage started read-only (the
    /// disk was full), if it did.
    Started {
        shard: u16,
        read_only: Option<String>,
    },
    Failed {
        shard: Option<u16>,
        failure: ShardFailure,
    },
    /// Drained; `complete` is false when connections were cut at the
    /// deadline or events read were not all applied in time.
    Drained {
        complete: bool,
    },
}

/// A change to the stream catalog, in the order the admin side runs them:
/// create = `Install` on every shard, then `Activate` on every shard;
/// delete = `Deactivate` everywhere, then `Settle` everywhere, then `Drop`
/// everywhere ([`crate::shard::streams`]).
pub enum StreamChange {
    /// Open the partitions of a new stream that this shard owns.
    Install { spec: StreamSpec, reply: flume::Sender<Result<(), crate::shard::streams::InstallError>> },
    /// Let ingest route to it (every shard has installed it).
    Activate { id: u32, reply: flume::Sender<()> },
    /// Stop routing to it and end its subscriptions (`reply` then); `fenced`
    /// once nothing this shard routed to it is in flight any more.
    Deactivate { id: u32, reply: flume::Sender<()>, fenced: flume::Sender<()> },
    /// Answer once none of its partitions moves into or out of this shard
    /// (none starts to: it is inactive everywhere).
    Settle { id: u32, reply: flume::Sender<()> },
    /// Remove its partitions (no shard routes to it any more) and close
    /// their files; the admin side deletes them.
    Drop { id: u32, reply: flume::Sender<()> },
}

/// One partition as its owner sees it (for `/partitions`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PartitionInfo {
    /// Its global id.
    pub partition: u32,
    /// Its stream and its number in the stream.
    pub stream: String,
    pub stream_partition: u32,
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
    /// Payload bytes of the events counted in `events_total`.
    pub payload_bytes_total: u64,
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
            ControlRequest::Groups(reply) => {
                let _ = reply.send(shard.groups.infos());
            }
            ControlRequest::Stream(request) => crate::shard::streams::handle(shard, request),
            ControlRequest::Aggregate(request) => crate::shard::aggregates::handle(shard, request),
            ControlRequest::Committed(committed) => crate::shard::replicated::apply_committed(shard, committed),
            ControlRequest::GapRead(read) => crate::shard::gap_read::handle(shard, read),
            ControlRequest::MirrorView(view) => {
                shard.replication.set_mirror_view(view);
                // Fetches parked on a partition whose mirror caught up (or
                // that this node now holds) may resolve now.
                shard.subscriptions.wake_parked();
            }
            ControlRequest::Shutdown { deadline } => {
                let shard = shard.clone();
                let events = events.clone();
                glommio::spawn_local(async move {
                    let complete = drain(&shard, deadline).await;
                    crate::shard::checkpoint::checkpoint_at_stop(&shard).await;
                    if let Some(committer) = &shard.committer {
                        committer.trim_at_stop().await;
                    }
                    let _ = events.send(ShardEvent::Drained { complete });
                })
                .detach();
            }
            ControlRequest::Exit => return,
        }
    }
}

/// Stops accepting, waits for the connection tasks until `deadline` (the
/// sweeper cuts those still open then), and for every event read to be
/// applied until the deadline plus [`SHUTDOWN_DRAIN_MARGIN_MS`]. Returns
/// whether both finished in time.
async fn drain(shard: &Shard, deadline: Instant) -> bool {
    let lifecycle = &shard.lifecycle;
    lifecycle.request_shutdown(deadline);
    let until = |instant: Instant| glommio::timer::sleep(instant.saturating_duration_since(Instant::now()));
    let connections_done = match first(lifecycle.connections_closed(), until(deadline)).await {
        Either::Left(()) => true,
        Either::Right(()) => {
            let cut = lifecycle.tasks_open();
            ShardMetrics::add(&shard.metrics.connections_cut_at_deadline, cut);
            log::warn!(shard = shard.id, "shutdown deadline: cutting {cut} connections still open");
            // The sweeper asks them to close within its interval.
            let margin = deadline + Duration::from_millis(SHUTDOWN_DRAIN_MARGIN_MS);
            matches!(first(lifecycle.connections_closed(), until(margin)).await, Either::Left(()));
            false
        }
    };
    let margin = deadline.max(Instant::now()) + Duration::from_millis(SHUTDOWN_DRAIN_MARGIN_MS);
    let applied =
        matches!(first(shard.ingress.sync_barrier(0..shard.shard_count), until(margin)).await, Either::Left(()));
    if !applied {
        log::warn!(shard = shard.id, "shutdown deadline: events read but not yet applied are dropped");
    }
    connections_done && applied
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
        let router = shard.ingress.router();
        metrics.credits_outstanding_bytes.set(router.credits_outstanding_bytes() as u64);
        metrics.batch_buffered_bytes.set(router.batch_buffered_bytes() as u64);
    }
    metrics.replication_inflight_batches.set(shard.replication.inflight_batches() as u64);
    metrics.connections_open.set(shard.lifecycle.connections_open());
    metrics.subscriber_connections_open.set(shard.lifecycle.sessions_open());
    metrics.apply_queue_bytes.set(shard.apply_queue.bytes() as u64);
    metrics.grants_held_batches.set(shard.pending_grants.held_batches() as u64);
    metrics.segment_pool_bytes.set(crate::partition::log::segment_pool_bytes() as u64);
    crate::shard::aggregates::set_metrics(shard);
    metrics.storage_failing.set(u64::from(shard.committer.as_ref().is_some_and(|committer| committer.is_failing())));
    let read_only_reason = shard.committer.as_ref().and_then(|committer| committer.read_only_reason());
    metrics.storage_read_only.set(u64::from(read_only_reason.is_some()));
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
    metrics.consolidation_moves.set(counters.consolidation_moves);
    metrics.consolidation_batches.set(counters.consolidation_batches);
    let kept_shards = match balancer.consolidator.mode() {
        crate::balance::Consolidation::Spread => shard.shard_count,
        crate::balance::Consolidation::Gathered { kept_shards } => kept_shards,
    };
    metrics.consolidation_kept_shards.set(u64::from(kept_shards));
    ShardStats { shard: shard.id, counters: metrics.snapshot(), read_only_reason }
}

fn partition_infos(shard: &Shard) -> Vec<PartitionInfo> {
    let placement = shard.placement.borrow();
    let streams = shard.streams.borrow();
    shard
        .partitions
        .borrow()
        .iter()
        .map(|(partition, value)| PartitionInfo {
            partition,
            stream: streams.catalog().stream_of(partition).map(|(spec, _)| spec.name.clone()).unwrap_or_default(),
            stream_partition: partition - value.stream_base,
            owner: shard.id,
            epoch: placement.get(partition).epoch,
            next_offset: value.log.next_offset(),
            earliest_offset: value.log.earliest_offset(),
            log_bytes: value.log.cost_bytes() as u64,
            disk_bytes: value.log.disk_bytes(),
            visible_offset: value.log.visible_offset(),
            events_total: value.events_total,
            payload_bytes_total: value.bytes_total,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use glommio::{LocalExecutorBuilder, Placement};

    /// The mechanism [`serve_control`] relies on: a message from another
    /// thread to a task of an urgent queue is handled while a busy task of
    /// the default queue still has 50 ms of work (it checks
    /// `yield_if_needed` every 50 µs), not after it. In glommio 0.9 as
    /// published the wake-up waits for the end of the pass: the busy task
    /// would finish first (its 60 ms are under the 100 ms preempt timer).
    #[test]
    fn a_request_from_another_thread_runs_before_a_busy_pass_ends() {
        const BUSY: Duration = Duration::from_millis(60);
        let (sender, receiver) = flume::bounded::<Instant>(1);
        let executor = LocalExecutorBuilder::new(Placement::Unbound).io_memory(512 << 10).make().unwrap();
        let (waited, busy_finished_first) = executor.run(async move {
            let control = glommio::executor().create_urgent_task_queue("control");
            let busy_done = Rc::new(Cell::new(false));
            let done = busy_done.clone();
            let answered = glommio::spawn_local_into(
                async move {
                    let sent = receiver.recv_async().await.unwrap();
                    (sent.elapsed(), done.get())
                },
                control,
            )
            .unwrap();
            // Let it reach its wait, as a shard's control task always is.
            glommio::timer::sleep(Duration::from_millis(1)).await;
            let busy = glommio::spawn_local(async move {
                let start = Instant::now();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(5));
                    let _ = sender.send(Instant::now());
                });
                while start.elapsed() < BUSY {
                    let step = Instant::now();
                    while step.elapsed() < Duration::from_micros(50) {
                        std::hint::spin_loop();
                    }
                    glommio::yield_if_needed().await;
                }
                busy_done.set(true);
            });
            let answer = answered.await;
            busy.await;
            answer
        });
        assert!(!busy_finished_first, "the request waited for the busy task ({waited:?})");
        assert!(waited < Duration::from_millis(20), "the request waited {waited:?}");
    }
}
