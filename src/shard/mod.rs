//! The per-core runtime. One [`Shard`] per glommio executor owns a set of
//! partitions, the open batches of its connections, and its view of the
//! placement table. It is `!Send`: everything it owns lives on its thread, and
//! other shards reach it only through [`frame::Frame`]s on the channel mesh.
//!
//! The data path through a shard:
//!
//! 1. A connection task ([`crate::ingest`]) parses lines and calls
//!    [`router::Router::try_push`] for each event, which encodes it into the
//!    open batch of the partition's owner and spends credits.
//! 2. A full batch, or any non-empty one after `batch_flush_us`, is
//!    [`Shard::flush`]ed: to the local apply queue if this shard owns it, else
//!    into the mesh through the [`outbox::Outbox`].
//! 3. The owner applies the batch to its partition logs
//!    ([`Shard::apply_batch`]) and returns a [`frame::CreditGrant`], which wakes
//!    the connections that were waiting for credits.

pub mod balancer;
pub mod frame;
pub mod metrics;
pub mod migration;
pub mod notify;
mod outbox;
pub mod router;
mod runtime;

pub use runtime::{ControlRequest, PartitionInfo, ShardContext, ShardEvent, run_shard};

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;
use glommio::channels::local_channel::LocalSender;

use crate::config::Config;
use crate::partition::{PartitionManager, PlacementTable};
use crate::protocol::record::BatchIter;
use crate::subscribe::{FetchReply, FetchRequest, serve_fetch};
use balancer::Balancer;
use frame::{CreditGrant, DataBatch, Frame};
use metrics::ShardMetrics;
use migration::Migrations;
use notify::{Notify, WaitList};
use outbox::Outbox;
use router::Router;

/// One shard's state. Borrow its cells briefly and never across an `.await`.
pub struct Shard {
    pub id: u16,
    pub shard_count: u16,
    pub config: Arc<Config>,
    pub placement: RefCell<PlacementTable>,
    pub partitions: RefCell<PartitionManager>,
    pub router: RefCell<Router>,
    pub metrics: ShardMetrics,
    pub balancer: RefCell<Balancer>,
    pub migrations: RefCell<Migrations>,
    /// Per owner: tasks waiting for that owner's credits or grants.
    credit_waiters: Vec<WaitList>,
    pub(crate) outbox: std::rc::Rc<Outbox>,
    /// Batches to apply, from every source (this shard included), in arrival
    /// order; FIFO per source. Mesh receivers only enqueue here, so frames
    /// that are not data (grants, fetches, replies) never wait behind a slow
    /// apply. Bounded by the credits every source holds against this shard.
    apply_queue: RefCell<VecDeque<(u16, DataBatch)>>,
    apply_queue_bytes: Cell<usize>,
    apply_notify: Notify,
    flush_notify: Notify,
    flush_requested: Cell<bool>,
    /// Fetches waiting for new events: (origin shard, request).
    parked_fetches: RefCell<Vec<(u16, FetchRequest)>>,
    fetch_notify: Notify,
    /// Subscribers connected to this shard, by id.
    subscriptions: RefCell<AHashMap<u64, LocalSender<FetchReply>>>,
    next_subscription_id: Cell<u64>,
    shutdown_requested: Cell<bool>,
    shutdown_waiters: WaitList,
    connection_waiters: WaitList,
}

