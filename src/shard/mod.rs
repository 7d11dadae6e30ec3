//! The per-core runtime. One [`Shard`] per glommio executor owns a set of
//! partitions and its services; it is `!Send`, everything it owns lives on
//! its thread, and other shards reach it only through [`frame::MeshFrame`]s on
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

pub mod aggregates;
pub mod apply_queue;
pub mod balancer;
pub mod checkpoint;
pub mod commit;
pub mod consolidation;
pub mod control;
pub mod disk_read;
pub mod frame;
pub mod gap_read;
pub mod grants;
pub mod groups;
pub mod ingress;
pub mod lifecycle;
pub mod metrics;
pub mod outbox;
pub mod replicated;
pub mod streams;
pub mod subscriptions;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::balance::Refusal;
use crate::config::{Config, STORAGE_RETRY_MS};
use crate::partition::MovedPartition;
use crate::partition::apply::{ShardMigrations, apply_batch, install_moved};
use crate::partition::disk::DiskLog;
use crate::partition::disk::OpenReport;
use crate::partition::fetch::{FetchReply, FetchRequest, serve_fetch_with};
use crate::partition::migration::{self, Effect, Migrations};
use crate::partition::{MemoryLog, Partition, PartitionLog, PartitionManager, PlacementTable};
use crate::routing::{CreditGrant, DataBatch};
use crate::runtime::log;
use crate::storage::segment::SegmentError;
use crate::stream::{Catalog, ShardStreams, StreamSpec};
use apply_queue::ApplyQueue;
use balancer::{Balancer, LoadSample, now_ms};
use commit::Committer;
use frame::{Handoff, MeshFrame};
use ingress::Ingress;
use lifecycle::Lifecycle;
use metrics::ShardMetrics;
use outbox::Outbox;
use subscriptions::Subscriptions;

/// One shard's state. Borrow its cells briefly and never across an `.await`.
pub struct Shard {
    id: u16,
    shard_count: u16,
    config: Arc<Config>,
    metrics: Rc<ShardMetrics>,
    placement: RefCell<PlacementTable>,
    ingress: Ingress,
    partitions: RefCell<PartitionManager>,
    migrations: RefCell<ShardMigrations<CreditGrant>>,
    apply_queue: Rc<ApplyQueue>,
    /// Credit grants held to leave several in one frame.
    pending_grants: grants::PendingGrants,
    /// Group commit to the partitions' files; `None` with memory storage.
    committer: Option<Committer>,
    subscriptions: Subscriptions,
    balancer: RefCell<Balancer>,
    /// Slows the gossip loop down while the whole process is idle.
    gossip_pace: balancer::GossipPace,
    /// Wakes the consolidation mover ([`consolidation`]).
    consolidation_wake: crate::runtime::notify::Notify,
    /// Producer connections handed over by other shards, waiting for the
    /// ingest face to serve them (at most one per connection of the process).
    adoptions: RefCell<std::collections::VecDeque<Box<dyn std::any::Any + Send>>>,
    adoption_wake: crate::runtime::notify::Notify,
    lifecycle: Lifecycle,
    outbox: Rc<Outbox>,
    /// This shard's copy of the stream catalog.
    streams: RefCell<ShardStreams>,
    /// Emit queue, clock and checkpoints of keyed aggregates.
    aggregates: aggregates::ShardAggregates,
    /// Consumer groups: the ones it coordinates, its members' inboxes, and
    /// the hold floors.
    groups: groups::Groups,
    /// Which partitions are Raft groups, and the way to the cluster thread.
    replication: replicated::ShardReplication,
}

/// What the faces (ingest, subscribe, groups' members) and start-up see of a
/// shard. Its fields are private to `shard/`: a face reads the
/// configuration and counters, routes through [`Ingress`], registers
/// subscribers and members, and asks the stream catalog for a route; it
/// never borrows the partitions, placement or migrations itself.
impl Shard {
    /// Where proposals for replicated partitions go (the cluster thread).
    pub fn set_replication_sender(&self, sender: flume::Sender<crate::replication::node::ProposalRequest>) {
        self.replication.set_sender(sender);
    }

    /// Where the replicated partitions subscribers wait on are said (the
    /// cluster thread).
    pub fn set_replication_readers(&self, readers: flume::Sender<crate::replication::mirror::Reader>) {
        self.replication.set_readers(readers);
    }

    /// This shard's mesh peer id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// How many shards the process runs.
    pub fn shard_count(&self) -> u16 {
        self.shard_count
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// Routing and credits for producer connections.
    pub fn ingress(&self) -> &Ingress {
        &self.ingress
    }

    /// Starts routing a run of events: holds the placement table and the
    /// router until the route is dropped (never across an await).
    pub fn begin_route(&self) -> ingress::Route<'_> {
        self.ingress.begin(&self.placement)
    }

