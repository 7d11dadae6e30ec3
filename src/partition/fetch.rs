//! Owner-side reads for subscribers.
//!
//! Subscriptions pull: the shard that holds a subscriber keeps its cursors
//! and sends each owner at most one [`FetchRequest`] at a time, with a byte
//! budget. The owner answers with [`serve_fetch`]: records from its logs
//! ([`FetchedRecords`], copied a span at a time) and the new cursors, or
//! nothing yet, in which case the request waits
//! in [`ParkedFetches`] until one of its partitions is appended to. A
//! partition the owner no longer holds is answered "moved" (the subscriber's
//! shard asks its new owner next), one still migrating here "waiting".
//!
//! A fetch can *stand* ([`FetchRequest::window`]): once its cursors are
//! resolved, the owner keeps it after a reply that only carries events,
//! advances its cursors itself, and answers again as events arrive, while
//! its window of bytes and replies lasts. The subscriber gives the window
//! back in [`FetchCredit`]s as it writes the replies out, half a window at a
//! time. So a subscriber that keeps up costs one frame per reply from the
//! owner, not a reply and a new request: the request right after each reply
//! used to wake an owner that had just gone to sleep, more often than any
//! other frame (perf on `sched_waking` at 100 k events/s). A reply on a
//! standing fetch carries only the cursors that moved. Anything else
//! (a partition moved or still arriving, a read from the files, a refusal,
//! a wake-up from the subscriber) ends it with a final reply, and the
//! subscriber asks again as before.
//!
//! The owner knows no wire format: a reply carries records, and the face
//! that asked renders them on its own shard (the subscribe port its text
//! lines, `crate::subscribe`). Budgets count the reply's record bytes
//! ([`FetchedRecords::size_bytes`]: key, payload and 6 bytes a record, 21
//! a run of one partition or a notice), on both sides: `--fetch-bytes-max`
//! bounds one reply's records (but a reply always carries one record when
//! one is readable), and a standing fetch's window is spent and given back
//! in the same bytes. The lines a subscriber reads are larger than the
//! records (offsets in decimal, separators); they are rendered in chunks of
//! at most `--fetch-bytes-max` (and a line), so a subscriber still holds at
//! most one window of records per owner and one chunk being written, the
//! `(S + 1) * fetch_bytes_max` of the memory formula.

use crate::partition::records::{ENTRY_HEADER_SIZE, FetchedRecords};
use crate::partition::{Partition, PartitionManager};
use crate::storage::format::{DecodedFrame, decode_frame, record_size_of};

/// Where a cursor stands before the owner has resolved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    Earliest,
    Latest,
    At(u64),
    /// An offset the subscriber asked for and no owner has checked yet: the
    /// owner answers at once, with `out_of_range` if it is past the end.
    Requested(u64),
    /// A consumer group's committed offset: like `Requested`, but one past
    /// the end is not refused. That can only mean the log lost events the
    /// group had read before this process opened it (unsynced events lost
    /// to a power cut; a commit made since cannot be past the end): reading
    /// resumes where this process opened the partition
    /// ([`crate::partition::Partition::opened_offset`]), so every event
    /// written since is read, and the reply reports it
    /// ([`FetchReply::resumed_past_end`]): logged and counted, never silent.
    Resume(u64),
}

/// A subscriber's request to one owner shard.
#[derive(Debug)]
pub struct FetchRequest {
    pub subscription_id: u64,
    /// The stream the subscription reads: a partition of another stream
    /// (the ids of a deleted stream, reused) is answered "deleted".
    pub stream_id: u32,
    pub cursors: Vec<(u32, Position)>,
    pub bytes_max: usize,
    /// `Some`: the fetch may stand (see the module doc), within this window.
    /// `None`: one reply, then the subscriber asks again.
    pub window: Option<FetchWindow>,
}

/// What an owner may still send on a standing fetch before the subscriber
/// gives some back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FetchWindow {
    pub bytes: usize,
    pub replies: u32,
}

