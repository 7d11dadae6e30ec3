//! The bytes of a durable log: records, batch frames and the recovery scan.
//!
//! Pure functions over byte slices: no I/O, no allocation, no panics on any
//! input (the property tests at the bottom feed arbitrary bytes).
//!
//! # Record
//!
//! The same bytes as a record of the in-memory partition log:
//!
//! ```text
//! offset size field
//!      0    2 key_size      u16 LE
//!      2    4 payload_size  u32 LE
//!      6    k key
//!    6+k    p payload
//! ```
//!
//! # Frame
//!
//! A log is a sequence of frames back to back. A frame holds the records of
//! one log (one stream partition) appended in one flush, with dense offsets
//! `base_offset .. base_offset + record_count`:
//!
//! ```text
//! offset size field
//!      0    4 magic         u32 LE, FRAME_MAGIC: the bytes "SPTF"
//!      4    4 crc32c        u32 LE, CRC32C (Castagnoli) of the header with
//!                           this field zeroed, then of the body
//!      8    1 version       u8, 1
//!      9    1 flags         u8: bit 0 (FLAG_EXTENDED_RECORDS) says the body
//!                           holds extended (Kafka) records (see
//!                           `protocol::record`); other bits are reserved
//!                           and a reader rejects them. A spate that predates
//!                           extended records rejects bit 0 too, rather than
//!                           show a Kafka record's parts as a payload
//!     10    2 header_size   u16 LE, bytes of the header (44 in version 1;
//!                           a later version may grow it, up to 4096)
//!     12    4 record_count  u32 LE, at least 1
//!     16    8 base_offset   u64 LE, offset of the first record
//!     24    8 timestamp_ms  u64 LE, arrival time of the frame, ms since
//!                           the Unix epoch
//!     32    8 log_id        u64 LE, the log (stream partition) the frame
//!                           belongs to: checked against the segment's
//!                           directory on recovery, and what lets one
//!                           write-ahead file per shard interleave partitions
//!     40    4 body_size     u32 LE, bytes of records after the header
//!     44      body          record_count records, exactly body_size bytes
//! ```
//!
//! The `u64` fields sit at multiples of 8 from the frame start. Frames are
//! not padded: the next frame starts right after the body. A frame whose
//! first four bytes are zero is not a frame but the end of the log: segment
//! files grow in zero-filled blocks (see `segment.rs`), so zeros after the
//! last frame always read as a clean end.
//!
//! # Writing a frame
//!
//! [`FrameEncoder`] reserves the header, appends records (each copied once,
//! straight into the caller's buffer, which can be the segment writer's DMA
//! buffer), then [`FrameEncoder::seal`] fills in the counts and the CRC.
//!
//! # Recovery scan
//!
//! [`scan`] walks frames from a position and stops at the first byte that is
//! not a whole, valid frame continuing the log; [`ScanStop`] says why.

use std::fmt;

/// Bytes before the key in a record: key size (2) + payload size (4).
pub const RECORD_HEADER_SIZE: usize = 6;
/// The longest key a record can carry.
pub const RECORD_KEY_SIZE_MAX: usize = u16::MAX as usize;
// A record on disk is the same bytes as one of the in-memory log.
const _: () = assert!(RECORD_HEADER_SIZE == crate::protocol::record::LOG_HEADER_SIZE);
const _: () = assert!(RECORD_KEY_SIZE_MAX == crate::protocol::record::KEY_SIZE_LIMIT);

/// The first four bytes of every frame: "SPTF" read as a little-endian u32.
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"SPTF");
/// The frame version this code writes and reads.
pub const FRAME_VERSION: u8 = 1;
/// Frame flag: the body holds at least one extended record.
pub const FLAG_EXTENDED_RECORDS: u8 = 1;
/// Bytes of a version 1 frame header.
pub const FRAME_HEADER_SIZE: usize = 44;
/// The largest header a reader accepts (a later version may grow it).
pub const FRAME_HEADER_SIZE_MAX: usize = 4096;
/// The largest frame body. A bound on what a corrupt `body_size` can make a
/// reader fetch; writers flush far smaller frames (tens of KiB).
pub const FRAME_BODY_SIZE_MAX: usize = 64 << 20;
/// The largest frame: header plus body.
pub const FRAME_SIZE_MAX: usize = FRAME_HEADER_SIZE_MAX + FRAME_BODY_SIZE_MAX;

/// Byte positions of the header fields, from the start of the frame.
mod field {
    pub const MAGIC: usize = 0;
    pub const CRC32C: usize = 4;
    pub const VERSION: usize = 8;
    pub const FLAGS: usize = 9;
    pub const HEADER_SIZE: usize = 10;
    pub const RECORD_COUNT: usize = 12;
    pub const BASE_OFFSET: usize = 16;
    pub const TIMESTAMP_MS: usize = 24;
    pub const LOG_ID: usize = 32;
    pub const BODY_SIZE: usize = 40;
    pub const END: usize = 44;
}

