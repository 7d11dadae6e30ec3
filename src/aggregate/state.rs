//! One aggregate's state on one partition: its keys, each key's open
//! windows and last closed window, the watermark, and the sweep that closes
//! windows once the watermark passes their end.
//!
//! # Layout
//!
//! Keys live in the partition's [`KeyTable`] (`keys.rs`), shared by its
//! aggregates: this aggregate's state for a key is one column of the key's
//! row, so an event costs one probe for all of them. A key's first open
//! window is stored in the row itself; a declaration that may hold more
//! open windows per key reserves them all on the key's first event, so they
//! never grow. A window is one [`WindowState`] (48 bytes): for every kind
//! but `count` and `distinct-estimate` one `f64` is enough (sum, min, max or
//! last; avg keeps the sum), and `distinct-estimate` points into a pool of
//! sketches ([`SketchPool`]) that closed windows give back.
//!
//! The processor looks an event's key up once, then each aggregate takes it
//! in two calls: [`AggregateState::prepare`] reads its time and value and
//! moves the watermark (a sweep may drop keys from the table, never the
//! row held for the event), then [`AggregateState::apply`] adds it to the
//! key's windows.
//!
//! # Closing windows
//!
//! `min_open_end_ms` is the earliest end of any open window, kept exact (a
//! new window lowers it, the sweep recomputes it), so the per-event check is
//! one comparison. When the watermark reaches it, the sweep walks every key
//! once: windows that ended are copied (with their key) into a reused
//! buffer, sorted by (end, key) and emitted in that order, so the output
//! does not depend on the table's (randomly seeded) iteration order. A sweep
//! costs O(keys) and runs at most once per window step per aggregate and
//! partition (when windows close). The same pass drops idle keys: no open
//! window and a last closed window that ended a whole window size before
//! the watermark. The sweep runs BEFORE an event is added, so which keys are
//! idle when a new key meets the limit depends only on the watermark and the
//! events, never on when the engine's timer last fired.

use serde::Serialize;

use crate::aggregate::TIME_MS_MAX;
use crate::aggregate::declaration::{AggregateDeclaration, AggregateKind, TimeSource};
use crate::aggregate::extract::{self, Input};
use crate::aggregate::hll::{self, SketchPool};
use crate::aggregate::keys::{KeyTable, OpenWindows, StateRef, spilled_bytes};
use crate::aggregate::output::{ClosedWindow, KeyView, TopEntry, WindowView, top_order};

/// A window's index in the sketch pool when it has no sketch.
pub(crate) const NO_SKETCH: u32 = u32::MAX;

/// One window of one key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WindowState {
    /// 0 for a running aggregate's one window.
    pub(crate) start_ms: u64,
    pub(crate) count: u64,
    pub(crate) first_offset: u64,
    pub(crate) last_offset: u64,
    /// Sum (`sum`, `avg`), minimum, maximum or last value; unused by
    /// `count` and `distinct-estimate`.
    pub(crate) acc: f64,
    /// The sketch of a `distinct-estimate` window, else [`NO_SKETCH`].
    pub(crate) sketch: u32,
}

/// What one aggregate counted on one partition. Every counter is a pure
/// function of the input, so replay after a crash counts the same.
/// `repr(C)`: `events_applied`, which every event adds to, starts the cache
/// line [`AggregateState`] keeps them in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[repr(C)]
pub struct AggregateCounters {
    /// Events that counted in at least one window.
    pub events_applied: u64,
    /// Value missing or not a number (or not hashable) for this aggregate.
    pub value_malformed: u64,
    /// Event time missing or invalid.
    pub time_malformed: u64,
    /// Events whose every window had closed: skipped (`late: drop`).
    pub late_events_dropped: u64,
    /// Events some of whose windows had closed: counted in the others.
    pub late_partial_events: u64,
    /// Events older than the largest event time already seen (late or not).
    pub out_of_order_events: u64,
    /// Events of a new key skipped because the key limit was reached.
    pub keys_refused: u64,
    /// Idle keys dropped.
    pub keys_expired: u64,
    /// Windows closed and emitted.
    pub windows_closed: u64,
    /// Window updates skipped because a key had no room for another open
    /// window. Declarations are validated so this stays 0; it is here so
    /// that a bug shows as a number rather than as memory growth.
    pub windows_refused: u64,
}

