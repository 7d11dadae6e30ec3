//! A partition's log: records with dense offsets.
//!
//! [`MemoryLog`] is an append-only sequence of records kept in fixed-size
//! in-memory segments and bounded by a byte retention. Memory is accounted by
//! allocation, not by content: a segment costs its data capacity plus 4 bytes
//! of index per record slot, so the retention bound is a bound on what the
//! process really holds. When the log would pass its retention, the oldest
//! segment is dropped and its buffers are reused for the new one, so a
//! steady-state log allocates nothing.
//!
//! [`PartitionLog`] is what a partition owns. With `--storage memory` it is a
//! `MemoryLog` alone, bounded by the retention. With `--storage disk` the
//! `MemoryLog` is the tail cache in front of a [`DiskLog`]: every append
//! lands there first (one copy, as in memory mode); the shard's committer
//! copies it into frames on disk; the cache then drops what is on disk
//! beyond `--tail-cache-bytes`, never what is not. Readers see only the
//! *visible* prefix: everything in memory mode; on disk, what is written
//! (`--fsync interval|never`) or durable (`--fsync always`), so no reader
//! ever sees an event that a crash could take back and give to another.

use std::cell::RefCell;
use std::collections::VecDeque;

use crate::partition::disk::DiskLog;
use crate::protocol::record::{LOG_HEADER_SIZE, RecordRef, decode_log_record};
use crate::runtime::prefetch::{prefetch, prefetch_lines};

/// One segment: records back to back, and where each starts.
#[derive(Debug)]
pub struct Segment {
    base_offset: u64,
    data: Vec<u8>,
    positions: Vec<u32>,
    /// Some record in it is extended (a Kafka record: key size 0), so a
    /// frame copied from it whole must say so (see
    /// [`MemoryLog::read_spans_within`]).
    extended: bool,
}

impl Segment {
    fn cost_bytes(&self) -> usize {
        self.data.capacity() + self.positions.capacity() * std::mem::size_of::<u32>()
    }

    fn next_offset(&self) -> u64 {
        self.base_offset + self.positions.len() as u64
    }

    fn record(&self, index: usize) -> &[u8] {
        let start = self.positions[index] as usize;
        let end = self.positions.get(index + 1).map_or(self.data.len(), |&next| next as usize);
        &self.data[start..end]
    }
}

/// An append-only in-memory log with dense offsets and byte retention.
#[derive(Debug)]
pub struct MemoryLog {
    segments: VecDeque<Segment>,
    next_offset: u64,
    cost_bytes: usize,
    retention_bytes: usize,
    segment_bytes: usize,
    /// Retention never drops a record at or after this offset (a tail cache
    /// keeps what is not on disk yet).
    keep_from: u64,
}

impl MemoryLog {
    pub fn new(retention_bytes: usize, segment_bytes: usize) -> MemoryLog {
        MemoryLog::starting_at(0, retention_bytes, segment_bytes)
    }

    /// An empty log whose first record gets `next_offset`.
    pub fn starting_at(next_offset: u64, retention_bytes: usize, segment_bytes: usize) -> MemoryLog {
        assert!(segment_bytes > LOG_HEADER_SIZE);
        assert!(retention_bytes >= segment_bytes);
        MemoryLog {
            segments: VecDeque::new(),
            next_offset,
            cost_bytes: 0,
            retention_bytes,
            segment_bytes,
            keep_from: u64::MAX,
        }
    }

    /// Lets retention drop records before `offset` (and only those).
    pub fn keep_from(&mut self, offset: u64) {
        self.keep_from = offset;
    }

    /// The offset the next append gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The oldest offset still readable (== next_offset when empty).
    pub fn earliest_offset(&self) -> u64 {
        self.segments.front().map_or(self.next_offset, |segment| segment.base_offset)
    }

    /// Bytes of the records from `offset` to the end (0 when `offset` is
    /// at or past the end; from the earliest record when before it).
    pub fn bytes_from(&self, offset: u64) -> usize {
        let mut bytes = 0;
        for segment in self.segments.iter().rev() {
            if offset >= segment.next_offset() {
                break;
            }
            let first = offset.saturating_sub(segment.base_offset) as usize;
            bytes += segment.data.len() - segment.positions.get(first).map_or(0, |&position| position as usize);
            if offset >= segment.base_offset {
                break;
            }
        }
        bytes
    }

