//! The sparse offset index of one segment, and its sidecar file format.
//!
//! An entry `(relative_offset, position)` says that the frame starting at
//! file `position` has `base_offset == segment base + relative_offset`. An
//! entry is added for the first frame and then for the first frame that
//! starts at least `interval_bytes` after the last entry, so the index of a
//! segment of `size` bytes holds at most `size / interval_bytes + 1` entries
//! (8 bytes each) whatever the frame sizes. [`SegmentIndex::lookup`] gives the
//! position of the last indexed frame at or before the one holding an offset:
//! a reader seeks there and walks at most `interval_bytes` of frames (one
//! aligned read) to reach it.
//!
//! The index lives in memory while its segment is active (fed by the writer
//! for every frame it appends, or by the recovery scan) and is written as a
//! sidecar `.index` file when the segment is sealed. The sidecar is only an
//! accelerator: a missing or damaged one is rebuilt by scanning the segment
//! ([`crate::storage::format::scan_with`] calls back for every frame), so
//! losing it is never fatal.
//!
//! # Sidecar file
//!
//! ```text
//! offset size field
//!      0    4 magic           u32 LE, INDEX_MAGIC: the bytes "SPTI"
//!      4    4 crc32c          u32 LE, of the whole file with this field zeroed
//!      8    1 version         u8, 1
//!      9    3 reserved        zero
//!     12    4 entry_count     u32 LE
//!     16    8 log_id          u64 LE
//!     24    8 base_offset     u64 LE, the segment's first offset
//!     32    8 next_offset     u64 LE, the offset after the segment's last record
//!     40    8 log_size        u64 LE, bytes of whole frames in the segment
//!     48    4 interval_bytes  u32 LE
//!     52    4 reserved        zero
//!     56      entries         entry_count x (relative_offset u32 LE, position u32 LE)
//! ```

use std::fmt;

use super::format::FrameHeader;

/// The first four bytes of an index file: "SPTI" as a little-endian u32.
pub const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"SPTI");
pub const INDEX_VERSION: u8 = 1;
pub const INDEX_HEADER_SIZE: usize = 56;
pub const INDEX_ENTRY_SIZE: usize = 8;
/// Segments are addressed with u32 positions and relative offsets.
pub const SEGMENT_SIZE_MAX: u64 = u32::MAX as u64;

/// Why an index cannot be used (rebuild it from the segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexError {
    Truncated {
        needed: usize,
        available: usize,
    },
    BadMagic {
        found: u32,
    },
    UnsupportedVersion {
        version: u8,
    },
    CrcMismatch {
        expected: u32,
        actual: u32,
    },
    /// The file belongs to another segment or log.
    WrongSegment {
        log_id: u64,
        base_offset: u64,
    },
    /// Entries that do not increase, or point past the log.
    BadEntry {
        entry_index: u32,
    },
    /// A frame past [`SEGMENT_SIZE_MAX`] or with more than u32 offsets.
    SegmentTooLarge {
        position: u64,
        relative_offset: u64,
    },
    /// A frame that does not continue the indexed log.
    OutOfOrder {
        position: u64,
        expected_position: u64,
    },
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IndexError::Truncated { needed, available } => {
                write!(f, "truncated index: needs {needed} bytes, {available} available")
            }
            IndexError::BadMagic { found } => write!(f, "bad index magic {found:#010x}"),
            IndexError::UnsupportedVersion { version } => write!(f, "unsupported index version {version}"),
            IndexError::CrcMismatch { expected, actual } => {
                write!(f, "index CRC32C mismatch: stored {expected:#010x}, computed {actual:#010x}")
            }
            IndexError::WrongSegment { log_id, base_offset } => {
                write!(f, "index of another segment (log {log_id}, base offset {base_offset})")
            }
            IndexError::BadEntry { entry_index } => write!(f, "index entry {entry_index} is out of order"),
            IndexError::SegmentTooLarge { position, relative_offset } => write!(
                f,
                "frame at position {position} (relative offset {relative_offset}) is past the segment limit of {SEGMENT_SIZE_MAX}"
            ),
            IndexError::OutOfOrder { position, expected_position } => {
                write!(f, "frame at position {position} does not follow the indexed log end {expected_position}")
            }
        }
    }
}

impl std::error::Error for IndexError {}

/// One index entry: the frame at `position` starts at `base + relative_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub relative_offset: u32,
    pub position: u32,
}

// The memory formula counts an entry per index interval at this size.
const _: () = assert!(std::mem::size_of::<IndexEntry>() <= crate::config::limits::INDEX_ENTRY_BYTES);

/// The sparse index of one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentIndex {
    log_id: u64,
    base_offset: u64,
    next_offset: u64,
    /// Bytes of whole frames indexed so far.
    log_size: u64,
    interval_bytes: u32,
    entries: Vec<IndexEntry>,
}

