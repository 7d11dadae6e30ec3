//! What a processor gives out: closed windows (and the JSON payload the
//! engine appends to the output stream), one key's view, top-N entries and
//! their merge across partitions and shards, and per-aggregate stats.

use std::cmp::Ordering;
use std::io::Write;

use serde::{Serialize, Serializer};

use crate::aggregate::TOP_N_MAX;
use crate::aggregate::declaration::AggregateKind;
use crate::aggregate::state::AggregateCounters;

/// A window that has just closed, borrowed from the processor for the
/// length of the callback. The engine appends it to `output` with key `key`
/// and payload [`ClosedWindow::write_json`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClosedWindow<'a> {
    pub aggregate: &'a str,
    /// The stream the window is appended to.
    pub output: &'a str,
    pub kind: AggregateKind,
    /// The input partition: with `sequence`, what identifies a window.
    pub partition: u32,
    pub key: &'a [u8],
    pub window_start_ms: u64,
    pub window_end_ms: u64,
    /// The aggregate's value: count, sum, min, max, avg, last, or the
    /// distinct estimate (rounded).
    pub value: f64,
    /// Events that counted in the window.
    pub count: u64,
    /// Offsets (in the input partition) of the first and last of them.
    pub first_offset: u64,
    pub last_offset: u64,
    /// Dense per (partition, aggregate), from 0: a replay after a crash emits
    /// the same window with the same sequence.
    pub sequence: u64,
}

impl ClosedWindow<'_> {
    /// Appends the output event's payload, one JSON object (no newline):
    ///
    /// ```json
    /// {"aggregate":"clicks","partition":7,"sequence":12,"window_start_ms":1000,"window_end_ms":2000,
    ///  "value":2,"count":2,"first_offset":0,"last_offset":1}
    /// ```
    ///
    /// Integral values are written without a fraction; a value too large
    /// for JSON (an overflowed sum) is `null`. Allocates nothing once `out`
    /// has room.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mut integers = itoa::Buffer::new();
        out.extend_from_slice(b"{\"aggregate\":\"");
        // Aggregate names are [a-z0-9._-]: nothing to escape.
        out.extend_from_slice(self.aggregate.as_bytes());
        out.extend_from_slice(b"\",\"partition\":");
        out.extend_from_slice(integers.format(self.partition).as_bytes());
        for (name, number) in [
            (&b",\"sequence\":"[..], self.sequence),
            (b",\"window_start_ms\":", self.window_start_ms),
            (b",\"window_end_ms\":", self.window_end_ms),
        ] {
            out.extend_from_slice(name);
            out.extend_from_slice(integers.format(number).as_bytes());
        }
        out.extend_from_slice(b",\"value\":");
        write_number(out, self.value);
        for (name, number) in [
            (&b",\"count\":"[..], self.count),
            (b",\"first_offset\":", self.first_offset),
            (b",\"last_offset\":", self.last_offset),
        ] {
            out.extend_from_slice(name);
            out.extend_from_slice(integers.format(number).as_bytes());
        }
        out.push(b'}');
    }
}

/// Closed windows waiting to be appended to their output streams, encoded
/// back to back in one reused buffer (no allocation per window once it has
/// grown): `u16 output size, output, u16 key size, key, u32 payload size,
/// payload` ([`ClosedWindow::write_json`]). A processor fills one as it
/// applies events; the shard moves its bytes to its emit queue after each
/// batch.
#[derive(Debug, Default)]
pub struct ClosedOutputs {
    bytes: Vec<u8>,
    count: u64,
}

impl ClosedOutputs {
    /// Encodes one closed window.
    pub fn push(&mut self, window: &ClosedWindow<'_>) {
        // Stream names are at most 64 bytes and keys at most u16::MAX
        // (the record format's limit), so both casts are exact.
        self.bytes.extend_from_slice(&(window.output.len() as u16).to_le_bytes());
        self.bytes.extend_from_slice(window.output.as_bytes());
        self.bytes.extend_from_slice(&(window.key.len() as u16).to_le_bytes());
        self.bytes.extend_from_slice(window.key);
        let size_at = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]);
        window.write_json(&mut self.bytes);
        let payload_size = (self.bytes.len() - size_at - 4) as u32;
        self.bytes[size_at..size_at + 4].copy_from_slice(&payload_size.to_le_bytes());
        self.count += 1;
    }

    /// Moves every window of `other` behind this one's.
    pub fn append(&mut self, other: &mut ClosedOutputs) {
        self.bytes.extend_from_slice(&other.bytes);
        self.count += other.count;
        other.clear();
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.count = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Windows held.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes reserved (the buffer's capacity).
    pub fn capacity_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    /// The first window at or after byte `position`: `(output, key,
    /// payload, next position)`, or `None` at the end.
    pub fn read_at(&self, position: usize) -> Option<(&str, &[u8], &[u8], usize)> {
        let bytes = &self.bytes;
        let take = |at: usize, size: usize| bytes.get(at..at + size);
        let output_size = usize::from(u16::from_le_bytes(take(position, 2)?.try_into().ok()?));
        let output = std::str::from_utf8(take(position + 2, output_size)?).ok()?;
        let key_at = position + 2 + output_size;
        let key_size = usize::from(u16::from_le_bytes(take(key_at, 2)?.try_into().ok()?));
        let key = take(key_at + 2, key_size)?;
        let payload_at = key_at + 2 + key_size;
        let payload_size = u32::from_le_bytes(take(payload_at, 4)?.try_into().ok()?) as usize;
        let payload = take(payload_at + 4, payload_size)?;
        Some((output, key, payload, payload_at + 4 + payload_size))
    }

    /// Drops the windows before byte `position` (already sent).
    pub fn consume(&mut self, position: usize, count: u64) {
        self.bytes.drain(..position);
        self.count -= count;
    }
}

/// A finite number as JSON: integral values below 2^53 as integers.
fn write_number(out: &mut Vec<u8>, value: f64) {
    const EXACT_INTEGER_MAX: f64 = 9_007_199_254_740_992.0;
    if !value.is_finite() {
        out.extend_from_slice(b"null");
    } else if value.fract() == 0.0 && value.abs() < EXACT_INTEGER_MAX {
        out.extend_from_slice(itoa::Buffer::new().format(value as i64).as_bytes());
    } else {
        // `Display` for f64 is the shortest text that reads back the same
        // value, and never uses an exponent: valid JSON.
        let _ = write!(out, "{value}");
    }
}

/// One window of one key, for queries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowView {
    /// `None` for a running aggregate.
    pub window_start_ms: Option<u64>,
    pub window_end_ms: Option<u64>,
    pub value: f64,
    pub count: u64,
    pub first_offset: u64,
    pub last_offset: u64,
}

