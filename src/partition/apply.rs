//! Applying a batch on its owner: every record goes to its partition's log,
//! records of partitions still migrating here are buffered, the batch's
//! markers advance migrations, and its credit grant is returned or held.
//! What must happen next comes back as data ([`Applied`] and the migration
//! [`Effect`]s); the shard carries it out.
//!
//! The owned partitions are anything that implements [`OwnedPartitions`]:
//! the engine's [`PartitionManager`], and the simulator's tracer partitions
//! (`spate simulate` applies its batches, in the engine's record format,
//! with these very functions: [`apply_batch`] and [`install_moved`]).
//!
//! A large batch is applied partition by partition ([`RecordOrder`]): its
//! records grouped by partition, each group in batch order. Offsets and
//! ordering are per partition, so nothing a reader can see changes; what
//! changes is the memory traffic. A batch holds records for every partition
//! the owner has, so applying it in arrival order touches a different
//! partition (its struct, its segment, the tail of its index and data)
//! at nearly every record, each a cache miss; grouped, a partition's lines
//! are fetched once per batch and its records are copied to one tail.
//! `benches/hot_path.rs` (`owner/apply_128_partitions` and
//! `..._grouped`): 43.9 ns/event in arrival order, 25.9 grouped, the
//! grouping included. A batch whose records already come in long runs of
//! one partition each (a Kafka producer's: [`Batch::in_runs`]) touches
//! each partition once per run in arrival order, so it is applied so,
//! without ordering it.

use crate::partition::migration::{Effect, Marker, Migrations};
use crate::partition::{Partition, PartitionManager};
use crate::protocol::record::{
    BATCH_HEADER_SIZE, BatchIter, LOG_HEADER_SIZE, RecordRef, batch_partition, decode_log_record, partition_at,
};
use crate::routing::{OffsetAsk, OffsetAsks};

/// Batches smaller than this are applied in arrival order: a small batch
/// touches few partitions, and grouping would cost more than it saves.
pub const GROUPED_APPLY_BYTES_MIN: usize = 4096;

/// The order in which a batch's records are applied: grouped by partition,
/// arrival order within each group (a counting sort of record positions).
/// Kept by the shard and reused, so applying allocates nothing once it has
/// seen its largest batch (`records` holds 8 bytes and `order` 4 bytes per
/// record of it, `counts` 4 bytes per partition id:
/// [`crate::config::Config::apply_order_bytes`]).
#[derive(Debug, Default)]
pub struct RecordOrder {
    /// Per partition id + 1: records, then (prefix sums) where its group starts.
    counts: Vec<u32>,
    /// `(partition, position)` of every record, in batch order.
    records: Vec<(u32, u32)>,
    /// Record positions in application order.
    order: Vec<u32>,
}

// The memory formula counts the order's bytes per record and per partition id.
const _: () = assert!(
    std::mem::size_of::<(u32, u32)>() + std::mem::size_of::<u32>()
        <= crate::config::limits::APPLY_ORDER_BYTES_PER_RECORD
        && std::mem::size_of::<u32>() <= crate::config::limits::APPLY_ORDER_BYTES_PER_PARTITION
);