    /// Bytes this log holds (segment capacity plus index).
    pub fn cost_bytes(&self) -> usize {
        self.cost_bytes
    }

    /// Starts fetching the cache lines the next append writes (the end of
    /// the last segment's data and of its positions).
    #[inline]
    pub fn prefetch_tail(&self) {
        if let Some(segment) = self.segments.back() {
            prefetch_lines(segment.data.as_ptr().wrapping_add(segment.data.len()), 2);
            prefetch(segment.positions.as_ptr().wrapping_add(segment.positions.len()));
        }
    }

    /// Appends one record in log format and returns its offset.
    #[inline]
    pub fn append(&mut self, log_record: &[u8]) -> u64 {
        debug_assert!(decode_log_record(log_record).is_some_and(|r| r.log_record.len() == log_record.len()));
        let fits = self.segments.back().is_some_and(|segment| {
            segment.data.len() + log_record.len() <= segment.data.capacity()
                && segment.positions.len() < segment.positions.capacity()
        });
        if !fits {
            self.roll(log_record.len());
        }
        let segment = self.segments.back_mut().expect("roll made a segment");
        segment.positions.push(segment.data.len() as u32);
        segment.extended |= log_record[..2] == [0, 0];
        segment.data.extend_from_slice(log_record);
        let offset = self.next_offset;
        self.next_offset += 1;
        debug_assert_eq!(segment.next_offset(), self.next_offset);
        offset
    }

    /// Starts a new segment that holds at least `record_size` bytes, dropping
    /// (and reusing) the oldest segments beyond retention.
    fn roll(&mut self, record_size: usize) {
        let data_size = self.segment_bytes.max(record_size);
        // Index slots: enough for a segment of smallest records (1-byte key,
        // empty payload) would waste memory; size for ~32-byte records and
        // roll early when the index is full instead.
        let index_slots = index_slots_for(data_size);
        let new_cost = data_size + index_slots * std::mem::size_of::<u32>();
        let mut reused = None;
        while self.cost_bytes + new_cost > self.retention_bytes
            && self.segments.front().is_some_and(|oldest| oldest.next_offset() <= self.keep_from)
        {
            let oldest = self.segments.pop_front().expect("not empty");
            self.cost_bytes -= oldest.cost_bytes();
            if let Some(earlier) = reused.replace(oldest) {
                give_to_pool(earlier);
            }
        }
        let fits =
            |segment: &Segment| segment.data.capacity() == data_size && segment.positions.capacity() == index_slots;
        let recycled = match reused {
            Some(segment) if fits(&segment) => Some(segment),
            Some(other) => {
                give_to_pool(other);
                None
            }
            None => None,
        };
        let segment = match recycled.or_else(|| take_from_pool(data_size, index_slots)) {
            Some(mut segment) => {
                segment.data.clear();
                segment.positions.clear();
                segment.extended = false;
                segment.base_offset = self.next_offset;
                segment
            }
            None => Segment {
                base_offset: self.next_offset,
                data: Vec::with_capacity(data_size),
                positions: Vec::with_capacity(index_slots),
                extended: false,
            },
        };
        self.cost_bytes += segment.cost_bytes();
        self.segments.push_back(segment);
    }

