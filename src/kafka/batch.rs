//! Kafka record batches (magic 2) to and from spate's records.
//!
//! A produce request's records are read in place: the batch header and its
//! CRC32C are checked by the `kafka-protocol` crate's own decoder
//! ([`RecordBatchDecoder::decode_batch_info`]), and the records are walked
//! here as borrowed slices (the crate keeps its varint codec private: the
//! zigzag varints are read by [`get_varlong`], a dozen lines tested against
//! the crate's encoder). The crate's
//! full decoder would build a `Vec<Record>` with an `IndexMap` of headers
//! per record (an allocation per event, and duplicate header keys, which
//! Kafka allows, collapsed), and reserves `record_count` entries up front,
//! however few bytes follow it. Headers are kept verbatim instead, so they
//! come back exactly as sent.
//!
//! A fetch's records are written as one batch per run of the reply
//! ([`write_batch`]); the tests check both directions against the crate's
//! decoder and encoder.

use bytes::{Buf, Bytes};
use kafka_protocol::records::{Compression, RecordBatchDecoder};

use crate::config::limits::{KAFKA_STAGED_BYTES_MAX, KAFKA_STAGED_RECORDS_MAX};
use crate::protocol::record::{ExtendedRecord, RecordRef, encode_extended_batch_record};

/// Bytes of a v2 batch header, before its records.
pub const BATCH_HEADER_SIZE: usize = 61;
/// The smallest record: size, attributes, timestamp and offset deltas, key
/// and value sizes and the header count, one byte each.
const RECORD_SIZE_MIN: usize = 7;
/// Where the attributes start: the CRC covers them and all that follows.
const CRC_START: usize = 21;

/// Why a produced batch is refused, with the Kafka error code each gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Truncated, a bad CRC, sizes that do not add up (CORRUPT_MESSAGE).
    Corrupt(String),
    /// Compressed batches are not taken (UNSUPPORTED_COMPRESSION_TYPE).
    Compressed(Compression),
    /// A record over the size limit (MESSAGE_TOO_LARGE).
    TooLarge { record_size: usize, record_size_max: usize },
    /// Magic 0 or 1 message sets (CORRUPT_MESSAGE: clients that negotiate
    /// Produce v3 or later never send them).
    OldFormat(i8),
}

impl BatchError {
    pub fn code(&self) -> i16 {
        match self {
            BatchError::Corrupt(_) | BatchError::OldFormat(_) => super::codes::CORRUPT_MESSAGE,
            BatchError::Compressed(_) => super::codes::UNSUPPORTED_COMPRESSION_TYPE,
            BatchError::TooLarge { .. } => super::codes::MESSAGE_TOO_LARGE,
        }
    }
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::Corrupt(why) => write!(f, "corrupt record batch: {why}"),
            BatchError::Compressed(compression) => {
                write!(f, "compressed batches ({compression:?}) are not supported: produce uncompressed")
            }
            BatchError::TooLarge { record_size, record_size_max } => {
                write!(f, "record of {record_size} bytes is over the limit of {record_size_max}")
            }
            BatchError::OldFormat(magic) => write!(f, "message format v{magic} is not supported (v2 only)"),
        }
    }
}

/// A checked batch's header: who produced it, and where its records are.
#[derive(Debug, Clone, Copy)]
pub struct CheckedBatch {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
    pub base_timestamp: i64,
    /// Its records section (after the batch header), as positions in the
    /// partition entry's bytes.
    records_start: usize,
    records_end: usize,
    /// Its first record's index in [`EntryCheck`]'s staged records.
    first_staged: usize,
}

impl CheckedBatch {
    /// Who produced it and its sequences, for the idempotence check.
    pub fn identity(&self) -> super::producers::BatchIdentity {
        super::producers::BatchIdentity {
            producer_id: self.producer_id,
            epoch: self.producer_epoch,
            first_sequence: self.base_sequence,
            record_count: self.record_count,
        }
    }
}

