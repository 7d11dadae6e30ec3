//! The simulated shards, each running the engine's migration protocol: its own
//! [`Migrations`] state machine and [`PlacementTable`] copy, the partitions installed on it,
//! and the balancer's [`Ledger`]. They talk only through frames on the simulated [`Mesh`].
//!
//! What runs the engine's own code, and what is the simulator's:
//!
//! - the owner side is the engine's: a batch is applied by `partition::apply::apply_batch`
//!   (records, then markers, then `settle_grant`), a handoff is installed by
//!   `partition::apply::install_moved`, the effects are carried out by
//!   `partition::migration::carry_out`, and the balancer's bookkeeping is `balance::Ledger`.
//!   Batches are in the engine's record format (a tracer event is a record whose key is its
//!   source and whose payload is its sequence) and early records wait in the engine's
//!   `PendingRecords`;
//! - the transport is the simulator's: sources route each tracer event by their own placement
//!   copy into an open batch per owner and send every open batch at the end of each
//!   millisecond (the engine's flusher sends them within microseconds); a marker joins the open
//!   batch of its old owner and leaves at once, behind every event batched there (as
//!   `Ingress::send_marker`); frames travel the simulated mesh with random delays;
//! - the partitions are tracer logs ([`SimPartition`]): a partition keeps, per source, the next
//!   sequence it expects, so an append out of sequence is a lost, duplicated or reordered event
//!   the moment it happens.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use ahash::AHashMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::mesh::Mesh;
use crate::balance::report::{Ewma, PartitionLoad};
use crate::balance::rule::{BalanceConfig, Direction, Ledger, Migration, Refusal, ShardState, pick_partition};
use crate::config::STEAL_REQUEST_TIMEOUT_MS;
use crate::partition::apply::{self, Applied, OwnedPartitions, RecordOrder, ShardMigrations};
use crate::partition::migration::{self, Carrier, Effect, Marker, Migrations};
use crate::partition::{Placement, PlacementTable};
use crate::protocol::record::{RecordRef, encode_batch_record};

/// Most frames in flight at once. A migration puts about three frames per shard in flight
/// (placements, markers and their grants), so a hundred migrations starting together at 1024
/// shards is 300 K; a frame takes about 64 bytes on the wheel, 256 MiB at the limit.
pub const MESH_FRAMES_MAX: usize = 1 << 22;
/// How long a migration may stay in flight, and how long the mesh may take to drain at the end
/// of a run. A migration takes three mesh hops and a few applier turns: with the longest mesh
/// delay (a second) that is a few seconds.
pub const DRAIN_MS_MAX: u64 = 10_000;

/// One tracer event: the `sequence`-th event `source` emitted for `partition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracer {
    pub source: u16,
    pub partition: u32,
    pub sequence: u32,
}

/// A batch's credit grant: the batch's sequence on its (source, owner) channel, so the source
/// can check grants come back in order.
#[derive(Debug, PartialEq, Eq)]
pub struct SimGrant {
    sequence: u32,
}

impl Tracer {
    /// Encodes the event as a batch record of the engine's format: key = the source, payload =
    /// the sequence (little-endian).
    fn encode(self, batch: &mut Vec<u8>) {
        encode_batch_record(batch, self.partition, &self.source.to_le_bytes(), &self.sequence.to_le_bytes());
    }

    /// The event a record of `partition` encodes, if it is one ([`Tracer::encode`]).
    fn decode(partition: u32, record: &RecordRef<'_>) -> Option<Tracer> {
        let source = u16::from_le_bytes(record.key.try_into().ok()?);
        let sequence = u32::from_le_bytes(record.payload.try_into().ok()?);
        Some(Tracer { source, partition, sequence })
    }
}

/// A partition as it lives on a shard and travels in a handoff.
#[derive(Clone, Debug)]
pub struct SimPartition {
    /// The epoch of the placement it was installed under.
    epoch: u32,
    /// Measured events/s, as the owner's rule sees it.
    rate: Ewma,
    /// When its last owner handed it over (the thief's cooldown starts there).
    moved_ms: Option<u64>,
    /// The tracer log: per source, the sequence the next appended event must carry.
    appended: AHashMap<u16, u32>,
}

impl SimPartition {
    fn new(half_life_ms: u64) -> SimPartition {
        SimPartition { epoch: 0, rate: Ewma::new(half_life_ms), moved_ms: None, appended: AHashMap::new() }
    }

    /// Appends `event`, or returns the sequence the log expected instead.
    fn append(&mut self, event: Tracer) -> Result<(), u32> {
        let expected = self.appended.entry(event.source).or_insert(0);
        if event.sequence != *expected {
            return Err(*expected);
        }
        *expected += 1;
        Ok(())
    }
}

/// A data batch: tracer events as records of the engine's batch format, then the markers
/// behind them. Open while its source adds to it, numbered when sent.
#[derive(Debug, Default)]
pub struct SimBatch {
    sequence: u32,
    records: Vec<u8>,
    markers: Vec<Marker>,
}

/// A data batch as it travels. Most batches of a migration hold one marker and no event: they
/// travel without an allocation.
#[derive(Debug)]
pub enum Batch {
    Boxed(Box<SimBatch>),
    Marker { sequence: u32, marker: Marker },
}

impl Batch {
    fn sequence(&self) -> u32 {
        match self {
            Batch::Boxed(batch) => batch.sequence,
            Batch::Marker { sequence, .. } => *sequence,
        }
    }
}

