//! Keyed stateful processing: per-key counts, sums and windowed aggregates
//! computed on a partition's events in offset order, as the owning shard
//! applies them. Everything here is pure: no I/O, no glommio, no clock of
//! its own (time comes in as arguments), so it runs the same in unit tests,
//! in replay after a crash, and on the shard.
//!
//! # The pieces
//!
//! * [`AggregateDeclaration`] (`declaration.rs`): what an aggregate computes
//!   (kind, value source, window, time source, lateness, output stream),
//!   parsed and validated from the JSON that `POST /streams/NAME/aggregates`
//!   receives, with errors that name the field and the value.
//! * [`PartitionProcessor`] (`processor.rs`): the state of every aggregate
//!   declared on one stream, for ONE partition. The engine calls
//!   [`PartitionProcessor::on_event`] for every event it applies, in offset
//!   order; closed windows come back through a callback as [`ClosedWindow`]s,
//!   which the engine appends to the output stream
//!   ([`ClosedWindow::write_json`] writes the payload). Queries:
//!   [`PartitionProcessor::current`] (one key's windows) and
//!   [`PartitionProcessor::top`] (per partition), merged across partitions
//!   and shards with [`merge_top`].
//! * Checkpoints (`checkpoint.rs`): [`PartitionProcessor::encode_checkpoint`]
//!   writes the whole state, with the log offset it covers, into bytes with a
//!   CRC32C; [`PartitionProcessor::decode_checkpoint`] reads it back or says
//!   why it cannot ([`CheckpointError`]).
//! * `cycle.rs`: aggregates as a graph of streams (`stream -> output`); a
//!   declaration that would close a cycle is refused ([`cycle_closed_by`]),
//!   and one an older catalog holds is found at start ([`cycles_in`]).
//! * `extract.rs` reads values and event times out of JSON, ILP and plain
//!   payloads with the engine's own parsers; `hll.rs` is the
//!   `distinct-estimate` sketch; `aggregate.rs` is one aggregate's state
//!   (keys, windows, watermark, the sweep that closes windows).
//!
//! # Semantics in one place
//!
//! * **Windows** are aligned to the Unix epoch: `[k*step, k*step + size)`.
//!   An event at time `t` belongs to every window that contains `t`.
//! * **Watermark**, per partition and per aggregate (aggregates on one
//!   stream may read time from different places and allow different
//!   lateness): `max(event time seen) - allowed_lateness_ms`, never
//!   decreasing. For arrival-time aggregates the engine's clock raises it
//!   too ([`PartitionProcessor::advance_time`]). A window closes, and is
//!   emitted once, when the watermark reaches its end. An event whose every
//!   window has closed is late: counted (`late_events_dropped`) and skipped.
//!   An event some of whose windows have closed counts in the open ones
//!   (`late_partial_events`).
//! * **Emission order** is deterministic: each time windows close, they are
//!   emitted in order of window end, then key bytes; each carries a dense
//!   `sequence` per (partition, aggregate) and the offset range of the events
//!   it holds. The same input gives the same windows, values and sequences,
//!   whatever the hash seeds, checkpoints and migrations in between.
//! * **Malformed input**: a value or time that is missing or does not parse
//!   is counted (`value_malformed`, `time_malformed`) and the event is
//!   skipped for that aggregate only; the engine stores the event anyway.
//!
//! # Bounded state
//!
//! Per partition and aggregate, at most `keys_per_aggregate_max` keys
//! ([`ProcessorLimits`], default [`KEYS_PER_AGGREGATE_MAX`]), and per key at
//! most the declaration's open windows (`ceil((size + lateness) / step)`,
//! at most [`WINDOWS_PER_KEY_MAX`], checked when declared, so never reached at
//! run time). A key costs at most [`key_cost_bytes`]. A windowed key whose
//! windows have all closed is dropped once the watermark is one window size
//! past its last window's end (until then queries show that window).
//!
//! **At the limit a new key is refused** (counted in `keys_refused`; the
//! event is skipped for that aggregate), after first dropping every idle
//! windowed key. Why refuse rather than evict the least recently updated
//! key: eviction would either lose a running key's state silently (its value
//! would be wrong when it returns) or emit a window early and then emit it
//! again with a different value, breaking the guarantee that a window is
//! emitted once with its final value; refusing keeps every reported value
//! exact for the keys tracked and makes the loss a visible counter. It is
//! also deterministic, so replay after a crash refuses the same keys, and it
//! costs nothing per event (LRU order would cost a list update per event).
//!
//! # Exactly once with respect to the log
//!
//! The processor covers every offset below [`PartitionProcessor::next_offset`]
//! and ignores events below it (replay is idempotent). After a crash the
//! engine decodes the last good checkpoint and replays the log from its
//! `next_offset`: every event is counted once. Output is a deterministic
//! function of the input, so windows closed after the checkpoint and before
//! the crash are emitted again **identical** (same value, count, offsets and
//! sequence); windows closed before the checkpoint are not in its state and
//! are never emitted again. A reader drops a window whose `(aggregate,
//! partition, sequence)` it has already seen (the engine does not suppress
//! the repeats itself; see `crate::shard::aggregates` for how checkpoints
//! are ordered against the output's durability so that none is lost).
//!
//! ```
//! use spate::aggregate::{AggregateDeclaration, PartitionProcessor, ProcessorLimits};
//! let declaration = AggregateDeclaration::from_json(br#"{"name":"clicks","stream":"web","kind":"count",
//!     "window":{"type":"tumbling","size_ms":1000},"output":"clicks-per-second"}"#).unwrap();
//! let mut processor = PartitionProcessor::new("web", 7, 0, ProcessorLimits::default());
//! processor.add_aggregate(declaration, 0).unwrap();
//! let mut closed = Vec::new();
//! let mut out = |window: &spate::aggregate::ClosedWindow<'_>| closed.push((window.key.to_vec(), window.value));
//! processor.on_event(0, b"alice", b"click", 1_000, &mut out);
//! processor.on_event(1, b"alice", b"click", 1_500, &mut out);
//! processor.on_event(2, b"bob", b"click", 2_100, &mut out); // the watermark passes 2000
//! assert_eq!(closed, vec![(b"alice".to_vec(), 2.0)]);
//! let mut bytes = Vec::new();
//! processor.encode_checkpoint(&mut bytes);
//! let restored = PartitionProcessor::decode_checkpoint(&bytes, ProcessorLimits::default()).unwrap();
//! assert_eq!(restored.next_offset(), 3);
//! ```

