//! The owner side of the data path: everything a shard does for the
//! partitions it owns, as plain data structures and pure functions that the
//! shard ([`crate::shard`]) drives. Nothing here does I/O or knows about the
//! mesh, so all of it runs in unit tests and in the simulator.
//!
//! * [`log`]: a partition's append-only log of records, with dense offsets
//!   and byte retention; it stores and returns records, it writes no wire
//!   format.
//! * [`placement`]: the placement table, a full copy on every shard.
//! * [`apply`]: applying a batch of records to the partitions, returning what
//!   must happen to its credits.
//! * [`migration`]: moving a partition between shards without losing or
//!   reordering an event, as a state machine with the clock passed in
//!   (`spate simulate` drives the same code).
//! * [`fetch`]: serving a subscriber's fetch from the logs, and the fetches
//!   parked until new events arrive.
//! * [`records`]: what a fetch reply carries, records copied from the logs
//!   a span at a time; the faces render them in their wire formats.
//!
//! A [`Partition`] is one owned partition (its log, counters and rates) and
//! the [`PartitionManager`] holds the ones a shard owns.

pub mod apply;
pub mod disk;
pub mod fetch;
pub mod log;
pub mod migration;
pub mod placement;
pub mod records;

pub use log::{MemoryLog, PartitionLog};
pub use placement::{Placement, PlacementTable};

use crate::aggregate::PartitionProcessor;
use crate::balance::Ewma;
use crate::protocol::record::RecordRef;

/// One partition owned by this shard. Everything here moves with the
/// partition when it migrates: the log, the counters and the rate history
/// (so the new owner's load is right at once).
#[derive(Debug)]
pub struct Partition {
    pub log: PartitionLog,
    /// The global id of its stream's first partition: a client sees
    /// `global - stream_base`, the partition's number in its stream.
    pub stream_base: u32,
    /// Its stream's id: a fetch names the stream it reads, so a fetch for a
    /// deleted stream whose partition ids a new stream reuses is answered
    /// "deleted", never with the new stream's events.
    pub stream_id: u32,
    /// Its next offset when this process opened its files (0 for a
    /// partition created in this run): every offset from here on was
    /// written by this process. A consumer group whose committed offset is
    /// past the end committed it before a loss of the log's tail, so it
    /// resumes here: nothing after it was ever read.
    pub opened_offset: u64,
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
    /// The keyed aggregates declared on its stream, run on every event it
    /// appends ([`crate::aggregate`]); `None` when its stream has none.
    pub processor: Option<Box<PartitionProcessor>>,
}

impl Partition {
    pub fn new(log: PartitionLog, rate_half_life_ms: u64) -> Partition {
        Partition {
            log,
            stream_base: 0,
            stream_id: 0,
            opened_offset: 0,
            events_total: 0,
            bytes_total: 0,
            events_rate: Ewma::new(rate_half_life_ms),
            bytes_rate: Ewma::new(rate_half_life_ms),
            sampled_events: 0,
            sampled_bytes: 0,
            moved_ms: None,
            processor: None,
        }
    }

    /// Appends one event and runs its stream's aggregates on it (at
    /// `arrival_ms`, Unix ms); returns the record bytes it added to the log.
    #[inline]
    pub fn append(&mut self, record: &RecordRef<'_>, arrival_ms: u64) -> u64 {
        // The aggregates run before the copy into the log (an append cannot
        // fail, so the offset is known): the copy's stores to the log's cold
        // tail then drain while the next event is read, instead of filling
        // the store buffer ahead of the aggregates' own stores, which
        // stalled there (perf annotate: `call`s and `push`es in the value
        // read took the samples).
        if let Some(processor) = &mut self.processor {
            processor.process(self.log.next_offset(), record.key, record.payload, arrival_ms, record.value_at);
        }
        self.log.append(record.log_record);
        self.events_total += 1;
        self.bytes_total += record.payload.len() as u64;
        record.log_record.len() as u64
    }

    /// Starts fetching what appending its next event touches: the struct,
    /// the log's tail, its aggregates' state ([`PartitionProcessor::prefetch`]).
    #[inline]
    pub fn prefetch(&self) {
        crate::runtime::prefetch::prefetch_lines(self as *const Partition, 2);
        self.log.prefetch_tail();
        if let Some(processor) = &self.processor {
            processor.prefetch();
        }
    }

    /// Folds the events since the last sample into the rates.
    /// Returns the events/s of the interval alone.
    pub fn sample_rates(&mut self, elapsed_ms: u64, now_ms: u64) -> f64 {
        let seconds = elapsed_ms.max(1) as f64 / 1000.0;
        let events = (self.events_total - self.sampled_events) as f64;
        let bytes = (self.bytes_total - self.sampled_bytes) as f64;
        self.events_rate.update(events / seconds, now_ms);
        self.bytes_rate.update(bytes / seconds, now_ms);
        self.sampled_events = self.events_total;
        self.sampled_bytes = self.bytes_total;
        events / seconds
    }
}

/// A partition in transit to another shard: everything a [`Partition`]
/// holds, with its files closed (they are opened again by the thief), so it
/// can cross threads.
#[derive(Debug)]
pub struct MovedPartition {
    memory: MemoryLog,
    stream_base: u32,
    stream_id: u32,
    opened_offset: u64,
    disk: Option<disk::MovedDisk>,
    events_total: u64,
    bytes_total: u64,
    events_rate: Ewma,
    bytes_rate: Ewma,
    sampled_events: u64,
    sampled_bytes: u64,
    pub moved_ms: Option<u64>,
    processor: Option<Box<PartitionProcessor>>,
}