const _: () = assert!(field::END == FRAME_HEADER_SIZE);
const _: () = assert!(
    field::BASE_OFFSET.is_multiple_of(8) && field::TIMESTAMP_MS.is_multiple_of(8) && field::LOG_ID.is_multiple_of(8)
);
const _: () = assert!(field::MAGIC + 4 == field::CRC32C && field::CRC32C + 4 == field::VERSION);
const _: () = assert!(FRAME_MAGIC != 0 && FRAME_MAGIC != u32::MAX);
const _: () = assert!(FRAME_HEADER_SIZE <= FRAME_HEADER_SIZE_MAX && FRAME_HEADER_SIZE_MAX <= u16::MAX as usize);
const _: () = assert!(FRAME_SIZE_MAX <= u32::MAX as usize);

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The bytes end before the frame does.
    Truncated { needed: usize, available: usize },
    /// The first four bytes are not [`FRAME_MAGIC`].
    BadMagic { found: u32 },
    /// A version this code does not read.
    UnsupportedVersion { version: u8 },
    /// Reserved flag bits are set.
    UnsupportedFlags { flags: u8 },
    /// `header_size` is outside `FRAME_HEADER_SIZE..=FRAME_HEADER_SIZE_MAX`.
    BadHeaderSize { header_size: u16 },
    /// `record_count` is zero.
    EmptyFrame,
    /// `body_size` is over [`FRAME_BODY_SIZE_MAX`].
    BodyTooLarge { body_size: u32, body_size_max: u32 },
    /// `base_offset + record_count` does not fit in a u64.
    OffsetOverflow { base_offset: u64, record_count: u32 },
    /// The stored CRC32C is not the CRC32C of the bytes.
    CrcMismatch { expected: u32, actual: u32 },
    /// Record `record_index` (0-based) runs past the body, which holds
    /// `body_size` bytes; it starts at `body_position`.
    BadRecord { record_index: u32, body_position: usize, body_size: u32 },
    /// The records end before `record_count`, or bytes follow the last one.
    RecordCountMismatch { declared: u32, found: u32 },
    /// Encoding: the buffer has no room for what is being appended.
    FrameFull { needed: usize, available: usize },
    /// Encoding: a key longer than [`RECORD_KEY_SIZE_MAX`].
    KeyTooLarge { key_size: usize },
    /// Encoding: the bytes given as one record are not exactly one record.
    NotOneRecord { size: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameError::Truncated { needed, available } => {
                write!(f, "truncated frame: needs {needed} bytes, {available} available")
            }
            FrameError::BadMagic { found } => write!(f, "bad frame magic {found:#010x} (expected {FRAME_MAGIC:#010x})"),
            FrameError::UnsupportedVersion { version } => write!(f, "unsupported frame version {version}"),
            FrameError::UnsupportedFlags { flags } => write!(f, "unsupported frame flags {flags:#04x}"),
            FrameError::BadHeaderSize { header_size } => write!(
                f,
                "bad frame header size {header_size} (expected {FRAME_HEADER_SIZE}..={FRAME_HEADER_SIZE_MAX})"
            ),
            FrameError::EmptyFrame => write!(f, "frame with no records"),
            FrameError::BodyTooLarge { body_size, body_size_max } => {
                write!(f, "frame body of {body_size} bytes is over the limit of {body_size_max}")
            }
            FrameError::OffsetOverflow { base_offset, record_count } => {
                write!(f, "frame offsets overflow: base {base_offset} + {record_count} records")
            }
            FrameError::CrcMismatch { expected, actual } => {
                write!(f, "frame CRC32C mismatch: stored {expected:#010x}, computed {actual:#010x}")
            }
            FrameError::BadRecord { record_index, body_position, body_size } => write!(
                f,
                "record {record_index} at body position {body_position} runs past the body of {body_size} bytes"
            ),
            FrameError::RecordCountMismatch { declared, found } => {
                write!(f, "frame declares {declared} records, body holds {found}")
            }
            FrameError::FrameFull { needed, available } => {
                write!(f, "frame buffer full: needs {needed} bytes, {available} available")
            }
            FrameError::KeyTooLarge { key_size } => {
                write!(f, "key of {key_size} bytes is over the limit of {RECORD_KEY_SIZE_MAX}")
            }
            FrameError::NotOneRecord { size } => write!(f, "{size} bytes are not exactly one record"),
        }
    }
}

impl std::error::Error for FrameError {}

/// The decoded header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub header_size: u16,
    pub record_count: u32,
    pub base_offset: u64,
    pub timestamp_ms: u64,
    pub log_id: u64,
    pub body_size: u32,
    pub crc32c: u32,
}

impl FrameHeader {
    /// Bytes of the whole frame: header and body.
    pub fn frame_size(&self) -> usize {
        usize::from(self.header_size) + self.body_size as usize
    }

    /// The offset after this frame's last record.
    pub fn next_offset(&self) -> u64 {
        // parse_header rejects frames whose offsets overflow.
        self.base_offset + u64::from(self.record_count)
    }

