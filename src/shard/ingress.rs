//! The shard's ingress: where every ingest format's events enter the
//! engine. It drives the pure routing of [`crate::routing`] (the router,
//! its batches and credits): it sends full batches (to the local apply
//! queue or the mesh), runs the flusher, and parks connections that wait
//! for credits or for a held partition.
//!
//! When an open batch leaves: when it is full, or when the flusher sends it.
//! A chunk routed from a small read that drained its socket (the read
//! returned less than the buffer had room for, and at most
//! [`crate::config::FLUSH_SOON_READ_BYTES_MAX`]: nothing more is waiting
//! and the producer trickles) asks for a flush *soon*: the flusher yields
//! once, so every task that is ready now (the shard's other connections
//! whose reads completed in the same poll) adds its events first, and then
//! sends, with no timer. A chunk from a full read (more is waiting: the
//! producer outruns one read) leaves its batch open for up to
//! `--batch-flush-us`, so that at high rates batches fill instead of leaving
//! one small frame per read. So an event at a moderate rate waits for no
//! timer, and a core that has nothing else to do never wakes up again only
//! to flush.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::partition::PlacementTable;
use crate::partition::migration::Marker;
use crate::protocol::record::ExtendedRecord;
use crate::routing::{Blocked, CreditGrant, DataBatch, OffsetAsk, Router, route, route_encoded, route_extended};
use crate::runtime::notify::{Notify, WaitList};
use crate::shard::frame::MeshFrame;
use crate::shard::metrics::ShardMetrics;
use crate::shard::outbox::Outbox;
use crate::stream::StreamRoute;

/// Where a Kafka Produce reads the offsets its asked records got
/// ([`OffsetAsk`]): one cell per ask, `(offset, log_start_offset)`, -1 until
/// the owner's grant answers it. One allocation per request.
pub type OffsetSlots = Rc<[Cell<(i64, i64)>]>;

/// An ask this shard's batches carry, and the cell its answer goes to.
struct OffsetWaiter {
    sequence: u64,
    position: u32,
    slots: OffsetSlots,
    index: usize,
}

/// One shard's source side: its router, the flush timer, and the
/// connections waiting for credits.
pub struct Ingress {
    router: RefCell<Router>,
    /// Per owner, the offset asks in flight to it, in the order its grants
    /// answer them (batch sequence, then position). Bounded by the credit
    /// window: at most one per record in flight, and Kafka asks two per
    /// partition of a Produce.
    offset_waiters: RefCell<Vec<VecDeque<OffsetWaiter>>>,
    /// Per owner: tasks waiting for that owner's credits or grants.
    credit_waiters: Vec<WaitList>,
    /// Connections waiting for a held partition's release.
    hold_waiters: WaitList,
    flush_notify: Notify,
    flush_requested: Cell<bool>,
    /// The pending flush should go as soon as the ready tasks have run.
    flush_soon: Cell<bool>,
    /// Cuts the flusher's timer short for a flush requested soon.
    soon_notify: Notify,
    batch_flush: Duration,
    /// Whether a `#SYNC` must ask owners for durability (disk storage).
    sync_requests: bool,
    outbox: Rc<Outbox>,
    metrics: Rc<ShardMetrics>,
}

/// Routing one chunk of input: the placement table and the router stay
/// borrowed for the whole chunk (one borrow per chunk, not per event). Hold
/// it only between awaits; dropping it schedules the flush of open batches.
pub struct Route<'a> {
    ingress: &'a Ingress,
    placement: std::cell::Ref<'a, PlacementTable>,
    router: RefMut<'a, Router>,
    /// The chunk came from a read that drained its socket: open batches go
    /// soon, not after the flush timer.
    pub drained: bool,
}

impl Route<'_> {
    /// Routes one event of `stream`; see [`route`].
    #[inline]
    pub fn route_event(&mut self, stream: StreamRoute, key: &[u8], payload: &[u8]) -> Result<u16, Blocked> {
        self.route_hinted(stream, key, payload, 0)
    }

    /// [`Route::route_event`] with the hint for the stream's keyed
    /// aggregates ([`crate::protocol::record::RecordRef::value_at`]).
    #[inline]
    pub fn route_hinted(
        &mut self,
        stream: StreamRoute,
        key: &[u8],
        payload: &[u8],
        value_at: u16,
    ) -> Result<u16, Blocked> {
        let Route { ingress, placement, router, .. } = self;
        route(placement, router, stream, (key, payload, value_at), |owner, batch| ingress.deliver(owner, batch))
    }
}