/// Reused buffers for a sweep: the windows closing, and their keys.
#[derive(Debug, Default)]
pub(crate) struct Closing {
    entries: Vec<ClosingEntry>,
    keys: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
struct ClosingEntry {
    key_start: usize,
    key_end: usize,
    window: WindowState,
    value: f64,
}

impl Closing {
    fn push(&mut self, key: &[u8], window: WindowState, value: f64) {
        let key_start = self.keys.len();
        self.keys.extend_from_slice(key);
        self.entries.push(ClosingEntry { key_start, key_end: self.keys.len(), window, value });
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.keys.capacity() + self.entries.capacity() * std::mem::size_of::<ClosingEntry>()
    }
}

/// An aggregate's column of the partition's key table, and the row the
/// caller holds (a sweep keeps it in the table even when it empties).
pub(crate) type Column<'t> = (&'t mut KeyTable, usize, Option<u32>);

/// What an aggregate decided about an event before its key is looked up:
/// the value it adds and the windows it goes to (first and last start,
/// inclusive, step apart).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prepared {
    input: Input,
    first_start_ms: u64,
    last_start_ms: u64,
    step_ms: u64,
}

/// One aggregate on one partition. Its keys' states are a column of the
/// partition's [`KeyTable`]; the processor passes the table and the column
/// to every call that reads or changes them.
///
/// `repr(C)`, aligned to a cache line, with what every event reads or
/// writes first: the two first lines hold it all and the third the
/// counters an event adds to; the declaration and what only sweeps,
/// queries and the key limit read come after. In the compiler's own order
/// an event touched six of its eight lines, and a shard's partitions each
/// see a few events per batch, so most of those were misses (perf
/// annotate: the loads of `placed` and of the lateness took `place`'s
/// samples).
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct AggregateState {
    /// `(size_ms, step_ms)`, `None` when running.
    pub(crate) window: Option<(u64, u64)>,
    /// Events below this offset are not counted (declared after them).
    pub(crate) from_offset: u64,
    /// Earliest end of an open window (`u64::MAX` when none is open).
    pub(crate) min_open_end_ms: u64,
    /// The declaration's, read by every event.
    allowed_lateness_ms: u64,
    pub(crate) max_time_ms: Option<u64>,
    pub(crate) watermark_ms: Option<u64>,
    /// The last event time placed and where it went: the events of one
    /// batch share their arrival time, so most events skip the divisions.
    /// A pure function of (time, watermark), so not checkpointed.
    placed: Placed,
    /// At most [`crate::aggregate::WINDOWS_PER_KEY_MAX`].
    pub(crate) windows_per_key: u16,
    /// The declaration's, read by every event.
    kind: AggregateKind,
    /// The declaration's time source is the arrival time.
    arrival_time: bool,
    /// Keys this aggregate tracks: its non-empty states in the table.
    pub(crate) key_count: u32,
    pub(crate) counters: AggregateCounters,
    pub(crate) keys_max: u32,
    /// The watermark at which idle keys were last collected for a key at
    /// the limit: no key can become idle until the watermark moves, so the
    /// limit does not rescan the table per refused event. Not checkpointed:
    /// a collection more or less gives the same state.
    collected_at_watermark_ms: Option<u64>,
    pub(crate) next_sequence: u64,
    pub(crate) sketches: SketchPool,
    pub(crate) declaration: AggregateDeclaration,
}

// What an event touches fits the first two cache lines (the counters are
// the third).
const _: () = assert!(std::mem::offset_of!(AggregateState, key_count) + 4 <= 128);
const _: () = assert!(std::mem::offset_of!(AggregateState, counters) == 128);
const _: () = assert!(crate::aggregate::WINDOWS_PER_KEY_MAX <= u16::MAX as usize);