impl FetchWindow {
    pub fn has_room(&self) -> bool {
        self.bytes > 0 && self.replies > 0
    }

    /// What one reply of `bytes` costs.
    pub fn spend(&mut self, bytes: usize) {
        self.bytes = self.bytes.saturating_sub(bytes);
        self.replies = self.replies.saturating_sub(1);
    }

    pub fn give_back(&mut self, returned: FetchWindow) {
        self.bytes += returned.bytes;
        self.replies += returned.replies;
    }
}

/// The window a subscriber returns to an owner's standing fetch.
#[derive(Debug, Clone, Copy)]
pub struct FetchCredit {
    pub subscription_id: u64,
    pub returned: FetchWindow,
}

impl FetchRequest {
    /// Whether the owner may keep this fetch after a reply that only
    /// carries events: it has a window with room, and every cursor is
    /// resolved (so the owner can advance them alone).
    pub fn can_stand(&self) -> bool {
        self.window.is_some_and(|window| window.has_room())
            && self.cursors.iter().all(|(_, position)| matches!(position, Position::At(_)))
    }

    /// Whether the owner should serve it now (a standing fetch whose window
    /// is used up waits for credit).
    pub fn is_servable(&self) -> bool {
        self.window.is_none_or(|window| window.has_room())
    }

    /// The byte budget of the next reply.
    pub fn budget(&self) -> usize {
        match self.window {
            Some(window) => self.bytes_max.min(window.bytes),
            None => self.bytes_max,
        }
    }
}

/// An owner's answer: records and truncation notices for the face to
/// render, and new cursors.
#[derive(Debug)]
pub struct FetchReply {
    pub subscription_id: u64,
    pub owner: u16,
    pub records: FetchedRecords,
    /// New offset of every requested partition the owner holds (on a
    /// standing fetch: of those that moved on).
    pub cursors: Vec<(u32, u64)>,
    /// The owner kept the fetch: more replies follow on it. A reply
    /// without it is the fetch's last.
    pub standing: bool,
    /// The budget ran out before the end of what is readable: a standing
    /// fetch has more to send now, not only once new events arrive.
    pub more: bool,
    /// Requested partitions the owner does not hold (they moved).
    pub moved: Vec<u32>,
    /// Requested partitions that are migrating to this owner and not yet
    /// installed: the cursor stays, the next fetch comes back here.
    pub waiting: Vec<u32>,
    /// Cursors behind the tail cache of a partition on disk: (partition,
    /// offset). The owner reads them from the files before it replies
    /// ([`copy_from_frames`]); their cursors stay until then.
    pub disk_reads: Vec<(u32, u64)>,
    /// Requested offsets past the end of their partition, with the
    /// partition's next offset (the subscriber is refused).
    pub out_of_range: Vec<(u32, u64)>,
    /// Requested partitions whose stream was deleted (the subscription ends).
    pub deleted: Vec<u32>,
    /// A group's committed offset past its partition's end:
    /// `(partition, committed, end, resumed at)`.
    pub resumed_past_end: Vec<(u32, u64, u64, u64)>,
}

/// Serves a fetch from the owner's logs. `None` means there is nothing to
/// say yet (every cursor is resolved and at the end of its log): park it,
/// unless `force`, which always answers (with unchanged cursors if need be).
/// A fetch that [can stand](FetchRequest::can_stand) gets only the cursors
/// that moved in its reply, and its own cursors advanced to match (so the
/// owner can keep it).
pub fn serve_fetch(
    owner: u16,
    partitions: &PartitionManager,
    is_incoming: impl Fn(u32) -> bool,
    request: &mut FetchRequest,
    force: bool,
) -> Option<FetchReply> {
    serve_fetch_with(owner, partitions, is_incoming, |_| false, request, force)
}

