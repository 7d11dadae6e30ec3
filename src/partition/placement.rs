//! The placement table: `partition -> (owner shard, epoch)`, a full copy on
//! every shard (a Seastar-style `_table`). Only the migration protocol
//! ([`super::migration`]) changes it, and every update carries a higher
//! epoch, so a stale update that arrives late is ignored.

/// Where a partition lives: its owner shard and the epoch of that decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    pub owner: u16,
    pub epoch: u32,
}

// The memory formula counts a placement table of this many bytes per entry.
const _: () = assert!(std::mem::size_of::<Placement>() <= crate::config::limits::PLACEMENT_ENTRY_BYTES);

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
            .map(|partition| Placement { owner: crate::balance::home_shard(partition, shard_count), epoch: 0 })
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