/// [`AggregateState::place`]'s arithmetic for one (time, watermark).
#[derive(Debug, Clone, Copy)]
struct Placed {
    /// [`Placed::NONE`]'s is no event time (they are at most
    /// [`crate::aggregate::TIME_MS_MAX`]).
    time_ms: u64,
    watermark_ms: u64,
    /// Start of the oldest window containing the time, of the first still
    /// open, of the last.
    oldest_start_ms: u64,
    first_start_ms: u64,
    last_start_ms: u64,
}

impl Placed {
    /// Nothing placed yet: matches no event.
    const NONE: Placed =
        Placed { time_ms: u64::MAX, watermark_ms: 0, oldest_start_ms: 0, first_start_ms: 0, last_start_ms: 0 };
}

impl AggregateState {
    pub(crate) fn new(declaration: AggregateDeclaration, from_offset: u64, keys_max: u32) -> AggregateState {
        let window = declaration.window.size_and_step_ms();
        let windows_per_key = u16::try_from(declaration.windows_per_key_max()).expect("validated declarations");
        AggregateState {
            window,
            from_offset,
            min_open_end_ms: u64::MAX,
            allowed_lateness_ms: declaration.allowed_lateness_ms,
            max_time_ms: None,
            watermark_ms: None,
            placed: Placed::NONE,
            windows_per_key,
            kind: declaration.kind,
            arrival_time: declaration.time == TimeSource::Arrival,
            key_count: 0,
            counters: AggregateCounters::default(),
            keys_max,
            collected_at_watermark_ms: None,
            next_sequence: 0,
            sketches: SketchPool::default(),
            declaration,
        }
    }

    /// The first half of applying an event (the caller has checked its
    /// offset is new): reads its time and value and moves time forward,
    /// closing the windows the watermark passes (which may drop keys from
    /// the table, all but the row `keys` names as held). `None` when the
    /// aggregate skips the event (before its first offset, malformed, late).
    /// `value` is the event's value as read for an earlier aggregate with
    /// the same source ([`AggregateState::reads_value_as`]), if it was
    /// read; else this one reads it and leaves it there for later ones.
    #[inline]
    pub(crate) fn prepare<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        (event, value): (Event<'_>, &mut Option<Option<Input>>),
        scratch: &mut Vec<u8>,
        closing: &mut Closing,
        keys: Column<'_>,
        out: &mut F,
    ) -> Option<Prepared> {
        if event.offset < self.from_offset {
            return None;
        }
        let time_ms = match self.window {
            None => 0,
            Some(_) if self.arrival_time && event.arrival_ms <= TIME_MS_MAX => event.arrival_ms,
            Some(_) => match extract::event_time_ms(&self.declaration.time, event.payload, event.arrival_ms, scratch) {
                Some(time_ms) => time_ms,
                None => {
                    self.counters.time_malformed += 1;
                    return None;
                }
            },
        };
        let input = *value.get_or_insert_with(|| match self.kind {
            AggregateKind::Count => Some(Input::Unit),
            AggregateKind::DistinctEstimate => {
                extract::value_hash(&self.declaration.value, event.payload, event.value_at, scratch).map(Input::Hash)
            }
            _ => extract::number(&self.declaration.value, event.payload, event.value_at, scratch).map(Input::Number),
        });
        let Some(input) = input else {
            self.counters.value_malformed += 1;
            return None;
        };
        match self.window {
            None => Some(Prepared { input, first_start_ms: 0, last_start_ms: 0, step_ms: 1 }),
            Some(_) => {
                // `place` gives the windows alone: passing it the 16-byte input made the
                // caller store it in two halves and `place` load it whole, a store-forwarding
                // stall that waits for every older store (the log copy, the last event's
                // row) to reach the cache: 80 % of `place`'s samples (perf annotate).
                let (first_start_ms, last_start_ms, step_ms) =
                    self.place(time_ms, event.partition, closing, keys, out)?;
                Some(Prepared { input, first_start_ms, last_start_ms, step_ms })
            }
        }
    }

