//! The per-core runtime. One [`Shard`] per glommio executor owns a set of
//! partitions and its services; it is `!Send`, everything it owns lives on
//! its thread, and other shards reach it only through [`frame::Frame`]s on
//! the channel mesh.
//!
//! The shard is thin: it owns its services and dispatches mesh frames to
//! them, carrying out what the owner-side logic in [`crate::partition`]
//! returns as data (grants, markers, handoffs). The services:
//!
//! * [`source::Source`]: where every ingest format's events enter
//!   ([`source::Route::route_event`]): batches per owner and their credits;
//! * [`apply_queue::ApplyQueue`]: batches waiting to be applied here;
//! * the owned partitions, the migration state machine and the placement
//!   table ([`crate::partition`]);
//! * [`subscriptions::Subscriptions`]: subscriber inboxes and parked fetches;
//! * [`balancer::Balancer`]: gossip and stealing;
//! * [`lifecycle::Lifecycle`]: shutdown and connection counting;
//! * [`outbox::Outbox`]: never-blocking mesh sends.
//!
//! The network faces (ingest, subscribe) and start-up live above, in
//! [`crate::serve`]; the shard imports neither.

pub mod apply_queue;
pub mod balancer;
pub mod control;
pub mod frame;
pub mod lifecycle;
pub mod metrics;
pub mod notify;
pub mod outbox;
pub mod source;
pub mod subscriptions;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::balance::Refusal;
use crate::config::Config;
use crate::partition::apply::{ShardMigrations, apply_batch, install_handoff};
use crate::partition::fetch::{FetchReply, FetchRequest, serve_fetch};
use crate::partition::migration::{Effect, Migrations};
use crate::partition::{Partition, PartitionLog, PartitionManager, PlacementTable};
use apply_queue::ApplyQueue;
use balancer::{Balancer, Sample, now_ms};
use frame::{CreditGrant, DataBatch, Frame, Handoff};
use lifecycle::Lifecycle;
use metrics::ShardMetrics;
use outbox::Outbox;
use source::Source;
use subscriptions::Subscriptions;

/// One shard's state. Borrow its cells briefly and never across an `.await`.
pub struct Shard {
    pub id: u16,
    pub shard_count: u16,
    pub config: Arc<Config>,
    pub metrics: Rc<ShardMetrics>,
    pub placement: RefCell<PlacementTable>,
    pub source: Source,
    pub partitions: RefCell<PartitionManager>,
    pub migrations: RefCell<ShardMigrations<CreditGrant>>,
    pub apply_queue: Rc<ApplyQueue>,
    pub subscriptions: Subscriptions,
    pub balancer: RefCell<Balancer>,
    pub lifecycle: Lifecycle,
    pub outbox: Rc<Outbox>,
}

impl Shard {
    /// A shard with the initial placement, owning its share of partitions.
    pub fn new(id: u16, config: Arc<Config>, outbox: Rc<Outbox>) -> Shard {
        let shard_count = outbox.peer_count() as u16;
        let metrics = Rc::new(ShardMetrics::default());
        let apply_queue = Rc::new(ApplyQueue::default());
        let source = Source::new(id, &config, outbox.clone(), apply_queue.clone(), metrics.clone());
        let enabled = config.rebalance == crate::config::Rebalance::On;
        let balancer = Balancer::new(config.balance_config(), enabled, id, shard_count);
        let placement = PlacementTable::spread(config.partitions, shard_count);
        let mut partitions = PartitionManager::new(config.partitions);
        for (partition, entry) in placement.iter().filter(|(_, entry)| entry.owner == id) {
            let log = PartitionLog::new(config.retention_bytes, config.segment_bytes);
            partitions.install(partition, Box::new(Partition::new(log, balancer.config.ewma_half_life_ms)));
            debug_assert_eq!(entry.epoch, 0);
        }
        Shard {
            id,
            shard_count,
            metrics,
            placement: RefCell::new(placement),
            source,
            partitions: RefCell::new(partitions),
            migrations: RefCell::new(Migrations::new(id, shard_count)),
            apply_queue,
            subscriptions: Subscriptions::new(id),
            balancer: RefCell::new(balancer),
            lifecycle: Lifecycle::default(),
            outbox,
            config,
        }
    }

