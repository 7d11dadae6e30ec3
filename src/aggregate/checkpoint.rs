//! A processor's whole state as bytes: what the engine writes next to the
//! partition's log, and one way to move a processor between shards.
//!
//! # Format (version 1, little-endian)
//!
//! ```text
//! offset size field
//!      0    4 magic        "SPAC"
//!      4    4 crc32c       CRC32C (Castagnoli) of every byte after this field
//!      8    2 version      1
//!     10    2 reserved     0
//!     12    8 body_size    bytes after the 24-byte header
//!     20    4 reserved     0
//!     24      body
//! body:
//!   stream        u16 size + bytes
//!   partition     u32
//!   next_offset   u64          replay the log from here
//!   aggregates    u16 count, then each:
//!     declaration u32 size + canonical JSON (AggregateDeclaration::to_json)
//!     from_offset u64
//!     max_time_ms, watermark_ms   u8 present + u64
//!     next_sequence u64
//!     counters    u16 count + u64 each (AggregateCounters, in field order)
//!     keys        u32 count, sorted by key bytes, then each:
//!       key           u16 size + bytes
//!       last_closed   u8 present + window
//!       open          u16 count + windows, oldest first
//! window: start_ms, count, first_offset, last_offset u64; value f64 bits;
//!         then HLL_REGISTERS register bytes for distinct-estimate
//! ```
//!
//! Keys are written in byte order and sketches inline, so the bytes are a
//! function of the state alone: two processors that saw the same events
//! encode to the same bytes (the tests rely on it).
//!
//! # Torn or corrupt checkpoints
//!
//! Decoding checks the magic, the version, that the file holds exactly
//! `body_size` bytes after the header ([`CheckpointError::Torn`] when fewer:
//! a write cut short), the CRC32C, and then every count and value against
//! the limits and invariants (windows aligned and ordered, open windows
//! after the watermark, registers in range), so no input can make it panic
//! or allocate beyond its own size. On any error the engine falls back to
//! the previous checkpoint, or, with none left, to an empty processor
//! covering the partition's first retained offset and a replay of the whole
//! retained log (exact only while retention still holds every event since
//! the aggregate was declared; the engine should write checkpoints well
//! within retention). Writing a checkpoint as a new file, fsynced, then
//! renamed over the old, with the previous one kept, makes a torn write
//! cost nothing.

use std::fmt;

use crate::aggregate::declaration::{AggregateDeclaration, AggregateKind, DeclarationError};
use crate::aggregate::hll::{HLL_PRECISION, HLL_REGISTERS};
use crate::aggregate::keys::{KeyState, KeyTable, StateRef};
use crate::aggregate::processor::{DecodedKey, PartitionProcessor};
use crate::aggregate::state::{AggregateCounters, AggregateState, NO_SKETCH, WindowState};
use crate::aggregate::{AGGREGATES_PER_STREAM_MAX, ProcessorLimits};

/// The first four bytes of a checkpoint: "SPAC" read as a little-endian u32.
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"SPAC");
/// The version this code writes and reads.
pub const CHECKPOINT_VERSION: u16 = 1;
const HEADER_SIZE: usize = 24;
/// Counters in version 1.
const COUNTER_COUNT: usize = 10;
/// Largest register value: a rank over the hash bits below the index.
const REGISTER_MAX: u8 = (64 - HLL_PRECISION + 1) as u8;

/// Why a checkpoint cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointError {
    /// Fewer bytes than a header.
    TooShort {
        size: usize,
        size_min: usize,
    },
    BadMagic {
        magic: u32,
    },
    UnsupportedVersion {
        version: u16,
        version_max: u16,
    },
    /// The body is shorter than the header says: a write cut short.
    Torn {
        body_size: u64,
        body_size_available: u64,
    },
    /// More bytes than the header says.
    TrailingBytes {
        body_size: u64,
        body_size_available: u64,
    },
    Crc {
        stored: u32,
        computed: u32,
    },
    /// A field that cannot hold what it holds, at a byte position.
    Malformed {
        what: &'static str,
        byte_position: usize,
    },
    /// A stored declaration that no longer validates.
    Declaration {
        error: DeclarationError,
    },
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CheckpointError as E;
        match self {
            E::TooShort { size, size_min } => write!(f, "checkpoint has {size} bytes, a header needs {size_min}"),
            E::BadMagic { magic } => write!(f, "checkpoint magic {magic:#010x} is not {CHECKPOINT_MAGIC:#010x}"),
            E::UnsupportedVersion { version, version_max } => {
                write!(f, "checkpoint version {version}, this build reads up to {version_max}")
            }
            E::Torn { body_size, body_size_available } => {
                write!(f, "checkpoint torn: body of {body_size} bytes, {body_size_available} present")
            }
            E::TrailingBytes { body_size, body_size_available } => {
                write!(f, "checkpoint body of {body_size} bytes followed by more ({body_size_available} present)")
            }
            E::Crc { stored, computed } => {
                write!(f, "checkpoint corrupt: crc32c {computed:#010x}, header says {stored:#010x}")
            }
            E::Malformed { what, byte_position } => write!(f, "checkpoint malformed: {what} at byte {byte_position}"),
            E::Declaration { error } => write!(f, "checkpoint holds a declaration that is no longer valid: {error}"),
        }
    }
}

