//! Shard start-up, its long-running tasks, and the control plane.
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
use std::sync::Arc;

use glommio::channels::channel_mesh::FullMesh;
use glommio::net::TcpListener;

use crate::config::Config;
use crate::shard::frame::Frame;
use crate::shard::metrics::ShardStats;
use crate::shard::outbox::Outbox;
use crate::shard::{Shard, notify};

/// Requests from the control plane to one shard.
pub enum ControlRequest {
    Stats(flume::Sender<ShardStats>),
    Partitions(flume::Sender<Vec<PartitionInfo>>),
    Shutdown,
    Exit,
}

/// What a shard reports to `main`.
#[derive(Debug)]
pub enum ShardEvent {
    Started { shard: u16 },
    Failed { shard: u16, reason: String },
    Drained { shard: u16 },
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
    pub events_total: u64,
}

/// Everything a shard thread needs; cloned into every executor.
#[derive(Clone)]
pub struct ShardContext {
    pub config: Arc<Config>,
    pub mesh: FullMesh<Frame>,
    /// Control receivers, indexed by shard id (known only after the mesh join).
    pub control: Arc<Vec<flume::Receiver<ControlRequest>>>,
    pub events: flume::Sender<ShardEvent>,
}

/// The body of one shard's executor.
pub async fn run_shard(context: ShardContext) {
    let Ok((senders, mut receivers)) = context.mesh.join().await else {
        let _ = context.events.send(ShardEvent::Failed { shard: u16::MAX, reason: "mesh join failed".into() });
        return;
    };
    let id = receivers.peer_id() as u16;
    let shard_count = context.control.len() as u16;
    let outbox = Rc::new(Outbox::new(senders));
    let shard = Rc::new(Shard::new(id, shard_count, context.config.clone(), outbox.clone()));
    install_initial_partitions(&shard);

    for (peer, stream) in receivers.streams() {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while let Some(frame) = stream.recv().await {
                shard.handle_frame(peer as u16, frame);
            }
        })
        .detach();
        glommio::spawn_local(outbox.clone().drain(peer as u16)).detach();
    }
    spawn_background_tasks(&shard);

    let listeners = bind_listeners(&context.config);
    let (ingest, subscribe) = match listeners {
        Ok(listeners) => listeners,
        Err(reason) => {
            let _ = context.events.send(ShardEvent::Failed { shard: id, reason });
            return;
        }
    };
    glommio::spawn_local(crate::ingest::accept_loop(shard.clone(), ingest)).detach();
    glommio::spawn_local(accept_subscribers(shard.clone(), subscribe)).detach();
    let _ = context.events.send(ShardEvent::Started { shard: id });

    let control = &context.control[usize::from(id)];
    serve_control(&shard, control, &context.events).await;
    outbox.close();
}

fn install_initial_partitions(shard: &Shard) {
    let placement = shard.placement.borrow();
    let mut partitions = shard.partitions.borrow_mut();
    for (partition, entry) in placement.iter() {
        if entry.owner == shard.id {
            let log = crate::partition::PartitionLog::new(shard.config.retention_bytes, shard.config.segment_bytes);
            let half_life_ms = shard.balancer.borrow().config.ewma_half_life_ms;
            partitions.install(partition, Box::new(crate::partition::Partition::new(log, half_life_ms)));
        }
    }
}

fn spawn_background_tasks(shard: &Rc<Shard>) {
    let flusher = shard.clone();
    glommio::spawn_local(async move { flusher.run_flusher().await }).detach();
    let applier = shard.clone();
    glommio::spawn_local(async move { applier.run_applier().await }).detach();
    let balancer = shard.clone();
    glommio::spawn_local(async move { balancer.run_balancer().await }).detach();
    let servicer = shard.clone();
    glommio::spawn_local(async move { servicer.run_fetch_servicer().await }).detach();
}

fn bind_listeners(config: &Config) -> Result<(TcpListener, TcpListener), String> {
    let ingest = TcpListener::bind(config.ingest).map_err(|error| format!("bind ingest {}: {error}", config.ingest))?;
    let subscribe =
        TcpListener::bind(config.subscribe).map_err(|error| format!("bind subscribe {}: {error}", config.subscribe))?;
    Ok((ingest, subscribe))
}

async fn accept_subscribers(shard: Rc<Shard>, listener: TcpListener) {
    loop {
        let accepted = notify::first(listener.accept(), shard.shutdown_requested()).await;
        let stream = match accepted {
            notify::Either::Left(Ok(stream)) => stream,
            notify::Either::Left(Err(_)) => continue,
            notify::Either::Right(()) => return,
        };
        glommio::spawn_local(crate::subscribe::serve_subscriber(shard.clone(), stream)).detach();
    }
}

/// Answers control requests until `Exit`; drains on `Shutdown`.
async fn serve_control(
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
                    shard.request_shutdown();
                    shard.connections_closed().await;
                    shard.sync_barrier(0..shard.shard_count).await;
                    let _ = events.send(ShardEvent::Drained { shard: shard.id });
                })
                .detach();
            }
            ControlRequest::Exit => return,
        }
    }
}

fn stats(shard: &Shard) -> ShardStats {
    let mut stats = shard.metrics.snapshot(shard.id);
    let partitions = shard.partitions.borrow();
    stats.partitions_owned = partitions.owned_count();
    stats.log_bytes = partitions.iter().map(|(_, partition)| partition.log.cost_bytes() as u64).sum();
    let router = shard.router.borrow();
    stats.credits_outstanding_bytes = router.credits_outstanding_bytes() as u64;
    stats.batch_buffered_bytes = router.batch_buffered_bytes() as u64;
    stats.apply_queue_bytes = shard.apply_queue_bytes() as u64;
    stats.mesh_queued_frames = shard.outbox.queued_frames() as u64;
    let balancer = shard.balancer.borrow();
    stats.load_events_per_s = balancer.events_per_s;
    stats.load_bytes_per_s = balancer.bytes_per_s;
    stats.hottest_partition_events_per_s = balancer.hottest_events_per_s();
    let counters = balancer.counters;
    stats.steal_requests_sent = counters.steal_requests_sent;
    stats.steal_refusals_sent = counters.steal_refusals_sent;
    stats.steal_refusals_received = counters.steal_refusals_received;
    stats.migrations_started = counters.migrations_started;
    stats.migrations_completed = counters.migrations_completed;
    stats.migration_pending_bytes = shard.migrations.borrow().pending_bytes() as u64;
    stats
}

fn partition_infos(shard: &Shard) -> Vec<PartitionInfo> {
    let placement = shard.placement.borrow();
    shard
        .partitions
        .borrow()
        .iter()
        .map(|(partition, value)| {
            let entry = placement.get(partition);
            PartitionInfo {
                partition,
                owner: shard.id,
                epoch: entry.epoch,
                next_offset: value.log.next_offset(),
                earliest_offset: value.log.earliest_offset(),
                log_bytes: value.log.cost_bytes() as u64,
                events_total: value.events_total,
            }
        })
        .collect()
}