impl SegmentIndex {
    pub fn new(log_id: u64, base_offset: u64, interval_bytes: u32) -> SegmentIndex {
        assert!(interval_bytes > 0);
        SegmentIndex { log_id, base_offset, next_offset: base_offset, log_size: 0, interval_bytes, entries: Vec::new() }
    }

    pub fn log_id(&self) -> u64 {
        self.log_id
    }

    pub fn base_offset(&self) -> u64 {
        self.base_offset
    }

    /// The offset after the last indexed record.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Bytes of whole frames indexed: where the next frame starts.
    pub fn log_size(&self) -> u64 {
        self.log_size
    }

    pub fn interval_bytes(&self) -> u32 {
        self.interval_bytes
    }

    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Records a frame appended at `position`. Frames must come in log order.
    pub fn on_frame(&mut self, position: u64, header: &FrameHeader) -> Result<(), IndexError> {
        if position != self.log_size || header.base_offset != self.next_offset {
            return Err(IndexError::OutOfOrder { position, expected_position: self.log_size });
        }
        let end = position + header.frame_size() as u64;
        let relative_next = header.next_offset() - self.base_offset;
        if end > SEGMENT_SIZE_MAX || relative_next > u64::from(u32::MAX) {
            return Err(IndexError::SegmentTooLarge { position, relative_offset: relative_next });
        }
        let due = self
            .entries
            .last()
            .is_none_or(|last| position >= u64::from(last.position) + u64::from(self.interval_bytes));
        if due {
            let relative_offset = (header.base_offset - self.base_offset) as u32;
            self.entries.push(IndexEntry { relative_offset, position: position as u32 });
        }
        self.log_size = end;
        self.next_offset = header.next_offset();
        Ok(())
    }

    /// The index of the log's first `log_size` bytes (a frame boundary,
    /// where the offset `next_offset` starts): what a checkpoint records as
    /// durable while the writer holds more.
    pub fn prefix(&self, log_size: u64, next_offset: u64) -> SegmentIndex {
        assert!(log_size <= self.log_size && next_offset <= self.next_offset && next_offset >= self.base_offset);
        let entries = self.entries.iter().copied().filter(|entry| u64::from(entry.position) < log_size).collect();
        SegmentIndex { next_offset, log_size, entries, ..*self }
    }

    /// The position of the last indexed frame at or before the frame that
    /// holds `offset`; `None` when `offset` is not in this segment.
    pub fn lookup(&self, offset: u64) -> Option<u64> {
        if offset < self.base_offset || offset >= self.next_offset {
            return None;
        }
        let relative = offset - self.base_offset;
        let after = self.entries.partition_point(|entry| u64::from(entry.relative_offset) <= relative);
        debug_assert!(after > 0, "the first frame is always indexed");
        self.entries.get(after.checked_sub(1)?).map(|entry| u64::from(entry.position))
    }

    /// Bytes of the sidecar file.
    pub fn encoded_size(&self) -> usize {
        INDEX_HEADER_SIZE + self.entries.len() * INDEX_ENTRY_SIZE
    }