    /// Handles one frame from peer `source`; never waits.
    pub fn handle_frame(&self, source: u16, frame: Frame) {
        match frame {
            Frame::Data(batch) => self.apply_queue.push(source, batch),
            Frame::Credit(grant) => self.source.on_grant(source, grant),
            Frame::Fetch(request) => self.handle_fetch(source, request),
            Frame::FetchReply(reply) => self.subscriptions.deliver(*reply),
            Frame::FetchCancel { subscription_id } => self.subscriptions.cancel(source, subscription_id),
            Frame::FetchWake { subscription_id } => self.wake_fetch(source, subscription_id),
            Frame::Load(report) => {
                self.balancer.borrow_mut().view.update(report);
            }
            Frame::StealRequest { thief_events_per_s } => self.on_steal_request(source, thief_events_per_s),
            Frame::StealRefused(refusal) => self.on_steal_refused(source, refusal),
            Frame::Placement { partition, owner, epoch } => {
                let mut effects = Vec::new();
                let mut placement = self.placement.borrow_mut();
                let now_ms = now_ms();
                self.migrations.borrow_mut().on_placement(
                    &mut placement,
                    partition,
                    owner,
                    epoch,
                    now_ms,
                    &mut effects,
                );
                drop(placement);
                self.carry_out(effects);
            }
            Frame::Handoff(handoff) => self.on_handoff(handoff),
        }
    }

    /// Carries out what the migration logic decided, in order.
    fn carry_out(&self, effects: Vec<Effect<CreditGrant>>) {
        for effect in effects {
            match effect {
                Effect::SendPlacement { to, partition, owner, epoch } => {
                    self.outbox.send(to, Frame::Placement { partition, owner, epoch }, &self.metrics);
                }
                Effect::SendMarker { to, marker } => self.source.send_marker(to, marker),
                Effect::SendHandoff { to, partition, epoch } => self.send_handoff(to, partition, epoch),
                Effect::Grant { source, grant } => self.send_grant(source, grant),
                Effect::Began(migration) => self.balancer.borrow_mut().migration_began(migration),
                Effect::Ended { partition, direction, at_ms } => {
                    self.balancer.borrow_mut().migration_ended(partition, direction, at_ms, at_ms);
                }
            }
        }
    }

    /// Returns credits to `source` (this shard included).
    fn send_grant(&self, source: u16, grant: CreditGrant) {
        if source == self.id {
            self.source.on_grant(source, grant);
        } else {
            self.outbox.send(source, Frame::Credit(grant), &self.metrics);
        }
    }

    /// The applier: applies queued batches in arrival order.
    pub async fn run_applier(&self) {
        loop {
            self.apply_queue.pushed().await;
            while let Some((source, batch)) = self.apply_queue.pop() {
                self.apply(source, batch).await;
                glommio::yield_if_needed().await;
            }
        }
    }

    /// Applies one batch from `source` and carries out what follows.
    async fn apply(&self, source: u16, batch: DataBatch) {
        let delay_ns = self.config.apply_delay_ns_per_event_on(self.id) * u64::from(batch.event_count);
        if delay_ns > 0 {
            glommio::timer::sleep(Duration::from_nanos(delay_ns)).await;
        }
        let mut effects = Vec::new();
        let applied = apply_batch(
            &mut self.partitions.borrow_mut(),
            &mut self.migrations.borrow_mut(),
            source,
            batch,
            now_ms(),
            &mut effects,
        );
        ShardMetrics::add(&self.metrics.events_stored, applied.stored);
        ShardMetrics::add(&self.metrics.bytes_stored, applied.stored_bytes);
        ShardMetrics::add(&self.metrics.batches_applied, 1);
        self.carry_out(effects);
        self.subscriptions.wake_parked();
    }

    /// Step 4 of a migration on the old owner: hand the partition over.
    fn send_handoff(&self, thief: u16, partition_id: u32, epoch: u32) {
        let partition = self.partitions.borrow_mut().remove(partition_id);
        let mut partition =
            partition.unwrap_or_else(|| panic!("shard {} hands over {partition_id}, not owned", self.id));
        partition.moved_ms = Some(now_ms());
        self.outbox.send(thief, Frame::Handoff(Handoff { partition_id, epoch, partition }), &self.metrics);
        // Parked fetches for it must now be told it moved.
        self.subscriptions.wake_parked();
    }

    /// Step 5 on the thief: install, catch up, release the held credits.
    fn on_handoff(&self, handoff: Handoff) {
        let Handoff { partition_id, epoch, partition } = handoff;
        let now_ms = now_ms();
        let moved_ms = partition.moved_ms.unwrap_or(now_ms);
        let mut effects = Vec::new();
        let pending = self.migrations.borrow_mut().on_handoff(partition_id, epoch, now_ms, &mut effects);
        let applied = install_handoff(&mut self.partitions.borrow_mut(), partition_id, partition, pending);
        ShardMetrics::add(&self.metrics.events_stored, applied.stored);
        ShardMetrics::add(&self.metrics.bytes_stored, applied.stored_bytes);
        for effect in effects {
            match effect {
                Effect::Ended { partition, direction, at_ms } => {
                    self.balancer.borrow_mut().migration_ended(partition, direction, at_ms, moved_ms);
                }
                other => self.carry_out(vec![other]),
            }
        }
        self.subscriptions.wake_parked();
    }