    /// Which shard owns a global partition now.
    pub fn owner_of(&self, partition_id: u32) -> u16 {
        self.placement.borrow().owner(partition_id)
    }

    /// The route of an active stream, by name.
    pub fn route_for(&self, stream: &[u8]) -> Option<crate::stream::StreamRoute> {
        self.streams.borrow().route_for(stream)
    }

    /// The names of the active streams (what Kafka's Metadata lists).
    pub fn stream_names(&self) -> Vec<String> {
        let streams = self.streams.borrow();
        let active = streams.catalog().streams().iter().filter(|spec| streams.is_active(spec.id));
        active.map(|spec| spec.name.clone()).collect()
    }

    /// Whether a stream (by id) is replicated over the cluster (its
    /// partitions are Raft groups).
    pub fn stream_is_replicated(&self, stream_id: u32) -> bool {
        let streams = self.streams.borrow();
        streams.catalog().streams().iter().any(|spec| spec.id == stream_id && spec.is_replicated())
    }

    /// Puts into `member` the top-level JSON member stream `stream_id`'s
    /// aggregates read ([`crate::stream::Catalog::json_value_member`]);
    /// empty when none does. No allocation once `member` is that long.
    pub fn json_value_member(&self, stream_id: u32, member: &mut Vec<u8>) {
        member.clear();
        if let Some(name) = self.streams.borrow().catalog().json_value_member(stream_id) {
            member.extend_from_slice(name);
        }
    }

    /// Whether a stream (by id) is still active: not deleted or being deleted.
    pub fn stream_is_active(&self, stream_id: u32) -> bool {
        self.streams.borrow().is_active(stream_id)
    }

    /// Why the shard refuses writes (a full disk at start-up), if it does.
    pub fn read_only_reason(&self) -> Option<String> {
        self.committer.as_ref().and_then(Committer::read_only_reason)
    }

    /// Whether partitions live on disk (a committer runs).
    pub fn stores_on_disk(&self) -> bool {
        self.committer.is_some()
    }

    /// Subscriber registrations: where fetch replies and deletion notices go.
    pub fn subscriptions(&self) -> &Subscriptions {
        &self.subscriptions
    }

    /// Consumer groups: member inboxes.
    pub fn groups(&self) -> &groups::Groups {
        &self.groups
    }
}

impl Shard {
    /// A shard with the initial placement. With memory storage it owns its
    /// share of partitions at once; on disk they are opened by
    /// [`Shard::open_partitions`].
    pub fn new(id: u16, config: Arc<Config>, outbox: Rc<Outbox>, catalog: Catalog) -> Shard {
        let shard_count = outbox.peer_count() as u16;
        let metrics = Rc::new(ShardMetrics::default());
        let apply_queue = Rc::new(ApplyQueue::default());
        let ingress = Ingress::new(&config, outbox.clone(), metrics.clone());
        let enabled = config.rebalance == crate::config::Rebalance::On;
        let balancer = Balancer::new(config.balance_config(), enabled, config.consolidation_config(), id, shard_count);
        let placement = PlacementTable::spread(config.partitions_max, shard_count);
        let mut partitions = PartitionManager::new(config.partitions_max);
        let on_disk = config.storage == crate::config::Storage::Disk;
        if !on_disk {
            for spec in catalog.streams() {
                install_memory_partitions(&mut partitions, &placement, id, &config, spec);
            }
        }
        let replication = replicated::ShardReplication::default();
        replication.refresh(&catalog, config.partitions_max);
        Shard {
            id,
            shard_count,
            metrics,
            placement: RefCell::new(placement),
            ingress,
            partitions: RefCell::new(partitions),
            migrations: RefCell::new(Migrations::new(id, shard_count)),
            apply_queue,
            pending_grants: grants::PendingGrants::new(usize::from(shard_count), config.credit_window_bytes()),
            committer: on_disk.then(|| Committer::new(&config)),
            subscriptions: Subscriptions::new(id),
            balancer: RefCell::new(balancer),
            gossip_pace: balancer::GossipPace::default(),
            consolidation_wake: Default::default(),
            adoptions: Default::default(),
            adoption_wake: Default::default(),
            lifecycle: Lifecycle::default(),
            outbox,
            streams: RefCell::new(ShardStreams::new(catalog)),
            aggregates: aggregates::ShardAggregates::new(&config),
            groups: groups::Groups::new(config.partitions_max),
            replication,
            config,
        }
    }