/// A simulated batch is applied by the engine's `apply_batch`, as a mesh `DataBatch` is.
impl apply::Batch for Batch {
    type Grant = SimGrant;

    fn records(&self) -> &[u8] {
        match self {
            Batch::Boxed(batch) => &batch.records,
            Batch::Marker { .. } => &[],
        }
    }

    fn markers(&self) -> &[Marker] {
        match self {
            Batch::Boxed(batch) => &batch.markers,
            Batch::Marker { marker, .. } => std::slice::from_ref(marker),
        }
    }

    fn into_grant(self) -> SimGrant {
        SimGrant { sequence: self.sequence() }
    }
}

/// What travels on the simulated mesh. Small, as a hundred migrations at 1024 shards put a
/// million frames in flight at once: the large ones are boxed.
#[derive(Debug)]
pub enum SimFrame {
    Data(Batch),
    Grant(SimGrant),
    Placement { partition: u32, owner: u16, epoch: u32 },
    Handoff { partition: u32, epoch: u32, state: Box<SimPartition> },
}

/// One simulated shard.
#[derive(Debug)]
struct SimShard {
    migrations: ShardMigrations<SimGrant>,
    placement: PlacementTable,
    /// The partitions installed here; ordered, so loads are summed in the same order every run.
    installed: BTreeMap<u32, SimPartition>,
    /// Data batches received and not yet applied, with their source.
    apply_queue: VecDeque<(u16, Batch)>,
    ledger: Ledger,
}

/// A migration in flight as the simulator records it, apart from the shards' own records.
#[derive(Clone, Debug)]
struct Flight {
    partition: u32,
    owner: u16,
    thief: u16,
    epoch: u32,
    started_ms: u64,
    /// Whether the partition is on the mesh, in its handoff to the thief.
    handed_over: bool,
}

/// A deliberately broken executor of the effects, to prove the checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub enum Fault {
    None,
    /// The first marker a shard sends to another shard is never sent.
    DropMarker,
    /// The first data batch with events is held back and sent after the next batch of its
    /// channel: two data frames of one channel arrive swapped.
    SwapData,
    /// The first handoff is sent twice: the engine's own asserts catch the second.
    DuplicateHandoff,
}

/// What a run exercised of the protocol.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Coverage {
    pub migrations_completed: u64,
    /// Most migrations in flight at once.
    pub migrations_in_flight_max: u64,
    pub frames_sent: u64,
    pub tracer_events_emitted: u64,
    pub tracer_events_appended: u64,
    /// Tracer events that reached a thief before their partition and waited in its buffer.
    pub tracer_events_buffered: u64,
    /// Grants a thief held back until a handoff.
    pub grants_held: u64,
}

/// Fails the run, naming the seed: `fail!(self, "format", arguments...)` in a [`Cluster`]
/// method. It reads only `origin` and `now_ms`, so it may be used while a shard is borrowed.
macro_rules! fail {
    ($cluster:expr, $($argument:tt)*) => {
        $cluster.origin.fail($cluster.now_ms, format_args!($($argument)*))
    };
}

/// Which run a failure belongs to; a field apart from the shards, so a check can fail while it
/// borrows one of them.
#[derive(Clone, Copy, Debug)]
struct Origin {
    seed: u64,
    rebalance: bool,
}

impl Origin {
    fn fail(self, now_ms: u64, what: fmt::Arguments<'_>) -> ! {
        super::fail_with(self.seed, now_ms, self.rebalance, what)
    }
}

/// Every simulated shard and the mesh between them.
pub struct Cluster {
    origin: Origin,
    shard_count: u16,
    cooldown_ms: u64,
    fault: Fault,
    now_ms: u64,
    /// Whether a migration started, or a partition was handed over or installed, since the last
    /// [`Cluster::check`].
    changed: bool,
    shards: Vec<SimShard>,
    mesh: Mesh<SimFrame>,
    /// Open batches by (source, owner): a map, so they leave in the same order every run.
    open: BTreeMap<(u16, u16), Box<SimBatch>>,
    /// Shards with batches in their apply queue, in the order they got their first one.
    appliers_due: Vec<u16>,
    /// Per (source, owner), at `owner * shard_count + source` (the sources of one owner side by
    /// side, as a migration's markers all go to one owner). Eight bytes per pair of shards: 8 MiB
    /// at 1024 shards.
    channels: Vec<Channel>,
    /// The newest epoch each partition was moved under; `start` must use it plus one.
    newest_epoch: Vec<u32>,
    /// When each partition was last handed over, to check cooldowns apart from the rule's.
    last_moved_ms: Vec<Option<u64>>,
    flights: Vec<Flight>,
    /// Per (source, partition): the sequence of the next tracer event.
    emitted: AHashMap<(u16, u32), u32>,
    tracer_rng: StdRng,
    /// A data batch held back by [`Fault::SwapData`].
    swapped: Option<(u16, u16, Box<SimBatch>)>,
    effects: Vec<Effect<SimGrant>>,
    /// The grouping scratch of `apply_batch`, kept from batch to batch as the engine keeps it.
    record_order: RecordOrder,
    scratch_counts: Vec<u8>,
    /// Where each partition is, as of the last [`Cluster::locate`].
    scratch_locations: Vec<u16>,
    coverage: Coverage,
}