    /// A fetch from a subscriber on shard `origin` (possibly this one).
    pub fn handle_fetch(&self, origin: u16, request: FetchRequest) {
        match self.serve(&request, false) {
            Some(reply) => self.send_reply(origin, reply),
            None => self.subscriptions.park(origin, request),
        }
    }

    /// Serves a fetch from this shard's logs; `force` answers even when
    /// there is no news.
    fn serve(&self, request: &FetchRequest, force: bool) -> Option<FetchReply> {
        let migrations = self.migrations.borrow();
        let partitions = self.partitions.borrow();
        serve_fetch(self.id, &partitions, |partition| migrations.is_incoming(partition), request, force)
    }

    /// A subscriber on `origin` wants its parked fetch back (it has cursors
    /// for this shard that the fetch does not carry): answer it now.
    fn wake_fetch(&self, origin: u16, subscription_id: u64) {
        if let Some(request) = self.subscriptions.take_parked(origin, subscription_id) {
            let reply = self.serve(&request, true).expect("a forced fetch always answers");
            self.send_reply(origin, reply);
        }
    }

    fn send_reply(&self, origin: u16, reply: FetchReply) {
        if origin == self.id {
            self.subscriptions.deliver(reply);
        } else {
            self.outbox.send(origin, Frame::FetchReply(Box::new(reply)), &self.metrics);
        }
    }

    /// Re-serves parked fetches when they may have news.
    pub async fn run_fetch_servicer(&self) {
        loop {
            for (origin, request) in self.subscriptions.parked_with_news().await {
                self.handle_fetch(origin, request);
            }
        }
    }

    /// Sends a fetch to `owner` for a subscriber on this shard.
    pub fn send_fetch(&self, owner: u16, request: FetchRequest) {
        if owner == self.id {
            self.handle_fetch(self.id, request);
        } else {
            self.outbox.send(owner, Frame::Fetch(request), &self.metrics);
        }
    }

    /// Asks `owner` to answer this subscriber's parked fetch now.
    pub fn send_fetch_wake(&self, owner: u16, subscription_id: u64) {
        if owner == self.id {
            self.wake_fetch(self.id, subscription_id);
        } else {
            self.outbox.send(owner, Frame::FetchWake { subscription_id }, &self.metrics);
        }
    }

    /// Forgets a subscriber and cancels its parked fetches everywhere.
    pub fn unregister_subscription(&self, subscription_id: u64) {
        self.subscriptions.unregister(subscription_id);
        for owner in 0..self.shard_count {
            if owner == self.id {
                self.subscriptions.cancel(self.id, subscription_id);
            } else {
                self.outbox.send(owner, Frame::FetchCancel { subscription_id }, &self.metrics);
            }
        }
    }

    /// The gossip loop: sample, report, maybe ask for work.
    pub async fn run_balancer(&self) {
        let interval = Duration::from_millis(self.balancer.borrow().config.report_interval_ms);
        loop {
            glommio::timer::sleep(interval).await;
            let sample = Sample {
                now_ms: now_ms(),
                runtime: glommio::executor().executor_stats().total_runtime(),
                credit_stalls: self.metrics.credit_stalls.get(),
                migrating: self.is_migrating(),
            };
            let (report, request) = self.balancer.borrow_mut().tick(&mut self.partitions.borrow_mut(), sample);
            for peer in (0..self.shard_count).filter(|&peer| peer != self.id) {
                self.outbox.send(peer, Frame::Load(report.clone()), &self.metrics);
            }
            if let Some(request) = request {
                let frame = Frame::StealRequest { thief_events_per_s: request.thief_events_per_s };
                self.outbox.send(request.victim, frame, &self.metrics);
            }
        }
    }

    /// A migration into or out of this shard is in flight (as the balancer
    /// recorded it, or as the protocol still tracks it).
    pub fn is_migrating(&self) -> bool {
        self.balancer.borrow().state.is_migrating() || self.migrations.borrow().is_busy()
    }

    /// A thief asks this shard for a partition.
    fn on_steal_request(&self, thief: u16, thief_events_per_s: f64) {
        let now_ms = now_ms();
        let busy = self.migrations.borrow().is_busy();
        let choice =
            self.balancer.borrow_mut().answer_steal(&self.partitions.borrow(), busy, thief, thief_events_per_s, now_ms);
        match choice {
            Ok(partition) => {
                let mut effects = Vec::new();
                let mut placement = self.placement.borrow_mut();
                self.migrations.borrow_mut().start(&mut placement, partition, thief, &mut effects);
                drop(placement);
                self.carry_out(effects);
            }
            Err(refusal) => self.outbox.send(thief, Frame::StealRefused(refusal), &self.metrics),
        }
    }

    fn on_steal_refused(&self, victim: u16, refusal: Refusal) {
        self.balancer.borrow_mut().on_refused(victim, &refusal, now_ms());
    }
}
