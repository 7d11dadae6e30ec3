//! One key table per partition, shared by every aggregate of the partition.
//!
//! An event goes to every aggregate of its stream with the same key, so the
//! partition looks the key up once: [`KeyTable::row_for`] hashes and probes
//! the index (a hashbrown map from the key's bytes to a row number, short
//! keys stored in the slot itself) and gives the key's *row*: one
//! [`KeyState`] per aggregate (a *column*), side by side in one vector. So
//! an event costs one probe and one row (a few adjacent cache lines)
//! however many aggregates the partition runs; with a table per aggregate
//! it cost a probe, a key and a window vector per aggregate, each a cache
//! miss once the keys outgrow the cache (README, "Keyed aggregates").
//!
//! A key is in the table while any aggregate holds state for it. An
//! aggregate's state for a key is *empty* ([`KeyState::is_empty`]: no open
//! window, no last closed one) when the aggregate does not track the key;
//! each aggregate counts its own non-empty states, so its key limit, its
//! idle-key expiry and its checkpoint are exactly what they were with a
//! table of its own. A row whose states are all empty leaves the index and
//! goes to a free list for the next new key.

use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::aggregate::state::WindowState;

/// Keys up to this many bytes are stored in the index's slot itself.
pub(crate) const KEY_INLINE_BYTES: usize = 22;

/// A key's bytes in the table: inline when short (the lookup then costs no
/// second cache miss for the key's own allocation), else boxed. Hashes and
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

/// A key looked up in the index: hashes as the byte slice (as
/// [`KeyBytes`] does) and compares with a stored key without a call to
/// `memcmp` (a variable-length slice compare is one; it was 14 ns of an
/// event's 120 ns of aggregate work, `perf report`).
struct Probe<'k>(&'k [u8]);

impl std::hash::Hash for Probe<'_> {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl hashbrown::Equivalent<KeyBytes> for Probe<'_> {
    #[inline]
    fn equivalent(&self, stored: &KeyBytes) -> bool {
        match stored {
            KeyBytes::Inline { size, bytes } => usize::from(*size) == self.0.len() && short_eq(self.0, bytes),
            KeyBytes::Boxed(bytes) => **bytes == *self.0,
        }
    }
}

impl From<&Probe<'_>> for KeyBytes {
    #[inline]
    fn from(probe: &Probe<'_>) -> KeyBytes {
        KeyBytes::from(probe.0)
    }
}

/// `key == stored[..key.len()]` for a key of at most [`KEY_INLINE_BYTES`]
/// bytes, with two or three overlapping word compares (every byte is in
/// one of them).
#[inline]
fn short_eq(key: &[u8], stored: &[u8; KEY_INLINE_BYTES]) -> bool {
    let len = key.len();
    debug_assert!(len <= KEY_INLINE_BYTES);
    let word = |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let half = |bytes: &[u8], at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    match len {
        17.. => {
            word(key, 0) == word(stored, 0)
                && word(key, 8) == word(stored, 8)
                && word(key, len - 8) == word(stored, len - 8)
        }
        8..=16 => word(key, 0) == word(stored, 0) && word(key, len - 8) == word(stored, len - 8),
        4..=7 => half(key, 0) == half(stored, 0) && half(key, len - 4) == half(stored, len - 4),
        _ => key == &stored[..len],
    }
}

/// Open windows of one key in one aggregate, oldest first. The first is
/// stored in the table itself (a running aggregate and a tumbling window
/// without lateness never have more), so updating it touches no other
/// memory; a key of an aggregate that may hold more reserves them all on
/// its first event, so the vector never grows after.
pub(crate) type OpenWindows = SmallVec<[WindowState; 1]>;

/// One key in one aggregate, owned: its open windows and the last one
/// closed (what a checkpoint decodes; the table keeps the two apart, see
/// [`KeyTable`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct KeyState {
    pub(crate) open: OpenWindows,
    pub(crate) last_closed: Option<WindowState>,
}

/// One key's state in one aggregate, as the table holds it: its open
/// windows (in the hot half of the row) and its last closed window (in the
/// cold half).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StateRef<'t> {
    pub(crate) open: &'t OpenWindows,
    pub(crate) last_closed: &'t Option<WindowState>,
}

/// [`StateRef`], to change. Its open windows' capacity changes only
/// through [`StateMut::clear`] and [`StateMut::reserve_open`], which keep
/// the table's count of spilled bytes.
#[derive(Debug)]
pub(crate) struct StateMut<'t> {
    pub(crate) open: &'t mut OpenWindows,
    pub(crate) last_closed: &'t mut Option<WindowState>,
    /// The table's [`KeyTable::spilled_bytes`].
    spilled: &'t mut usize,
}