/// Data batches from a source to an owner.
#[derive(Clone, Copy, Debug, Default)]
struct Channel {
    batches_sent: u32,
    /// Grants the source got back; each must be the next batch's.
    grants_received: u32,
}

/// The settings a [`Cluster`] needs.
pub struct ClusterSettings {
    pub seed: u64,
    pub rebalance: bool,
    pub shard_count: u16,
    pub partition_count: u32,
    pub half_life_ms: u64,
    pub cooldown_ms: u64,
    pub mesh_delay_ms: u64,
    pub mesh_seed: u64,
    pub tracer_seed: u64,
    pub fault: Fault,
}

impl Cluster {
    /// Shards with the initial placement ([`PlacementTable::spread`]), each with its partitions
    /// installed, and an empty mesh.
    pub fn new(settings: &ClusterSettings) -> Cluster {
        let shard_count = settings.shard_count;
        let partition_count = settings.partition_count;
        let table = PlacementTable::spread(partition_count, shard_count);
        let shards = (0..shard_count)
            .map(|me| {
                let installed = table
                    .iter()
                    .filter(|(_, entry)| entry.owner == me)
                    .map(|(partition, _)| (partition, SimPartition::new(settings.half_life_ms)))
                    .collect();
                SimShard {
                    migrations: Migrations::new(me, shard_count),
                    placement: table.clone(),
                    installed,
                    apply_queue: VecDeque::new(),
                    ledger: Ledger::default(),
                }
            })
            .collect();
        let channel_count = usize::from(shard_count) * usize::from(shard_count);
        Cluster {
            origin: Origin { seed: settings.seed, rebalance: settings.rebalance },
            shard_count,
            cooldown_ms: settings.cooldown_ms,
            fault: settings.fault,
            now_ms: 0,
            changed: true,
            shards,
            mesh: Mesh::new(shard_count, settings.mesh_delay_ms, settings.mesh_seed),
            open: BTreeMap::new(),
            appliers_due: Vec::new(),
            channels: vec![Channel::default(); channel_count],
            newest_epoch: vec![0; partition_count as usize],
            last_moved_ms: vec![None; partition_count as usize],
            flights: Vec::new(),
            emitted: AHashMap::new(),
            tracer_rng: StdRng::seed_from_u64(settings.tracer_seed),
            swapped: None,
            effects: Vec::new(),
            record_order: RecordOrder::default(),
            scratch_counts: vec![0; partition_count as usize],
            scratch_locations: vec![0; partition_count as usize],
            coverage: Coverage::default(),
        }
    }