    /// Visits the records from `offset` on, in offset order, calling
    /// `visit(offset, record)` until it returns false (that record is not
    /// consumed) or the log ends. Returns the offset to read next. `offset`
    /// must be readable: `earliest_offset() <= offset <= next_offset()` (the
    /// caller decides what a reader behind retention is told).
    pub fn read(&self, offset: u64, mut visit: impl FnMut(u64, RecordRef<'_>) -> bool) -> u64 {
        assert!(offset >= self.earliest_offset() && offset <= self.next_offset, "offset {offset} not readable");
        let mut offset = offset;
        let first_segment = self.segments.partition_point(|segment| segment.next_offset() <= offset);
        for segment in self.segments.range(first_segment..) {
            let first_index = (offset - segment.base_offset) as usize;
            for index in first_index..segment.positions.len() {
                let record = decode_log_record(segment.record(index)).expect("the log holds whole records");
                if !visit(offset, record) {
                    return offset;
                }
                offset += 1;
            }
        }
        offset
    }

    /// Visits the records from `offset` up to `end` as spans of whole
    /// records that lie back to back in memory (one per segment), in offset
    /// order: `visit(first_offset, record_count, log_records)`. The first
    /// record is always taken, whatever its size; after it, records are
    /// taken while all taken stay within `bytes_max`. Returns the offset to
    /// read next. `offset` must be readable, as for [`MemoryLog::read`], and
    /// `end` at most [`MemoryLog::next_offset`].
    pub fn read_spans(&self, offset: u64, end: u64, bytes_max: usize, mut visit: impl FnMut(u64, u32, &[u8])) -> u64 {
        self.visit_spans(offset, end, bytes_max, true, |first, count, span, _| visit(first, count, span))
    }

    /// As [`MemoryLog::read_spans`], for copying the records into a frame:
    /// no record is taken past `bytes_max`, not even the first, and each
    /// span comes with whether it may hold an extended record (its segment
    /// holds one somewhere): `visit(first_offset, record_count,
    /// log_records, may_hold_extended)`.
    pub fn read_spans_within(
        &self,
        offset: u64,
        end: u64,
        bytes_max: usize,
        visit: impl FnMut(u64, u32, &[u8], bool),
    ) -> u64 {
        self.visit_spans(offset, end, bytes_max, false, visit)
    }

    fn visit_spans(
        &self,
        offset: u64,
        end: u64,
        bytes_max: usize,
        take_first: bool,
        mut visit: impl FnMut(u64, u32, &[u8], bool),
    ) -> u64 {
        assert!(offset >= self.earliest_offset() && offset <= self.next_offset, "offset {offset} not readable");
        assert!(end <= self.next_offset, "end {end} past the log");
        let (mut offset, mut room_bytes, mut take_one) = (offset, bytes_max, take_first);
        let first_segment = self.segments.partition_point(|segment| segment.next_offset() <= offset);
        for segment in self.segments.range(first_segment..) {
            if offset >= end {
                break;
            }
            let first_index = (offset - segment.base_offset) as usize;
            let end_index = (end.min(segment.next_offset()) - segment.base_offset) as usize;
            let taken_index = segment.index_within(first_index, end_index, room_bytes, take_one);
            if taken_index > first_index {
                let span = segment.span(first_index, taken_index);
                // Exact: a segment holds at most a u32 of records (its positions are u32).
                visit(offset, (taken_index - first_index) as u32, span, segment.extended);
                offset += (taken_index - first_index) as u64;
                room_bytes = room_bytes.saturating_sub(span.len());
                take_one = false;
            }
            if taken_index < end_index {
                break;
            }
        }
        offset
    }
}

impl Segment {
    /// Where record `index` starts (`data.len()` for one past the last).
    fn start_of(&self, index: usize) -> usize {
        self.positions.get(index).map_or(self.data.len(), |&position| position as usize)
    }

    /// The records `first_index .. end_index`, back to back.
    fn span(&self, first_index: usize, end_index: usize) -> &[u8] {
        &self.data[self.start_of(first_index)..self.start_of(end_index)]
    }