impl Shard {
    fn new(id: u16, shard_count: u16, config: Arc<Config>, outbox: std::rc::Rc<Outbox>) -> Shard {
        let placement = PlacementTable::spread(config.partitions, shard_count);
        let router = Router::new(
            usize::from(shard_count),
            config.batch_bytes,
            config.credit_window_bytes,
            config.credit_window_batches,
        );
        Shard {
            id,
            shard_count,
            partitions: RefCell::new(PartitionManager::new(config.partitions)),
            placement: RefCell::new(placement),
            router: RefCell::new(router),
            metrics: ShardMetrics::default(),
            balancer: RefCell::new(Balancer::new(
                config.balance_config(),
                config.rebalance == crate::config::Rebalance::On,
                shard_count,
            )),
            migrations: RefCell::default(),
            credit_waiters: (0..shard_count).map(|_| WaitList::default()).collect(),
            outbox,
            apply_queue: RefCell::default(),
            apply_queue_bytes: Cell::new(0),
            apply_notify: Notify::default(),
            flush_notify: Notify::default(),
            flush_requested: Cell::new(false),
            parked_fetches: RefCell::default(),
            fetch_notify: Notify::default(),
            subscriptions: RefCell::default(),
            // Ids are unique across shards: the shard id in the top bits.
            next_subscription_id: Cell::new(u64::from(id) << 48),
            shutdown_requested: Cell::new(false),
            shutdown_waiters: WaitList::default(),
            connection_waiters: WaitList::default(),
            config,
        }
    }

    /// Sends the open batch for `owner`, if it has events and a batch slot.
    pub fn flush(&self, owner: u16) {
        let Some(batch) = self.router.borrow_mut().take_batch(owner) else { return };
        self.deliver(owner, batch);
    }

    /// Sends a batch taken from the router to its owner. It does not touch
    /// the router, so callers may hold it borrowed.
    pub fn deliver(&self, owner: u16, batch: DataBatch) {
        ShardMetrics::add(&self.metrics.batches_sent, 1);
        if owner == self.id {
            self.enqueue_apply(self.id, batch);
        } else {
            self.outbox.send(owner, Frame::Data(batch), &self.metrics);
        }
    }

    /// Sends every open batch that can be sent.
    pub fn flush_all(&self) {
        let owners: Vec<u16> = self.router.borrow().pending_owners().collect();
        for owner in owners {
            self.flush(owner);
        }
    }

    /// Asks the flusher task to send open batches within `batch_flush_us`.
    pub fn request_flush(&self) {
        if !self.flush_requested.replace(true) {
            self.flush_notify.notify();
        }
    }

    /// The flusher: bounds how long an event waits in an open batch.
    async fn run_flusher(&self) {
        let interval = Duration::from_micros(self.config.batch_flush_us);
        loop {
            self.flush_notify.notified().await;
            glommio::timer::sleep(interval).await;
            self.flush_requested.set(false);
            self.flush_all();
        }
    }

    /// Waits until `owner` has credits for a record of `size` bytes, flushing
    /// its open batch first (spent credits only return once it is applied).
    /// Returns the time spent stalled.
    pub async fn wait_for_credits(&self, owner: u16, size: usize) -> Duration {
        let started = std::time::Instant::now();
        ShardMetrics::add(&self.metrics.credit_stalls, 1);
        self.flush(owner);
        self.credit_waiters[usize::from(owner)]
            .wait_until(|| {
                self.flush(owner);
                self.router.borrow().has_credits(owner, size)
            })
            .await;
        let stalled = started.elapsed();
        ShardMetrics::add(&self.metrics.credit_stall_ns, stalled.as_nanos() as u64);
        stalled
    }

    /// Applies a batch from `source` to the partition logs, processes its
    /// markers, then grants its credits back (or holds them, when it carried
    /// events for a partition still migrating here).
    pub async fn apply_batch(&self, source: u16, batch: DataBatch) {
        let delay_ns = self.config.apply_delay_ns_per_event_on(self.id) * u64::from(batch.event_count);
        if delay_ns > 0 {
            glommio::timer::sleep(Duration::from_nanos(delay_ns)).await;
        }
        let (mut stored, mut stored_bytes, mut misrouted) = (0u64, 0u64, 0u64);
        let mut held_for = None;
        {
            let mut partitions = self.partitions.borrow_mut();
            let mut migrations = self.migrations.borrow_mut();
            for (partition_id, record) in BatchIter::new(&batch.bytes) {
                match partitions.get_mut(partition_id) {
                    Some(partition) => {
                        stored += 1;
                        stored_bytes += partition.append(&record) + 4;
                    }
                    None if migrations.buffer(partition_id, record.log_record) => held_for = Some(partition_id),
                    None => misrouted += 1,
                }
            }
        }
        assert_eq!(misrouted, 0, "batch for a partition this shard neither owns nor expects: a routing bug");
        ShardMetrics::add(&self.metrics.events_stored, stored);
        ShardMetrics::add(&self.metrics.bytes_stored, stored_bytes);
        ShardMetrics::add(&self.metrics.events_misrouted, misrouted);
        ShardMetrics::add(&self.metrics.batches_applied, 1);
        for marker in &batch.markers {
            self.on_marker(source, *marker);
        }
        let grant = CreditGrant { sequence: batch.sequence, credit_bytes: batch.bytes.len(), recycled: batch.bytes };
        let mut migrations = self.migrations.borrow_mut();
        if held_for.is_some() || migrations.holds_grants_for(source) {
            migrations.hold_grant(source, grant, held_for);
        } else {
            drop(migrations);
            self.send_grant(source, grant);
        }
        if !self.parked_fetches.borrow().is_empty() {
            self.fetch_notify.notify();
        }
    }

