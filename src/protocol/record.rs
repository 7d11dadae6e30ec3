//! Binary event records: the format of mesh batches and of the partition log.
//!
//! A batch record is `partition: u32 LE | key_size: u16 LE | payload_size:
//! u32 LE | key | payload`. The log stores the same record without the
//! partition prefix, so applying a batch is one copy of the tail of each
//! record. All sizes are fixed-width little-endian; `usize` never reaches the
//! wire unchecked: [`KEY_SIZE_LIMIT`] and [`PAYLOAD_SIZE_LIMIT`] are what the
//! fields hold, and the configuration refuses limits beyond them
//! ([`crate::config::ConfigError`]).

/// Bytes before the key in a log record: key size (2) + payload size (4).
pub const LOG_HEADER_SIZE: usize = 6;
/// The largest key a record can hold (a `u16` size field).
pub const KEY_SIZE_LIMIT: usize = u16::MAX as usize;
/// The largest payload a record can hold (a `u32` size field), less room for
/// the record header so a whole record's size also fits a `u32`.
pub const PAYLOAD_SIZE_LIMIT: usize = u32::MAX as usize - BATCH_HEADER_SIZE - KEY_SIZE_LIMIT;
/// Bytes before the key in a batch record: partition (4) + log header.
pub const BATCH_HEADER_SIZE: usize = 4 + LOG_HEADER_SIZE;

/// Size of an event's batch record; this is also what it costs in credits.
#[inline]
pub fn batch_record_size(key: &[u8], payload: &[u8]) -> usize {
    BATCH_HEADER_SIZE + key.len() + payload.len()
}

/// Appends one batch record. The caller bounds the key and payload sizes (the
/// line parser does, by limits the configuration keeps within the fields).
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
    Some(RecordRef {
        key: &record[LOG_HEADER_SIZE..LOG_HEADER_SIZE + key_size],
        payload: &record[LOG_HEADER_SIZE + key_size..],
        log_record: record,
    })
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
        let partition = u32::from_le_bytes(self.bytes.get(..4)?.try_into().ok()?);
        let record = decode_log_record(&self.bytes[4..]);
        assert!(record.is_some(), "corrupt batch: {} bytes left", self.bytes.len());
        let record = record?;
        self.bytes = &self.bytes[4 + record.log_record.len()..];
        Some((partition, record))
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
