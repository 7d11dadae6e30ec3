//! One aggregate's state on one partition: its keys, each key's open
//! windows and last closed window, the watermark, and the sweep that closes
//! windows once the watermark passes their end.
//!
//! # Layout
//!
//! Keys live in a hashbrown table keyed by owned bytes and looked up by
//! borrowed bytes with `entry_ref`: one hash and probe per event, and an
//! allocation only for a key seen for the first time (its bytes, and its
//! window vector, reserved at once to the declaration's most open windows
//! so that it never grows). A window is one [`WindowState`] (48 bytes): for
//! every kind but `count` and `distinct-estimate` one `f64` is enough (sum,
//! min, max or last; avg keeps the sum), and `distinct-estimate` points into
//! a pool of sketches ([`SketchPool`]) that closed windows give back.
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

use hashbrown::HashMap;
use hashbrown::hash_map::EntryRef;
use serde::Serialize;

use crate::aggregate::declaration::{AggregateDeclaration, AggregateKind, TimeSource};
use crate::aggregate::extract::{self, Input};
use crate::aggregate::hll::{self, SketchPool};
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

/// One key: its open windows (oldest first) and the last one closed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyState {
    pub(crate) open: Vec<WindowState>,
    pub(crate) last_closed: Option<WindowState>,
}

/// A key's slot in the table (for the memory formula).
pub(crate) type KeySlot = (KeyBytes, KeyState);
pub(crate) type KeyMap = HashMap<KeyBytes, KeyState, ahash::RandomState>;

/// Keys up to this many bytes are stored in the table's slot itself.
pub(crate) const KEY_INLINE_BYTES: usize = 22;

/// A key's bytes in the table: inline when short (the lookup then costs no
/// second cache miss for the key's own allocation, the largest share of an
/// aggregate's per-event cost with many keys), else boxed. Hashes and
/// compares as the byte slice, so the table is looked up by `&[u8]`.
#[derive(Clone)]
pub(crate) enum KeyBytes {
    Inline { size: u8, bytes: [u8; KEY_INLINE_BYTES] },
    Boxed(Box<[u8]>),
}

impl KeyBytes {
    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            KeyBytes::Inline { size, bytes } => &bytes[..usize::from(*size)],
            KeyBytes::Boxed(bytes) => bytes,
        }
    }
}

impl From<&[u8]> for KeyBytes {
    #[inline]
    fn from(key: &[u8]) -> KeyBytes {
        if key.len() <= KEY_INLINE_BYTES {
            let mut bytes = [0; KEY_INLINE_BYTES];
            bytes[..key.len()].copy_from_slice(key);
            KeyBytes::Inline { size: key.len() as u8, bytes }
        } else {
            KeyBytes::Boxed(key.into())
        }
    }
}

impl std::borrow::Borrow<[u8]> for KeyBytes {
    #[inline]
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::hash::Hash for KeyBytes {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialEq for KeyBytes {
    #[inline]
    fn eq(&self, other: &KeyBytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for KeyBytes {}

impl std::fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_slice()))
    }
}

/// What one aggregate counted on one partition. Every counter is a pure
/// function of the input, so replay after a crash counts the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
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

/// Where the event goes, once the key is known.
struct Windows {
    /// First and last window start to update (inclusive), step apart.
    first_start_ms: u64,
    last_start_ms: u64,
    step_ms: u64,
}

/// One aggregate on one partition.
#[derive(Debug)]
pub(crate) struct AggregateState {
    pub(crate) declaration: AggregateDeclaration,
    /// `(size_ms, step_ms)`, `None` when running.
    pub(crate) window: Option<(u64, u64)>,
    pub(crate) windows_per_key: usize,
    /// Events below this offset are not counted (declared after them).
    pub(crate) from_offset: u64,
    pub(crate) table: Table,
    pub(crate) max_time_ms: Option<u64>,
    pub(crate) watermark_ms: Option<u64>,
    /// Earliest end of an open window (`u64::MAX` when none is open).
    pub(crate) min_open_end_ms: u64,
    pub(crate) next_sequence: u64,
    pub(crate) counters: AggregateCounters,
}

/// The keys of one aggregate and the sketches their windows use.
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) keys: KeyMap,
    pub(crate) keys_max: u32,
    pub(crate) sketches: SketchPool,
    /// The watermark at which idle keys were last collected for a key at
    /// the limit: no key can become idle until the watermark moves, so the
    /// limit does not rescan the table per refused event. Not checkpointed:
    /// a collection more or less gives the same table.
    collected_at_watermark_ms: Option<u64>,
}