impl StateRef<'_> {
    /// The aggregate does not track this key.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.open.is_empty() && self.last_closed.is_none()
    }
}

impl StateMut<'_> {
    /// The aggregate does not track this key (reads the cold half only when
    /// no window is open).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.open.is_empty() && self.last_closed.is_none()
    }

    #[inline]
    pub(crate) fn as_ref(&self) -> StateRef<'_> {
        StateRef { open: self.open, last_closed: self.last_closed }
    }

    /// Empties the state (the aggregate no longer tracks the key), freeing
    /// its spilled windows.
    pub(crate) fn clear(&mut self) {
        *self.spilled -= spilled_bytes(self.open);
        *self.open = OpenWindows::new();
        *self.last_closed = None;
    }

    /// Makes room for `windows` open windows in all.
    pub(crate) fn reserve_open(&mut self, windows: usize) {
        let before = spilled_bytes(self.open);
        self.open.reserve_exact(windows.saturating_sub(self.open.len()));
        *self.spilled = *self.spilled - before + spilled_bytes(self.open);
    }
}

/// One slot of the index (for the memory formula).
pub(crate) type IndexSlot = (KeyBytes, u32);

/// The keys of every aggregate of one partition; see the module docs.
///
/// A row is split in two halves, in two vectors: the open windows of every
/// column (read and written by every event of the key), and the last
/// closed windows (written when a sweep closes windows, read by queries,
/// checkpoints and the idle-key rule once no window is open). An event
/// touches the hot half alone, half the bytes of a whole row: with 10 000
/// keys of two aggregates the rows an event may touch are 1.1 MB instead
/// of 2.2 MB, which keeps them in a core's L2 (`cargo bench --bench
/// process`, README "Keyed aggregates").
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    index: HashMap<KeyBytes, u32, ahash::RandomState>,
    /// Row `r`'s open windows: `open[r * columns .. (r + 1) * columns]`.
    open: Vec<OpenWindows>,
    /// Row `r`'s last closed windows, indexed as `open`.
    closed: Vec<Option<WindowState>>,
    columns: usize,
    /// Rows no key uses (all their states empty), reused first.
    free: Vec<u32>,
    /// Heap bytes of the keys too long to be stored inline, kept as keys
    /// come and go so that `/stats` reads the table's memory without
    /// walking it (the walk took about 100 µs of a shard per request with
    /// 10 000 keys, and grows with them).
    boxed_key_bytes: usize,
    /// Heap bytes of every state's spilled windows ([`spilled_bytes`]),
    /// kept the same way.
    spilled_bytes: usize,
}