impl RecordOrder {
    /// Orders the records of `batch` (batch records, as
    /// [`crate::protocol::record`] encodes them); returns their positions in
    /// `batch`, grouped by partition, arrival order within a group.
    pub fn group(&mut self, batch: &[u8]) -> &[u32] {
        self.records.clear();
        let mut position = 0;
        let mut partition_end = 0;
        while position < batch.len() {
            // Only the record's partition and size are read here (its
            // header): an extended record is decoded once, as it is applied.
            let header: &[u8; BATCH_HEADER_SIZE] = batch
                .get(position..position + BATCH_HEADER_SIZE)
                .and_then(|header| header.try_into().ok())
                .expect("a batch record header");
            let partition = batch_partition(u32::from_le_bytes([header[0], header[1], header[2], header[3]]));
            let key_size = usize::from(u16::from_le_bytes([header[4], header[5]]));
            let payload_size = u32::from_le_bytes([header[6], header[7], header[8], header[9]]) as usize;
            let position_u32 = u32::try_from(position).expect("a batch is smaller than 4 GiB");
            self.records.push((partition, position_u32));
            partition_end = partition_end.max(partition as usize + 1);
            position += BATCH_HEADER_SIZE + key_size + payload_size;
            assert!(position <= batch.len(), "batches hold whole records");
        }
        if self.counts.len() < partition_end + 1 {
            self.counts.resize(partition_end + 1, 0);
        }
        let counts = &mut self.counts[..partition_end + 1];
        counts.fill(0);
        for &(partition, _) in &self.records {
            counts[partition as usize + 1] += 1;
        }
        for index in 1..counts.len() {
            counts[index] += counts[index - 1];
        }
        self.order.clear();
        self.order.resize(self.records.len(), 0);
        for &(partition, position) in &self.records {
            let slot = &mut counts[partition as usize];
            self.order[*slot as usize] = position;
            *slot += 1;
        }
        &self.order
    }
}

/// Log records that reached this shard for a partition still migrating to
/// it, in arrival order. Bounded by the sources' credit windows (their
/// grants are held until the partition is installed).
#[derive(Debug, Default)]
pub struct PendingRecords {
    bytes: Vec<u8>,
    count: u64,
}