impl Table {
    pub(crate) fn new(keys_max: u32) -> Table {
        Table { keys: KeyMap::default(), keys_max, sketches: SketchPool::default(), collected_at_watermark_ms: None }
    }

    /// The key's state (inserted if new) and the sketches; `None` when the
    /// key is new and the table is full even after dropping idle keys.
    /// `expiry` is `(size_ms, watermark_ms)` of a windowed aggregate.
    #[inline]
    fn entry(
        &mut self,
        key: &[u8],
        windows_per_key: usize,
        expiry: Option<(u64, u64)>,
        counters: &mut AggregateCounters,
    ) -> Option<(&mut KeyState, &mut SketchPool)> {
        if self.keys.len() >= self.keys_max as usize && !self.keys.contains_key(key) {
            if let Some((size_ms, watermark_ms)) = expiry {
                self.collect_idle_keys(size_ms, watermark_ms, counters);
            }
            if self.keys.len() >= self.keys_max as usize {
                return None;
            }
        }
        let state = match self.keys.entry_ref(key) {
            EntryRef::Occupied(entry) => {
                let state = entry.into_mut();
                if let Some((size_ms, watermark_ms)) = expiry {
                    // An idle key not yet collected starts over, exactly as
                    // if it had been collected and seen anew.
                    if is_idle(state, size_ms, watermark_ms) && state.last_closed.is_some() {
                        release(&mut self.sketches, state.last_closed.take().map(|window| window.sketch));
                        counters.keys_expired += 1;
                    }
                }
                state
            }
            EntryRef::Vacant(entry) => {
                entry.insert(KeyState { open: Vec::with_capacity(windows_per_key), last_closed: None })
            }
        };
        Some((state, &mut self.sketches))
    }

    /// Drops every idle key.
    fn collect_idle_keys(&mut self, size_ms: u64, watermark_ms: u64, counters: &mut AggregateCounters) {
        if self.collected_at_watermark_ms == Some(watermark_ms) {
            return;
        }
        self.collected_at_watermark_ms = Some(watermark_ms);
        let sketches = &mut self.sketches;
        let mut expired = 0;
        self.keys.retain(|_, state| {
            let idle = is_idle(state, size_ms, watermark_ms);
            if idle {
                release(sketches, state.last_closed.map(|window| window.sketch));
                expired += 1;
            }
            !idle
        });
        counters.keys_expired += expired;
    }
}

impl AggregateState {
    pub(crate) fn new(declaration: AggregateDeclaration, from_offset: u64, keys_max: u32) -> AggregateState {
        let window = declaration.window.size_and_step_ms();
        let windows_per_key = declaration.windows_per_key_max() as usize;
        AggregateState {
            declaration,
            window,
            windows_per_key,
            from_offset,
            table: Table::new(keys_max),
            max_time_ms: None,
            watermark_ms: None,
            min_open_end_ms: u64::MAX,
            next_sequence: 0,
            counters: AggregateCounters::default(),
        }
    }