    /// Moves the simulated clock forward to `now_ms`.
    pub fn set_clock(&mut self, now_ms: u64) {
        assert!(now_ms >= self.now_ms, "the simulated clock went back");
        self.now_ms = now_ms;
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    pub fn coverage(&self) -> Coverage {
        Coverage { frames_sent: self.mesh.sent_count(), ..self.coverage.clone() }
    }

    /// `event_count` tracer events from random sources into their owners' open batches, each
    /// routed by its source's placement copy. Half go to partitions with a migration in flight,
    /// where the protocol has work to do; the rest to any partition.
    fn emit(&mut self, event_count: u32) {
        let partition_count = self.newest_epoch.len() as u32;
        for _ in 0..event_count {
            let source = self.tracer_rng.random_range(0..self.shard_count);
            let partition = if !self.flights.is_empty() && self.tracer_rng.random_bool(0.5) {
                self.flights[self.tracer_rng.random_range(0..self.flights.len())].partition
            } else {
                self.tracer_rng.random_range(0..partition_count)
            };
            let next = self.emitted.entry((source, partition)).or_insert(0);
            let event = Tracer { source, partition, sequence: *next };
            *next += 1;
            let owner = self.shards[usize::from(source)].placement.owner(partition);
            event.encode(&mut self.open_batch(source, owner).records);
            self.coverage.tracer_events_emitted += 1;
        }
    }

    /// Runs the shards from now until `end_ms`, millisecond by millisecond, with `event_count`
    /// tracer events spread evenly over the span: each millisecond its share of events is
    /// emitted, then every frame due is delivered, the batches queued meanwhile are applied, and
    /// the open batches are sent (the engine's flusher sends them within microseconds).
    pub fn run_until(&mut self, end_ms: u64, event_count: u32) {
        let start_ms = self.now_ms;
        assert!(end_ms >= start_ms);
        let span_ms = end_ms - start_ms + 1;
        for now_ms in start_ms..=end_ms {
            self.now_ms = now_ms;
            let (offset_ms, event_count) = (now_ms - start_ms, u64::from(event_count));
            let share = event_count * (offset_ms + 1) / span_ms - event_count * offset_ms / span_ms;
            self.emit(share as u32);
            self.settle();
        }
    }

    /// Handles everything due now, until nothing is.
    fn settle(&mut self) {
        loop {
            while let Some(envelope) = self.mesh.pop_due(self.now_ms) {
                self.receive(envelope.from, envelope.to, envelope.frame);
            }
            if self.run_appliers() {
                continue;
            }
            if self.open.is_empty() {
                return;
            }
            for ((source, owner), batch) in std::mem::take(&mut self.open) {
                self.send_batch(source, owner, batch);
            }
        }
    }

    /// Whether nothing is left to do: no frame, open batch or queued batch anywhere, no
    /// migration in flight and no grant held.
    pub fn is_quiet(&self) -> bool {
        self.mesh.is_empty()
            && self.open.is_empty()
            && self.appliers_due.is_empty()
            && self.swapped.is_none()
            && self.flights.is_empty()
            && self.shards.iter().all(|shard| !shard.migrations.is_busy() && shard.migrations.held_grant_count() == 0)
    }

    fn receive(&mut self, from: u16, to: u16, frame: SimFrame) {
        match frame {
            SimFrame::Data(batch) => {
                let shard = &mut self.shards[usize::from(to)];
                if shard.apply_queue.is_empty() {
                    self.appliers_due.push(to);
                }
                shard.apply_queue.push_back((from, batch));
            }
            SimFrame::Grant(grant) => self.on_grant(to, from, grant),
            SimFrame::Placement { partition, owner, epoch } => self.on_placement(to, partition, owner, epoch),
            SimFrame::Handoff { partition, epoch, state } => self.on_handoff(to, partition, epoch, *state),
        }
    }

    /// Every shard with queued batches applies them all, in arrival order. Returns whether any
    /// did (applying sends frames that may be due at once).
    fn run_appliers(&mut self) -> bool {
        if self.appliers_due.is_empty() {
            return false;
        }
        let mut due = std::mem::take(&mut self.appliers_due);
        for &owner in &due {
            while let Some((source, batch)) = self.shards[usize::from(owner)].apply_queue.pop_front() {
                self.apply(owner, source, batch);
            }
        }
        // Applying sends frames to the mesh only, so no queue filled meanwhile.
        assert!(self.appliers_due.is_empty());
        due.clear();
        self.appliers_due = due;
        true
    }

    /// Applies one batch with the engine's `apply_batch`: records, markers, grant; then carries
    /// out the effects with the engine's `carry_out`.
    fn apply(&mut self, owner: u16, source: u16, batch: Batch) {
        let mut effects = std::mem::take(&mut self.effects);
        let shard = &mut self.shards[usize::from(owner)];
        let held_count = shard.migrations.held_grant_count();
        let mut owned = SimOwned::new(&mut shard.installed, &mut self.record_order, 0);
        apply::apply_batch(&mut owned, &mut shard.migrations, source, batch, self.now_ms, &mut effects);
        let (appended, failure) = (owned.appended, owned.failure.take());
        if shard.migrations.held_grant_count() > held_count {
            self.coverage.grants_held += 1;
        }
        self.note_appends(owner, appended, failure);
        migration::carry_out(&mut effects, &mut SimCarrier { cluster: self, me: owner, moved_ms: None });
        self.effects = effects;
    }

    /// Counts what an apply or an install appended, and fails the run on an event out of
    /// sequence.
    fn note_appends(&mut self, owner: u16, appended: u64, failure: Option<(Tracer, u32)>) {
        self.coverage.tracer_events_appended += appended;
        if let Some((event, expected)) = failure {
            fail!(
                self,
                "{event:?} appended on shard {owner}, where the partition's log expected sequence {expected} from \
                 that source: an event was lost, duplicated or reordered"
            );
        }
    }

    fn send(&mut self, from: u16, to: u16, frame: SimFrame) {
        if self.mesh.len() >= MESH_FRAMES_MAX {
            fail!(self, "{} frames in flight, the most the mesh holds", self.mesh.len());
        }
        self.mesh.send(from, to, self.now_ms, frame);
    }

    fn channel(&self, source: u16, owner: u16) -> usize {
        usize::from(owner) * usize::from(self.shard_count) + usize::from(source)
    }

    /// The open batch of `source` for `owner`, opened if need be.
    fn open_batch(&mut self, source: u16, owner: u16) -> &mut SimBatch {
        self.open.entry((source, owner)).or_default()
    }

    /// As `Source::send_marker`: the marker joins the open batch for `to`, behind every event
    /// batched there, and the batch leaves at once.
    fn send_marker(&mut self, me: u16, to: u16, marker: Marker) {
        if self.fault == Fault::DropMarker && to != me {
            self.fault = Fault::None;
            return;
        }
        match self.open.remove(&(me, to)) {
            Some(mut batch) => {
                batch.markers.push(marker);
                self.send_batch(me, to, batch);
            }
            None => {
                let sequence = self.next_batch_sequence(me, to);
                self.send(me, to, SimFrame::Data(Batch::Marker { sequence, marker }));
            }
        }
    }

    /// Numbers the next batch of `source` for `owner`.
    fn next_batch_sequence(&mut self, source: u16, owner: u16) -> u32 {
        let channel = self.channel(source, owner);
        self.channels[channel].batches_sent += 1;
        self.channels[channel].batches_sent
    }

    fn send_batch(&mut self, source: u16, owner: u16, mut batch: Box<SimBatch>) {
        assert!(!batch.records.is_empty() || !batch.markers.is_empty(), "an empty batch");
        batch.sequence = self.next_batch_sequence(source, owner);
        if self.fault == Fault::SwapData && !batch.records.is_empty() {
            self.fault = Fault::None;
            self.swapped = Some((source, owner, batch));
            return;
        }
        self.send(source, owner, SimFrame::Data(Batch::Boxed(batch)));
        if self.swapped.as_ref().is_some_and(|(from, to, _)| (*from, *to) == (source, owner)) {
            let (_, _, held) = self.swapped.take().expect("checked above");
            self.send(source, owner, SimFrame::Data(Batch::Boxed(held)));
        }
    }

    /// A grant from `owner` reached `source`: it must be the next of their channel.
    fn on_grant(&mut self, source: u16, owner: u16, grant: SimGrant) {
        let channel = self.channels[self.channel(source, owner)];
        let expected = channel.grants_received + 1;
        if grant.sequence != expected {
            fail!(
                self,
                "shard {source} got the grant of batch {} from shard {owner}, expected batch {expected}: grants \
                 out of order",
                grant.sequence
            );
        }
        if grant.sequence > channel.batches_sent {
            fail!(self, "shard {source} got a grant from shard {owner} for a batch never sent");
        }
        let channel_index = self.channel(source, owner);
        self.channels[channel_index].grants_received = grant.sequence;
    }
}

/// A shard's installed tracer partitions as the engine's apply code sees them. An event out of
/// sequence is kept in `failure` (the first one) for the simulator to fail the run with.
struct SimOwned<'a> {
    installed: &'a mut BTreeMap<u32, SimPartition>,
    record_order: &'a mut RecordOrder,
    /// The epoch a partition installed now arrives at.
    epoch: u32,
    /// The partition a handoff installs now (its early records are appended to it first).
    handing_in: u32,
    appended: u64,
    failure: Option<(Tracer, u32)>,
    installed_twice: bool,
}