    /// Writes the sidecar file's bytes into `out` (cleared first).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&INDEX_MAGIC.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&[INDEX_VERSION, 0, 0, 0]);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for value in [self.log_id, self.base_offset, self.next_offset, self.log_size] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.extend_from_slice(&self.interval_bytes.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        debug_assert_eq!(out.len(), INDEX_HEADER_SIZE);
        for entry in &self.entries {
            out.extend_from_slice(&entry.relative_offset.to_le_bytes());
            out.extend_from_slice(&entry.position.to_le_bytes());
        }
        let crc = crc32c::crc32c(out);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads a sidecar file, checking it whole and that it belongs to the
    /// segment `(log_id, base_offset)`.
    pub fn decode(bytes: &[u8], log_id: u64, base_offset: u64) -> Result<SegmentIndex, IndexError> {
        if bytes.len() < INDEX_HEADER_SIZE {
            return Err(IndexError::Truncated { needed: INDEX_HEADER_SIZE, available: bytes.len() });
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if u32_at(0) != INDEX_MAGIC {
            return Err(IndexError::BadMagic { found: u32_at(0) });
        }
        if bytes[8] != INDEX_VERSION {
            return Err(IndexError::UnsupportedVersion { version: bytes[8] });
        }
        let entry_count = u32_at(12) as usize;
        let needed = INDEX_HEADER_SIZE.saturating_add(entry_count.saturating_mul(INDEX_ENTRY_SIZE));
        if bytes.len() != needed {
            return Err(IndexError::Truncated { needed, available: bytes.len() });
        }
        let expected = u32_at(4);
        let crc = crc32c::crc32c(&bytes[..4]);
        let crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, &[0; 4]), &bytes[8..]);
        if crc != expected {
            return Err(IndexError::CrcMismatch { expected, actual: crc });
        }
        if u64_at(16) != log_id || u64_at(24) != base_offset {
            return Err(IndexError::WrongSegment { log_id: u64_at(16), base_offset: u64_at(24) });
        }
        let mut index = SegmentIndex::new(log_id, base_offset, u32_at(48).max(1));
        index.next_offset = u64_at(32);
        index.log_size = u64_at(40);
        for entry_index in 0..entry_count {
            let at = INDEX_HEADER_SIZE + entry_index * INDEX_ENTRY_SIZE;
            index.entries.push(IndexEntry { relative_offset: u32_at(at), position: u32_at(at + 4) });
        }
        index.check_entries()?;
        Ok(index)
    }

    /// Entries strictly increase, start at the segment start, and stay
    /// inside the log.
    fn check_entries(&self) -> Result<(), IndexError> {
        let relative_next = self.next_offset.checked_sub(self.base_offset);
        for (entry_index, entry) in self.entries.iter().enumerate() {
            let first_ok = entry_index > 0 || (entry.relative_offset == 0 && entry.position == 0);
            let increasing = entry_index == 0 || {
                let previous = self.entries[entry_index - 1];
                entry.relative_offset > previous.relative_offset && entry.position > previous.position
            };
            let inside = u64::from(entry.position) < self.log_size
                && relative_next.is_some_and(|next| u64::from(entry.relative_offset) < next);
            if !(first_ok && increasing && inside) {
                return Err(IndexError::BadEntry { entry_index: entry_index as u32 });
            }
        }
        if self.entries.is_empty() != (self.log_size == 0) || relative_next.is_none() {
            return Err(IndexError::BadEntry { entry_index: 0 });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::format::tests::sample_log;
    use crate::storage::format::{DecodedFrame, ScanCursor, decode_frame, scan_with};

    fn index_of(log: &[u8], interval_bytes: u32) -> SegmentIndex {
        let mut index = SegmentIndex::new(7, 0, interval_bytes);
        let outcome = scan_with(log, 7, ScanCursor::at_segment_start(0), |position, header| {
            index.on_frame(position, header).unwrap();
        });
        assert!(outcome.stop.is_clean());
        index
    }

    /// Every offset of the log is found: the lookup position is a frame at
    /// or before the one holding it, within one interval plus one frame.
    #[test]
    fn lookup_finds_every_offset() {
        let (log, _) = sample_log(40);
        for interval_bytes in [1, 64, 300, 4096] {
            let index = index_of(&log, interval_bytes);
            assert!(index.entries().len() <= log.len() / interval_bytes as usize + 1);
            for offset in 0..index.next_offset() {
                let mut position = index.lookup(offset).unwrap() as usize;
                let start = position;
                let frame: DecodedFrame<'_> = loop {
                    let frame = decode_frame(&log[position..]).unwrap();
                    if frame.header.contains(offset) {
                        break frame;
                    }
                    position += frame.header.frame_size();
                };
                assert!(frame.header.base_offset <= offset);
                assert!(position - start < interval_bytes as usize, "walked {} bytes", position - start);
            }
            assert_eq!(index.lookup(index.next_offset()), None);
        }
    }

    /// The sidecar round-trips, and any damage to it is detected.
    #[test]
    fn sidecar_round_trip_and_damage() {
        let (log, _) = sample_log(30);
        let index = index_of(&log, 256);
        let mut bytes = Vec::new();
        index.encode(&mut bytes);
        assert_eq!(bytes.len(), index.encoded_size());
        assert_eq!(SegmentIndex::decode(&bytes, 7, 0), Ok(index.clone()));
        assert!(matches!(SegmentIndex::decode(&bytes, 8, 0), Err(IndexError::WrongSegment { .. })));
        for cut in 0..bytes.len() {
            assert!(SegmentIndex::decode(&bytes[..cut], 7, 0).is_err(), "cut {cut}");
        }
        for byte in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[byte] ^= 0x01;
            assert!(SegmentIndex::decode(&bad, 7, 0).is_err(), "byte {byte}");
        }
    }

    /// Frames that skip a position or an offset are refused, not indexed.
    #[test]
    fn out_of_order_frames_are_refused() {
        let (log, ends) = sample_log(3);
        let mut index = index_of(&log[..ends[0]], 4096);
        let second = decode_frame(&log[ends[0]..]).unwrap().header;
        assert!(matches!(index.on_frame(ends[0] as u64 + 1, &second), Err(IndexError::OutOfOrder { .. })));
        let third = decode_frame(&log[ends[1]..]).unwrap().header;
        assert!(matches!(index.on_frame(ends[0] as u64, &third), Err(IndexError::OutOfOrder { .. })));
        index.on_frame(ends[0] as u64, &second).unwrap();
        assert_eq!(index.log_size(), ends[1] as u64);
    }
}