impl std::error::Error for CheckpointError {}

impl PartitionProcessor {
    /// Appends the whole state to `out`: a self-contained checkpoint
    /// covering every offset below [`PartitionProcessor::next_offset`].
    pub fn encode_checkpoint(&self, out: &mut Vec<u8>) {
        let header_start = out.len();
        out.extend_from_slice(&CHECKPOINT_MAGIC.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&[0; 4]);
        let body_start = out.len();
        debug_assert_eq!(body_start - header_start, HEADER_SIZE);
        put_bytes16(out, self.stream.as_bytes());
        out.extend_from_slice(&self.partition.to_le_bytes());
        out.extend_from_slice(&self.next_offset.to_le_bytes());
        out.extend_from_slice(&(self.aggregates.len() as u16).to_le_bytes());
        for (column, aggregate) in self.aggregates.iter().enumerate() {
            encode_aggregate(aggregate, (&self.keys, column), out);
        }
        let body_size = (out.len() - body_start) as u64;
        out[header_start + 12..header_start + 20].copy_from_slice(&body_size.to_le_bytes());
        let crc = crc32c::crc32c(&out[header_start + 8..]);
        out[header_start + 4..header_start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads a checkpoint back. `limits` are today's (a checkpoint holding
    /// more keys than a lowered limit keeps them; new keys are refused until
    /// enough have gone idle).
    pub fn decode_checkpoint(bytes: &[u8], limits: ProcessorLimits) -> Result<PartitionProcessor, CheckpointError> {
        let body = check_frame(bytes)?;
        let mut reader = Reader { bytes: body, position: 0, base: HEADER_SIZE };
        let stream = String::from_utf8(reader.bytes16("stream")?.to_vec()).map_err(|_| reader.error("stream"))?;
        let partition = reader.u32("partition")?;
        let next_offset = reader.u64("next_offset")?;
        let aggregate_count = reader.u16("aggregate count")? as usize;
        if aggregate_count > AGGREGATES_PER_STREAM_MAX {
            return Err(reader.error("aggregate count"));
        }
        let mut aggregates = Vec::with_capacity(aggregate_count);
        for _ in 0..aggregate_count {
            let (aggregate, keys) = decode_aggregate(&mut reader, limits)?;
            let name_taken = |(other, _): &(AggregateState, _)| other.declaration.name == aggregate.declaration.name;
            if aggregate.declaration.stream != stream || aggregates.iter().any(name_taken) {
                return Err(reader.error("aggregate declaration"));
            }
            aggregates.push((aggregate, keys));
        }
        if reader.position != body.len() {
            return Err(reader.error("end of body"));
        }
        Ok(PartitionProcessor::from_parts(stream, partition, next_offset, limits, aggregates))
    }
}

/// Checks header, size and CRC; returns the body.
fn check_frame(bytes: &[u8]) -> Result<&[u8], CheckpointError> {
    if bytes.len() < HEADER_SIZE {
        return Err(CheckpointError::TooShort { size: bytes.len(), size_min: HEADER_SIZE });
    }
    let field = |start: usize, size: usize| &bytes[start..start + size];
    let magic = u32::from_le_bytes(field(0, 4).try_into().expect("4 bytes"));
    if magic != CHECKPOINT_MAGIC {
        return Err(CheckpointError::BadMagic { magic });
    }
    let version = u16::from_le_bytes(field(8, 2).try_into().expect("2 bytes"));
    if version != CHECKPOINT_VERSION {
        return Err(CheckpointError::UnsupportedVersion { version, version_max: CHECKPOINT_VERSION });
    }
    let body_size = u64::from_le_bytes(field(12, 8).try_into().expect("8 bytes"));
    let body_size_available = (bytes.len() - HEADER_SIZE) as u64;
    if body_size > body_size_available {
        return Err(CheckpointError::Torn { body_size, body_size_available });
    }
    if body_size < body_size_available {
        return Err(CheckpointError::TrailingBytes { body_size, body_size_available });
    }
    let stored = u32::from_le_bytes(field(4, 4).try_into().expect("4 bytes"));
    let computed = crc32c::crc32c(&bytes[8..]);
    if stored != computed {
        return Err(CheckpointError::Crc { stored, computed });
    }
    if field(10, 2) != [0, 0] || field(20, 4) != [0; 4] {
        return Err(CheckpointError::Malformed { what: "reserved header bytes", byte_position: 10 });
    }
    Ok(&bytes[HEADER_SIZE..])
}

fn put_bytes16(out: &mut Vec<u8>, bytes: &[u8]) {
    let size = u16::try_from(bytes.len()).expect("stream names and keys fit in u16");
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_option(out: &mut Vec<u8>, value: Option<u64>) {
    out.push(u8::from(value.is_some()));
    out.extend_from_slice(&value.unwrap_or(0).to_le_bytes());
}

fn counters_array(counters: &AggregateCounters) -> [u64; COUNTER_COUNT] {
    [
        counters.events_applied,
        counters.value_malformed,
        counters.time_malformed,
        counters.late_events_dropped,
        counters.late_partial_events,
        counters.out_of_order_events,
        counters.keys_refused,
        counters.keys_expired,
        counters.windows_closed,
        counters.windows_refused,
    ]
}

fn counters_from(values: [u64; COUNTER_COUNT]) -> AggregateCounters {
    let [
        events_applied,
        value_malformed,
        time_malformed,
        late_events_dropped,
        late_partial_events,
        out_of_order_events,
        keys_refused,
        keys_expired,
        windows_closed,
        windows_refused,
    ] = values;
    AggregateCounters {
        events_applied,
        value_malformed,
        time_malformed,
        late_events_dropped,
        late_partial_events,
        out_of_order_events,
        keys_refused,
        keys_expired,
        windows_closed,
        windows_refused,
    }
}

fn encode_aggregate(aggregate: &AggregateState, (table, column): (&KeyTable, usize), out: &mut Vec<u8>) {
    let declaration = aggregate.declaration.to_json();
    out.extend_from_slice(&(declaration.len() as u32).to_le_bytes());
    out.extend_from_slice(declaration.as_bytes());
    out.extend_from_slice(&aggregate.from_offset.to_le_bytes());
    put_option(out, aggregate.max_time_ms);
    put_option(out, aggregate.watermark_ms);
    out.extend_from_slice(&aggregate.next_sequence.to_le_bytes());
    out.extend_from_slice(&(COUNTER_COUNT as u16).to_le_bytes());
    for counter in counters_array(&aggregate.counters) {
        out.extend_from_slice(&counter.to_le_bytes());
    }
    let mut keys: Vec<(&[u8], StateRef<'_>)> = table.iter_column(column).collect();
    keys.sort_unstable_by(|left, right| left.0.cmp(right.0));
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    let distinct = aggregate.declaration.kind == AggregateKind::DistinctEstimate;
    for (key, state) in keys {
        put_bytes16(out, key);
        out.push(u8::from(state.last_closed.is_some()));
        if let Some(window) = state.last_closed {
            encode_window(aggregate, window, distinct, out);
        }
        out.extend_from_slice(&(state.open.len() as u16).to_le_bytes());
        for window in state.open {
            encode_window(aggregate, window, distinct, out);
        }
    }
}

fn encode_window(aggregate: &AggregateState, window: &WindowState, distinct: bool, out: &mut Vec<u8>) {
    for field in [window.start_ms, window.count, window.first_offset, window.last_offset, window.acc.to_bits()] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    if distinct {
        out.extend_from_slice(aggregate.sketches.get(window.sketch));
    }
}

fn decode_aggregate<'a>(
    reader: &mut Reader<'a>,
    limits: ProcessorLimits,
) -> Result<(AggregateState, Vec<DecodedKey<'a>>), CheckpointError> {
    let declaration_size = reader.u32("declaration size")? as usize;
    let declaration_bytes = reader.take(declaration_size, "declaration")?;
    let declaration =
        AggregateDeclaration::from_json(declaration_bytes).map_err(|error| CheckpointError::Declaration { error })?;
    let from_offset = reader.u64("from_offset")?;
    let mut aggregate = AggregateState::new(declaration, from_offset, limits.keys_per_aggregate_max);
    aggregate.max_time_ms = reader.option("max_time_ms")?;
    aggregate.watermark_ms = reader.option("watermark_ms")?;
    aggregate.next_sequence = reader.u64("next_sequence")?;
    if reader.u16("counter count")? as usize != COUNTER_COUNT {
        return Err(reader.error("counter count"));
    }
    let mut counters = [0u64; COUNTER_COUNT];
    for counter in &mut counters {
        *counter = reader.u64("counter")?;
    }
    aggregate.counters = counters_from(counters);
    let key_count = reader.u32("key count")? as usize;
    let mut previous_key: Option<&[u8]> = None;
    let mut keys = Vec::with_capacity(key_count.min(reader.bytes.len() / 4));
    for _ in 0..key_count {
        let key = reader.bytes16("key")?;
        if previous_key.is_some_and(|previous| previous >= key) {
            return Err(reader.error("key order"));
        }
        previous_key = Some(key);
        let state = decode_key(reader, &mut aggregate)?;
        keys.push((key, state));
    }
    aggregate.min_open_end_ms = match aggregate.window {
        None => u64::MAX,
        Some((size_ms, _)) => {
            let first_starts = keys.iter().filter_map(|(_, state)| state.open.first());
            first_starts.map(|window| window.start_ms + size_ms).min().unwrap_or(u64::MAX)
        }
    };
    Ok((aggregate, keys))
}

fn decode_key(reader: &mut Reader<'_>, aggregate: &mut AggregateState) -> Result<KeyState, CheckpointError> {
    let last_closed = match reader.u8("last_closed present")? {
        0 => None,
        1 => Some(decode_window(reader, aggregate)?),
        _ => return Err(reader.error("last_closed present")),
    };
    let open_count = reader.u16("open window count")? as usize;
    let windows_per_key = usize::from(aggregate.windows_per_key);
    if open_count > windows_per_key || (aggregate.window.is_none() && last_closed.is_some()) {
        return Err(reader.error("open window count"));
    }
    let mut state = KeyState { open: Default::default(), last_closed };
    if windows_per_key > 1 {
        state.open.reserve_exact(windows_per_key);
    }
    for _ in 0..open_count {
        let window = decode_window(reader, aggregate)?;
        let ordered = state.open.last().is_none_or(|previous| previous.start_ms < window.start_ms);
        let open = match (aggregate.window, aggregate.watermark_ms) {
            (Some((size_ms, _)), Some(watermark_ms)) => window.start_ms + size_ms > watermark_ms,
            (None, _) => window.start_ms == 0,
            (Some(_), None) => false,
        };
        if !ordered || !open || window.count == 0 {
            return Err(reader.error("open window"));
        }
        state.open.push(window);
    }
    if state.open.is_empty() && state.last_closed.is_none() {
        return Err(reader.error("key without windows"));
    }
    Ok(state)
}

fn decode_window(reader: &mut Reader<'_>, aggregate: &mut AggregateState) -> Result<WindowState, CheckpointError> {
    let start_ms = reader.u64("window start")?;
    let count = reader.u64("window count")?;
    let first_offset = reader.u64("window first_offset")?;
    let last_offset = reader.u64("window last_offset")?;
    let acc = f64::from_bits(reader.u64("window value")?);
    let aligned = match aggregate.window {
        None => start_ms == 0,
        Some((_, step_ms)) => start_ms.is_multiple_of(step_ms) && start_ms <= crate::aggregate::TIME_MS_MAX,
    };
    if !aligned || first_offset > last_offset || acc.is_nan() {
        return Err(reader.error("window"));
    }
    let mut sketch = NO_SKETCH;
    if aggregate.declaration.kind == AggregateKind::DistinctEstimate {
        let registers = reader.take(HLL_REGISTERS, "sketch")?;
        if registers.iter().any(|&register| register > REGISTER_MAX) {
            return Err(reader.error("sketch register"));
        }
        sketch = aggregate.sketches.allocate();
        aggregate.sketches.get_mut(sketch).copy_from_slice(registers);
    }
    Ok(WindowState { start_ms, count, first_offset, last_offset, acc, sketch })
}

/// Reads fields in order; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    /// Bytes before `bytes` in the checkpoint, for error positions.
    base: usize,
}

impl<'a> Reader<'a> {
    fn error(&self, what: &'static str) -> CheckpointError {
        CheckpointError::Malformed { what, byte_position: self.base + self.position }
    }

    fn take(&mut self, size: usize, what: &'static str) -> Result<&'a [u8], CheckpointError> {
        let end = self.position.checked_add(size).filter(|&end| end <= self.bytes.len()).ok_or(self.error(what))?;
        let taken = &self.bytes[self.position..end];
        self.position = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], CheckpointError> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, CheckpointError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, CheckpointError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, CheckpointError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, CheckpointError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn bytes16(&mut self, what: &'static str) -> Result<&'a [u8], CheckpointError> {
        let size = self.u16(what)? as usize;
        self.take(size, what)
    }

    fn option(&mut self, what: &'static str) -> Result<Option<u64>, CheckpointError> {
        let present = self.u8(what)?;
        let value = self.u64(what)?;
        match present {
            0 if value == 0 => Ok(None),
            1 => Ok(Some(value)),
            _ => Err(self.error(what)),
        }
    }
}
