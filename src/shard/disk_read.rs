//! Reads for subscribers behind a partition's tail cache: from its segment
//! files, on the owner, without blocking anything else.
//!
//! [`crate::partition::fetch::serve_fetch`] answers what the tail cache
//! holds and lists the cursors that need the files. This task reads each of
//! those from disk in turn (one bounded read per cursor, through the
//! segment's sparse index), copies the records into the same reply (one
//! copy per frame), moves the cursors, and sends the reply. A subscriber thus catches up from disk at
//! `--fetch-bytes-max` per fetch per owner, and a live one never touches it.

use std::rc::Rc;

use crate::config::INDEX_INTERVAL_BYTES;
use crate::partition::disk::{FRAME_BODY_BYTES_TARGET, Located};
use crate::partition::fetch::{FetchReply, copy_from_frames};
use crate::runtime::log;
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;
use crate::storage::format::FRAME_HEADER_SIZE;
use crate::storage::segment::{SegmentError, SegmentReader};

/// The most one retry reads when a frame did not fit the first read (a
/// frame holds at most one record larger than the frame target).
const DISK_READ_BYTES_MAX: usize = 8 << 20;

/// The longest a read waits for the committer to give the active segment's
/// writer back, in ms.
const BUSY_WAIT_MS_MAX: u64 = 100;

/// Completes a reply's disk reads, then sends it to `origin`.
pub async fn complete_disk_reads(shard: Rc<Shard>, origin: u16, mut reply: FetchReply, bytes_max: usize) {
    for (partition_id, offset) in std::mem::take(&mut reply.disk_reads) {
        if reply.records.size_bytes() >= bytes_max {
            break;
        }
        if let Err(error) = read_one(&shard, &mut reply, partition_id, offset, bytes_max).await {
            ShardMetrics::add(&shard.metrics.storage_read_errors, 1);
            log::warn!(shard = shard.id, "read of partition {partition_id} at {offset}: {error}");
        }
    }
    shard.send_reply(origin, reply);
}

/// Reads one cursor's records from disk into the reply and moves its cursor.
async fn read_one(
    shard: &Shard,
    reply: &mut FetchReply,
    partition_id: u32,
    offset: u64,
    bytes_max: usize,
) -> Result<(), SegmentError> {
    let (located, visible) = {
        let partitions = shard.partitions.borrow();
        let Some(partition) = partitions.get(partition_id) else { return Ok(()) };
        let Some(disk) = partition.log.disk() else { return Ok(()) };
        (disk.locate(offset), partition.log.visible_offset())
    };
    let (path, position, readable_end) = match located {
        Located::File { path, position, readable_end } => (path, position, readable_end),
        Located::Gone { earliest } => {
            reply.records.push_truncated(partition_id, offset, earliest);
            set_cursor(reply, partition_id, earliest);
            return Ok(());
        }
        // The committer holds the active segment's writer: wait for its
        // round to end, and the next fetch comes back for the records.
        // Answering at once would have a local subscriber ask again at once,
        // with nothing in between that yields: a spin that starves the
        // committer it waits for (seen with 4 shards on 2 CPUs).
        Located::Busy => {
            if let Some(committer) = shard.committer.as_ref() {
                // Bounded: a writer out for a move or a stream deletion has
                // no round to wait for.
                let limit = glommio::timer::sleep(std::time::Duration::from_millis(BUSY_WAIT_MS_MAX));
                let _ = crate::runtime::notify::first(committer.round_ended(), limit).await;
            }
            return Ok(());
        }
    };
    let reader = SegmentReader::open(&path).await?;
    let budget = bytes_max.saturating_sub(reply.records.size_bytes());
    let mut want = budget + INDEX_INTERVAL_BYTES as usize + FRAME_BODY_BYTES_TARGET + FRAME_HEADER_SIZE;
    let mut frames = Vec::new();
    loop {
        frames.clear();
        let size = want.min(usize::try_from(readable_end - position).unwrap_or(usize::MAX));
        reader.read_into(position, size, &mut frames).await?;
        let (next, copied) = copy_from_frames(&mut reply.records, partition_id, &frames, offset, visible, bytes_max);
        ShardMetrics::add(&shard.metrics.storage_read_bytes, frames.len() as u64);
        if copied > 0 || size >= DISK_READ_BYTES_MAX || position + size as u64 >= readable_end {
            set_cursor(reply, partition_id, next);
            return Ok(());
        }
        // The frame holding `offset` is larger than what was read.
        want = (want * 4).min(DISK_READ_BYTES_MAX);
    }
}

/// Moves a cursor of the reply; a reply to a fetch that could stand lists
/// only the cursors that moved, so it may not be there yet.
fn set_cursor(reply: &mut FetchReply, partition_id: u32, offset: u64) {
    match reply.cursors.iter_mut().find(|(partition, _)| *partition == partition_id) {
        Some(cursor) => {
            debug_assert!(offset >= cursor.1, "a cursor only moves forward");
            cursor.1 = offset;
        }
        None => reply.cursors.push((partition_id, offset)),
    }
}
