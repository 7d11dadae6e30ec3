//! Partitions: the logs one shard owns ([`PartitionManager`]) and the
//! placement table every shard keeps a full copy of ([`PlacementTable`]).

pub mod log;

pub use log::{PartitionLog, ReadOutcome, Truncated};

use crate::balance::Ewma;
use crate::protocol::RecordRef;

/// Where a partition lives: its owner shard and the epoch of that decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    pub owner: u16,
    pub epoch: u32,
}

/// `partition -> (owner, epoch)`, a full copy on every shard. Updates with an
/// epoch not above the current one are stale and ignored.
#[derive(Debug, Clone)]
pub struct PlacementTable {
    entries: Vec<Placement>,
}

impl PlacementTable {
    /// Initial placement: partition `p` on shard `p % shard_count`, epoch 0.
    /// Consecutive partitions land on different shards, so every shard owns
    /// `partition_count / shard_count` partitions (one more for the first
    /// `partition_count % shard_count` shards).
    pub fn spread(partition_count: u32, shard_count: u16) -> PlacementTable {
        assert!(partition_count > 0 && shard_count > 0);
        let entries = (0..partition_count)
            .map(|partition| Placement { owner: (partition % u32::from(shard_count)) as u16, epoch: 0 })
            .collect();
        PlacementTable { entries }
    }

    #[inline]
    pub fn owner(&self, partition: u32) -> u16 {
        self.entries[partition as usize].owner
    }

    pub fn get(&self, partition: u32) -> Placement {
        self.entries[partition as usize]
    }

    pub fn partition_count(&self) -> u32 {
        self.entries.len() as u32
    }

    /// Applies an update if its epoch is newer; returns whether it did.
    pub fn update(&mut self, partition: u32, placement: Placement) -> bool {
        let entry = &mut self.entries[partition as usize];
        if placement.epoch <= entry.epoch {
            return false;
        }
        *entry = placement;
        true
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, Placement)> + '_ {
        self.entries.iter().enumerate().map(|(partition, placement)| (partition as u32, *placement))
    }
}

/// One partition owned by this shard. Everything here moves with the
/// partition when it migrates: the log, the counters and the rate history
/// (so the new owner's load is right at once).
#[derive(Debug)]
pub struct Partition {
    pub log: PartitionLog,
    pub events_total: u64,
    pub bytes_total: u64,
    /// Events/s and payload bytes/s, averaged over the balancer's half-life.
    pub events_rate: Ewma,
    pub bytes_rate: Ewma,
    /// `events_total` / `bytes_total` at the last rate sample.
    pub sampled_events: u64,
    pub sampled_bytes: u64,
    /// When this partition last arrived at a new owner (process clock, ms).
    pub moved_ms: Option<u64>,
}

impl Partition {
    pub fn new(log: PartitionLog, rate_half_life_ms: u64) -> Partition {
        Partition {
            log,
            events_total: 0,
            bytes_total: 0,
            events_rate: Ewma::new(rate_half_life_ms),
            bytes_rate: Ewma::new(rate_half_life_ms),
            sampled_events: 0,
            sampled_bytes: 0,
            moved_ms: None,
        }
    }

    /// Appends one event; returns the record bytes it added to the log.
    #[inline]
    pub fn append(&mut self, record: &RecordRef<'_>) -> u64 {
        self.log.append(record.log_record);
        self.events_total += 1;
        self.bytes_total += record.payload.len() as u64;
        record.log_record.len() as u64
    }

    /// Folds the events since the last sample into the rates.
    pub fn sample_rates(&mut self, elapsed_ms: u64, now_ms: u64) {
        let seconds = elapsed_ms.max(1) as f64 / 1000.0;
        let events = (self.events_total - self.sampled_events) as f64;
        let bytes = (self.bytes_total - self.sampled_bytes) as f64;
        self.events_rate.update(events / seconds, now_ms);
        self.bytes_rate.update(bytes / seconds, now_ms);
        self.sampled_events = self.events_total;
        self.sampled_bytes = self.bytes_total;
    }
}

/// The partitions one shard owns, indexed by partition id.
#[derive(Debug)]
pub struct PartitionManager {
    partitions: Vec<Option<Box<Partition>>>,
    owned_count: u32,
}

impl PartitionManager {
    pub fn new(partition_count: u32) -> PartitionManager {
        PartitionManager { partitions: (0..partition_count).map(|_| None).collect(), owned_count: 0 }
    }

    pub fn install(&mut self, partition: u32, value: Box<Partition>) {
        let slot = &mut self.partitions[partition as usize];
        assert!(slot.is_none(), "partition {partition} installed twice");
        *slot = Some(value);
        self.owned_count += 1;
    }

    /// Takes a partition out (it is migrating away).
    pub fn remove(&mut self, partition: u32) -> Option<Box<Partition>> {
        let value = self.partitions.get_mut(partition as usize)?.take();
        if value.is_some() {
            self.owned_count -= 1;
        }
        value
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Partition)> + '_ {
        self.partitions
            .iter_mut()
            .enumerate()
            .filter_map(|(partition, value)| value.as_deref_mut().map(|value| (partition as u32, value)))
    }

    #[inline]
    pub fn get_mut(&mut self, partition: u32) -> Option<&mut Partition> {
        self.partitions.get_mut(partition as usize)?.as_deref_mut()
    }

    pub fn get(&self, partition: u32) -> Option<&Partition> {
        self.partitions.get(partition as usize)?.as_deref()
    }

    pub fn owned_count(&self) -> u32 {
        self.owned_count
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &Partition)> + '_ {
        self.partitions
            .iter()
            .enumerate()
            .filter_map(|(partition, value)| value.as_deref().map(|value| (partition as u32, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Initial placement spreads partitions evenly; stale epochs are ignored.
    #[test]
    fn placement_spreads_and_ignores_stale_updates() {
        let mut table = PlacementTable::spread(10, 4);
        let mut owned = [0; 4];
        for (_, placement) in table.iter() {
            owned[usize::from(placement.owner)] += 1;
        }
        assert_eq!(owned, [3, 3, 2, 2]);
        assert!(table.update(5, Placement { owner: 3, epoch: 2 }));
        assert!(!table.update(5, Placement { owner: 0, epoch: 1 }), "stale");
        assert!(!table.update(5, Placement { owner: 0, epoch: 2 }), "same epoch");
        assert_eq!(table.get(5), Placement { owner: 3, epoch: 2 });
    }
}
