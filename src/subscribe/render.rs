//! The subscribe port's face on fetched records: owners reply with records
//! ([`crate::partition::records`]), and this renders them as the lines a
//! subscriber reads, `<partition> <offset> <key> <payload>` and
//! `TRUNCATED <partition> <requested> <earliest>`
//! ([`crate::protocol::subscribe`]), on the subscriber's own shard.
//!
//! Lines go into one buffer per session, kept between writes, so rendering
//! allocates nothing per event (nor, once the buffer has grown, per reply).
//! Replies that arrived together leave in one write (every write wakes the
//! subscriber's reader), in chunks of at most `--fetch-bytes-max` and a
//! line: lines are larger than the records they come from (a record of a
//! 1-byte key and an empty payload is 7 bytes, its line up to 35), so a
//! reply is written out as it is rendered rather than rendered whole, and
//! the buffer stays within the one reply being written of the memory
//! formula.

use futures_lite::{AsyncWrite, AsyncWriteExt};

use crate::partition::fetch::FetchReply;
use crate::partition::records::{Entries, Entry, FetchedRecords, RunRecords};
use crate::protocol::subscribe::{EventLinePrefix, write_prefixed_event_line, write_truncated};
use crate::shard::metrics::ShardMetrics;

/// Renders one reply's records as subscriber lines, a chunk at a time.
pub struct LineRenderer<'a> {
    entries: Entries<'a>,
    /// The run being rendered: the start of its next line (its partition as
    /// the subscriber numbers it and the next offset, counted up line by
    /// line: offsets in a run are dense) and the records left.
    run: Option<(EventLinePrefix, RunRecords<'a>)>,
    /// The global id of the stream's partition 0: lines carry
    /// `global - base`.
    base: u32,
}

impl<'a> LineRenderer<'a> {
    pub fn new(records: &'a FetchedRecords, base: u32) -> LineRenderer<'a> {
        LineRenderer { entries: records.entries(), run: None, base }
    }

    /// Appends lines to `out` until it holds at least `bytes_max` bytes
    /// (then returns false: write `out`, clear it and call again) or the
    /// records end (returns true).
    pub fn render(&mut self, out: &mut Vec<u8>, bytes_max: usize) -> bool {
        loop {
            if let Some((prefix, records)) = self.run.as_mut() {
                while let Some((_, record)) = records.next() {
                    write_prefixed_event_line(out, prefix, record.key, record.payload);
                    // The prefix counts past a run's last offset only if
                    // the run goes on (its last offset may be u64::MAX).
                    if records.is_empty() {
                        break;
                    }
                    prefix.advance();
                    if out.len() >= bytes_max {
                        return false;
                    }
                }
                self.run = None;
                if out.len() >= bytes_max {
                    return false;
                }
            }
            match self.entries.next() {
                None => return true,
                Some(Entry::Run(run)) => {
                    let prefix = EventLinePrefix::new(self.local(run.partition), run.base_offset);
                    self.run = Some((prefix, run.records()));
                }
                Some(Entry::Truncated { partition, requested, earliest }) => {
                    write_truncated(out, self.local(partition), requested, earliest);
                    if out.len() >= bytes_max {
                        return false;
                    }
                }
            }
        }
    }

    /// A partition's number in its stream (owners check the stream, so a
    /// reply never names a partition below the base).
    fn local(&self, partition: u32) -> u32 {
        debug_assert!(partition >= self.base, "partition {partition} below the stream's base {}", self.base);
        partition.saturating_sub(self.base)
    }
}

/// Writes the lines of `replies` to `stream`: rendered into `out` (the
/// session's buffer, empty between calls) and written whenever it reaches
/// `chunk_bytes`, and once at the end. Counts the events, bytes and
/// notices delivered once all is written.
pub async fn write_replies<W: AsyncWrite + Unpin>(
    stream: &mut W,
    out: &mut Vec<u8>,
    replies: Vec<FetchReply>,
    base: u32,
    chunk_bytes: usize,
    metrics: &ShardMetrics,
) -> std::io::Result<()> {
    debug_assert!(out.is_empty());
    let (mut events, mut truncations, mut bytes) = (0, 0, 0);
    for reply in &replies {
        events += reply.records.record_count();
        truncations += reply.records.truncation_count();
        let mut renderer = LineRenderer::new(&reply.records, base);
        while !renderer.render(out, chunk_bytes) {
            stream.write_all(out).await?;
            bytes += out.len() as u64;
            out.clear();
        }
    }
    if !out.is_empty() {
        stream.write_all(out).await?;
        bytes += out.len() as u64;
        out.clear();
    }
    // A line far larger than a chunk grew the buffer: do not keep that.
    if out.capacity() > 2 * chunk_bytes {
        *out = Vec::new();
    }
    ShardMetrics::add(&metrics.events_delivered, events);
    ShardMetrics::add(&metrics.bytes_delivered, bytes);
    ShardMetrics::add(&metrics.truncation_notices, truncations);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record::encode_batch_record;

    fn records_of(partition: u32, first_offset: u64, events: &[(&[u8], &[u8])]) -> FetchedRecords {
        let mut log_records = Vec::new();
        for (key, payload) in events {
            let mut batch = Vec::new();
            encode_batch_record(&mut batch, partition, key, payload);
            log_records.extend_from_slice(&batch[4..]);
        }
        let mut records = FetchedRecords::default();
        records.push_truncated(partition, 0, first_offset);
        records.push_records(partition, first_offset, events.len() as u32, &log_records);
        records
    }

    /// Records render as the subscriber lines the protocol defines (the
    /// partition numbered in its stream, offsets counted up across a carry,
    /// keys escaped), and a chunked render gives the same bytes as a whole
    /// one, never stopping before a chunk is full.
    #[test]
    fn renders_lines_in_chunks() {
        let records = records_of(12, 99, &[(b"k", b"a"), (b"two words", b"b c"), (b"k", b"")]);
        let mut whole = Vec::new();
        assert!(LineRenderer::new(&records, 10).render(&mut whole, usize::MAX));
        assert_eq!(whole, b"TRUNCATED 2 0 99\n2 99 k a\n2 100 two\\swords b c\n2 101 k \n");
        for chunk_bytes in [1, 5, 17, 30, 1000] {
            let (mut renderer, mut out, mut chunked) = (LineRenderer::new(&records, 10), Vec::new(), Vec::new());
            while !renderer.render(&mut out, chunk_bytes) {
                assert!(out.len() >= chunk_bytes, "a chunk is full before it is written");
                chunked.append(&mut out);
            }
            chunked.append(&mut out);
            assert_eq!(chunked, whole, "chunks of {chunk_bytes}");
        }
    }
}