/// [`serve_fetch`] on a node of a cluster: `awaits_mirror(partition)` says
/// that this node holds no replica of a replicated partition and its
/// mirror has not caught up with the replicas
/// ([`crate::replication::mirror`]). A cursor there at `latest`, or at a
/// requested offset past this node's copy, is left unresolved (the
/// fetch parks, and comes back once the mirror has caught up): the local
/// copy's end is not the partition's.
pub fn serve_fetch_with(
    owner: u16,
    partitions: &PartitionManager,
    is_incoming: impl Fn(u32) -> bool,
    awaits_mirror: impl Fn(u32) -> bool,
    request: &mut FetchRequest,
    force: bool,
) -> Option<FetchReply> {
    let standing = request.can_stand();
    let budget = request.budget();
    let mut reply = FetchReply::empty(request.subscription_id, owner);
    if !standing {
        reply.cursors.reserve(request.cursors.len());
    }
    let mut resolved_any = false;
    for (partition_id, slot) in request.cursors.iter_mut() {
        let (partition_id, requested) = (*partition_id, *slot);
        let Some(partition) = owned_partition(&mut reply, partitions, &is_incoming, request.stream_id, partition_id)
        else {
            continue;
        };
        let past_copy = match requested {
            Position::Latest => true,
            Position::Requested(offset) => offset > partition.log.next_offset(),
            _ => false,
        };
        if past_copy && awaits_mirror(partition_id) {
            continue;
        }
        resolved_any |= !matches!(requested, Position::At(_));
        let Some(position) = checked_position(&mut reply, partition, partition_id, requested) else { continue };
        let offset = read_into(&mut reply, partition_id, &partition.log, position, budget);
        if !standing || requested != Position::At(offset) {
            reply.cursors.push((partition_id, offset));
        }
        if standing {
            *slot = Position::At(offset);
        }
    }
    finish_reply(reply, force, resolved_any)
}

/// The partition of a cursor if this owner holds it (for the fetch's
/// stream); else notes in the reply why not: deleted, on its way here, or
/// moved.
fn owned_partition<'a>(
    reply: &mut FetchReply,
    partitions: &'a PartitionManager,
    is_incoming: impl Fn(u32) -> bool,
    stream_id: u32,
    partition_id: u32,
) -> Option<&'a Partition> {
    let held = partitions.get(partition_id);
    if let Some(partition) = held.filter(|partition| partition.stream_id == stream_id) {
        return Some(partition);
    }
    if held.is_some() || partitions.is_retired(partition_id) {
        reply.deleted.push(partition_id);
    } else if is_incoming(partition_id) {
        reply.waiting.push(partition_id);
    } else {
        reply.moved.push(partition_id);
    }
    None
}

/// Checks a requested offset against the partition's end: past it, the
/// request is refused (`None`, noted in the reply); a group's committed
/// offset past it resumes where this process opened the partition (noted).
fn checked_position(
    reply: &mut FetchReply,
    partition: &Partition,
    partition_id: u32,
    position: Position,
) -> Option<Position> {
    let end = partition.log.next_offset();
    match position {
        Position::Requested(offset) if offset > end => {
            reply.out_of_range.push((partition_id, end));
            None
        }
        Position::Resume(offset) if offset > end => {
            let resume = partition.opened_offset.min(end);
            reply.resumed_past_end.push((partition_id, offset, end, resume));
            Some(Position::At(resume))
        }
        Position::Resume(offset) => Some(Position::At(offset)),
        other => Some(other),
    }
}

/// The reply if it has news (or `force`), its buffer trimmed.
fn finish_reply(mut reply: FetchReply, force: bool, resolved_any: bool) -> Option<FetchReply> {
    let has_news = force
        || !reply.records.is_empty()
        || !reply.moved.is_empty()
        || !reply.disk_reads.is_empty()
        || !reply.deleted.is_empty()
        || resolved_any;
    debug_assert!(reply.out_of_range.is_empty() || has_news, "a refusal is news");
    // The buffer was sized for a full reply; a standing fetch keeps many
    // small ones in flight, so give the unused part back.
    if reply.records.capacity() > 2 * reply.records.size_bytes() + REPLY_SLACK_BYTES {
        reply.records.shrink_to_fit();
    }
    has_news.then_some(reply)
}