impl Route<'_> {
    /// Routes one Kafka record to the partition its producer chose; see
    /// [`crate::routing::route_extended`]. With `ask`, the owner's grant
    /// will write the offset it gives the record into that slot.
    #[inline]
    pub fn route_extended(
        &mut self,
        partition: u32,
        record: &ExtendedRecord<'_>,
        ask: Option<(&OffsetSlots, usize)>,
    ) -> Result<u16, Blocked> {
        let Route { ingress, placement, router, .. } = self;
        let deliver = |owner, batch| ingress.deliver(owner, batch);
        let (owner, asked) = route_extended(placement, router, partition, record, ask.is_some(), deliver)?;
        ingress.wait_for_offset(owner, ask, asked);
        Ok(owner)
    }

    /// Routes a run of records the Kafka face encoded while checking them
    /// (see [`crate::routing::route_encoded`]); with `ask`, the first
    /// record's offset is asked for as in [`Route::route_extended`].
    /// Returns the owner and how many records were routed.
    #[inline]
    pub fn route_encoded(
        &mut self,
        partition: u32,
        run: (&[u8], usize, &[u32]),
        ask: Option<(&OffsetSlots, usize)>,
    ) -> Result<(u16, usize), Blocked> {
        let Route { ingress, placement, router, .. } = self;
        let deliver = |owner, batch| ingress.deliver(owner, batch);
        let (owner, count, asked) = route_encoded(placement, router, partition, run, ask.is_some(), deliver)?;
        ingress.wait_for_offset(owner, ask, asked);
        Ok((owner, count))
    }

    /// Like [`Route::sync_point`], but without asking for durability: once
    /// `owner` granted the returned sequence, the events before it are
    /// applied (stored and visible to subscribers), as Kafka's `acks=1`
    /// promises.
    pub fn applied_point(&mut self, owner: u16) -> u64 {
        let Route { ingress, router, .. } = self;
        router.request_grant(owner);
        let sequence = router.sequences(owner).0 + 1;
        if let Some(batch) = router.take_batch(owner) {
            debug_assert_eq!(batch.sequence, sequence);
            ingress.deliver(owner, batch);
        }
        sequence
    }

    /// A `#SYNC`'s point in `owner`'s batch sequence: makes the open batch
    /// (possibly an empty one) carry a sync request (disk storage) and ask
    /// for its grant at once, sends it now if a batch slot is free (else the
    /// flusher sends it when one returns), and returns its sequence. Every
    /// event routed to `owner` before the call is in that batch or an
    /// earlier one, and grants arrive in order, so once `owner` has granted
    /// that sequence ([`Ingress::granted`]) those events are stored as the
    /// storage promises. Unlike [`Ingress::sync_barrier`] nothing waits
    /// here: a connection keeps reading while its `#SYNC`s are in flight.
    pub fn sync_point(&mut self, owner: u16) -> u64 {
        let Route { ingress, router, .. } = self;
        if ingress.sync_requests {
            router.request_sync(owner);
        }
        router.request_grant(owner);
        let sequence = router.sequences(owner).0 + 1;
        if let Some(batch) = router.take_batch(owner) {
            debug_assert_eq!(batch.sequence, sequence);
            ingress.deliver(owner, batch);
        }
        sequence
    }
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        if self.router.pending_owners().next().is_some() {
            if self.drained {
                self.ingress.request_flush_soon();
            } else {
                self.ingress.request_flush();
            }
        }
    }
}

impl Ingress {
    /// Registers the offset slot a routed record asked its owner to fill
    /// (`ask` as the caller passed it, `asked` as the router answered it),
    /// so the owner's grant writes the record's offset there.
    fn wait_for_offset(&self, owner: u16, ask: Option<(&OffsetSlots, usize)>, asked: Option<OffsetAsk>) {
        if let (Some((slots, index)), Some(asked)) = (ask, asked) {
            let waiter =
                OffsetWaiter { sequence: asked.sequence, position: asked.position, slots: slots.clone(), index };
            self.offset_waiters.borrow_mut()[usize::from(owner)].push_back(waiter);
        }
    }

