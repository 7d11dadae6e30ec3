//! Binary event records: the format of mesh batches and of the partition log.
//!
//! A batch record is `partition: u32 LE | key_size: u16 LE | payload_size:
//! u32 LE | key | payload`. The log stores the same record without the
//! partition prefix, so applying a batch is one copy of the tail of each
//! record. The partition word's low 16 bits are the partition (ids are
//! below [`crate::config::limits::PARTITION_COUNT_MAX`]); its high 16 bits
//! are a hint for the owner's keyed aggregates, [`RecordRef::value_at`]
//! (0 for none): read every partition word through [`batch_partition`]. All sizes are fixed-width little-endian; `usize` never reaches the
//! wire unchecked: [`KEY_SIZE_LIMIT`] and [`PAYLOAD_SIZE_LIMIT`] are what the
//! fields hold, and the configuration refuses limits beyond them
//! ([`crate::config::ConfigError`]).
//!
//! # Extended records
//!
//! A Kafka producer's record carries more than a key and a payload: a key
//! that may be null or empty, a value that may be null, headers and its own
//! timestamp. It is stored as an *extended* record, marked by a key size of
//! 0 (a line's key is never empty, so no plain record has one):
//!
//! ```text
//! offset size field
//!      0    2 key_size      0: an extended record
//!      2    4 payload_size  u32 LE, bytes of the extension below
//!      6    1 flags         bit 0: the key is null, bit 1: the value is null
//!      7    8 timestamp_ms  i64 LE, the producer's timestamp (-1: none)
//!     15    4 key_size      u32 LE
//!     19    4 headers_size  u32 LE, bytes of the headers
//!     23      key, headers (Kafka's own encoding: a varint count, then each
//!             header's varint sizes and bytes, kept verbatim), value (the rest)
//! ```
//!
//! Every reader sees an extended record through the same [`RecordRef`]: its
//! `key` and `payload` are the Kafka key and value (empty when null), so a
//! `SUB` subscriber, a group member and an aggregate read a Kafka producer's
//! events like any other; the Kafka face also reads the rest. A frame that
//! holds extended records says so in its flags
//! ([`crate::storage::format`]), so an older spate refuses it rather than
//! misread it; frames of plain records are unchanged.

/// Bytes before the key in a log record: key size (2) + payload size (4).
pub const LOG_HEADER_SIZE: usize = 6;
/// The largest key a record can hold (a `u16` size field).
pub const KEY_SIZE_LIMIT: usize = u16::MAX as usize;
/// The largest payload a record can hold (a `u32` size field), less room for
/// the record header so a whole record's size also fits a `u32`.
pub const PAYLOAD_SIZE_LIMIT: usize = u32::MAX as usize - BATCH_HEADER_SIZE - KEY_SIZE_LIMIT;
/// Bytes before the key in a batch record: partition (4) + log header.
pub const BATCH_HEADER_SIZE: usize = 4 + LOG_HEADER_SIZE;
/// The partition in a batch record's partition word (module doc).
const PARTITION_MASK: u32 = 0xffff;
const _: () = assert!(crate::config::limits::PARTITION_COUNT_MAX <= PARTITION_MASK + 1);

/// The partition a batch record's partition word names (its low half).
#[inline(always)]
pub fn batch_partition(word: u32) -> u32 {
    word & PARTITION_MASK
}

/// The partition of the batch record at `position` in `records` (`None`
/// when the record's partition word is not all there).
#[inline(always)]
pub fn partition_at(records: &[u8], position: usize) -> Option<u32> {
    let word = records.get(position..position.checked_add(4)?)?;
    Some(batch_partition(u32::from_le_bytes([word[0], word[1], word[2], word[3]])))
}

/// A batch record's partition word: `partition` and the aggregates' value
/// hint ([`RecordRef::value_at`]).
#[inline(always)]
pub fn partition_word(partition: u32, value_at: u16) -> u32 {
    debug_assert!(partition <= PARTITION_MASK);
    partition | (u32::from(value_at) << 16)
}