impl<'a> SimOwned<'a> {
    fn new(installed: &'a mut BTreeMap<u32, SimPartition>, record_order: &'a mut RecordOrder, epoch: u32) -> Self {
        SimOwned {
            installed,
            record_order,
            epoch,
            handing_in: u32::MAX,
            appended: 0,
            failure: None,
            installed_twice: false,
        }
    }

    fn append_checked(
        partition_id: u32,
        partition: &mut SimPartition,
        record: &RecordRef<'_>,
    ) -> Result<(), (Tracer, u32)> {
        let event = Tracer::decode(partition_id, record).expect("the simulator's batches hold tracer records");
        partition.append(event).map_err(|expected| (event, expected))
    }

    fn note(&mut self, outcome: Result<(), (Tracer, u32)>) {
        self.appended += 1;
        if let Err(failure) = outcome {
            self.failure.get_or_insert(failure);
        }
    }
}

impl OwnedPartitions for SimOwned<'_> {
    type Partition = SimPartition;

    fn append(&mut self, partition_id: u32, record: &RecordRef<'_>) -> Option<u64> {
        let partition = self.installed.get_mut(&partition_id)?;
        let outcome = SimOwned::append_checked(partition_id, partition, record);
        self.note(outcome);
        Some(record.log_record.len() as u64)
    }

    fn append_to(&mut self, partition: &mut SimPartition, record: &RecordRef<'_>) -> u64 {
        // The handoff's partition id is the one being installed: its records carry it.
        let partition_id = self.handing_in;
        let outcome = SimOwned::append_checked(partition_id, partition, record);
        self.note(outcome);
        record.log_record.len() as u64
    }

    fn is_retired(&self, _partition_id: u32) -> bool {
        false
    }

    fn install_moved(&mut self, partition_id: u32, partition: Box<SimPartition>) {
        let state = SimPartition { epoch: self.epoch, ..*partition };
        self.installed_twice |= self.installed.insert(partition_id, state).is_some();
    }

    fn take_record_order(&mut self) -> RecordOrder {
        std::mem::take(self.record_order)
    }

    fn put_record_order(&mut self, order: RecordOrder) {
        *self.record_order = order;
    }
}

/// A simulated shard's side of a migration step's effects, as the engine's `ShardCarrier`:
/// frames on the simulated mesh, the handoff, grants and the balancer's ledger.
struct SimCarrier<'a> {
    cluster: &'a mut Cluster,
    me: u16,
    /// When the partition whose handoff these effects follow was handed over.
    moved_ms: Option<u64>,
}

impl Carrier<SimGrant> for SimCarrier<'_> {
    fn send_placement(&mut self, to: u16, partition: u32, owner: u16, epoch: u32) {
        self.cluster.send(self.me, to, SimFrame::Placement { partition, owner, epoch });
    }

    fn send_marker(&mut self, to: u16, marker: Marker) {
        self.cluster.send_marker(self.me, to, marker);
    }

    fn send_handoff(&mut self, to: u16, partition: u32, epoch: u32) {
        self.cluster.send_handoff(self.me, to, partition, epoch);
    }

    fn grant(&mut self, source: u16, grant: SimGrant) {
        self.cluster.send(self.me, source, SimFrame::Grant(grant));
    }

    fn began(&mut self, migration: Migration) {
        self.cluster.shards[usize::from(self.me)].ledger.migration_began(migration);
    }

    fn ended(&mut self, partition: u32, direction: Direction, at_ms: u64) {
        let moved_ms = self.moved_ms.unwrap_or(at_ms);
        self.cluster.shards[usize::from(self.me)].ledger.migration_ended(partition, direction, at_ms, moved_ms);
    }
}

/// The migration protocol's steps.
impl Cluster {
    /// As the engine's `on_steal_request`: the owner refuses while its machine is busy, else the
    /// rule picks a partition (recording the migration as begun) and the machine starts moving
    /// it.
    pub fn answer_steal(
        &mut self,
        owner: u16,
        thief: u16,
        loads: &[PartitionLoad],
        events_per_s: (f64, f64),
        cfg: &BalanceConfig,
    ) -> Result<u32, Refusal> {
        let (owner_events_per_s, thief_events_per_s) = events_per_s;
        let shard = &self.shards[usize::from(owner)];
        // As `Balancer::answer_steal`: busy, or waiting for its own answer.
        if shard.ledger.refuses_steal(shard.migrations.is_busy()) {
            return Err(Refusal::AlreadyMigrating { partition: u32::MAX });
        }
        let ledger = &shard.ledger;
        let partition = pick_partition(
            loads,
            owner_events_per_s,
            thief_events_per_s,
            cfg,
            &ledger.cooldowns,
            &ledger.state,
            self.now_ms,
        )?;
        self.start_migration(owner, thief, partition);
        Ok(partition)
    }