    /// Returns credits to `source` (this shard included).
    fn send_grant(&self, source: u16, grant: CreditGrant) {
        if source == self.id {
            self.on_grant(source, grant);
        } else {
            self.outbox.send(source, Frame::Credit(grant), &self.metrics);
        }
    }

    /// Credits from `owner` came back.
    fn on_grant(&self, owner: u16, grant: CreditGrant) {
        self.router.borrow_mut().grant(owner, grant);
        self.credit_waiters[usize::from(owner)].wake_all();
        if self.router.borrow().has_pending(owner) {
            self.request_flush();
        }
    }

    fn enqueue_apply(&self, source: u16, batch: DataBatch) {
        self.apply_queue_bytes.set(self.apply_queue_bytes.get() + batch.bytes.len());
        self.apply_queue.borrow_mut().push_back((source, batch));
        self.apply_notify.notify();
    }

    /// The applier: applies queued batches in arrival order.
    async fn run_applier(&self) {
        loop {
            self.apply_notify.notified().await;
            loop {
                let Some((source, batch)) = self.apply_queue.borrow_mut().pop_front() else { break };
                self.apply_queue_bytes.set(self.apply_queue_bytes.get() - batch.bytes.len());
                self.apply_batch(source, batch).await;
                glommio::yield_if_needed().await;
            }
        }
    }

    /// Resolves once every event this shard accepted before the call for
    /// the owners in `owners` has been applied by its owner (used by `#SYNC`,
    /// for the owners a connection sent to, and by drain, for all).
    pub async fn sync_barrier(&self, owners: impl Iterator<Item = u16>) {
        for owner in owners {
            let waiters = &self.credit_waiters[usize::from(owner)];
            // The open batch may lack a slot: flush until it is gone.
            waiters
                .wait_until(|| {
                    self.flush(owner);
                    !self.router.borrow().has_pending(owner)
                })
                .await;
            let (sent, _) = self.router.borrow().sequences(owner);
            waiters.wait_until(|| self.router.borrow().sequences(owner).1 >= sent).await;
        }
    }

    /// A fetch from a subscriber on shard `origin` (possibly this one).
    pub fn handle_fetch(&self, origin: u16, request: FetchRequest) {
        let reply = {
            let migrations = self.migrations.borrow();
            serve_fetch(self.id, &self.partitions.borrow(), |partition| migrations.is_incoming(partition), &request)
        };
        match reply {
            Some(reply) => self.deliver_reply(origin, reply),
            None => self.parked_fetches.borrow_mut().push((origin, request)),
        }
    }

    fn deliver_reply(&self, origin: u16, reply: FetchReply) {
        if origin == self.id {
            let subscriptions = self.subscriptions.borrow();
            // A subscriber that went away drops its reply.
            if let Some(inbox) = subscriptions.get(&reply.subscription_id) {
                let sent = inbox.try_send(reply);
                debug_assert!(sent.is_ok(), "inbox holds one reply per owner");
            }
        } else {
            self.outbox.send(origin, Frame::FetchReply(reply), &self.metrics);
        }
    }