    /// Applies one event (the caller has checked its offset is new).
    #[inline]
    pub(crate) fn on_event<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        event: Event<'_>,
        scratch: &mut Vec<u8>,
        closing: &mut Closing,
        out: &mut F,
    ) {
        if event.offset < self.from_offset {
            return;
        }
        let time_ms = match self.window {
            None => 0,
            Some(_) => match extract::event_time_ms(&self.declaration.time, event.payload, event.arrival_ms, scratch) {
                Some(time_ms) => time_ms,
                None => return self.counters.time_malformed += 1,
            },
        };
        let input = match self.declaration.kind {
            AggregateKind::Count => Some(Input::Unit),
            AggregateKind::DistinctEstimate => {
                extract::value_hash(&self.declaration.value, event.payload, scratch).map(Input::Hash)
            }
            _ => extract::number(&self.declaration.value, event.payload, scratch).map(Input::Number),
        };
        let Some(input) = input else { return self.counters.value_malformed += 1 };
        let windows = match self.window {
            None => Windows { first_start_ms: 0, last_start_ms: 0, step_ms: 1 },
            Some(_) => match self.place(time_ms, event.partition, closing, out) {
                Some(windows) => windows,
                None => return,
            },
        };
        let kind = self.declaration.kind;
        let expiry = self.window.zip(self.watermark_ms).map(|((size_ms, _), watermark_ms)| (size_ms, watermark_ms));
        let entry = self.table.entry(event.key, self.windows_per_key, expiry, &mut self.counters);
        let Some((state, sketches)) = entry else { return self.counters.keys_refused += 1 };
        let mut start_ms = windows.first_start_ms;
        let mut refused = 0;
        while start_ms <= windows.last_start_ms {
            refused += u64::from(!add(state, sketches, kind, start_ms, event.offset, input));
            start_ms += windows.step_ms;
        }
        self.counters.windows_refused += refused;
        self.counters.events_applied += 1;
        if let Some((size_ms, _)) = self.window {
            self.min_open_end_ms = self.min_open_end_ms.min(windows.first_start_ms + size_ms);
        }
    }

    /// Moves time forward to `time_ms` (closing what the watermark passes)
    /// and gives the windows the event goes to, or `None` when it is late.
    fn place<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        time_ms: u64,
        partition: u32,
        closing: &mut Closing,
        out: &mut F,
    ) -> Option<Windows> {
        let (size_ms, step_ms) = self.window.expect("windowed");
        if self.max_time_ms.is_some_and(|max_time_ms| time_ms < max_time_ms) {
            self.counters.out_of_order_events += 1;
        }
        let max_time_ms = self.max_time_ms.map_or(time_ms, |max_time_ms| max_time_ms.max(time_ms));
        self.max_time_ms = Some(max_time_ms);
        self.raise_watermark(max_time_ms.saturating_sub(self.declaration.allowed_lateness_ms), partition, closing, out);
        let watermark_ms = self.watermark_ms.expect("raised");
        let last_start_ms = time_ms - time_ms % step_ms;
        let oldest_start_ms = (last_start_ms + step_ms).saturating_sub(size_ms);
        // The first start whose window ends after the watermark.
        let first_open_ms = match watermark_ms.checked_sub(size_ms) {
            None => 0,
            Some(before) => before - before % step_ms + step_ms,
        };
        let first_start_ms = oldest_start_ms.max(first_open_ms);
        if first_start_ms > last_start_ms {
            self.counters.late_events_dropped += 1;
            return None;
        }
        if first_start_ms > oldest_start_ms {
            self.counters.late_partial_events += 1;
        }
        Some(Windows { first_start_ms, last_start_ms, step_ms })
    }

    /// Raises the watermark to `candidate_ms` if that is later, then closes
    /// every window it has passed.
    pub(crate) fn raise_watermark<F: FnMut(&ClosedWindow<'_>)>(
        &mut self,
        candidate_ms: u64,
        partition: u32,
        closing: &mut Closing,
        out: &mut F,
    ) {
        if self.watermark_ms.is_none_or(|watermark_ms| candidate_ms > watermark_ms) {
            self.watermark_ms = Some(candidate_ms);
            if candidate_ms >= self.min_open_end_ms {
                self.sweep(partition, closing, out);
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
        out: &mut F,
    ) {
        if self.window.is_some() && self.declaration.time == TimeSource::Arrival {
            let candidate_ms = now_ms.saturating_sub(self.declaration.allowed_lateness_ms);
            self.raise_watermark(candidate_ms, partition, closing, out);
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
    fn sweep<F: FnMut(&ClosedWindow<'_>)>(&mut self, partition: u32, closing: &mut Closing, out: &mut F) {
        let (size_ms, _) = self.window.expect("only windowed aggregates sweep");
        let watermark_ms = self.watermark_ms.expect("a sweep follows a watermark");
        let kind = self.declaration.kind;
        closing.entries.clear();
        closing.keys.clear();
        let mut min_open_end_ms = u64::MAX;
        let mut expired = 0;
        let Table { keys, sketches, .. } = &mut self.table;
        keys.retain(|key, state| {
            let closed_count = state.open.iter().take_while(|window| window.start_ms + size_ms <= watermark_ms).count();
            for (index, window) in state.open.drain(..closed_count).enumerate() {
                closing.push(key.as_slice(), window, value(kind, &window, sketches));
                let replaced = if index + 1 == closed_count { state.last_closed.replace(window) } else { Some(window) };
                release(sketches, replaced.map(|window| window.sketch));
            }
            if let Some(first) = state.open.first() {
                min_open_end_ms = min_open_end_ms.min(first.start_ms + size_ms);
                return true;
            }
            let idle = is_idle(state, size_ms, watermark_ms);
            if idle {
                release(sketches, state.last_closed.map(|window| window.sketch));
                expired += 1;
            }
            !idle
        });
        self.min_open_end_ms = min_open_end_ms;
        self.counters.keys_expired += expired;
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
    pub(crate) fn view(&self, key: &[u8], partition: u32) -> Option<KeyView> {
        let state = self.table.keys.get(key)?;
        let open: Vec<WindowView> = state.open.iter().map(|window| self.window_view(window)).collect();
        let last_closed = self.visible_last_closed(state).map(|window| self.window_view(window));
        if open.is_empty() && last_closed.is_none() {
            return None;
        }
        let watermark_ms = self.window.and(self.watermark_ms);
        Some(KeyView { aggregate: self.declaration.name.clone(), partition, watermark_ms, open, last_closed })
    }

    fn visible_last_closed<'s>(&self, state: &'s KeyState) -> Option<&'s WindowState> {
        let (size_ms, _) = self.window?;
        let watermark_ms = self.watermark_ms?;
        state.last_closed.as_ref().filter(|_| !is_idle(state, size_ms, watermark_ms))
    }

    fn window_view(&self, window: &WindowState) -> WindowView {
        let bounds = self.window.map(|(size_ms, _)| (window.start_ms, window.start_ms + size_ms));
        WindowView {
            window_start_ms: bounds.map(|(start_ms, _)| start_ms),
            window_end_ms: bounds.map(|(_, end_ms)| end_ms),
            value: value(self.declaration.kind, window, &self.table.sketches),
            count: window.count,
            first_offset: window.first_offset,
            last_offset: window.last_offset,
        }
    }

    /// The `n` largest keys: running aggregates by their value, windowed
    /// ones by their last closed window.
    pub(crate) fn top(&self, n: usize) -> Vec<TopEntry> {
        let mut ranked: Vec<(f64, &[u8], &WindowState)> = Vec::with_capacity(self.table.keys.len());
        for (key, state) in &self.table.keys {
            let key = key.as_slice();
            let window = match self.window {
                None => state.open.first(),
                Some(_) => self.visible_last_closed(state),
            };
            if let Some(window) = window {
                ranked.push((value(self.declaration.kind, window, &self.table.sketches), key, window));
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

    pub(crate) fn open_windows(&self) -> u64 {
        self.table.keys.values().map(|state| state.open.len() as u64).sum()
    }

    /// Estimated heap bytes: table, key bytes, windows, sketches.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let table = self.table.keys.capacity() * (std::mem::size_of::<KeySlot>() + 1);
        let per_key: usize = self
            .table
            .keys
            .iter()
            .map(|(key, state)| {
                let key_bytes = if key.as_slice().len() > KEY_INLINE_BYTES { key.as_slice().len() } else { 0 };
                key_bytes + state.open.capacity() * std::mem::size_of::<WindowState>() + 32
            })
            .sum();
        (table + per_key + self.table.sketches.capacity_bytes()) as u64
    }
}

/// An event as the processor hands it to each aggregate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event<'a> {
    pub(crate) offset: u64,
    pub(crate) partition: u32,
    pub(crate) key: &'a [u8],
    pub(crate) payload: &'a [u8],
    pub(crate) arrival_ms: u64,
}

/// A key with no open window whose last closed window ended at least one
/// window size before the watermark.
fn is_idle(state: &KeyState, size_ms: u64, watermark_ms: u64) -> bool {
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
    state: &mut KeyState,
    sketches: &mut SketchPool,
    kind: AggregateKind,
    start_ms: u64,
    offset: u64,
    input: Input,
) -> bool {
    // Windows are sorted by start; the event's is nearly always the last.
    let position = state.open.iter().rposition(|window| window.start_ms <= start_ms);
    let index = match position {
        Some(index) if state.open[index].start_ms == start_ms => index,
        _ if state.open.len() == state.open.capacity() => return false,
        other => {
            let index = other.map_or(0, |index| index + 1);
            state.open.insert(index, WindowState::open(start_ms, kind, sketches));
            index
        }
    };
    state.open[index].add(kind, offset, input, sketches);
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
