//! A shard's side of a peer's gap fetch ([`crate::replication::catchup`]):
//! reads a range of a partition's log, from the tail cache or the segment
//! files, into the records of one answer.
//!
//! The range is `[from, below)`, cut at the partition's visible offset (a
//! replicated partition holds committed records only, so these are the
//! records every replica holds at those offsets) and at the answer's byte
//! budget (at least one record). A read from the files is one bounded read
//! through the segment's sparse index, as a subscriber's
//! ([`crate::shard::disk_read`]), in a task of its own so the shard goes on
//! meanwhile; the cluster thread runs at most
//! [`crate::replication::catchup::GAP_SERVES_MAX`] of them at once.

use std::rc::Rc;

use crate::config::INDEX_INTERVAL_BYTES;
use crate::partition::disk::{FRAME_BODY_BYTES_TARGET, Located};
use crate::partition::fetch::copy_from_frames;
use crate::partition::records::{Entry, FetchedRecords};
use crate::replication::catchup::{GapRead, GapReadAnswer};
use crate::runtime::log;
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;
use crate::storage::format::FRAME_HEADER_SIZE;
use crate::storage::segment::{SegmentError, SegmentReader};

/// The most one read of a segment file takes (a retry when a frame did not
/// fit the first read: a frame holds at most one record larger than the
/// frame target).
pub const DISK_READ_BYTES_MAX: usize = 8 << 20;

/// How long a read waits for the committer to give the active segment's
/// writer back, in ms (then it answers no records; the peer asks again).
const BUSY_WAIT_MS_MAX: u64 = 100;

/// Where the records of a read are.
enum Plan {
    Answered,
    Disk { located: Located, below: u64 },
}

/// Answers a [`GapRead`]: at once from the tail cache, or from the files in
/// a task of its own; one with [`GapRead::wait_ms`] that finds nothing
/// readable yet waits in a task of its own until something is (or the
/// wait ends) and is then answered as one without.
pub fn handle(shard: &Rc<Shard>, read: GapRead) {
    let plan = {
        let partitions = shard.partitions.borrow();
        let Some(partition) = partitions.get(read.partition) else {
            let _ = read.reply.send(GapReadAnswer::NotOwned);
            return;
        };
        let log = &partition.log;
        let below = read.below.min(log.visible_offset());
        if read.from_offset < log.earliest_offset() {
            let _ = read.reply.send(GapReadAnswer::Lacks { earliest: log.earliest_offset() });
            return;
        }
        if read.from_offset >= below && read.wait_ms > 0 && read.from_offset < read.below {
            drop(partitions);
            wait_then_handle(shard, read);
            return;
        }
        if read.from_offset >= below {
            Plan::Answered
        } else if read.from_offset >= log.cached_from() {
            let (mut records, mut record_count) = (Vec::new(), 0u32);
            log.memory().read_spans(read.from_offset, below, read.bytes_max, |_, count, span| {
                records.extend_from_slice(span);
                record_count += count;
            });
            let _ = read.reply.send(GapReadAnswer::Records { record_count, records });
            return;
        } else if !read.files {
            let _ = read.reply.send(GapReadAnswer::NeedsFiles);
            return;
        } else {
            match log.disk() {
                Some(disk) => Plan::Disk { located: disk.locate(read.from_offset), below },
                None => Plan::Answered,
            }
        }
    };
    let Plan::Disk { located, below } = plan else {
        let _ = read.reply.send(GapReadAnswer::Records { record_count: 0, records: Vec::new() });
        return;
    };
    let shard = shard.clone();
    glommio::spawn_local(async move {
        let answer = match read_files(&shard, &read, located, below).await {
            Ok(answer) => answer,
            Err(error) => {
                ShardMetrics::add(&shard.metrics.storage_read_errors, 1);
                log::warn!(
                    shard = shard.id,
                    "gap read of partition {} at {}: {error}",
                    read.partition,
                    read.from_offset
                );
                GapReadAnswer::Records { record_count: 0, records: Vec::new() }
            }
        };
        let _ = read.reply.send(answer);
    })
    .detach();
}

/// Waits until the partition of `read` has a readable record at its
/// offset (or is no longer here), at most `read.wait_ms`, then answers it
/// without waiting. The wait holds no buffer; it is woken after every
/// commit round of the shard ([`crate::shard::subscriptions`]).
fn wait_then_handle(shard: &Rc<Shard>, mut read: GapRead) {
    let shard = shard.clone();
    glommio::spawn_local(async move {
        let readable = {
            let shard = shard.clone();
            let (partition, from_offset) = (read.partition, read.from_offset);
            move || {
                shard
                    .partitions
                    .borrow()
                    .get(partition)
                    .is_none_or(|partition| partition.log.visible_offset() > from_offset)
            }
        };
        let limit = glommio::timer::sleep(std::time::Duration::from_millis(read.wait_ms));
        crate::runtime::notify::first(shard.subscriptions.appended(readable), limit).await;
        read.wait_ms = 0;
        handle(&shard, read);
    })
    .detach();
}

/// Reads the records of `read` below `below` from the segment file
/// `located` names.
async fn read_files(
    shard: &Shard,
    read: &GapRead,
    located: Located,
    below: u64,
) -> Result<GapReadAnswer, SegmentError> {
    let (path, position, readable_end) = match located {
        Located::File { path, position, readable_end } => (path, position, readable_end),
        Located::Gone { earliest } => return Ok(GapReadAnswer::Lacks { earliest }),
        Located::Busy => {
            if let Some(committer) = shard.committer.as_ref() {
                let limit = glommio::timer::sleep(std::time::Duration::from_millis(BUSY_WAIT_MS_MAX));
                let _ = crate::runtime::notify::first(committer.round_ended(), limit).await;
            }
            return Ok(GapReadAnswer::Records { record_count: 0, records: Vec::new() });
        }
    };
    let reader = SegmentReader::open(&path).await?;
    let mut want = read.bytes_max + INDEX_INTERVAL_BYTES as usize + FRAME_BODY_BYTES_TARGET + FRAME_HEADER_SIZE;
    let mut frames = Vec::new();
    let mut fetched = FetchedRecords::default();
    loop {
        frames.clear();
        let size = want.min(usize::try_from(readable_end - position).unwrap_or(usize::MAX)).min(DISK_READ_BYTES_MAX);
        reader.read_into(position, size, &mut frames).await?;
        let (_, copied) =
            copy_from_frames(&mut fetched, read.partition, &frames, read.from_offset, below, read.bytes_max);
        ShardMetrics::add(&shard.metrics.storage_read_bytes, frames.len() as u64);
        if copied > 0 || size >= DISK_READ_BYTES_MAX || position + size as u64 >= readable_end {
            break;
        }
        // The frame holding the offset is larger than what was read.
        want = (want * 4).min(DISK_READ_BYTES_MAX);
    }
    Ok(flatten(&fetched, read.from_offset))
}

/// The records of `fetched` from `from_offset` on, back to back, as long as
/// their offsets follow each other.
fn flatten(fetched: &FetchedRecords, from_offset: u64) -> GapReadAnswer {
    let (mut records, mut record_count, mut next) = (Vec::with_capacity(fetched.size_bytes()), 0u32, from_offset);
    for entry in fetched.entries() {
        let Entry::Run(run) = entry else { break };
        if run.base_offset != next {
            break;
        }
        records.extend_from_slice(run.log_records);
        record_count += run.record_count;
        next += u64::from(run.record_count);
    }
    GapReadAnswer::Records { record_count, records }
}