mod checkpoint;
mod cycle;
mod declaration;
mod extract;
mod hll;
mod keys;
mod output;
mod processor;
mod state;

pub use checkpoint::{CHECKPOINT_MAGIC, CHECKPOINT_VERSION, CheckpointError};
pub use cycle::{Cycle, cycle_closed_by, cycles_in};
pub use declaration::{
    AggregateDeclaration, AggregateKind, DeclarationError, LatePolicy, SOURCE_SIZE_MAX, TimeSource, ValueSource,
    WindowSpec,
};
pub use hll::{HLL_PRECISION, HLL_REGISTERS};
pub use output::{AggregateStats, ClosedOutputs, ClosedWindow, KeyView, TopEntry, WindowView, merge_top};
pub use processor::{PartitionProcessor, ProcessError};
pub use state::AggregateCounters;

pub use crate::config::limits::{AGGREGATES_PER_STREAM_MAX, KEYS_PER_AGGREGATE_MAX, TOP_N_MAX};

/// Longest aggregate name, in bytes (`[a-z0-9._-]`).
pub const AGGREGATE_NAME_SIZE_MAX: usize = 64;
/// Open windows one key may hold in one aggregate: a declaration implying
/// more (`ceil((size + lateness) / step)`) is refused. Each open window is
/// [`WINDOW_ENTRY_BYTES`] (plus a [`HLL_REGISTERS`]-byte sketch for
/// `distinct-estimate`), allocated when the key is first seen.
pub const WINDOWS_PER_KEY_MAX: usize = 64;
/// Longest window (size or step): 366 days.
pub const WINDOW_SIZE_MS_MAX: u64 = 366 * 86_400_000;
/// Most allowed lateness: 7 days.
pub const ALLOWED_LATENESS_MS_MAX: u64 = 7 * 86_400_000;
/// Latest event time accepted (9999-12-31T23:59:59.999Z): later ones are
/// malformed. Keeps every window end far from `u64::MAX`.
pub const TIME_MS_MAX: u64 = 253_402_300_799_999;
/// Bytes of one window's accumulator.
pub const WINDOW_ENTRY_BYTES: usize = std::mem::size_of::<state::WindowState>();
/// Bytes of one key in one aggregate besides its key bytes and the open
/// windows beyond the first: its slot in the partition's key index at worst
/// occupancy (hashbrown keeps at most 7/8 of a power-of-two table full, so
/// up to twice the slots) with its control byte, its state in the key's
/// row (the first open window and the last closed one, inline) twice over
/// (the rows' vector doubles as it grows), and allocator overhead of the
/// key's own allocations (two at most: long key bytes and windows beyond
/// the first). The index slot is shared by the partition's aggregates, so
/// a key that several aggregates track costs less than this per aggregate.
pub const KEY_ENTRY_BYTES: usize =
    2 * (std::mem::size_of::<keys::IndexSlot>() + 1) + 2 * std::mem::size_of::<keys::KeyState>() + 32;

