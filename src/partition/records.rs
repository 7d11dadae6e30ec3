//! What a fetch reply carries: records, not any face's wire format.
//!
//! The owner copies records out of a partition's log into a
//! [`FetchedRecords`] buffer; the face that asked (the subscribe port's
//! text lines today, Kafka's record batches later) renders them on its own
//! shard. The owner thus knows no wire format, and copying is one `memcpy`
//! per span of records that lie back to back in the log (a tail-cache
//! segment, a frame read from a file), not one per record.
//!
//! # Layout
//!
//! Entries back to back, each an [`ENTRY_HEADER_SIZE`]-byte header, all
//! fields little-endian:
//!
//! ```text
//! run:        tag 1 (u8) | partition (u32) | base_offset (u64) | record_count (u32) | body_size (u32)
//!             then body_size bytes: record_count log records back to back,
//!             offsets base_offset .. base_offset + record_count
//! truncated:  tag 2 (u8) | partition (u32) | requested (u64) | earliest (u64)
//! ```
//!
//! A log record is the partition log's own format
//! ([`crate::protocol::record`]: key size, payload size, key, payload), so
//! a run's body is a slice of the log copied whole. Offsets are dense, so a
//! run stores its base offset once. `partition` is the global partition id,
//! as in the reply's cursors (a face subtracts its stream's base for the
//! number a client sees). A `truncated` entry says the cursor at `requested`
//! fell behind retention and reading continues at `earliest`.
//!
//! # Size
//!
//! [`FetchedRecords::size_bytes`] is the whole buffer, headers included:
//! what a fetch's byte budget (`--fetch-bytes-max`) and a standing fetch's
//! window count, on the owner and on the subscriber alike, and what the
//! reply holds in memory. A record costs its key, its payload and 6 bytes;
//! a run or notice 21 bytes more.
//!
//! The buffer is built only by the methods here, so reading it back cannot
//! fail; should it ever not parse (a bug), the readers stop rather than
//! panic, and debug builds assert.

use crate::protocol::record::{LOG_HEADER_SIZE, RecordRef, decode_log_record};

/// Bytes of every entry's header.
pub const ENTRY_HEADER_SIZE: usize = 21;

const TAG_RUN: u8 = 1;
const TAG_TRUNCATED: u8 = 2;

/// Byte positions of the header fields, from the start of an entry.
mod field {
    pub const TAG: usize = 0;
    pub const PARTITION: usize = 1;
    /// A run's `base_offset`, a notice's `requested`.
    pub const OFFSET: usize = 5;
    /// A run's `record_count`.
    pub const RECORD_COUNT: usize = 13;
    /// A run's `body_size`.
    pub const BODY_SIZE: usize = 17;
    /// A notice's `earliest`.
    pub const EARLIEST: usize = 13;
    pub const END: usize = 21;
}

const _: () = assert!(field::END == ENTRY_HEADER_SIZE && field::BODY_SIZE + 4 == field::END);
const _: () = assert!(field::EARLIEST + 8 == field::END && field::RECORD_COUNT + 4 == field::BODY_SIZE);

/// A reply's records and notices, in the layout of the module doc.
#[derive(Debug, Default)]
pub struct FetchedRecords {
    bytes: Vec<u8>,
    /// Where the header of the last entry starts, when it is a run that a
    /// following span may extend.
    open_run: Option<usize>,
    record_count: u64,
    truncation_count: u64,
}