/// One key of one aggregate on one partition: `GET /aggregates/NAME?key=K`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyView {
    pub aggregate: String,
    pub partition: u32,
    /// The aggregate's watermark on this partition (`None` before any event
    /// with a valid time, and for running aggregates).
    pub watermark_ms: Option<u64>,
    /// Windows still open, oldest first, with their values so far. A
    /// running aggregate has exactly one, with no bounds.
    pub open: Vec<WindowView>,
    /// The most recently closed window, kept until the watermark is one
    /// window size past its end.
    pub last_closed: Option<WindowView>,
}

/// One entry of a top-N list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopEntry {
    #[serde(serialize_with = "bytes_as_text")]
    pub key: Vec<u8>,
    pub value: f64,
    pub count: u64,
    /// The window ranked: each key's most recently closed window (`None`
    /// for running aggregates, ranked by their running value).
    pub window_start_ms: Option<u64>,
    pub window_end_ms: Option<u64>,
}

/// Keys are bytes; JSON shows them as text (invalid UTF-8 replaced).
fn bytes_as_text<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&String::from_utf8_lossy(bytes))
}

/// Top-N order: largest value first, then key bytes ascending.
pub(crate) fn top_order(left: &TopEntry, right: &TopEntry) -> Ordering {
    right.value.total_cmp(&left.value).then_with(|| left.key.cmp(&right.key))
}

/// Merges per-partition (or per-shard) top lists into the `n` largest, in
/// top-N order. A key listed twice (a partition counted twice while it
/// migrated) is kept once, with its larger value. `n` is capped at
/// [`TOP_N_MAX`].
pub fn merge_top<I: IntoIterator<Item = Vec<TopEntry>>>(lists: I, n: usize) -> Vec<TopEntry> {
    let mut merged: Vec<TopEntry> = lists.into_iter().flatten().collect();
    merged.sort_by(top_order);
    let mut seen = ahash::AHashSet::new();
    merged.retain(|entry| seen.insert(entry.key.clone()));
    merged.truncate(n.min(TOP_N_MAX));
    merged
}

/// What one aggregate holds and has counted on one partition (`/stats`,
/// `/metrics`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AggregateStats {
    pub aggregate: String,
    pub partition: u32,
    pub keys: u64,
    pub open_windows: u64,
    pub watermark_ms: Option<u64>,
    /// Estimated heap bytes held (keys, windows, sketches, table).
    pub memory_bytes: u64,
    /// Offsets below this were not counted: the aggregate was declared here.
    pub from_offset: u64,
    pub counters: AggregateCounters,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(value: f64) -> ClosedWindow<'static> {
        ClosedWindow {
            aggregate: "clicks",
            output: "out",
            kind: AggregateKind::Sum,
            partition: 7,
            key: b"k",
            window_start_ms: 1000,
            window_end_ms: 2000,
            value,
            count: 2,
            first_offset: 0,
            last_offset: 1,
            sequence: 12,
        }
    }

    /// The payload is the documented JSON, parses with serde_json, and integral values have no fraction.
    #[test]
    fn payload_json() {
        let mut out = Vec::new();
        window(2.0).write_json(&mut out);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            r#"{"aggregate":"clicks","partition":7,"sequence":12,"window_start_ms":1000,"window_end_ms":2000,"value":2,"count":2,"first_offset":0,"last_offset":1}"#
        );
        for value in [0.1 + 0.2, -3.5, 1e300, 1e-300, f64::INFINITY, 9_007_199_254_740_993.0] {
            out.clear();
            window(value).write_json(&mut out);
            let parsed: serde_json::Value = serde_json::from_slice(&out).unwrap();
            match parsed["value"].as_f64() {
                Some(read) => assert_eq!(read, value),
                None => assert!(!value.is_finite() && parsed["value"].is_null()),
            }
        }
    }

    fn entry(key: &str, value: f64) -> TopEntry {
        TopEntry { key: key.into(), value, count: 1, window_start_ms: None, window_end_ms: None }
    }

    /// Merging keeps the n largest across lists, ties by key, and a key listed twice once.
    #[test]
    fn merge_top_orders_and_dedupes() {
        let merged = merge_top(
            vec![vec![entry("a", 5.0), entry("b", 1.0)], vec![entry("c", 5.0), entry("a", 2.0), entry("d", 3.0)]],
            3,
        );
        let keys: Vec<_> =
            merged.iter().map(|entry| (String::from_utf8(entry.key.clone()).unwrap(), entry.value)).collect();
        assert_eq!(keys, vec![("a".into(), 5.0), ("c".into(), 5.0), ("d".into(), 3.0)]);
    }
}