/// The check of one partition entry of a Produce request (every batch),
/// kept for routing it: each batch's header and, for an entry within
/// [`KAFKA_STAGED_RECORDS_MAX`] records and [`KAFKA_STAGED_BYTES_MAX`]
/// bytes, every record already encoded as the extended batch record routing
/// appends to its owner's batch ([`encode_extended_batch_record`]). So a
/// record is decoded and encoded once, while it is checked, and routing
/// copies whole runs of them with one credit check per run
/// ([`crate::routing::route_encoded`]); a larger entry (rare: a client's
/// batches for one partition are at most `batch.size`, 1 MiB for
/// librdkafka, 16 KiB for the Java client) is walked again as it is routed,
/// so the staging stays within a fixed size. One per connection, reused by
/// every request (no allocation per record, nor per request once grown).
#[derive(Debug, Default)]
pub struct EntryCheck {
    batches: Vec<CheckedBatch>,
    /// The staged records, encoded back to back.
    encoded: Vec<u8>,
    /// Where each staged record ends in `encoded`.
    ends: Vec<u32>,
    /// Every record of the entry is staged.
    all_staged: bool,
}

/// How many bytes more a record takes staged than in its Kafka batch, at
/// most: staged, it has a 27-byte head (partition, log header, the
/// extended fixed fields) besides its key, headers and value; in the batch,
/// at least 6 (its size, attributes, both deltas and the key and value
/// sizes, a byte each).
const STAGED_GROWTH_BYTES_MAX: usize =
    4 + crate::protocol::record::LOG_HEADER_SIZE + crate::protocol::record::EXTENDED_FIXED_SIZE - 6;

/// Batches of one entry whose headers an [`EntryCheck`] keeps between
/// requests; a request with more frees what is above it once routed.
const CHECKED_BATCHES_KEPT_MAX: usize = 64;

/// Bytes of one staged record's end: what [`KAFKA_STAGED_RECORDS_MAX`]
/// costs besides [`KAFKA_STAGED_BYTES_MAX`].
pub const STAGED_RECORD_BYTES: usize = std::mem::size_of::<u32>();

impl EntryCheck {
    /// Checks every batch of a partition entry's produce data (CRC, format,
    /// compression, each record's framing and size) before any record is
    /// routed, so a partition's data is taken whole or refused whole, and
    /// stages what routing needs for (global) `partition`
    /// ([`EntryCheck::staged`]).
    pub fn check(&mut self, data: &Bytes, partition: u32, record_size_max: usize) -> Result<(), BatchError> {
        self.batches.clear();
        self.encoded.clear();
        self.ends.clear();
        self.all_staged = true;
        let mut rest = data.clone();
        while rest.has_remaining() {
            let mut batch = check_batch(&mut rest, data.len())?;
            batch.first_staged = self.ends.len();
            self.all_staged &= self.ends.len() + batch.record_count as usize <= KAFKA_STAGED_RECORDS_MAX;
            self.check_records(&data[batch.records_start..batch.records_end], &batch, partition, record_size_max)?;
            self.batches.push(batch);
        }
        if !self.all_staged {
            self.encoded.clear();
            self.ends.clear();
        }
        Ok(())
    }

    /// Checks the records of `batch` (`records`, its records section, which
    /// must hold exactly `record_count` records) and stages them while the
    /// entry is staged. One loop, the record parsed in place (no iterator
    /// of `Result`s), and the staging grown once per batch, not per record.
    #[inline]
    fn check_records(
        &mut self,
        mut records: &[u8],
        batch: &CheckedBatch,
        partition: u32,
        record_size_max: usize,
    ) -> Result<(), BatchError> {
        let record_count = batch.record_count as usize;
        if self.all_staged {
            // What the batch's records take staged, at most; when that
            // passes the bound, `stage` finds out record by record.
            let needed = self.encoded.len() + records.len() + record_count * STAGED_GROWTH_BYTES_MAX;
            if needed <= KAFKA_STAGED_BYTES_MAX {
                self.reserve_staged(needed);
            }
            self.ends.reserve(record_count);
        }
        for _ in 0..record_count {
            let record = parse_record(&mut records, batch.base_timestamp).map_err(corrupt)?;
            let record_size = record.log_size();
            if record_size > record_size_max {
                return Err(BatchError::TooLarge { record_size, record_size_max });
            }
            if self.all_staged {
                self.stage(partition, &record);
            }
        }
        if !records.is_empty() {
            return Err(BatchError::Corrupt(format!("{} bytes after the last record", records.len())));
        }
        Ok(())
    }

    /// Grows the staging to hold `needed` bytes, doubling, but never past
    /// [`KAFKA_STAGED_BYTES_MAX`] (the memory formula's bound).
    #[inline]
    fn reserve_staged(&mut self, needed: usize) {
        if needed > self.encoded.capacity() {
            let capacity = needed.max(2 * self.encoded.capacity()).min(KAFKA_STAGED_BYTES_MAX);
            self.encoded.reserve_exact(capacity.saturating_sub(self.encoded.len()));
        }
    }