    /// The end of the longest run of records from `first_index` (below
    /// `end_index`) whose bytes stay within `room_bytes`, found by binary
    /// search over the positions; with `take_one`, at least one record.
    fn index_within(&self, first_index: usize, end_index: usize, room_bytes: usize, take_one: bool) -> usize {
        if first_index >= end_index {
            return first_index;
        }
        let start = self.start_of(first_index);
        let fits = |index: usize| self.start_of(index) - start <= room_bytes;
        if fits(end_index) {
            return end_index;
        }
        // Records first_index .. first_index + k fit for k up to the count of
        // the positions after first_index that stay within the room.
        let after = &self.positions[first_index + 1..end_index];
        let fitting = after.partition_point(|&position| position as usize - start <= room_bytes);
        let taken_index = first_index + fitting;
        if taken_index == first_index && take_one { first_index + 1 } else { taken_index }
    }
}

impl Drop for MemoryLog {
    /// A log that goes away (its stream was deleted) leaves its segments to
    /// the shard's pool, when it keeps one.
    fn drop(&mut self) {
        for segment in self.segments.drain(..) {
            give_to_pool(segment);
        }
    }
}

/// Segments a shard keeps ready for its logs, when `--log-prefault-bytes`
/// asks for them: written once at start so their pages are mapped, and
/// refilled by the segments logs give up (a deleted stream, a retention step
/// that drops more than it reuses). A log that grows takes one of them
/// instead of memory the kernel must first fault in and zero page by page.
/// On the VM this project is measured on a fresh page costs 2 to 18 us
/// (its host backs guest memory lazily), so a log filling at hundreds of
/// MB/s could spend most of a core in page faults (flamegraphs/peak-sub-*).
/// A log at its retention already reuses its own oldest segment and needs
/// none.
///
/// The pool is per shard (a thread-local: every shard is one thread, and a
/// log is only ever appended to and dropped on the shard that owns it). It
/// holds at most `bytes_max` (S * `--log-prefault-bytes` in the memory
/// formula), only segments of the one size its shard's logs use, and does
/// nothing when `bytes_max` is 0, the default.
#[derive(Debug, Default)]
pub struct SegmentPool {
    segments: Vec<Segment>,
    bytes: usize,
    bytes_max: usize,
    data_size: usize,
    index_slots: usize,
}

thread_local! {
    static POOL: RefCell<SegmentPool> = RefCell::new(SegmentPool::default());
}

/// Index slots of a segment of `data_size` bytes (see [`MemoryLog::roll`]).
fn index_slots_for(data_size: usize) -> usize {
    (data_size / 32).max(1)
}

/// Sets up this shard's pool for segments of `segment_bytes` and fills it
/// with `bytes_max` bytes of them, each page written once; returns the bytes
/// it holds. Runs once, at shard start.
pub fn prefault_segment_pool(bytes_max: usize, segment_bytes: usize) -> usize {
    const PAGE_SIZE: usize = 4096;
    let index_slots = index_slots_for(segment_bytes);
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        *pool = SegmentPool { bytes_max, data_size: segment_bytes, index_slots, ..SegmentPool::default() };
        let cost = segment_bytes + index_slots * std::mem::size_of::<u32>();
        while pool.bytes + cost <= bytes_max {
            let mut data: Vec<u8> = Vec::with_capacity(segment_bytes);
            let mut positions: Vec<u32> = Vec::with_capacity(index_slots);
            for page in data.spare_capacity_mut().iter_mut().step_by(PAGE_SIZE) {
                page.write(0);
            }
            for page in positions.spare_capacity_mut().iter_mut().step_by(PAGE_SIZE / 4) {
                page.write(0);
            }
            pool.bytes += cost;
            pool.segments.push(Segment { base_offset: 0, data, positions, extended: false });
        }
        pool.bytes
    })
}

fn take_from_pool(data_size: usize, index_slots: usize) -> Option<Segment> {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.data_size != data_size || pool.index_slots != index_slots {
            return None;
        }
        let segment = pool.segments.pop()?;
        pool.bytes -= segment.cost_bytes();
        Some(segment)
    })
}

fn give_to_pool(segment: Segment) {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let fits = segment.data.capacity() == pool.data_size && segment.positions.capacity() == pool.index_slots;
        if fits && pool.bytes + segment.cost_bytes() <= pool.bytes_max {
            pool.bytes += segment.cost_bytes();
            pool.segments.push(segment);
        }
    });
}

/// Bytes in this shard's segment pool now.
pub fn segment_pool_bytes() -> usize {
    POOL.with(|pool| pool.borrow().bytes)
}

/// The log a partition owns: its in-memory records, and on disk storage the
/// files behind them (see the module doc).
#[derive(Debug)]
pub struct PartitionLog {
    memory: MemoryLog,
    disk: Option<Box<DiskLog>>,
}