impl KeyTable {
    /// Keys in the table (tracked by at least one aggregate).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn columns(&self) -> usize {
        self.columns
    }

    /// The key's row, if any aggregate tracks it.
    #[inline]
    pub(crate) fn row(&self, key: &[u8]) -> Option<u32> {
        self.index.get(&Probe(key)).copied()
    }

    /// The key's row, added (every state empty) if the key is new, and
    /// whether it was. One hash and probe; allocates only for a new key
    /// longer than [`KEY_INLINE_BYTES`] or when the rows outgrow their vector.
    #[inline]
    pub(crate) fn row_for(&mut self, key: &[u8]) -> (u32, bool) {
        let KeyTable { index, open, closed, columns, free, boxed_key_bytes: boxed, .. } = self;
        let mut added = false;
        let row = *index.entry_ref(&Probe(key)).or_insert_with(|| {
            added = true;
            *boxed += boxed_key_bytes(key);
            free.pop().unwrap_or_else(|| {
                let row = (open.len() / *columns) as u32;
                open.resize_with(open.len() + *columns, OpenWindows::new);
                closed.resize(closed.len() + *columns, None);
                row
            })
        });
        (row, added)
    }

    #[inline]
    fn at(&self, row: u32, column: usize) -> usize {
        debug_assert!(column < self.columns);
        row as usize * self.columns + column
    }

    #[inline]
    pub(crate) fn state(&self, row: u32, column: usize) -> StateRef<'_> {
        let at = self.at(row, column);
        StateRef { open: &self.open[at], last_closed: &self.closed[at] }
    }

    #[inline]
    pub(crate) fn state_mut(&mut self, row: u32, column: usize) -> StateMut<'_> {
        let at = self.at(row, column);
        StateMut { open: &mut self.open[at], last_closed: &mut self.closed[at], spilled: &mut self.spilled_bytes }
    }

    /// The open windows alone (what an event changes), to be changed
    /// within their capacity: the table counts it ([`StateMut`]).
    #[inline]
    pub(crate) fn open_mut(&mut self, row: u32, column: usize) -> &mut OpenWindows {
        let at = self.at(row, column);
        &mut self.open[at]
    }

    /// Replaces a state (a checkpoint's, as it is restored).
    pub(crate) fn set_state(&mut self, row: u32, column: usize, state: KeyState) {
        let at = self.at(row, column);
        self.spilled_bytes = self.spilled_bytes - spilled_bytes(&self.open[at]) + spilled_bytes(&state.open);
        self.open[at] = state.open;
        self.closed[at] = state.last_closed;
    }

    /// Drops the key if no aggregate tracks it any more (after an event
    /// every aggregate refused or skipped, or whose sweep emptied it).
    #[inline]
    pub(crate) fn remove_if_empty(&mut self, key: &[u8], row: u32) {
        if self.row_is_empty(row) && self.index.remove(&Probe(key)).is_some() {
            self.boxed_key_bytes -= boxed_key_bytes(key);
            self.free.push(row);
        }
    }

    /// Whether no column tracks row `row`: the cold half is read only when
    /// every window of the hot half is closed.
    #[inline]
    fn row_is_empty(&self, row: u32) -> bool {
        let range = self.at(row, 0)..self.at(row, 0) + self.columns;
        self.open[range.clone()].iter().all(OpenWindows::is_empty) && self.closed[range].iter().all(Option::is_none)
    }

    /// Calls `visit` with every key and its state in `column` (empty states
    /// included: `visit` may fill or clear them), then drops the keys no
    /// aggregate tracks any more, except the one in row `keep` (the key of
    /// the event being applied, which the caller still holds).
    pub(crate) fn visit_column(
        &mut self,
        column: usize,
        keep: Option<u32>,
        mut visit: impl FnMut(&[u8], StateMut<'_>),
    ) {
        let KeyTable { index, open, closed, columns, free, boxed_key_bytes: boxed, spilled_bytes: spilled } = self;
        let columns = *columns;
        index.retain(|key, row| {
            let range = *row as usize * columns..(*row as usize + 1) * columns;
            let (open, closed) = (&mut open[range.clone()], &mut closed[range]);
            let state = StateMut { open: &mut open[column], last_closed: &mut closed[column], spilled: &mut *spilled };
            visit(key.as_slice(), state);
            let drop =
                Some(*row) != keep && open.iter().all(OpenWindows::is_empty) && closed.iter().all(Option::is_none);
            if drop {
                *boxed -= boxed_key_bytes(key.as_slice());
                free.push(*row);
            }
            !drop
        });
    }

    /// Every key that `column` tracks, with its state, in table order.
    pub(crate) fn iter_column(&self, column: usize) -> impl Iterator<Item = (&[u8], StateRef<'_>)> {
        self.index
            .iter()
            .map(move |(key, &row)| (key.as_slice(), self.state(row, column)))
            .filter(|(_, state)| !state.is_empty())
    }

    /// Adds a column (a new aggregate) at the end, empty for every key.
    pub(crate) fn add_column(&mut self) {
        let columns = self.columns;
        restride(&mut self.open, columns, columns + 1, |states| states.push(OpenWindows::new()));
        restride(&mut self.closed, columns, columns + 1, |states| states.push(None));
        self.columns = columns + 1;
    }

    /// Removes `column` (a dropped aggregate) and the keys only it tracked.
    pub(crate) fn remove_column(&mut self, column: usize) {
        let columns = self.columns;
        self.spilled_bytes -= self.open.iter().skip(column).step_by(columns).map(spilled_bytes).sum::<usize>();
        restride(&mut self.open, columns, columns - 1, |states| {
            states.remove(column);
        });
        restride(&mut self.closed, columns, columns - 1, |states| {
            states.remove(column);
        });
        self.columns = columns - 1;
        if self.columns == 0 {
            *self = KeyTable::default();
            return;
        }
        self.visit_column(0, None, |_, _| {});
    }

    /// Estimated heap bytes shared by the columns: index, rows, boxed keys
    /// (each column's spilled windows are its own: [`spilled_bytes`]).
    pub(crate) fn shared_bytes(&self) -> usize {
        let index = self.index.capacity() * (std::mem::size_of::<IndexSlot>() + 1);
        let open = self.open.capacity() * std::mem::size_of::<OpenWindows>();
        let closed = self.closed.capacity() * std::mem::size_of::<Option<WindowState>>();
        index + open + closed + self.free.capacity() * 4 + self.boxed_key_bytes
    }

    /// Estimated heap bytes of the whole table: [`KeyTable::shared_bytes`]
    /// and every state's spilled windows (free rows' too: a state emptied
    /// by its windows closing keeps its capacity), from the counts kept as
    /// the table changes: no walk.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.shared_bytes() + self.spilled_bytes
    }

    /// [`KeyTable::memory_bytes`] counted by walking every key and row:
    /// what the kept counts must equal.
    #[cfg(test)]
    pub(crate) fn memory_bytes_walked(&self) -> usize {
        let boxed_keys: usize = self.index.keys().map(|key| boxed_key_bytes(key.as_slice())).sum();
        self.shared_bytes() - self.boxed_key_bytes + boxed_keys + self.open.iter().map(spilled_bytes).sum::<usize>()
    }
}

