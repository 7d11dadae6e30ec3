//! [`PartitionProcessor`]: every aggregate of one stream, on one partition.
//!
//! The engine owns one per (stream, partition) that has aggregates, next to
//! the partition's log, and moves it with the partition (it is `Send`; or
//! through checkpoint bytes). Calls, all on the owning shard:
//!
//! * [`PartitionProcessor::on_event`] for every event applied, in offset
//!   order, with the batch's arrival time; closed windows come out through
//!   the callback.
//! * [`PartitionProcessor::advance_time`] from a timer, so arrival-time
//!   windows close when no events come ([`PartitionProcessor::next_close_ms`]
//!   says when the next one is due). Never during replay.
//! * Queries, checkpoints and stats at any time between those calls.

use std::fmt;

use crate::aggregate::declaration::AggregateDeclaration;
use crate::aggregate::extract::Input;
use crate::aggregate::keys::KeyTable;
use crate::aggregate::output::{AggregateStats, ClosedOutputs, ClosedWindow, KeyView, TopEntry};
use crate::aggregate::state::{AggregateCounters, AggregateState, Closing, Event};
use crate::aggregate::{AGGREGATES_PER_STREAM_MAX, ProcessorLimits, TOP_N_MAX};

/// The state of every aggregate declared on one stream, for one partition.
#[derive(Debug)]
pub struct PartitionProcessor {
    pub(crate) stream: String,
    pub(crate) partition: u32,
    /// Every offset below this has been applied (or was before the state
    /// began): the offset replay starts from.
    pub(crate) next_offset: u64,
    pub(crate) limits: ProcessorLimits,
    pub(crate) aggregates: Vec<AggregateState>,
    /// Every aggregate's keys: column `i` is `aggregates[i]`'s.
    pub(crate) keys: KeyTable,
    /// Per aggregate, the first aggregate that reads the same value
    /// (itself when none before it does): the value is read once per event.
    value_readers: Vec<usize>,
    /// The event's values, per reader (`None` until read).
    values: Vec<Option<Option<Input>>>,
    /// Unescaped JSON scalars, reused across events.
    scratch: Vec<u8>,
    closing: Closing,
    /// Events ignored because their offset was already covered.
    replay_skipped: u64,
    /// Windows closed by [`PartitionProcessor::process`] and
    /// [`PartitionProcessor::advance`], until the engine takes them.
    output: ClosedOutputs,
}

/// Why a processor refused a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessError {
    /// The declaration is for another stream.
    WrongStream {
        declared: String,
        stream: String,
    },
    TooManyAggregates {
        aggregate_count: usize,
        aggregate_count_max: usize,
    },
    NameTaken {
        name: String,
    },
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessError::WrongStream { declared, stream } => {
                write!(f, "the aggregate reads stream {declared:?}, this processor is for {stream:?}")
            }
            ProcessError::TooManyAggregates { aggregate_count, aggregate_count_max } => {
                write!(f, "stream has {aggregate_count} aggregates, limit {aggregate_count_max}")
            }
            ProcessError::NameTaken { name } => write!(f, "aggregate {name:?} already exists on this stream"),
        }
    }
}

impl std::error::Error for ProcessError {}

impl PartitionProcessor {
    /// An empty processor for `stream`'s `partition` that covers every
    /// offset below `next_offset` (the partition's next offset when the
    /// first aggregate is declared).
    pub fn new(stream: &str, partition: u32, next_offset: u64, limits: ProcessorLimits) -> PartitionProcessor {
        PartitionProcessor {
            stream: stream.to_string(),
            partition,
            next_offset,
            limits,
            aggregates: Vec::new(),
            keys: KeyTable::default(),
            value_readers: Vec::new(),
            values: Vec::new(),
            scratch: Vec::new(),
            closing: Closing::default(),
            replay_skipped: 0,
            output: ClosedOutputs::default(),
        }
    }

    pub fn stream(&self) -> &str {
        &self.stream
    }

    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The first offset not covered: replay the log from here.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    pub fn limits(&self) -> ProcessorLimits {
        self.limits
    }

    /// Events ignored because their offset was already covered.
    pub fn replay_skipped(&self) -> u64 {
        self.replay_skipped
    }

