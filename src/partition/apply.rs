//! Applying a batch on its owner: every record goes to its partition's log
//! in batch order, records of partitions still migrating here are buffered,
//! the batch's markers advance migrations, and its credit grant is returned
//! or held. What must happen next comes back as data ([`Applied`] and the
//! migration [`Effect`]s); the shard carries it out.

use crate::partition::migration::{Effect, Marker, Migrations};
use crate::partition::{Partition, PartitionManager};
use crate::protocol::record::{BatchIter, decode_log_record};

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

/// The migration state machine as the engine uses it.
pub type ShardMigrations<G> = Migrations<G, PendingRecords>;

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
}

/// Applies one batch from `source`: its records, then its markers, then its
/// grant (returned or held). Effects for the shard are appended to `effects`.
pub fn apply_batch<B: Batch>(
    partitions: &mut PartitionManager,
    migrations: &mut ShardMigrations<B::Grant>,
    source: u16,
    batch: B,
    now_ms: u64,
    effects: &mut Vec<Effect<B::Grant>>,
) -> Applied {
    let mut applied = Applied::default();
    // Incoming partitions this batch carried records for (almost always
    // none; a Vec that stays empty does not allocate).
    let mut held_for: Vec<u32> = Vec::new();
    for (partition_id, record) in BatchIter::new(batch.records()) {
        if let Some(bytes) = partitions.append(partition_id, &record) {
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
    for marker in batch.markers() {
        migrations.on_marker(source, *marker, now_ms, effects);
    }
    migrations.settle_grant(source, batch.into_grant(), held_for, effects);
    applied
}

/// Installs a partition that was handed over, then appends the records
/// that arrived for it before the handoff, in arrival order.
pub fn install_handoff(
    partitions: &mut PartitionManager,
    partition_id: u32,
    mut partition: Box<Partition>,
    pending: PendingRecords,
) -> Applied {
    let mut applied = Applied { stored: pending.count, stored_bytes: 0, discarded: 0 };
    let mut position = 0;
    while position < pending.bytes.len() {
        let record = decode_log_record(&pending.bytes[position..]).expect("pending holds whole records");
        applied.stored_bytes += partition.append(&record, partitions.arrival_ms);
        position += record.log_record.len();
    }
    partitions.install(partition_id, partition);
    partitions.mark_dirty(partition_id);
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
        partitions.get(partition).unwrap().log.read_cached(0, |_, record| {
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

    /// A record for a partition neither owned nor incoming is a routing bug.
    #[test]
    #[should_panic(expected = "neither owned nor incoming")]
    fn misrouted_record_is_a_bug() {
        let mut partitions = manager(&[0]);
        let mut migrations: ShardMigrations<u64> = Migrations::new(0, 2);
        let records = batch(&[(3, "lost?")]);
        apply_batch(&mut partitions, &mut migrations, 1, TestBatch(records, 1), 0, &mut Vec::new());
    }
}