    pub fn new(config: &crate::config::Config, outbox: Rc<Outbox>, metrics: Rc<ShardMetrics>) -> Ingress {
        let shard_count = outbox.peer_count();
        let router =
            Router::new(shard_count, config.batch_bytes, config.credit_window_bytes(), config.credit_window_batches());
        Ingress {
            router: RefCell::new(router),
            offset_waiters: RefCell::new((0..shard_count).map(|_| VecDeque::new()).collect()),
            credit_waiters: (0..shard_count).map(|_| WaitList::default()).collect(),
            hold_waiters: WaitList::default(),
            flush_notify: Notify::default(),
            flush_requested: Cell::new(false),
            flush_soon: Cell::new(false),
            soon_notify: Notify::default(),
            batch_flush: Duration::from_micros(config.batch_flush_us),
            sync_requests: config.storage == crate::config::Storage::Disk,
            outbox,
            metrics,
        }
    }

    /// Starts routing a chunk of events.
    pub fn begin<'a>(&'a self, placement: &'a RefCell<PlacementTable>) -> Route<'a> {
        Route { ingress: self, placement: placement.borrow(), router: self.router.borrow_mut(), drained: false }
    }

    pub fn router(&self) -> std::cell::Ref<'_, Router> {
        self.router.borrow()
    }

    /// Sends a batch to its owner (this shard included).
    pub fn deliver(&self, owner: u16, batch: DataBatch) {
        ShardMetrics::add(&self.metrics.batches_sent, 1);
        self.outbox.send(owner, MeshFrame::Data(batch), &self.metrics);
    }

    /// Sends the open batch for `owner`, if it has events and a batch slot.
    pub fn flush(&self, owner: u16) {
        let batch = self.router.borrow_mut().take_batch(owner);
        if let Some(batch) = batch {
            self.deliver(owner, batch);
        }
    }

    /// Sends every open batch that can be sent.
    pub fn flush_all(&self) {
        let owners: Vec<u16> = self.router.borrow().pending_owners().collect();
        for owner in owners {
            self.flush(owner);
        }
    }

    /// Queues a migration marker for `owner` behind everything batched for
    /// it so far; the flusher sends it once the tasks ready now have run.
    /// Not at once: the markers of a batch of migrations
    /// ([`crate::partition::migration::Migrations::start_batch`]) then leave
    /// in one batch, taking one credit slot instead of one each.
    pub fn send_marker(&self, owner: u16, marker: Marker) {
        self.router.borrow_mut().add_marker(owner, marker);
        self.request_flush_soon();
    }

    /// Asks the flusher task to send open batches within `batch_flush_us`.
    pub fn request_flush(&self) {
        if !self.flush_requested.replace(true) {
            self.flush_notify.notify();
        }
    }

    /// Asks the flusher task to send open batches once the tasks that are
    /// ready now have run (see the module doc).
    pub fn request_flush_soon(&self) {
        self.flush_soon.set(true);
        if self.flush_requested.replace(true) {
            self.soon_notify.notify();
        } else {
            self.flush_notify.notify();
        }
    }

    /// The flusher: bounds how long an event waits in an open batch.
    pub async fn run_flusher(&self) {
        loop {
            self.flush_notify.notified().await;
            if !self.flush_soon.get() {
                let timer = glommio::timer::sleep(self.batch_flush);
                crate::runtime::notify::first(timer, self.soon_notify.notified()).await;
            }
            // Tasks made ready by the same poll (other connections' reads)
            // run first and add their events to the batches that leave.
            futures_lite::future::yield_now().await;
            self.flush_requested.set(false);
            self.flush_soon.set(false);
            self.flush_all();
        }
    }

    /// Credits from `owner` came back.
    pub fn on_grant(&self, owner: u16, mut grant: CreditGrant) {
        let asks = grant.offset_asks.take();
        self.answer_offsets(owner, asks.as_deref().map_or(&[], |asks| asks.as_slice()), grant.sequence);
        if let Some(asks) = asks {
            self.router.borrow_mut().recycle_offset_asks(owner, asks);
        }
        self.router.borrow_mut().grant(owner, grant);
        self.credit_waiters[usize::from(owner)].wake_all();
        if self.router.borrow().has_pending(owner) {
            self.request_flush();
        }
    }

    /// Writes the answers of a grant from `owner`, which covers its batches
    /// up to `sequence`, into their waiters' slots. Asks and waiters are in
    /// the same order; a waiter of a covered batch that got no answer (its
    /// batch's records were moved for replication, `shard::replicated`)
    /// never will, and is dropped, its slot left at -1.
    fn answer_offsets(&self, owner: u16, asks: &[OffsetAsk], sequence: u64) {
        let mut waiters = self.offset_waiters.borrow_mut();
        let waiters = &mut waiters[usize::from(owner)];
        for ask in asks {
            while let Some(waiter) = waiters.front() {
                let key = (waiter.sequence, waiter.position);
                if key > (ask.sequence, ask.position) {
                    break;
                }
                if key == (ask.sequence, ask.position) {
                    waiter.slots[waiter.index].set((ask.offset, ask.log_start_offset));
                }
                waiters.pop_front();
            }
        }
        while waiters.front().is_some_and(|waiter| waiter.sequence <= sequence) {
            waiters.pop_front();
        }
    }

    /// Waits until `owner` has credits for a record of `size` bytes, flushing
    /// its open batch first (spent credits only return once it is applied).
    /// Returns the time spent stalled.
    pub async fn wait_for_credits(&self, owner: u16, size: usize) -> Duration {
        let started = Instant::now();
        ShardMetrics::add(&self.metrics.credit_stalls, 1);
        // Below half of the window, every batch sent asked for its grant at
        // once, and the open one will. A record larger than half the window
        // can stall above that: then ask explicitly.
        if !self.router.borrow().below_half(owner) {
            self.router.borrow_mut().request_grant(owner);
        }
        self.flush(owner);
        self.credit_waiters[usize::from(owner)]
            .wait_until(|| {
                self.flush(owner);
                self.router.borrow().has_credits(owner, size)
            })
            .await;
        let stalled = started.elapsed();
        ShardMetrics::add(&self.metrics.credit_stall_seconds, stalled.as_secs_f64());
        stalled
    }

    /// Holds or releases `partition` for this shard's connections (its
    /// owner decided, [`crate::shard::groups`]).
    pub fn set_held(&self, partition: u32, held: bool) {
        self.router.borrow_mut().set_held(partition, held);
        if !held {
            self.hold_waiters.wake_all();
        }
    }

    pub fn is_held(&self, partition: u32) -> bool {
        self.router.borrow().is_held(partition)
    }

    /// Waits until `partition` is no longer held; sends the open batches
    /// first (events already routed must not wait behind the hold).
    /// Returns the time spent stalled.
    pub async fn wait_for_release(&self, partition: u32) -> Duration {
        let started = Instant::now();
        ShardMetrics::add(&self.metrics.group_hold_stalls, 1);
        self.flush_all();
        self.hold_waiters.wait_until(|| !self.router.borrow().is_held(partition)).await;
        let stalled = started.elapsed();
        ShardMetrics::add(&self.metrics.group_hold_stall_seconds, stalled.as_secs_f64());
        stalled
    }

    /// Whether `owner` has granted back every batch up to `sequence` (see
    /// [`Route::sync_point`]); sequence 0 is granted from the start.
    pub fn granted(&self, owner: u16, sequence: u64) -> bool {
        self.router.borrow().sequences(owner).1 >= sequence
    }

    /// Resolves once every owner has granted back its batch of `sequences`
    /// (indexed by owner; 0 for an owner with nothing to wait for).
    pub async fn wait_granted(&self, sequences: &[u64]) {
        for (owner, &sequence) in sequences.iter().enumerate() {
            let owner = owner as u16;
            self.credit_waiters[usize::from(owner)].wait_until(|| self.granted(owner, sequence)).await;
        }
    }

    /// Resolves once every event this shard accepted before the call for the
    /// owners in `owners` is stored by its owner as the storage promises
    /// (applied in memory mode; written or durable on disk, per the fsync
    /// policy): a grant returns only then, and the last batch to each owner
    /// carries a sync request. Used by `#SYNC`, for the owners a connection
    /// sent to, and by drain, for all.
    pub async fn sync_barrier(&self, owners: impl Iterator<Item = u16>) {
        for owner in owners {
            if self.sync_requests {
                self.router.borrow_mut().request_sync(owner);
            }
            // The owner may hold grants to send several in one frame: the
            // barrier's last batch asks for them.
            self.router.borrow_mut().request_grant(owner);
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
}