    /// The second half: adds the event to the key's windows in `row` of
    /// the table (refused, and counted, when the key is new and the
    /// aggregate is at its key limit even after dropping idle keys).
    /// Whether the event went to a window (so the key's state here is not
    /// empty).
    #[inline]
    pub(crate) fn apply(
        &mut self,
        prepared: Prepared,
        offset: u64,
        table: &mut KeyTable,
        row: u32,
        column: usize,
    ) -> bool {
        if !self.admit(table, row, column) {
            self.counters.keys_refused += 1;
            return false;
        }
        let kind = self.kind;
        let windows_per_key = usize::from(self.windows_per_key);
        let open = table.open_mut(row, column);
        // Every state that holds windows reserved all it may hold (as it
        // was admitted, or restored from a checkpoint), and `add` refuses a
        // window past that, so the capacity the table counts
        // (`KeyTable::memory_bytes`) does not change here.
        #[cfg(debug_assertions)]
        let capacity_before = open.capacity();
        let mut start_ms = prepared.first_start_ms;
        let mut refused = 0;
        while start_ms <= prepared.last_start_ms {
            let added = add(open, &mut self.sketches, kind, windows_per_key, start_ms, offset, prepared.input);
            refused += u64::from(!added);
            start_ms += prepared.step_ms;
        }
        #[cfg(debug_assertions)]
        debug_assert_eq!(open.capacity(), capacity_before, "an event's windows spilled past their reservation");
        if refused > 0 {
            self.counters.windows_refused += refused;
        }
        self.counters.events_applied += 1;
        if let Some((size_ms, _)) = self.window {
            self.min_open_end_ms = self.min_open_end_ms.min(prepared.first_start_ms + size_ms);
        }
        refused == 0
    }

    /// Whether this aggregate reads the same value from an event as
    /// `other` (same source, read the same way), so one read serves both.
    pub(crate) fn reads_value_as(&self, other: &AggregateState) -> bool {
        let class = |kind: AggregateKind| match kind {
            AggregateKind::Count => 0,
            AggregateKind::DistinctEstimate => 1,
            _ => 2,
        };
        class(self.declaration.kind) == class(other.declaration.kind)
            && self.declaration.value == other.declaration.value
    }

    /// `(size_ms, watermark_ms)` of a windowed aggregate with a watermark.
    fn expiry(&self) -> Option<(u64, u64)> {
        self.window.zip(self.watermark_ms).map(|((size_ms, _), watermark_ms)| (size_ms, watermark_ms))
    }

    /// Whether the key in `row` may count here: a key already tracked may
    /// (an idle one not yet collected starts over, exactly as if it had
    /// been collected and seen anew); a new key only under the limit.
    #[inline]
    fn admit(&mut self, table: &mut KeyTable, row: u32, column: usize) -> bool {
        let expiry = self.expiry();
        let state = table.state_mut(row, column);
        if !state.is_empty() {
            if let Some((size_ms, watermark_ms)) = expiry
                && is_idle(state.as_ref(), size_ms, watermark_ms)
            {
                release(&mut self.sketches, state.last_closed.take().map(|window| window.sketch));
                self.counters.keys_expired += 1;
            }
            return true;
        }
        if self.key_count >= self.keys_max {
            if let Some((size_ms, watermark_ms)) = expiry {
                self.collect_idle_keys(table, column, row, size_ms, watermark_ms);
            }
            if self.key_count >= self.keys_max {
                return false;
            }
        }
        self.key_count += 1;
        if self.windows_per_key > 1 {
            table.state_mut(row, column).reserve_open(usize::from(self.windows_per_key));
        }
        true
    }