    /// Step 1 on the owner, checked: the partition is installed there and not cooling down,
    /// and the new epoch is the newest so far plus one.
    fn start_migration(&mut self, owner: u16, thief: u16, partition: u32) {
        self.changed = true;
        let now_ms = self.now_ms;
        let index = partition as usize;
        if let Some(moved_ms) = self.last_moved_ms[index]
            && now_ms < moved_ms + self.cooldown_ms
        {
            fail!(self, "partition {partition} moves again {} ms after its last move", now_ms - moved_ms);
        }
        let newest_epoch = self.newest_epoch[index];
        let shard = &mut self.shards[usize::from(owner)];
        if !shard.installed.contains_key(&partition) {
            fail!(self, "shard {owner} gives away partition {partition}, which it does not have");
        }
        if shard.placement.get(partition) != (Placement { owner, epoch: newest_epoch }) {
            fail!(self, "shard {owner} moves partition {partition} with a stale placement");
        }
        let migration = Migration { partition, peer: thief, direction: Direction::Out, started_ms: now_ms };
        shard.ledger.state.begin(migration);
        let mut effects = std::mem::take(&mut self.effects);
        shard.migrations.start(&mut shard.placement, partition, thief, self.now_ms, &mut effects);
        let started = shard.placement.get(partition);
        if started != (Placement { owner: thief, epoch: newest_epoch + 1 }) {
            fail!(self, "partition {partition} started as {started:?} after epoch {newest_epoch}");
        }
        self.newest_epoch[index] = newest_epoch + 1;
        let epoch = newest_epoch + 1;
        self.flights.push(Flight { partition, owner, thief, epoch, started_ms: now_ms, handed_over: false });
        let in_flight_count = self.flights.len() as u64;
        self.coverage.migrations_in_flight_max = self.coverage.migrations_in_flight_max.max(in_flight_count);
        migration::carry_out(&mut effects, &mut SimCarrier { cluster: self, me: owner, moved_ms: None });
        self.effects = effects;
    }

    /// Step 2 on every shard but the owner: a placement update arrived.
    fn on_placement(&mut self, me: u16, partition: u32, owner: u16, epoch: u32) {
        if epoch > self.newest_epoch[partition as usize] {
            fail!(self, "shard {me} got partition {partition} at epoch {epoch}, which never started");
        }
        let mut effects = std::mem::take(&mut self.effects);
        let shard = &mut self.shards[usize::from(me)];
        let before = shard.placement.get(partition);
        shard.migrations.on_placement(&mut shard.placement, partition, owner, epoch, self.now_ms, &mut effects);
        let after = shard.placement.get(partition);
        if after.epoch < before.epoch {
            fail!(self, "shard {me}'s entry for partition {partition} went back: {before:?} to {after:?}");
        }
        self.check_table(me, partition);
        migration::carry_out(&mut effects, &mut SimCarrier { cluster: self, me, moved_ms: None });
        self.effects = effects;
    }

    /// Step 4 on the old owner, as `Shard::send_handoff`: the partition leaves with its state.
    fn send_handoff(&mut self, me: u16, thief: u16, partition: u32, epoch: u32) {
        self.changed = true;
        let Some(mut state) = self.shards[usize::from(me)].installed.remove(&partition) else {
            fail!(self, "shard {me} hands over partition {partition}, which it does not have");
        };
        // As the engine does once the handoff leaves (at once in memory).
        self.shards[usize::from(me)].migrations.handoff_sent(partition);
        state.moved_ms = Some(self.now_ms);
        self.last_moved_ms[partition as usize] = Some(self.now_ms);
        let flight = self.flights.iter_mut().find(|flight| flight.partition == partition && !flight.handed_over);
        match flight {
            Some(flight) if (flight.owner, flight.thief, flight.epoch) == (me, thief, epoch) => {
                flight.handed_over = true
            }
            _ => fail!(self, "shard {me} hands partition {partition} to {thief}, which no steal asked"),
        }
        if self.fault == Fault::DuplicateHandoff {
            self.fault = Fault::None;
            self.send(me, thief, SimFrame::Handoff { partition, epoch, state: Box::new(state.clone()) });
        }
        self.send(me, thief, SimFrame::Handoff { partition, epoch, state: Box::new(state) });
    }