impl FetchedRecords {
    /// Bytes of the buffer, headers included (what budgets count).
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    pub fn reserve(&mut self, additional_bytes: usize) {
        self.bytes.reserve(additional_bytes);
    }

    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
    }

    /// Empties the buffer, keeping its capacity.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.open_run = None;
        self.record_count = 0;
        self.truncation_count = 0;
    }

    /// Records in all runs.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// `truncated` entries.
    pub fn truncation_count(&self) -> u64 {
        self.truncation_count
    }

    /// Appends `record_count` whole log records, lying back to back in
    /// `log_records`, of `partition` from `first_offset` on: one copy. A span
    /// that continues the last run (same partition, next offset) extends it.
    pub fn push_records(&mut self, partition: u32, first_offset: u64, record_count: u32, log_records: &[u8]) {
        debug_assert!(record_count > 0 && log_records.len() >= record_count as usize * LOG_HEADER_SIZE);
        let body_size = u32::try_from(log_records.len()).expect("a span of one segment or frame fits a u32");
        if let Some(header) = self.open_run.filter(|&header| self.extends(header, partition, first_offset)) {
            let count_at = header + field::RECORD_COUNT;
            let size_at = header + field::BODY_SIZE;
            let (count, size) = (u32_at(&self.bytes, count_at), u32_at(&self.bytes, size_at));
            if let (Some(count), Some(size)) = (count.checked_add(record_count), size.checked_add(body_size)) {
                self.bytes[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
                self.bytes[size_at..size_at + 4].copy_from_slice(&size.to_le_bytes());
                self.bytes.extend_from_slice(log_records);
                self.record_count += u64::from(record_count);
                return;
            }
        }
        self.open_run = Some(self.bytes.len());
        self.bytes.reserve(ENTRY_HEADER_SIZE + log_records.len());
        self.bytes.push(TAG_RUN);
        self.bytes.extend_from_slice(&partition.to_le_bytes());
        self.bytes.extend_from_slice(&first_offset.to_le_bytes());
        self.bytes.extend_from_slice(&record_count.to_le_bytes());
        self.bytes.extend_from_slice(&body_size.to_le_bytes());
        self.bytes.extend_from_slice(log_records);
        self.record_count += u64::from(record_count);
    }

    /// Whether the run whose header starts at `header` ends right before
    /// `offset` of `partition`.
    fn extends(&self, header: usize, partition: u32, offset: u64) -> bool {
        let run_partition = u32_at(&self.bytes, header + field::PARTITION);
        let base_offset = u64_at(&self.bytes, header + field::OFFSET);
        let count = u64::from(u32_at(&self.bytes, header + field::RECORD_COUNT));
        run_partition == partition && base_offset + count == offset
    }

    /// Appends a `truncated` notice: the cursor of `partition` at
    /// `requested` fell behind retention; reading continues at `earliest`.
    pub fn push_truncated(&mut self, partition: u32, requested: u64, earliest: u64) {
        self.open_run = None;
        self.bytes.push(TAG_TRUNCATED);
        self.bytes.extend_from_slice(&partition.to_le_bytes());
        self.bytes.extend_from_slice(&requested.to_le_bytes());
        self.bytes.extend_from_slice(&earliest.to_le_bytes());
        self.truncation_count += 1;
    }

    /// The entries, in the order they were appended.
    pub fn entries(&self) -> Entries<'_> {
        Entries { bytes: &self.bytes }
    }

    /// The offset of the first record of `partition`, if any.
    pub fn first_offset_of(&self, partition: u32) -> Option<u64> {
        self.entries().find_map(|entry| match entry {
            Entry::Run(run) if run.partition == partition => Some(run.base_offset),
            _ => None,
        })
    }
}

/// One entry of a [`FetchedRecords`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    Run(Run<'a>),
    Truncated { partition: u32, requested: u64, earliest: u64 },
}

/// Records of one partition with dense offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run<'a> {
    pub partition: u32,
    pub base_offset: u64,
    pub record_count: u32,
    /// The records in log format, back to back.
    pub log_records: &'a [u8],
}

impl<'a> Run<'a> {
    /// The records with their offsets.
    pub fn records(&self) -> RunRecords<'a> {
        RunRecords { bytes: self.log_records, offset: self.base_offset }
    }
}

/// Iterates the entries of a [`FetchedRecords`].
#[derive(Debug, Clone)]
pub struct Entries<'a> {
    bytes: &'a [u8],
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.bytes.is_empty() {
            return None;
        }
        let entry = parse_entry(self.bytes);
        debug_assert!(entry.is_some(), "fetched records that do not parse");
        let (entry, size) = entry?;
        self.bytes = &self.bytes[size..];
        Some(entry)
    }
}