const _: () = assert!(
    std::mem::size_of::<FetchReply>() * crate::config::limits::STANDING_FETCH_REPLIES_MAX as usize
        <= crate::config::limits::STANDING_REPLIES_STATE_BYTES,
    "the memory formula's standing-reply bookkeeping"
);

/// A fetch reply's buffer is reserved this large (or at the fetch's budget)
/// once it has data, so a full reply does not regrow it.
const FETCH_BUFFER_BYTES_INITIAL_MAX: usize = 256 * 1024;
/// Unused reply capacity kept rather than given back.
const REPLY_SLACK_BYTES: usize = 4096;

impl FetchReply {
    /// A reply that says nothing yet.
    pub fn empty(subscription_id: u64, owner: u16) -> FetchReply {
        FetchReply {
            subscription_id,
            owner,
            records: FetchedRecords::default(),
            cursors: Vec::new(),
            standing: false,
            more: false,
            moved: Vec::new(),
            waiting: Vec::new(),
            disk_reads: Vec::new(),
            out_of_range: Vec::new(),
            deleted: Vec::new(),
            resumed_past_end: Vec::new(),
        }
    }

    /// Whether the reply carries only events (and truncation notices): the
    /// owner may keep a standing fetch after it.
    pub fn is_tail_only(&self) -> bool {
        self.moved.is_empty()
            && self.waiting.is_empty()
            && self.disk_reads.is_empty()
            && self.out_of_range.is_empty()
            && self.deleted.is_empty()
    }
}

/// Copies one partition's records from `position` into the reply, within
/// the budget (at least one record when there is one, so a large event
/// never stalls a reader); returns the cursor's new offset.
fn read_into(
    reply: &mut FetchReply,
    partition_id: u32,
    log: &crate::partition::PartitionLog,
    position: Position,
    bytes_max: usize,
) -> u64 {
    let mut offset = match position {
        Position::Earliest => log.earliest_offset(),
        Position::Latest => log.visible_offset(),
        Position::At(offset) | Position::Requested(offset) | Position::Resume(offset) => offset,
    };
    if offset >= log.visible_offset() {
        return offset;
    }
    if reply.records.size_bytes() >= bytes_max {
        reply.more = true;
        return offset;
    }
    if reply.records.capacity() == 0 {
        reply.records.reserve(bytes_max.min(FETCH_BUFFER_BYTES_INITIAL_MAX));
    }
    if offset < log.earliest_offset() {
        reply.records.push_truncated(partition_id, offset, log.earliest_offset());
        offset = log.earliest_offset();
    }
    if offset < log.cached_from() {
        reply.disk_reads.push((partition_id, offset));
        return offset;
    }
    let next = copy_records(&mut reply.records, partition_id, log, offset, bytes_max);
    reply.more |= next < log.visible_offset();
    next
}

/// Copies the visible records of `log` from `offset` on into `out` (one
/// copy per tail-cache segment), until `out` would pass `bytes_max` (at
/// least one record is copied when there is one). Returns the next offset.
pub fn copy_records(
    out: &mut FetchedRecords,
    partition_id: u32,
    log: &crate::partition::PartitionLog,
    offset: u64,
    bytes_max: usize,
) -> u64 {
    let room_bytes = bytes_max.saturating_sub(out.size_bytes() + ENTRY_HEADER_SIZE);
    log.read_cached_spans(offset, room_bytes, |first_offset, record_count, log_records| {
        out.push_records(partition_id, first_offset, record_count, log_records);
    })
}