    /// Opens the files of the partitions this shard owns at start (disk
    /// storage), recovering each: concurrently, one task per partition.
    pub async fn open_partitions(self: &Rc<Self>) -> Result<Vec<OpenReport>, SegmentError> {
        let specs: Vec<StreamSpec> = self.streams.borrow().catalog().streams().to_vec();
        let mut reports = Vec::new();
        for spec in &specs {
            reports.extend(self.open_stream_partitions(spec).await?);
        }
        Ok(reports)
    }

    /// Installs the partitions of `spec` this shard owns: in memory at once,
    /// on disk once their files are open (concurrently, one task each).
    pub async fn open_stream_partitions(self: &Rc<Self>, spec: &StreamSpec) -> Result<Vec<OpenReport>, SegmentError> {
        if self.committer.is_none() {
            let placement = self.placement.borrow();
            install_memory_partitions(&mut self.partitions.borrow_mut(), &placement, self.id, &self.config, spec);
            return Ok(Vec::new());
        }
        let owned = owned_partitions_of(&self.placement.borrow(), self.id, spec);
        let declarations: Vec<_> = self.streams.borrow().catalog().aggregates_of(&spec.name).cloned().collect();
        let limits = self.aggregates.limits;
        let opens: Vec<_> = owned
            .into_iter()
            .map(|partition_id| {
                let log_id = spec.log_id(partition_id - spec.base);
                let committer = self.committer.as_ref();
                let frames = committer.and_then(|committer| committer.take_replay_frames(log_id));
                let durable = committer.and_then(|committer| committer.take_replay_position(log_id));
                let open = open_partition(
                    self.config.clone(),
                    spec.clone(),
                    partition_id,
                    declarations.clone(),
                    limits,
                    (frames, durable),
                );
                glommio::spawn_local(open)
            })
            .collect();
        let (mut reports, count) = (Vec::new(), opens.len());
        for (opened, open) in opens.into_iter().enumerate() {
            crate::runtime::stage::set(
                Some(self.id),
                format!("opening partitions: {opened} of {count} of stream {:?} open", spec.name),
            );
            let (partition_id, partition, report) = open.await?;
            self.partitions.borrow_mut().install(partition_id, Box::new(partition));
            // Read-only from its install on: no round may pass over a
            // partition whose writer does not exist yet.
            self.defer_unwritten(report.deferred.clone());
            reports.push(report);
        }
        self.defer_unwritten(None);
        Ok(reports)
    }

    /// Makes the shard read-only when opening a partition deferred a write
    /// (`deferred` says why), or a probe file could not be written, for
    /// lack of disk space.
    fn defer_unwritten(&self, deferred: Option<String>) {
        let Some(committer) = &self.committer else { return };
        if let Some(reason) = deferred {
            committer.defer(reason, None);
        }
        if let Some((dir, error)) = crate::storage::segment::take_probe_write_failure()
            && error.is_storage_full()
        {
            committer.defer(error.to_string(), Some(dir));
        }
    }