    /// Re-serves parked fetches after appends.
    async fn run_fetch_servicer(&self) {
        loop {
            self.fetch_notify.notified().await;
            let parked = std::mem::take(&mut *self.parked_fetches.borrow_mut());
            for (origin, request) in parked {
                self.handle_fetch(origin, request);
            }
        }
    }

    fn cancel_fetch(&self, origin: u16, subscription_id: u64) {
        self.parked_fetches
            .borrow_mut()
            .retain(|(parked_origin, request)| (*parked_origin, request.subscription_id) != (origin, subscription_id));
    }

    /// Sends a fetch to `owner` for a subscriber on this shard.
    pub fn send_fetch(&self, owner: u16, request: FetchRequest) {
        if owner == self.id {
            self.handle_fetch(self.id, request);
        } else {
            self.outbox.send(owner, Frame::Fetch(request), &self.metrics);
        }
    }

    /// Registers a subscriber's inbox; returns its id.
    pub fn register_subscription(&self, inbox: LocalSender<FetchReply>) -> u64 {
        let id = self.next_subscription_id.get();
        self.next_subscription_id.set(id + 1);
        self.subscriptions.borrow_mut().insert(id, inbox);
        id
    }

    /// Forgets a subscriber and cancels its parked fetches everywhere.
    pub fn unregister_subscription(&self, subscription_id: u64) {
        self.subscriptions.borrow_mut().remove(&subscription_id);
        for owner in 0..self.shard_count {
            if owner == self.id {
                self.cancel_fetch(self.id, subscription_id);
            } else {
                self.outbox.send(owner, Frame::FetchCancel { subscription_id }, &self.metrics);
            }
        }
    }

    /// Handles one frame from peer `source`; never waits.
    fn handle_frame(&self, source: u16, frame: Frame) {
        match frame {
            Frame::Data(batch) => self.enqueue_apply(source, batch),
            Frame::Credit(grant) => self.on_grant(source, grant),
            Frame::Fetch(request) => self.handle_fetch(source, request),
            Frame::FetchReply(reply) => self.deliver_reply(self.id, reply),
            Frame::FetchCancel { subscription_id } => self.cancel_fetch(source, subscription_id),
            Frame::Load(report) => {
                self.balancer.borrow_mut().view.update(report);
            }
            Frame::StealRequest { thief_events_per_s, .. } => self.on_steal_request(source, thief_events_per_s),
            Frame::StealRefused(refusal) => self.on_steal_refused(source, refusal),
            Frame::Placement { partition, owner, epoch } => self.on_placement(partition, owner, epoch),
            Frame::Handoff(handoff) => self.on_handoff(handoff),
        }
    }

    /// A migration into or out of this shard is in flight (as the balancer
    /// recorded it, or as the protocol still tracks it).
    pub fn is_migrating(&self) -> bool {
        self.balancer.borrow().state.is_migrating() || self.migrations.borrow().is_busy()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutdown_requested.get()
    }

    /// Resolves when shutdown is requested.
    pub async fn shutdown_requested(&self) {
        self.shutdown_waiters.wait_until(|| self.shutdown_requested.get()).await
    }

    fn request_shutdown(&self) {
        self.shutdown_requested.set(true);
        self.shutdown_waiters.wake_all();
    }

    /// Connection bookkeeping, so drain can wait for connection tasks.
    pub fn connection_opened(&self) {
        ShardMetrics::add(&self.metrics.connections_open, 1);
    }

    pub fn connection_closed(&self) {
        let open = self.metrics.connections_open.get();
        debug_assert!(open > 0);
        self.metrics.connections_open.set(open - 1);
        self.connection_waiters.wake_all();
    }

    async fn connections_closed(&self) {
        self.connection_waiters.wait_until(|| self.metrics.connections_open.get() == 0).await
    }

    /// Bytes waiting in the apply queue.
    pub fn apply_queue_bytes(&self) -> usize {
        self.apply_queue_bytes.get()
    }
}