    /// Encodes `record` behind the staged ones, unless that would pass
    /// [`KAFKA_STAGED_BYTES_MAX`] (then nothing of the entry is staged).
    #[inline]
    fn stage(&mut self, partition: u32, record: &ExtendedRecord<'_>) {
        let needed = self.encoded.len() + record.batch_size();
        if needed > KAFKA_STAGED_BYTES_MAX {
            self.all_staged = false;
            return;
        }
        self.reserve_staged(needed);
        encode_extended_batch_record(&mut self.encoded, partition, record);
        // Exact: the staged bytes are within KAFKA_STAGED_BYTES_MAX.
        self.ends.push(self.encoded.len() as u32);
    }

    /// The batches checked last, in order.
    pub fn batches(&self) -> &[CheckedBatch] {
        &self.batches
    }

    /// Batch `index`'s records, encoded for routing, when the entry was
    /// staged whole.
    pub fn staged(&self, index: usize) -> Option<StagedRun<'_>> {
        if !self.all_staged {
            return None;
        }
        let batch = &self.batches[index];
        let first = batch.first_staged;
        let start = if first == 0 { 0 } else { self.ends[first - 1] as usize };
        Some(StagedRun { encoded: &self.encoded, start, ends: &self.ends[first..first + batch.record_count as usize] })
    }

    /// The records of batch `index` of the entry checked last, whose bytes
    /// are `data` (the same bytes [`EntryCheck::check`] took), decoded
    /// again, in order: for an entry too large to stage.
    pub fn records<'a>(&'a self, data: &'a [u8], index: usize) -> impl Iterator<Item = ExtendedRecord<'a>> + 'a {
        let batch = &self.batches[index];
        let bytes = &data[batch.records_start..batch.records_end];
        // Checked: a record that does not parse cannot occur here; it would
        // end the walk, never be routed half-read.
        Records { bytes, left: batch.record_count, base_timestamp: batch.base_timestamp }.map_while(Result::ok)
    }

    /// Frees what a request larger than most grew: the staging is kept at
    /// most [`KAFKA_STAGED_BYTES_MAX`] between requests.
    pub fn trim(&mut self) {
        self.batches.clear();
        self.batches.shrink_to(CHECKED_BATCHES_KEPT_MAX);
        self.encoded.clear();
        self.ends.clear();
    }
}

/// One checked batch's records, encoded as routing appends them: record
/// `i` is `encoded[ends[i - 1]..ends[i]]`, the first starting at `start`.
#[derive(Debug, Clone, Copy)]
pub struct StagedRun<'a> {
    pub encoded: &'a [u8],
    pub start: usize,
    pub ends: &'a [u32],
}

/// Splits the next batch off `rest` (the tail of a partition entry of
/// `entry_size` bytes) and checks its header and CRC.
fn check_batch(rest: &mut Bytes, entry_size: usize) -> Result<CheckedBatch, BatchError> {
    let data = rest;
    if data.len() < BATCH_HEADER_SIZE {
        return Err(BatchError::Corrupt(format!(
            "{} bytes left, a batch header needs {BATCH_HEADER_SIZE}",
            data.len()
        )));
    }
    let magic = data[16] as i8;
    if magic != 2 {
        return Err(BatchError::OldFormat(magic));
    }
    let length = i32::from_be_bytes([data[8], data[9], data[10], data[11]]);
    let size = usize::try_from(length).ok().and_then(|length| length.checked_add(12));
    let Some(size) = size.filter(|&size| size >= BATCH_HEADER_SIZE && size <= data.len()) else {
        return Err(BatchError::Corrupt(format!("batch length {length} with {} bytes left", data.len())));
    };
    let start = entry_size - data.len();
    let mut whole = data.split_to(size);
    let infos =
        RecordBatchDecoder::decode_batch_info(&mut whole).map_err(|error| BatchError::Corrupt(error.to_string()))?;
    let Some(info) = infos.into_iter().next() else {
        return Err(BatchError::Corrupt("no batch".into()));
    };
    if info.compression != Compression::None {
        return Err(BatchError::Compressed(info.compression));
    }
    let records_size = size - BATCH_HEADER_SIZE;
    let count_max = records_size / RECORD_SIZE_MIN;
    if info.record_count < 0 || info.record_count as usize > count_max {
        return Err(BatchError::Corrupt(format!("{} records in {records_size} bytes", info.record_count)));
    }
    Ok(CheckedBatch {
        producer_id: info.producer_id,
        producer_epoch: info.producer_epoch,
        base_sequence: info.base_sequence,
        record_count: info.record_count,
        base_timestamp: info.min_timestamp,
        records_start: start + BATCH_HEADER_SIZE,
        records_end: start + size,
        first_staged: 0,
    })
}