/// Rebuilds `rows` (`columns` wide) as `new_columns` wide, `change` turning
/// each row's states into the new ones.
fn restride<T>(rows: &mut Vec<T>, columns: usize, new_columns: usize, mut change: impl FnMut(&mut Vec<T>)) {
    let mut old = std::mem::take(rows).into_iter();
    let mut states = Vec::with_capacity(columns.max(new_columns));
    while old.len() > 0 {
        states.extend(old.by_ref().take(columns));
        change(&mut states);
        debug_assert_eq!(states.len(), new_columns);
        rows.append(&mut states);
    }
}

// The memory formula counts a key's state in one column as one `KeyState`:
// the two halves take exactly that.
const _: () = assert!(
    std::mem::size_of::<OpenWindows>() + std::mem::size_of::<Option<WindowState>>() == std::mem::size_of::<KeyState>()
);

/// Heap bytes a key's own allocation takes (none when stored inline).
pub(crate) fn boxed_key_bytes(key: &[u8]) -> usize {
    if key.len() > KEY_INLINE_BYTES { key.len() } else { 0 }
}

/// Heap bytes of a state's windows beyond the one stored inline.
pub(crate) fn spilled_bytes(open: &OpenWindows) -> usize {
    if open.spilled() { open.capacity() * std::mem::size_of::<WindowState>() } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start_ms: u64) -> WindowState {
        WindowState { start_ms, count: 1, first_offset: 0, last_offset: 0, acc: 0.0, sketch: u32::MAX }
    }

    /// Keys share one row across columns, leave when every column drops them, and their rows
    /// are reused; adding and removing columns keeps every other column's states.
    #[test]
    fn rows_are_shared_dropped_when_empty_and_reused() {
        let mut table = KeyTable::default();
        table.add_column();
        table.add_column();
        let (alice, added) = table.row_for(b"alice");
        assert!(added);
        assert_eq!(table.row_for(b"alice"), (alice, false));
        table.state_mut(alice, 0).open.push(window(0));
        table.state_mut(alice, 1).open.push(window(1000));
        let (bob, _) = table.row_for(b"bob");
        table.state_mut(bob, 1).open.push(window(2000));
        assert_eq!(table.iter_column(0).count(), 1, "only alice in column 0");
        table.visit_column(1, None, |_, state| state.open.clear());
        assert_eq!(table.len(), 1, "bob was only in column 1: gone; alice stays for column 0");
        assert_eq!(table.row(b"bob"), None);
        let (carol, added) = table.row_for(b"carol");
        assert!(added && carol == bob, "the free row is reused");
        table.remove_if_empty(b"carol", carol);
        assert_eq!(table.row(b"carol"), None);
        table.add_column();
        assert_eq!(table.columns(), 3);
        assert_eq!(table.state(alice, 0).open[0].start_ms, 0, "restride keeps states");
        table.remove_column(0);
        assert_eq!((table.columns(), table.len()), (2, 0), "alice was only in the removed column");
        table.remove_column(0);
        table.remove_column(0);
        assert_eq!(table.columns(), 0);
    }

    /// The table's memory, from the counts it keeps, is what the columns' estimates add up
    /// to (the shared bytes and each state's spilled windows, every column's) and what a walk
    /// counts, as states spill, are cleared and replaced, keys come and go and columns go.
    #[test]
    fn memory_counts_every_columns_spilled_windows_without_a_walk() {
        let mut table = KeyTable::default();
        table.add_column();
        table.add_column();
        let long = b"a key longer than the inline limit, boxed".as_slice();
        let (alice, _) = table.row_for(b"alice");
        let (bob, _) = table.row_for(long);
        table.state_mut(alice, 0).reserve_open(3);
        table.state_mut(alice, 0).open.extend((0..3).map(|start| window(start * 1000)));
        table.state_mut(bob, 1).reserve_open(5);
        table.state_mut(bob, 1).open.extend((0..5).map(|start| window(start * 1000)));
        table.state_mut(alice, 1).open.push(window(0));
        let by_column: usize = (0..2)
            .map(|column| table.iter_column(column).map(|(_, state)| spilled_bytes(state.open)).sum::<usize>())
            .sum();
        assert!(by_column >= 8 * std::mem::size_of::<WindowState>(), "both spilled states count");
        assert!(table.boxed_key_bytes >= long.len(), "the long key counts");
        assert_eq!(table.memory_bytes(), table.shared_bytes() + by_column);
        assert_eq!(table.memory_bytes(), table.memory_bytes_walked());
        table.set_state(
            alice,
            1,
            KeyState { open: (0..4).map(|start| window(start * 1000)).collect(), last_closed: None },
        );
        assert_eq!(table.memory_bytes(), table.memory_bytes_walked(), "a state replaced");
        table.visit_column(1, None, |_, mut state| state.clear());
        assert_eq!(table.row(long), None, "the long key was only in column 1");
        assert_eq!(table.boxed_key_bytes, 0);
        assert_eq!(table.memory_bytes(), table.memory_bytes_walked(), "states cleared, a key gone");
        table.state_mut(alice, 1).reserve_open(6);
        table.remove_column(1);
        assert_eq!(table.memory_bytes(), table.memory_bytes_walked(), "a spilled column removed");
        table.remove_column(0);
        assert_eq!((table.memory_bytes(), table.memory_bytes_walked()), (table.shared_bytes(), table.shared_bytes()));
    }

    /// The probe's word compares agree with a plain slice compare at every length up to the
    /// inline limit, for a difference at any byte.
    #[test]
    fn short_keys_compare_as_slices() {
        for len in 0..=KEY_INLINE_BYTES {
            let key: Vec<u8> = (0..len as u8).map(|byte| byte.wrapping_mul(37).wrapping_add(1)).collect();
            let KeyBytes::Inline { bytes, .. } = KeyBytes::from(key.as_slice()) else { panic!("inline") };
            assert!(short_eq(&key, &bytes), "len {len}");
            for at in 0..len {
                let mut other = key.clone();
                other[at] ^= 0x40;
                assert!(!short_eq(&other, &bytes), "len {len}, byte {at} differs");
                assert!(!hashbrown::Equivalent::equivalent(&Probe(&other), &KeyBytes::from(key.as_slice())));
            }
            assert!(hashbrown::Equivalent::equivalent(&Probe(&key), &KeyBytes::from(key.as_slice())));
        }
        let long = vec![7u8; KEY_INLINE_BYTES + 5];
        assert!(hashbrown::Equivalent::equivalent(&Probe(&long), &KeyBytes::from(long.as_slice())));
        assert!(!hashbrown::Equivalent::equivalent(&Probe(&long[1..]), &KeyBytes::from(long.as_slice())));
    }

    /// A key whose only state is a last closed window (the cold half) stays in the table, in
    /// its column and across restrides; clearing both halves lets it go; and a state set from a
    /// checkpoint lands in the right halves.
    #[test]
    fn the_cold_half_alone_keeps_a_key() {
        let mut table = KeyTable::default();
        table.add_column();
        table.add_column();
        let (dave, _) = table.row_for(b"dave");
        let (erin, _) = table.row_for(b"erin");
        *table.state_mut(dave, 1).last_closed = Some(window(5000));
        table.set_state(
            erin,
            0,
            KeyState { open: [window(7000)].into_iter().collect(), last_closed: Some(window(6000)) },
        );
        table.remove_if_empty(b"dave", dave);
        table.visit_column(0, None, |_, _| {});
        assert_eq!(table.row(b"dave"), Some(dave), "a last closed window alone keeps the key");
        table.add_column();
        assert_eq!(table.state(dave, 1).last_closed.map(|window| window.start_ms), Some(5000));
        assert!(table.state(dave, 1).open.is_empty() && table.state(dave, 2).is_empty());
        let erin_state = table.state(erin, 0);
        assert_eq!(
            (erin_state.open[0].start_ms, erin_state.last_closed.map(|window| window.start_ms)),
            (7000, Some(6000))
        );
        assert_eq!(table.iter_column(1).map(|(key, _)| key.to_vec()).collect::<Vec<_>>(), vec![b"dave".to_vec()]);
        table.visit_column(1, None, |_, mut state| state.clear());
        assert_eq!((table.row(b"dave"), table.len()), (None, 1), "cleared: dave goes, erin stays");
        table.remove_column(1);
        assert_eq!(table.state(erin, 0).last_closed.map(|window| window.start_ms), Some(6000));
    }
}