    /// Whether `offset` is one of this frame's records.
    pub fn contains(&self, offset: u64) -> bool {
        self.base_offset <= offset && offset < self.next_offset()
    }
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Decodes and checks the header at the start of `bytes` (not the CRC, which
/// needs the body). Reads only the header's bytes.
pub fn parse_header(bytes: &[u8]) -> Result<FrameHeader, FrameError> {
    if bytes.len() >= 4 && u32_at(bytes, field::MAGIC) != FRAME_MAGIC {
        return Err(FrameError::BadMagic { found: u32_at(bytes, field::MAGIC) });
    }
    if bytes.len() < FRAME_HEADER_SIZE {
        return Err(FrameError::Truncated { needed: FRAME_HEADER_SIZE, available: bytes.len() });
    }
    let version = bytes[field::VERSION];
    if version != FRAME_VERSION {
        return Err(FrameError::UnsupportedVersion { version });
    }
    let flags = bytes[field::FLAGS];
    if flags & !FLAG_EXTENDED_RECORDS != 0 {
        return Err(FrameError::UnsupportedFlags { flags });
    }
    let header_size = u16_at(bytes, field::HEADER_SIZE);
    if !(FRAME_HEADER_SIZE..=FRAME_HEADER_SIZE_MAX).contains(&usize::from(header_size)) {
        return Err(FrameError::BadHeaderSize { header_size });
    }
    let header = FrameHeader {
        header_size,
        record_count: u32_at(bytes, field::RECORD_COUNT),
        base_offset: u64_at(bytes, field::BASE_OFFSET),
        timestamp_ms: u64_at(bytes, field::TIMESTAMP_MS),
        log_id: u64_at(bytes, field::LOG_ID),
        body_size: u32_at(bytes, field::BODY_SIZE),
        crc32c: u32_at(bytes, field::CRC32C),
    };
    if header.record_count == 0 {
        return Err(FrameError::EmptyFrame);
    }
    if header.body_size as usize > FRAME_BODY_SIZE_MAX {
        return Err(FrameError::BodyTooLarge {
            body_size: header.body_size,
            body_size_max: FRAME_BODY_SIZE_MAX as u32,
        });
    }
    if header.base_offset.checked_add(u64::from(header.record_count)).is_none() {
        return Err(FrameError::OffsetOverflow { base_offset: header.base_offset, record_count: header.record_count });
    }
    Ok(header)
}

/// CRC32C of a frame: the header with its CRC field taken as zero, then the
/// body. `header` is the whole header (`header_size` bytes).
fn frame_crc32c(header: &[u8], body: &[u8]) -> u32 {
    debug_assert!(header.len() >= FRAME_HEADER_SIZE);
    let crc = crc32c::crc32c(&header[..field::CRC32C]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    let crc = crc32c::crc32c_append(crc, &header[field::VERSION..]);
    crc32c::crc32c_append(crc, body)
}

/// A frame checked whole: header, CRC and record structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedFrame<'a> {
    pub header: FrameHeader,
    /// The records, back to back.
    pub body: &'a [u8],
}

impl<'a> DecodedFrame<'a> {
    /// The records of this frame, with their offsets.
    pub fn records(&self) -> RecordIter<'a> {
        RecordIter { bytes: self.body, offset: self.header.base_offset }
    }
}

/// Decodes the frame at the start of `bytes`, checking everything: header,
/// size, CRC32C, and that the body is exactly `record_count` records.
pub fn decode_frame(bytes: &[u8]) -> Result<DecodedFrame<'_>, FrameError> {
    let header = parse_header(bytes)?;
    let frame_size = header.frame_size();
    if bytes.len() < frame_size {
        return Err(FrameError::Truncated { needed: frame_size, available: bytes.len() });
    }
    let (header_bytes, body) = bytes[..frame_size].split_at(usize::from(header.header_size));
    let actual = frame_crc32c(header_bytes, body);
    if actual != header.crc32c {
        return Err(FrameError::CrcMismatch { expected: header.crc32c, actual });
    }
    check_records(body, header.record_count)?;
    Ok(DecodedFrame { header, body })
}

/// Checks that `body` is exactly `record_count` whole records.
fn check_records(body: &[u8], record_count: u32) -> Result<(), FrameError> {
    let mut position = 0;
    let mut found = 0u32;
    while position < body.len() {
        let Some(size) = record_size(&body[position..]) else {
            return Err(FrameError::BadRecord {
                record_index: found,
                body_position: position,
                body_size: body.len() as u32,
            });
        };
        position += size;
        found += 1;
        if found > record_count {
            break;
        }
    }
    if found != record_count {
        return Err(FrameError::RecordCountMismatch { declared: record_count, found });
    }
    Ok(())
}

/// Size of the whole record at the start of `bytes`, or `None` when the
/// bytes end first.
fn record_size(bytes: &[u8]) -> Option<usize> {
    if bytes.len() < RECORD_HEADER_SIZE {
        return None;
    }
    let key_size = usize::from(u16_at(bytes, 0));
    let payload_size = u32_at(bytes, 2) as usize;
    let size = RECORD_HEADER_SIZE.checked_add(key_size)?.checked_add(payload_size)?;
    (size <= bytes.len()).then_some(size)
}

/// Where each whole record of `records` (records back to back) starts; stops
/// at the first one that is not whole.
fn record_starts(records: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut position = 0;
    std::iter::from_fn(move || {
        let size = record_size(&records[position..])?;
        let start = position;
        position += size;
        Some(start)
    })
}