    /// Adds an aggregate that counts events from `from_offset` on (at the
    /// earliest [`PartitionProcessor::next_offset`]: events already applied
    /// are not revisited). Returns the offset it counts from.
    pub fn add_aggregate(&mut self, declaration: AggregateDeclaration, from_offset: u64) -> Result<u64, ProcessError> {
        if declaration.stream != self.stream {
            return Err(ProcessError::WrongStream { declared: declaration.stream, stream: self.stream.clone() });
        }
        if self.aggregate_index(&declaration.name).is_some() {
            return Err(ProcessError::NameTaken { name: declaration.name });
        }
        if self.aggregates.len() >= AGGREGATES_PER_STREAM_MAX {
            return Err(ProcessError::TooManyAggregates {
                aggregate_count: self.aggregates.len() + 1,
                aggregate_count_max: AGGREGATES_PER_STREAM_MAX,
            });
        }
        let from_offset = from_offset.max(self.next_offset);
        let keys_max = self.limits.keys_per_aggregate_max;
        self.aggregates.push(AggregateState::new(declaration, from_offset, keys_max));
        self.keys.add_column();
        self.find_value_readers();
        Ok(from_offset)
    }

    /// Drops an aggregate and its state; `false` if there is none by that name.
    pub fn remove_aggregate(&mut self, name: &str) -> bool {
        let Some(index) = self.aggregate_index(name) else { return false };
        self.aggregates.remove(index);
        self.keys.remove_column(index);
        self.find_value_readers();
        true
    }

    fn find_value_readers(&mut self) {
        let aggregates = &self.aggregates;
        let first_reader = |index: usize| {
            (0..index).find(|&other| aggregates[index].reads_value_as(&aggregates[other])).unwrap_or(index)
        };
        self.value_readers = (0..aggregates.len()).map(first_reader).collect();
        self.values = vec![None; aggregates.len()];
    }

    /// The declarations, in the order they were added.
    pub fn declarations(&self) -> impl Iterator<Item = &AggregateDeclaration> {
        self.aggregates.iter().map(|aggregate| &aggregate.declaration)
    }

    /// The offset an aggregate counts from.
    pub fn from_offset(&self, aggregate: &str) -> Option<u64> {
        Some(self.aggregates[self.aggregate_index(aggregate)?].from_offset)
    }

    fn aggregate_index(&self, name: &str) -> Option<usize> {
        self.aggregates.iter().position(|aggregate| aggregate.declaration.name == name)
    }