impl PartitionLog {
    /// A log held in memory only, bounded by `retention_bytes`.
    pub fn in_memory(retention_bytes: usize, segment_bytes: usize) -> PartitionLog {
        PartitionLog { memory: MemoryLog::new(retention_bytes, segment_bytes), disk: None }
    }

    /// A log held in memory only (a moved one).
    pub fn from_memory(memory: MemoryLog) -> PartitionLog {
        PartitionLog { memory, disk: None }
    }

    /// A log on disk with `cache` as its tail cache; the cache starts where
    /// the files end.
    pub fn on_disk(mut cache: MemoryLog, disk: DiskLog) -> PartitionLog {
        assert_eq!(cache.next_offset(), disk.next_offset(), "the cache continues the files");
        cache.keep_from(disk.written_offset());
        PartitionLog { memory: cache, disk: Some(Box::new(disk)) }
    }

    /// Appends one record in log format and returns its offset.
    #[inline]
    pub fn append(&mut self, log_record: &[u8]) -> u64 {
        self.memory.append(log_record)
    }

    /// [`MemoryLog::prefetch_tail`].
    #[inline]
    pub fn prefetch_tail(&self) {
        self.memory.prefetch_tail();
    }

    /// The offset the next append gets.
    pub fn next_offset(&self) -> u64 {
        self.memory.next_offset()
    }

    /// The oldest offset still readable (from memory or disk).
    pub fn earliest_offset(&self) -> u64 {
        match &self.disk {
            Some(disk) => disk.earliest_offset(),
            None => self.memory.earliest_offset(),
        }
    }

    /// Readers see offsets below this one.
    pub fn visible_offset(&self) -> u64 {
        match &self.disk {
            Some(disk) => disk.visible_offset(),
            None => self.memory.next_offset(),
        }
    }

    /// The oldest offset held in memory: reads from here on need no I/O.
    pub fn cached_from(&self) -> u64 {
        self.memory.earliest_offset()
    }

    /// Visits visible records from `offset` (at least [`Self::cached_from`])
    /// as spans, as [`MemoryLog::read_spans`] does; returns the offset to
    /// read next.
    pub fn read_cached_spans(&self, offset: u64, bytes_max: usize, visit: impl FnMut(u64, u32, &[u8])) -> u64 {
        let visible = self.visible_offset();
        if offset >= visible {
            return offset;
        }
        self.memory.read_spans(offset, visible, bytes_max, visit)
    }

    /// Bytes this log holds in memory.
    pub fn cost_bytes(&self) -> usize {
        self.memory.cost_bytes()
    }

    /// Bytes of its files, 0 in memory mode.
    pub fn disk_bytes(&self) -> u64 {
        self.disk.as_ref().map_or(0, |disk| disk.bytes())
    }

    pub fn memory(&self) -> &MemoryLog {
        &self.memory
    }

    pub fn disk(&self) -> Option<&DiskLog> {
        self.disk.as_deref()
    }

    /// The files and the cache, both mutably (the committer encodes from
    /// one into the other).
    pub fn parts_mut(&mut self) -> (&mut MemoryLog, Option<&mut DiskLog>) {
        (&mut self.memory, self.disk.as_deref_mut())
    }