/// Bytes of an extended record's fixed fields after the log header.
pub const EXTENDED_FIXED_SIZE: usize = 17;
/// Bytes of an extended batch record before its key: partition, log
/// header and the fixed fields.
const EXTENDED_HEAD_SIZE: usize = 4 + LOG_HEADER_SIZE + EXTENDED_FIXED_SIZE;
const EXTENDED_KEY_NULL: u8 = 1;
const EXTENDED_VALUE_NULL: u8 = 2;

/// A Kafka record as the Kafka face hands it to routing: borrowed slices of
/// the produce request, nothing copied until it is encoded into a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// Kafka's encoding of the record's headers (count and entries).
    pub headers: &'a [u8],
    pub timestamp_ms: i64,
}

impl ExtendedRecord<'_> {
    /// Bytes of its log record.
    #[inline]
    pub fn log_size(&self) -> usize {
        LOG_HEADER_SIZE
            + EXTENDED_FIXED_SIZE
            + self.key.map_or(0, <[u8]>::len)
            + self.headers.len()
            + self.value.map_or(0, <[u8]>::len)
    }

    /// Bytes of its batch record: what it costs in credits.
    #[inline]
    pub fn batch_size(&self) -> usize {
        4 + self.log_size()
    }
}

/// Appends one extended batch record. The caller bounds the sizes (the Kafka
/// face checks them against the record size limit, far below `u32`).
/// Inlined: the Kafka face stages every produced record with it.
#[inline(always)]
pub fn encode_extended_batch_record(batch: &mut Vec<u8>, partition: u32, record: &ExtendedRecord<'_>) {
    let extension_size = record.log_size() - LOG_HEADER_SIZE;
    assert!(extension_size <= PAYLOAD_SIZE_LIMIT, "extended record of {extension_size} bytes");
    let key = record.key.unwrap_or_default();
    let flags = if record.key.is_none() { EXTENDED_KEY_NULL } else { 0 }
        | if record.value.is_none() { EXTENDED_VALUE_NULL } else { 0 };
    // The fixed fields go in one copy from the stack (a Kafka record is
    // encoded once per event: field-by-field appends cost a capacity check
    // each).
    let mut head = [0u8; EXTENDED_HEAD_SIZE];
    head[0..4].copy_from_slice(&partition.to_le_bytes());
    // head[4..6]: key size 0, an extended record.
    // Exact casts: every part is within the extension, checked above.
    head[6..10].copy_from_slice(&(extension_size as u32).to_le_bytes());
    head[10] = flags;
    head[11..19].copy_from_slice(&record.timestamp_ms.to_le_bytes());
    head[19..23].copy_from_slice(&(key.len() as u32).to_le_bytes());
    head[23..27].copy_from_slice(&(record.headers.len() as u32).to_le_bytes());
    batch.reserve(record.batch_size());
    batch.extend_from_slice(&head);
    batch.extend_from_slice(key);
    match record.headers {
        // No headers (a count of 0): most records, one byte.
        [count] => batch.push(*count),
        headers => batch.extend_from_slice(headers),
    }
    batch.extend_from_slice(record.value.unwrap_or_default());
}

/// Size of an event's batch record; this is also what it costs in credits.
#[inline]
pub fn batch_record_size(key: &[u8], payload: &[u8]) -> usize {
    BATCH_HEADER_SIZE + key.len() + payload.len()
}

/// Appends one batch record. The caller bounds the key and payload sizes (the
/// line parser does, by limits the configuration keeps within the fields).
/// `partition` is the partition word: the partition, or
/// [`partition_word`] with a value hint.
#[inline]
pub fn encode_batch_record(batch: &mut Vec<u8>, partition: u32, key: &[u8], payload: &[u8]) {
    assert!(!key.is_empty() && key.len() <= KEY_SIZE_LIMIT, "key of {} bytes", key.len());
    assert!(payload.len() <= PAYLOAD_SIZE_LIMIT, "payload of {} bytes", payload.len());
    batch.reserve(batch_record_size(key, payload));
    batch.extend_from_slice(&partition.to_le_bytes());
    // Both casts are exact: checked against the field limits above.
    batch.extend_from_slice(&(key.len() as u16).to_le_bytes());
    batch.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    batch.extend_from_slice(key);
    batch.extend_from_slice(payload);
}