const _: () = assert!(TIME_MS_MAX < u64::MAX / 2 && WINDOW_SIZE_MS_MAX < u64::MAX / 4);
const _: () = assert!(WINDOWS_PER_KEY_MAX <= u16::MAX as usize);
const _: () = assert!(AGGREGATES_PER_STREAM_MAX <= u16::MAX as usize);
const _: () = assert!(KEYS_PER_AGGREGATE_MAX as usize <= u32::MAX as usize);

/// The most memory one key of one aggregate can hold, in bytes: its entry,
/// its key bytes and its windows (`windows_per_key`, all outside the row
/// when more than one, plus the last closed one kept for queries; each
/// with a sketch for `distinct-estimate`).
pub const fn key_cost_bytes(key_size: usize, windows_per_key: usize, distinct: bool) -> usize {
    let sketch_bytes = if distinct { (windows_per_key + 1) * (HLL_REGISTERS + 4) } else { 0 };
    let spilled_bytes = if windows_per_key > 1 { windows_per_key * WINDOW_ENTRY_BYTES } else { 0 };
    KEY_ENTRY_BYTES + key_size + spilled_bytes + sketch_bytes
}

/// Open windows a key may hold at once: windows still open end after the
/// watermark and start at or before the largest event time, which is at
/// most `lateness` past the watermark, so their starts are multiples of
/// `step` in a span of `size + lateness`.
pub const fn windows_per_key(size_ms: u64, step_ms: u64, allowed_lateness_ms: u64) -> u64 {
    (size_ms + allowed_lateness_ms).div_ceil(step_ms)
}

/// Limits a processor is built with (the engine takes them from its config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessorLimits {
    /// Keys per aggregate on this partition; see [`KEYS_PER_AGGREGATE_MAX`].
    pub keys_per_aggregate_max: u32,
}

impl Default for ProcessorLimits {
    fn default() -> ProcessorLimits {
        ProcessorLimits { keys_per_aggregate_max: KEYS_PER_AGGREGATE_MAX }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory formula's numbers, as the README states them: 322 bytes per key entry (66 of
    /// them the shared index slot), 354 for a 32-byte key with one open window, 48 per window
    /// beyond the first, 1028 per sketch.
    #[test]
    fn key_cost_matches_the_documented_formula() {
        assert_eq!(WINDOW_ENTRY_BYTES, 48);
        assert_eq!(2 * (std::mem::size_of::<keys::IndexSlot>() + 1), 66);
        assert_eq!(KEY_ENTRY_BYTES, 322);
        assert_eq!(key_cost_bytes(32, 1, false), 354);
        assert_eq!(key_cost_bytes(32, 1, true), 354 + 2 * 1028);
        assert_eq!(key_cost_bytes(32, 7, false), 354 + 7 * 48);
        assert_eq!(windows_per_key(60_000, 10_000, 5_000), 7);
    }
}