/// Copies the records of whole frames in `frames` (read from a segment
/// file) from `from_offset` on into `out`, one copy per frame, until `out`
/// would pass `bytes_max` (at least one record) or `below` is reached.
/// Returns the next offset and the records copied; stops at the first
/// bytes that are not a whole valid frame (the caller read a bounded
/// chunk).
pub fn copy_from_frames(
    out: &mut FetchedRecords,
    partition_id: u32,
    frames: &[u8],
    from_offset: u64,
    below: u64,
    bytes_max: usize,
) -> (u64, u64) {
    let (mut next, mut copied, mut rest) = (from_offset, 0u64, frames);
    while let Ok(frame) = decode_frame(rest) {
        rest = &rest[frame.header.frame_size()..];
        let room_bytes = bytes_max.saturating_sub(out.size_bytes() + ENTRY_HEADER_SIZE);
        let (record_count, span, complete) = frame_span(&frame, next, below, room_bytes, copied == 0);
        if record_count > 0 {
            out.push_records(partition_id, next, record_count, span);
            next += u64::from(record_count);
            copied += u64::from(record_count);
        }
        if !complete {
            break;
        }
    }
    (next, copied)
}

/// The records of `frame` from `next` on, below `below` and within
/// `room_bytes` (with `take_one`, at least one): how many, their bytes, and
/// whether the frame was taken to its end (else reading stops here: the
/// budget, `below`, or a gap in the offsets).
fn frame_span<'a>(
    frame: &DecodedFrame<'a>,
    next: u64,
    below: u64,
    room_bytes: usize,
    take_one: bool,
) -> (u32, &'a [u8], bool) {
    let (mut position, mut span_start, mut count) = (0, None, 0u32);
    for record in frame.records() {
        let size = record_size_of(record.key, record.payload);
        if record.offset < next {
            position += size;
            continue;
        }
        let start = *span_start.get_or_insert(position);
        let offset = next + u64::from(count);
        let fits = position + size - start <= room_bytes || (take_one && count == 0);
        if record.offset != offset || offset >= below || !fits {
            return (count, &frame.body[start..position], false);
        }
        position += size;
        count += 1;
    }
    let start = span_start.unwrap_or(position);
    (count, &frame.body[start..position], true)
}

/// Fetches waiting at an owner for new events: (origin shard, request).
/// Bounded by the subscribers of every shard (one fetch per subscriber per
/// owner at a time).
#[derive(Debug, Default)]
pub struct ParkedFetches {
    parked: Vec<(u16, FetchRequest)>,
}