    /// Drops every idle key of this aggregate (keeping row `keep` in the
    /// table: the caller holds it).
    fn collect_idle_keys(&mut self, table: &mut KeyTable, column: usize, keep: u32, size_ms: u64, watermark_ms: u64) {
        if self.collected_at_watermark_ms == Some(watermark_ms) {
            return;
        }
        self.collected_at_watermark_ms = Some(watermark_ms);
        let sketches = &mut self.sketches;
        let mut expired = 0;
        table.visit_column(column, Some(keep), |_, mut state| {
            if !state.is_empty() && is_idle(state.as_ref(), size_ms, watermark_ms) {
                release(sketches, state.last_closed.map(|window| window.sketch));
                state.clear();
                expired += 1;
            }
        });
        self.counters.keys_expired += expired;
        self.key_count -= expired as u32;
    }

    /// Moves time forward to `time_ms` (closing what the watermark passes)
    /// and gives the windows the event goes to (first and last start, and
    /// the step between them), or `None` when it is late.
    #[inline]
    fn place<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        time_ms: u64,
        partition: u32,
        closing: &mut Closing,
        keys: Column<'_>,
        out: &mut F,
    ) -> Option<(u64, u64, u64)> {
        // Nearly every event: the time of the event before it (a batch shares its arrival
        // time), so nothing moves: the maximum time stays, the watermark it gives is the one
        // already reached, and the windows are the ones placed last.
        let placed = self.placed;
        if self.max_time_ms == Some(time_ms)
            && placed.time_ms == time_ms
            && self.watermark_ms == Some(placed.watermark_ms)
            && time_ms.saturating_sub(self.allowed_lateness_ms) <= placed.watermark_ms
        {
            let (_, step_ms) = self.window.expect("windowed");
            return self.count_placed(placed, step_ms);
        }
        self.place_moving(time_ms, partition, closing, keys, out)
    }

    /// [`AggregateState::place`] when time or the watermark moves.
    #[inline(never)]
    fn place_moving<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        time_ms: u64,
        partition: u32,
        closing: &mut Closing,
        keys: Column<'_>,
        out: &mut F,
    ) -> Option<(u64, u64, u64)> {
        let (size_ms, step_ms) = self.window.expect("windowed");
        if self.max_time_ms.is_some_and(|max_time_ms| time_ms < max_time_ms) {
            self.counters.out_of_order_events += 1;
        }
        let max_time_ms = self.max_time_ms.map_or(time_ms, |max_time_ms| max_time_ms.max(time_ms));
        self.max_time_ms = Some(max_time_ms);
        let candidate_ms = max_time_ms.saturating_sub(self.allowed_lateness_ms);
        self.raise_watermark(candidate_ms, partition, closing, keys, out);
        let watermark_ms = self.watermark_ms.expect("raised");
        let placed = match self.placed {
            placed if placed.time_ms == time_ms && placed.watermark_ms == watermark_ms => placed,
            _ => {
                let placed = windows_of(time_ms, watermark_ms, size_ms, step_ms);
                self.placed = placed;
                placed
            }
        };
        self.count_placed(placed, step_ms)
    }

    /// The windows of a placed event, counting it when it is late for some
    /// or all of them.
    #[inline]
    fn count_placed(&mut self, placed: Placed, step_ms: u64) -> Option<(u64, u64, u64)> {
        let Placed { oldest_start_ms, first_start_ms, last_start_ms, .. } = placed;
        if first_start_ms > last_start_ms {
            self.counters.late_events_dropped += 1;
            return None;
        }
        if first_start_ms > oldest_start_ms {
            self.counters.late_partial_events += 1;
        }
        Some((first_start_ms, last_start_ms, step_ms))
    }

    /// Raises the watermark to `candidate_ms` if that is later, then closes
    /// every window it has passed.
    pub(crate) fn raise_watermark<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        candidate_ms: u64,
        partition: u32,
        closing: &mut Closing,
        keys: Column<'_>,
        out: &mut F,
    ) {
        if self.watermark_ms.is_none_or(|watermark_ms| candidate_ms > watermark_ms) {
            self.watermark_ms = Some(candidate_ms);
            if candidate_ms >= self.min_open_end_ms {
                self.sweep(partition, closing, keys, out);
            }
        }
    }

    /// The engine's clock: arrival-time windows close by it when no events
    /// arrive. Event-time aggregates ignore it.
    pub(crate) fn advance_time<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        now_ms: u64,
        partition: u32,
        closing: &mut Closing,
        keys: Column<'_>,
        out: &mut F,
    ) {
        if self.window.is_some() && self.declaration.time == TimeSource::Arrival {
            let candidate_ms = now_ms.saturating_sub(self.declaration.allowed_lateness_ms);
            self.raise_watermark(candidate_ms, partition, closing, keys, out);
        }
    }

    /// When [`AggregateState::advance_time`] would next close a window.
    pub(crate) fn next_close_ms(&self) -> Option<u64> {
        let by_clock = self.window.is_some() && self.declaration.time == TimeSource::Arrival;
        (by_clock && self.min_open_end_ms != u64::MAX)
            .then(|| self.min_open_end_ms.saturating_add(self.declaration.allowed_lateness_ms))
    }

    /// Closes every window the watermark has passed, emits them in (end,
    /// key) order, and drops keys left idle.
    fn sweep<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        partition: u32,
        closing: &mut Closing,
        (table, column, keep): Column<'_>,
        out: &mut F,
    ) {
        let (size_ms, _) = self.window.expect("only windowed aggregates sweep");
        let watermark_ms = self.watermark_ms.expect("a sweep follows a watermark");
        let kind = self.declaration.kind;
        closing.entries.clear();
        closing.keys.clear();
        let mut min_open_end_ms = u64::MAX;
        let mut expired = 0;
        let sketches = &mut self.sketches;
        table.visit_column(column, keep, |key, mut state| {
            if state.is_empty() {
                return;
            }
            let closed_count = state.open.iter().take_while(|window| window.start_ms + size_ms <= watermark_ms).count();
            for (index, window) in state.open.drain(..closed_count).enumerate() {
                closing.push(key, window, value(kind, &window, sketches));
                let replaced = if index + 1 == closed_count { state.last_closed.replace(window) } else { Some(window) };
                release(sketches, replaced.map(|window| window.sketch));
            }
            if let Some(first) = state.open.first() {
                min_open_end_ms = min_open_end_ms.min(first.start_ms + size_ms);
            } else if is_idle(state.as_ref(), size_ms, watermark_ms) {
                release(sketches, state.last_closed.map(|window| window.sketch));
                state.clear();
                expired += 1;
            }
        });
        self.min_open_end_ms = min_open_end_ms;
        self.counters.keys_expired += expired;
        self.key_count -= expired as u32;
        self.emit(partition, closing, size_ms, out);
    }

    /// Emits the windows a sweep closed, in (end, key) order.
    fn emit<F: FnMut(&ClosedWindow<'_>)>(&mut self, partition: u32, closing: &mut Closing, size_ms: u64, out: &mut F) {
        let kind = self.declaration.kind;
        let keys = &closing.keys;
        closing.entries.sort_unstable_by(|left, right| {
            (left.window.start_ms.cmp(&right.window.start_ms))
                .then_with(|| keys[left.key_start..left.key_end].cmp(&keys[right.key_start..right.key_end]))
        });
        let output = self.declaration.output.as_deref().unwrap_or("");
        for entry in &closing.entries {
            out(&ClosedWindow {
                aggregate: &self.declaration.name,
                output,
                kind,
                partition,
                key: &keys[entry.key_start..entry.key_end],
                window_start_ms: entry.window.start_ms,
                window_end_ms: entry.window.start_ms + size_ms,
                value: entry.value,
                count: entry.window.count,
                first_offset: entry.window.first_offset,
                last_offset: entry.window.last_offset,
                sequence: self.next_sequence,
            });
            self.next_sequence += 1;
        }
        self.counters.windows_closed += closing.entries.len() as u64;
    }

    /// One key's windows, for `GET /aggregates/NAME?key=K`.
    pub(crate) fn view(&self, state: StateRef<'_>, partition: u32) -> Option<KeyView> {
        let open: Vec<WindowView> = state.open.iter().map(|window| self.window_view(window)).collect();
        let last_closed = self.visible_last_closed(state).map(|window| self.window_view(window));
        if open.is_empty() && last_closed.is_none() {
            return None;
        }
        let watermark_ms = self.window.and(self.watermark_ms);
        Some(KeyView { aggregate: self.declaration.name.clone(), partition, watermark_ms, open, last_closed })
    }

    fn visible_last_closed<'s>(&self, state: StateRef<'s>) -> Option<&'s WindowState> {
        let (size_ms, _) = self.window?;
        let watermark_ms = self.watermark_ms?;
        state.last_closed.as_ref().filter(|_| !is_idle(state, size_ms, watermark_ms))
    }

    fn window_view(&self, window: &WindowState) -> WindowView {
        let bounds = self.window.map(|(size_ms, _)| (window.start_ms, window.start_ms + size_ms));
        WindowView {
            window_start_ms: bounds.map(|(start_ms, _)| start_ms),
            window_end_ms: bounds.map(|(_, end_ms)| end_ms),
            value: value(self.declaration.kind, window, &self.sketches),
            count: window.count,
            first_offset: window.first_offset,
            last_offset: window.last_offset,
        }
    }

    /// The `n` largest keys: running aggregates by their value, windowed
    /// ones by their last closed window.
    pub(crate) fn top(&self, (table, column): (&KeyTable, usize), n: usize) -> Vec<TopEntry> {
        let mut ranked: Vec<(f64, &[u8], &WindowState)> = Vec::with_capacity(self.key_count as usize);
        for (key, state) in table.iter_column(column) {
            let window = match self.window {
                None => state.open.first(),
                Some(_) => self.visible_last_closed(state),
            };
            if let Some(window) = window {
                ranked.push((value(self.declaration.kind, window, &self.sketches), key, window));
            }
        }
        let order = |left: &(f64, &[u8], &WindowState), right: &(f64, &[u8], &WindowState)| {
            right.0.total_cmp(&left.0).then_with(|| left.1.cmp(right.1))
        };
        if n < ranked.len() && n > 0 {
            ranked.select_nth_unstable_by(n - 1, order);
        }
        ranked.truncate(n);
        ranked.sort_by(order);
        let mut entries: Vec<TopEntry> = ranked
            .into_iter()
            .map(|(value, key, window)| {
                let view = self.window_view(window);
                TopEntry {
                    key: key.to_vec(),
                    value,
                    count: window.count,
                    window_start_ms: view.window_start_ms,
                    window_end_ms: view.window_end_ms,
                }
            })
            .collect();
        entries.sort_by(top_order);
        entries
    }

    pub(crate) fn open_windows(&self, (table, column): (&KeyTable, usize)) -> u64 {
        table.iter_column(column).map(|(_, state)| state.open.len() as u64).sum()
    }

    /// Estimated heap bytes: an even share of the partition's key table,
    /// this aggregate's spilled windows, its sketches.
    pub(crate) fn memory_bytes(&self, (table, column): (&KeyTable, usize)) -> u64 {
        let share = table.shared_bytes() / table.columns().max(1);
        let spilled: usize = table.iter_column(column).map(|(_, state)| spilled_bytes(state.open)).sum();
        (share + spilled + self.sketches.capacity_bytes()) as u64
    }
}