/// The records of a checked batch, decoded as they are walked.
pub struct Records<'a> {
    bytes: &'a [u8],
    left: i32,
    base_timestamp: i64,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<ExtendedRecord<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return (!self.bytes.is_empty())
                .then(|| Err(BatchError::Corrupt(format!("{} bytes after the last record", self.bytes.len()))));
        }
        self.left -= 1;
        let parsed = parse_record(&mut self.bytes, self.base_timestamp).map_err(corrupt);
        if parsed.is_err() {
            self.left = 0;
            self.bytes = &[];
        }
        Some(parsed)
    }
}

/// Reads one zigzag varint (Kafka's `varint` and `varlong`, at most 10
/// bytes) off the front of `bytes`.
#[inline]
pub fn get_varlong(bytes: &mut &[u8]) -> Option<i64> {
    // Most varints of a record (attributes aside, every field) are one
    // byte (sizes and deltas under 64) or two (under 8192: a record's size,
    // a value of 64 bytes or more).
    match **bytes {
        [byte, ..] if byte & 0x80 == 0 => {
            *bytes = &bytes[1..];
            return Some(i64::from(byte >> 1) ^ -i64::from(byte & 1));
        }
        [low, high, ..] if high & 0x80 == 0 => {
            *bytes = &bytes[2..];
            let value = u64::from(low & 0x7f) | u64::from(high) << 7;
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
        _ => {}
    }
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            *bytes = &bytes[index + 1..];
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    None
}

fn corrupt(what: &str) -> BatchError {
    BatchError::Corrupt(format!("record {what}"))
}

/// The part of a record that does not parse, named in its
/// [`BatchError::Corrupt`]: the decode passes this word around, and the
/// error (a `String`) is built only once a record is refused, so the hot
/// loop moves small values.
type BadPart = &'static str;

/// A varint that must fit an `i32`, `what` naming it if it does not parse.
#[inline(always)]
fn varint_of(bytes: &mut &[u8], what: BadPart) -> Result<i32, BadPart> {
    get_varlong(bytes).and_then(|value| i32::try_from(value).ok()).ok_or(what)
}

/// A varint-prefixed byte string: `None` for size -1 (null).
#[inline(always)]
fn nullable<'a>(bytes: &mut &'a [u8], what: BadPart) -> Result<Option<&'a [u8]>, BadPart> {
    let size = varint_of(bytes, what)?;
    if size == -1 {
        return Ok(None);
    }
    let size = usize::try_from(size).map_err(|_| what)?;
    let (taken, rest) = bytes.split_at_checked(size).ok_or(what)?;
    *bytes = rest;
    Ok(Some(taken))
}

/// Parses one record off the front of `bytes`.
#[inline(always)]
fn parse_record<'a>(bytes: &mut &'a [u8], base_timestamp: i64) -> Result<ExtendedRecord<'a>, BadPart> {
    let size = usize::try_from(varint_of(bytes, "size")?).map_err(|_| "size")?;
    let (record, rest) = bytes.split_at_checked(size).ok_or("size")?;
    *bytes = rest;
    // The attributes (one byte, unused: a record has none of its own).
    let mut record = record.get(1..).ok_or("attributes")?;
    let timestamp_delta = get_varlong(&mut record).ok_or("timestamp")?;
    let _offset_delta = varint_of(&mut record, "offset delta")?;
    let key = nullable(&mut record, "key")?;
    let value = nullable(&mut record, "value")?;
    let headers = record;
    if headers != [0] {
        // No headers (a count of 0) is most records; others are walked.
        check_headers(headers)?;
    }
    Ok(ExtendedRecord { key, value, headers, timestamp_ms: base_timestamp.wrapping_add(timestamp_delta) })
}

/// Checks that `headers` is exactly a header count and that many headers.
#[inline(never)]
fn check_headers(mut headers: &[u8]) -> Result<(), BadPart> {
    let count = varint_of(&mut headers, "header count")?;
    if count < 0 || count as usize > headers.len() {
        return Err("header count");
    }
    for _ in 0..count {
        if nullable(&mut headers, "header key")?.is_none() {
            return Err("header key");
        }
        nullable(&mut headers, "header value")?;
    }
    if !headers.is_empty() {
        return Err("headers");
    }
    Ok(())
}