    /// Takes the log apart for a move to another shard.
    pub fn into_parts(self) -> (MemoryLog, Option<Box<DiskLog>>) {
        (self.memory, self.disk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::{ExtendedRecord, encode_batch_record, encode_extended_batch_record};

    fn log_record(key: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut batch = Vec::new();
        encode_batch_record(&mut batch, 0, key, payload);
        batch.split_off(4)
    }

    /// Reads every record from `offset`, as (offset, payload) pairs.
    fn read_all(log: &MemoryLog, offset: u64) -> Vec<(u64, String)> {
        let mut seen = Vec::new();
        log.read(offset, |offset, record| {
            seen.push((offset, String::from_utf8(record.payload.to_vec()).unwrap()));
            true
        });
        seen
    }

    /// Offsets are dense from 0 and reads return events in offset order.
    #[test]
    fn append_and_read_in_order() {
        let mut log = MemoryLog::new(4096, 1024);
        for index in 0..100u32 {
            assert_eq!(log.append(&log_record(b"k", index.to_string().as_bytes())), u64::from(index));
        }
        let expected: Vec<(u64, String)> = (95..100).map(|offset| (offset, offset.to_string())).collect();
        assert_eq!(read_all(&log, 95), expected);
        assert!(read_all(&log, 100).is_empty());
        let mut visited = 0;
        assert_eq!(
            log.read(95, |_, _| {
                visited += 1;
                visited <= 3
            }),
            98,
            "a visitor that stops is not consumed"
        );
    }

    /// `bytes_from` sums the records from an offset across segments.
    #[test]
    fn bytes_from_counts_records_to_the_end() {
        let mut log = MemoryLog::new(64 * 1024, 1024);
        let record = log_record(b"k", &[b'x'; 40]);
        for _ in 0..100 {
            log.append(&record);
        }
        assert!(log.segments.len() > 3, "the records span segments");
        for offset in [0, 1, 17, 50, 99] {
            assert_eq!(log.bytes_from(offset), (100 - offset as usize) * record.len(), "from {offset}");
        }
        assert_eq!(log.bytes_from(100), 0);
        assert_eq!(log.bytes_from(1000), 0);
    }

    /// Retention drops whole old segments and keeps memory under the bound.
    #[test]
    fn retention_bounds_memory() {
        let mut log = MemoryLog::new(8 * 1024, 1024);
        let payload = [b'p'; 50];
        for _ in 0..10_000 {
            log.append(&log_record(b"key", &payload));
            assert!(log.cost_bytes() <= 8 * 1024, "cost {}", log.cost_bytes());
        }
        let earliest = log.earliest_offset();
        assert!(earliest > 9_000 && earliest < 10_000, "earliest {earliest}");
        assert_eq!(read_all(&log, earliest).len() as u64, 10_000 - earliest);
    }

    /// A tail cache keeps what is not on disk yet, past its retention, and
    /// drops only what is.
    #[test]
    fn keep_from_protects_unwritten_records() {
        let mut log = MemoryLog::new(4096, 1024);
        log.keep_from(0);
        for _ in 0..500 {
            log.append(&log_record(b"k", &[b'x'; 20]));
        }
        assert_eq!(log.earliest_offset(), 0, "nothing is written: nothing dropped");
        assert!(log.cost_bytes() > 4096);
        log.keep_from(400);
        log.append(&log_record(b"k", &[b'x'; 20]));
        for _ in 0..100 {
            log.append(&log_record(b"k", &[b'x'; 20]));
        }
        assert!(log.earliest_offset() > 0 && log.earliest_offset() <= 400, "{}", log.earliest_offset());
    }

    /// With a pool, a growing log takes the pre-faulted segments first, a
    /// dropped log gives its segments back (up to the pool's bound), and a
    /// log of another segment size is left alone.
    #[test]
    fn a_segment_pool_feeds_growing_logs() {
        std::thread::spawn(|| {
            let segment_cost = 1024 + index_slots_for(1024) * 4;
            assert_eq!(prefault_segment_pool(3 * segment_cost + 10, 1024), 3 * segment_cost);
            let mut log = MemoryLog::new(1 << 20, 1024);
            for _ in 0..40 {
                log.append(&log_record(b"k", &[b'x'; 40]));
            }
            assert_eq!(log.segments.len(), 2);
            assert_eq!(segment_pool_bytes(), segment_cost, "two taken");
            let mut other = MemoryLog::new(1 << 20, 2048);
            other.append(&log_record(b"k", b"v"));
            assert_eq!(segment_pool_bytes(), segment_cost, "another size neither takes nor gives");
            drop(other);
            assert_eq!(segment_pool_bytes(), segment_cost);
            drop(log);
            assert_eq!(segment_pool_bytes(), 3 * segment_cost, "a dropped log gives back, within the bound");
        })
        .join()
        .unwrap();
    }

    /// A log of `count` records, key `k`, payload the offset in five digits,
    /// in segments of 256 bytes.
    fn numbered_log(count: u32) -> MemoryLog {
        let mut log = MemoryLog::new(1 << 20, 256);
        for index in 0..count {
            log.append(&log_record(b"k", format!("{index:05}").as_bytes()));
        }
        log
    }

    /// Spans cover the records from any start to the end bound once, in
    /// order, one span per segment, within the byte budget (the first record
    /// whatever its size), and say where to read next.
    #[test]
    fn spans_respect_segments_budget_and_end() {
        let log = numbered_log(1000);
        let record_size = log_record(b"k", b"00000").len();
        let spans = |offset, end, bytes_max| {
            let mut seen = Vec::new();
            let next = log.read_spans(offset, end, bytes_max, |first, count, bytes| {
                assert_eq!(bytes.len(), count as usize * record_size);
                let payload = decode_log_record(bytes).unwrap().payload;
                assert_eq!(payload, format!("{first:05}").as_bytes(), "a span starts at its first offset");
                seen.push((first, count));
            });
            (next, seen)
        };
        let (next, seen) = spans(17, 1000, usize::MAX);
        assert_eq!(next, 1000);
        assert!(seen.len() > 1, "several segments");
        let mut expected = 17;
        for &(first, count) in &seen {
            assert_eq!(first, expected);
            expected += u64::from(count);
        }
        let (next, seen) = spans(17, 40, usize::MAX);
        assert_eq!((next, seen[0], seen.iter().map(|&(_, count)| count).sum::<u32>()), (40, (17, 7), 23), "to the end");
        assert_eq!(spans(17, 1000, 3 * record_size + 1).0, 20, "within the budget");
        assert_eq!(spans(17, 1000, 1), (18, vec![(17, 1)]), "at least one record");
        assert_eq!(spans(17, 17, usize::MAX), (17, vec![]), "nothing below the end");
        assert_eq!(spans(1000, 1000, usize::MAX), (1000, vec![]));
    }

    /// Spans for a frame never pass the budget, not even with the first
    /// record, and say which segments hold an extended record.
    #[test]
    fn spans_within_a_budget_take_no_record_past_it() {
        let mut log = numbered_log(100);
        let record_size = log_record(b"k", b"00000").len();
        let within = |log: &MemoryLog, offset, bytes_max| {
            let mut seen = Vec::new();
            let next = log.read_spans_within(offset, log.next_offset(), bytes_max, |first, count, bytes, extended| {
                assert!(bytes.len() <= bytes_max);
                seen.push((first, count, extended));
            });
            (next, seen)
        };
        assert_eq!(within(&log, 17, record_size - 1), (17, vec![]), "no record past the budget");
        assert_eq!(within(&log, 17, 2 * record_size + 1).0, 19);
        assert!(within(&log, 0, usize::MAX).1.iter().all(|&(_, _, extended)| !extended));
        // An extended record (key size 0) marks its segment, and only it.
        let kafka = ExtendedRecord { key: None, value: Some(b"xxxxx"), headers: b"\x00", timestamp_ms: 1_700 };
        let mut extended_record = Vec::new();
        encode_extended_batch_record(&mut extended_record, 0, &kafka);
        let extended_record = extended_record.split_off(4);
        let before = log.next_offset();
        log.append(&extended_record);
        let (_, seen) = within(&log, 0, usize::MAX);
        let marked: Vec<bool> = seen.iter().map(|&(_, _, extended)| extended).collect();
        assert_eq!(marked.iter().filter(|&&extended| extended).count(), 1, "{seen:?}");
        let last = seen.last().unwrap();
        assert!(last.2 && last.0 <= before && before < last.0 + u64::from(last.1));
    }

    /// Reads across segment boundaries see every offset once, from any start.
    #[test]
    fn reads_cross_segments() {
        let log = numbered_log(1000);
        for start in [0, 1, 17, 500, 999] {
            let seen = read_all(&log, start);
            assert_eq!(seen.len() as u64, 1000 - start);
            for (position, (offset, payload)) in seen.iter().enumerate() {
                assert_eq!(*offset, start + position as u64);
                assert_eq!(*payload, format!("{offset:05}"));
            }
        }
    }
}