/// The windows an event at `time_ms` belongs to, given the watermark.
fn windows_of(time_ms: u64, watermark_ms: u64, size_ms: u64, step_ms: u64) -> Placed {
    let last_start_ms = time_ms - time_ms % step_ms;
    let oldest_start_ms = (last_start_ms + step_ms).saturating_sub(size_ms);
    // The first start whose window ends after the watermark.
    let first_open_ms = match watermark_ms.checked_sub(size_ms) {
        None => 0,
        Some(before) => before - before % step_ms + step_ms,
    };
    let first_start_ms = oldest_start_ms.max(first_open_ms);
    Placed { time_ms, watermark_ms, oldest_start_ms, first_start_ms, last_start_ms }
}

/// An event as the processor hands it to each aggregate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event<'a> {
    pub(crate) offset: u64,
    pub(crate) partition: u32,
    pub(crate) key: &'a [u8],
    pub(crate) payload: &'a [u8],
    pub(crate) arrival_ms: u64,
    /// Where the JSON value starts, if the listener said (0: not known).
    pub(crate) value_at: u16,
}

/// A key with no open window whose last closed window ended at least one
/// window size before the watermark.
fn is_idle(state: StateRef<'_>, size_ms: u64, watermark_ms: u64) -> bool {
    state.open.is_empty() && state.last_closed.is_none_or(|window| window.start_ms + 2 * size_ms <= watermark_ms)
}