/// Appends a zigzag varint (Kafka's `varint`/`varlong`).
fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varlong(out, -1),
        Some(bytes) => {
            put_varlong(out, bytes.len() as i64);
            out.extend_from_slice(bytes);
        }
    }
}

/// The Kafka view of a stored record: a plain (line) record has a key, a
/// value, no headers and no timestamp of its own (-1).
fn kafka_parts<'a>(record: &RecordRef<'a>) -> ExtendedRecord<'a> {
    match record.extended {
        None => ExtendedRecord { key: Some(record.key), value: Some(record.payload), headers: &[0], timestamp_ms: -1 },
        Some(extension) => ExtendedRecord {
            key: (!extension.key_is_null).then_some(record.key),
            value: (!extension.value_is_null).then_some(record.payload),
            headers: extension.headers,
            timestamp_ms: extension.timestamp_ms,
        },
    }
}

/// Appends one v2 batch holding `records` (dense offsets from
/// `base_offset`, at least one record) to `out`: no producer id, no
/// compression, CreateTime timestamps (the producer's; -1 for events that
/// came in as lines).
pub fn write_batch<'a>(out: &mut Vec<u8>, base_offset: u64, records: impl Iterator<Item = RecordRef<'a>> + Clone) {
    let start = out.len();
    let first_timestamp = records.clone().next().map_or(-1, |record| kafka_parts(&record).timestamp_ms);
    out.extend_from_slice(&(base_offset as i64).to_be_bytes());
    out.extend_from_slice(&[0; 4]); // batch length, below
    out.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
    out.push(2); // magic
    out.extend_from_slice(&[0; 4]); // crc, below
    out.extend_from_slice(&0i16.to_be_bytes()); // attributes
    out.extend_from_slice(&[0; 4]); // last offset delta, below
    out.extend_from_slice(&first_timestamp.to_be_bytes());
    out.extend_from_slice(&[0; 8]); // max timestamp, below
    out.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    out.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    out.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    out.extend_from_slice(&[0; 4]); // record count, below
    let (mut count, mut max_timestamp) = (0i32, first_timestamp);
    for record in records {
        let parts = kafka_parts(&record);
        max_timestamp = max_timestamp.max(parts.timestamp_ms);
        write_record(out, count, parts.timestamp_ms.wrapping_sub(first_timestamp), &parts);
        count += 1;
    }
    let length = (out.len() - start - 12) as i32;
    out[start + 8..start + 12].copy_from_slice(&length.to_be_bytes());
    out[start + 23..start + 27].copy_from_slice(&(count - 1).to_be_bytes());
    out[start + 35..start + 43].copy_from_slice(&max_timestamp.to_be_bytes());
    out[start + 57..start + 61].copy_from_slice(&count.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + CRC_START..]);
    out[start + 17..start + 21].copy_from_slice(&crc.to_be_bytes());
}

/// How many of `records` (the first at least, when `at_least_one`) fit in
/// one batch ([`write_batch`]) of at most `bytes_max` bytes: Kafka's
/// `max_bytes` and `partition_max_bytes` count the batches a Fetch answers.
pub fn records_fitting<'a>(
    records: impl Iterator<Item = RecordRef<'a>>,
    bytes_max: usize,
    at_least_one: bool,
) -> usize {
    let mut records = records.peekable();
    let first_timestamp = records.peek().map_or(-1, |record| kafka_parts(record).timestamp_ms);
    let (mut count, mut size) = (0usize, BATCH_HEADER_SIZE);
    for record in records {
        let parts = kafka_parts(&record);
        let offset_delta = i32::try_from(count).unwrap_or(i32::MAX);
        size += record_size(offset_delta, parts.timestamp_ms.wrapping_sub(first_timestamp), &parts);
        if size > bytes_max && !(at_least_one && count == 0) {
            break;
        }
        count += 1;
    }
    count
}

/// The most bytes a batch of `record_count` records whose log records
/// take `log_bytes` can render to: a log record holds its key, value and
/// headers, and a rendered one adds at most its length, attributes, two
/// deltas and two sizes as varints ([`RECORD_OVERHEAD_BYTES_MAX`]). When
/// this fits, [`records_fitting`] need not count.
pub fn batch_size_bound(record_count: usize, log_bytes: usize) -> usize {
    BATCH_HEADER_SIZE + log_bytes + record_count * RECORD_OVERHEAD_BYTES_MAX
}