/// One event inside a batch or a log segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub key: &'a [u8],
    pub payload: &'a [u8],
    /// The record in log format (header, key, payload), ready to copy.
    pub log_record: &'a [u8],
    /// What only an extended (Kafka) record has; `None` for a plain one.
    pub extended: Option<Extension<'a>>,
    /// Where, in the payload, the value the stream's keyed aggregates read
    /// starts, plus one; 0 when not known. The JSON listener finds it while
    /// it validates the line ([`crate::protocol::json::parse_json_line_with`])
    /// and it travels in the batch record's partition word, so the owner
    /// does not scan the JSON for it again
    /// ([`crate::protocol::json::extract_value_at`] checks it). Only batch
    /// records carry it: a record read from the log has 0.
    pub value_at: u16,
}

/// The parts of an extended record beyond its key and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extension<'a> {
    pub key_is_null: bool,
    pub value_is_null: bool,
    pub timestamp_ms: i64,
    /// Kafka's encoding of the headers, verbatim.
    pub headers: &'a [u8],
}

/// Decodes the log record at the start of `bytes`; returns it and its size.
/// `None` means the bytes are not a whole record (a bug: batches are built by
/// [`encode_batch_record`] only).
#[inline]
pub fn decode_log_record(bytes: &[u8]) -> Option<RecordRef<'_>> {
    let key_size = usize::from(u16::from_le_bytes(bytes.get(0..2)?.try_into().ok()?));
    let payload_size = u32::from_le_bytes(bytes.get(2..6)?.try_into().ok()?) as usize;
    let size = LOG_HEADER_SIZE + key_size + payload_size;
    let record = bytes.get(..size)?;
    if key_size == 0 {
        return decode_extended(record);
    }
    Some(RecordRef {
        key: &record[LOG_HEADER_SIZE..LOG_HEADER_SIZE + key_size],
        payload: &record[LOG_HEADER_SIZE + key_size..],
        log_record: record,
        extended: None,
        value_at: 0,
    })
}

/// Decodes a whole extended record (see the module doc); `None` if its
/// parts do not add up.
fn decode_extended(record: &[u8]) -> Option<RecordRef<'_>> {
    let fixed = record.get(LOG_HEADER_SIZE..LOG_HEADER_SIZE + EXTENDED_FIXED_SIZE)?;
    let flags = fixed[0];
    let timestamp_ms = i64::from_le_bytes(fixed[1..9].try_into().ok()?);
    let key_size = u32::from_le_bytes(fixed[9..13].try_into().ok()?) as usize;
    let headers_size = u32::from_le_bytes(fixed[13..17].try_into().ok()?) as usize;
    let rest = &record[LOG_HEADER_SIZE + EXTENDED_FIXED_SIZE..];
    let key = rest.get(..key_size)?;
    let headers = rest.get(key_size..key_size.checked_add(headers_size)?)?;
    let payload = &rest[key_size + headers_size..];
    let extension = Extension {
        key_is_null: flags & EXTENDED_KEY_NULL != 0,
        value_is_null: flags & EXTENDED_VALUE_NULL != 0,
        timestamp_ms,
        headers,
    };
    Some(RecordRef { key, payload, log_record: record, extended: Some(extension), value_at: 0 })
}

/// Iterates the records of a batch as `(partition, record)`.
pub struct BatchIter<'a> {
    bytes: &'a [u8],
}

