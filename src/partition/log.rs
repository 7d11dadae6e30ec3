//! The in-memory partition log: an append-only sequence of records with dense
//! offsets, kept in fixed-size segments and bounded by a byte retention.
//!
//! Memory is accounted by allocation, not by content: a segment costs its
//! data capacity plus 4 bytes of index per record slot, so the retention
//! bound is a bound on what the process really holds. When the log would pass
//! its retention, the oldest segment is dropped and its buffers are reused for
//! the new one, so a steady-state log allocates nothing.

use std::collections::VecDeque;

use crate::protocol::record::{LOG_HEADER_SIZE, RecordRef, decode_log_record};

/// One segment: records back to back, and where each starts.
#[derive(Debug)]
pub struct Segment {
    base_offset: u64,
    data: Vec<u8>,
    positions: Vec<u32>,
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

/// An append-only log with dense offsets and byte retention.
#[derive(Debug)]
pub struct PartitionLog {
    segments: VecDeque<Segment>,
    next_offset: u64,
    cost_bytes: usize,
    retention_bytes: usize,
    segment_bytes: usize,
}

impl PartitionLog {
    pub fn new(retention_bytes: usize, segment_bytes: usize) -> PartitionLog {
        assert!(segment_bytes > LOG_HEADER_SIZE);
        assert!(retention_bytes >= segment_bytes);
        PartitionLog { segments: VecDeque::new(), next_offset: 0, cost_bytes: 0, retention_bytes, segment_bytes }
    }

    /// The offset the next append gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The oldest offset still readable (== next_offset when empty).
    pub fn earliest_offset(&self) -> u64 {
        self.segments.front().map_or(self.next_offset, |segment| segment.base_offset)
    }

    /// Bytes this log holds (segment capacity plus index).
    pub fn cost_bytes(&self) -> usize {
        self.cost_bytes
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
        let index_slots = (data_size / 32).max(1);
        let new_cost = data_size + index_slots * std::mem::size_of::<u32>();
        let mut reused = None;
        while self.cost_bytes + new_cost > self.retention_bytes && !self.segments.is_empty() {
            let oldest = self.segments.pop_front().expect("not empty");
            self.cost_bytes -= oldest.cost_bytes();
            reused = Some(oldest);
        }
        let segment = match reused {
            Some(mut segment)
                if segment.data.capacity() == data_size && segment.positions.capacity() == index_slots =>
            {
                segment.data.clear();
                segment.positions.clear();
                segment.base_offset = self.next_offset;
                segment
            }
            _ => Segment {
                base_offset: self.next_offset,
                data: Vec::with_capacity(data_size),
                positions: Vec::with_capacity(index_slots),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::encode_batch_record;

    fn log_record(key: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut batch = Vec::new();
        encode_batch_record(&mut batch, 0, key, payload);
        batch.split_off(4)
    }

    /// Reads every record from `offset`, as (offset, payload) pairs.
    fn read_all(log: &PartitionLog, offset: u64) -> Vec<(u64, String)> {
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
        let mut log = PartitionLog::new(4096, 1024);
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

    /// Retention drops whole old segments and keeps memory under the bound.
    #[test]
    fn retention_bounds_memory() {
        let mut log = PartitionLog::new(8 * 1024, 1024);
        let payload = [b'p'; 50];
        for _ in 0..10_000 {
            log.append(&log_record(b"key", &payload));
            assert!(log.cost_bytes() <= 8 * 1024, "cost {}", log.cost_bytes());
        }
        let earliest = log.earliest_offset();
        assert!(earliest > 9_000 && earliest < 10_000, "earliest {earliest}");
        assert_eq!(read_all(&log, earliest).len() as u64, 10_000 - earliest);
    }

    /// Reads across segment boundaries see every offset once, from any start.
    #[test]
    fn reads_cross_segments() {
        let mut log = PartitionLog::new(1 << 20, 256);
        for index in 0..1000u32 {
            log.append(&log_record(b"k", format!("{index:05}").as_bytes()));
        }
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