/// Size of the record for `key` and `payload`.
pub fn record_size_of(key: &[u8], payload: &[u8]) -> usize {
    RECORD_HEADER_SIZE + key.len() + payload.len()
}

/// One record of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub offset: u64,
    pub key: &'a [u8],
    pub payload: &'a [u8],
}

/// Iterates the records of a checked frame. On bytes that are not whole
/// records (impossible after [`decode_frame`]) it stops rather than panics.
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    bytes: &'a [u8],
    offset: u64,
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Record<'a>> {
        let size = record_size(self.bytes)?;
        let key_size = usize::from(u16_at(self.bytes, 0));
        let (record, rest) = self.bytes.split_at(size);
        let key_end = RECORD_HEADER_SIZE + key_size;
        let item =
            Record { offset: self.offset, key: &record[RECORD_HEADER_SIZE..key_end], payload: &record[key_end..] };
        self.bytes = rest;
        self.offset += 1;
        Some(item)
    }
}

/// What [`FrameEncoder::seal`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedFrame {
    pub log_id: u64,
    pub base_offset: u64,
    pub record_count: u32,
    /// Bytes of the frame, header included.
    pub frame_size: usize,
}

impl SealedFrame {
    /// The offset after this frame's last record.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
}

/// Builds one frame in place at the start of a caller's buffer: the header
/// space is reserved first, records are copied in once, and [`seal`] fills
/// in the header and the CRC.
///
/// [`seal`]: FrameEncoder::seal
#[derive(Debug)]
pub struct FrameEncoder<'a> {
    buffer: &'a mut [u8],
    /// Bytes of the frame so far, header space included.
    size: usize,
    record_count: u32,
    /// An extended record was appended: the frame says so in its flags.
    extended: bool,
}