    /// Step 5 on the thief: the engine's `install_moved` installs the partition, appends what
    /// waited for it and releases the held grants; the engine's `carry_out` does the rest.
    fn on_handoff(&mut self, me: u16, partition: u32, epoch: u32, state: SimPartition) {
        self.changed = true;
        if epoch != self.newest_epoch[partition as usize] {
            let newest_epoch = self.newest_epoch[partition as usize];
            fail!(self, "handoff of partition {partition} at epoch {epoch}, the newest is {newest_epoch}");
        }
        let mut effects = std::mem::take(&mut self.effects);
        let shard = &mut self.shards[usize::from(me)];
        let moved_ms = state.moved_ms.unwrap_or(self.now_ms);
        let mut owned = SimOwned::new(&mut shard.installed, &mut self.record_order, epoch);
        owned.handing_in = partition;
        let installed: Applied = apply::install_moved(
            &mut owned,
            &mut shard.migrations,
            partition,
            epoch,
            Box::new(state),
            self.now_ms,
            &mut effects,
        );
        let (appended, failure, twice) = (owned.appended, owned.failure.take(), owned.installed_twice);
        if twice {
            fail!(self, "partition {partition} installed twice on shard {me}");
        }
        self.coverage.tracer_events_buffered += installed.stored;
        self.note_appends(me, appended, failure);
        self.check_table(me, partition);
        migration::carry_out(&mut effects, &mut SimCarrier { cluster: self, me, moved_ms: Some(moved_ms) });
        self.effects = effects;
        let flight = self.flights.iter().position(|flight| flight.partition == partition);
        match flight.map(|index| self.flights.swap_remove(index)) {
            Some(flight) if flight.handed_over && (flight.thief, flight.epoch) == (me, epoch) => {}
            flight => fail!(self, "shard {me} installed partition {partition}, handed over as {flight:?}"),
        }
        self.coverage.migrations_completed += 1;
    }
}

/// The balancer's side: loads, steal requests and their answers.
impl Cluster {
    /// Folds each installed partition's true rate, with relative noise, into its average.
    pub fn measure(&mut self, rates: &[f64], noise_ratio: f64, rng: &mut StdRng) {
        let now_ms = self.now_ms;
        for shard in &mut self.shards {
            for (&partition, state) in &mut shard.installed {
                let noise = if noise_ratio > 0.0 { rng.random_range(-noise_ratio..=noise_ratio) } else { 0.0 };
                state.rate.update(rates[partition as usize] * (1.0 + noise), now_ms);
            }
        }
    }

    /// Fills `loads` with the measured loads of the partitions installed on `shard`, as the shard
    /// itself sees them, and returns their sum.
    pub fn gather_loads(&self, shard: u16, loads: &mut Vec<PartitionLoad>) -> f64 {
        loads.clear();
        for (&partition, state) in &self.shards[usize::from(shard)].installed {
            let events_per_s = state.rate.value();
            loads.push(PartitionLoad { partition, events_per_s, bytes_per_s: events_per_s * super::EVENT_SIZE_BYTES });
        }
        loads.iter().map(|load| load.events_per_s).sum()
    }

    /// Whether `shard` is in a migration, as the balancer records it or as the protocol does.
    pub fn is_migrating(&self, shard: u16) -> bool {
        let shard = &self.shards[usize::from(shard)];
        shard.ledger.state.is_migrating() || shard.migrations.is_busy()
    }

    /// What `shard` reports as `migrating`, as `Balancer::tick` does: in a
    /// migration, waiting for the answer to its steal request, or settling.
    pub fn reports_migrating(&self, shard: u16, now_ms: u64, cfg: &BalanceConfig) -> bool {
        let ledger = &self.shards[usize::from(shard)].ledger;
        self.is_migrating(shard) || ledger.pending_request.is_some() || ledger.state.settling(now_ms, cfg)
    }

    /// The state the thief side of the rule sees, if `thief` may ask at all: not while it is
    /// migrating, nor while a request of its own waits for an answer (as `Balancer::tick`).
    pub fn thief_state(&self, thief: u16) -> Option<&ShardState> {
        let ledger = &self.shards[usize::from(thief)].ledger;
        let waiting = ledger.awaiting_answer(self.now_ms, STEAL_REQUEST_TIMEOUT_MS);
        (!self.is_migrating(thief) && !waiting).then_some(&ledger.state)
    }

    pub fn note_request(&mut self, thief: u16, victim: u16) {
        self.shards[usize::from(thief)].ledger.request_sent(victim, self.now_ms);
    }

    pub fn on_refused(&mut self, thief: u16, victim: u16, refusal: &Refusal, cfg: &BalanceConfig) {
        self.shards[usize::from(thief)].ledger.refused(victim, refusal, self.now_ms, cfg);
    }

    pub fn prune_cooldowns(&mut self, cooldown_ms: u64) {
        for shard in &mut self.shards {
            shard.ledger.cooldowns.prune(self.now_ms, cooldown_ms);
        }
    }
}

/// The invariants.
impl Cluster {
    /// Checks the invariants that hold between steps. The others are checked as they happen:
    /// misrouted events and tracer sequences on every append, grant order on every grant, epochs
    /// and table entries on every start, placement update and install, cooldowns on every start.
    pub fn check(&mut self) {
        // Homes and epochs change only on a start, a handoff or an install: a step without any
        // has nothing new for `locate` to see.
        if self.changed {
            self.locate();
            self.changed = false;
        }
        self.check_balancer_records();
        self.check_flights();
    }

