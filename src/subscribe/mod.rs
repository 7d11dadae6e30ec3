//! Subscribers: `SUB <partition|*> <offset|earliest|latest>` on the subscribe
//! port, then `<partition> <offset> <key> <payload>` lines, replay then live
//! tail, in offset order per partition.
//!
//! Subscriptions **pull**. The shard that accepted the subscriber keeps the
//! cursors and sends each owner shard at most one [`FetchRequest`] at a time
//! (carrying the cursors of the partitions that owner holds) with a byte
//! budget. The owner answers at once with what its logs have, or parks the
//! request until one of those partitions is appended to. So:
//!
//! * a slow subscriber only delays its own next fetch: the log keeps the
//!   events (up to retention), ingest never waits for a subscriber;
//! * memory per subscriber is bounded by `shards * fetch_bytes_max`;
//! * cursors live with the subscription, not with the partition, so a
//!   partition that moves to another shard only changes where the next fetch
//!   goes (an owner that no longer has a partition answers "moved");
//! * a subscriber whose cursor fell behind retention gets one line
//!   `TRUNCATED <partition> <requested-offset> <next-readable-offset>` and the
//!   stream continues from the next readable offset; it never skips silently.

mod session;

pub use session::serve_subscriber;

use crate::partition::PartitionManager;

/// A fetch reply's buffer is reserved this large (or at the fetch's budget)
/// once it has data, so a full reply does not regrow it; a fetch that finds
/// nothing (and parks) allocates nothing.
const FETCH_BUFFER_BYTES_INITIAL_MAX: usize = 256 * 1024;

/// Where a cursor stands before the owner has resolved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    Earliest,
    Latest,
    At(u64),
}

/// A subscriber's request to one owner shard.
#[derive(Debug)]
pub struct FetchRequest {
    pub subscription_id: u64,
    pub cursors: Vec<(u32, Position)>,
    pub bytes_max: usize,
}

/// An owner's answer: subscriber lines, ready to write, and new cursors.
#[derive(Debug)]
pub struct FetchReply {
    pub subscription_id: u64,
    pub owner: u16,
    pub data: Vec<u8>,
    pub event_count: u64,
    pub truncation_count: u64,
    /// New offset of every requested partition the owner holds.
    pub cursors: Vec<(u32, u64)>,
    /// Requested partitions the owner does not hold (they moved).
    pub moved: Vec<u32>,
    /// Requested partitions that are migrating to this owner and not yet
    /// installed: the cursor stays, the next fetch comes back here.
    pub waiting: Vec<u32>,
}

/// Serves a fetch from the owner's logs. `None` means there is nothing to
/// say yet (every cursor is resolved and at the end of its log): park it.
pub fn serve_fetch(
    owner: u16,
    partitions: &PartitionManager,
    is_incoming: impl Fn(u32) -> bool,
    request: &FetchRequest,
) -> Option<FetchReply> {
    let mut reply = FetchReply {
        subscription_id: request.subscription_id,
        owner,
        data: Vec::new(),
        event_count: 0,
        truncation_count: 0,
        cursors: Vec::with_capacity(request.cursors.len()),
        moved: Vec::new(),
        waiting: Vec::new(),
    };
    let mut resolved_any = false;
    for &(partition_id, position) in &request.cursors {
        let Some(partition) = partitions.get(partition_id) else {
            if is_incoming(partition_id) {
                reply.waiting.push(partition_id);
            } else {
                reply.moved.push(partition_id);
            }
            continue;
        };
        let log = &partition.log;
        let mut offset = match position {
            Position::Earliest => log.earliest_offset(),
            Position::Latest => log.next_offset(),
            Position::At(offset) => offset,
        };
        resolved_any |= !matches!(position, Position::At(_));
        if reply.data.len() < request.bytes_max && offset < log.next_offset() {
            if reply.data.capacity() == 0 {
                reply.data.reserve(request.bytes_max.min(FETCH_BUFFER_BYTES_INITIAL_MAX));
            }
            if offset < log.earliest_offset() {
                write_truncated(&mut reply.data, partition_id, offset, log.earliest_offset());
                reply.truncation_count += 1;
                offset = log.earliest_offset();
            }
            let outcome = log.read_lines(partition_id, offset, &mut reply.data, request.bytes_max);
            reply.event_count += outcome.event_count;
            offset = outcome.next_offset;
        }
        reply.cursors.push((partition_id, offset));
    }
    let has_news = !reply.data.is_empty() || !reply.moved.is_empty() || resolved_any;
    has_news.then_some(reply)
}

fn write_truncated(out: &mut Vec<u8>, partition: u32, requested: u64, earliest: u64) {
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(b"TRUNCATED ");
    out.extend_from_slice(numbers.format(partition).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(requested).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(earliest).as_bytes());
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{Partition, PartitionLog};
    use crate::protocol::record::encode_batch_record;

    fn manager_with(events: &[(u32, &str)]) -> PartitionManager {
        let mut manager = PartitionManager::new(4);
        for partition in [0, 1] {
            let log = PartitionLog::new(4096, 1024);
            manager.install(partition, Box::new(Partition::new(log, 500)));
        }
        for &(partition, payload) in events {
            let mut batch = Vec::new();
            encode_batch_record(&mut batch, partition, b"k", payload.as_bytes());
            manager.get_mut(partition).unwrap().log.append(&batch[4..]);
        }
        manager
    }

    fn request(cursors: &[(u32, Position)]) -> FetchRequest {
        FetchRequest { subscription_id: 9, cursors: cursors.to_vec(), bytes_max: 1 << 20 }
    }

    /// A fetch returns lines in offset order, resolves earliest/latest, names
    /// partitions the owner does not hold, and parks when there is no news.
    #[test]
    fn fetch_serves_resolves_and_parks() {
        let manager = manager_with(&[(0, "a"), (0, "b"), (1, "c")]);
        let reply = serve_fetch(
            3,
            &manager,
            |_| false,
            &request(&[(0, Position::Earliest), (1, Position::Latest), (2, Position::At(0))]),
        )
        .unwrap();
        assert_eq!(reply.data, b"0 0 k a\n0 1 k b\n");
        assert_eq!(reply.cursors, [(0, 2), (1, 1)]);
        assert_eq!(reply.moved, [2]);
        assert_eq!(reply.event_count, 2);
        assert!(serve_fetch(3, &manager, |_| false, &request(&[(0, Position::At(2)), (1, Position::At(1))])).is_none());
        let tail = serve_fetch(3, &manager, |_| false, &request(&[(1, Position::At(0))])).unwrap();
        assert_eq!(tail.data, b"1 0 k c\n");
    }

    /// A cursor behind retention gets an explicit TRUNCATED notice first.
    #[test]
    fn fetch_behind_retention_is_told() {
        let payload = "x".repeat(200);
        let events: Vec<(u32, &str)> = (0..100).map(|_| (0, payload.as_str())).collect();
        let manager = manager_with(&events);
        let earliest = manager.get(0).unwrap().log.earliest_offset();
        assert!(earliest > 0);
        let reply = serve_fetch(0, &manager, |_| false, &request(&[(0, Position::At(0))])).unwrap();
        let text = String::from_utf8(reply.data).unwrap();
        assert!(text.starts_with(&format!("TRUNCATED 0 0 {earliest}\n0 {earliest} k ")), "{}", &text[..60]);
        assert_eq!(reply.truncation_count, 1);
        assert_eq!(reply.cursors, [(0, 100)]);
    }
}