/// A rendered record's bytes besides its key, value and headers, at most:
/// a length (5 bytes for any size here), attributes (1), timestamp and
/// offset deltas (10 and 5) and key and value sizes (5 each).
const RECORD_OVERHEAD_BYTES_MAX: usize = 5 + 1 + 10 + 5 + 5 + 5;

/// Bytes of one record as [`write_record`] writes it, its length included.
fn record_size(offset_delta: i32, timestamp_delta: i64, record: &ExtendedRecord<'_>) -> usize {
    let size = record_body_size(offset_delta, timestamp_delta, record);
    varlong_size(size as i64) + size
}

/// Bytes of one record after its length.
fn record_body_size(offset_delta: i32, timestamp_delta: i64, record: &ExtendedRecord<'_>) -> usize {
    1 + varlong_size(timestamp_delta)
        + varlong_size(i64::from(offset_delta))
        + nullable_size(record.key)
        + nullable_size(record.value)
        + record.headers.len()
}

/// Appends one record, its size computed first (no second pass, no move).
fn write_record(out: &mut Vec<u8>, offset_delta: i32, timestamp_delta: i64, record: &ExtendedRecord<'_>) {
    let ExtendedRecord { key, value, headers, .. } = *record;
    let size = record_body_size(offset_delta, timestamp_delta, record);
    put_varlong(out, size as i64);
    out.push(0); // attributes
    put_varlong(out, timestamp_delta);
    put_varlong(out, i64::from(offset_delta));
    put_nullable(out, key);
    put_nullable(out, value);
    out.extend_from_slice(headers);
}

fn varlong_size(value: i64) -> usize {
    let zigzag = ((value << 1) ^ (value >> 63)) as u64;
    (64 - zigzag.leading_zeros() as usize).max(1).div_ceil(7)
}