impl<'a> FrameEncoder<'a> {
    /// Starts a frame at the start of `buffer`. Fails when the buffer cannot
    /// hold a header and one empty record.
    pub fn new(buffer: &'a mut [u8]) -> Result<FrameEncoder<'a>, FrameError> {
        let needed = FRAME_HEADER_SIZE + RECORD_HEADER_SIZE;
        if buffer.len() < needed {
            return Err(FrameError::FrameFull { needed, available: buffer.len() });
        }
        let size_max = buffer.len().min(FRAME_HEADER_SIZE + FRAME_BODY_SIZE_MAX);
        Ok(FrameEncoder { buffer: &mut buffer[..size_max], size: FRAME_HEADER_SIZE, record_count: 0, extended: false })
    }

    /// Records appended so far.
    pub fn record_count(&self) -> u32 {
        self.record_count
    }

    /// Bytes of the frame so far, header included.
    pub fn frame_size(&self) -> usize {
        self.size
    }

    /// Bytes still free for records.
    pub fn available(&self) -> usize {
        self.buffer.len() - self.size
    }

    /// Appends one record. On `FrameFull` nothing was written: seal this
    /// frame and start another.
    pub fn append(&mut self, key: &[u8], payload: &[u8]) -> Result<(), FrameError> {
        if key.len() > RECORD_KEY_SIZE_MAX {
            return Err(FrameError::KeyTooLarge { key_size: key.len() });
        }
        let record_size = record_size_of(key, payload);
        let out = self.reserve(record_size)?;
        out[0..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
        // reserve() bounds the record by FRAME_BODY_SIZE_MAX, so this fits.
        out[2..6].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        out[RECORD_HEADER_SIZE..RECORD_HEADER_SIZE + key.len()].copy_from_slice(key);
        out[RECORD_HEADER_SIZE + key.len()..].copy_from_slice(payload);
        Ok(())
    }

    /// Appends one record already in record format (`key_size | payload_size
    /// | key | payload`), as the in-memory log holds it: one copy.
    pub fn append_record(&mut self, record: &[u8]) -> Result<(), FrameError> {
        if record_size(record) != Some(record.len()) {
            return Err(FrameError::NotOneRecord { size: record.len() });
        }
        self.reserve(record.len())?.copy_from_slice(record);
        // A key size of 0 marks an extended record (a plain key is never empty).
        self.extended |= record[..2] == [0, 0];
        Ok(())
    }

    /// Appends `record_count` whole records that lie back to back in
    /// `records` (a span of an in-memory log, which holds only whole
    /// records) with one copy. Records are not walked one by one, except
    /// when `may_hold_extended` says some may be extended: then each one's
    /// key size is read, so the frame's flag says exactly whether it holds
    /// one. Fails, appending nothing, when the span does not fit.
    pub fn append_records(
        &mut self,
        records: &[u8],
        record_count: u32,
        may_hold_extended: bool,
    ) -> Result<(), FrameError> {
        let available = self.available();
        let count_fits = self.record_count.checked_add(record_count).is_some();
        if records.len() > available || !count_fits {
            return Err(FrameError::FrameFull { needed: records.len(), available });
        }
        debug_assert_eq!(check_records(records, record_count), Ok(()));
        if may_hold_extended && !self.extended {
            self.extended = record_starts(records).any(|start| records[start..start + 2] == [0, 0]);
        }
        let start = self.size;
        self.size += records.len();
        self.record_count += record_count;
        self.buffer[start..self.size].copy_from_slice(records);
        Ok(())
    }

    fn reserve(&mut self, record_size: usize) -> Result<&mut [u8], FrameError> {
        let available = self.available();
        if record_size > available || self.record_count == u32::MAX {
            return Err(FrameError::FrameFull { needed: record_size, available });
        }
        let start = self.size;
        self.size += record_size;
        self.record_count += 1;
        Ok(&mut self.buffer[start..self.size])
    }

    /// Fills in the header and the CRC. The frame is the first
    /// `frame_size` bytes of the buffer.
    pub fn seal(self, log_id: u64, base_offset: u64, timestamp_ms: u64) -> Result<SealedFrame, FrameError> {
        if self.record_count == 0 {
            return Err(FrameError::EmptyFrame);
        }
        if base_offset.checked_add(u64::from(self.record_count)).is_none() {
            return Err(FrameError::OffsetOverflow { base_offset, record_count: self.record_count });
        }
        let body_size = self.size - FRAME_HEADER_SIZE;
        let (header, rest) = self.buffer.split_at_mut(FRAME_HEADER_SIZE);
        header[field::MAGIC..field::MAGIC + 4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        header[field::CRC32C..field::CRC32C + 4].fill(0);
        header[field::VERSION] = FRAME_VERSION;
        header[field::FLAGS] = if self.extended { FLAG_EXTENDED_RECORDS } else { 0 };
        header[field::HEADER_SIZE..field::HEADER_SIZE + 2].copy_from_slice(&(FRAME_HEADER_SIZE as u16).to_le_bytes());
        header[field::RECORD_COUNT..field::RECORD_COUNT + 4].copy_from_slice(&self.record_count.to_le_bytes());
        header[field::BASE_OFFSET..field::BASE_OFFSET + 8].copy_from_slice(&base_offset.to_le_bytes());
        header[field::TIMESTAMP_MS..field::TIMESTAMP_MS + 8].copy_from_slice(&timestamp_ms.to_le_bytes());
        header[field::LOG_ID..field::LOG_ID + 8].copy_from_slice(&log_id.to_le_bytes());
        header[field::BODY_SIZE..field::BODY_SIZE + 4].copy_from_slice(&(body_size as u32).to_le_bytes());
        let crc = frame_crc32c(header, &rest[..body_size]);
        header[field::CRC32C..field::CRC32C + 4].copy_from_slice(&crc.to_le_bytes());
        debug_assert!(decode_frame(&self.buffer[..self.size]).is_ok());
        Ok(SealedFrame { log_id, base_offset, record_count: self.record_count, frame_size: self.size })
    }
}

/// Where a scan is: the end of the last valid frame and what it held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScanCursor {
    /// File position after the last valid frame.
    pub position: u64,
    /// The offset the next frame must start at.
    pub next_offset: u64,
    pub frame_count: u64,
    pub record_count: u64,
    /// `timestamp_ms` of the last valid frame (0 before the first).
    pub last_timestamp_ms: u64,
}

impl ScanCursor {
    /// A cursor at the start of a segment whose first offset is `base_offset`.
    pub fn at_segment_start(base_offset: u64) -> ScanCursor {
        ScanCursor { next_offset: base_offset, ..ScanCursor::default() }
    }
}

/// Why a scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanStop {
    /// The bytes ended exactly after a frame (or were empty).
    EndOfData,
    /// The next frame position holds zeros: never written (a clean end).
    Zeros,
    /// The bytes end inside a frame: a torn write at the tail (or, before
    /// the end of a file, a sign that more bytes must be read).
    TornTail { needed: usize, available: usize },
    /// The bytes at the position are not a valid frame.
    BadFrame(FrameError),
    /// A valid frame whose `base_offset` does not continue the log.
    OffsetGap { expected: u64, found: u64 },
    /// A valid frame of another log.
    WrongLog { expected: u64, found: u64 },
}

impl ScanStop {
    /// Whether the log ended where it should: nothing after the last valid
    /// frame but the end of the bytes or zeros.
    pub fn is_clean(&self) -> bool {
        matches!(self, ScanStop::EndOfData | ScanStop::Zeros)
    }
}

/// What [`scan`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanOutcome {
    /// After the last valid frame: truncating here keeps every whole frame.
    pub cursor: ScanCursor,
    pub stop: ScanStop,
}

/// Walks the frames of log `log_id` in `bytes`, which start at file position
/// `start.position`; stops at the first position that is not a valid frame
/// continuing the log. Calls `on_frame(position, header)` for every valid
/// frame (the index rebuild uses it).
pub fn scan_with(
    bytes: &[u8],
    log_id: u64,
    start: ScanCursor,
    mut on_frame: impl FnMut(u64, &FrameHeader),
) -> ScanOutcome {
    let mut cursor = start;
    let mut consumed = 0usize;
    loop {
        let rest = &bytes[consumed..];
        let stop = match next_frame(rest, log_id, cursor.next_offset) {
            Ok(header) => {
                on_frame(cursor.position, &header);
                let frame_size = header.frame_size();
                consumed += frame_size;
                cursor.position += frame_size as u64;
                cursor.next_offset = header.next_offset();
                cursor.frame_count += 1;
                cursor.record_count += u64::from(header.record_count);
                cursor.last_timestamp_ms = header.timestamp_ms;
                continue;
            }
            Err(stop) => stop,
        };
        return ScanOutcome { cursor, stop };
    }
}