impl ParkedFetches {
    pub fn park(&mut self, origin: u16, request: FetchRequest) {
        self.parked.push((origin, request));
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// Calls `each` with every partition a parked fetch waits on (once per
    /// fetch that carries it).
    pub fn partitions(&self, each: &mut impl FnMut(u32)) {
        for (_, request) in &self.parked {
            for (partition, _) in &request.cursors {
                each(*partition);
            }
        }
    }

    /// Whether any parked fetch may be served now.
    pub fn any_servable(&self) -> bool {
        self.parked.iter().any(|(_, request)| request.is_servable())
    }

    /// Takes every parked fetch that may be served, to serve them again (a
    /// standing fetch whose window is used up stays, waiting for credit).
    pub fn take_servable(&mut self) -> Vec<(u16, FetchRequest)> {
        if self.parked.iter().all(|(_, request)| request.is_servable()) {
            return std::mem::take(&mut self.parked);
        }
        let mut servable = Vec::new();
        let mut index = 0;
        while index < self.parked.len() {
            if self.parked[index].1.is_servable() {
                servable.push(self.parked.swap_remove(index));
            } else {
                index += 1;
            }
        }
        servable
    }

    /// Gives window back to a subscriber's standing fetch; returns whether
    /// it became servable again. A fetch that ended meanwhile is gone: the
    /// credit is dropped (the subscriber's next fetch brings a new window).
    pub fn credit(&mut self, origin: u16, credit: FetchCredit) -> bool {
        let parked = self.parked.iter_mut().find(|(parked_origin, request)| {
            (*parked_origin, request.subscription_id) == (origin, credit.subscription_id)
        });
        let Some((_, request)) = parked else { return false };
        let Some(window) = request.window.as_mut() else { return false };
        let was_servable = window.has_room();
        window.give_back(credit.returned);
        !was_servable && window.has_room()
    }

    /// Takes the parked fetch of one subscriber, if it is parked here.
    pub fn take(&mut self, origin: u16, subscription_id: u64) -> Option<FetchRequest> {
        let index = self.parked.iter().position(|(parked_origin, request)| {
            (*parked_origin, request.subscription_id) == (origin, subscription_id)
        })?;
        Some(self.parked.swap_remove(index).1)
    }

    /// Drops the parked fetch of a subscriber that went away.
    pub fn cancel(&mut self, origin: u16, subscription_id: u64) {
        self.parked
            .retain(|(parked_origin, request)| (*parked_origin, request.subscription_id) != (origin, subscription_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::records::Entry;
    use crate::partition::{Partition, PartitionLog};
    use crate::protocol::record::encode_batch_record;

    fn manager_with(events: &[(u32, &str)]) -> PartitionManager {
        let mut manager = PartitionManager::new(4);
        for partition in [0, 1] {
            let log = PartitionLog::in_memory(4096, 1024);
            manager.install(partition, Box::new(Partition::new(log, 500)));
        }
        for &(partition, payload) in events {
            let mut batch = Vec::new();
            encode_batch_record(&mut batch, partition, b"k", payload.as_bytes());
            manager.get_mut(partition).unwrap().log.append(&batch[4..]);
        }
        manager
    }

    /// The reply's records as `<partition> <offset> <key> <payload>` lines
    /// and notices as `TRUNCATED <partition> <requested> <earliest>`, for
    /// reading the tests (the subscribe face renders the real lines).
    fn text(reply: &FetchReply) -> String {
        let mut text = String::new();
        for entry in reply.records.entries() {
            match entry {
                Entry::Run(run) => {
                    for (offset, record) in run.records() {
                        let (key, payload) =
                            (String::from_utf8_lossy(record.key), String::from_utf8_lossy(record.payload));
                        text.push_str(&format!("{} {offset} {key} {payload}\n", run.partition));
                    }
                }
                Entry::Truncated { partition, requested, earliest } => {
                    text.push_str(&format!("TRUNCATED {partition} {requested} {earliest}\n"));
                }
            }
        }
        text
    }

    fn request(cursors: &[(u32, Position)]) -> FetchRequest {
        FetchRequest { subscription_id: 9, stream_id: 0, cursors: cursors.to_vec(), bytes_max: 1 << 20, window: None }
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
            &mut request(&[(0, Position::Earliest), (1, Position::Latest), (2, Position::At(0))]),
            false,
        )
        .unwrap();
        assert_eq!(text(&reply), "0 0 k a\n0 1 k b\n");
        assert_eq!(reply.cursors, [(0, 2), (1, 1)]);
        assert_eq!(reply.moved, [2]);
        assert_eq!(reply.records.record_count(), 2);
        assert!(
            serve_fetch(3, &manager, |_| false, &mut request(&[(0, Position::At(2)), (1, Position::At(1))]), false)
                .is_none()
        );
        let tail = serve_fetch(3, &manager, |_| false, &mut request(&[(1, Position::At(0))]), false).unwrap();
        assert_eq!(text(&tail), "1 0 k c\n");
        let forced = serve_fetch(3, &manager, |_| false, &mut request(&[(0, Position::At(2))]), true).unwrap();
        assert_eq!(
            (forced.cursors.as_slice(), forced.records.size_bytes()),
            (&[(0, 2)][..], 0),
            "forced: unchanged cursors"
        );
        let incoming = |partition| partition == 3;
        assert!(
            serve_fetch(3, &manager, incoming, &mut request(&[(3, Position::At(0))]), false).is_none(),
            "waits for it"
        );
        let both =
            serve_fetch(3, &manager, incoming, &mut request(&[(3, Position::At(0)), (2, Position::At(0))]), false)
                .unwrap();
        assert_eq!((both.waiting.as_slice(), both.moved.as_slice()), (&[3][..], &[2][..]));
    }

    /// A requested offset is answered at once: past the end it is refused
    /// with the partition's next offset, at the end it resolves (no parking),
    /// and within the log it reads like any cursor.
    #[test]
    fn requested_offsets_are_checked_at_once() {
        let manager = manager_with(&[(0, "a"), (0, "b")]);
        let past = serve_fetch(0, &manager, |_| false, &mut request(&[(0, Position::Requested(3))]), false).unwrap();
        assert_eq!((past.out_of_range.as_slice(), past.cursors.len()), (&[(0, 2)][..], 0));
        let mut largest = request(&[(1, Position::Requested(u64::MAX)), (0, Position::Requested(1))]);
        let reply = serve_fetch(0, &manager, |_| false, &mut largest, false).unwrap();
        assert_eq!(reply.out_of_range, [(1, 0)]);
        assert_eq!((reply.cursors.as_slice(), text(&reply).as_str()), (&[(0, 2)][..], "0 1 k b\n"));
        let at_end = serve_fetch(0, &manager, |_| false, &mut request(&[(0, Position::Requested(2))]), false).unwrap();
        assert_eq!((at_end.cursors.as_slice(), at_end.out_of_range.len()), (&[(0, 2)][..], 0));
    }

    /// A fetch that can stand (a window, every cursor resolved) gets only
    /// the cursors that moved on, and its own cursors advance, so the owner
    /// can keep it and serve it again without a new request.
    #[test]
    fn a_standing_fetch_advances_itself() {
        let manager = manager_with(&[(0, "a"), (0, "b")]);
        let mut standing = request(&[(0, Position::At(0)), (1, Position::At(0))]);
        standing.window = Some(FetchWindow { bytes: 1 << 20, replies: 4 });
        assert!(standing.can_stand());
        let reply = serve_fetch(0, &manager, |_| false, &mut standing, false).unwrap();
        assert_eq!(reply.cursors, [(0, 2)], "partition 1 did not move on");
        assert!(reply.is_tail_only());
        assert_eq!(standing.cursors, [(0, Position::At(2)), (1, Position::At(0))]);
        assert!(serve_fetch(0, &manager, |_| false, &mut standing, false).is_none(), "nothing new: park it");
        let mut unresolved = request(&[(0, Position::Latest)]);
        unresolved.window = standing.window;
        assert!(!unresolved.can_stand(), "an unresolved cursor first needs its answer");
    }

    /// A standing fetch whose window is used up stays parked but is not
    /// served until credit gives window back; credit for a fetch that
    /// ended is dropped.
    #[test]
    fn parked_standing_fetches_wait_for_credit() {
        let mut parked = ParkedFetches::default();
        let mut spent = request(&[(0, Position::At(0))]);
        spent.window = Some(FetchWindow { bytes: 10, replies: 1 });
        spent.window.as_mut().unwrap().spend(10);
        parked.park(1, spent);
        parked.park(2, request(&[(0, Position::At(0))]));
        assert!(parked.any_servable());
        let servable = parked.take_servable();
        assert_eq!(servable.len(), 1);
        assert_eq!(servable[0].0, 2);
        assert!(!parked.any_servable() && !parked.is_empty());
        let credit = FetchCredit { subscription_id: 9, returned: FetchWindow { bytes: 10, replies: 1 } };
        assert!(!parked.credit(2, credit), "no fetch of origin 2 is parked any more");
        assert!(parked.credit(1, credit), "window back: servable again");
        assert_eq!(parked.take_servable().len(), 1);
    }

    /// A cursor behind retention gets an explicit TRUNCATED notice first.
    #[test]
    fn fetch_behind_retention_is_told() {
        let payload = "x".repeat(200);
        let events: Vec<(u32, &str)> = (0..100).map(|_| (0, payload.as_str())).collect();
        let manager = manager_with(&events);
        let earliest = manager.get(0).unwrap().log.earliest_offset();
        assert!(earliest > 0);
        let reply = serve_fetch(0, &manager, |_| false, &mut request(&[(0, Position::At(0))]), false).unwrap();
        let text = text(&reply);
        assert!(text.starts_with(&format!("TRUNCATED 0 0 {earliest}\n0 {earliest} k ")), "{}", &text[..60]);
        assert_eq!(reply.records.truncation_count(), 1);
        assert_eq!(reply.cursors, [(0, 100)]);
    }

    /// Frames of `per_frame` records each, `payload` then the offset, from
    /// offset 0.
    fn frames(frame_count: u64, per_frame: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        for frame in 0..frame_count {
            let mut buffer = vec![0u8; 4096];
            let mut encoder = crate::storage::format::FrameEncoder::new(&mut buffer).unwrap();
            for offset in frame * per_frame..(frame + 1) * per_frame {
                encoder.append(b"k", format!("p{offset}").as_bytes()).unwrap();
            }
            let sealed = encoder.seal(0, frame * per_frame, 0).unwrap();
            bytes.extend_from_slice(&buffer[..sealed.frame_size]);
        }
        bytes
    }

    /// Records read from frames are copied from the cursor on, one run for
    /// consecutive frames, up to the visible bound and within the budget
    /// (at least one record); a cut-off frame at the end of a read stops the
    /// copy cleanly.
    #[test]
    fn copies_from_frames_within_bounds() {
        let bytes = frames(3, 4);
        let copy = |from, below, bytes_max, frames: &[u8]| {
            let mut reply = FetchReply::empty(0, 0);
            let (next, copied) = copy_from_frames(&mut reply.records, 2, frames, from, below, bytes_max);
            assert_eq!(copied, reply.records.record_count());
            (next, text(&reply), reply.records.entries().count())
        };
        let (next, lines, entries) = copy(3, u64::MAX, usize::MAX, &bytes);
        assert_eq!(next, 12);
        let expected: String = (3..12).map(|offset| format!("2 {offset} k p{offset}\n")).collect();
        assert_eq!((lines, entries), (expected, 1), "one run across frames");
        assert_eq!(copy(3, 6, usize::MAX, &bytes).0, 6, "stops below the visible bound");
        let record_size = crate::storage::format::record_size_of(b"k", b"p10");
        let budget = ENTRY_HEADER_SIZE + 2 * record_size;
        assert_eq!(copy(5, u64::MAX, budget, &bytes).0, 7, "two records in the budget");
        assert_eq!(copy(5, u64::MAX, 1, &bytes).0, 6, "at least one record");
        assert_eq!(copy(0, u64::MAX, usize::MAX, &bytes[..bytes.len() - 1]).0, 8, "a cut-off last frame");
    }

    /// The budget bounds a reply, but a reply always carries at least one
    /// event, so an event larger than the budget is still delivered.
    #[test]
    fn fetch_budget_bounds_replies_and_always_progresses() {
        let events: Vec<(u32, &str)> = (0..50).map(|_| (0, "0123456789")).collect();
        let manager = manager_with(&events);
        let mut small = request(&[(0, Position::At(0))]);
        small.bytes_max = 1;
        let reply = serve_fetch(0, &manager, |_| false, &mut small, false).unwrap();
        assert_eq!((reply.records.record_count(), reply.cursors.as_slice()), (1, &[(0, 1)][..]));
        assert!(reply.more, "the budget cut it: more is readable now");
        let whole = serve_fetch(0, &manager, |_| false, &mut request(&[(0, Position::At(0))]), false).unwrap();
        assert_eq!((whole.records.record_count(), whole.more), (50, false));
        small.bytes_max = 100;
        let reply = serve_fetch(0, &manager, |_| false, &mut small, false).unwrap();
        let size_bytes = reply.records.size_bytes();
        assert!(size_bytes <= 100 && reply.records.record_count() >= 1, "{size_bytes} bytes");
    }
}