fn nullable_size(bytes: Option<&[u8]>) -> usize {
    match bytes {
        None => 1,
        Some(bytes) => varlong_size(bytes.len() as i64) + bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    /// `records_fitting` counts exactly what `write_batch` writes: the most
    /// records whose batch stays within the size (one at least when asked),
    /// and `batch_size_bound` is never below a batch's real size.
    #[test]
    fn records_fitting_counts_what_write_batch_writes() {
        let mut stored = Vec::new();
        for index in 0..40 {
            let payload = "p".repeat(index * 7);
            crate::protocol::record::encode_batch_record(
                &mut stored,
                0,
                format!("key{index}").as_bytes(),
                payload.as_bytes(),
            );
        }
        let records: Vec<RecordRef<'_>> = crate::protocol::record::BatchIter::new(&stored).map(|(_, r)| r).collect();
        let log_bytes: usize = records.iter().map(|record| record.log_record.len()).sum();
        let mut whole = Vec::new();
        write_batch(&mut whole, 0, records.iter().copied());
        assert!(batch_size_bound(records.len(), log_bytes) >= whole.len());
        for bytes_max in [0, 60, 100, 500, 1000, 3000, whole.len() - 1, whole.len()] {
            let count = records_fitting(records.iter().copied(), bytes_max, false);
            let size = |count: usize| {
                let mut out = Vec::new();
                write_batch(&mut out, 0, records.iter().copied().take(count));
                out.len()
            };
            if count > 0 {
                assert!(size(count) <= bytes_max, "{count} records within {bytes_max}");
            }
            if count < records.len() {
                assert!(size(count + 1) > bytes_max, "one more passes {bytes_max}");
            }
            assert_eq!(records_fitting(records.iter().copied(), bytes_max, true), count.max(1));
        }
    }

    fn crate_record(key: Option<&'static [u8]>, value: Option<&'static [u8]>, timestamp: i64) -> Record {
        let mut headers = IndexMap::new();
        headers.insert(StrBytes::from_static_str("trace"), Some(Bytes::from_static(b"abc")));
        headers.insert(StrBytes::from_static_str("none"), None);
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: 0,
            timestamp,
            key: key.map(Bytes::from_static),
            value: value.map(Bytes::from_static),
            headers,
        }
    }

    fn encoded(records: &[Record]) -> Bytes {
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buffer, records, &options).unwrap();
        buffer.freeze()
    }

    /// `data` checked as a partition entry.
    fn check_batches(data: Bytes, record_size_max: usize) -> Result<EntryCheck, BatchError> {
        let mut check = EntryCheck::default();
        check.check(&data, 0, record_size_max).map(|()| check)
    }

    /// What the crate's encoder writes, this walker reads: null and empty
    /// keys apart, values, timestamps and headers (verbatim).
    #[test]
    fn reads_what_the_crate_encodes() {
        let records = [crate_record(None, Some(b"v0"), 1_000), crate_record(Some(b""), None, 1_005)];
        let data = encoded(&records);
        let check = check_batches(data.clone(), 1 << 20).unwrap();
        let batches = check.batches();
        assert_eq!((batches.len(), batches[0].producer_id, batches[0].record_count), (1, 7, 2));
        let read: Vec<_> = check.records(&data, 0).collect();
        assert_eq!((read[0].key, read[0].value, read[0].timestamp_ms), (None, Some(&b"v0"[..]), 1_000));
        assert_eq!((read[1].key, read[1].value, read[1].timestamp_ms), (Some(&b""[..]), None, 1_005));
        assert_eq!(read[0].headers[0], 4, "two headers, zigzag");
    }

    /// What this writer writes, the crate's decoder reads back exactly
    /// (CRC, offsets, timestamps, headers).
    #[test]
    fn the_crate_reads_what_this_writes() {
        let records =
            [crate_record(Some(b"k"), Some(b"v"), 1_700_000_000_000), crate_record(None, None, 1_699_999_999_999)];
        let data = encoded(&records);
        let check = check_batches(data.clone(), 1 << 20).unwrap();
        let mut log = Vec::new();
        for record in check.records(&data, 0) {
            crate::protocol::record::encode_extended_batch_record(&mut log, 0, &record);
        }
        let stored: Vec<RecordRef<'_>> = crate::protocol::record::BatchIter::new(&log).map(|(_, r)| r).collect();
        let mut out = Vec::new();
        write_batch(&mut out, 40, stored.iter().copied());
        let decoded = RecordBatchDecoder::decode(&mut Bytes::from(out)).unwrap().records;
        assert_eq!(decoded.len(), 2);
        for (index, (got, sent)) in decoded.iter().zip(&records).enumerate() {
            assert_eq!(got.offset, 40 + index as i64);
            assert_eq!((&got.key, &got.value, got.timestamp), (&sent.key, &sent.value, sent.timestamp));
            assert_eq!(got.headers, sent.headers);
        }
    }

    /// `get_varlong` reads exactly what `put_varlong` writes (the writer
    /// the crate's decoder reads back in `the_crate_reads_what_this_writes`),
    /// one, two or up to ten bytes, and leaves what follows; a varint cut
    /// short or longer than ten bytes is `None`.
    #[test]
    fn varlongs_read_what_is_written() {
        let mut values: Vec<i64> = (-20_000..20_000).collect();
        for shift in 0..63 {
            values.extend([1i64 << shift, -(1i64 << shift), (1i64 << shift) - 1, -(1i64 << shift) + 1]);
        }
        values.extend([i64::MAX, i64::MIN]);
        for value in values {
            let mut encoded = Vec::new();
            put_varlong(&mut encoded, value);
            let size = encoded.len();
            encoded.extend_from_slice(&[0xff, 0x01]);
            let mut bytes = &encoded[..];
            assert_eq!(get_varlong(&mut bytes), Some(value), "{value}");
            assert_eq!(bytes, &[0xff, 0x01], "{value}: the bytes after it are left");
            let mut cut = &encoded[..size - 1];
            assert_eq!(get_varlong(&mut cut), None, "{value} cut short");
        }
        assert_eq!(get_varlong(&mut &[0x80u8; 11][..]), None, "eleven bytes");
    }

    /// An entry is routed with the same bytes whether its records were
    /// staged (encoded as they were checked) or, past
    /// [`KAFKA_STAGED_RECORDS_MAX`], are decoded again and encoded as they
    /// are routed: every key, value, header and timestamp, in order, and
    /// each staged record's end where its encoding ends.
    #[test]
    fn staged_and_walked_records_are_the_same() {
        let batch = |count: usize, first: i64| {
            let records: Vec<Record> = (0..count)
                .map(|index| {
                    let mut record = crate_record(Some(b"key"), Some(b"value"), first + index as i64);
                    // One batch: the encoder starts another where `offset -
                    // sequence` changes.
                    (record.offset, record.sequence) = (index as i64, index as i32);
                    record.key = (index % 3 != 0).then(|| Bytes::from(format!("key-{index}")));
                    record.value = (index % 5 != 0).then(|| Bytes::from(format!("value-{first}-{index}")));
                    record
                })
                .collect();
            encoded(&records)
        };
        let (small, large) = (batch(200, 1_000), batch(KAFKA_STAGED_RECORDS_MAX, 5_000));
        // The routed bytes of every batch, staged or walked, and the
        // record count.
        let read = |data: &Bytes| {
            let check = check_batches(data.clone(), 1 << 20).unwrap();
            let (mut bytes, mut count) = (Vec::new(), 0);
            for index in 0..check.batches().len() {
                match check.staged(index) {
                    Some(run) => {
                        let mut start = run.start;
                        for &end in run.ends {
                            let one = &run.encoded[start..end as usize];
                            let (partition, record) = crate::protocol::record::BatchIter::new(one).next().unwrap();
                            assert_eq!((partition, 4 + record.log_record.len()), (0, one.len()), "one whole record");
                            start = end as usize;
                        }
                        bytes.extend_from_slice(&run.encoded[run.start..start]);
                        count += run.ends.len();
                    }
                    None => {
                        for record in check.records(data, index) {
                            crate::protocol::record::encode_extended_batch_record(&mut bytes, 0, &record);
                            count += 1;
                        }
                    }
                }
            }
            (check.all_staged, bytes, count)
        };
        let walked = |data: &Bytes| -> Vec<u8> {
            let records = &data[BATCH_HEADER_SIZE..];
            let count = i32::from_be_bytes(data[57..61].try_into().unwrap());
            let base_timestamp = i64::from_be_bytes(data[27..35].try_into().unwrap());
            let mut bytes = Vec::new();
            for record in (Records { bytes: records, left: count, base_timestamp }) {
                crate::protocol::record::encode_extended_batch_record(&mut bytes, 0, &record.unwrap());
            }
            bytes
        };
        let (staged, small_read, count) = read(&small);
        assert!(staged);
        assert_eq!((small_read, count), (walked(&small), 200));
        let both = Bytes::from([large.as_ref(), small.as_ref()].concat());
        let (staged, both_read, count) = read(&both);
        assert!(!staged, "{} records are more than are staged", KAFKA_STAGED_RECORDS_MAX + 200);
        assert_eq!(both_read, [walked(&large), walked(&small)].concat());
        assert_eq!(count, KAFKA_STAGED_RECORDS_MAX + 200);
    }

    /// An entry whose encoding would pass [`KAFKA_STAGED_BYTES_MAX`] is not
    /// staged (routing walks it again), so the staging stays bounded.
    #[test]
    fn an_entry_past_the_staged_bytes_is_walked() {
        let count = KAFKA_STAGED_BYTES_MAX / 1000 + 1;
        let records: Vec<Record> = (0..count)
            .map(|index| {
                let mut record = crate_record(Some(b"key"), None, index as i64);
                record.value = Some(Bytes::from(vec![b'v'; 1000]));
                (record.offset, record.sequence) = (index as i64, index as i32);
                record
            })
            .collect();
        let check = check_batches(encoded(&records), 1 << 20).unwrap();
        assert!(check.staged(0).is_none());
        assert!(check.encoded.capacity() <= KAFKA_STAGED_BYTES_MAX);
        let fewer = check_batches(encoded(&records[..count / 2]), 1 << 20).unwrap();
        assert_eq!(fewer.staged(0).map(|run| run.ends.len()), Some(count / 2));
    }

    /// Damage is refused with the right error, never a panic: every
    /// truncation and every flipped byte of a batch.
    #[test]
    fn damaged_batches_are_refused() {
        let whole = encoded(&[crate_record(Some(b"key"), Some(b"value"), 5)]);
        for size in 0..whole.len() {
            assert!(check_batches(whole.slice(..size), 1 << 20).is_err() || size == 0, "size {size}");
        }
        for index in 0..whole.len() {
            let mut bytes = whole.to_vec();
            bytes[index] ^= 0x40;
            let _ = check_batches(Bytes::from(bytes), 1 << 20);
        }
        let too_large = check_batches(whole.clone(), 10).unwrap_err();
        assert_eq!(too_large.code(), super::super::codes::MESSAGE_TOO_LARGE);
    }
}