    /// Applies one event to every aggregate. Events must come in increasing
    /// offset order; an offset below [`PartitionProcessor::next_offset`] is
    /// already counted and is ignored (returns `false`), which makes replay
    /// idempotent. `arrival_ms` is the time the engine applied the event's
    /// batch (ms since the Unix epoch), from a clock that never goes back
    /// for this partition. Windows the event's time closes are handed to
    /// `out` before the event is added. Allocates only for a key seen for
    /// the first time (and while reused buffers grow to their peak).
    #[inline]
    pub fn on_event<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        offset: u64,
        key: &[u8],
        payload: &[u8],
        arrival_ms: u64,
        out: &mut F,
    ) -> bool {
        if offset < self.next_offset {
            self.replay_skipped += 1;
            return false;
        }
        let event = Event { offset, partition: self.partition, key, payload, arrival_ms, value_at: 0 };
        self.apply(event, out);
        true
    }

    /// [`PartitionProcessor::on_event`], with the closed windows kept in
    /// the processor until [`PartitionProcessor::take_output`]: the engine's
    /// entry point on its apply path. `value_at` is the JSON listener's hint
    /// of where the value starts ([`crate::protocol::record::RecordRef::value_at`];
    /// 0: not known).
    #[inline]
    pub fn process(&mut self, offset: u64, key: &[u8], payload: &[u8], arrival_ms: u64, value_at: u16) -> bool {
        if offset < self.next_offset {
            self.replay_skipped += 1;
            return false;
        }
        let event = Event { offset, partition: self.partition, key, payload, arrival_ms, value_at };
        let mut output = std::mem::take(&mut self.output);
        self.apply(event, &mut |window: &ClosedWindow<'_>| output.push(window));
        self.output = output;
        true
    }

    /// Applies an event whose offset is new: its key is looked up once
    /// (added if new), then every aggregate prepares it (time, value,
    /// watermark; a sweep may drop keys, never this one) and, unless it
    /// skips the event, adds it to its column of the key's row. A key no
    /// aggregate tracks afterwards leaves the table.
    #[inline]
    fn apply<F: FnMut(&ClosedWindow<'_>)>(&mut self, event: Event<'_>, out: &mut F) {
        self.next_offset = event.offset + 1;
        if self.aggregates.is_empty() {
            return;
        }
        self.values.fill(None);
        let (row, _) = self.keys.row_for(event.key);
        // Whether some aggregate put the event in a window (then the key stays).
        let mut tracked = false;
        for (column, aggregate) in self.aggregates.iter_mut().enumerate() {
            let keys = (&mut self.keys, column, Some(row));
            let value = &mut self.values[self.value_readers[column]];
            let prepared = aggregate.prepare((event, value), &mut self.scratch, &mut self.closing, keys, out);
            if let Some(prepared) = prepared {
                tracked |= aggregate.apply(prepared, event.offset, &mut self.keys, row, column);
            }
        }
        if !tracked {
            self.keys.remove_if_empty(event.key, row);
        }
    }

    /// Starts fetching what every event reads of each aggregate (the first
    /// three cache lines of its state: [`AggregateState`]'s layout).
    #[inline]
    pub fn prefetch(&self) {
        for aggregate in &self.aggregates {
            crate::runtime::prefetch::prefetch_lines(aggregate as *const AggregateState, 3);
        }
    }

    /// [`PartitionProcessor::advance_time`], keeping the closed windows.
    pub fn advance(&mut self, now_ms: u64) {
        let mut output = std::mem::take(&mut self.output);
        self.advance_time(now_ms, &mut |window: &ClosedWindow<'_>| output.push(window));
        self.output = output;
    }

    /// Moves the covered offsets up to `offset` without counting what is
    /// below it (events the log no longer holds).
    pub fn skip_to(&mut self, offset: u64) {
        self.next_offset = self.next_offset.max(offset);
    }

    /// Whether closed windows wait for [`PartitionProcessor::take_output`].
    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Moves the closed windows kept so far behind `into`'s.
    pub fn take_output(&mut self, into: &mut ClosedOutputs) {
        into.append(&mut self.output);
    }

    /// The engine's clock (ms since the Unix epoch, the clock arrival times
    /// come from): closes the arrival-time windows whose end plus lateness
    /// it has reached, so they come out when no events arrive. Event-time
    /// aggregates only move with their events. Must not be called while
    /// replaying the log after a recovery (the replayed events have older
    /// arrival times and would be late), nor with a time later than the
    /// arrival time the next applied event will carry.
    pub fn advance_time<F: FnMut(&ClosedWindow<'_>)>(&mut self, now_ms: u64, out: &mut F) {
        for (column, aggregate) in self.aggregates.iter_mut().enumerate() {
            aggregate.advance_time(now_ms, self.partition, &mut self.closing, (&mut self.keys, column, None), out);
        }
    }

    /// When [`PartitionProcessor::advance_time`] next has a window to close
    /// (the engine arms its timer for it), or `None` when no arrival-time
    /// window is open.
    pub fn next_close_ms(&self) -> Option<u64> {
        self.aggregates.iter().filter_map(AggregateState::next_close_ms).min()
    }

    /// One key's open windows and last closed window in `aggregate`, or
    /// `None` when the aggregate is unknown or holds nothing for the key.
    pub fn current(&self, aggregate: &str, key: &[u8]) -> Option<KeyView> {
        let column = self.aggregate_index(aggregate)?;
        let state = self.keys.state(self.keys.row(key)?, column);
        self.aggregates[column].view(state, self.partition)
    }

    /// The `n` (at most [`TOP_N_MAX`]) keys with the largest value on this
    /// partition: running aggregates by their value, windowed ones by each
    /// key's last closed window. Ties go to the smaller key. Merge lists of
    /// several partitions with [`crate::aggregate::merge_top`].
    pub fn top(&self, aggregate: &str, n: usize) -> Vec<TopEntry> {
        match self.aggregate_index(aggregate) {
            Some(index) => self.aggregates[index].top((&self.keys, index), n.min(TOP_N_MAX)),
            None => Vec::new(),
        }
    }

    /// Each aggregate's counters and key count: what `/stats` sums, in
    /// O(aggregates), where [`PartitionProcessor::stats`] walks every key
    /// for its windows and memory.
    pub fn counters(&self) -> impl Iterator<Item = (&AggregateCounters, u64)> + '_ {
        self.aggregates.iter().map(|aggregate| (&aggregate.counters, u64::from(aggregate.key_count)))
    }

    /// Keys, windows, memory and counters of every aggregate.
    pub fn stats(&self) -> Vec<AggregateStats> {
        self.aggregates
            .iter()
            .enumerate()
            .map(|(column, aggregate)| AggregateStats {
                aggregate: aggregate.declaration.name.clone(),
                partition: self.partition,
                keys: u64::from(aggregate.key_count),
                open_windows: aggregate.open_windows((&self.keys, column)),
                watermark_ms: aggregate.window.and(aggregate.watermark_ms),
                memory_bytes: aggregate.memory_bytes((&self.keys, column)),
                from_offset: aggregate.from_offset,
                counters: aggregate.counters,
            })
            .collect()
    }

    /// Estimated heap bytes held, reused buffers included. `/stats` asks
    /// every partition for this: the key table answers from the counts it
    /// keeps (`KeyTable::memory_bytes`), without a walk, where
    /// [`PartitionProcessor::stats`] walks it once per aggregate.
    pub fn memory_bytes(&self) -> u64 {
        let sketches: usize = self.aggregates.iter().map(|aggregate| aggregate.sketches.capacity_bytes()).sum();
        let aggregates = (self.keys.memory_bytes() + sketches) as u64;
        let values = self.values.capacity() * std::mem::size_of::<Option<Option<Input>>>();
        let buffers = self.scratch.capacity() + self.closing.capacity_bytes() + self.output.capacity_bytes() + values;
        aggregates + buffers as u64
    }

    /// Rebuilds a processor from decoded parts (checkpoint.rs): each
    /// aggregate with its keys' states.
    pub(crate) fn from_parts(
        stream: String,
        partition: u32,
        next_offset: u64,
        limits: ProcessorLimits,
        aggregates: Vec<(AggregateState, Vec<DecodedKey<'_>>)>,
    ) -> PartitionProcessor {
        let mut processor = PartitionProcessor::new(&stream, partition, next_offset, limits);
        for (column, (mut aggregate, keys)) in aggregates.into_iter().enumerate() {
            processor.keys.add_column();
            aggregate.key_count = keys.len() as u32;
            for (key, state) in keys {
                let (row, _) = processor.keys.row_for(key);
                processor.keys.set_state(row, column, state);
            }
            processor.aggregates.push(aggregate);
        }
        processor.find_value_readers();
        processor
    }
}

/// A key and one aggregate's state for it, as a checkpoint holds them.
pub(crate) type DecodedKey<'a> = (&'a [u8], crate::aggregate::keys::KeyState);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::ClosedWindow;

    const DECLARATIONS: [&str; 4] = [
        r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":1000},"output":"o"}"#,
        r#"{"name":"total","stream":"s","kind":"sum","value":"json:/amount","window":{"type":"hopping","size_ms":2000,"step_ms":500},"output":"o"}"#,
        r#"{"name":"forever","stream":"s","kind":"max","value":"json:/amount","window":{"type":"none"}}"#,
        r#"{"name":"users","stream":"s","kind":"distinct-estimate","value":"json:/user","window":{"type":"tumbling","size_ms":300},"output":"o"}"#,
    ];

    fn processor(declarations: &[&str], keys_max: u32) -> PartitionProcessor {
        let limits = ProcessorLimits { keys_per_aggregate_max: keys_max };
        let mut processor = PartitionProcessor::new("s", 3, 0, limits);
        for declaration in declarations {
            let declaration = AggregateDeclaration::from_json(declaration.as_bytes()).expect("valid");
            processor.add_aggregate(declaration, 0).expect("added");
        }
        processor
    }

    type Emitted = Vec<(String, Vec<u8>, u64, u64, u64)>;

    /// Feeds a deterministic mix: 300 keys (some long), values that are sometimes malformed,
    /// time moving forward with a few late events; returns what came out, in order, per
    /// aggregate.
    fn feed(processor: &mut PartitionProcessor, events: u64) -> Emitted {
        let mut emitted = Vec::new();
        for offset in 0..events {
            let key = match offset % 7 {
                0 => format!("a-key-long-enough-to-be-boxed-{}", offset % 31),
                _ => format!("k{}", (offset * 2_654_435_761) % 300),
            };
            let payload = match offset % 13 {
                0 => "not json".to_string(),
                _ => format!(r#"{{"amount":{},"user":"u{}"}}"#, offset % 97, offset % 41),
            };
            let arrival_ms = 1_000_000 + offset * 3 - (offset % 11 == 0) as u64 * 900;
            processor.on_event(offset, key.as_bytes(), payload.as_bytes(), arrival_ms, &mut |window: &ClosedWindow<
                '_,
            >| {
                emitted.push((
                    window.aggregate.to_string(),
                    window.key.to_vec(),
                    window.window_start_ms,
                    window.value.to_bits(),
                    window.sequence,
                ))
            });
        }
        emitted.sort_by(|left, right| left.0.cmp(&right.0).then(left.4.cmp(&right.4)));
        emitted
    }

    /// A partition whose aggregates share one key table computes, refuses and expires exactly
    /// what each aggregate computes alone (its own processor, so its own table): same closed
    /// windows and sequences, same counters, same per-aggregate checkpoint bytes, under a key
    /// limit that refuses keys. Removing an aggregate keeps the others exact.
    #[test]
    fn a_shared_key_table_computes_what_separate_tables_do() {
        for keys_max in [40, 100_000] {
            let mut shared = processor(&DECLARATIONS, keys_max);
            let shared_out = feed(&mut shared, 20_000);
            assert_eq!(shared.keys.memory_bytes(), shared.keys.memory_bytes_walked(), "the kept counts, fed");
            let mut alone_out = Vec::new();
            for (column, declaration) in DECLARATIONS.iter().enumerate() {
                let mut alone = processor(&[declaration], keys_max);
                alone_out.extend(feed(&mut alone, 20_000));
                assert_eq!(shared.stats()[column].counters, alone.stats()[0].counters, "{declaration}");
                assert_eq!(shared.stats()[column].keys, alone.stats()[0].keys, "{declaration}");
                let tracked = shared.keys.iter_column(column).count() as u64;
                assert_eq!(shared.stats()[column].keys, tracked, "the key count is the column's non-empty states");
                let key = b"k17";
                assert_eq!(
                    shared.current(&alone.aggregates[0].declaration.name, key),
                    alone.current(&alone.aggregates[0].declaration.name, key)
                );
            }
            alone_out.sort_by(|left, right| left.0.cmp(&right.0).then(left.4.cmp(&right.4)));
            assert!(shared_out.len() > 1000, "windows closed: {}", shared_out.len());
            assert_eq!(shared_out, alone_out, "keys_max {keys_max}");
            if keys_max == 40 {
                assert!(shared.stats().iter().all(|stats| stats.counters.keys_refused > 0), "the limit was reached");
            }
            let mut bytes = Vec::new();
            shared.encode_checkpoint(&mut bytes);
            let restored = PartitionProcessor::decode_checkpoint(&bytes, shared.limits()).expect("decodes");
            assert_eq!(restored.keys.memory_bytes(), restored.keys.memory_bytes_walked(), "restored");
            let mut again = Vec::new();
            restored.encode_checkpoint(&mut again);
            assert_eq!(bytes, again, "a checkpoint round-trips to the same bytes");
            assert!(shared.remove_aggregate("total") && shared.remove_aggregate("users"));
            assert_eq!(shared.keys.memory_bytes(), shared.keys.memory_bytes_walked(), "aggregates removed");
            let _ = feed(&mut shared, 20_000);
            assert_eq!(shared.keys.memory_bytes(), shared.keys.memory_bytes_walked(), "fed again");
            let mut alone = processor(&[DECLARATIONS[0], DECLARATIONS[2]], keys_max);
            let _ = feed(&mut alone, 20_000);
            assert_eq!(
                shared.stats().iter().map(|stats| stats.keys).collect::<Vec<_>>(),
                alone.stats().iter().map(|stats| stats.keys).collect::<Vec<_>>()
            );
            assert_eq!(
                shared.keys.len() as u64,
                alone.keys.len() as u64,
                "keys only the removed aggregates held are gone"
            );
        }
    }
}