fn release(sketches: &mut SketchPool, sketch: Option<u32>) {
    if let Some(sketch) = sketch.filter(|&sketch| sketch != NO_SKETCH) {
        sketches.release(sketch);
    }
}

/// The value a window reports.
pub(crate) fn value(kind: AggregateKind, window: &WindowState, sketches: &SketchPool) -> f64 {
    match kind {
        AggregateKind::Count => window.count as f64,
        AggregateKind::Sum | AggregateKind::Min | AggregateKind::Max | AggregateKind::Last => window.acc,
        AggregateKind::Avg => window.acc / window.count.max(1) as f64,
        AggregateKind::DistinctEstimate => hll::estimate(sketches.get(window.sketch)).round(),
    }
}

/// Adds an event to the key's window starting at `start_ms`, opening it if
/// needed. `false` when the key has no room for another open window.
#[inline]
fn add(
    open: &mut OpenWindows,
    sketches: &mut SketchPool,
    kind: AggregateKind,
    windows_per_key: usize,
    start_ms: u64,
    offset: u64,
    input: Input,
) -> bool {
    // Windows are sorted by start; the event's is nearly always the last.
    let position = open.iter().rposition(|window| window.start_ms <= start_ms);
    let index = match position {
        Some(index) if open[index].start_ms == start_ms => index,
        _ if open.len() >= windows_per_key => return false,
        other => {
            let index = other.map_or(0, |index| index + 1);
            open.insert(index, WindowState::open(start_ms, kind, sketches));
            index
        }
    };
    open[index].add(kind, offset, input, sketches);
    true
}

