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
use crate::aggregate::output::{AggregateStats, ClosedOutputs, ClosedWindow, KeyView, TopEntry};
use crate::aggregate::state::{AggregateState, Closing, Event};
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
        Ok(from_offset)
    }

    /// Drops an aggregate and its state; `false` if there is none by that name.
    pub fn remove_aggregate(&mut self, name: &str) -> bool {
        let index = self.aggregate_index(name);
        index.map(|index| self.aggregates.remove(index)).is_some()
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
        let event = Event { offset, partition: self.partition, key, payload, arrival_ms };
        for aggregate in &mut self.aggregates {
            aggregate.on_event(event, &mut self.scratch, &mut self.closing, out);
        }
        self.next_offset = offset + 1;
        true
    }

    /// [`PartitionProcessor::on_event`], with the closed windows kept in
    /// the processor until [`PartitionProcessor::take_output`]: the engine's
    /// entry point on its apply path.
    #[inline]
    pub fn process(&mut self, offset: u64, key: &[u8], payload: &[u8], arrival_ms: u64) -> bool {
        if offset < self.next_offset {
            self.replay_skipped += 1;
            return false;
        }
        let event = Event { offset, partition: self.partition, key, payload, arrival_ms };
        let output = &mut self.output;
        let mut out = |window: &ClosedWindow<'_>| output.push(window);
        for aggregate in &mut self.aggregates {
            aggregate.on_event(event, &mut self.scratch, &mut self.closing, &mut out);
        }
        self.next_offset = offset + 1;
        true
    }

    /// [`PartitionProcessor::advance_time`], keeping the closed windows.
    pub fn advance(&mut self, now_ms: u64) {
        let output = &mut self.output;
        let mut out = |window: &ClosedWindow<'_>| output.push(window);
        for aggregate in &mut self.aggregates {
            aggregate.advance_time(now_ms, self.partition, &mut self.closing, &mut out);
        }
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
        for aggregate in &mut self.aggregates {
            aggregate.advance_time(now_ms, self.partition, &mut self.closing, out);
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
        self.aggregates[self.aggregate_index(aggregate)?].view(key, self.partition)
    }

    /// The `n` (at most [`TOP_N_MAX`]) keys with the largest value on this
    /// partition: running aggregates by their value, windowed ones by each
    /// key's last closed window. Ties go to the smaller key. Merge lists of
    /// several partitions with [`crate::aggregate::merge_top`].
    pub fn top(&self, aggregate: &str, n: usize) -> Vec<TopEntry> {
        match self.aggregate_index(aggregate) {
            Some(index) => self.aggregates[index].top(n.min(TOP_N_MAX)),
            None => Vec::new(),
        }
    }

    /// Keys, windows, memory and counters of every aggregate.
    pub fn stats(&self) -> Vec<AggregateStats> {
        self.aggregates
            .iter()
            .map(|aggregate| AggregateStats {
                aggregate: aggregate.declaration.name.clone(),
                partition: self.partition,
                keys: aggregate.table.keys.len() as u64,
                open_windows: aggregate.open_windows(),
                watermark_ms: aggregate.window.and(aggregate.watermark_ms),
                memory_bytes: aggregate.memory_bytes(),
                from_offset: aggregate.from_offset,
                counters: aggregate.counters,
            })
            .collect()
    }

    /// Estimated heap bytes held, reused buffers included.
    pub fn memory_bytes(&self) -> u64 {
        let aggregates: u64 = self.aggregates.iter().map(AggregateState::memory_bytes).sum();
        let buffers = self.scratch.capacity() + self.closing.capacity_bytes() + self.output.capacity_bytes();
        aggregates + buffers as u64
    }

    /// Rebuilds a processor from decoded parts (checkpoint.rs).
    pub(crate) fn from_parts(
        stream: String,
        partition: u32,
        next_offset: u64,
        limits: ProcessorLimits,
        aggregates: Vec<AggregateState>,
    ) -> PartitionProcessor {
        let mut processor = PartitionProcessor::new(&stream, partition, next_offset, limits);
        processor.aggregates = aggregates;
        processor
    }
}