    /// Handles one frame from peer `source`; never waits.
    pub fn handle_frame(self: &Rc<Self>, source: u16, frame: MeshFrame) {
        match frame {
            MeshFrame::Data(batch) => self.apply_queue.push(source, batch),
            MeshFrame::Credit(grant) => self.ingress.on_grant(source, grant),
            MeshFrame::Fetch(request) => self.handle_fetch(source, request),
            MeshFrame::FetchReply(reply) => self.subscriptions.deliver(*reply),
            MeshFrame::FetchCredit(credit) => self.subscriptions.credit(source, credit),
            MeshFrame::FetchCancel { subscription_id } => self.subscriptions.cancel(source, subscription_id),
            MeshFrame::FetchWake { subscription_id } => self.wake_fetch(source, subscription_id),
            MeshFrame::Load(report) => {
                if report.events_per_s >= balancer::GOSSIP_IDLE_EVENTS_PER_S || report.migrating {
                    self.gossip_pace.traffic();
                }
                self.balancer.borrow_mut().view.update(report);
            }
            MeshFrame::StealRequest { thief_events_per_s } => self.on_steal_request(source, thief_events_per_s),
            MeshFrame::StealRefused(refusal) => self.on_steal_refused(source, refusal),
            MeshFrame::Placement { partition, owner, epoch } => {
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
            MeshFrame::Handoff(handoff) => self.on_handoff(handoff),
            MeshFrame::Group(frame) => self.handle_group_frame(*frame),
            MeshFrame::Adopt(adoption) => self.on_adoption(adoption),
        }
    }

    /// Carries out what the migration logic decided, in order.
    fn carry_out(self: &Rc<Self>, mut effects: Vec<Effect<CreditGrant>>) {
        migration::carry_out(&mut effects, &mut ShardCarrier { shard: self, moved_ms: None });
    }

    /// Returns credits to `source` once the batch is stored as the storage
    /// promises: once applied in memory (held to leave with later ones
    /// unless due, [`grants`]), after the committer's round on disk.
    fn send_grant(&self, source: u16, grant: CreditGrant) {
        match &self.committer {
            Some(committer) if committer.releases_at_once(&grant) => self.send_grant_now(source, grant),
            Some(committer) => committer.queue_grant(source, grant),
            None if source == self.id => self.send_grant_now(source, grant),
            None => {
                if let Some(due) = self.pending_grants.add(source, grant) {
                    self.send_grant_now(source, due);
                }
            }
        }
    }

    /// Returns credits to `source` (this shard included) now.
    pub(crate) fn send_grant_now(&self, source: u16, grant: CreditGrant) {
        self.send(source, MeshFrame::Credit(grant));
    }

    /// Sends a frame to shard `to`, this one included: the one way a shard
    /// talks to a peer ([`outbox::Outbox::send`]).
    pub fn send(&self, to: u16, frame: MeshFrame) {
        self.outbox.send(to, frame, &self.metrics);
    }

    /// Hands the frames this shard sends itself to [`Shard::handle_frame`],
    /// as a mesh receiver does with a peer's.
    pub async fn run_loopback(self: &Rc<Self>) {
        loop {
            let frame = self.outbox.next_loopback().await;
            self.handle_frame(self.id, frame);
        }
    }

    /// The applier: applies queued batches in arrival order.
    pub async fn run_applier(self: &Rc<Self>) {
        loop {
            self.apply_queue.pushed().await;
            while let Some((source, batch)) = self.apply_queue.pop() {
                if self.replication.is_active() || self.replication.inflight_batches() > 0 {
                    // Records of replicated partitions go to their groups
                    // first; the rest follows in order once committed.
                    replicated::submit(self, source, batch).await;
                } else {
                    self.apply_local(source, batch).await;
                }
                glommio::yield_if_needed().await;
            }
        }
    }

    /// Applies one batch from `source` (its replicated records already
    /// taken out, [`replicated::submit`]) and carries out what follows.
    async fn apply_local(self: &Rc<Self>, source: u16, batch: DataBatch) {
        let delay_ns = self.config.apply_delay_ns_per_event_on(self.id).saturating_mul(u64::from(batch.event_count));
        if delay_ns > 0 {
            glommio::timer::sleep(Duration::from_nanos(delay_ns)).await;
        }
        let any_processor = aggregates::any_declared(self);
        self.partitions.borrow_mut().arrival_ms = self.aggregates.clock();
        let mut effects = Vec::new();
        let applied = apply_batch(
            &mut *self.partitions.borrow_mut(),
            &mut self.migrations.borrow_mut(),
            source,
            batch,
            now_ms(),
            &mut effects,
        );
        ShardMetrics::add(&self.metrics.events_stored, applied.stored);
        ShardMetrics::add(&self.metrics.bytes_stored, applied.stored_bytes);
        ShardMetrics::add(&self.metrics.events_discarded_deleted_stream, applied.discarded);
        ShardMetrics::add(&self.metrics.batches_applied, 1);
        self.gossip_pace.traffic();
        aggregates::after_apply(self, any_processor).await;
        self.carry_out(effects);
        if self.has_hold_floors() {
            self.check_holds();
        }
        match &self.committer {
            // Readers see new events once they are committed.
            Some(committer) => committer.wake(),
            None => self.subscriptions.wake_parked(),
        }
    }

    /// Step 4 of a migration on the old owner: hand the partition over. On
    /// disk its files are first made durable and closed (the thief opens
    /// them again), so the handoff waits for a synced commit round.
    fn send_handoff(self: &Rc<Self>, thief: u16, partition_id: u32, epoch: u32) {
        if self.committer.is_none() {
            let partition = self.take_partition(partition_id).into_moved(None);
            self.finish_handoff(thief, partition_id, epoch, partition);
            return;
        }
        let shard = self.clone();
        glommio::spawn_local(async move {
            let committer = shard.committer.as_ref().expect("disk storage");
            committer.barrier().await;
            let detached =
                shard.detach_partitions(&[partition_id], false).await.pop().and_then(|(_, partition)| partition);
            let mut partition =
                detached.unwrap_or_else(|| panic!("shard {} hands over {partition_id}, not owned", shard.id));
            let writer = partition.log.parts_mut().1.and_then(|disk| disk.take_writer());
            let mut writer = writer.expect("a detached partition has its writer (it leaves only between rounds)");
            // With a write-ahead log the round made the events durable in
            // this shard's log, and the writer may still hold some behind
            // it: the thief must need neither, so the files get all of it,
            // durably, before they move (retried until the disk allows).
            sync_for_handoff(&shard, partition_id, &mut writer).await;
            let disk = partition.log.parts_mut().1.expect("a disk partition");
            disk.put_writer(writer);
            let writer = disk.take_writer().expect("just put back");
            let index = writer.index().clone();
            if let Err(error) = writer.close().await {
                // Its data is durable already (the round synced it): the
                // thief opens the file again either way.
                log::warn!(shard = shard.id, "closing partition {partition_id} for a move: {error}");
            }
            shard.finish_handoff(thief, partition_id, epoch, partition.into_moved(Some(index)));
        })
        .detach();
    }

    /// Takes partitions out of this shard (a handoff; with `retire`, a
    /// stream deletion, see [`Committer::detach`]). On disk this waits for a
    /// gap between commit rounds, so no writer is ever out of a partition
    /// that leaves.
    pub async fn detach_partitions(&self, partition_ids: &[u32], retire: bool) -> Vec<(u32, Option<Box<Partition>>)> {
        match &self.committer {
            Some(committer) => committer.detach(partition_ids, retire).await,
            None => {
                let mut partitions = self.partitions.borrow_mut();
                let detached = partition_ids.iter().map(|&id| (id, partitions.remove(id))).collect();
                if retire {
                    partition_ids.iter().for_each(|&id| partitions.retire(id));
                }
                detached
            }
        }
    }

    fn take_partition(&self, partition_id: u32) -> Box<Partition> {
        let partition = self.partitions.borrow_mut().remove(partition_id);
        partition.unwrap_or_else(|| panic!("shard {} hands over {partition_id}, not owned", self.id))
    }

    fn finish_handoff(&self, thief: u16, partition_id: u32, epoch: u32, mut partition: MovedPartition) {
        self.migrations.borrow_mut().handoff_sent(partition_id);
        partition.moved_ms = Some(now_ms());
        let partition = Box::new(partition);
        self.outbox.send(thief, MeshFrame::Handoff(Handoff { partition_id, epoch, partition }), &self.metrics);
        // Parked fetches for it must now be told it moved.
        self.subscriptions.wake_parked();
    }

    /// Step 5 on the thief: open the files again (on disk), install, catch
    /// up, release the held credits.
    fn on_handoff(self: &Rc<Self>, handoff: Handoff) {
        let Handoff { partition_id, epoch, mut partition } = handoff;
        let Some(moved_disk) = partition.take_disk() else {
            self.install_moved(partition_id, epoch, Partition::from_moved(*partition, None));
            return;
        };
        let shard = self.clone();
        glommio::spawn_local(async move {
            // Events for it keep arriving meanwhile and wait as pending
            // (bounded by their sources' credits), also while an open that
            // failed (no file descriptor left, say) is tried again.
            let mut logged = false;
            let disk = loop {
                match DiskLog::reopen(&moved_disk).await {
                    Ok(disk) => break disk,
                    Err(error) => {
                        ShardMetrics::add(&shard.metrics.storage_errors, 1);
                        if !std::mem::replace(&mut logged, true) {
                            log::warn!(
                                shard = shard.id,
                                "cannot open moved partition {partition_id} yet: {error}; \
                                 retrying every {STORAGE_RETRY_MS} ms"
                            );
                        }
                        glommio::timer::sleep(Duration::from_millis(STORAGE_RETRY_MS)).await;
                    }
                }
            };
            if logged {
                log::info!(shard = shard.id, "opened moved partition {partition_id}");
            }
            shard.install_moved(partition_id, epoch, Partition::from_moved(*partition, Some(disk)));
        })
        .detach();
    }

    fn install_moved(self: &Rc<Self>, partition_id: u32, epoch: u32, partition: Partition) {
        let partition = Box::new(partition);
        // A deleted stream's partitions settle everywhere before any shard
        // drops them (`shard::streams`): one arriving after the drop would
        // stay, and the next stream given its id would find it here.
        assert!(
            !self.partitions.borrow().is_retired(partition_id),
            "moved partition {partition_id} arrived after its stream was dropped here"
        );
        let now_ms = now_ms();
        let moved_ms = partition.moved_ms.unwrap_or(now_ms);
        let mut effects = Vec::new();
        self.partitions.borrow_mut().arrival_ms = self.aggregates.clock();
        let applied = install_moved(
            &mut *self.partitions.borrow_mut(),
            &mut self.migrations.borrow_mut(),
            partition_id,
            epoch,
            partition,
            now_ms,
            &mut effects,
        );
        aggregates::reconcile_partition(self, partition_id);
        ShardMetrics::add(&self.metrics.events_stored, applied.stored);
        ShardMetrics::add(&self.metrics.bytes_stored, applied.stored_bytes);
        migration::carry_out(&mut effects, &mut ShardCarrier { shard: self, moved_ms: Some(moved_ms) });
        if let Some(committer) = &self.committer {
            committer.wake();
        }
        self.subscriptions.wake_parked();
    }

    /// A fetch from a subscriber on shard `origin` (possibly this one). A
    /// reply that only carries events keeps a fetch that can stand parked
    /// here, its cursors advanced and its window spent
    /// ([`crate::partition::fetch`]).
    pub fn handle_fetch(self: &Rc<Self>, origin: u16, mut request: FetchRequest) {
        let could_stand = request.can_stand();
        let budget = request.budget();
        match self.serve(&mut request, false) {
            Some(mut reply) => {
                if could_stand && reply.is_tail_only() {
                    reply.standing = true;
                    if let Some(window) = request.window.as_mut() {
                        window.spend(reply.records.size_bytes());
                    }
                    self.note_readers(&request);
                    self.subscriptions.park(origin, request);
                    if reply.more {
                        // A backlog: serve it again soon, not only when
                        // new events arrive (if its window allows).
                        self.subscriptions.wake_parked();
                    }
                }
                self.reply_after_disk_reads(origin, reply, budget);
            }
            None => {
                self.note_readers(&request);
                self.subscriptions.park(origin, request);
            }
        }
    }

    /// A fetch parks here: its replicated partitions have a reader on this
    /// node (what the cluster thread mirrors when it holds no replica).
    fn note_readers(&self, request: &FetchRequest) {
        if self.replication.is_active() {
            self.replication.note_readers(|each| request.cursors.iter().for_each(|(partition, _)| each(*partition)));
        }
    }

    /// Sends a reply, reading from the files first what it needs from them.
    fn reply_after_disk_reads(self: &Rc<Self>, origin: u16, reply: FetchReply, bytes_max: usize) {
        if reply.disk_reads.is_empty() {
            self.send_reply(origin, reply);
        } else {
            glommio::spawn_local(disk_read::complete_disk_reads(self.clone(), origin, reply, bytes_max)).detach();
        }
    }

    /// Serves a fetch from this shard's logs; `force` answers even when
    /// there is no news.
    fn serve(&self, request: &mut FetchRequest, force: bool) -> Option<FetchReply> {
        let migrations = self.migrations.borrow();
        let partitions = self.partitions.borrow();
        let is_incoming = |partition| migrations.is_incoming(partition);
        let awaits_mirror = |partition| self.replication.awaits_mirror(partition);
        serve_fetch_with(self.id, &partitions, is_incoming, awaits_mirror, request, force)
    }

    /// A subscriber on `origin` wants its parked fetch back (it has cursors
    /// for this shard that the fetch does not carry): answer it now.
    fn wake_fetch(self: &Rc<Self>, origin: u16, subscription_id: u64) {
        if let Some(mut request) = self.subscriptions.take_parked(origin, subscription_id) {
            let reply = self.serve(&mut request, true).expect("a forced fetch always answers");
            self.reply_after_disk_reads(origin, reply, request.budget());
        }
    }

    pub(crate) fn send_reply(&self, origin: u16, reply: FetchReply) {
        self.send(origin, MeshFrame::FetchReply(Box::new(reply)));
    }

    /// Re-serves parked fetches when they may have news.
    pub async fn run_fetch_servicer(self: &Rc<Self>) {
        loop {
            for (origin, request) in self.subscriptions.parked_with_news().await {
                self.handle_fetch(origin, request);
            }
        }
    }

    /// Sends a fetch to `owner` for a subscriber on this shard.
    pub fn send_fetch(&self, owner: u16, request: FetchRequest) {
        self.send(owner, MeshFrame::Fetch(request));
    }

    /// Gives window back to this subscriber's standing fetch at `owner`.
    pub fn send_fetch_credit(&self, owner: u16, credit: crate::partition::fetch::FetchCredit) {
        self.send(owner, MeshFrame::FetchCredit(credit));
    }

    /// Asks `owner` to answer this subscriber's parked fetch now.
    pub fn send_fetch_wake(&self, owner: u16, subscription_id: u64) {
        self.send(owner, MeshFrame::FetchWake { subscription_id });
    }

    /// Forgets a subscriber and cancels its parked fetches everywhere.
    pub fn unregister_subscription(&self, subscription_id: u64) {
        self.subscriptions.unregister(subscription_id);
        for owner in 0..self.shard_count {
            self.send(owner, MeshFrame::FetchCancel { subscription_id });
        }
    }

    /// The gossip loop: sample, report, maybe ask for work.
    pub async fn run_balancer(&self) {
        let interval = Duration::from_millis(self.balancer.borrow().config.report_interval_ms);
        loop {
            if self.gossip_pace.sleep(interval).await {
                // Traffic after an idle gap: sample it over a short window
                // of its own, then tick at once (a thief woken by a peer's
                // report asks while the burst is still fresh).
                let runtime = glommio::executor().executor_stats().total_runtime();
                self.balancer.borrow_mut().restart_window(now_ms(), runtime);
                glommio::timer::sleep(interval.min(Duration::from_millis(balancer::GOSSIP_WAKE_SAMPLE_MS))).await;
            }
            let sample = LoadSample {
                now_ms: now_ms(),
                runtime: glommio::executor().executor_stats().total_runtime(),
                credit_stalls: self.metrics.credit_stalls.get(),
                migrating: self.is_migrating(),
            };
            let (report, request) = self.balancer.borrow_mut().tick(&mut self.partitions.borrow_mut(), sample);
            for peer in (0..self.shard_count).filter(|&peer| peer != self.id) {
                self.outbox.send(peer, MeshFrame::Load(report.clone()), &self.metrics);
            }
            if let Some(request) = request {
                let frame = MeshFrame::StealRequest { thief_events_per_s: request.thief_events_per_s };
                self.outbox.send(request.victim, frame, &self.metrics);
            }
            if self.balancer.borrow().consolidation_due() {
                self.consolidation_wake.notify();
            }
            // Fetches parked for long keep their partitions' mirrors alive.
            if self.replication.is_active() {
                self.replication.note_readers(|each| self.subscriptions.parked_partitions(each));
            }
            let balancer = self.balancer.borrow();
            let idle = balancer.is_idle() && !balancer.gather_pending() && !self.is_migrating();
            drop(balancer);
            self.gossip_pace.set_idle(idle);
            // Freed memory goes back to the kernel once its purge delay has
            // passed, and all of it at every tick of an idle process (every
            // 5 s): an idle shard may call the allocator no more
            // ([`crate::runtime::memory`]).
            if idle {
                crate::runtime::memory::purge_all();
            } else {
                crate::runtime::memory::purge_due();
            }
        }
    }

    /// A migration into or out of this shard is in flight (as the balancer
    /// recorded it, or as the protocol still tracks it).
    pub fn is_migrating(&self) -> bool {
        self.balancer.borrow().ledger.state.is_migrating() || self.migrations.borrow().is_busy()
    }

    /// A thief asks this shard for a partition.
    fn on_steal_request(self: &Rc<Self>, thief: u16, thief_events_per_s: f64) {
        let now_ms = now_ms();
        let busy = self.migrations.borrow().is_busy();
        let choice = {
            let streams = self.streams.borrow();
            // A replicated partition stays on its shard (for now).
            let movable = |partition| {
                streams
                    .catalog()
                    .stream_of(partition)
                    .is_some_and(|(spec, _)| streams.is_active(spec.id) && !spec.is_replicated())
            };
            let partitions = self.partitions.borrow();
            self.balancer.borrow_mut().answer_steal(&partitions, movable, busy, thief, thief_events_per_s, now_ms)
        };
        match choice {
            Ok(partition) => {
                let mut effects = Vec::new();
                let mut placement = self.placement.borrow_mut();
                self.migrations.borrow_mut().start(&mut placement, partition, thief, now_ms, &mut effects);
                drop(placement);
                self.carry_out(effects);
            }
            Err(refusal) => self.outbox.send(thief, MeshFrame::StealRefused(refusal), &self.metrics),
        }
    }

    fn on_steal_refused(&self, victim: u16, refusal: Refusal) {
        self.balancer.borrow_mut().on_refused(victim, &refusal, now_ms());
    }
}

/// The engine's side of a migration step's effects: frames on the mesh, the
/// handoff, credits, the balancer's ledger. `moved_ms`: when the partition
/// whose handoff these effects follow was handed over (a thief's cooldown
/// starts then).
struct ShardCarrier<'a> {
    shard: &'a Rc<Shard>,
    moved_ms: Option<u64>,
}

