//! Owner-side reads for subscribers.
//!
//! Subscriptions pull: the shard that holds a subscriber keeps its cursors
//! and sends each owner at most one [`FetchRequest`] at a time, with a byte
//! budget. The owner answers with [`serve_fetch`]: subscriber lines from its
//! logs and the new cursors, or nothing yet, in which case the request waits
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

use crate::partition::PartitionManager;
use crate::protocol::subscribe::{event_line_size_max, write_event_line, write_truncated};

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

/// An owner's answer: subscriber lines, ready to write, and new cursors.
#[derive(Debug)]
pub struct FetchReply {
    pub subscription_id: u64,
    pub owner: u16,
    pub data: Vec<u8>,
    pub event_count: u64,
    pub truncation_count: u64,
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
    /// ([`write_lines_from_frames`]); their cursors stay until then.
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
    let standing = request.can_stand();
    let budget = request.budget();
    let mut reply = FetchReply::empty(request.subscription_id, owner);
    if !standing {
        reply.cursors.reserve(request.cursors.len());
    }
    let mut resolved_any = false;
    for (partition_id, slot) in request.cursors.iter_mut() {
        let (partition_id, requested) = (*partition_id, *slot);
        let position = requested;
        let Some(partition) = partitions.get(partition_id).filter(|partition| partition.stream_id == request.stream_id)
        else {
            if partitions.get(partition_id).is_some() {
                reply.deleted.push(partition_id);
                continue;
            }
            if partitions.is_retired(partition_id) {
                reply.deleted.push(partition_id);
            } else if is_incoming(partition_id) {
                reply.waiting.push(partition_id);
            } else {
                reply.moved.push(partition_id);
            }
            continue;
        };
        resolved_any |= !matches!(position, Position::At(_));
        if let Position::Requested(offset) = position
            && offset > partition.log.next_offset()
        {
            reply.out_of_range.push((partition_id, partition.log.next_offset()));
            continue;
        }
        let position = match position {
            Position::Resume(offset) if offset > partition.log.next_offset() => {
                let end = partition.log.next_offset();
                let resume = partition.opened_offset.min(end);
                reply.resumed_past_end.push((partition_id, offset, end, resume));
                Position::At(resume)
            }
            Position::Resume(offset) => Position::At(offset),
            other => other,
        };
        let ids = PartitionIds { global: partition_id, local: partition_id - partition.stream_base };
        let offset = read_into(&mut reply, ids, &partition.log, position, budget);
        if !standing || requested != Position::At(offset) {
            reply.cursors.push((partition_id, offset));
        }
        if standing {
            *slot = Position::At(offset);
        }
    }
    let has_news = force
        || !reply.data.is_empty()
        || !reply.moved.is_empty()
        || !reply.disk_reads.is_empty()
        || !reply.deleted.is_empty()
        || resolved_any;
    debug_assert!(reply.out_of_range.is_empty() || has_news, "a refusal is news");
    // The buffer was sized for a full reply; a standing fetch keeps many
    // small ones in flight, so give the unused part back.
    if reply.data.capacity() > 2 * reply.data.len() + REPLY_SLACK_BYTES {
        reply.data.shrink_to_fit();
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
            data: Vec::new(),
            event_count: 0,
            truncation_count: 0,
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

/// A partition's global id (cursors, the engine) and its number in its
/// stream (what a subscriber line says).
#[derive(Debug, Clone, Copy)]
struct PartitionIds {
    global: u32,
    local: u32,
}

/// Writes one partition's lines from `position` into the reply, within the
/// budget (at least one event when there is one, so a large event never
/// stalls a reader); returns the cursor's new offset.
fn read_into(
    reply: &mut FetchReply,
    ids: PartitionIds,
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
    if reply.data.len() >= bytes_max {
        reply.more = true;
        return offset;
    }
    if reply.data.capacity() == 0 {
        reply.data.reserve(bytes_max.min(FETCH_BUFFER_BYTES_INITIAL_MAX));
    }
    if offset < log.earliest_offset() {
        write_truncated(&mut reply.data, ids.local, offset, log.earliest_offset());
        reply.truncation_count += 1;
        offset = log.earliest_offset();
    }
    if offset < log.cached_from() {
        reply.disk_reads.push((ids.global, offset));
        return offset;
    }
    let (next, written) = write_lines(&mut reply.data, ids.local, log, offset, bytes_max);
    reply.event_count += written;
    reply.more |= next < log.visible_offset();
    next
}

/// Writes subscriber lines for the events of `log` from `offset` on into
/// `out`, until `out` would pass `bytes_max` (at least one event is written
/// when there is one). Returns the next offset and the events written.
pub fn write_lines(
    out: &mut Vec<u8>,
    local_partition: u32,
    log: &crate::partition::PartitionLog,
    offset: u64,
    bytes_max: usize,
) -> (u64, u64) {
    let mut written = 0u64;
    let next = log.read_cached(offset, |offset, record| {
        let line_size = event_line_size_max(record.key, record.payload);
        if written > 0 && out.len() + line_size > bytes_max {
            return false;
        }
        write_event_line(out, local_partition, offset, record.key, record.payload);
        written += 1;
        true
    });
    (next, written)
}

/// Writes subscriber lines for the records of whole frames in `frames`
/// (read from a segment file) from `from_offset` on, until `out` would pass
/// `bytes_max` (at least one event) or `below` is reached. Returns the next
/// offset and the events written; stops at the first bytes that are not a
/// whole valid frame (the caller read a bounded chunk).
pub fn write_lines_from_frames(
    out: &mut Vec<u8>,
    local_partition: u32,
    frames: &[u8],
    from_offset: u64,
    below: u64,
    bytes_max: usize,
) -> (u64, u64) {
    let (mut next, mut written, mut rest) = (from_offset, 0u64, frames);
    while let Ok(frame) = crate::storage::format::decode_frame(rest) {
        rest = &rest[frame.header.frame_size()..];
        for record in frame.records() {
            if record.offset < next {
                continue;
            }
            let line_size = event_line_size_max(record.key, record.payload);
            if record.offset != next || next >= below || (written > 0 && out.len() + line_size > bytes_max) {
                return (next, written);
            }
            write_event_line(out, local_partition, record.offset, record.key, record.payload);
            next += 1;
            written += 1;
        }
    }
    (next, written)
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
        assert_eq!(reply.data, b"0 0 k a\n0 1 k b\n");
        assert_eq!(reply.cursors, [(0, 2), (1, 1)]);
        assert_eq!(reply.moved, [2]);
        assert_eq!(reply.event_count, 2);
        assert!(
            serve_fetch(3, &manager, |_| false, &mut request(&[(0, Position::At(2)), (1, Position::At(1))]), false)
                .is_none()
        );
        let tail = serve_fetch(3, &manager, |_| false, &mut request(&[(1, Position::At(0))]), false).unwrap();
        assert_eq!(tail.data, b"1 0 k c\n");
        let forced = serve_fetch(3, &manager, |_| false, &mut request(&[(0, Position::At(2))]), true).unwrap();
        assert_eq!((forced.cursors.as_slice(), forced.data.len()), (&[(0, 2)][..], 0), "forced: unchanged cursors");
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
        assert_eq!((reply.cursors.as_slice(), reply.data.as_slice()), (&[(0, 2)][..], &b"0 1 k b\n"[..]));
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
        let text = String::from_utf8(reply.data).unwrap();
        assert!(text.starts_with(&format!("TRUNCATED 0 0 {earliest}\n0 {earliest} k ")), "{}", &text[..60]);
        assert_eq!(reply.truncation_count, 1);
        assert_eq!(reply.cursors, [(0, 100)]);
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
        assert_eq!((reply.event_count, reply.cursors.as_slice()), (1, &[(0, 1)][..]));
        assert!(reply.more, "the budget cut it: more is readable now");
        let whole = serve_fetch(0, &manager, |_| false, &mut request(&[(0, Position::At(0))]), false).unwrap();
        assert_eq!((whole.event_count, whole.more), (50, false));
        small.bytes_max = 100;
        let reply = serve_fetch(0, &manager, |_| false, &mut small, false).unwrap();
        assert!(reply.data.len() <= 100 && reply.event_count >= 1, "{} bytes", reply.data.len());
    }
}