impl PendingRecords {
    pub fn push(&mut self, log_record: &[u8]) {
        self.bytes.extend_from_slice(log_record);
        self.count += 1;
    }

    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// The migration state machine as the engine (and the simulator) uses it.
pub type ShardMigrations<G> = Migrations<G, PendingRecords>;

/// The partitions one shard owns, as applying sees them.
pub trait OwnedPartitions {
    /// One owned partition, as it travels in a handoff.
    type Partition;
    /// Appends a record to an owned partition; the log bytes it added, or
    /// `None` when the partition is not owned here.
    fn append(&mut self, partition_id: u32, record: &RecordRef<'_>) -> Option<u64>;
    /// Appends a record to a partition that is not installed yet (a
    /// handoff's, before its early records follow it).
    fn append_to(&mut self, partition: &mut Self::Partition, record: &RecordRef<'_>) -> u64;
    /// Whether the partition belongs to a deleted stream: records still in
    /// flight for it are dropped.
    fn is_retired(&self, partition_id: u32) -> bool;
    /// Installs a partition that arrived in a handoff.
    fn install_moved(&mut self, partition_id: u32, partition: Box<Self::Partition>);
    /// The scratch space a large batch is grouped in (kept to be reused;
    /// [`OwnedPartitions::put_record_order`] gives it back).
    fn take_record_order(&mut self) -> RecordOrder;
    fn put_record_order(&mut self, order: RecordOrder);
    /// An owned partition's next offset (the one its next append gets) and
    /// its earliest readable one; `None` when it is not owned here. Asked
    /// only for records a source asked the offset of ([`OffsetAsk`]).
    fn offsets(&self, _partition_id: u32) -> Option<(u64, u64)> {
        None
    }
    /// A hint that a record of `partition_id` is appended soon: starts
    /// fetching what that touches. Changes nothing.
    fn prefetch(&self, _partition_id: u32) {}
}

impl OwnedPartitions for PartitionManager {
    type Partition = Partition;

    #[inline]
    fn append(&mut self, partition_id: u32, record: &RecordRef<'_>) -> Option<u64> {
        PartitionManager::append(self, partition_id, record)
    }

    fn append_to(&mut self, partition: &mut Partition, record: &RecordRef<'_>) -> u64 {
        partition.append(record, self.arrival_ms)
    }

    fn is_retired(&self, partition_id: u32) -> bool {
        PartitionManager::is_retired(self, partition_id)
    }

    fn install_moved(&mut self, partition_id: u32, partition: Box<Partition>) {
        self.install(partition_id, partition);
        // What it brought and what waited for it go to its files.
        self.mark_dirty(partition_id);
    }

    fn take_record_order(&mut self) -> RecordOrder {
        std::mem::take(&mut self.record_order)
    }

    fn put_record_order(&mut self, order: RecordOrder) {
        self.record_order = order;
    }

    fn offsets(&self, partition_id: u32) -> Option<(u64, u64)> {
        let partition = self.get(partition_id)?;
        Some((partition.log.next_offset(), partition.log.earliest_offset()))
    }

    #[inline]
    fn prefetch(&self, partition_id: u32) {
        if let Some(partition) = self.get(partition_id) {
            partition.prefetch();
        }
    }
}

/// What applying a batch stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    pub stored: u64,
    /// Log record bytes appended.
    pub stored_bytes: u64,
    /// Records of deleted streams' partitions, dropped.
    pub discarded: u64,
}

/// A batch as the owner applies it: records, the markers behind them, and
/// the credit grant it turns into once applied (which takes the batch's
/// buffer back to its source for reuse).
pub trait Batch {
    type Grant;
    /// Batch records ([`crate::protocol::record`]).
    fn records(&self) -> &[u8];
    fn markers(&self) -> &[Marker];
    fn into_grant(self) -> Self::Grant;
    /// The records whose offsets the source asked for, to be answered as
    /// they are applied (see [`OffsetAsk`]); none unless the batch has them.
    fn take_offset_asks(&mut self) -> OffsetAsks {
        None
    }
    /// Puts the answered asks back, to leave with the grant.
    fn put_offset_asks(&mut self, _asks: OffsetAsks) {}
    /// Its records came in long runs of one partition each
    /// ([`crate::routing::DataBatch::in_runs`]): applied in arrival order
    /// even when large, as ordering them by partition would gain nothing.
    fn in_runs(&self) -> bool {
        false
    }
}

/// Applies one batch from `source`: its records, then its markers, then its
/// grant (returned or held). Effects for the shard are appended to `effects`.
pub fn apply_batch<B: Batch, O: OwnedPartitions>(
    partitions: &mut O,
    migrations: &mut ShardMigrations<B::Grant>,
    source: u16,
    mut batch: B,
    now_ms: u64,
    effects: &mut Vec<Effect<B::Grant>>,
) -> Applied {
    let mut applied = Applied::default();
    // Incoming partitions this batch carried records for (almost always
    // none; a Vec that stays empty does not allocate).
    let mut held_for: Vec<u32> = Vec::new();
    let mut asks = batch.take_offset_asks();
    let in_runs = batch.in_runs();
    let records = batch.records();
    let asked = asks.as_deref_mut().filter(|asks| !asks.is_empty());
    if records.len() >= GROUPED_APPLY_BYTES_MIN && !in_runs {
        let mut order = partitions.take_record_order();
        let mut answers = Answers::new(asked, records, true);
        let positions = order.group(records);
        for (index, &position) in positions.iter().enumerate() {
            let (partition_id, record) =
                BatchIter::new(&records[position as usize..]).next().expect("grouping found a record here");
            prefetch_group_ahead(partitions, records, positions, index);
            answers.answer(position, partition_id, partitions);
            apply_record(partitions, migrations, source, partition_id, &record, &mut applied, &mut held_for);
        }
        answers.finish();
        partitions.put_record_order(order);
    } else {
        let mut answers = Answers::new(asked, records, false);
        let mut position = 0;
        for (partition_id, record) in BatchIter::new(records) {
            answers.answer(position, partition_id, partitions);
            position += (BATCH_HEADER_SIZE - LOG_HEADER_SIZE + record.log_record.len()) as u32;
            apply_record(partitions, migrations, source, partition_id, &record, &mut applied, &mut held_for);
        }
    }
    batch.put_offset_asks(asks);
    for marker in batch.markers() {
        migrations.on_marker(source, *marker, now_ms, effects);
    }
    migrations.settle_grant(source, batch.into_grant(), held_for, effects);
    applied
}

/// How many records ahead of the one applied a grouped batch prefetches the
/// partition of: far enough for its lines to arrive while the records in
/// between are applied (a few hundred ns), near enough to still be cached.
const PREFETCH_RECORDS_AHEAD: usize = 4;

/// Prefetches the partition of the record [`PREFETCH_RECORDS_AHEAD`] after
/// `index` in a grouped batch when that record starts its partition's group
/// (the records after it in the group find everything cached).
#[inline]
fn prefetch_group_ahead<O: OwnedPartitions>(partitions: &O, records: &[u8], positions: &[u32], index: usize) {
    let ahead = index + PREFETCH_RECORDS_AHEAD;
    if let Some(&position) = positions.get(ahead)
        && let Some(partition_id) = partition_at(records, position as usize)
        && partition_at(records, positions[ahead - 1] as usize) != Some(partition_id)
    {
        partitions.prefetch(partition_id);
    }
}

/// A batch's offset asks as its records are applied: each asked record's
/// offset is read just before it is appended. The asks are in position
/// order; a grouped batch is applied partition by partition, so they are
/// sorted the same way first (by partition, then position) and back after,
/// and either way one cursor finds each ask as its record comes: a small
/// cost per batch with asks, one branch per record without.
struct Answers<'a> {
    asks: Option<&'a mut [OffsetAsk]>,
    next: usize,
}

impl<'a> Answers<'a> {
    fn new(asks: Option<&'a mut Vec<OffsetAsk>>, records: &[u8], grouped: bool) -> Answers<'a> {
        let mut asks = asks.map(|asks| asks.as_mut_slice());
        if grouped && let Some(asks) = asks.as_deref_mut() {
            let partition_of = |position: u32| partition_at(records, position as usize).unwrap_or(u32::MAX);
            asks.sort_unstable_by_key(|ask| (partition_of(ask.position), ask.position));
        }
        Answers { asks, next: 0 }
    }

    /// The record at `position`, of `partition_id`, is applied next.
    #[inline]
    fn answer<O: OwnedPartitions>(&mut self, position: u32, partition_id: u32, partitions: &O) {
        let Some(asks) = self.asks.as_deref_mut() else { return };
        if let Some(ask) = asks.get_mut(self.next)
            && ask.position == position
        {
            if let Some((next_offset, earliest_offset)) = partitions.offsets(partition_id) {
                ask.offset = next_offset as i64;
                ask.log_start_offset = earliest_offset as i64;
            }
            self.next += 1;
        }
    }

    /// Puts the asks back in position order, as their source keeps them.
    fn finish(self) {
        if let Some(asks) = self.asks {
            debug_assert_eq!(self.next, asks.len(), "every ask is of a record in the batch");
            asks.sort_unstable_by_key(|ask| ask.position);
        }
    }
}

/// Applies one record of a batch from `source`: appends it to its
/// partition, or buffers it for a partition migrating here (noting it in
/// `held_for`), or discards it for a deleted stream.
fn apply_record<G, O: OwnedPartitions>(
    partitions: &mut O,
    migrations: &mut ShardMigrations<G>,
    source: u16,
    partition_id: u32,
    record: &RecordRef<'_>,
    applied: &mut Applied,
    held_for: &mut Vec<u32>,
) {
    if let Some(bytes) = partitions.append(partition_id, record) {
        applied.stored += 1;
        applied.stored_bytes += bytes;
    } else if partitions.is_retired(partition_id) {
        // In flight when its stream was deleted.
        applied.discarded += 1;
    } else if let Some(pending) = migrations.pending_mut(partition_id) {
        pending.push(record.log_record);
        if !held_for.contains(&partition_id) {
            held_for.push(partition_id);
        }
    } else {
        // Routing follows the placement table and migrations put markers
        // behind every event routed to an old owner, so this is a bug,
        // never a client's doing: stop rather than lose the event.
        panic!("batch from shard {source} for partition {partition_id}, neither owned nor incoming here");
    }
}

/// Step 5 of a migration on the thief: the handoff of `partition_id` at
/// `epoch` arrived. Installs the partition, appends the records that
/// arrived for it before, in arrival order, and releases the grants held
/// for them (in `effects`).
pub fn install_moved<O: OwnedPartitions, G>(
    partitions: &mut O,
    migrations: &mut ShardMigrations<G>,
    partition_id: u32,
    epoch: u32,
    partition: Box<O::Partition>,
    now_ms: u64,
    effects: &mut Vec<Effect<G>>,
) -> Applied {
    let pending = migrations.on_handoff(partition_id, epoch, now_ms, effects);
    install_handoff(partitions, partition_id, partition, pending)
}

/// Installs a partition that was handed over, then appends the records
/// that arrived for it before the handoff, in arrival order.
pub fn install_handoff<O: OwnedPartitions>(
    partitions: &mut O,
    partition_id: u32,
    mut partition: Box<O::Partition>,
    pending: PendingRecords,
) -> Applied {
    let mut applied = Applied { stored: pending.count, stored_bytes: 0, discarded: 0 };
    let mut position = 0;
    while position < pending.bytes.len() {
        let record = decode_log_record(&pending.bytes[position..]).expect("pending holds whole records");
        applied.stored_bytes += partitions.append_to(&mut partition, &record);
        position += record.log_record.len();
    }
    partitions.install_moved(partition_id, partition);
    applied
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{PartitionLog, PlacementTable};
    use crate::protocol::record::encode_batch_record;

    fn manager(owned: &[u32]) -> PartitionManager {
        let mut manager = PartitionManager::new(8);
        for &partition in owned {
            manager.install(partition, Box::new(Partition::new(PartitionLog::in_memory(1 << 16, 1 << 12), 500)));
        }
        manager
    }

    /// A test batch: records, no markers, and a grant that is a number.
    struct TestBatch(Vec<u8>, u64);

    impl Batch for TestBatch {
        type Grant = u64;
        fn records(&self) -> &[u8] {
            &self.0
        }
        fn markers(&self) -> &[Marker] {
            &[]
        }
        fn into_grant(self) -> u64 {
            self.1
        }
    }

    fn batch(events: &[(u32, &str)]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for &(partition, payload) in events {
            encode_batch_record(&mut bytes, partition, b"k", payload.as_bytes());
        }
        bytes
    }

    fn payloads(partitions: &PartitionManager, partition: u32) -> Vec<String> {
        let mut seen = Vec::new();
        partitions.get(partition).unwrap().log.memory().read(0, |_, record| {
            seen.push(String::from_utf8(record.payload.to_vec()).unwrap());
            true
        });
        seen
    }

    /// Records of owned partitions are stored in batch order, and the grant
    /// goes straight back.
    #[test]
    fn owned_records_are_stored_and_credited() {
        let mut partitions = manager(&[0, 2]);
        let mut migrations: ShardMigrations<u64> = Migrations::new(0, 2);
        let records = batch(&[(0, "a"), (2, "b"), (0, "c")]);
        let mut effects = Vec::new();
        let applied = apply_batch(&mut partitions, &mut migrations, 1, TestBatch(records, 7), 0, &mut effects);
        assert_eq!(applied.stored, 3);
        assert_eq!(payloads(&partitions, 0), ["a", "c"]);
        assert_eq!(effects, [Effect::Grant { source: 1, grant: 7 }]);
    }

    /// A batch large enough to be applied grouped by partition stores every
    /// record, each partition's in batch order, and buffers a migrating
    /// partition's records in batch order too.
    #[test]
    fn grouped_batches_keep_each_partitions_order() {
        let mut table = PlacementTable::spread(8, 2);
        let mut partitions = manager(&[0, 3, 5]);
        let mut migrations: ShardMigrations<u64> = Migrations::new(1, 2);
        let mut effects = Vec::new();
        migrations.on_placement(&mut table, 6, 1, 1, 0, &mut effects);
        effects.clear();
        let owners = [5, 0, 6, 3, 0, 6, 5, 3];
        let events: Vec<(u32, String)> =
            (0..2000).map(|index| (owners[index * 7 % owners.len()], format!("event-{index}"))).collect();
        let borrowed: Vec<(u32, &str)> =
            events.iter().map(|(partition, payload)| (*partition, payload.as_str())).collect();
        let records = batch(&borrowed);
        assert!(records.len() >= GROUPED_APPLY_BYTES_MIN);
        let applied = apply_batch(&mut partitions, &mut migrations, 0, TestBatch(records, 4), 0, &mut effects);
        let expected = |partition: u32| -> Vec<String> {
            events.iter().filter(|(owner, _)| *owner == partition).map(|(_, payload)| payload.clone()).collect()
        };
        for partition in [0, 3, 5] {
            assert_eq!(payloads(&partitions, partition), expected(partition), "partition {partition}");
        }
        assert_eq!(applied.stored, 2000 - expected(6).len() as u64);
        let pending = migrations.pending_mut(6).expect("partition 6 is migrating here");
        assert_eq!(pending.count(), expected(6).len() as u64);
        let mut buffered = Vec::new();
        let mut position = 0;
        while position < pending.bytes.len() {
            let record = decode_log_record(&pending.bytes[position..]).unwrap();
            buffered.push(String::from_utf8(record.payload.to_vec()).unwrap());
            position += record.log_record.len();
        }
        assert_eq!(buffered, expected(6));
    }

    /// The grouping is a stable counting sort: positions grouped by
    /// partition in ascending partition order, batch order within a group,
    /// and the scratch space is reused from one batch to the next.
    #[test]
    fn record_order_groups_stably() {
        let mut order = RecordOrder::default();
        let first = batch(&[(3, "a"), (1, "b"), (3, "c"), (0, "d"), (1, "e")]);
        let payloads_in_order = |bytes: &[u8], positions: &[u32]| -> Vec<String> {
            positions
                .iter()
                .map(|&position| {
                    let (_, record) = BatchIter::new(&bytes[position as usize..]).next().unwrap();
                    String::from_utf8(record.payload.to_vec()).unwrap()
                })
                .collect()
        };
        let positions = order.group(&first).to_vec();
        assert_eq!(payloads_in_order(&first, &positions), ["d", "b", "e", "a", "c"]);
        let second = batch(&[(7, "x"), (2, "y")]);
        let positions = order.group(&second).to_vec();
        assert_eq!(payloads_in_order(&second, &positions), ["y", "x"]);
        assert!(order.group(&[]).is_empty());
    }

    /// A large batch can be applied either way: grouped by partition or,
    /// when its source says its records came in runs, in arrival order;
    /// each partition gets the same records in the same order either way
    /// (extended records among plain ones, which the grouping reads only
    /// the sizes of).
    #[test]
    fn batches_in_runs_apply_as_grouped_ones_do() {
        struct RunsBatch(Vec<u8>, bool);
        impl Batch for RunsBatch {
            type Grant = ();
            fn records(&self) -> &[u8] {
                &self.0
            }
            fn markers(&self) -> &[Marker] {
                &[]
            }
            fn into_grant(self) {}
            fn in_runs(&self) -> bool {
                self.1
            }
        }
        let mut records = Vec::new();
        let mut expected: Vec<Vec<String>> = vec![Vec::new(); 8];
        for run in 0..24u32 {
            let partition = [0, 3, 5][run as usize % 3];
            for index in 0..40 {
                let payload = format!("run-{run}-{index}");
                if index % 2 == 0 {
                    let headers: &[u8] = if index % 4 == 0 { &[0] } else { b"\x02\x02h\x02x" };
                    let record = crate::protocol::record::ExtendedRecord {
                        key: (index % 3 != 0).then_some(&b"key"[..]),
                        value: Some(payload.as_bytes()),
                        headers,
                        timestamp_ms: 7,
                    };
                    crate::protocol::record::encode_extended_batch_record(&mut records, partition, &record);
                } else {
                    encode_batch_record(&mut records, partition, b"k", payload.as_bytes());
                }
                expected[partition as usize].push(payload);
            }
        }
        assert!(records.len() >= GROUPED_APPLY_BYTES_MIN);
        for in_runs in [false, true] {
            let mut partitions = manager(&[0, 3, 5]);
            let mut migrations: ShardMigrations<()> = Migrations::new(1, 2);
            let batch = RunsBatch(records.clone(), in_runs);
            let applied = apply_batch(&mut partitions, &mut migrations, 0, batch, 0, &mut Vec::new());
            assert_eq!(applied.stored, 24 * 40);
            for partition in [0, 3, 5] {
                assert_eq!(payloads(&partitions, partition), expected[partition as usize], "in_runs {in_runs}");
            }
        }
    }

    /// Records for a partition migrating here wait, with their grant, until
    /// the handoff installs the partition; then they follow its log in order.
    #[test]
    fn early_records_wait_for_the_handoff() {
        let mut table = PlacementTable::spread(8, 2);
        let mut partitions = manager(&[1]);
        let mut migrations: ShardMigrations<u64> = Migrations::new(1, 2);
        let mut effects = Vec::new();
        migrations.on_placement(&mut table, 2, 1, 1, 0, &mut effects);
        effects.clear();
        let records = batch(&[(1, "x"), (2, "late1"), (2, "late2")]);
        let applied = apply_batch(&mut partitions, &mut migrations, 0, TestBatch(records, 9), 0, &mut effects);
        assert_eq!(applied.stored, 1);
        assert!(effects.is_empty(), "the grant is held");
        let mut moved = Box::new(Partition::new(PartitionLog::in_memory(1 << 16, 1 << 12), 500));
        moved.append(&crate::protocol::record::BatchIter::new(&batch(&[(2, "early")])).next().unwrap().1, 0);
        let pending = migrations.on_handoff(2, 1, 3, &mut effects);
        let installed = install_handoff(&mut partitions, 2, moved, pending);
        assert_eq!(installed.stored, 2);
        assert_eq!(payloads(&partitions, 2), ["early", "late1", "late2"]);
        assert!(effects.contains(&Effect::Grant { source: 0, grant: 9 }));
    }

    /// A test batch that asks for the offsets of some of its records.
    struct AskingBatch(Vec<u8>, OffsetAsks);

    impl Batch for AskingBatch {
        type Grant = Vec<OffsetAsk>;
        fn records(&self) -> &[u8] {
            &self.0
        }
        fn markers(&self) -> &[Marker] {
            &[]
        }
        fn into_grant(self) -> Vec<OffsetAsk> {
            self.1.map(|asks| *asks).unwrap_or_default()
        }
        fn take_offset_asks(&mut self) -> OffsetAsks {
            self.1.take()
        }
        fn put_offset_asks(&mut self, asks: OffsetAsks) {
            self.1 = asks;
        }
    }

    /// Applies `events` as one batch asking for the offsets of the records
    /// at `asked` (indexes into `events`); the asks' (offset, log start) in
    /// position order, as the grant returns them.
    fn answered(
        partitions: &mut PartitionManager,
        migrations: &mut ShardMigrations<Vec<OffsetAsk>>,
        events: &[(u32, String)],
        asked: &[usize],
    ) -> Vec<(i64, i64)> {
        let mut bytes = Vec::new();
        let mut asks = Vec::new();
        for (index, (partition, payload)) in events.iter().enumerate() {
            if asked.contains(&index) {
                asks.push(OffsetAsk { sequence: 1, position: bytes.len() as u32, offset: -1, log_start_offset: -1 });
            }
            encode_batch_record(&mut bytes, *partition, b"k", payload.as_bytes());
        }
        let mut effects = Vec::new();
        apply_batch(partitions, migrations, 0, AskingBatch(bytes, Some(Box::new(asks))), 0, &mut effects);
        let Some(Effect::Grant { grant, .. }) = effects.pop() else { panic!("the grant goes back") };
        assert!(grant.windows(2).all(|pair| pair[0].position < pair[1].position), "in position order");
        grant.iter().map(|ask| (ask.offset, ask.log_start_offset)).collect()
    }

    /// An owner answers each asked record with the offset it stored it at
    /// (and its partition's earliest offset), whether the batch is applied
    /// in arrival order or grouped by partition; a record that is not
    /// stored (its stream was deleted) is answered -1.
    #[test]
    fn asked_records_are_answered_with_their_offsets() {
        let mut partitions = manager(&[0, 3]);
        partitions.retire(6);
        let mut migrations: ShardMigrations<Vec<OffsetAsk>> = Migrations::new(1, 2);
        let small: Vec<(u32, String)> = [(3, "a"), (0, "b"), (3, "c"), (6, "d"), (0, "e")]
            .iter()
            .map(|&(partition, payload)| (partition, payload.to_string()))
            .collect();
        assert_eq!(
            answered(&mut partitions, &mut migrations, &small, &[0, 2, 3, 4]),
            [(0, 0), (1, 0), (-1, -1), (1, 0)]
        );
        let owners = [3, 0, 6, 0, 3];
        let large: Vec<(u32, String)> =
            (0..1000).map(|index| (owners[index % owners.len()], format!("event-{index}"))).collect();
        // Partition 3 holds 2 before this batch, 0 holds 2: index 0 is p3's
        // 3rd (offset 2), 1 is p0's 3rd, 4 is p3's 4th, 999 is p3 again
        // (its 400th of the batch), 2 is p6's.
        let asked = [0, 1, 2, 4, 999];
        assert_eq!(
            answered(&mut partitions, &mut migrations, &large, &asked),
            [(2, 0), (2, 0), (-1, -1), (3, 0), (401, 0)]
        );
        assert_eq!(partitions.get(3).unwrap().log.next_offset(), 402);
    }

    /// A record for a partition neither owned nor incoming is a routing bug.
    #[test]
    #[should_panic(expected = "neither owned nor incoming")]
    fn misrouted_record_is_a_bug() {
        let mut partitions = manager(&[0]);
        let mut migrations: ShardMigrations<u64> = Migrations::new(0, 2);
        let records = batch(&[(3, "lost?")]);
        apply_batch(&mut partitions, &mut migrations, 1, TestBatch(records, 1), 0, &mut Vec::new());
    }

    /// Partitions that only record which partitions they were asked to prefetch.
    #[derive(Default)]
    struct PrefetchRecorder(std::cell::RefCell<Vec<u32>>);

    impl OwnedPartitions for PrefetchRecorder {
        type Partition = ();
        fn append(&mut self, _: u32, _: &RecordRef<'_>) -> Option<u64> {
            unreachable!()
        }
        fn append_to(&mut self, _: &mut (), _: &RecordRef<'_>) -> u64 {
            unreachable!()
        }
        fn is_retired(&self, _: u32) -> bool {
            unreachable!()
        }
        fn install_moved(&mut self, _: u32, _: Box<()>) {
            unreachable!()
        }
        fn take_record_order(&mut self) -> RecordOrder {
            unreachable!()
        }
        fn put_record_order(&mut self, _: RecordOrder) {}
        fn prefetch(&self, partition_id: u32) {
            self.0.borrow_mut().push(partition_id);
        }
    }

    /// A grouped batch prefetches each partition once, PREFETCH_RECORDS_AHEAD records before
    /// its group starts (the first groups, within reach of the start, are not prefetched).
    #[test]
    fn a_grouped_batch_prefetches_each_group_ahead_of_it() {
        let events: Vec<(u32, &str)> =
            [7, 3, 7, 9, 3, 7, 12, 12, 5, 9, 1, 12].iter().map(|&partition| (partition, "x")).collect();
        let records = batch(&events);
        let mut order = RecordOrder::default();
        let positions = order.group(&records).to_vec();
        let recorder = PrefetchRecorder::default();
        let mut asked_at = Vec::new();
        for index in 0..positions.len() {
            let before = recorder.0.borrow().len();
            prefetch_group_ahead(&recorder, &records, &positions, index);
            if recorder.0.borrow().len() > before {
                asked_at.push(index);
            }
        }
        // Groups in application order: 1 (index 0), 3 (1-2), 5 (3), 7 (4-6), 9 (7-8), 12 (9-11).
        assert_eq!(*recorder.0.borrow(), vec![7, 9, 12], "the groups starting at index 4 and later");
        assert_eq!(asked_at, vec![0, 3, 5], "each asked for PREFETCH_RECORDS_AHEAD records before its start");
    }
}