impl migration::Carrier<CreditGrant> for ShardCarrier<'_> {
    fn send_placement(&mut self, to: u16, partition: u32, owner: u16, epoch: u32) {
        self.shard.send(to, MeshFrame::Placement { partition, owner, epoch });
    }

    fn send_marker(&mut self, to: u16, marker: migration::Marker) {
        self.shard.ingress.send_marker(to, marker);
    }

    fn send_handoff(&mut self, to: u16, partition: u32, epoch: u32) {
        self.shard.send_handoff(to, partition, epoch);
    }

    fn grant(&mut self, source: u16, grant: CreditGrant) {
        self.shard.send_grant(source, grant);
    }

    fn began(&mut self, migration: crate::balance::Migration) {
        self.shard.balancer.borrow_mut().migration_began(migration);
    }

    fn ended(&mut self, partition: u32, direction: crate::balance::Direction, at_ms: u64) {
        let moved_ms = self.moved_ms.unwrap_or(at_ms);
        self.shard.balancer.borrow_mut().migration_ended(partition, direction, at_ms, moved_ms);
    }
}

/// Opens one partition's files and builds the partition around them, with
/// an empty tail cache that starts where the files end.
async fn open_partition(
    config: Arc<Config>,
    spec: StreamSpec,
    partition_id: u32,
    declarations: Vec<crate::aggregate::AggregateDeclaration>,
    limits: crate::aggregate::ProcessorLimits,
    (frames, durable): (Option<crate::storage::wal::LogFrames>, Option<crate::storage::index::SegmentIndex>),
) -> Result<(u32, Partition, OpenReport), SegmentError> {
    let local = partition_id - spec.base;
    let dir = crate::storage::dir::partition_dir(&config.data_dir, &spec.name, local).map_err(|error| {
        let source = std::io::Error::other(error.to_string());
        SegmentError::Io { op: "partition directory", path: config.data_dir.clone(), position: 0, source }
    })?;
    let (mut disk, mut report) =
        DiskLog::open_with(&dir, spec.log_id(local), config.disk_config_for(&spec), durable).await?;
    if let Some(frames) = frames {
        let appended = commit::replay_frames(&mut disk, frames).await?;
        report.replayed_frames = appended;
        if appended > 0 {
            log::info!("replayed {appended} frames from the write-ahead logs into {}", dir.display());
        }
    }
    let processor = aggregates::recover(&disk, &spec, local, &declarations, limits).await?;
    let cache = MemoryLog::starting_at(disk.next_offset(), config.tail_cache_bytes, config.tail_cache_segment_bytes());
    let mut partition = Partition::new(PartitionLog::on_disk(cache, disk), config.balance_config().ewma_half_life_ms);
    partition.stream_base = spec.base;
    partition.stream_id = spec.id;
    partition.opened_offset = partition.log.next_offset();
    partition.processor = processor;
    Ok((partition_id, partition, report))
}

