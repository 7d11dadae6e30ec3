//! The in-memory partition log: an append-only sequence of records with dense
//! offsets, kept in fixed-size segments and bounded by a byte retention.
//!
//! Memory is accounted by allocation, not by content: a segment costs its
//! data capacity plus 4 bytes of index per record slot, so the retention
//! bound is a bound on what the process really holds. When the log would pass
//! its retention, the oldest segment is dropped and its buffers are reused for
//! the new one, so a steady-state log allocates nothing.

use std::collections::VecDeque;

use crate::protocol::record::{LOG_HEADER_SIZE, decode_log_record, write_event_line};

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

/// What [`PartitionLog::read_lines`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// The offset to read next.
    pub next_offset: u64,
    /// Events written.
    pub event_count: u64,
    /// Set when the requested offset was already dropped by retention: the
    /// read started at `earliest` instead.
    pub truncated: Option<Truncated>,
}

/// Offsets `requested..earliest` are gone: retention dropped them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    pub requested: u64,
    pub earliest: u64,
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

    /// Writes subscriber lines for events from `offset` on into `out`, until
    /// `out` would pass `bytes_max` (at least one event is written when there
    /// is one, so a large event never stalls a reader).
    pub fn read_lines(&self, partition: u32, offset: u64, out: &mut Vec<u8>, bytes_max: usize) -> ReadOutcome {
        let earliest = self.earliest_offset();
        let (mut offset, truncated) = if offset < earliest {
            (earliest, Some(Truncated { requested: offset, earliest }))
        } else {
            (offset.min(self.next_offset), None)
        };
        let mut event_count = 0;
        let first_segment = self.segments.partition_point(|segment| segment.next_offset() <= offset);
        'segments: for segment in self.segments.range(first_segment..) {
            let first_index = (offset - segment.base_offset) as usize;
            for index in first_index..segment.positions.len() {
                let record = decode_log_record(segment.record(index)).expect("log holds whole records");
                let line_size = record.key.len() + record.payload.len() + 24;
                if event_count > 0 && out.len() + line_size > bytes_max {
                    break 'segments;
                }
                write_event_line(out, partition, offset, record.key, record.payload);
                offset += 1;
                event_count += 1;
            }
        }
        ReadOutcome { next_offset: offset, event_count, truncated }
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

    /// Offsets are dense from 0 and reads return events in offset order.
    #[test]
    fn append_and_read_in_order() {
        let mut log = PartitionLog::new(4096, 1024);
        for index in 0..100u32 {
            assert_eq!(log.append(&log_record(b"k", index.to_string().as_bytes())), u64::from(index));
        }
        let mut out = Vec::new();
        let outcome = log.read_lines(3, 95, &mut out, 1 << 20);
        assert_eq!(outcome, ReadOutcome { next_offset: 100, event_count: 5, truncated: None });
        assert_eq!(out, b"3 95 k 95\n3 96 k 96\n3 97 k 97\n3 98 k 98\n3 99 k 99\n");
    }

    /// Retention drops whole old segments, keeps memory under the bound, and a
    /// reader behind it is told where the log now starts.
    #[test]
    fn retention_bounds_memory_and_reports_truncation() {
        let mut log = PartitionLog::new(8 * 1024, 1024);
        let payload = [b'p'; 50];
        for _ in 0..10_000 {
            log.append(&log_record(b"key", &payload));
            assert!(log.cost_bytes() <= 8 * 1024, "cost {}", log.cost_bytes());
        }
        let earliest = log.earliest_offset();
        assert!(earliest > 9_000 && earliest < 10_000, "earliest {earliest}");
        let mut out = Vec::new();
        let outcome = log.read_lines(0, 5, &mut out, 200);
        assert_eq!(outcome.truncated, Some(Truncated { requested: 5, earliest }));
        assert!(outcome.event_count >= 1 && out.len() <= 200);
        assert!(out.starts_with(format!("0 {earliest} key ").as_bytes()));
    }

    /// Reads across segment boundaries see every offset once, and a budget
    /// smaller than one event still returns that event.
    #[test]
    fn reads_cross_segments_and_always_progress() {
        let mut log = PartitionLog::new(1 << 20, 256);
        for index in 0..1000u32 {
            log.append(&log_record(b"k", format!("{index:05}").as_bytes()));
        }
        let (mut offset, mut out) = (0, Vec::new());
        while offset < 1000 {
            let before = out.len();
            let outcome = log.read_lines(0, offset, &mut out, before + 1);
            assert_eq!(outcome.event_count, 1);
            offset = outcome.next_offset;
        }
        let text = String::from_utf8(out).unwrap();
        for (index, line) in text.lines().enumerate() {
            assert_eq!(line, format!("0 {index} k {index:05}"));
        }
        let big = log_record(b"big", &[b'x'; 1000]);
        let offset = log.append(&big);
        let mut out = Vec::new();
        assert_eq!(log.read_lines(0, offset, &mut out, 10).event_count, 1);
    }
}