impl<'a> BatchIter<'a> {
    pub fn new(bytes: &'a [u8]) -> BatchIter<'a> {
        BatchIter { bytes }
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = (u32, RecordRef<'a>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.bytes.is_empty() {
            return None;
        }
        let word = u32::from_le_bytes(self.bytes.get(..4)?.try_into().ok()?);
        let record = decode_log_record(&self.bytes[4..]);
        assert!(record.is_some(), "corrupt batch: {} bytes left", self.bytes.len());
        let mut record = record?;
        record.value_at = (word >> 16) as u16;
        self.bytes = &self.bytes[4 + record.log_record.len()..];
        Some((batch_partition(word), record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records round-trip through a batch, in order, with exact sizes.
    #[test]
    fn batch_records_round_trip() {
        let mut batch = Vec::new();
        encode_batch_record(&mut batch, 7, b"user42", b"hello");
        encode_batch_record(&mut batch, 65_000, b"k", b"");
        encode_batch_record(&mut batch, 0, &[b'x'; 255], &[0xff; 300]);
        assert_eq!(
            batch.len(),
            batch_record_size(b"user42", b"hello") + batch_record_size(b"k", b"") + BATCH_HEADER_SIZE + 555
        );
        let records: Vec<_> = BatchIter::new(&batch).collect();
        assert_eq!(records.len(), 3);
        assert_eq!((records[0].0, records[0].1.key, records[0].1.payload), (7, &b"user42"[..], &b"hello"[..]));
        assert_eq!((records[1].0, records[1].1.key, records[1].1.payload), (65_000, &b"k"[..], &b""[..]));
        assert_eq!(records[2].1.payload.len(), 300);
        assert_eq!(decode_log_record(records[0].1.log_record), Some(records[0].1));
    }

    /// An extended record keeps a null key apart from an empty one, and its
    /// headers and timestamp, and reads back through the same iterator as
    /// plain records.
    #[test]
    fn extended_records_round_trip_among_plain_ones() {
        let mut batch = Vec::new();
        let kafka = ExtendedRecord { key: None, value: Some(b"v1"), headers: b"\x02\x02h\x02x", timestamp_ms: 1_700 };
        encode_extended_batch_record(&mut batch, 3, &kafka);
        encode_batch_record(&mut batch, 4, b"plain", b"line");
        let empty = ExtendedRecord { key: Some(b""), value: None, headers: b"\x00", timestamp_ms: -1 };
        encode_extended_batch_record(&mut batch, 5, &empty);
        assert_eq!(batch.len(), kafka.batch_size() + batch_record_size(b"plain", b"line") + empty.batch_size());
        let records: Vec<_> = BatchIter::new(&batch).collect();
        let first = records[0].1;
        assert_eq!((records[0].0, first.key, first.payload), (3, &b""[..], &b"v1"[..]));
        let extension = first.extended.unwrap();
        assert!(extension.key_is_null && !extension.value_is_null);
        assert_eq!((extension.timestamp_ms, extension.headers), (1_700, &b"\x02\x02h\x02x"[..]));
        assert_eq!(records[1].1.extended, None);
        let third = records[2].1.extended.unwrap();
        assert!(!third.key_is_null && third.value_is_null && third.timestamp_ms == -1);
        for size in 0..first.log_record.len() {
            assert_eq!(decode_log_record(&first.log_record[..size]), None, "size {size}");
        }
    }

    /// A value hint rides in the partition word's high half: the iterator
    /// gives the partition alone and the hint on the record; a log record
    /// has none.
    #[test]
    fn a_value_hint_rides_in_the_partition_word() {
        let mut batch = Vec::new();
        encode_batch_record(&mut batch, partition_word(65_535, 42), b"k", br#"{"ms":7}"#);
        encode_batch_record(&mut batch, 3, b"k", b"v");
        let records: Vec<_> = BatchIter::new(&batch).collect();
        assert_eq!((records[0].0, records[0].1.value_at), (65_535, 42));
        assert_eq!((records[1].0, records[1].1.value_at), (3, 0));
        assert_eq!(decode_log_record(records[0].1.log_record).map(|record| record.value_at), Some(0));
        assert_eq!(batch_partition(partition_word(9, u16::MAX)), 9);
    }

    /// A truncated record decodes to nothing rather than reading past the end.
    #[test]
    fn truncated_log_record_is_rejected() {
        let mut batch = Vec::new();
        encode_batch_record(&mut batch, 1, b"key", b"payload");
        let log = &batch[4..];
        for size in 0..log.len() {
            assert_eq!(decode_log_record(&log[..size]), None, "size {size}");
        }
    }
}