/// Installs the partitions of `spec` that shard `id` owns, held in memory
/// only.
fn install_memory_partitions(
    partitions: &mut PartitionManager,
    placement: &PlacementTable,
    id: u16,
    config: &Config,
    spec: &StreamSpec,
) {
    let retention_bytes = usize::try_from(spec.retention_bytes).unwrap_or(usize::MAX);
    for partition_id in owned_partitions_of(placement, id, spec) {
        let log = PartitionLog::in_memory(retention_bytes.max(config.segment_bytes()), config.segment_bytes());
        let mut partition = Partition::new(log, config.balance_config().ewma_half_life_ms);
        partition.stream_base = spec.base;
        partition.stream_id = spec.id;
        partitions.install(partition_id, Box::new(partition));
    }
}

/// The global ids of `spec`'s partitions that shard `id` owns.
fn owned_partitions_of(placement: &PlacementTable, id: u16, spec: &StreamSpec) -> Vec<u32> {
    spec.globals().filter(|&global| placement.owner(global) == id).collect()
}

/// Writes and fdatasyncs a partition's files before a handoff, retrying
/// every [`crate::config::STORAGE_RETRY_MS`] until it succeeds: the thief
/// reopens them at the end its index names.
async fn sync_for_handoff(shard: &Shard, partition_id: u32, writer: &mut crate::storage::segment::SegmentWriter) {
    let mut logged = false;
    while let Err(error) = writer.sync().await {
        if !std::mem::replace(&mut logged, true) {
            log::warn!(shard = shard.id, "syncing partition {partition_id} for a move: {error}; retrying");
        }
        glommio::timer::sleep(std::time::Duration::from_millis(crate::config::STORAGE_RETRY_MS)).await;
    }
    if logged {
        log::info!(shard = shard.id, "partition {partition_id} synced for its move");
    }
}