impl WindowState {
    fn open(start_ms: u64, kind: AggregateKind, sketches: &mut SketchPool) -> WindowState {
        let acc = match kind {
            AggregateKind::Min => f64::INFINITY,
            AggregateKind::Max => f64::NEG_INFINITY,
            _ => 0.0,
        };
        let sketch = if kind == AggregateKind::DistinctEstimate { sketches.allocate() } else { NO_SKETCH };
        WindowState { start_ms, count: 0, first_offset: 0, last_offset: 0, acc, sketch }
    }

    #[inline]
    fn add(&mut self, kind: AggregateKind, offset: u64, input: Input, sketches: &mut SketchPool) {
        if self.count == 0 {
            self.first_offset = offset;
        }
        self.count += 1;
        self.last_offset = offset;
        match (kind, input) {
            (AggregateKind::Sum | AggregateKind::Avg, Input::Number(value)) => self.acc += value,
            (AggregateKind::Min, Input::Number(value)) => self.acc = self.acc.min(value),
            (AggregateKind::Max, Input::Number(value)) => self.acc = self.acc.max(value),
            (AggregateKind::Last, Input::Number(value)) => self.acc = value,
            (AggregateKind::DistinctEstimate, Input::Hash(hash)) => hll::insert(sketches.get_mut(self.sketch), hash),
            (AggregateKind::Count, Input::Unit) => {}
            (kind, input) => unreachable!("{kind:?} given {input:?}"),
        }
    }
}