    /// Where every partition is: the shard that has it installed, or the thief its handoff is
    /// travelling to. Fails unless every partition is in exactly one of those places with the
    /// newest epoch of its moves (one less on the owner handing it over).
    pub fn locate(&mut self) -> &[u16] {
        let counts = &mut self.scratch_counts;
        let locations = &mut self.scratch_locations;
        counts.fill(0);
        let mut stale = None;
        for (shard_index, shard) in self.shards.iter().enumerate() {
            for (&partition, state) in &shard.installed {
                let index = partition as usize;
                counts[index] = counts[index].saturating_add(1);
                locations[index] = shard_index as u16;
                let handing_over = u32::from(shard.migrations.is_outgoing(partition));
                if state.epoch + handing_over != self.newest_epoch[index] {
                    stale = Some((partition, state.epoch));
                }
            }
        }
        // Handoffs on the mesh, as recorded when sent and until installed (scanning the mesh
        // for them would cost a million frames a tick while a hundred migrations start at 1024
        // shards). A handoff the mesh lost would leave its migration in flight: see
        // `check_flights`.
        for flight in self.flights.iter().filter(|flight| flight.handed_over) {
            let index = flight.partition as usize;
            counts[index] = counts[index].saturating_add(1);
            locations[index] = flight.thief;
            if flight.epoch != self.newest_epoch[index] {
                stale = Some((flight.partition, flight.epoch));
            }
        }
        if let Some(partition) = counts.iter().position(|&count| count != 1) {
            let count = counts[partition];
            fail!(self, "partition {partition} is installed or handed over {count} times: it must be exactly once");
        }
        if let Some((partition, epoch)) = stale {
            let newest_epoch = self.newest_epoch[partition as usize];
            fail!(self, "partition {partition} is at epoch {epoch}, but its newest move is at epoch {newest_epoch}");
        }
        &self.scratch_locations
    }

    /// After a placement update or an install on `me`: a partition `me` has, and is not handing
    /// over, is placed on `me` at its newest epoch in `me`'s own table.
    fn check_table(&self, me: u16, partition: u32) {
        let shard = &self.shards[usize::from(me)];
        if !shard.installed.contains_key(&partition) || shard.migrations.is_outgoing(partition) {
            return;
        }
        let expected = Placement { owner: me, epoch: self.newest_epoch[partition as usize] };
        let entry = shard.placement.get(partition);
        if entry != expected {
            fail!(self, "shard {me} has partition {partition}, its table says {entry:?}");
        }
    }

    /// A shard's balancer records at most one migration (its type holds one), that migration is
    /// in flight in the shard's machine, and every owner handing a partition over records it:
    /// a record left behind would keep the shard from stealing forever.
    fn check_balancer_records(&self) {
        for (me, shard) in self.shards.iter().enumerate() {
            let Some(migration) = shard.ledger.state.migration() else { continue };
            let in_flight = match migration.direction {
                Direction::Out => shard.migrations.is_outgoing(migration.partition),
                Direction::In => shard.migrations.is_incoming(migration.partition),
            };
            if !in_flight {
                fail!(self, "shard {me}'s balancer records {migration:?}, which its migration machine does not have");
            }
        }
        for flight in self.flights.iter().filter(|flight| !flight.handed_over) {
            let expected = Migration {
                partition: flight.partition,
                peer: flight.thief,
                direction: Direction::Out,
                started_ms: flight.started_ms,
            };
            if self.shards[usize::from(flight.owner)].ledger.state.migration() != Some(&expected) {
                fail!(self, "shard {} does not record {expected:?}", flight.owner);
            }
        }
    }

    /// No migration stays in flight for long.
    fn check_flights(&self) {
        for flight in &self.flights {
            if self.now_ms > flight.started_ms + DRAIN_MS_MAX {
                fail!(
                    self,
                    "the migration of partition {} from shard {} to shard {} is in flight since {} ms",
                    flight.partition,
                    flight.owner,
                    flight.thief,
                    flight.started_ms
                );
            }
        }
    }

    /// Once quiet: every tracer event emitted was appended exactly once (appends were checked
    /// in sequence, so equal counts mean nothing was lost) and every batch's grant came back.
    pub fn check_drained(&mut self) {
        assert!(self.is_quiet(), "check_drained before the mesh drained");
        self.locate();
        let lost = self
            .emitted
            .iter()
            .map(|(&(source, partition), &emitted_count)| {
                let home = &self.shards[usize::from(self.scratch_locations[partition as usize])];
                let appended_count = home.installed[&partition].appended.get(&source).copied().unwrap_or(0);
                (source, partition, emitted_count, appended_count)
            })
            .filter(|&(_, _, emitted_count, appended_count)| emitted_count != appended_count)
            .min();
        if let Some((source, partition, emitted_count, appended_count)) = lost {
            fail!(
                self,
                "shard {source} emitted {emitted_count} events for partition {partition}; {appended_count} were \
                 appended"
            );
        }
        let coverage = &self.coverage;
        if coverage.tracer_events_appended != coverage.tracer_events_emitted {
            fail!(
                self,
                "{} tracer events emitted, {} appended",
                coverage.tracer_events_emitted,
                coverage.tracer_events_appended
            );
        }
        let unreturned = self.channels.iter().position(|channel| channel.batches_sent != channel.grants_received);
        if let Some(index) = unreturned {
            let (owner, source) = (index / usize::from(self.shard_count), index % usize::from(self.shard_count));
            let channel = self.channels[index];
            fail!(
                self,
                "shard {source} sent {} batches to shard {owner} and got {} grants back",
                channel.batches_sent,
                channel.grants_received
            );
        }
    }

    /// Installs a second copy of `partition` on `shard`: a bug for the invariants to catch.
    #[cfg(test)]
    pub fn install_duplicate(&mut self, shard: u16, partition: u32) {
        let copy = SimPartition::new(1000);
        self.shards[usize::from(shard)].installed.insert(partition, copy);
        self.changed = true;
    }
}