/// [`scan_with`] without a callback.
pub fn scan(bytes: &[u8], log_id: u64, start: ScanCursor) -> ScanOutcome {
    scan_with(bytes, log_id, start, |_, _| {})
}

/// The header of the valid frame at the start of `bytes` that continues log
/// `log_id` at `next_offset`, or why there is none.
fn next_frame(bytes: &[u8], log_id: u64, next_offset: u64) -> Result<FrameHeader, ScanStop> {
    if bytes.is_empty() {
        return Err(ScanStop::EndOfData);
    }
    let magic_bytes = &bytes[..bytes.len().min(4)];
    if magic_bytes.iter().all(|&byte| byte == 0) {
        return Err(ScanStop::Zeros);
    }
    let frame = match decode_frame(bytes) {
        Ok(frame) => frame,
        Err(FrameError::Truncated { needed, available }) => return Err(ScanStop::TornTail { needed, available }),
        Err(error) => return Err(ScanStop::BadFrame(error)),
    };
    if frame.header.log_id != log_id {
        return Err(ScanStop::WrongLog { expected: log_id, found: frame.header.log_id });
    }
    if frame.header.base_offset != next_offset {
        return Err(ScanStop::OffsetGap { expected: next_offset, found: frame.header.base_offset });
    }
    Ok(frame.header)
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Appends one sealed frame of `records` to `log` (a test helper).
    pub(crate) fn push_frame(log: &mut Vec<u8>, log_id: u64, base_offset: u64, records: &[(&[u8], &[u8])]) -> usize {
        let size: usize = FRAME_HEADER_SIZE + records.iter().map(|(k, p)| record_size_of(k, p)).sum::<usize>();
        let start = log.len();
        log.resize(start + size, 0xAA);
        let mut encoder = FrameEncoder::new(&mut log[start..]).unwrap();
        for (key, payload) in records {
            encoder.append(key, payload).unwrap();
        }
        let sealed = encoder.seal(log_id, base_offset, 1_700_000_000_000 + base_offset).unwrap();
        assert_eq!(sealed.frame_size, size);
        size
    }

    /// A log of `frame_count` frames of log 7 with varied records; returns
    /// the bytes and the end position of every frame.
    pub(crate) fn sample_log(frame_count: usize) -> (Vec<u8>, Vec<usize>) {
        let (mut log, mut ends, mut offset) = (Vec::new(), Vec::new(), 0u64);
        for frame_index in 0..frame_count {
            let payloads: Vec<Vec<u8>> =
                (0..=frame_index % 4).map(|i| vec![b'a' + i as u8; frame_index * 7 + i]).collect();
            let records: Vec<(&[u8], &[u8])> = payloads.iter().map(|p| (&b"user42"[..], &p[..])).collect();
            push_frame(&mut log, 7, offset, &records);
            offset += records.len() as u64;
            ends.push(log.len());
        }
        (log, ends)
    }

    /// The header constants are the documented byte layout.
    #[test]
    fn header_layout_is_the_documented_one() {
        let mut buffer = vec![0u8; 256];
        let mut encoder = FrameEncoder::new(&mut buffer).unwrap();
        encoder.append(b"k", b"v").unwrap();
        let sealed = encoder.seal(0x0102_0304_0506_0708, 42, 1234).unwrap();
        assert_eq!(sealed.frame_size, 44 + 6 + 2);
        assert_eq!(&buffer[0..4], b"SPTF");
        assert_eq!((buffer[8], buffer[9]), (1, 0));
        assert_eq!(&buffer[10..12], &44u16.to_le_bytes());
        assert_eq!(&buffer[12..16], &1u32.to_le_bytes());
        assert_eq!(&buffer[16..24], &42u64.to_le_bytes());
        assert_eq!(&buffer[24..32], &1234u64.to_le_bytes());
        assert_eq!(&buffer[32..40], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&buffer[40..44], &8u32.to_le_bytes());
        assert_eq!(&buffer[44..52], &[1, 0, 1, 0, 0, 0, b'k', b'v']);
        let mut zeroed = buffer[..52].to_vec();
        zeroed[4..8].fill(0);
        assert_eq!(&buffer[4..8], &crc32c::crc32c(&zeroed).to_le_bytes());
    }

    /// Records go in and come out the same, with dense offsets, through both
    /// append paths.
    #[test]
    fn frame_round_trip() {
        let mut buffer = vec![0u8; 4096];
        let mut encoder = FrameEncoder::new(&mut buffer).unwrap();
        encoder.append(b"user42", b"clicked").unwrap();
        encoder.append(&[b'k'; 300], b"").unwrap();
        let mut raw = vec![2, 0, 3, 0, 0, 0];
        raw.extend_from_slice(b"abxyz");
        encoder.append_record(&raw).unwrap();
        assert_eq!(encoder.append_record(&raw[..raw.len() - 1]), Err(FrameError::NotOneRecord { size: 10 }));
        let sealed = encoder.seal(9, 100, 5).unwrap();
        let frame = decode_frame(&buffer[..sealed.frame_size + 10]).unwrap();
        assert_eq!((frame.header.base_offset, frame.header.record_count, frame.header.log_id), (100, 3, 9));
        let records: Vec<Record<'_>> = frame.records().collect();
        assert_eq!(records[0], Record { offset: 100, key: b"user42", payload: b"clicked" });
        assert_eq!((records[1].offset, records[1].key.len(), records[1].payload), (101, 300, &b""[..]));
        assert_eq!(records[2], Record { offset: 102, key: b"ab", payload: b"xyz" });
    }

    /// A span of records goes in with one copy and reads back the same as
    /// the records appended one by one; the frame is flagged extended
    /// exactly when a record of the span is.
    #[test]
    fn spans_of_records_frame_like_single_records() {
        let (mut one, mut spans) = (vec![0u8; 4096], vec![0u8; 4096]);
        let mut encoder = FrameEncoder::new(&mut one).unwrap();
        for (key, payload) in [(&b"user42"[..], &b"clicked"[..]), (b"k", b""), (b"ab", b"xyz")] {
            encoder.append(key, payload).unwrap();
        }
        let size_one = encoder.seal(9, 100, 5).unwrap().frame_size;
        // The records back to back, as a span of an in-memory log holds them.
        let records = one[FRAME_HEADER_SIZE..size_one].to_vec();
        let mut encoder = FrameEncoder::new(&mut spans).unwrap();
        encoder.append_records(&records[..19], 1, true).unwrap();
        encoder.append_records(&records[19..], 2, false).unwrap();
        let size_spans = encoder.seal(9, 100, 5).unwrap().frame_size;
        assert_eq!(one[..size_one], spans[..size_spans]);
        assert_eq!(spans[9], 0, "no extended record");
        // A span that does not fit appends nothing.
        let mut small = vec![0u8; FRAME_HEADER_SIZE + 20];
        let mut encoder = FrameEncoder::new(&mut small).unwrap();
        assert_eq!(
            encoder.append_records(&records, 3, false),
            Err(FrameError::FrameFull { needed: 37, available: 20 })
        );
        assert_eq!((encoder.record_count(), encoder.frame_size()), (0, FRAME_HEADER_SIZE));
        // An extended record (key size 0) in a span that may hold one.
        let mut extended = records.clone();
        extended.extend_from_slice(&[0, 0, 2, 0, 0, 0, b'h', b'i']);
        let mut buffer = vec![0u8; 4096];
        let mut encoder = FrameEncoder::new(&mut buffer).unwrap();
        encoder.append_records(&extended, 4, true).unwrap();
        encoder.seal(9, 100, 5).unwrap();
        assert_eq!(buffer[9], FLAG_EXTENDED_RECORDS);
    }

    /// The encoder refuses what does not fit and writes nothing for it.
    #[test]
    fn encoder_limits() {
        let mut small = [0u8; FRAME_HEADER_SIZE + 5];
        assert!(matches!(FrameEncoder::new(&mut small), Err(FrameError::FrameFull { .. })));
        let mut buffer = vec![0u8; FRAME_HEADER_SIZE + 10];
        let mut encoder = FrameEncoder::new(&mut buffer).unwrap();
        assert_eq!(encoder.append(b"key", b"payload"), Err(FrameError::FrameFull { needed: 16, available: 10 }));
        assert_eq!(encoder.append(&vec![0; 70_000], b""), Err(FrameError::KeyTooLarge { key_size: 70_000 }));
        assert_eq!(encoder.record_count(), 0);
        assert!(matches!(encoder.seal(0, 0, 0), Err(FrameError::EmptyFrame)));
    }

    /// Every corruption of a frame is caught and named.
    #[test]
    fn decode_rejects_damage() {
        let mut log = Vec::new();
        let size = push_frame(&mut log, 1, 0, &[(b"k", b"payload")]);
        let mut bad = log.clone();
        bad[0] ^= 1;
        assert!(matches!(decode_frame(&bad), Err(FrameError::BadMagic { .. })));
        let mut bad = log.clone();
        bad[8] = 2;
        assert_eq!(decode_frame(&bad), Err(FrameError::UnsupportedVersion { version: 2 }));
        let mut bad = log.clone();
        bad[size - 1] ^= 0x40;
        assert!(matches!(decode_frame(&bad), Err(FrameError::CrcMismatch { .. })));
        assert_eq!(decode_frame(&log[..size - 1]), Err(FrameError::Truncated { needed: size, available: size - 1 }));
        assert_eq!(decode_frame(&log[..10]), Err(FrameError::Truncated { needed: 44, available: 10 }));
        // A frame whose CRC is right but whose records do not fill the body
        // (a writer bug) is still rejected.
        let mut bad = log.clone();
        bad[12..16].copy_from_slice(&2u32.to_le_bytes());
        let crc = frame_crc32c(&bad[..44], &bad[44..size]);
        bad[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_frame(&bad), Err(FrameError::RecordCountMismatch { declared: 2, found: 1 }));
    }

    /// A scan of a whole log finds every frame and a clean end, with zeros
    /// after it or without.
    #[test]
    fn scan_clean_log() {
        let (mut log, ends) = sample_log(20);
        let outcome = scan(&log, 7, ScanCursor::at_segment_start(0));
        assert_eq!(outcome.stop, ScanStop::EndOfData);
        assert_eq!(outcome.cursor.position, log.len() as u64);
        assert_eq!(outcome.cursor.frame_count, 20);
        assert_eq!(outcome.cursor.next_offset, outcome.cursor.record_count);
        log.resize(log.len() + 5000, 0);
        let zeros = scan(&log, 7, ScanCursor::at_segment_start(0));
        assert_eq!((zeros.stop, zeros.cursor), (ScanStop::Zeros, outcome.cursor));
        let mut positions = Vec::new();
        scan_with(&log, 7, ScanCursor::at_segment_start(0), |position, _| positions.push(position as usize));
        assert_eq!(positions[1..], ends[..19]);
    }

    /// Cutting the log at every byte of its last frame keeps every frame
    /// before it and reports a torn tail.
    #[test]
    fn scan_every_truncation_of_the_last_frame() {
        let (log, ends) = sample_log(6);
        let last_start = ends[4];
        for cut in last_start + 1..log.len() {
            let outcome = scan(&log[..cut], 7, ScanCursor::at_segment_start(0));
            assert_eq!(outcome.cursor.position, last_start as u64, "cut {cut}");
            assert_eq!(outcome.cursor.frame_count, 5);
            assert!(matches!(outcome.stop, ScanStop::TornTail { .. }), "cut {cut}: {:?}", outcome.stop);
        }
    }

    /// Flipping any byte of the last frame stops the scan before it.
    #[test]
    fn scan_every_flipped_byte_of_the_last_frame() {
        let (log, ends) = sample_log(6);
        for index in ends[4]..log.len() {
            let mut bad = log.clone();
            bad[index] ^= 0x10;
            let outcome = scan(&bad, 7, ScanCursor::at_segment_start(0));
            assert_eq!(outcome.cursor.position, ends[4] as u64, "byte {index}");
            assert!(!outcome.stop.is_clean(), "byte {index}: {:?}", outcome.stop);
        }
    }

    /// A frame that skips or repeats offsets, or belongs to another log, is
    /// damage even with a good CRC.
    #[test]
    fn scan_stops_at_offset_gaps_and_foreign_frames() {
        let mut log = Vec::new();
        push_frame(&mut log, 7, 0, &[(b"a", b"1"), (b"b", b"2")]);
        let first_end = log.len() as u64;
        let mut gap = log.clone();
        push_frame(&mut gap, 7, 3, &[(b"c", b"3")]);
        let outcome = scan(&gap, 7, ScanCursor::at_segment_start(0));
        assert_eq!(outcome.stop, ScanStop::OffsetGap { expected: 2, found: 3 });
        assert_eq!(outcome.cursor.position, first_end);
        let mut foreign = log.clone();
        push_frame(&mut foreign, 8, 2, &[(b"c", b"3")]);
        assert_eq!(
            scan(&foreign, 7, ScanCursor::at_segment_start(0)).stop,
            ScanStop::WrongLog { expected: 7, found: 8 }
        );
        assert_eq!(scan(&log, 7, ScanCursor::at_segment_start(5)).stop, ScanStop::OffsetGap { expected: 5, found: 0 });
    }

    proptest! {
        /// Arbitrary bytes never make the decoder or the scan panic, and the
        /// scan never claims more bytes than it was given.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), magic in any::<bool>()) {
            let mut bytes = bytes;
            if magic && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
            }
            let _ = decode_frame(&bytes);
            let outcome = scan(&bytes, 7, ScanCursor::at_segment_start(0));
            prop_assert!(outcome.cursor.position <= bytes.len() as u64);
        }

        /// A valid log cut anywhere and followed by anything recovers to the
        /// longest whole-frame prefix that fits before the cut.
        #[test]
        fn truncated_log_recovers_a_prefix(frame_count in 1usize..12, cut_fraction in 0.0f64..=1.0, tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let (log, ends) = sample_log(frame_count);
            let cut = (log.len() as f64 * cut_fraction) as usize;
            let mut damaged = log[..cut].to_vec();
            damaged.extend_from_slice(&tail);
            let outcome = scan(&damaged, 7, ScanCursor::at_segment_start(0));
            let whole = ends.iter().filter(|&&end| end <= cut).count();
            // The tail bytes may not extend a cut frame into a valid one
            // unless they match it: the scan keeps at least the whole frames
            // before the cut and never claims past the cut plus the tail.
            prop_assert!(outcome.cursor.frame_count as usize >= whole);
            prop_assert!(outcome.cursor.position as usize <= damaged.len());
            if outcome.cursor.frame_count as usize > whole {
                // Only possible when the tail happens to complete the frame
                // byte for byte (then it is that frame).
                prop_assert_eq!(&damaged[..outcome.cursor.position as usize], &log[..outcome.cursor.position as usize]);
            }
            prop_assert_eq!(scan(&log[..cut], 7, ScanCursor::at_segment_start(0)).cursor.frame_count as usize, whole);
        }
    }
}