/// The entry at the start of `bytes` and its size.
fn parse_entry(bytes: &[u8]) -> Option<(Entry<'_>, usize)> {
    let header = bytes.get(..ENTRY_HEADER_SIZE)?;
    let partition = u32_at(header, field::PARTITION);
    match header[field::TAG] {
        TAG_RUN => {
            let body_size = u32_at(header, field::BODY_SIZE) as usize;
            let log_records = bytes.get(ENTRY_HEADER_SIZE..ENTRY_HEADER_SIZE + body_size)?;
            let (base_offset, record_count) = (u64_at(header, field::OFFSET), u32_at(header, field::RECORD_COUNT));
            let run = Run { partition, base_offset, record_count, log_records };
            Some((Entry::Run(run), ENTRY_HEADER_SIZE + body_size))
        }
        TAG_TRUNCATED => {
            let (requested, earliest) = (u64_at(header, field::OFFSET), u64_at(header, field::EARLIEST));
            Some((Entry::Truncated { partition, requested, earliest }, ENTRY_HEADER_SIZE))
        }
        _ => None,
    }
}

/// Iterates the records of a [`Run`] as `(offset, record)`.
#[derive(Debug, Clone)]
pub struct RunRecords<'a> {
    bytes: &'a [u8],
    offset: u64,
}

impl RunRecords<'_> {
    /// Whether every record has been read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl<'a> Iterator for RunRecords<'a> {
    type Item = (u64, RecordRef<'a>);

    #[inline]
    fn next(&mut self) -> Option<(u64, RecordRef<'a>)> {
        if self.bytes.is_empty() {
            return None;
        }
        let record = decode_log_record(self.bytes);
        debug_assert!(record.is_some(), "a run that does not hold whole records");
        let record = record?;
        self.bytes = &self.bytes[record.log_record.len()..];
        let offset = self.offset;
        self.offset += 1;
        Some((offset, record))
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut field = [0; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(field)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut field = [0; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::encode_batch_record;

    fn log_records(payloads: &[&str]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for payload in payloads {
            let mut batch = Vec::new();
            encode_batch_record(&mut batch, 0, b"k", payload.as_bytes());
            bytes.extend_from_slice(&batch[4..]);
        }
        bytes
    }

    /// What the entries say, as plain values.
    fn described(records: &FetchedRecords) -> Vec<String> {
        let mut seen = Vec::new();
        for entry in records.entries() {
            match entry {
                Entry::Run(run) => {
                    assert_eq!(run.records().count(), run.record_count as usize);
                    for (offset, record) in run.records() {
                        let payload = String::from_utf8_lossy(record.payload);
                        seen.push(format!("{}@{offset}={payload}", run.partition));
                    }
                }
                Entry::Truncated { partition, requested, earliest } => {
                    seen.push(format!("truncated {partition} {requested}->{earliest}"));
                }
            }
        }
        seen
    }

    /// Spans that continue a run extend it (one header for the run); a new
    /// partition, a gap or a notice starts a new entry; everything reads
    /// back in order, with the counts and sizes the budgets use.
    #[test]
    fn spans_extend_runs_and_read_back() {
        let mut records = FetchedRecords::default();
        records.push_records(7, 10, 2, &log_records(&["a", "b"]));
        records.push_records(7, 12, 1, &log_records(&["c"]));
        assert_eq!(records.entries().count(), 1, "a continued run is one entry");
        records.push_records(8, 13, 1, &log_records(&["d"]));
        records.push_records(8, 20, 1, &log_records(&["gap"]));
        records.push_truncated(9, 0, 5);
        records.push_records(9, 5, 1, &log_records(&["e"]));
        assert_eq!(
            described(&records),
            ["7@10=a", "7@11=b", "7@12=c", "8@13=d", "8@20=gap", "truncated 9 0->5", "9@5=e"]
        );
        assert_eq!((records.record_count(), records.truncation_count()), (6, 1));
        let record_bytes = log_records(&["a", "b", "c", "d", "gap", "e"]).len();
        assert_eq!(records.size_bytes(), record_bytes + 5 * ENTRY_HEADER_SIZE);
        assert_eq!(
            (records.first_offset_of(8), records.first_offset_of(9), records.first_offset_of(3)),
            (Some(13), Some(5), None)
        );
    }

    /// An empty buffer has no entries and costs nothing.
    #[test]
    fn empty_records_say_nothing() {
        let records = FetchedRecords::default();
        assert!(records.is_empty());
        assert_eq!((records.entries().count(), records.size_bytes(), records.capacity()), (0, 0, 0));
    }
}