impl MovedPartition {
    /// The files to open again on the thief, if any.
    pub fn take_disk(&mut self) -> Option<disk::MovedDisk> {
        self.disk.take()
    }
}

impl Partition {
    /// Packs the partition for a move. On disk, the writer must be out,
    /// closed, and everything durable; `active_index` is its index.
    pub fn into_moved(self, active_index: Option<crate::storage::index::SegmentIndex>) -> MovedPartition {
        let (memory, disk) = self.log.into_parts();
        let disk = disk.map(|disk| disk.into_moved(active_index.expect("an index for the active segment")));
        MovedPartition {
            memory,
            stream_base: self.stream_base,
            stream_id: self.stream_id,
            opened_offset: self.opened_offset,
            disk,
            events_total: self.events_total,
            bytes_total: self.bytes_total,
            events_rate: self.events_rate,
            bytes_rate: self.bytes_rate,
            sampled_events: self.sampled_events,
            sampled_bytes: self.sampled_bytes,
            moved_ms: self.moved_ms,
            processor: self.processor,
        }
    }

    /// Unpacks a moved partition, with its files opened again (`disk`) when
    /// it has any ([`MovedPartition::take_disk`] first).
    pub fn from_moved(moved: MovedPartition, disk: Option<disk::DiskLog>) -> Partition {
        assert!(moved.disk.is_none(), "take the files out and open them first");
        let log = match disk {
            Some(disk) => PartitionLog::on_disk(moved.memory, disk),
            None => PartitionLog::from_memory(moved.memory),
        };
        Partition {
            log,
            stream_base: moved.stream_base,
            stream_id: moved.stream_id,
            opened_offset: moved.opened_offset,
            events_total: moved.events_total,
            bytes_total: moved.bytes_total,
            events_rate: moved.events_rate,
            bytes_rate: moved.bytes_rate,
            sampled_events: moved.sampled_events,
            sampled_bytes: moved.sampled_bytes,
            moved_ms: moved.moved_ms,
            processor: moved.processor,
        }
    }
}

/// The partitions one shard owns, indexed by partition id, and which of
/// them were appended to since the committer last looked.
#[derive(Debug)]
pub struct PartitionManager {
    /// The arrival time (Unix ms) aggregates see for what is appended next:
    /// set by the shard once per batch, never going back.
    pub arrival_ms: u64,
    partitions: Vec<Option<Box<Partition>>>,
    owned_count: u32,
    dirty: Vec<u32>,
    dirty_flags: Vec<bool>,
    /// Partitions whose aggregates closed windows the shard has not taken
    /// yet ([`PartitionManager::take_emitting`]).
    emitting: Vec<u32>,
    emitting_flags: Vec<bool>,
    /// Partitions of deleted streams: records still in flight for them are
    /// discarded (the stream is gone), and fetches are told so.
    retired: Vec<bool>,
    /// The order [`apply::apply_batch`] applies a batch's records in,
    /// reused from batch to batch.
    pub(crate) record_order: apply::RecordOrder,
}

impl PartitionManager {
    pub fn new(partition_count: u32) -> PartitionManager {
        let count = partition_count as usize;
        PartitionManager {
            arrival_ms: 0,
            partitions: (0..count).map(|_| None).collect(),
            owned_count: 0,
            dirty: Vec::new(),
            dirty_flags: vec![false; count],
            emitting: Vec::new(),
            emitting_flags: vec![false; count],
            retired: vec![false; count],
            record_order: apply::RecordOrder::default(),
        }
    }

    /// Appends one event to an owned partition (marking it dirty); returns
    /// the log bytes added, or `None` if the partition is not owned here.
    #[inline]
    pub fn append(&mut self, partition_id: u32, record: &RecordRef<'_>) -> Option<u64> {
        let partition = self.partitions.get_mut(partition_id as usize)?.as_deref_mut()?;
        let bytes = partition.append(record, self.arrival_ms);
        let closed = partition.processor.as_deref().is_some_and(PartitionProcessor::has_output);
        if closed && !self.emitting_flags[partition_id as usize] {
            self.emitting_flags[partition_id as usize] = true;
            self.emitting.push(partition_id);
        }
        self.mark_dirty(partition_id);
        Some(bytes)
    }

    /// The partitions whose aggregates closed windows since the last call.
    pub fn take_emitting(&mut self) -> Vec<u32> {
        for &partition_id in &self.emitting {
            self.emitting_flags[partition_id as usize] = false;
        }
        std::mem::take(&mut self.emitting)
    }

    /// Marks a partition of a deleted stream (after removing it, if owned).
    pub fn retire(&mut self, partition_id: u32) {
        self.retired[partition_id as usize] = true;
    }

    /// A new stream takes `partition_id` (a deleted stream's id, free again).
    pub fn unretire(&mut self, partition_id: u32) {
        self.retired[partition_id as usize] = false;
    }

    pub fn is_retired(&self, partition_id: u32) -> bool {
        self.retired.get(partition_id as usize).copied().unwrap_or(false)
    }

    /// Notes that `partition_id` has records its files may not have.
    #[inline]
    pub fn mark_dirty(&mut self, partition_id: u32) {
        let flag = &mut self.dirty_flags[partition_id as usize];
        if !*flag {
            *flag = true;
            self.dirty.push(partition_id);
        }
    }

    /// The partitions appended to since the last call (the committer's work).
    pub fn take_dirty(&mut self) -> Vec<u32> {
        for &partition_id in &self.dirty {
            self.dirty_flags[partition_id as usize] = false;
        }
        std::mem::take(&mut self.dirty)
    }

    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
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
